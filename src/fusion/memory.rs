//! The plan builder's memory step: where every stored value lives.
//!
//! Takes the kernels sorted by level and gives every f32 root that is made and dies in
//! the segment an offset in one arena, from the static memory planner
//! ([`crate::plan`]); escaping roots and other dtypes stay [`Home::Pooled`]. A buffer
//! lives from its producer's level to one past its last reader's. Invariants: two
//! buffers whose lifetimes overlap never overlap in the arena, unless they are an
//! in-place pair that the planner merged; an in-place pair is offered only for a fused
//! kernel's input that dies at the kernel's level, has no other reader there, and is
//! read at the index the kernel writes.

use std::time::Duration;

use super::values::Facts;
use super::{Home, Kernel, Value};
use crate::ir::{DType, Layout};
use crate::plan;

/// Step 4: arena offsets for f32 roots born and dead in the segment; pooled buffers for
/// the rest. Returns the arena length and the lower bound, in f32 elements.
///
/// A fused kernel's arena output may take the bytes of an arena input that dies at the
/// kernel's level (an in-place pair of the planner) when the kernel reads it at the
/// index it writes (the same length, a contiguous layout from offset 0) and nothing
/// else reads it at that level (kernels of one level may run at once). Where the
/// planner gives both the same offset, the kernel records the pair and reads that
/// input from its output region.
pub(super) fn place(
    kernels: &mut [Kernel],
    levels: &[u32],
    facts: &[Facts],
    values: &mut [Value],
) -> (usize, usize) {
    const ALIGN: usize = 16; // elements: 64 bytes
    let n = values.len();
    let mut born = vec![u32::MAX; n];
    let mut last = vec![0u32; n];
    for (k, &lvl) in kernels.iter().zip(levels) {
        let (ins, outs) = k.io();
        for &v in outs {
            born[v as usize] = lvl;
            last[v as usize] = last[v as usize].max(lvl);
        }
        for &v in ins {
            let r = facts[v as usize].root as usize;
            last[r] = last[r].max(lvl);
        }
    }
    let mut buffers = Vec::new();
    let mut owners = Vec::new();
    for v in 0..n {
        let val = &values[v];
        if val.home == Home::Pooled
            && !val.escapes
            && val.dtype == DType::F32
            && born[v] != u32::MAX
        {
            let len = val.layout.numel().div_ceil(ALIGN) * ALIGN;
            buffers.push(plan::Buffer {
                id: v,
                lower: born[v] as u64,
                upper: last[v] as u64 + 1,
                size: (len.max(ALIGN) * 4) as u64,
                alignment: (ALIGN * 4) as u64,
            });
            owners.push(v);
        }
    }
    if buffers.is_empty() {
        return (0, 0);
    }
    let mut problem = plan::Problem::new(buffers);
    // In-place candidates: (kernel, input k, output j, input buffer, output buffer).
    let position = |v: usize| owners.iter().position(|&o| o == v);
    let mut reads_at_last = vec![0usize; n];
    for (k, &lvl) in kernels.iter().zip(levels) {
        for &v in k.io().0 {
            let r = facts[v as usize].root as usize;
            if last[r] == lvl {
                reads_at_last[r] += 1;
            }
        }
    }
    let mut pairs: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
    for (ki, (k, &lvl)) in kernels.iter().zip(levels).enumerate() {
        let Kernel::Fused {
            inputs,
            outputs,
            dims,
            ..
        } = k
        else {
            continue;
        };
        let whole = Layout::contiguous(dims);
        for (j, &o) in outputs.iter().enumerate() {
            let Some(out) = position(o as usize) else {
                continue;
            };
            let numel = values[o as usize].layout.numel();
            let found = inputs.iter().enumerate().find_map(|(i, (v, layout))| {
                let r = facts[*v as usize].root as usize;
                let inp = position(r)?;
                let ok = last[r] == lvl
                    && born[r] < lvl
                    && reads_at_last[r] == 1
                    && *layout == whole
                    && values[r].layout.numel() == numel
                    && !pairs.iter().any(|p| p.3 == inp);
                ok.then_some((i, inp))
            });
            if let Some((i, inp)) = found {
                pairs.push((ki, i, j, inp, out));
            }
        }
    }
    problem.in_place = pairs
        .iter()
        .map(|&(_, _, _, input, output)| plan::InPlace { input, output })
        .collect();
    let options = plan::Options {
        time_limit: Duration::from_millis(50),
        threads: 1,
        ..plan::Options::default()
    };
    let (offsets, arena, lower) = match plan::solve(&problem, &options) {
        Ok(p) => (p.offsets, p.arena, p.lower_bound),
        Err(e) => {
            // Never expected; fall back to no reuse rather than fail the segment.
            log::warn!("memory planning failed ({e}); using one buffer after the other");
            let mut at = 0;
            let offs = problem
                .buffers
                .iter()
                .map(|b| {
                    let o = at;
                    at += b.size;
                    o
                })
                .collect();
            (offs, at, plan::lower_bound(&problem))
        }
    };
    // Only where the planner took the offer does the kernel read in place.
    for &(ki, i, j, inp, out) in &pairs {
        if offsets.get(inp) == offsets.get(out) {
            if let Kernel::Fused { in_place, .. } = &mut kernels[ki] {
                in_place.push((i, j));
            }
        }
    }
    for (v, off) in owners.into_iter().zip(offsets) {
        values[v].home = Home::Arena {
            offset: off as usize / 4,
        };
    }
    (arena as usize / 4, lower as usize / 4)
}
