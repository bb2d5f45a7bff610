//! The BERT encoder as sentence-transformers runs it for all-MiniLM-L6-v2: token,
//! position and type embeddings, `num_hidden_layers` post-norm transformer layers,
//! then mean pooling over the real (unmasked) tokens and L2 normalisation.
//!
//! This module owns the config ([`BertConfig`], read from `config.json`), the weights
//! ([`BertModel::load`], from `model.safetensors`), the forward pass
//! ([`BertModel::forward`]), and batching ([`BertModel::embed`]): sequences sorted by
//! length and batched with their neighbours, so a batch pays only for the padding up
//! to its own longest sequence, on one stream or split over several threads that
//! share one copy of the weights.
//!
//! Weights are converted once, at load, into the layout the forward pass multiplies
//! with: linear weights transposed to `[in, out]`, the query, key and value
//! projections joined into one `[hidden, 3 * hidden]` matrix (with the attention
//! scale `1/sqrt(head_dim)` folded into the query part), and the position and token
//! type embeddings added into one table. Each weight is one contiguous `Vec<f32>`
//! made straight from the file's bytes; the file's bytes are dropped after loading.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use safetensors::{Dtype, SafeTensors};

use super::ModelError;
use crate::{DType, Error, Result, Tensor};

/// The fields of a Hugging Face BERT `config.json` that the forward pass needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Rows of the token embedding table.
    pub vocab_size: usize,
    /// Width of every hidden state (384 for MiniLM-L6).
    pub hidden_size: usize,
    /// Number of transformer layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer; `hidden_size` must be a multiple of it.
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Longest sequence the position table covers.
    pub max_position_embeddings: usize,
    /// Rows of the token type table (at least 1: every token has type 0 here).
    pub type_vocab_size: usize,
    /// Epsilon of every layer norm.
    pub layer_norm_eps: f64,
    /// Activation of the feed-forward layer: `gelu` (exact), `gelu_new` /
    /// `gelu_pytorch_tanh` (tanh approximation) or `relu`.
    pub hidden_act: String,
    /// Token id used to pad sequences in a batch.
    pub pad_token_id: u32,
}

