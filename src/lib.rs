//! streamfuse
