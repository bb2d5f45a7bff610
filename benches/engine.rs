//! Engine overhead: what recording one op costs, and recording plus running a chain.
//!
//! `record/chain_10k` times only the recording of a chain of 10,000 small element-wise
//! ops (each also queues the Drop of the previous link); divide the median by 10,000
//! for ns per op. `record_and_run/chain_10k` adds the flush.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use streamfuse::Tensor;

const OPS: usize = 10_000;

fn chain(x: &Tensor) -> Tensor {
    let mut t = x.clone();
    for i in 0..OPS {
        t = if i % 2 == 0 {
            t.affine(1.0001, 0.5).unwrap()
        } else {
            t.add(x).unwrap()
        };
    }
    t
}

fn record(c: &mut Criterion) {
    streamfuse::set_queue_limit(4 * OPS);
    let x = Tensor::from_vec(vec![1.0f32; 16], &[16]).unwrap();
    let mut g = c.benchmark_group("record");
    g.throughput(Throughput::Elements(OPS as u64));
    g.bench_function("chain_10k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let t = chain(&x);
                total += start.elapsed();
                streamfuse::sync().unwrap();
                drop(t);
                streamfuse::sync().unwrap();
            }
            total
        })
    });
    g.finish();

    let mut g = c.benchmark_group("record_and_run");
    g.throughput(Throughput::Elements(OPS as u64));
    g.bench_function("chain_10k", |b| {
        b.iter(|| {
            let t = chain(&x);
            t.to_vec::<f32>().unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, record);
criterion_main!(benches);
