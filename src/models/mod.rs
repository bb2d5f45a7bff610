//! Real models built on the public [`Tensor`](crate::Tensor) API, and the plumbing
//! they need: loading weights and batching inputs.
//!
//! [`bert`] owns the BERT encoder (the architecture of the sentence-transformers model
//! all-MiniLM-L6-v2): its config, its weights loaded from a safetensors file, its
//! forward pass with mean pooling and L2 normalisation, and length-sorted batching over
//! one or many streams. The library loads a model folder it is given; finding or
//! fetching one is the examples' job (`examples/common/fetch.rs`). Models use nothing
//! but the public tensor API, so every engine improvement (fusion, plan cache, memory
//! planning) speeds them up without changing them.

pub mod bert;

pub use bert::{BertConfig, BertModel, EmbedOptions};

use std::fmt;
use std::path::PathBuf;

/// Why a model could not be loaded.
#[derive(Debug)]
pub enum ModelError {
    /// A model file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// A model file was read but its contents are not what the model needs (a missing
    /// config field or weight, a weight of the wrong shape or dtype).
    Format {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        msg: String,
    },
    /// Building a weight tensor failed.
    Tensor(crate::Error),
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::Io { path, error } => {
                write!(f, "cannot read {}: {error}", path.display())
            }
            ModelError::Format { path, msg } => write!(f, "{}: {msg}", path.display()),
            ModelError::Tensor(e) => write!(f, "building a weight tensor: {e}"),
        }
    }
}

impl std::error::Error for ModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ModelError::Io { error, .. } => Some(error),
            ModelError::Tensor(e) => Some(e),
            ModelError::Format { .. } => None,
        }
    }
}

impl From<crate::Error> for ModelError {
    fn from(e: crate::Error) -> Self {
        ModelError::Tensor(e)
    }
}
