//! streamfuse runs tensor programs lazily and fast on the CPU.
//!
//! You write ordinary tensor code with [`Tensor`]; each op is checked and queued on the
//! calling thread's stream, and nothing runs until a result is needed (`to_vec`,
//! [`sync`], or the queue limit). Then the pending segment runs on the CPU kernels.
//! Many threads can record at once, each into its own stream, sharing read-only
//! tensors such as weights.
//!
//! ```
//! use streamfuse::{DType, Tensor};
//! # fn main() -> streamfuse::Result<()> {
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let w = Tensor::ones(&[2, 3], DType::F32)?;
//! let y = x.matmul(&w)?.relu()?.sum(-1)?;
//! assert_eq!(y.to_vec::<f32>()?, vec![9.0, 21.0]);
//! # Ok(())
//! # }
//! ```
//!
//! See ARCHITECTURE.md for the path of an op from [`Tensor::add`] to its kernel.

// The public surface is documented, `pub` means reachable from outside the crate, and
// every unsafe operation sits in an `unsafe` block with the invariant it relies on.
// `scripts/lint.sh` (run by CI) turns these warnings into errors.
#![warn(missing_docs, unsafe_op_in_unsafe_fn)]
// Every `pub` item is reachable from outside the crate: the raw kernels only through
// `inspect::kernels`, which the `internals` feature builds (for the benchmarks), so the
// lint holds with it on (`scripts/lint.sh` checks it so).
#![cfg_attr(feature = "internals", warn(unreachable_pub))]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod cpu {
    //! Which instruction-set tier the kernels run on here: the CPU's best, or the one
    //! `STREAMFUSE_ISA` forces (see [`Tier`] for the names). Examples print it, and a
    //! trace records it.
    //!
    //! ```
    //! println!("kernels: {}", streamfuse::cpu::tier());
    //! streamfuse::cpu::check().expect("STREAMFUSE_ISA names a tier this CPU has");
    //! ```

    pub use crate::kernels::cpu::{available, Tier};

    // The seam through which `models` asks which products are fast here (ARCHITECTURE
    // names it): the tier owner's feature questions, crate-wide.
    pub(crate) use crate::kernels::cpu::{
        has_amx_bf16, has_arm_bf16, has_avx2, has_avx512, has_avx512_bf16, has_avx512_vnni,
        has_avx_vnni, has_dotprod,
    };

    /// The tier the kernels run on (`portable` when `STREAMFUSE_ISA` is wrong: see
    /// [`check`]).
    pub fn tier() -> Tier {
        crate::kernels::cpu::tier()
    }

    /// An error naming the problem when `STREAMFUSE_ISA` names no tier or one this CPU
    /// lacks (then every flush fails with it too); `Ok` otherwise.
    pub fn check() -> crate::Result<()> {
        crate::kernels::cpu::check().map_err(|e| crate::Error::Arg {
            op: "cpu",
            msg: e.0,
        })
    }
}
#[cfg(feature = "text")]
pub mod embedder;
mod error;
mod fusion;
pub mod inspect;
mod ir;
mod kernels;
pub mod memory_planner;
pub mod models;
mod ops;
mod reuse;
mod runtime;
mod stream;
mod tensor;
pub mod trace;

pub use error::{Error, Result};
pub use fusion::cache::clear as clear_plan_cache;
pub use fusion::cache::{
    plan_cache_limit, set_plan_cache_limit, CacheStats, DEFAULT_PLAN_CACHE_LIMIT,
};
pub use fusion::plan_svg;
pub use ir::{DType, Layout, TensorId, MAX_RANK};
pub use runtime::{
    kernel_spin, load_aware, pool_limit, set_kernel_spin, set_load_aware, set_pool_limit,
    trim_pools, External,
};
pub use stream::{
    last_flush, pending_key, reset_peak_bytes, set_fusion, set_kernel_threads, set_queue_limit,
    stats, sync, EngineStats, FlushInfo, FlushReason,
};
pub use tensor::{Dim, KeyWindow, Tensor, TensorElement};
