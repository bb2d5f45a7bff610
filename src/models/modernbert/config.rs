//! The encoder's hyperparameters: [`ModernBertConfig`], read from a Hugging Face
//! ModernBERT `config.json` and checked. Both spellings transformers has written are
//! read: the newer `layer_types` and `rope_parameters` (per layer type), and the
//! older `global_attn_every_n_layers`, `global_rope_theta` and `local_rope_theta`.
//! What the engine cannot run exactly (biases in the linear layers, scaled rotary
//! positions, another activation) is refused by name, never run approximately.

use std::path::Path;

use super::super::{json, ModelError};

/// The fields of a ModernBERT `config.json` the forward pass needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ModernBertConfig {
    /// Rows of the token embedding table.
    pub vocab_size: usize,
    /// Width of every hidden state (768 for ModernBERT-base).
    pub hidden_size: usize,
    /// Width of the gated feed-forward (GeGLU).
    pub intermediate_size: usize,
    /// Number of encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (`hidden_size / num_attention_heads` wide).
    pub num_attention_heads: usize,
    /// The longest sequence the model was built for.
    pub max_position_embeddings: usize,
    /// Epsilon of every layer norm.
    pub norm_eps: f64,
    /// Whether the layer norms have biases (ModernBERT's have none).
    pub norm_bias: bool,
    /// The local layers' window: a token sees the keys at most
    /// `local_attention / 2` positions away on either side.
    pub local_attention: usize,
    /// Layer `l` attends globally when `l % global_attn_every_n_layers == 0`, within
    /// its local window otherwise (transformers decides the window this way, and the
    /// rotary base by `layer_types`; the two must agree).
    pub global_attn_every_n_layers: usize,
    /// The rotary base θ of the global layers.
    pub global_rope_theta: f64,
    /// The rotary base θ of the local layers.
    pub local_rope_theta: f64,
}

impl ModernBertConfig {
    /// Parses the text of a `config.json` whose `model_type` is `modernbert`. Missing
    /// or ill-typed fields, and features the engine does not run, are named in the
    /// error.
    pub fn from_json(text: &str) -> std::result::Result<ModernBertConfig, String> {
        let obj = json::object(text)?;
        let usize_field = |name: &str| json::usize_field(&obj, name);
        let or = |name: &str, default: usize| match obj.get(name) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(_) => usize_field(name),
        };
        let model_type = obj.get("model_type").and_then(|t| t.as_str());
        if model_type != Some("modernbert") {
            return Err(format!("model_type {model_type:?} is not `modernbert`"));
        }
        if let Some(act) = obj.get("hidden_activation").and_then(|x| x.as_str()) {
            if act != "gelu" {
                return Err(format!(
                    "hidden_activation `{act}` is not supported for modernbert (only gelu, GeGLU)"
                ));
            }
        }
        for name in ["attention_bias", "mlp_bias"] {
            if obj.get(name).and_then(|x| x.as_bool()) == Some(true) {
                return Err(format!("{name} true is not supported for modernbert"));
            }
        }
        let every = or("global_attn_every_n_layers", 3)?;
        let layers = usize_field("num_hidden_layers")?;
        if let Some(kinds) = obj.get("layer_types").and_then(|x| x.as_array()) {
            check_layer_types(kinds, layers, every)?;
        }
        let (global_theta, local_theta) = rope_thetas(&obj)?;
        let cfg = ModernBertConfig {
            vocab_size: usize_field("vocab_size")?,
            hidden_size: usize_field("hidden_size")?,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: layers,
            num_attention_heads: usize_field("num_attention_heads")?,
            max_position_embeddings: usize_field("max_position_embeddings")?,
            norm_eps: number(obj.get("norm_eps"), "norm_eps", 1e-5)?,
            norm_bias: obj.get("norm_bias").and_then(|x| x.as_bool()) == Some(true),
            local_attention: or("local_attention", 128)?,
            global_attn_every_n_layers: every,
            global_rope_theta: global_theta,
            local_rope_theta: local_theta,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a `config.json` file.
    pub fn load(path: &Path) -> std::result::Result<ModernBertConfig, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|error| ModelError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        ModernBertConfig::from_json(&text).map_err(|msg| ModelError::Format {
            path: path.to_path_buf(),
            msg,
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Whether layer `l` attends only within its local window.
    pub fn is_local(&self, l: usize) -> bool {
        !l.is_multiple_of(self.global_attn_every_n_layers)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        json::all_positive(&[
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("max_position_embeddings", self.max_position_embeddings),
            (
                "global_attn_every_n_layers",
                self.global_attn_every_n_layers,
            ),
        ])?;
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "the head width {} must be even (rotary positions)",
                self.head_dim()
            ));
        }
        if self.norm_eps.is_nan() || self.norm_eps < 0.0 {
            return Err("norm_eps must be a non-negative number".into());
        }
        for (name, theta) in [
            ("global rope_theta", self.global_rope_theta),
            ("local rope_theta", self.local_rope_theta),
        ] {
            if theta.is_nan() || theta <= 0.0 || theta.is_infinite() {
                return Err(format!("{name} must be a positive number"));
            }
        }
        Ok(())
    }
}

