//! CPU kernels: the loops that actually touch tensor data.
//!
//! Every kernel here has the same contract. Inputs are read through a [`Layout`] (any
//! strides, including 0 for broadcasting, and any offset), and the output is written to a
//! contiguous row-major `dst` that holds exactly the output's elements. Before it touches
//! memory, a kernel checks its preconditions (the lengths, that each layout
//! fits in its buffer (`check_input`), that dims agree, that indices are in range) and
//! returns a [`KernelError`] when one fails, so a bad plan or a bad index never panics or
//! reads out of bounds.
//!
//! Speed comes from three places:
//!
//! * **Layout simplification.** Before walking a layout, adjacent dims that are
//!   contiguous with each other are merged and size-1 dims dropped (module `strided`), so a
//!   contiguous or row-broadcast input becomes one or two long runs with a tight inner loop
//!   the compiler vectorises, and only truly strided inputs pay for index arithmetic.
//! * **Fast paths** for the common shapes: contiguous inputs, scalar broadcast, row
//!   reductions over the last dim, accumulation of rows over an outer dim.
//! * **Parallelism** with rayon, bounded by [`Par`]: the output is split into chunks of
//!   at least 64K element operations each (module `par`), so small tensors stay on the
//!   calling thread and large ones are spread over cache-sized pieces.
//!
//! Matrix multiplication by a weight packed once runs on our own tiles (`packed`:
//! [`PackedRhs`], [`matmul_prepacked`]; f32, bf16 and int8 forms, one tile per
//! instruction set); every other product is delegated to the `gemm` crate (see
//! [`matmul()`]). Which tile and which SIMD loops run is decided in one place, `cpu`.
//!
//! The modules:
//!
//! - `cpu`: the CPU's tier and what each kernel may use (the only place that asks the
//!   CPU for its features);
//! - `copy` (fill, strided copy, cast, cat), `elementwise` (unary and binary maps),
//!   `strided` (layout simplification), `index` (index select), `reduce` (sum, max,
//!   mean, argmax);
//! - `fused`: register programs of fused element-wise chains;
//! - `math`: activation functions, their vector forms per instruction set, erf for the
//!   tests' references;
//! - `norm`: softmax, layer norm, RMS norm;
//! - `attention`: scaled dot-product attention as one kernel, per instruction set;
//! - `product` (a product as its plan decided it: `ProductPlan`, the path, packed on
//!   a named tile or by `gemm`, and the split; the right operand as bound, `Rhs`),
//!   `matmul` (the gemm wrapper), `packed` (products by a packed weight) and `chain`
//!   (a matmul, a fused program and a row norm run panel by panel as one kernel:
//!   matmul epilogues and norm prologues);
//! - `par`: splitting work between threads (with `Split`, the one split policy of a
//!   product), and `Out`, the raw output they share;
//! - `teardown`: whether the calling thread is exiting.
//!
//! `unsafe` appears only where it buys measured speed or reaches the CPU, each block
//! with a `// SAFETY:` comment naming the invariant it relies on:
//!
//! - the SIMD loops, called after the CPU check that they need (`cpu`'s answer, asserted
//!   before the call): the packed tiles (`packed/f32`, `packed/bf16`, `packed/i8`,
//!   `packed/tiles.rs` for AMX, `packed/neon.rs` and `packed/neon/`), the fused
//!   kernel's accumulator (`fused/avx.rs`, `fused/run.rs`), attention's vector block
//!   (`attention/`), the vector math (`math/`);
//! - the tiles' loads and stores through raw pointers, within bounds the safe caller
//!   asserts, and the stack scratch they fill before reading (`packed/mod.rs`);
//! - the disjoint writes of a split's tasks through one output (`par::Out`);
//! - the gemm wrapper (`matmul`);
//! - the system call that asks the kernel for the AMX tile state (`cpu`).

mod attention;
mod chain;
mod copy;
pub(crate) mod cpu;
mod elementwise;
mod fused;
mod index;
mod math;
mod matmul;
mod norm;
mod packed;
mod par;
mod product;
mod reduce;
mod strided;
pub(crate) mod teardown;

#[cfg(test)]
pub(crate) mod testutil;

