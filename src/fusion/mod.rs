//! Fusion and the plan cache: how a flushed segment becomes an [`ExecutionPlan`], once.
//!
//! A segment is a run of queued ops in relative form (ids numbered by first
//! appearance). [`build`] turns it into a plan:
//!
//! 1. **Values.** Every relative id is a value: a segment input (made before), a view of
//!    another value (no memory of its own: it reads its *root*), or the output of an op.
//!    An output *escapes* when no Drop for it is in the segment (a handle may still read
//!    it); a root escapes when it or any view of it does. A value is *live* when it
//!    escapes or a live op reads it; an op whose output is not live is *dead* work
//!    (everything it would make is dropped unread): it gets no kernel and no memory,
//!    and reads nothing, so what only it read may be dead too.
//! 2. **Fusion.** Chains of element-wise f32 ops with the same output dims become one
//!    [`FusedProgram`](crate::kernels::FusedProgram): a kernel that reads each external
//!    input once and writes only the values that are read outside the chain or escape. A value used only inside a
//!    chain never gets memory. A group then becomes a [`Chain`] when a matmul's product
//!    is read only by it (the matmul runs in row panels, each followed by the program:
//!    an *epilogue*) and/or when its result is read only by a softmax, layer norm or RMS
//!    norm (the norm normalises each panel's rows: a *prologue*); a matmul read only by
//!    a norm is a chain too. The product and the norm's input never get memory.
//! 3. **Levels.** Kernels are levelled by dependency (a kernel's level is one more than
//!    the highest level of the kernels it reads from); kernels of one level could run at
//!    once, so lifetimes are measured in levels.
//! 4. **Memory.** Every f32 root that is made and dies inside the segment is a buffer of
//!    the static memory planner ([`crate::memory_planner`]) with lifetime `[producer level, last
//!    reader level + 1)`; the plan gives it an offset in one arena. Escaping roots and
//!    other dtypes get pooled buffers of their own. A fused kernel may overwrite an
//!    input that dies at its level (same length, read at the same index it writes, no
//!    other reader at that level): the pair goes to the planner as an in-place pair,
//!    and when the planner gives both the same offset the kernel reads that input
//!    from its own output region.
//!
//! The [`cache`] maps the segment's stable key (checked op by op against the stored
//! signature, so a hash collision can never run a wrong plan) to the plan, so a repeated
//! forward pass pays for this once.

mod build;
pub(crate) mod cache;
mod chains;
mod groups;
mod kernel;
mod levels;
mod memory;
mod prune;
mod symbolic;
#[cfg(test)]
pub(crate) mod testutil;
mod traced;
mod values;

#[cfg(test)]
pub(crate) use build::build;
pub(crate) use kernel::{Chain, Kernel, MatMulHead, NormTail};
pub(crate) use memory::arena_problem;
pub use traced::plan_svg;

use std::fmt;

use crate::ir::{DType, Layout};

/// Where a value's elements live while a segment runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Home {
    /// A segment input: its slot already holds a buffer.
    Input,
    /// Computed inside a fused kernel and never stored.
    Fused,
    /// At `offset` (in f32 elements) in the segment's arena.
    Arena {
        /// Offset in elements.
        offset: usize,
    },
    /// In a pooled buffer of its own (it escapes the segment, or is not f32).
    Pooled,
    /// A view: it reads the elements of value `root` through its own layout.
    View {
        /// The value whose buffer it reads.
        root: u32,
    },
    /// Never made: dropped unread in the segment (the output of a dead op, or a value
    /// of a fused chain that nothing reads).
    Dead,
}

/// One value of a segment (a relative id).
#[derive(Clone, Debug)]
pub(crate) struct Value {
    /// Element type.
    pub dtype: DType,
    /// Layout over its root's buffer.
    pub layout: Layout,
    /// Where its elements live.
    pub home: Home,
    /// Whether a handle may read it after the segment (its slot must be filled).
    pub escapes: bool,
}

