//! Helpers shared by the engine tests and the benches: deterministic data and a BERT
//! encoder layer written with the public API, as a user would write it.
//!
//! Included with `#[path]` from benches, and as `mod support;` from tests; not every
//! user needs every helper.
#![allow(dead_code)]

use streamfuse::Tensor;

/// Runs `f` with fusion on and off on this thread; returns both results and the
/// fused segment's flush info.
pub fn fused_and_unfused(f: impl Fn() -> Tensor) -> (Vec<f32>, Vec<f32>, streamfuse::FlushInfo) {
    streamfuse::set_fusion(true);
    let fused = f().to_vec::<f32>().unwrap();
    let info = streamfuse::last_flush().unwrap();
    streamfuse::set_fusion(false);
    let plain = f().to_vec::<f32>().unwrap();
    streamfuse::set_fusion(true);
    (fused, plain, info)
}

/// Fused and unfused results agree to a relative `1e-4`.
pub fn assert_close(fused: &[f32], plain: &[f32]) {
    assert_eq!(fused.len(), plain.len());
    for (a, b) in fused.iter().zip(plain) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

/// `n` deterministic values in `[-0.5, 0.5)` (xorshift).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// A tensor of `dims` filled with `data(.., seed)` times `scale`.
pub fn tensor(dims: &[usize], seed: u64, scale: f32) -> Tensor {
    let v = data(dims.iter().product(), seed)
        .into_iter()
        .map(|x| x * scale)
        .collect();
    Tensor::from_vec(v, dims).unwrap()
}

/// The sixteen parameters of an encoder layer of width `h` and FFN width `ffn`:
/// q, k, v, output weights and biases, two layer norms, and the FFN.
pub fn encoder_params(h: usize, ffn: usize) -> Vec<Tensor> {
    let shapes: [Vec<usize>; 16] = [
        vec![h, h],
        vec![h],
        vec![h, h],
        vec![h],
        vec![h, h],
        vec![h],
        vec![h, h],
        vec![h],
        vec![h],
        vec![h],
        vec![h, ffn],
        vec![ffn],
        vec![ffn, h],
        vec![h],
        vec![h],
        vec![h],
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, d)| tensor(d, 100 + i as u64, 0.1))
        .collect()
}

/// One BERT encoder layer over `x` `[batch, seq, h]` with `heads` heads and an optional
/// additive attention mask broadcastable to `[batch, heads, seq, seq]`.
pub fn encoder(x: &Tensor, p: &[Tensor], heads: usize, mask: Option<&Tensor>) -> Tensor {
    let (b, s, h) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    let d = h / heads;
    let [q, k, v] = heads_qkv(x, p, heads);
    let mut scores = q
        .matmul(&k.transpose(2, 3).unwrap())
        .unwrap()
        .affine(1.0 / (d as f64).sqrt(), 0.0)
        .unwrap();
    if let Some(m) = mask {
        scores = scores.add(m).unwrap();
    }
    let att = scores.softmax(-1).unwrap();
    let ctx = att
        .matmul(&v)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape(&[b, s, h])
        .unwrap();
    encoder_tail(&ctx, x, p)
}

/// The same layer as [`encoder`] (no mask) with attention as one op
/// (`Tensor::attention`), as the BERT model runs it.
pub fn encoder_fused_attention(x: &Tensor, p: &[Tensor], heads: usize) -> Tensor {
    let (b, s, h) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    let d = h / heads;
    let [q, k, v] = heads_qkv(x, p, heads);
    let ctx = q
        .attention(&k, &v, None, 1.0 / (d as f32).sqrt())
        .unwrap()
        .reshape(&[b, s, h])
        .unwrap();
    encoder_tail(&ctx, x, p)
}

/// The layer's q, k and v projections of `x`, each split into heads
/// `[batch, heads, seq, head_dim]`.
fn heads_qkv(x: &Tensor, p: &[Tensor], heads: usize) -> [Tensor; 3] {
    let (b, s, h) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    [0, 2, 4].map(|i| {
        x.matmul(&p[i])
            .unwrap()
            .add(&p[i + 1])
            .unwrap()
            .reshape(&[b, s, heads, h / heads])
            .unwrap()
            .transpose(1, 2)
            .unwrap()
    })
}

/// The output projection, residual, norm and feed-forward of [`encoder`].
fn encoder_tail(ctx: &Tensor, x: &Tensor, p: &[Tensor]) -> Tensor {
    let h1 = ctx
        .matmul(&p[6])
        .unwrap()
        .add(&p[7])
        .unwrap()
        .add(x)
        .unwrap()
        .layer_norm(&p[8], &p[9], 1e-12)
        .unwrap();
    let ff = h1
        .matmul(&p[10])
        .unwrap()
        .add(&p[11])
        .unwrap()
        .gelu()
        .unwrap();
    ff.matmul(&p[12])
        .unwrap()
        .add(&p[13])
        .unwrap()
        .add(&h1)
        .unwrap()
        .layer_norm(&p[14], &p[15], 1e-12)
        .unwrap()
}
