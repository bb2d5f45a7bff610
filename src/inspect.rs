//! Read-only windows into the engine for tests and debugging: not part of the stable
//! API, and not needed to use streamfuse.
//!
//! Everything a user needs is at the crate root ([`Tensor`](crate::Tensor), the engine
//! controls and statistics) or in [`memory_planner`](crate::memory_planner) and
//! [`models`](crate::models). This module gathers, in one documented place, what tests
//! look at without changing anything: the memory observer that records what each
//! planned kernel touched, which CPU features the kernels use here, and which tile a
//! product by a weight runs on (as plans name it).
//!
//! The benchmarks also reach the raw CPU kernels and a plan-cache control, which are
//! not views: they are built only with the `internals` feature (`inspect::kernels`,
//! `forget_plan_instances`; `cargo bench --features internals`). Items here may change
//! between releases without notice.

use crate::ir::DType;

pub use crate::kernels::cpu::{
    forced_portable, has_arm_bf16, has_avx2, has_avx512, has_avx512_bf16, has_avx512_vnni,
    has_dotprod, has_i8mm, has_neon,
};
pub use crate::runtime::observer;

/// The tile a product by a weight kept in `dtype` runs on here, as plan listings name
/// it (`"avx512 14x32"` for f32 on AVX-512), or `None` where such products go through
/// `gemm` (f32 on the portable tier) or `dtype` is not a weight's.
pub fn product_tile(dtype: DType) -> Option<&'static str> {
    crate::kernels::PackedRhs::tile(dtype).map(|t| t.name)
}

/// Forgets the plan cache's instances but keeps its structures, so the next flush of a
/// cached segment is an instantiation (for `benches/symbolic.rs`).
#[cfg(feature = "internals")]
pub use crate::fusion::cache::forget_instances as forget_plan_instances;

/// The CPU kernels the engine runs, callable directly on slices (for benchmarks; built
/// with the `internals` feature).
#[cfg(feature = "internals")]
pub mod kernels {
    pub use crate::ir::{BinaryOp, UnaryOp};
    pub use crate::kernels::{
        binary, copy, layer_norm, matmul, matmul_prepacked, softmax, unary, KernelError, PackedRhs,
        Par,
    };
}
