//! Windows into the engine for tests, benchmarks and debugging: not part of the stable
//! API, and not needed to use streamfuse.
//!
//! Everything a user needs is at the crate root ([`Tensor`](crate::Tensor), the engine
//! controls and statistics) or in [`memory_planner`](crate::memory_planner) and [`models`](crate::models).
//! This module gathers, in one documented place, the few internals that tests and
//! benchmarks look at: the memory observer that records what each planned kernel
//! touched, a way to forget the plan cache's instances, and the raw CPU kernels with the types
//! their signatures use, so a benchmark can time one kernel without the engine around
//! it. Items here may change between releases without notice.

pub use crate::fusion::cache::forget_instances as forget_plan_instances;
pub use crate::ir::{BinaryOp, UnaryOp};
pub use crate::runtime::observer;

/// The CPU kernels the engine runs, callable directly on slices (for benchmarks).
pub mod kernels {
    /// Which of our SIMD paths run here (the tier, `STREAMFUSE_ISA`; see
    /// [`crate::cpu`]).
    pub use crate::kernels::cpu::{
        forced_portable, has_arm_bf16, has_avx2, has_avx512, has_avx512_bf16, has_avx512_vnni,
        has_dotprod, has_i8mm, has_neon,
    };
    pub use crate::kernels::{
        binary, copy, layer_norm, matmul, matmul_prepacked, softmax, unary, KernelError, PackedRhs,
        Par,
    };
}
