//! Reuse of memory: free lists of cells, spare vectors and scratch, and the pools of
//! storage, so that a repeated forward pass allocates nothing once it has run once.

pub(crate) mod cells;
pub(crate) mod pool;
pub(crate) mod retype;
pub(crate) mod vecs;
