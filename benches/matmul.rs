//! Benchmarks of the CPU kernels: matmul GFLOP/s for square sizes, serial and parallel,
//! plus softmax and layer norm over `[128 * 32, 384]` and a 16M-element add compared with
//! a plain copy of the same size (the memory-bandwidth reference).
//!
//! Run with `cargo bench --bench matmul -- --warm-up-time 1 --measurement-time 3`.
//! For matmul, criterion's "thrpt" in elements/s is FLOP/s (`2 n³` per product).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use streamfuse::inspect::kernels::{self, Par};
use streamfuse::inspect::BinaryOp;
use streamfuse::Layout;

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn bench_matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul");
    for n in [128usize, 512, 1024] {
        let a = data(n * n);
        let b = data(n * n);
        let l = Layout::contiguous(&[n, n]);
        let mut out = vec![0.0f32; n * n];
        group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        if n >= 1024 {
            group.sample_size(10);
        }
        for (name, par) in [("serial", Par::serial()), ("all", Par::all())] {
            group.bench_function(BenchmarkId::new(name, n), |bench| {
                bench.iter(|| kernels::matmul(&a, &l, &b, &l, &mut out, par).unwrap())
            });
        }
    }
    group.finish();
}

fn bench_rows(c: &mut Criterion) {
    let (rows, n) = (128 * 32, 384);
    let x = data(rows * n);
    let l = Layout::contiguous(&[rows, n]);
    let w = data(n);
    let wl = Layout::contiguous(&[n]);
    let mut out = vec![0.0f32; rows * n];
    let mut group = c.benchmark_group("rows_4096x384");
    group.throughput(Throughput::Elements((rows * n) as u64));
    for (name, par) in [("serial", Par::serial()), ("all", Par::all())] {
        group.bench_function(BenchmarkId::new("softmax", name), |bench| {
            bench.iter(|| kernels::softmax(&x, &l, &mut out, par).unwrap())
        });
        group.bench_function(BenchmarkId::new("layer_norm", name), |bench| {
            bench.iter(|| {
                kernels::layer_norm(&x, &l, &w, &wl, &w, &wl, 1e-5, &mut out, par).unwrap()
            })
        });
    }
    group.finish();
}

fn bench_add(c: &mut Criterion) {
    let n = 16 << 20;
    let a = data(n);
    let b = data(n);
    let l = Layout::contiguous(&[n]);
    let mut out = vec![0.0f32; n];
    let mut group = c.benchmark_group("add_16M");
    group.throughput(Throughput::Elements(n as u64));
    group.sample_size(10);
    for (name, par) in [("serial", Par::serial()), ("all", Par::all())] {
        group.bench_function(BenchmarkId::new("add", name), |bench| {
            bench.iter(|| kernels::binary(BinaryOp::Add, &a, &l, &b, &l, &mut out, par).unwrap())
        });
        group.bench_function(BenchmarkId::new("kernel_copy", name), |bench| {
            bench.iter(|| kernels::copy(&a, &l, &mut out, par).unwrap())
        });
    }
    group.bench_function("copy_from_slice", |bench| {
        bench.iter(|| out.copy_from_slice(&a))
    });
    group.finish();
}

criterion_group!(benches, bench_matmul, bench_rows, bench_add);
criterion_main!(benches);
