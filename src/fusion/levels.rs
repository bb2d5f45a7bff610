//! The plan builder's level step: which kernels could run at once.
//!
//! Takes the kernels in queue order and gives each a level: 0 when it reads nothing
//! made in the segment, else one more than the highest level of the kernels that made
//! what it reads (through the roots of views). Kernels of one level could run at once,
//! so the memory step measures lifetimes in levels.

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
