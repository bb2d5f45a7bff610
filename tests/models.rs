//! Whole models: a 3-layer MLP and a BERT encoder layer, written with the public API
//! as a user would, against references written independently with plain loops over
//! f64 arrays (no reshapes, no transposes: every index is computed by hand).

mod common;

use common::*;
use streamfuse::Tensor;

// ---------------------------------------------------------------------------------
// plain-loop helpers for the references (row-major f64 arrays)
// ---------------------------------------------------------------------------------

/// `x [rows, k]` times `w^T` where `w` is `[n, k]` (a torch-style linear layer), plus `b [n]`.
fn linear_wt(x: &[f64], rows: usize, k: usize, w: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; rows * n];
    for r in 0..rows {
        for j in 0..n {
            let mut acc = b[j];
            for p in 0..k {
                acc += x[r * k + p] * w[j * k + p];
            }
            out[r * n + j] = acc;
        }
    }
    out
}

/// `x [rows, k]` times `w [k, n]`, plus `b [n]`.
fn linear(x: &[f64], rows: usize, k: usize, w: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; rows * n];
    for r in 0..rows {
        for j in 0..n {
            let mut acc = b[j];
            for p in 0..k {
                acc += x[r * k + p] * w[p * n + j];
            }
            out[r * n + j] = acc;
        }
    }
    out
}

fn layer_norm_rows(x: &[f64], h: usize, w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for r in 0..x.len() / h {
        let row = &x[r * h..(r + 1) * h];
        let mean: f64 = row.iter().sum::<f64>() / h as f64;
        let var: f64 = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h as f64;
        for i in 0..h {
            out[r * h + i] = (row[i] - mean) / (var + eps).sqrt() * w[i] + b[i];
        }
    }
    out
}

fn softmax_rows(x: &mut [f64], n: usize) {
    for row in x.chunks_mut(n) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for v in row.iter_mut() {
            *v = (*v - m).exp() / s;
        }
    }
}

fn param(dims: &[usize], seed: u64, scale: f32) -> (Tensor, Vec<f64>) {
    let v = rand_vec(numel(dims), seed, -scale, scale);
    let t = Tensor::from_vec(v.clone(), dims).unwrap();
    (t, v.iter().map(|&x| x as f64).collect())
}

// ---------------------------------------------------------------------------------
// MLP
// ---------------------------------------------------------------------------------

struct Mlp {
    w: Vec<(Tensor, Vec<f64>)>,
    b: Vec<(Tensor, Vec<f64>)>,
}

const MLP_DIMS: [usize; 4] = [64, 128, 128, 10];

impl Mlp {
    fn new(seed: u64) -> Mlp {
        let mut w = Vec::new();
        let mut b = Vec::new();
        for l in 0..3 {
            let (i, o) = (MLP_DIMS[l], MLP_DIMS[l + 1]);
            w.push(param(&[i, o], seed + 2 * l as u64, 1.0 / (i as f32).sqrt()));
            b.push(param(&[o], seed + 2 * l as u64 + 1, 0.1));
        }
        Mlp { w, b }
    }

    /// gelu after layer 1, relu after layer 2, softmax at the end.
    fn forward(&self, x: &Tensor) -> streamfuse::Result<Tensor> {
        let h = x.matmul(&self.w[0].0)?.add(&self.b[0].0)?.gelu()?;
        let h = h.matmul(&self.w[1].0)?.add(&self.b[1].0)?.relu()?;
        h.matmul(&self.w[2].0)?.add(&self.b[2].0)?.softmax(-1)
    }

    fn reference(&self, x: &[f64], batch: usize) -> Vec<f64> {
        let h = linear(x, batch, 64, &self.w[0].1, 128, &self.b[0].1);
        let h: Vec<f64> = h.iter().map(|&v| gelu(v)).collect();
        let h = linear(&h, batch, 128, &self.w[1].1, 128, &self.b[1].1);
        let h: Vec<f64> = h.iter().map(|&v| v.max(0.0)).collect();
        let mut o = linear(&h, batch, 128, &self.w[2].1, 10, &self.b[2].1);
        softmax_rows(&mut o, 10);
        o
    }
}

