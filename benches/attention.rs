//! Attention at BERT-base-like sizes (batch 8, 12 heads, 128 tokens, head size 32):
//! the fused kernel (`Tensor::attention`) against the unfused path (`q·kᵀ`, scale,
//! mask, softmax, `·v`, and the copy of the context to `[b, l, heads · dh]`) and
//! against one plain matmul of the same FLOPs (`2 · b · heads · l · l · dh · 2`), on
//! one core. Criterion's "thrpt" is FLOP/s of the attention arithmetic.
//!
//! Run with `cargo bench --bench attention -- --warm-up-time 1 --measurement-time 3`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use streamfuse::inspect::kernels::{self, Par};
use streamfuse::{Layout, Tensor};

#[path = "../tests/support/mod.rs"]
mod support;
use support::{data, tensor};

const B: usize = 8;
const HEADS: usize = 12;
const L: usize = 128;
const DH: usize = 32;

fn bench(c: &mut Criterion) {
    streamfuse::set_kernel_threads(1);
    // q, k, v as views of one [b, l, 3, heads, dh] projection, as in BERT.
    let qkv = tensor(&[B, L, 3, HEADS, DH], 1, 2.0)
        .permute(&[2, 0, 3, 1, 4])
        .unwrap();
    let part = |i: usize| qkv.narrow(0, i, 1).unwrap().squeeze(0).unwrap();
    let (q, k, v) = (part(0), part(1), part(2));
    // Every sequence keeps its first 100 keys.
    let mask: Vec<f32> = (0..B * L)
        .map(|x| if x % L < 100 { 0.0 } else { -1e9 })
        .collect();
    let bias = Tensor::from_vec(mask, &[B, 1, 1, L]).unwrap();
    let scale = 1.0 / (DH as f32).sqrt();
    for t in [&q, &k, &v, &bias] {
        t.to_vec::<f32>().unwrap();
    }
    let flops = (4 * B * HEADS * L * L * DH) as u64;
    let mut g = c.benchmark_group("attention_b8_h12_l128_d32");
    g.throughput(Throughput::Elements(flops));
    g.sample_size(20);
    g.bench_function("fused", |bch| {
        bch.iter(|| {
            let t = q
                .attention(&k, &v, Some(&bias), scale)
                .unwrap()
                .reshape(&[B * L, HEADS * DH])
                .unwrap();
            streamfuse::sync().unwrap();
            t
        })
    });
    g.bench_function("unfused", |bch| {
        bch.iter(|| {
            let t = q
                .matmul(&k.transpose(-1, -2).unwrap())
                .unwrap()
                .affine(scale as f64, 0.0)
                .unwrap()
                .add(&bias)
                .unwrap()
                .softmax(-1)
                .unwrap()
                .matmul(&v)
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .reshape(&[B * L, HEADS * DH])
                .unwrap();
            streamfuse::sync().unwrap();
            t
        })
    });
    // The same FLOPs as one matmul: [B·HEADS·L, DH] x [DH, 2·L] has 2·(B·HEADS·L)·DH·2L.
    let (m, kk, n) = (B * HEADS * L, DH, 2 * L);
    let (a, w) = (data(m * kk, 3), data(kk * n, 4));
    let mut out = vec![0.0f32; m * n];
    let (la, lw) = (Layout::contiguous(&[m, kk]), Layout::contiguous(&[kk, n]));
    g.bench_function("gemm_same_flops", |bch| {
        bch.iter(|| kernels::matmul(&a, &la, &w, &lw, &mut out, Par::serial()).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
