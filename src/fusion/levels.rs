//! The plan builder's level step: which kernels could run at once.
//!
//! Takes the kernels in queue order and gives each a level: 0 when it reads nothing
//! (a fill), else one more than the highest level of what it reads, through the roots
//! of views, where a segment input counts as level 0 (so a kernel reading only inputs
//! is at level 1). Kernels of one level could run at once, so the memory step measures
//! lifetimes in levels; the kernels are then sorted by level, in queue order within
//! one.

use super::values::Facts;
use super::Kernel;

/// Step 3: the level of each kernel (in the given order).
pub(super) fn levels(kernels: &[Kernel], facts: &[Facts], n_values: usize) -> Vec<u32> {
    let mut level_of_root = vec![0u32; n_values];
    let mut levels = Vec::with_capacity(kernels.len());
    for k in kernels {
        let (ins, outs) = k.io();
        let lvl = ins
            .iter()
            .map(|&v| level_of_root[facts[v as usize].root as usize])
            .max()
            .map_or(0, |l| l + 1);
        for &v in outs {
            level_of_root[v as usize] = lvl;
        }
        levels.push(lvl);
    }
    levels
}

/// The kernels sorted by level (queue order kept within a level), with their levels.
pub(super) fn sort_by_level(kernels: Vec<Kernel>, facts: &[Facts]) -> (Vec<Kernel>, Vec<u32>) {
    let levels = levels(&kernels, facts, facts.len());
    let mut order: Vec<(Kernel, u32)> = kernels.into_iter().zip(levels).collect();
    order.sort_by_key(|&(_, level)| level); // stable: queue order within a level
    order.into_iter().unzip()
}

#[cfg(test)]
mod tests {
    use crate::fusion::testutil::{add, drop_of, exp, op, plan};
    use crate::fusion::{ExecutionPlan, Home, Kernel};
    use crate::ir::{Op, OpKind};

    fn contiguous(input: u64, output: u64) -> Op {
        op(OpKind::Contiguous, &[input], Some(output))
    }

    /// Every kernel's level is above the level of each kernel that made what it reads
    /// (through views), and kernels are sorted by level.
    fn assert_levels_follow_inputs(p: &ExecutionPlan) {
        let root = |v: u32| match p.values[v as usize].home {
            Home::View { root } => root,
            _ => v,
        };
        for (k, (kernel, &level)) in p.kernels.iter().zip(&p.levels).enumerate() {
            for &v in kernel.io().0 {
                for (maker, &made_at) in p.kernels.iter().zip(&p.levels) {
                    if maker.io().1.contains(&root(v)) {
                        assert!(made_at < level, "kernel {k} reads r{v}: {p}");
                    }
                }
            }
        }
        assert!(p.levels.windows(2).all(|w| w[0] <= w[1]), "{p}");
    }

    #[test]
    fn a_kernel_runs_a_level_after_its_inputs() {
        // a = contiguous(x); b = exp(x); c = a + b (fused with b); d = contiguous(c);
        // e = contiguous(x).
        let p = plan(&[
            contiguous(0, 1),
            exp(0, 2),
            add(1, 2, 3),
            contiguous(3, 4),
            contiguous(0, 5),
            drop_of(1),
            drop_of(2),
            drop_of(3),
        ]);
        assert_eq!(p.levels, [1, 1, 2, 3], "inputs are at level 0: {p}");
        let order: Vec<Option<usize>> = p
            .kernels
            .iter()
            .map(|k| match k {
                Kernel::Op { op, .. } => Some(*op),
                _ => None,
            })
            .collect();
        assert_eq!(
            order,
            [Some(0), Some(4), None, Some(3)],
            "queue order within a level"
        );
        assert_levels_follow_inputs(&p);
    }

    #[test]
    fn a_kernel_that_reads_nothing_is_at_level_0() {
        let fill = op(OpKind::Fill { value: 0 }, &[], Some(0));
        let p = plan(&[fill, contiguous(0, 1), drop_of(0)]);
        assert_eq!(p.levels, [0, 1], "{p}");
        assert_levels_follow_inputs(&p);
    }

    #[test]
    fn a_view_passes_its_root_level_on() {
        // a = contiguous(x); v = view(a); b = contiguous(v); c = contiguous(b).
        let p = plan(&[
            contiguous(0, 1),
            op(OpKind::View, &[1], Some(2)),
            contiguous(2, 3),
            contiguous(3, 4),
            drop_of(2),
            drop_of(1),
            drop_of(3),
        ]);
        assert_eq!(p.levels, [1, 2, 3], "{p}");
        assert_levels_follow_inputs(&p);
    }
}
