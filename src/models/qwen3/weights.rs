//! Loading a Qwen3 model: `config.json` and `model.safetensors` from a folder
//! ([`Qwen3Model::load_as`]), each weight checked by name, dtype and shape and
//! converted straight into the layout the forward pass uses, and the rotary tables.

use std::path::{Path, PathBuf};

use super::super::weights::WeightReader;
use super::super::{ragged, ModelError, Precision};
use super::{Layer, Qwen3Config, Qwen3Model};
use crate::Tensor;

impl Qwen3Model {
    /// Loads `config.json` and `model.safetensors` from the model folder `dir`, with
    /// the matrix weights in `precision` (the norms and the token embeddings stay
    /// f32).
    pub fn load_as(
        dir: &Path,
        precision: Precision,
    ) -> std::result::Result<Qwen3Model, ModelError> {
        let config = Qwen3Config::load(&dir.join("config.json"))?;
        let path = dir.join("model.safetensors");
        Qwen3Model::from_reader(config, &WeightReader::open_file(&path, precision)?)
    }

    /// Builds the model from `config` and the bytes of a safetensors file (`path`
    /// names it in errors).
    pub fn from_safetensors_as(
        config: Qwen3Config,
        bytes: &[u8],
        path: &Path,
        precision: Precision,
    ) -> std::result::Result<Qwen3Model, ModelError> {
        Qwen3Model::from_reader(config, &WeightReader::open(bytes, path, precision)?)
    }

    /// The model from `config` and the weights `r` reads.
    fn from_reader(
        config: Qwen3Config,
        r: &WeightReader<'_>,
    ) -> std::result::Result<Qwen3Model, ModelError> {
        let precision = r.precision();
        let c = &config;
        let (h, dh, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_out, kv_out) = (c.num_attention_heads * dh, c.num_key_value_heads * dh);
        let scale = 1.0 / (dh as f32).sqrt();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = format!("layers.{l}.");
            let name = |s: &str| format!("{p}{s}.weight");
            let (q, k, v) = (
                name("self_attn.q_proj"),
                name("self_attn.k_proj"),
                name("self_attn.v_proj"),
            );
            let (gate, up) = (name("mlp.gate_proj"), name("mlp.up_proj"));
            let q_norm = r.tensor(&name("self_attn.q_norm"), &[dh])?;
            layers.push(Layer {
                in_norm: r.tensor(&name("input_layernorm"), &[h])?,
                qkv_w: r
                    .linears_joined(&[(&q, q_out, 1.0), (&k, kv_out, 1.0), (&v, kv_out, 1.0)], h)?,
                // The attention scale, folded into the query norm's weight: the
                // norm's output is what the scores multiply.
                q_norm: Tensor::from_vec(
                    q_norm.to_vec::<f32>()?.iter().map(|w| w * scale).collect(),
                    &[dh],
                )?,
                k_norm: r.tensor(&name("self_attn.k_norm"), &[dh])?,
                out_w: r.linear(&name("self_attn.o_proj"), h, q_out)?,
                post_norm: r.tensor(&name("post_attention_layernorm"), &[h])?,
                gate_up_w: r.linears_joined(&[(&gate, inter, 1.0), (&up, inter, 1.0)], h)?,
                down_w: r.linear(&name("mlp.down_proj"), h, inter)?,
            });
        }
        let (cos, sin) = ragged::rotary_tables(c.rope_theta, dh, c.max_position_embeddings)
            .map_err(|e| ModelError::Format {
                path: PathBuf::from("config.json"),
                msg: format!("rotary tables: {e}"),
            })?;
        Ok(Qwen3Model {
            embed: r.tensor("embed_tokens.weight", &[c.vocab_size, h])?,
            final_norm: r.tensor("norm.weight", &[h])?,
            layers,
            cos,
            sin,
            precision,
            config,
        })
    }
}