/// The result of planning a segment once: kernels in level order and where every value
/// lives.
#[derive(Clone, Debug)]
pub(crate) struct ExecutionPlan {
    /// Every value of the segment, by relative id.
    pub values: Vec<Value>,
    /// Kernels, sorted by level (stable within a level).
    pub kernels: Vec<Kernel>,
    /// `levels[i]`: the level of `kernels[i]`.
    pub levels: Vec<u32>,
    /// Arena size in f32 elements.
    pub arena_len: usize,
    /// The planner's lower bound for the arena, in f32 elements.
    pub arena_lower_bound: usize,
    /// Ops in the segment (including Drops).
    pub ops: usize,
    /// Ops not run because everything they make is dropped unread (Drops not counted).
    pub dead_ops: usize,
    /// Element operations of the live ops (see [`crate::ops::work`]): whether the
    /// segment is worth running on several threads.
    pub work: usize,
}

impl ExecutionPlan {
    /// Number of kernels launched per run.
    pub(crate) fn kernel_count(&self) -> usize {
        self.kernels.len()
    }

    /// Arena size in bytes.
    pub(crate) fn arena_bytes(&self) -> usize {
        self.arena_len * 4
    }
}

impl fmt::Display for ExecutionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan: {} ops ({} dead) -> {} kernels, arena {} B (lower bound {} B)",
            self.ops,
            self.dead_ops,
            self.kernels.len(),
            self.arena_len * 4,
            self.arena_lower_bound * 4
        )?;
        let home = |v: u32| match self.values[v as usize].home {
            Home::Arena { offset } => format!("r{v}@{}", offset * 4),
            Home::Pooled => format!("r{v}:pool"),
            Home::Input => format!("r{v}:in"),
            Home::View { root } => format!("r{v}->r{root}"),
            Home::Fused | Home::Dead => format!("r{v}"),
        };
        for (k, lvl) in self.kernels.iter().zip(&self.levels) {
            match k {
                Kernel::Op {
                    op,
                    inputs,
                    output,
                    product,
                } => {
                    let ins: Vec<String> = inputs.iter().map(|&v| home(v)).collect();
                    let how = product.map_or(String::new(), |p| format!(" [{p}]"));
                    writeln!(
                        f,
                        "  L{lvl} op#{op}({}){how} -> {}",
                        ins.join(", "),
                        home(output[0])
                    )?;
                }
                Kernel::Fused {
                    program,
                    inputs,
                    outputs,
                    dims,
                    in_place,
                    ..
                } => {
                    let ins: Vec<String> = inputs
                        .iter()
                        .enumerate()
                        .map(|(k, (v, _))| match in_place.iter().find(|p| p.0 == k) {
                            Some(&(_, j)) => format!("{} (in place of r{})", home(*v), outputs[j]),
                            None => home(*v),
                        })
                        .collect();
                    let outs: Vec<String> = outputs.iter().map(|&v| home(v)).collect();
                    writeln!(
                        f,
                        "  L{lvl} fused{dims:?}({}) {{ {program} }} -> {}",
                        ins.join(", "),
                        outs.join(", ")
                    )?;
                }
                Kernel::Chain(c) => {
                    let ins: Vec<String> = c.input_ids.iter().map(|&v| home(v)).collect();
                    let outs: Vec<String> = c.outputs.iter().map(|&v| home(v)).collect();
                    let head = c.matmul.as_ref().map_or(String::new(), |m| {
                        let tile = if m.epilogue.is_some() {
                            ", program in the tile"
                        } else {
                            ""
                        };
                        format!("op#{} matmul [{}{tile}] -> ", m.op, m.plan)
                    });
                    let tail = c.norm.as_ref().map_or(String::new(), |n| {
                        format!(" -> op#{} {}(out{})", n.op, n.kind.name(), n.output)
                    });
                    writeln!(
                        f,
                        "  L{lvl} chain{:?}({}) {{ {head}{}{tail} }} -> {}",
                        c.dims,
                        ins.join(", "),
                        c.program,
                        outs.join(", ")
                    )?;
                }
            }
        }
        Ok(())
    }
}