pub(crate) use attention::{attention, attention_ragged, Window, MAX_HEAD_DIM};
pub(crate) use chain::{chain, ChainMatMul, ChainNorm, TileEpilogue};
pub use copy::copy;
pub(crate) use copy::{cast, cat, fill};
pub use elementwise::{binary, unary};
pub(crate) use fused::{fused_in_place, FusedProgram, Instr};
pub(crate) use index::index_select;
#[cfg(any(test, feature = "internals"))]
pub use matmul::matmul;
pub(crate) use norm::rms_norm;
pub use norm::{layer_norm, softmax};
pub use packed::PackedRhs;
#[cfg(test)]
pub(crate) use packed::Step;
pub(crate) use par::worth_splitting;
#[cfg(any(test, feature = "internals"))]
pub use product::matmul_prepacked;
pub(crate) use product::{packable, product, ProductPath, ProductPlan, Rhs};
pub(crate) use reduce::{argmax, reduce};

use std::fmt;

use crate::ir::Layout;

/// How many threads a kernel may use.
///
/// With `threads == 1` a kernel runs entirely on the calling thread and never touches
/// rayon; with more, it may split its work into rayon tasks, at most about `threads` of
/// them running at once.
#[derive(Clone, Copy, Debug)]
pub struct Par {
    /// The largest number of threads the kernel may keep busy.
    pub threads: usize,
}

impl Par {
    /// Run on the calling thread only.
    pub fn serial() -> Par {
        Par { threads: 1 }
    }

    /// Use every thread of the current rayon pool.
    #[cfg(any(test, feature = "internals"))]
    pub fn all() -> Par {
        Par {
            threads: rayon::current_num_threads(),
        }
    }
}

/// A kernel precondition failed or an index was out of range.
///
/// The message names the kernel and the offending values, e.g. `index_select: index 7 at
/// position 2 is out of range for dim 0 of size 5`.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelError(pub String);

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KernelError {}

/// Builds the error `"{kernel}: {msg}"`.
fn error(kernel: &str, msg: impl fmt::Display) -> KernelError {
    KernelError(format!("{kernel}: {msg}"))
}

/// The number of elements of `dims`, or an error if the product overflows.
fn numel_of(kernel: &str, dims: &[usize]) -> Result<usize, KernelError> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            error(
                kernel,
                format_args!("element count of dims {dims:?} overflows"),
            )
        })
}

/// Checks that `layout` is well formed (one stride per dim, no arithmetic overflow) and
/// that every element it addresses lies inside a buffer of `len` elements. Returns the
/// layout's element count.
///
/// This recomputes [`Layout::max_index`] with checked arithmetic, so even an absurd layout
/// gives an error rather than a wrapped index. The `unsafe` in the gemm wrapper relies on
/// this check.
fn check_input(
    kernel: &str,
    what: &str,
    len: usize,
    layout: &Layout,
) -> Result<usize, KernelError> {
    if layout.dims.len() != layout.strides.len() {
        return Err(error(
            kernel,
            format_args!(
                "{what} layout has {} dims but {} strides",
                layout.dims.len(),
                layout.strides.len()
            ),
        ));
    }
    let numel = numel_of(kernel, &layout.dims)?;
    if numel == 0 {
        return Ok(0);
    }
    let max = layout
        .dims
        .iter()
        .zip(&layout.strides)
        .try_fold(layout.offset, |acc, (&d, &s)| {
            (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x))
        });
    match max {
        Some(m) if m < len => Ok(numel),
        Some(m) => Err(error(
            kernel,
            format_args!(
                "{what} layout (dims {:?}, strides {:?}, offset {}) reaches index {m} but the buffer has {len} elements",
                layout.dims, layout.strides, layout.offset
            ),
        )),
        None => Err(error(
            kernel,
            format_args!(
                "{what} layout (dims {:?}, strides {:?}, offset {}) overflows usize",
                layout.dims, layout.strides, layout.offset
            ),
        )),
    }
}

/// Checks that `dst` holds exactly `expected` elements.
fn check_dst(kernel: &str, len: usize, expected: usize) -> Result<(), KernelError> {
    if len != expected {
        return Err(error(
            kernel,
            format_args!("dst has {len} elements but the output has {expected}"),
        ));
    }
    Ok(())
}
