//! What fusion and planning buy.
//!
//! - `chain8/*`: 8 element-wise ops over 16M f32, fused (one kernel) and unfused (8
//!   kernels), against one plain read+write pass over the same bytes (`copy`).
//! - `bert_layer/*`: a BERT encoder layer (hidden 384, 12 heads, ffn 1536, batch 8,
//!   sequence 128), fused and planned against op by op with pooled buffers. The peak
//!   tensor memory of one forward pass of each is printed before the timings.
//! - `plan_cache_hit/*`: recording and replaying a cached 1,000-op segment of tiny ops:
//!   the engine's cost per op when the plan is found in the cache.

use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use streamfuse::inspect::kernels::{self, Par};
use streamfuse::Tensor;

#[path = "../tests/support/mod.rs"]
mod support;
use support::{data, tensor as t};

/// Eight element-wise ops; the result is computed (sync) and dropped, so that the
/// timing holds the kernels and not a 64 MiB read-back.
fn chain8(x: &Tensor) {
    let y = x
        .affine(1.5, 0.1)
        .unwrap()
        .relu()
        .unwrap()
        .sqrt()
        .unwrap()
        .mul(x)
        .unwrap()
        .neg()
        .unwrap()
        .abs()
        .unwrap()
        .maximum(x)
        .unwrap()
        .affine(0.5, 0.0)
        .unwrap();
    streamfuse::sync().unwrap();
    drop(y);
}

fn chain(c: &mut Criterion) {
    const N: usize = 16 << 20;
    let x = t(&[N], 1, 1.0);
    let src = data(N, 2);
    let mut dst = vec![0f32; N];
    let mut g = c.benchmark_group("chain8");
    g.throughput(Throughput::Bytes((N * 8) as u64));
    g.sample_size(10);
    g.bench_function("copy", |b| {
        b.iter(|| {
            kernels::copy(
                &src,
                &streamfuse::Layout::contiguous(&[N]),
                &mut dst,
                Par::all(),
            )
            .unwrap();
        })
    });
    for fused in [true, false] {
        g.bench_function(if fused { "fused" } else { "unfused" }, |b| {
            streamfuse::set_fusion(fused);
            b.iter(|| chain8(&x));
            streamfuse::set_fusion(true);
        });
    }
    g.finish();
}

fn bert(c: &mut Criterion) {
    let (batch, seq, h, ffn, heads) = (8, 128, 384, 1536, 12);
    let p = support::encoder_params(h, ffn);
    let x = t(&[batch, seq, h], 3, 1.0);
    for fused in [true, false] {
        streamfuse::set_fusion(fused);
        support::encoder(&x, &p, heads, None)
            .to_vec::<f32>()
            .unwrap(); // warm up pools and the cache
        streamfuse::reset_peak_bytes();
        let base = streamfuse::stats().live_bytes;
        let start = Instant::now();
        support::encoder(&x, &p, heads, None)
            .to_vec::<f32>()
            .unwrap();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let peak = streamfuse::stats().peak_bytes - base;
        let info = streamfuse::last_flush().unwrap();
        println!(
            "bert_layer {}: peak tensor memory {:.2} MiB, {} kernels for {} ops, arena {:.2} MiB (lower bound {:.2} MiB), one pass {ms:.1} ms",
            if fused { "fused" } else { "unfused" },
            peak as f64 / (1 << 20) as f64,
            info.kernels,
            info.ops,
            info.arena_bytes as f64 / (1 << 20) as f64,
            info.arena_lower_bound as f64 / (1 << 20) as f64,
        );
    }
    streamfuse::set_fusion(true);
    let mut g = c.benchmark_group("bert_layer");
    g.sample_size(20);
    for fused in [true, false] {
        g.bench_function(if fused { "fused" } else { "unfused" }, |b| {
            streamfuse::set_fusion(fused);
            b.iter(|| {
                support::encoder(&x, &p, heads, None)
                    .to_vec::<f32>()
                    .unwrap()
            });
            streamfuse::set_fusion(true);
        });
    }
    g.finish();
}

fn cache_hit(c: &mut Criterion) {
    const OPS: usize = 1000;
    let x = t(&[4], 1, 1.0);
    let program = || {
        let mut h = x.clone();
        for i in 0..OPS {
            h = match i % 3 {
                0 => h.affine(0.9, 0.1).unwrap(),
                1 => h.add(&x).unwrap(),
                _ => h.sum_keepdim(0).unwrap().broadcast_as(&[4]).unwrap(),
            };
        }
        h.to_vec::<f32>().unwrap()
    };
    program();
    let mut g = c.benchmark_group("plan_cache_hit");
    g.throughput(Throughput::Elements(OPS as u64));
    g.bench_function("record_and_replay_1000_ops", |b| b.iter(program));
    g.finish();
    assert!(streamfuse::last_flush().unwrap().cache_hit);
}

criterion_group!(benches, chain, bert, cache_hit);
criterion_main!(benches);
