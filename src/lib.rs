//! streamfuse
pub mod plan;
