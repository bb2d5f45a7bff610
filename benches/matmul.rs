//! Benchmarks of the CPU kernels: matmul GFLOP/s for square sizes, serial and parallel;
//! a MiniLM forward pass's products (its 24 weights, 42.5 MB, more than the L3, at the
//! rows of one sentence and of a batch of 32) through `gemm` and through the packed
//! kernel with the weights packed once, and each of its weight shapes alone; softmax and layer norm over `[128 * 32, 384]` and a 16M-element add compared with
//! a plain copy of the same size (the memory-bandwidth reference).
//!
//! Run with `cargo bench --features internals --bench matmul -- --warm-up-time 1 --measurement-time 3`.
//! For matmul, criterion's "thrpt" in elements/s is FLOP/s (`2 n³` per product).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use streamfuse::inspect::kernels::BinaryOp;
use streamfuse::inspect::kernels::{self, Par};
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

/// Every product of a MiniLM-L6 forward pass by its weights (6 layers of `[384, 1152]`,
/// `[384, 384]`, `[384, 1536]`, `[1536, 384]`), one iteration a pass over all 24, so
/// the weights stream from memory as they do in the model.
fn bench_minilm_weights(c: &mut Criterion) {
    let shapes = [(384usize, 1152usize), (384, 384), (384, 1536), (1536, 384)];
    let weights: Vec<(Vec<f32>, Layout)> = (0..6)
        .flat_map(|layer| {
            shapes.iter().map(move |&(k, n)| {
                let w: Vec<f32> = data(k * n + layer).split_off(layer);
                (w, Layout::contiguous(&[k, n]))
            })
        })
        .collect();
    let packed: Vec<kernels::PackedRhs> = weights
        .iter()
        .filter_map(|(w, l)| kernels::PackedRhs::pack(w, l))
        .collect();

    let mut group = c.benchmark_group("minilm_weights");
    group.sample_size(10);
    for rows in [28usize, 896] {
        let a = data(rows * 1536);
        let mut out = vec![0.0f32; rows * 1536];
        let flops: usize = weights
            .iter()
            .map(|(_, l)| 2 * rows * l.dims()[0] * l.dims()[1])
            .sum();
        group.throughput(Throughput::Elements(flops as u64));
        for (name, par) in [("serial", Par::serial()), ("all", Par::all())] {
            let pass = |packs: Option<&[kernels::PackedRhs]>, out: &mut [f32]| {
                for (i, (w, wl)) in weights.iter().enumerate() {
                    let (k, n) = (wl.dims()[0], wl.dims()[1]);
                    let al = Layout::contiguous(&[rows, k]);
                    let p = packs.map(|p| &p[i]);
                    kernels::matmul_prepacked(
                        &a[..rows * k],
                        &al,
                        w,
                        wl,
                        p,
                        &mut out[..rows * n],
                        par,
                    )
                    .unwrap();
                }
            };
            group.bench_function(BenchmarkId::new(format!("gemm_{name}"), rows), |bench| {
                bench.iter(|| pass(None, &mut out))
            });
            if packed.len() == weights.len() {
                group.bench_function(BenchmarkId::new(format!("packed_{name}"), rows), |bench| {
                    bench.iter(|| pass(Some(&packed), &mut out))
                });
            }
        }
    }
    group.finish();
}

/// Each of MiniLM's four weight shapes alone (`[384, 1152]`, `[384, 384]`, `[384,
/// 1536]`, `[1536, 384]`) at the rows of one sentence (28) and of a batch (896):
/// `gemm` against the packed tile of the tier in use (`STREAMFUSE_ISA=avx2` times the
/// AVX2 tile), in the same run. One weight, so it comes from L3 (or L2) rather than
/// DRAM: the tile's arithmetic more than the weight's stream.
fn bench_minilm_shapes(c: &mut Criterion) {
    let mut group = c.benchmark_group("minilm_shapes");
    for (k, n) in [(384usize, 1152usize), (384, 384), (384, 1536), (1536, 384)] {
        let w = data(k * n);
        let wl = Layout::contiguous(&[k, n]);
        let packed = kernels::PackedRhs::pack(&w, &wl);
        for rows in [28usize, 896] {
            let a = data(rows * k);
            let al = Layout::contiguous(&[rows, k]);
            let mut out = vec![0.0f32; rows * n];
            group.throughput(Throughput::Elements((2 * rows * k * n) as u64));
            for (name, par) in [("serial", Par::serial()), ("all", Par::all())] {
                let shape = format!("{rows}x{k}x{n}");
                let run = |p: Option<&kernels::PackedRhs>, out: &mut [f32]| {
                    kernels::matmul_prepacked(&a, &al, &w, &wl, p, out, par).unwrap()
                };
                group.bench_function(BenchmarkId::new(format!("gemm_{name}"), &shape), |b| {
                    b.iter(|| run(None, &mut out))
                });
                if let Some(p) = &packed {
                    let id = BenchmarkId::new(format!("packed_{name}"), &shape);
                    group.bench_function(id, |b| b.iter(|| run(Some(p), &mut out)));
                }
            }
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

criterion_group!(
    benches,
    bench_matmul,
    bench_minilm_weights,
    bench_minilm_shapes,
    bench_rows,
    bench_add
);
criterion_main!(benches);
