//! The activation functions over 16M floats on one core, against a plain copy of the
//! same size (the memory-bandwidth floor: an activation that costs about a copy is
//! free inside a matmul epilogue, where its input is already in cache).
//!
//! Run with `cargo bench --features internals --bench activations -- --warm-up-time 1 --measurement-time 3`.
//! Criterion's "thrpt" is elements/s.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use streamfuse::inspect::kernels::UnaryOp;
use streamfuse::inspect::kernels::{self, Par};
use streamfuse::Layout;

const N: usize = 16 << 20;

fn bench(c: &mut Criterion) {
    // Values spread over the range activations see in a transformer (about -8..8).
    let src: Vec<f32> = (0..N)
        .map(|i| ((i * 7919) % 16_001) as f32 / 1000.0 - 8.0)
        .collect();
    let layout = Layout::contiguous(&[N]);
    let mut dst = vec![0.0f32; N];
    let mut g = c.benchmark_group("activation_16M");
    g.throughput(Throughput::Elements(N as u64));
    g.sample_size(10);
    g.bench_function("copy", |b| {
        b.iter(|| kernels::copy(&src, &layout, &mut dst, Par::serial()).unwrap())
    });
    for (name, op) in [
        ("gelu", UnaryOp::Gelu),
        ("gelu_tanh", UnaryOp::GeluTanh),
        ("exp", UnaryOp::Exp),
        ("tanh", UnaryOp::Tanh),
        ("sigmoid", UnaryOp::Sigmoid),
        ("silu", UnaryOp::Silu),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| kernels::unary(op, &src, &layout, &mut dst, Par::serial()).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
