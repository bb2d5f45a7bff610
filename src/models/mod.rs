//! Real models built on the public [`Tensor`](crate::Tensor) API, and the plumbing
//! they need: loading weights and batching inputs.
//!
//! [`bert`] owns the BERT encoder (the architecture of the sentence-transformers model
//! all-MiniLM-L6-v2): its config, its weights loaded from a safetensors file, its
//! forward pass with mean pooling and L2 normalisation, and length-sorted batching over
//! one or many streams, and its sequence-classification head (`BertClassifier`, the
//! cross-encoder rerankers' architecture), with RoBERTa's families and MPNet on the
//! same encoder. [`modernbert`] owns the ModernBERT encoder (rotary positions,
//! alternating global and local attention, GeGLU), and [`qwen3`] the Qwen3 decoder run
//! as an embedder (Qwen3-Embedding); `ragged` packs their batches. [`TextModel`] is
//! any of them, chosen by the folder's `model_type`, for the `Embedder`. The library loads a model folder it is given; finding or
//! fetching one is the examples' job (`examples/common/fetch.rs`). Models use nothing
//! but the public tensor API, so every engine improvement (fusion, plan cache, memory
//! planning) speeds them up without changing them.

pub mod accuracy;
pub mod bert;
pub mod head;
mod json;
pub mod modernbert;
pub mod pooling;
pub mod qwen3;
mod ragged;
mod text;
mod weights;

pub use accuracy::{agreement, Agreement};
pub use bert::{BertClassifier, BertConfig, BertModel, EmbedOptions};
pub use modernbert::{ModernBertConfig, ModernBertModel};
pub use qwen3::{Qwen3Config, Qwen3Model};
pub use text::TextModel;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::DType;

/// The precision a model keeps its matrix weights in (the embeddings, biases and norms
/// stay f32, and every activation is f32). Each reduced precision has an accuracy
/// contract, measured on all-MiniLM-L6-v2 against its f32 embeddings over
/// `scripts/data/sentences-512.txt` (`examples/minilm --precision P --compare f32`)
/// and held by `tests/minilm.rs` on a smaller set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 weights: the reference.
    #[default]
    F32,
    /// bfloat16 weights (half the memory; products on AMX tiles where the CPU has AMX,
    /// AVX512_BF16 elsewhere, on the `avx2` tier (AVX2 with FMA, no AVX-512) an AVX2
    /// tile that widens the weights to f32 in registers and multiplies the
    /// activations unrounded, in f32, and on aarch64 CPUs with the bf16 instructions
    /// (`neon-i8mm` where present) `bfmmla`, whose sums round to odd, a little
    /// differently from f32's). Contract: minimum cosine to the f32 embeddings ≥
    /// 0.9999. Tiers without one of these keep the weights rounded to bf16 in f32 and
    /// multiply in f32 (f32's speed and memory, bf16's weights, the widening tiles'
    /// results bit for bit), and say so once in the log ([`Precision::fast_here`]):
    /// `avx512` without AVX512_BF16 (its bf16 panels, widened into an f32 copy for the
    /// AVX-512 f32 tile, ran MiniLM 6–11% slower than f32 weights), `portable`, and
    /// aarch64 without the bf16 instructions (whose widening NEON tile does the f32
    /// tile's multiply-adds and more for half the bytes; not timed on hardware).
    Bf16,
    /// 8-bit integer weights with one scale per output channel, activations quantised
    /// per row inside the product (a quarter of the memory; AVX512_VNNI products, and
    /// AMX-INT8 tiles for blocks of 32 rows where the CPU has AMX; `vpdpbusd` on ymm
    /// with AVX-VNNI; on aarch64 `smmla` (`neon-i8mm`) or `sdot` (`neon-dotprod`), the
    /// same bits as AVX512_VNNI's, not timed on hardware). On the `avx2` tier (AVX2 without VNNI or AVX-512) the weights
    /// are 7-bit, with a scale per output channel and group of 64 input rows, the
    /// form `vpmaddubsw` multiplies exactly. Contract: minimum cosine ≥ 0.99, top-10
    /// neighbour overlap ≥ 0.9 (over the sentences above: 0.99234 and 0.912 with
    /// 8-bit weights, 0.99318 and 0.912 on the `avx2` tier). Tiers without an int8
    /// product faster than f32's (`avx512` without AVX512_VNNI, whose widened
    /// `vpmaddwd` tile only matches the AVX-512 f32 one; `portable`; plain `neon`,
    /// without `sdot`, where an exact widening product does no more multiply-adds an
    /// instruction than `fmla`) keep the quantised weights' values (each column's integers times
    /// its scale) in f32 and multiply in f32, activations unquantised (f32's speed and
    /// memory, int8's weights, closer to f32 than the contract), and say so once in
    /// the log.
    Int8,
    /// f32 accuracy from bf16 arithmetic: each weight kept as the sum of two bfloat16
    /// (the f32's memory), each product taken as three bf16 products on AMX tiles
    /// ([`DType::BF16X3`]). Contract: minimum cosine to the float64 reference
    /// embeddings ≥ 0.99999, as for f32 (`tests/minilm.rs`). Where the CPU has no AMX
    /// the model keeps its weights in f32 instead (faster there, and more accurate).
    Bf16x3,
}