impl BertConfig {
    /// Parses the text of a `config.json`. Missing or ill-typed fields are named in
    /// the error.
    pub fn from_json(text: &str) -> std::result::Result<BertConfig, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        let obj = v
            .as_object()
            .ok_or_else(|| "expected a JSON object at the top level".to_string())?;
        let usize_field = |name: &str| -> std::result::Result<usize, String> {
            obj.get(name)
                .ok_or_else(|| format!("missing field `{name}`"))?
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| format!("field `{name}` must be a non-negative integer"))
        };
        let cfg = BertConfig {
            vocab_size: usize_field("vocab_size")?,
            hidden_size: usize_field("hidden_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads: usize_field("num_attention_heads")?,
            intermediate_size: usize_field("intermediate_size")?,
            max_position_embeddings: usize_field("max_position_embeddings")?,
            type_vocab_size: obj
                .get("type_vocab_size")
                .map(|_| usize_field("type_vocab_size"))
                .transpose()?
                .unwrap_or(2),
            layer_norm_eps: match obj.get("layer_norm_eps") {
                None => 1e-12,
                Some(x) => x
                    .as_f64()
                    .ok_or_else(|| "field `layer_norm_eps` must be a number".to_string())?,
            },
            hidden_act: match obj.get("hidden_act") {
                None => "gelu".to_string(),
                Some(x) => x
                    .as_str()
                    .ok_or_else(|| "field `hidden_act` must be a string".to_string())?
                    .to_string(),
            },
            pad_token_id: obj
                .get("pad_token_id")
                .and_then(|x| x.as_u64())
                .unwrap_or(0) as u32,
        };
        if let Some(kind) = obj.get("position_embedding_type").and_then(|x| x.as_str()) {
            if kind != "absolute" {
                return Err(format!(
                    "position_embedding_type `{kind}` is not supported (only `absolute`)"
                ));
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a `config.json` file.
    pub fn load(path: &Path) -> std::result::Result<BertConfig, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|error| ModelError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        BertConfig::from_json(&text).map_err(|msg| ModelError::Format {
            path: path.to_path_buf(),
            msg,
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ];
        for (name, n) in positive {
            if n == 0 {
                return Err(format!("field `{name}` must be positive"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.layer_norm_eps.is_nan() || self.layer_norm_eps < 0.0 {
            return Err("layer_norm_eps must be a non-negative number".into());
        }
        Activation::parse(&self.hidden_act)?;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Activation {
    Gelu,
    GeluTanh,
    Relu,
}

impl Activation {
    fn parse(name: &str) -> std::result::Result<Activation, String> {
        match name {
            "gelu" => Ok(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            "relu" => Ok(Activation::Relu),
            other => Err(format!(
                "hidden_act `{other}` is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu)"
            )),
        }
    }

    fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Relu => x.relu(),
        }
    }
}

/// The weights of one transformer layer, laid out for `x @ w + b`.
struct Layer {
    /// `[hidden, 3 * hidden]`: query (pre-scaled), key and value projections.
    qkv_w: Tensor,
    qkv_b: Tensor,
    /// `[hidden, hidden]`.
    out_w: Tensor,
    out_b: Tensor,
    ln1_w: Tensor,
    ln1_b: Tensor,
    /// `[hidden, intermediate]`.
    ff_in_w: Tensor,
    ff_in_b: Tensor,
    /// `[intermediate, hidden]`.
    ff_out_w: Tensor,
    ff_out_b: Tensor,
    ln2_w: Tensor,
    ln2_b: Tensor,
}

/// A BERT encoder with sentence-transformers pooling: loaded once, then shared by any
/// number of threads (`BertModel` is `Send + Sync`; its weights are read-only tensors
/// that every stream reads without copying).
pub struct BertModel {
    config: BertConfig,
    act: Activation,
    /// `[vocab, hidden]`.
    word_emb: Tensor,
    /// `[max_positions, hidden]`: position embeddings plus the type-0 embedding.
    pos_type_emb: Tensor,
    emb_ln_w: Tensor,
    emb_ln_b: Tensor,
    layers: Vec<Layer>,
}

/// How [`BertModel::embed`] batches and spreads its work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Sequences per forward pass (at least 1).
    pub batch: usize,
    /// Threads, each with its own stream, that take batches in turn (at least 1).
    pub threads: usize,
    /// Kernel threads of each stream (see [`set_kernel_threads`](crate::set_kernel_threads));
    /// `None` picks: all cores for one thread, else the cores split between threads.
    pub kernel_threads: Option<usize>,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            batch: 32,
            threads: 1,
            kernel_threads: None,
        }
    }
}

/// Reads tensors out of a parsed safetensors file and converts them to f32 vectors.
struct WeightReader<'a> {
    st: SafeTensors<'a>,
    path: &'a Path,
}

impl<'a> WeightReader<'a> {
    fn err(&self, msg: String) -> ModelError {
        ModelError::Format {
            path: self.path.to_path_buf(),
            msg,
        }
    }

    /// The raw little-endian f32 bytes of `name` (also tried with a `bert.` prefix),
    /// checked against `shape`.
    fn bytes(&self, name: &str, shape: &[usize]) -> std::result::Result<&'a [u8], ModelError> {
        let view = self
            .st
            .tensor(name)
            .or_else(|_| self.st.tensor(&format!("bert.{name}")))
            .map_err(|_| self.err(format!("weight `{name}` is missing")))?;
        if view.dtype() != Dtype::F32 {
            return Err(self.err(format!(
                "weight `{name}` is {:?}; only F32 weights are supported",
                view.dtype()
            )));
        }
        if view.shape() != shape {
            return Err(self.err(format!(
                "weight `{name}` has shape {:?}, expected {shape:?}",
                view.shape()
            )));
        }
        Ok(view.data())
    }

    /// `name` as a tensor of `shape`, converted in one pass.
    fn tensor(&self, name: &str, shape: &[usize]) -> std::result::Result<Tensor, ModelError> {
        let bytes = self.bytes(name, shape)?;
        Ok(Tensor::from_vec(f32s(bytes).collect(), shape)?)
    }

    /// The linear weight `name` (`[out, in]` in the file) transposed to `[in, out]`,
    /// times `scale`, written into `dst`'s columns `first..first + out`.
    fn linear_into(
        &self,
        name: &str,
        [out, inp]: [usize; 2],
        scale: f32,
        dst: Columns<'_>,
    ) -> std::result::Result<(), ModelError> {
        let bytes = self.bytes(name, &[out, inp])?;
        for (o, row) in bytes.chunks_exact(inp * 4).enumerate() {
            for (i, x) in f32s(row).enumerate() {
                dst.data[i * dst.cols + dst.first + o] = x * scale;
            }
        }
        Ok(())
    }

    /// The linear weight `name` (`[out, in]` in the file) as an `[in, out]` tensor.
    fn linear(
        &self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> std::result::Result<Tensor, ModelError> {
        let mut w = vec![0.0f32; out * inp];
        self.linear_into(
            name,
            [out, inp],
            1.0,
            Columns {
                data: &mut w,
                cols: out,
                first: 0,
            },
        )?;
        Ok(Tensor::from_vec(w, &[inp, out])?)
    }

    fn bias_into(
        &self,
        name: &str,
        n: usize,
        scale: f32,
        dst: &mut [f32],
    ) -> std::result::Result<(), ModelError> {
        let bytes = self.bytes(name, &[n])?;
        for (d, x) in dst.iter_mut().zip(f32s(bytes)) {
            *d = x * scale;
        }
        Ok(())
    }
}

/// A row-major `[rows, cols]` destination matrix and the first column to write.
struct Columns<'d> {
    data: &'d mut [f32],
    cols: usize,
    first: usize,
}

/// Little-endian f32 values of `bytes` (whose length is a multiple of 4).
fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

impl BertModel {
    /// Loads `config.json` and `model.safetensors` from the model folder `dir`.
    ///
    /// The safetensors file is read into memory once; each weight is converted from
    /// its bytes straight into the f32 tensor the forward pass uses (one pass, no
    /// intermediate copy), and the bytes are dropped when loading ends. The pooler
    /// weights and position ids in the file are not used by sentence embeddings and
    /// are not loaded.
    pub fn load(dir: &Path) -> std::result::Result<BertModel, ModelError> {
        let config = BertConfig::load(&dir.join("config.json"))?;
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).map_err(|error| ModelError::Io {
            path: path.clone(),
            error,
        })?;
        BertModel::from_safetensors(config, &bytes, &path)
    }

    /// Builds the model from `config` and the bytes of a safetensors file (`path` is
    /// only used in error messages).
    pub fn from_safetensors(
        config: BertConfig,
        bytes: &[u8],
        path: &Path,
    ) -> std::result::Result<BertModel, ModelError> {
        config.validate().map_err(|msg| ModelError::Format {
            path: PathBuf::from("config.json"),
            msg,
        })?;
        let st = SafeTensors::deserialize(bytes).map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            msg: format!("not a valid safetensors file: {e:?}"),
        })?;
        let r = WeightReader { st, path };
        let h = config.hidden_size;
        let inter = config.intermediate_size;
        let positions = config.max_position_embeddings;

        let word_emb = r.tensor("embeddings.word_embeddings.weight", &[config.vocab_size, h])?;
        let pos = r.bytes("embeddings.position_embeddings.weight", &[positions, h])?;
        let types = r.bytes(
            "embeddings.token_type_embeddings.weight",
            &[config.type_vocab_size, h],
        )?;
        let type0: Vec<f32> = f32s(&types[..h * 4]).collect();
        let pos_type: Vec<f32> = f32s(pos)
            .enumerate()
            .map(|(i, p)| p + type0[i % h])
            .collect();
        let pos_type_emb = Tensor::from_vec(pos_type, &[positions, h])?;
        let emb_ln_w = r.tensor("embeddings.LayerNorm.weight", &[h])?;
        let emb_ln_b = r.tensor("embeddings.LayerNorm.bias", &[h])?;

        let scale = 1.0 / (config.head_dim() as f32).sqrt();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}.");
            let mut qkv_w = vec![0.0f32; h * 3 * h];
            let mut qkv_b = vec![0.0f32; 3 * h];
            for (j, (part, s)) in [("query", scale), ("key", 1.0), ("value", 1.0)]
                .into_iter()
                .enumerate()
            {
                let name = format!("{p}attention.self.{part}");
                r.linear_into(
                    &format!("{name}.weight"),
                    [h, h],
                    s,
                    Columns {
                        data: &mut qkv_w,
                        cols: 3 * h,
                        first: j * h,
                    },
                )?;
                r.bias_into(
                    &format!("{name}.bias"),
                    h,
                    s,
                    &mut qkv_b[j * h..(j + 1) * h],
                )?;
            }
            layers.push(Layer {
                qkv_w: Tensor::from_vec(qkv_w, &[h, 3 * h])?,
                qkv_b: Tensor::from_vec(qkv_b, &[3 * h])?,
                out_w: r.linear(&format!("{p}attention.output.dense.weight"), h, h)?,
                out_b: r.tensor(&format!("{p}attention.output.dense.bias"), &[h])?,
                ln1_w: r.tensor(&format!("{p}attention.output.LayerNorm.weight"), &[h])?,
                ln1_b: r.tensor(&format!("{p}attention.output.LayerNorm.bias"), &[h])?,
                ff_in_w: r.linear(&format!("{p}intermediate.dense.weight"), inter, h)?,
                ff_in_b: r.tensor(&format!("{p}intermediate.dense.bias"), &[inter])?,
                ff_out_w: r.linear(&format!("{p}output.dense.weight"), h, inter)?,
                ff_out_b: r.tensor(&format!("{p}output.dense.bias"), &[h])?,
                ln2_w: r.tensor(&format!("{p}output.LayerNorm.weight"), &[h])?,
                ln2_b: r.tensor(&format!("{p}output.LayerNorm.bias"), &[h])?,
            });
        }
        let act = Activation::parse(&config.hidden_act).map_err(|msg| ModelError::Format {
            path: PathBuf::from("config.json"),
            msg,
        })?;
        Ok(BertModel {
            config,
            act,
            word_emb,
            pos_type_emb,
            emb_ln_w,
            emb_ln_b,
            layers,
        })
    }

    /// The model's config.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Width of the embeddings (`hidden_size`).
    pub fn dim(&self) -> usize {
        self.config.hidden_size
    }

    /// Sentence embeddings of a batch: `input_ids` `[batch, len]` (u32 or i64 token
    /// ids, padded on the right) and `attention_mask` `[batch, len]` (1 for a real
    /// token, 0 for padding; f32, u32 or i64). Returns `[batch, hidden]`: the mean of
    /// the last hidden states over the real tokens, L2-normalised. Padding changes
    /// nothing: padded positions are masked out of attention and pooling.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        let op = "bert_forward";
        if input_ids.rank() != 2 || attention_mask.dims() != input_ids.dims() {
            return Err(Error::Shape {
                op,
                msg: format!(
                    "input_ids and attention_mask must both be [batch, len], got {:?} and {:?}",
                    input_ids.dims(),
                    attention_mask.dims()
                ),
            });
        }
        let (b, l) = (input_ids.dims()[0], input_ids.dims()[1]);
        let cfg = &self.config;
        if b == 0 || l == 0 {
            return Err(Error::Shape {
                op,
                msg: format!("empty batch {:?}", input_ids.dims()),
            });
        }
        if l > cfg.max_position_embeddings {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "sequences of {l} tokens are longer than the model's {} positions",
                    cfg.max_position_embeddings
                ),
            });
        }
        let (h, heads, dh) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim());
        let mask = match attention_mask.dtype() {
            DType::F32 => attention_mask.clone(),
            _ => attention_mask.to_dtype(DType::F32)?,
        };

        let ids = input_ids.reshape(&[b * l])?;
        let x = self
            .word_emb
            .index_select(&ids, 0)?
            .reshape(&[b, l, h])?
            .add(&self.pos_type_emb.narrow(0, 0, l)?)?
            .layer_norm(&self.emb_ln_w, &self.emb_ln_b, cfg.layer_norm_eps)?;
        let mut x = x.reshape(&[b * l, h])?;

        // 0 where a key is a real token, -1e9 where it is padding.
        let key_bias = mask.affine(1e9, -1e9)?.reshape(&[b, 1, 1, l])?;
        for layer in &self.layers {
            // Attention: one matmul for q, k and v, viewed as [3, b, heads, l, dh].
            let qkv = x
                .matmul(&layer.qkv_w)?
                .add(&layer.qkv_b)?
                .reshape(&[b, l, 3, heads, dh])?
                .permute(&[2, 0, 3, 1, 4])?;
            let q = qkv.narrow(0, 0, 1)?.squeeze(0)?;
            let k = qkv.narrow(0, 1, 1)?.squeeze(0)?;
            let v = qkv.narrow(0, 2, 1)?.squeeze(0)?;
            let probs = q
                .matmul(&k.transpose(-1, -2)?)?
                .add(&key_bias)?
                .softmax(-1)?;
            let ctx = probs
                .matmul(&v)?
                .permute(&[0, 2, 1, 3])?
                .reshape(&[b * l, h])?;
            let a = ctx
                .matmul(&layer.out_w)?
                .add(&layer.out_b)?
                .add(&x)?
                .layer_norm(&layer.ln1_w, &layer.ln1_b, cfg.layer_norm_eps)?;
            // Feed-forward.
            let f = self
                .act
                .apply(&a.matmul(&layer.ff_in_w)?.add(&layer.ff_in_b)?)?
                .matmul(&layer.ff_out_w)?
                .add(&layer.ff_out_b)?
                .add(&a)?;
            x = f.layer_norm(&layer.ln2_w, &layer.ln2_b, cfg.layer_norm_eps)?;
        }

        // Mean pooling over real tokens: mask [b, 1, l] x hidden [b, l, h].
        let summed = mask
            .reshape(&[b, 1, l])?
            .matmul(&x.reshape(&[b, l, h])?)?
            .reshape(&[b, h])?;
        let count = mask.sum_keepdim(-1)?.maximum(&Tensor::full(1e-9, &[1])?)?;
        let mean = summed.div(&count)?;
        let norm = mean
            .mul(&mean)?
            .sum_keepdim(-1)?
            .sqrt()?
            .maximum(&Tensor::full(1e-12, &[1])?)?;
        mean.div(&norm)
    }

    /// Embeddings of a few token sequences in one forward pass, padded to the longest
    /// of them. Each sequence must have 1 to `max_position_embeddings` tokens, each
    /// below `vocab_size`.
    pub fn embed_batch(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let op = "bert_embed";
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let l = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        for (i, s) in seqs.iter().enumerate() {
            self.check_sequence(op, i, s)?;
        }
        let b = seqs.len();
        let mut ids = vec![self.config.pad_token_id; b * l];
        let mut mask = vec![0.0f32; b * l];
        for (i, s) in seqs.iter().enumerate() {
            ids[i * l..i * l + s.len()].copy_from_slice(s);
            mask[i * l..i * l + s.len()].fill(1.0);
        }
        let ids = Tensor::from_vec(ids, &[b, l])?;
        let mask = Tensor::from_vec(mask, &[b, l])?;
        let out = self.forward(&ids, &mask)?.to_vec::<f32>()?;
        Ok(out.chunks_exact(self.dim()).map(|c| c.to_vec()).collect())
    }

    fn check_sequence(&self, op: &'static str, i: usize, s: &[u32]) -> Result<()> {
        let max = self.config.max_position_embeddings;
        if s.is_empty() || s.len() > max {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "sequence {i} has {} tokens; sequences need 1 to {max}",
                    s.len()
                ),
            });
        }
        if let Some(&bad) = s.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "sequence {i} has token id {bad}, outside the vocabulary of {}",
                    self.config.vocab_size
                ),
            });
        }
        Ok(())
    }

    /// Embeddings of many token sequences, returned in input order.
    ///
    /// Sequences are sorted by length and cut into batches of `opts.batch`
    /// neighbours, so each batch is padded only to its own longest sequence. With
    /// `opts.threads > 1`, that many threads (each its own stream) share this model's
    /// weights and take batches in turn, longest first.
    pub fn embed(&self, seqs: &[Vec<u32>], opts: &EmbedOptions) -> Result<Vec<Vec<f32>>> {
        let op = "bert_embed";
        if opts.batch == 0 || opts.threads == 0 {
            return Err(Error::Arg {
                op,
                msg: format!(
                    "batch and threads must be at least 1, got batch {} and threads {}",
                    opts.batch, opts.threads
                ),
            });
        }
        for (i, s) in seqs.iter().enumerate() {
            self.check_sequence(op, i, s)?;
        }
        let batches = length_sorted_batches(seqs, opts.batch);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = opts.threads.min(batches.len().max(1));
        let kernel_threads = opts.kernel_threads.unwrap_or(if threads == 1 {
            0
        } else {
            (cores / threads).max(1)
        });
        let results: Mutex<Vec<Option<Vec<f32>>>> = Mutex::new(vec![None; seqs.len()]);
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let work = || {
            if opts.kernel_threads.is_some() || threads > 1 {
                crate::set_kernel_threads(kernel_threads);
            }
            while !failed.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(batch) = batches.get(i) else { break };
                let refs: Vec<&[u32]> = batch.iter().map(|&j| seqs[j].as_slice()).collect();
                match self.embed_batch(&refs) {
                    Ok(embs) => {
                        let mut r = results.lock();
                        for (&j, e) in batch.iter().zip(embs) {
                            r[j] = Some(e);
                        }
                    }
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        first_error.lock().get_or_insert(e);
                    }
                }
            }
        };
        if threads <= 1 {
            work();
        } else {
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(work);
                }
            });
        }
        if let Some(e) = first_error.into_inner() {
            return Err(e);
        }
        results
            .into_inner()
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                e.ok_or_else(|| Error::Kernel {
                    op,
                    msg: format!("sequence {i} was not embedded (a worker thread panicked)"),
                })
            })
            .collect()
    }
}