#[test]
fn mlp_three_layers() {
    let mlp = Mlp::new(1000);
    let (x, rx) = param(&[8, 64], 42, 2.0);
    let y = mlp.forward(&x).unwrap();
    assert_eq!(y.dims(), &[8, 10]);
    let expected = mlp.reference(&rx, 8);
    assert_close_tol(&read_f32(&y), &expected, 1e-4, 1e-6);
    // rows are distributions
    let s = read_f32(&y.sum(1).unwrap());
    assert_close(&s, &[1.0; 8], 1e-5);
    // the argmax agrees with the reference
    let am = y.argmax(-1).unwrap().to_vec::<u32>().unwrap();
    for r in 0..8 {
        let row = &expected[r * 10..(r + 1) * 10];
        let best = (0..10).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        // only compare rows whose top two are clearly apart
        let mut sorted = row.to_vec();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        if sorted[0] - sorted[1] > 1e-3 {
            assert_eq!(am[r] as usize, best, "row {r}");
        }
    }
}

#[test]
fn mlp_repeated_forward_passes_and_new_inputs() {
    let mlp = Mlp::new(2000);
    for i in 0..4u64 {
        let (x, rx) = param(&[8, 64], 50 + (i % 2), 2.0);
        let y = mlp.forward(&x).unwrap();
        assert_close_tol(&read_f32(&y), &mlp.reference(&rx, 8), 1e-4, 1e-6);
    }
}

#[test]
fn mlp_on_a_non_contiguous_batch() {
    // the batch is the transpose of a [64, 8] tensor
    let mlp = Mlp::new(3000);
    let (xt, rxt) = param(&[64, 8], 7, 2.0);
    let x = xt.transpose(0, 1).unwrap();
    let mut rx = vec![0.0; 8 * 64];
    for i in 0..8 {
        for j in 0..64 {
            rx[i * 64 + j] = rxt[j * 8 + i];
        }
    }
    let y = mlp.forward(&x).unwrap();
    assert_close_tol(&read_f32(&y), &mlp.reference(&rx, 8), 1e-4, 1e-6);
}

// ---------------------------------------------------------------------------------
// BERT encoder layer
// ---------------------------------------------------------------------------------

const B: usize = 2;
const S: usize = 12;
const H: usize = 64;
const NH: usize = 4;
const HD: usize = H / NH;
const FF: usize = 256;
const EPS: f64 = 1e-12;

/// Weights in torch layout: linear weights are `[out, in]` and applied as `x W^T + b`.
struct Bert {
    wq: (Tensor, Vec<f64>),
    bq: (Tensor, Vec<f64>),
    wk: (Tensor, Vec<f64>),
    bk: (Tensor, Vec<f64>),
    wv: (Tensor, Vec<f64>),
    bv: (Tensor, Vec<f64>),
    wo: (Tensor, Vec<f64>),
    bo: (Tensor, Vec<f64>),
    ln1_w: (Tensor, Vec<f64>),
    ln1_b: (Tensor, Vec<f64>),
    w1: (Tensor, Vec<f64>),
    b1: (Tensor, Vec<f64>),
    w2: (Tensor, Vec<f64>),
    b2: (Tensor, Vec<f64>),
    ln2_w: (Tensor, Vec<f64>),
    ln2_b: (Tensor, Vec<f64>),
}

