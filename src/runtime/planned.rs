//! Running a cached [`ExecutionPlan`] on one segment's slots.
//!
//! The plan says where every value lives ([`Home`]); this module makes it so. Segment
//! inputs are read from their slots. Values planned in the arena are slices of one
//! `Vec<f32>` taken from a pool for the segment and given back after it: for each
//! kernel the arena is split into the output regions (written) and the gaps between
//! them (read), so the borrow checker itself proves that a kernel never reads what it
//! writes; an input region that straddles an output region is a planning bug and fails
//! the kernel with an error rather than reading torn data. Values that escape get
//! pooled buffers, and their slots are filled at the end. A failed input fails every
//! kernel downstream of it, with the same error.

use std::sync::Arc;

use parking_lot::Mutex;

use super::execute::run_into;
use super::observer;
use super::{Buffer, Data, DataMut, Slot, SlotState, Task};
use crate::error::Error;
use crate::fusion::{ExecutionPlan, Home, Kernel};
use crate::ir::relative::RelativeOp;
use crate::kernels::{self, KernelError, Par};

/// Free arenas, kept for the next segment.
static ARENAS: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// The most arenas kept free at once.
const MAX_FREE_ARENAS: usize = 16;

fn take_arena(len: usize) -> Vec<f32> {
    let mut free = ARENAS.lock();
    let best = free
        .iter()
        .enumerate()
        .filter(|(_, a)| a.len() >= len)
        .min_by_key(|(_, a)| a.len())
        .map(|(i, _)| i);
    let arena = match best {
        Some(i) => free.swap_remove(i),
        None => vec![0.0; len],
    };
    super::storage::add_live_bytes(arena.len() * 4);
    arena
}

fn give_back_arena(arena: Vec<f32>) {
    if arena.is_empty() {
        return;
    }
    super::storage::sub_live_bytes(arena.len() * 4);
    let mut free = ARENAS.lock();
    if free.len() < MAX_FREE_ARENAS {
        free.push(arena);
    }
}

/// Bytes of arenas kept free for reuse.
pub fn pooled_arena_bytes() -> usize {
    ARENAS.lock().iter().map(|a| a.len() * 4).sum()
}

/// Splits `arena` into the regions `writes` (`(start, len)`, pairwise disjoint) and the
/// read-only gaps between them (with their start offsets).
#[allow(clippy::type_complexity)]
fn carve<'a>(
    arena: &'a mut [f32],
    writes: &[(usize, usize)],
) -> Result<(Vec<&'a mut [f32]>, Vec<(usize, &'a [f32])>), KernelError> {
    let mut order: Vec<usize> = (0..writes.len()).collect();
    order.sort_by_key(|&i| writes[i].0);
    let mut out: Vec<Option<&'a mut [f32]>> = (0..writes.len()).map(|_| None).collect();
    let mut gaps = Vec::with_capacity(writes.len() + 1);
    let mut rest = arena;
    let mut at = 0;
    for i in order {
        let (start, len) = writes[i];
        if start < at || start + len > at + rest.len() {
            return Err(KernelError(format!(
                "arena region {start}+{len} overlaps another output or leaves the arena (planning bug)"
            )));
        }
        let (gap, tail) = rest.split_at_mut(start - at);
        let (w, tail) = tail.split_at_mut(len);
        gaps.push((at, &*gap));
        out[i] = Some(w);
        rest = tail;
        at = start + len;
    }
    gaps.push((at, &*rest));
    Ok((
        out.into_iter()
            .map(|w| w.expect("every write carved"))
            .collect(),
        gaps,
    ))
}

/// The read-only region `start..start + len` of a carved arena.
fn read<'a>(
    gaps: &[(usize, &'a [f32])],
    start: usize,
    len: usize,
) -> Result<&'a [f32], KernelError> {
    gaps.iter()
        .find(|(at, g)| start >= *at && start + len <= at + g.len())
        .map(|(at, g)| &g[start - at..start - at + len])
        .ok_or_else(|| {
            KernelError(format!(
                "arena region {start}+{len} is read while a kernel writes it (planning bug)"
            ))
        })
}

struct Run<'p> {
    plan: &'p ExecutionPlan,
    /// Buffers of inputs and pooled values, by relative id.
    bufs: Vec<Option<Arc<Buffer>>>,
    failed: Vec<Option<Error>>,
}

