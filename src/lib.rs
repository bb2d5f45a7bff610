//! streamfuse
pub mod ir;