/// The number `x` (field `name`), or `default` when it is absent.
fn number(x: Option<&serde_json::Value>, name: &str, default: f64) -> Result<f64, String> {
    match x {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(x) => x
            .as_f64()
            .ok_or_else(|| format!("field `{name}` must be a number")),
    }
}

/// `layer_types` must be what `global_attn_every_n_layers` implies: transformers
/// takes the window from the one and the rotary base from the other.
fn check_layer_types(
    kinds: &[serde_json::Value],
    layers: usize,
    every: usize,
) -> Result<(), String> {
    if kinds.len() != layers {
        return Err(format!(
            "layer_types has {} entries for {layers} layers",
            kinds.len()
        ));
    }
    for (l, k) in kinds.iter().enumerate() {
        let want = if every > 0 && l.is_multiple_of(every) {
            "full_attention"
        } else {
            "sliding_attention"
        };
        if k.as_str() != Some(want) {
            return Err(format!(
                "layer_types[{l}] is {k}, but global_attn_every_n_layers {every} makes it \
                 `{want}` (a pattern the engine cannot run exactly)"
            ));
        }
    }
    Ok(())
}

/// The global and local rotary bases: from `rope_parameters` (per layer type), else
/// `global_rope_theta` and `local_rope_theta`, else transformers' defaults (160000
/// and 10000). A scaled rotary type is refused.
fn rope_thetas(obj: &serde_json::Map<String, serde_json::Value>) -> Result<(f64, f64), String> {
    let params = obj.get("rope_parameters").and_then(|r| r.as_object());
    let theta = |kind: &str, old: &str, default: f64| -> Result<f64, String> {
        let p = params.and_then(|p| p.get(kind)).and_then(|p| p.as_object());
        if let Some(t) = p.and_then(|p| p.get("rope_type")).and_then(|t| t.as_str()) {
            if t != "default" {
                return Err(format!(
                    "rope_type `{t}` ({kind}) is not supported for modernbert (only default)"
                ));
            }
        }
        let field = p.and_then(|p| p.get("rope_theta")).or(obj.get(old));
        number(field, old, default)
    };
    let thetas = (
        theta("full_attention", "global_rope_theta", 160_000.0)?,
        theta("sliding_attention", "local_rope_theta", 10_000.0)?,
    );
    if obj.get("rope_scaling").is_some_and(|x| !x.is_null()) {
        return Err("rope_scaling is not supported for modernbert".into());
    }
    Ok(thetas)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"{"model_type": "modernbert", "vocab_size": 10,
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 3,
        "num_attention_heads": 2, "max_position_embeddings": 64, "norm_eps": 1e-5,
        "norm_bias": false, "local_attention": 16, "global_attn_every_n_layers": 2,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {"full_attention": {"rope_theta": 160000.0, "rope_type":
        "default"}, "sliding_attention": {"rope_theta": 10000.0, "rope_type":
        "default"}}, "hidden_activation": "gelu", "attention_bias": false,
        "mlp_bias": false}"#;

    #[test]
    fn config_reads_the_new_and_the_old_fields() {
        let c = ModernBertConfig::from_json(SMALL).unwrap();
        assert_eq!((c.head_dim(), c.local_attention), (4, 16));
        assert_eq!(
            (c.global_rope_theta, c.local_rope_theta),
            (160000.0, 10000.0)
        );
        assert_eq!(
            (0..3).map(|l| c.is_local(l)).collect::<Vec<_>>(),
            [false, true, false]
        );
        let old = r#"{"model_type": "modernbert", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2,
            "max_position_embeddings": 64, "global_rope_theta": 5000.0,
            "local_rope_theta": 50.0}"#;
        let c = ModernBertConfig::from_json(old).unwrap();
        assert_eq!((c.global_rope_theta, c.local_rope_theta), (5000.0, 50.0));
        assert_eq!((c.global_attn_every_n_layers, c.local_attention), (3, 128));
        assert!(!c.norm_bias && c.is_local(2) && !c.is_local(3));
    }

    #[test]
    fn what_is_not_run_exactly_is_refused_by_name() {
        for (from, to, what) in [
            (r#""gelu""#, r#""silu""#, "hidden_activation `silu`"),
            (
                r#""sliding_attention", "full_attention"]"#,
                r#""full_attention", "full_attention"]"#,
                "layer_types[1]",
            ),
            (r#""default"}}"#, r#""yarn"}}"#, "rope_type `yarn`"),
            (r#""mlp_bias": false"#, r#""mlp_bias": true"#, "mlp_bias"),
            (
                r#""attention_bias": false"#,
                r#""attention_bias": true"#,
                "attention_bias",
            ),
            (
                r#""num_attention_heads": 2"#,
                r#""num_attention_heads": 3"#,
                "multiple",
            ),
            (r#""hidden_size": 8"#, r#""hidden_size": 6"#, "even"),
            (r#""modernbert""#, r#""bert""#, "not `modernbert`"),
            (r#""vocab_size": 10"#, r#""vocab_size": 0"#, "vocab_size"),
        ] {
            let e = ModernBertConfig::from_json(&SMALL.replace(from, to)).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
    }
}