/// Indices of `seqs` cut into batches of at most `batch` sequences of similar length:
/// sorted by length (longest first, ties in input order), then chunked.
pub fn length_sorted_batches(seqs: &[Vec<u32>], batch: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].len()));
    order.chunks(batch.max(1)).map(|c| c.to_vec()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_minilm_fields() {
        let cfg = BertConfig::from_json(
            r#"{"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
                "num_attention_heads": 12, "intermediate_size": 1536,
                "max_position_embeddings": 512, "type_vocab_size": 2,
                "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}"#,
        )
        .unwrap();
        assert_eq!(cfg.head_dim(), 32);
        assert_eq!(cfg.layer_norm_eps, 1e-12);
    }

    #[test]
    fn config_errors_name_the_field() {
        let e = BertConfig::from_json(r#"{"vocab_size": 10}"#).unwrap_err();
        assert!(e.contains("hidden_size"), "{e}");
        let e = BertConfig::from_json("not json").unwrap_err();
        assert!(e.contains("JSON"), "{e}");
        let e = BertConfig::from_json(
            r#"{"vocab_size": 1, "hidden_size": 10, "num_hidden_layers": 1,
                "num_attention_heads": 3, "intermediate_size": 4,
                "max_position_embeddings": 8}"#,
        )
        .unwrap_err();
        assert!(e.contains("multiple"), "{e}");
    }

    #[test]
    fn batches_group_similar_lengths() {
        let seqs: Vec<Vec<u32>> = [3, 9, 1, 8, 2, 9].iter().map(|&n| vec![1; n]).collect();
        let b = length_sorted_batches(&seqs, 2);
        assert_eq!(b, vec![vec![1, 5], vec![3, 0], vec![4, 2]]);
    }
}
