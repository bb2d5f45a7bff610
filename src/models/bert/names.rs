//! Where each weight of a layer lies in the safetensors file, by family: BERT and
//! RoBERTa's families name them one way, MPNet another, for the same encoder layer
//! ([`LayerNames`]).

/// The names (without `.weight`/`.bias`) of one layer's weights.
pub(super) struct LayerNames {
    /// The query, key and value projections, in that order.
    pub(super) qkv: [String; 3],
    /// The attention's output projection.
    pub(super) out: String,
    /// The layer norm after attention.
    pub(super) ln1: String,
    /// The feed-forward's first and second projections.
    pub(super) ff_in: String,
    pub(super) ff_out: String,
    /// The layer norm after the feed-forward.
    pub(super) ln2: String,
}

impl LayerNames {
    /// The names of layer `l`'s weights in a model of `model_type`.
    pub(super) fn of(model_type: &str, l: usize) -> LayerNames {
        let p = format!("encoder.layer.{l}.");
        let (qkv, out, ln1) = if model_type == "mpnet" {
            (
                ["q", "k", "v"].map(|x| format!("{p}attention.attn.{x}")),
                format!("{p}attention.attn.o"),
                format!("{p}attention.LayerNorm"),
            )
        } else {
            (
                ["query", "key", "value"].map(|x| format!("{p}attention.self.{x}")),
                format!("{p}attention.output.dense"),
                format!("{p}attention.output.LayerNorm"),
            )
        };
        LayerNames {
            qkv,
            out,
            ln1,
            ff_in: format!("{p}intermediate.dense"),
            ff_out: format!("{p}output.dense"),
            ln2: format!("{p}output.LayerNorm"),
        }
    }
}
