//! Attention at BERT-base-like sizes (batch 8, 12 heads, 128 tokens, head size 32):
//! the fused kernel (`Tensor::attention`) against the unfused path (`q·kᵀ`, scale,
//! mask, softmax, `·v`, and the copy of the context to `[b, l, heads · dh]`) and
//! against one plain matmul of the same FLOPs (`2 · b · heads · l · l · dh · 2`), on
//! one core. Criterion's "thrpt" is FLOP/s of the attention arithmetic.
//!
//! `attention_window`: one sequence of 512 tokens, 12 heads of 64, one core, every key
//! against causal and `around(64)` windows (`Tensor::attention_with`), whose hidden key
//! tiles the kernel skips, and causal as a `-1e9` bias over every key (how models ran
//! it before windows). With `STREAMFUSE_ALTERNATE=N` it first times N rounds of
//! the three in turn and prints each one's median and the ratios to all-keys (medians
//! of alternated runs, which a shared machine's drift affects alike).
//!
//! Run with `cargo bench --features internals --bench attention -- --warm-up-time 1 --measurement-time 3`.

use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use streamfuse::inspect::kernels::{self, Par};
use streamfuse::{KeyWindow, Layout, Tensor};

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

/// Tokens, heads and head size of `attention_window`.
const WL: usize = 512;
const WHEADS: usize = 12;
const WDH: usize = 64;

fn window_bench(c: &mut Criterion) {
    streamfuse::set_kernel_threads(1);
    let (q, k, v) = (
        tensor(&[1, WHEADS, WL, WDH], 5, 2.0),
        tensor(&[1, WHEADS, WL, WDH], 6, 2.0),
        tensor(&[1, WHEADS, WL, WDH], 7, 1.0),
    );
    for t in [&q, &k, &v] {
        t.to_vec::<f32>().unwrap();
    }
    let scale = 1.0 / (WDH as f32).sqrt();
    // The way causal attention ran before windows: every key, a -1e9 bias above the
    // diagonal (`causal_bias`, `None` as its window).
    let mask: Vec<f32> = (0..WL * WL)
        .map(|x| if x % WL <= x / WL { 0.0 } else { -1e9 })
        .collect();
    let mask = Tensor::from_vec(mask, &[1, 1, WL, WL]).unwrap();
    mask.to_vec::<f32>().unwrap();
    let run = |w: Option<KeyWindow>| {
        let t = match w {
            Some(w) => q.attention_with(&k, &v, None, scale, w),
            None => q.attention(&k, &v, Some(&mask), scale),
        };
        streamfuse::sync().unwrap();
        t.unwrap()
    };
    let cases = [
        ("all", Some(KeyWindow::ALL)),
        ("causal", Some(KeyWindow::CAUSAL)),
        ("around64", Some(KeyWindow::around(64))),
        ("causal_bias", None),
    ];
    let rounds: usize = std::env::var("STREAMFUSE_ALTERNATE")
        .ok()
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    if rounds > 0 {
        for (_, w) in cases {
            run(w); // plans built, pages touched
        }
        let mut times = vec![Vec::new(); cases.len()];
        for _ in 0..rounds {
            for (i, (_, w)) in cases.iter().enumerate() {
                let start = Instant::now();
                run(*w);
                times[i].push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        let medians: Vec<f64> = times
            .iter_mut()
            .map(|t| {
                t.sort_by(f64::total_cmp);
                t[t.len() / 2]
            })
            .collect();
        let tier = streamfuse::cpu::tier();
        for ((name, _), m) in cases.iter().zip(&medians) {
            println!(
                "attention_window {tier} {name}: median {m:.1} µs of {rounds} alternated runs, \
                 {:.3} of all",
                m / medians[0]
            );
        }
    }
    let mut g = c.benchmark_group("attention_window_l512_h12_d64");
    g.sample_size(20);
    for (name, w) in cases {
        g.bench_function(name, |bch| bch.iter(|| run(w)));
    }
    g.finish();
}

criterion_group!(benches, bench, window_bench);
criterion_main!(benches);
