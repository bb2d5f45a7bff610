//! streamfuse
pub mod ir;
pub mod kernels;
