//! The decoder's hyperparameters: [`Qwen3Config`], read from a Hugging Face Qwen3
//! `config.json` and checked. What the engine cannot run exactly (sliding-window
//! layers, attention biases, scaled rotary positions, another activation) is refused
//! by name, never run approximately.

use std::path::Path;

use super::super::{json, ModelError};

/// The fields of a Qwen3 `config.json` the forward pass needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3Config {
    /// Rows of the token embedding table.
    pub vocab_size: usize,
    /// Width of every hidden state (1024 for Qwen3-Embedding-0.6B).
    pub hidden_size: usize,
    /// Width of the gated feed-forward (SwiGLU).
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Key and value heads per layer (grouped-query attention): a divisor of
    /// `num_attention_heads`; query head `h` reads k/v head `h / (heads / kv_heads)`.
    pub num_key_value_heads: usize,
    /// Width of one head (Qwen3 states it: `heads · head_dim` need not be
    /// `hidden_size`).
    pub head_dim: usize,
    /// The longest sequence the model was built for.
    pub max_position_embeddings: usize,
    /// Epsilon of every RMS norm.
    pub rms_norm_eps: f64,
    /// The rotary base θ (`rope_parameters.rope_theta`, or `rope_theta` in older
    /// configs).
    pub rope_theta: f64,
}

impl Qwen3Config {
    /// Parses the text of a `config.json` whose `model_type` is `qwen3`. Missing or
    /// ill-typed fields, and features the engine does not run, are named in the error.
    pub fn from_json(text: &str) -> std::result::Result<Qwen3Config, String> {
        let obj = json::object(text)?;
        let usize_field = |name: &str| json::usize_field(&obj, name);
        let f64_field = |x: Option<&serde_json::Value>, name: &str, default: f64| match x {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(x) => x
                .as_f64()
                .ok_or_else(|| format!("field `{name}` must be a number")),
        };
        let model_type = obj.get("model_type").and_then(|t| t.as_str());
        if model_type != Some("qwen3") {
            return Err(format!("model_type {model_type:?} is not `qwen3`"));
        }
        if let Some(act) = obj.get("hidden_act").and_then(|x| x.as_str()) {
            if act != "silu" {
                return Err(format!(
                    "hidden_act `{act}` is not supported for qwen3 (only silu, SwiGLU)"
                ));
            }
        }
        if obj.get("attention_bias").and_then(|x| x.as_bool()) == Some(true) {
            return Err("attention_bias true is not supported for qwen3".into());
        }
        if obj.get("use_sliding_window").and_then(|x| x.as_bool()) == Some(true) {
            return Err("use_sliding_window true is not supported for qwen3 yet".into());
        }
        if let Some(kinds) = obj.get("layer_types").and_then(|x| x.as_array()) {
            if let Some(k) = kinds.iter().find(|k| k.as_str() != Some("full_attention")) {
                return Err(format!(
                    "layer type {k} is not supported for qwen3 (only full_attention)"
                ));
            }
        }
        let rope = obj.get("rope_parameters").or(obj.get("rope_scaling"));
        let rope = rope.and_then(|r| r.as_object());
        if let Some(kind) = rope
            .and_then(|r| r.get("rope_type"))
            .and_then(|x| x.as_str())
        {
            if kind != "default" {
                return Err(format!(
                    "rope_type `{kind}` is not supported for qwen3 (only default)"
                ));
            }
        }
        let theta = rope
            .and_then(|r| r.get("rope_theta"))
            .or(obj.get("rope_theta"));
        let heads = usize_field("num_attention_heads")?;
        let hidden = usize_field("hidden_size")?;
        let cfg = Qwen3Config {
            vocab_size: usize_field("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: match obj.get("num_key_value_heads") {
                None | Some(serde_json::Value::Null) => heads,
                Some(_) => usize_field("num_key_value_heads")?,
            },
            head_dim: match obj.get("head_dim") {
                None | Some(serde_json::Value::Null) => hidden / heads.max(1),
                Some(_) => usize_field("head_dim")?,
            },
            max_position_embeddings: usize_field("max_position_embeddings")?,
            rms_norm_eps: f64_field(obj.get("rms_norm_eps"), "rms_norm_eps", 1e-6)?,
            rope_theta: f64_field(theta, "rope_theta", 10000.0)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a `config.json` file.
    pub fn load(path: &Path) -> std::result::Result<Qwen3Config, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|error| ModelError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        Qwen3Config::from_json(&text).map_err(|msg| ModelError::Format {
            path: path.to_path_buf(),
            msg,
        })
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        json::all_positive(&positive)?;
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim {} must be even (rotary positions)",
                self.head_dim
            ));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps < 0.0 {
            return Err("rms_norm_eps must be a non-negative number".into());
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 || self.rope_theta.is_infinite() {
            return Err("rope_theta must be a positive number".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"{"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 4, "max_position_embeddings": 32,
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1000000.0,
        "rope_type": "default"}, "hidden_act": "silu", "layer_types":
        ["full_attention"]}"#;

    #[test]
    fn config_reads_the_new_and_the_old_rope_fields() {
        let c = Qwen3Config::from_json(SMALL).unwrap();
        assert_eq!((c.num_key_value_heads, c.head_dim), (2, 4));
        assert_eq!(c.rope_theta, 1e6);
        let old = SMALL.replace(
            r#""rope_parameters": {"rope_theta": 1000000.0,
        "rope_type": "default"}"#,
            r#""rope_theta": 5000.0"#,
        );
        assert_eq!(Qwen3Config::from_json(&old).unwrap().rope_theta, 5000.0);
    }

    #[test]
    fn what_is_not_run_exactly_is_refused_by_name() {
        for (from, to, what) in [
            (r#""silu""#, r#""gelu""#, "hidden_act `gelu`"),
            (
                r#""full_attention"]"#,
                r#""sliding_attention"]"#,
                "sliding_attention",
            ),
            (r#""default""#, r#""yarn""#, "rope_type `yarn`"),
            (
                r#""num_key_value_heads": 2"#,
                r#""num_key_value_heads": 3"#,
                "multiple",
            ),
            (r#""head_dim": 4"#, r#""head_dim": 5"#, "even"),
            (r#""qwen3""#, r#""llama""#, "not `qwen3`"),
        ] {
            let e = Qwen3Config::from_json(&SMALL.replace(from, to)).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        let biased = SMALL.replace(
            "{\"model_type\"",
            "{\"attention_bias\": true, \"model_type\"",
        );
        assert!(Qwen3Config::from_json(&biased)
            .unwrap_err()
            .contains("attention_bias"));
    }
}
