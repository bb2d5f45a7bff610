//! Test helpers: the weights of a small BERT encoder as Hugging Face names them, with
//! deterministic values, and the safetensors file holding them (for the model's, the
//! classifier's and the embedder's unit tests).

use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// A weight: its name, shape and values.
pub(crate) type Weight = (String, Vec<usize>, Vec<f32>);

/// Names and shapes of a one-layer encoder's weights (each name after `prefix`): a
/// vocabulary of `vocab`, width `h`, feed-forward width `i`, `positions` positions and
/// two token types.
pub(crate) fn encoder_shapes(
    prefix: &str,
    vocab: usize,
    h: usize,
    i: usize,
    positions: usize,
) -> Vec<(String, Vec<usize>)> {
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("embeddings.word_embeddings.weight".into(), vec![vocab, h]),
        (
            "embeddings.position_embeddings.weight".into(),
            vec![positions, h],
        ),
        ("embeddings.token_type_embeddings.weight".into(), vec![2, h]),
        ("embeddings.LayerNorm.weight".into(), vec![h]),
        ("embeddings.LayerNorm.bias".into(), vec![h]),
    ];
    for (name, shape) in [
        ("attention.self.query.weight", vec![h, h]),
        ("attention.self.query.bias", vec![h]),
        ("attention.self.key.weight", vec![h, h]),
        ("attention.self.key.bias", vec![h]),
        ("attention.self.value.weight", vec![h, h]),
        ("attention.self.value.bias", vec![h]),
        ("attention.output.dense.weight", vec![h, h]),
        ("attention.output.dense.bias", vec![h]),
        ("attention.output.LayerNorm.weight", vec![h]),
        ("attention.output.LayerNorm.bias", vec![h]),
        ("intermediate.dense.weight", vec![i, h]),
        ("intermediate.dense.bias", vec![i]),
        ("output.dense.weight", vec![h, i]),
        ("output.dense.bias", vec![h]),
        ("output.LayerNorm.weight", vec![h]),
        ("output.LayerNorm.bias", vec![h]),
    ] {
        shapes.push((format!("encoder.layer.0.{name}"), shape));
    }
    shapes
        .into_iter()
        .map(|(name, shape)| (format!("{prefix}{name}"), shape))
        .collect()
}

/// `shapes` filled, in order, with values in [-0.5, 0.5) from a linear congruential
/// generator started at `seed`.
pub(crate) fn filled(shapes: Vec<(String, Vec<usize>)>, seed: u32) -> Vec<Weight> {
    let mut seed = seed;
    shapes
        .into_iter()
        .map(|(name, shape)| {
            let values = (0..shape.iter().product::<usize>())
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
                })
                .collect();
            (name, shape, values)
        })
        .collect()
}

/// A safetensors file holding `weights` in f32.
pub(crate) fn safetensors_file(weights: &[Weight]) -> Vec<u8> {
    let data: Vec<Vec<u8>> = weights
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = weights.iter().zip(&data).map(|((name, shape, _), bytes)| {
        (
            name.clone(),
            TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap(),
        )
    });
    safetensors::serialize(views, None).unwrap()
}