impl Bert {
    fn new(seed: u64) -> Bert {
        let s = 1.0 / (H as f32).sqrt();
        let ln_w = |seed| {
            let v = rand_vec(H, seed, 0.8, 1.2);
            (
                Tensor::from_vec(v.clone(), &[H]).unwrap(),
                v.iter().map(|&x| x as f64).collect(),
            )
        };
        Bert {
            wq: param(&[H, H], seed, s),
            bq: param(&[H], seed + 1, 0.1),
            wk: param(&[H, H], seed + 2, s),
            bk: param(&[H], seed + 3, 0.1),
            wv: param(&[H, H], seed + 4, s),
            bv: param(&[H], seed + 5, 0.1),
            wo: param(&[H, H], seed + 6, s),
            bo: param(&[H], seed + 7, 0.1),
            ln1_w: ln_w(seed + 8),
            ln1_b: param(&[H], seed + 9, 0.1),
            w1: param(&[FF, H], seed + 10, s),
            b1: param(&[FF], seed + 11, 0.1),
            w2: param(&[H, FF], seed + 12, 1.0 / (FF as f32).sqrt()),
            b2: param(&[H], seed + 13, 0.1),
            ln2_w: ln_w(seed + 14),
            ln2_b: param(&[H], seed + 15, 0.1),
        }
    }

    /// `x`: [B, S, H]; `mask`: [B, S] of 1.0 (attend) / 0.0 (padding).
    fn forward(&self, x: &Tensor, mask: &Tensor) -> streamfuse::Result<Tensor> {
        let linear = |x: &Tensor, w: &Tensor, b: &Tensor| -> streamfuse::Result<Tensor> {
            x.matmul(&w.transpose(0, 1)?)?.add(b)
        };
        let heads = |t: Tensor| -> streamfuse::Result<Tensor> {
            // [B, S, H] -> [B, S, NH, HD] -> [B, NH, S, HD]
            t.reshape(&[B, S, NH, HD])?.transpose(1, 2)
        };
        let q = heads(linear(x, &self.wq.0, &self.bq.0)?)?;
        let k = heads(linear(x, &self.wk.0, &self.bk.0)?)?;
        let v = heads(linear(x, &self.wv.0, &self.bv.0)?)?;
        // additive mask [B, 1, 1, S]: 0 where attended, -10000 where padded
        let add_mask = mask.affine(10000.0, -10000.0)?.reshape(&[B, 1, 1, S])?;
        let scores = q
            .matmul(&k.transpose(-2, -1)?)?
            .affine(1.0 / (HD as f64).sqrt(), 0.0)?
            .add(&add_mask)?;
        let probs = scores.softmax(-1)?;
        let ctx = probs.matmul(&v)?; // [B, NH, S, HD]
        let ctx = ctx.transpose(1, 2)?.reshape(&[B, S, H])?;
        let attn = linear(&ctx, &self.wo.0, &self.bo.0)?;
        let h1 = attn.add(x)?.layer_norm(&self.ln1_w.0, &self.ln1_b.0, EPS)?;
        let ff = linear(&h1, &self.w1.0, &self.b1.0)?.gelu()?;
        let ff = linear(&ff, &self.w2.0, &self.b2.0)?;
        ff.add(&h1)?.layer_norm(&self.ln2_w.0, &self.ln2_b.0, EPS)
    }