impl Precision {
    /// Whether the CPU tier in use has a product kernel for weights of this precision
    /// that is faster than f32's (`streamfuse::cpu`; ARCHITECTURE.md's table of what
    /// each kernel runs on each tier). Where it has none, [`Precision::dtype`] is f32:
    /// a precision never runs slower than f32 on the same CPU.
    pub fn fast_here(self) -> bool {
        use crate::cpu;
        match self {
            Precision::F32 => true,
            // AMX-BF16 comes with AVX512_BF16, AMX-INT8 with AVX512_VNNI.
            // On the `avx2` tier the widening tile (`kernels::packed::bf16`): a pass over
            // MiniLM's weights, one thread, against the AVX2 f32 tile: see
            // ARCHITECTURE.md's tier table. On aarch64 `bfmmla` (16 multiply-adds an
            // instruction against `fmla`'s 4; counted, not timed).
            // Not on `avx512` without AVX512_BF16: its bf16 path (each panel widened into
            // an f32 copy for the AVX-512 f32 tile) is slower than f32 weights there.
            // all-MiniLM-L6-v2 on the Skylake-SP, alternated 5 times: batches of 32
            // 253.5 against 269.7 sentences/s, one sentence a call p50 6.40 against
            // 5.80 ms.
            Precision::Bf16 => {
                cpu::has_avx512_bf16()
                    || (cpu::has_avx2() && !cpu::has_avx512())
                    || cpu::has_arm_bf16()
            }
            // VNNI on zmm or ymm, or AVX2's `vpmaddubsw` tile where there is no AVX-512
            // (whose f32 tile the widened `vpmaddwd` int8 tile does not beat: a pass
            // over MiniLM's weights, one thread, 96.2 against 109.0 G/s at 28 rows, 88.4
            // against 89.5 at 896; the AVX2 tile against the AVX2 f32 one: 79.1 against
            // 44.0 and 75.4 against 42.0). On aarch64 `sdot` (16 multiply-adds an
            // instruction against `fmla`'s 4) or `smmla` (32; counted, not timed).
            Precision::Int8 => {
                cpu::has_avx512_vnni()
                    || cpu::has_avx_vnni()
                    || (cpu::has_avx2() && !cpu::has_avx512())
                    || cpu::has_dotprod()
            }
            Precision::Bf16x3 => cpu::has_amx_bf16(),
        }
    }

    /// The dtype the matrix weights are kept in: the precision's own where the tier
    /// has a fast product for it ([`Precision::fast_here`]), f32 otherwise.
    pub fn dtype(self) -> DType {
        if self.fast_here() {
            self.own_dtype()
        } else {
            DType::F32
        }
    }

    /// The precision's own dtype, whatever the tier.
    pub(crate) fn own_dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::Int8 => DType::I8,
            Precision::Bf16x3 => DType::BF16X3,
        }
    }

    /// The name used on command lines: `f32`, `bf16`, `int8` or `bf16x3`.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
            Precision::Bf16x3 => "bf16x3",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Precision {
    type Err = String;

    /// `f32`, `bf16`, `int8` (also `i8`) or `bf16x3`.
    fn from_str(s: &str) -> Result<Precision, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            "int8" | "i8" => Ok(Precision::Int8),
            "bf16x3" => Ok(Precision::Bf16x3),
            other => Err(format!(
                "unknown precision `{other}`: expected f32, bf16, int8 or bf16x3"
            )),
        }
    }
}

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

#[cfg(test)]
mod precision_tests {
    use super::*;

    /// A reduced precision keeps its own dtype exactly where the tier has a product
    /// for it faster than f32's, and f32 weights elsewhere (never a slower product).
    #[test]
    fn a_precision_without_a_fast_product_here_keeps_f32_weights() {
        use crate::kernels::cpu;
        assert!(Precision::F32.fast_here());
        assert_eq!(
            Precision::Bf16.fast_here(),
            cpu::has_avx512_bf16()
                || (cpu::has_avx2() && !cpu::has_avx512())
                || cpu::has_arm_bf16()
        );
        assert_eq!(
            Precision::Int8.fast_here(),
            cpu::has_avx512_vnni()
                || cpu::has_avx_vnni()
                || (cpu::has_avx2() && !cpu::has_avx512())
                || cpu::has_dotprod()
        );
        assert_eq!(Precision::Bf16x3.fast_here(), cpu::has_amx_bf16());
        for p in [
            Precision::F32,
            Precision::Bf16,
            Precision::Int8,
            Precision::Bf16x3,
        ] {
            let want = if p.fast_here() {
                p.own_dtype()
            } else {
                DType::F32
            };
            assert_eq!(p.dtype(), want, "{p}");
        }
    }
}