impl Run<'_> {
    fn root(&self, v: u32) -> usize {
        match self.plan.values[v as usize].home {
            Home::View { root } => root as usize,
            _ => v as usize,
        }
    }

    fn region(&self, r: usize) -> Option<(usize, usize)> {
        match self.plan.values[r].home {
            Home::Arena { offset } => Some((offset, self.plan.values[r].layout.numel())),
            _ => None,
        }
    }

    /// The elements of value `v`'s root, from a buffer or the carved arena.
    fn data<'a>(&'a self, v: u32, gaps: &[(usize, &'a [f32])]) -> Result<Data<'a>, KernelError> {
        let r = self.root(v);
        if let Some((start, len)) = self.region(r) {
            return Ok(Data::F32(read(gaps, start, len)?));
        }
        self.bufs[r]
            .as_ref()
            .map(|b| b.data())
            .ok_or_else(|| KernelError(format!("value r{r} has no buffer (engine bug)")))
    }
}

/// Runs `plan` for a segment whose ops are `tasks` with relative forms `rels`; fills
/// the slots of escaping values. Returns the first kernel error.
pub fn execute_plan(
    plan: &ExecutionPlan,
    tasks: Vec<Task>,
    rels: &[RelativeOp],
    par: Par,
) -> Option<Error> {
    let n = plan.values.len();
    let mut slots: Vec<Option<Arc<Slot>>> = vec![None; n];
    for (task, rel) in tasks.iter().zip(rels) {
        for (s, &v) in task.inputs.iter().zip(&rel.inputs) {
            slots[v as usize].get_or_insert_with(|| s.clone());
        }
        if let (Some(s), Some(v)) = (&task.output, rel.output) {
            slots[v as usize] = Some(s.clone());
        }
    }
    let mut run = Run {
        plan,
        bufs: vec![None; n],
        failed: vec![None; n],
    };
    for (v, slot) in slots.iter().enumerate() {
        if plan.values[v].home == Home::Input {
            match slot.as_ref().map(|s| s.state()) {
                Some(SlotState::Ready(b)) => run.bufs[v] = Some(b),
                Some(SlotState::Failed(e)) => run.failed[v] = Some(e),
                _ => {
                    run.failed[v] = Some(Error::Kernel {
                        op: "segment",
                        msg: format!("input r{v} was never computed (engine bug)"),
                    })
                }
            }
        }
    }
    let mut arena = take_arena(plan.arena_len);
    let mut first_error = None;
    let observe = observer::enabled();
    let mut k = 0;
    while k < plan.kernels.len() {
        // One level: kernels that depend only on earlier levels.
        let mut end = k + 1;
        while end < plan.kernels.len() && plan.levels[end] == plan.levels[k] {
            end += 1;
        }
        let mut runnable = Vec::with_capacity(end - k);
        for (i, kernel) in plan.kernels[k..end].iter().enumerate() {
            let (ins, outs) = crate::fusion::kernel_io(kernel);
            if let Some(e) = ins.iter().find_map(|&v| run.failed[run.root(v)].clone()) {
                for &o in outs {
                    run.failed[o as usize] = Some(e.clone());
                }
                continue;
            }
            if observe {
                observer::record(plan, k + i, ins, outs, |v| run.root(v) as u32);
            }
            runnable.push(k + i);
        }
        let results = run_level(&mut run, &runnable, &tasks, &mut arena, par);
        for (&ki, result) in runnable.iter().zip(results) {
            let Err(e) = result else { continue };
            let kernel = &plan.kernels[ki];
            let name = match kernel {
                Kernel::Op { op, .. } => tasks[*op].op.kind.name(),
                Kernel::Fused { .. } | Kernel::Chain(_) => "fused",
            };
            let e = Error::Kernel { op: name, msg: e.0 };
            log::debug!("kernel error: {e}");
            first_error.get_or_insert_with(|| e.clone());
            for &o in crate::fusion::kernel_io(kernel).1 {
                run.failed[o as usize] = Some(e.clone());
            }
        }
        k = end;
    }
    give_back_arena(arena);
    for (v, slot) in slots.iter().enumerate() {
        let (Some(slot), true) = (slot, plan.values[v].escapes) else {
            continue;
        };
        let r = run.root(v as u32);
        let state = match (&run.failed[v], &run.failed[r], &run.bufs[r]) {
            (Some(e), _, _) | (_, Some(e), _) => SlotState::Failed(e.clone()),
            (_, _, Some(b)) => SlotState::Ready(b.clone()),
            _ => SlotState::Failed(Error::Kernel {
                op: "segment",
                msg: format!("escaping value r{v} was not made (engine bug)"),
            }),
        };
        slot.set(state);
    }
    first_error
}

/// One kernel of a level, ready to run: its index, its arena outputs and its pooled
/// outputs.
type Job<'a, 'b> = (usize, Vec<&'a mut [f32]>, &'b mut Vec<(u32, Buffer)>);

/// Runs the kernels `ks` of one level: carves the arena once for all their outputs,
/// then runs them one after the other, or at once on rayon when the stream may use
/// several threads. Returns one result per kernel.
fn run_level(
    run: &mut Run<'_>,
    ks: &[usize],
    tasks: &[Task],
    arena: &mut [f32],
    par: Par,
) -> Vec<Result<(), KernelError>> {
    let plan = run.plan;
    // Arena outputs are carved out; the others get pooled buffers.
    let mut writes = Vec::new();
    let mut counts = Vec::with_capacity(ks.len());
    let mut pooled: Vec<Vec<(u32, Buffer)>> = Vec::with_capacity(ks.len());
    for &k in ks {
        let outs = crate::fusion::kernel_io(&plan.kernels[k]).1;
        let before = writes.len();
        writes.extend(outs.iter().filter_map(|&o| run.region(o as usize)));
        counts.push(writes.len() - before);
        pooled.push(
            outs.iter()
                .filter(|&&o| run.region(o as usize).is_none())
                .map(|&o| {
                    let val = &plan.values[o as usize];
                    (o, Buffer::alloc(val.dtype, val.layout.numel()))
                })
                .collect(),
        );
    }
    let results = match carve(arena, &writes) {
        Err(e) => ks.iter().map(|_| Err(e.clone())).collect(),
        Ok((arena_outs, gaps)) => {
            let mut arena_outs = arena_outs.into_iter();
            let jobs: Vec<Job<'_, '_>> = ks
                .iter()
                .zip(&counts)
                .zip(pooled.iter_mut())
                .map(|((&k, &n), p)| (k, arena_outs.by_ref().take(n).collect(), p))
                .collect();
            let run_ref = &*run;
            if jobs.len() > 1 && par.threads > 1 {
                let mut results: Vec<Result<(), KernelError>> =
                    (0..jobs.len()).map(|_| Ok(())).collect();
                rayon::scope(|s| {
                    for ((k, outs, p), r) in jobs.into_iter().zip(results.iter_mut()) {
                        let gaps = &gaps;
                        s.spawn(move |_| {
                            *r = run_kernel(
                                run_ref,
                                &plan.kernels[k],
                                tasks,
                                outs,
                                p,
                                gaps,
                                Par::serial(),
                            )
                        });
                    }
                });
                results
            } else {
                jobs.into_iter()
                    .map(|(k, outs, p)| {
                        run_kernel(run_ref, &plan.kernels[k], tasks, outs, p, &gaps, par)
                    })
                    .collect()
            }
        }
    };
    for p in pooled {
        for (o, b) in p {
            run.bufs[o as usize] = Some(Arc::new(b));
        }
    }
    results
}

/// Runs one kernel: reads its inputs from buffers or the arena's read-only `gaps`,
/// writes its arena outputs into `arena_outs` and the others into `pooled`.
fn run_kernel(
    run: &Run<'_>,
    kernel: &Kernel,
    tasks: &[Task],
    arena_outs: Vec<&mut [f32]>,
    pooled: &mut [(u32, Buffer)],
    gaps: &[(usize, &[f32])],
    par: Par,
) -> Result<(), KernelError> {
    let mut arena_outs = arena_outs.into_iter();
    let mut pooled = pooled.iter_mut();
    // Destinations in the kernel's output order.
    let mut dst = |o: u32| -> Result<DataMut<'_>, KernelError> {
        let d = if run.region(o as usize).is_some() {
            arena_outs.next().map(DataMut::F32)
        } else {
            pooled.next().map(|(_, b)| b.data_mut())
        };
        d.ok_or_else(|| KernelError(format!("no place for r{o} (engine bug)")))
    };
    match kernel {
        Kernel::Op { op, inputs, output } => {
            let data = inputs
                .iter()
                .map(|&v| run.data(v, gaps))
                .collect::<Result<Vec<_>, _>>()?;
            run_into(&tasks[*op].op, &data, dst(output[0])?, par)
        }
        Kernel::Fused {
            program,
            inputs,
            outputs,
            ..
        } => {
            let data = inputs
                .iter()
                .map(|(v, l)| match run.data(*v, gaps)? {
                    Data::F32(s) => Ok((s, l)),
                    _ => Err(KernelError("fused input is not f32 (engine bug)".into())),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut dsts: Vec<&mut [f32]> = Vec::with_capacity(outputs.len());
            for &o in outputs {
                match dst(o)? {
                    DataMut::F32(d) => dsts.push(d),
                    _ => return Err(KernelError("fused output is not f32 (engine bug)".into())),
                }
            }
            kernels::fused(program, &data, &mut dsts, par)
        }
        Kernel::Chain(chain) => {
            let data = |v: u32| match run.data(v, gaps)? {
                Data::F32(s) => Ok(s),
                _ => Err(KernelError("chain input is not f32 (engine bug)".into())),
            };
            let mut dsts: Vec<&mut [f32]> = Vec::with_capacity(chain.outputs.len());
            for &o in &chain.outputs {
                match dst(o)? {
                    DataMut::F32(d) => dsts.push(d),
                    _ => return Err(KernelError("chain output is not f32 (engine bug)".into())),
                }
            }
            super::chain::run_chain(chain, data, &mut dsts, par)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_separates_writes_from_reads() {
        let mut arena: Vec<f32> = (0..10).map(|x| x as f32).collect();
        let (mut w, gaps) = carve(&mut arena, &[(6, 2), (1, 2)]).unwrap();
        assert_eq!(w[0], &[6.0, 7.0]);
        assert_eq!(w[1], &[1.0, 2.0]);
        w[0][0] = -1.0;
        assert_eq!(read(&gaps, 3, 3).unwrap(), &[3.0, 4.0, 5.0]);
        assert!(read(&gaps, 5, 2).is_err(), "straddles a write");
        assert!(
            carve(&mut arena, &[(0, 4), (3, 2)]).is_err(),
            "overlapping writes"
        );
        assert!(carve(&mut arena, &[(8, 4)]).is_err(), "past the end");
    }
}
