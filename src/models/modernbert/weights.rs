//! Loading a ModernBERT model: `config.json` and `model.safetensors` from a folder
//! ([`ModernBertModel::load_as`]), each weight checked by name, dtype and shape and
//! converted straight into the layout the forward pass uses, and the two kinds of
//! layer's rotary tables.

use std::path::{Path, PathBuf};

use super::super::weights::WeightReader;
use super::super::{ragged, ModelError, Precision};
use super::{Layer, ModernBertConfig, ModernBertModel, Rotary};
use crate::Tensor;

impl ModernBertModel {
    /// Loads `config.json` and `model.safetensors` from the model folder `dir`, with
    /// the matrix weights in `precision` (the norms and the token embeddings stay
    /// f32).
    pub fn load_as(
        dir: &Path,
        precision: Precision,
    ) -> std::result::Result<ModernBertModel, ModelError> {
        let config = ModernBertConfig::load(&dir.join("config.json"))?;
        let path = dir.join("model.safetensors");
        ModernBertModel::from_reader(config, &WeightReader::open_file(&path, precision)?)
    }

    /// Builds the model from `config` and the bytes of a safetensors file (`path`
    /// names it in errors).
    pub fn from_safetensors_as(
        config: ModernBertConfig,
        bytes: &[u8],
        path: &Path,
        precision: Precision,
    ) -> std::result::Result<ModernBertModel, ModelError> {
        ModernBertModel::from_reader(config, &WeightReader::open(bytes, path, precision)?)
    }

    /// The model from `config` and the weights `r` reads.
    fn from_reader(
        config: ModernBertConfig,
        r: &WeightReader<'_>,
    ) -> std::result::Result<ModernBertModel, ModelError> {
        let precision = r.precision();
        let c = &config;
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        // A layer norm's weight and bias (zeros where the model has none).
        let norm = |name: &str| -> std::result::Result<(Tensor, Tensor), ModelError> {
            let bias = if c.norm_bias {
                r.tensor(&format!("{name}.bias"), &[h])?
            } else {
                Tensor::from_vec(vec![0.0f32; h], &[h])?
            };
            Ok((r.tensor(&format!("{name}.weight"), &[h])?, bias))
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = format!("layers.{l}.");
            layers.push(Layer {
                attn_norm: match l {
                    0 => None,
                    _ => Some(norm(&format!("{p}attn_norm"))?),
                },
                qkv_w: r.linear(&format!("{p}attn.Wqkv.weight"), 3 * h, h)?,
                out_w: r.linear(&format!("{p}attn.Wo.weight"), h, h)?,
                mlp_norm: norm(&format!("{p}mlp_norm"))?,
                wi: r.linear(&format!("{p}mlp.Wi.weight"), 2 * inter, h)?,
                wo: r.linear(&format!("{p}mlp.Wo.weight"), h, inter)?,
            });
        }
        let rotary = |theta: f64| -> std::result::Result<Rotary, ModelError> {
            let (cos, sin) = ragged::rotary_tables(theta, c.head_dim(), c.max_position_embeddings)
                .map_err(|e| ModelError::Format {
                    path: PathBuf::from("config.json"),
                    msg: format!("rotary tables: {e}"),
                })?;
            Ok(Rotary { cos, sin })
        };
        Ok(ModernBertModel {
            embed: r.tensor("embeddings.tok_embeddings.weight", &[c.vocab_size, h])?,
            embed_norm: norm("embeddings.norm")?,
            final_norm: norm("final_norm")?,
            layers,
            global: rotary(c.global_rope_theta)?,
            local: rotary(c.local_rope_theta)?,
            precision,
            config,
        })
    }
}