    fn reference(&self, x: &[f64], mask: &[f64]) -> Vec<f64> {
        let rows = B * S;
        let q = linear_wt(x, rows, H, &self.wq.1, H, &self.bq.1);
        let k = linear_wt(x, rows, H, &self.wk.1, H, &self.bk.1);
        let v = linear_wt(x, rows, H, &self.wv.1, H, &self.bv.1);
        // attention per batch and head; q[b, s, h*HD + d]
        let mut ctx = vec![0.0; rows * H];
        let scale = 1.0 / (HD as f64).sqrt();
        for b in 0..B {
            for h in 0..NH {
                for i in 0..S {
                    let mut scores = vec![0.0; S];
                    for (j, sc) in scores.iter_mut().enumerate() {
                        let mut dot = 0.0;
                        for d in 0..HD {
                            dot +=
                                q[(b * S + i) * H + h * HD + d] * k[(b * S + j) * H + h * HD + d];
                        }
                        *sc = dot * scale + (1.0 - mask[b * S + j]) * -10000.0;
                    }
                    softmax_rows(&mut scores, S);
                    for d in 0..HD {
                        let mut acc = 0.0;
                        for (j, p) in scores.iter().enumerate() {
                            acc += p * v[(b * S + j) * H + h * HD + d];
                        }
                        ctx[(b * S + i) * H + h * HD + d] = acc;
                    }
                }
            }
        }
        let attn = linear_wt(&ctx, rows, H, &self.wo.1, H, &self.bo.1);
        let res1: Vec<f64> = attn.iter().zip(x).map(|(a, b)| a + b).collect();
        let h1 = layer_norm_rows(&res1, H, &self.ln1_w.1, &self.ln1_b.1, EPS);
        let ff = linear_wt(&h1, rows, H, &self.w1.1, FF, &self.b1.1);
        let ff: Vec<f64> = ff.iter().map(|&v| gelu(v)).collect();
        let ff = linear_wt(&ff, rows, FF, &self.w2.1, H, &self.b2.1);
        let res2: Vec<f64> = ff.iter().zip(&h1).map(|(a, b)| a + b).collect();
        layer_norm_rows(&res2, H, &self.ln2_w.1, &self.ln2_b.1, EPS)
    }
}

/// Batch 0 attends to all 12 tokens, batch 1 only to the first 7.
fn bert_mask() -> (Tensor, Vec<f64>) {
    let mut m = vec![1.0f32; B * S];
    for j in 7..S {
        m[S + j] = 0.0;
    }
    (
        Tensor::from_vec(m.clone(), &[B, S]).unwrap(),
        m.iter().map(|&v| v as f64).collect(),
    )
}

#[test]
fn bert_encoder_layer() {
    let bert = Bert::new(5000);
    let (x, rx) = param(&[B, S, H], 77, 1.0);
    let (mask, rmask) = bert_mask();
    let y = bert.forward(&x, &mask).unwrap();
    assert_eq!(y.dims(), &[B, S, H]);
    let expected = bert.reference(&rx, &rmask);
    assert_close_tol(&read_f32(&y), &expected, 1e-4, 1e-4);
}

#[test]
fn bert_padding_does_not_leak_into_attended_tokens() {
    // changing padded tokens of batch 1 must not change its first 7 outputs
    let bert = Bert::new(6000);
    let (mask, _) = bert_mask();
    let (x, rx) = param(&[B, S, H], 88, 1.0);
    let mut rx2 = rx.clone();
    let mut x2v: Vec<f32> = rx.iter().map(|&v| v as f32).collect();
    for j in 7..S {
        for d in 0..H {
            let i = (S + j) * H + d;
            x2v[i] += 0.5;
            rx2[i] = x2v[i] as f64;
        }
    }
    let x2 = Tensor::from_vec(x2v, &[B, S, H]).unwrap();
    let y1 = read_f32(&bert.forward(&x, &mask).unwrap());
    let y2 = read_f32(&bert.forward(&x2, &mask).unwrap());
    let (_, rmask) = bert_mask();
    assert_close_tol(&y2, &bert.reference(&rx2, &rmask), 1e-4, 1e-4);
    // first 7 tokens of batch 1 agree to within the mask's leakage (exp(-10000) = 0)
    let lo = S * H;
    let hi = (S + 7) * H;
    let a: Vec<f64> = y1[lo..hi].iter().map(|&v| v as f64).collect();
    assert_close_tol(&y2[lo..hi], &a, 1e-5, 1e-5);
}

#[test]
fn bert_two_layers_stacked_and_repeated() {
    let l1 = Bert::new(7000);
    let l2 = Bert::new(8000);
    let (mask, rmask) = bert_mask();
    for seed in [90u64, 91, 90] {
        let (x, rx) = param(&[B, S, H], seed, 1.0);
        let y = l2.forward(&l1.forward(&x, &mask).unwrap(), &mask).unwrap();
        let e = l2.reference(&l1.reference(&rx, &rmask), &rmask);
        assert_close_tol(&read_f32(&y), &e, 2e-4, 2e-4);
    }
}
