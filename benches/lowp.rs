//! Reduced-precision products at MiniLM-L6's shapes: the kernel over weights packed
//! once (`PackedRhs`) in f32, in bf16 (AMX tiles where the CPU has AMX, else
//! `vdpbf16ps`, AVX512_BF16; on the avx2 tier pairs widened to f32), in int8 (a scale
//! per column, activations quantised per row inside the kernel, AVX512_VNNI) and in
//! bf16x3 (three bf16 products on AMX tiles, f32 accuracy; portable loops without
//! AMX), on one thread and on all.
//!
//! Two groups: `lowp_pass` runs every product of a forward pass by its weights (6
//! layers of `[384, 1152]`, `[384, 384]`, `[384, 1536]`, `[1536, 384]`: 42.5 MB in f32,
//! 10.6 MB in int8) as one iteration, so the weights stream from memory as in the
//! model; `lowp_shape` runs one product of each shape (its weight stays in cache). Rows:
//! 28 (one sentence) and 896 (a batch of 32). Criterion's "thrpt" in elements/s is
//! FLOP/s (`2 m k n` per product; for int8, one multiply-add counts as 2 operations as
//! well).
//!
//! Peaks of one Zen 4 core, for reading the figures: f32 FMA ≈ 114 GFLOP/s (measured
//! with MKL's sgemm: one 512-bit FMA a cycle, 32 flop, at ≈ 3.56 GHz); `vpdpbusd`
//! does 4 times the multiply-adds of an f32 FMA per instruction at the same rate, so
//! the int8 peak is ≈ 456 GOP/s; `vdpbf16ps` does 2 times, so bf16's is ≈ 228.
//!
//! Measured (thread CPU time, one core, the pass; see `kernels/packed/i8.rs`): f32
//! 102 GFLOP/s at 28 rows and 111 at 896; int8 390 and 366 GOP/s (3.8× and 3.3×).
//!
//! Run with `cargo bench --features internals --bench lowp -- --warm-up-time 1 --measurement-time 3`
//! (`STREAMFUSE_PORTABLE=1` times the portable int8 loops instead).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::{Duration, Instant};
use streamfuse::inspect::kernels::{self, PackedRhs, Par};
use streamfuse::Layout;

/// MiniLM-L6's weight shapes `[k, n]`.
const SHAPES: [(usize, usize); 4] = [(384, 1152), (384, 384), (384, 1536), (1536, 384)];

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// One weight in every form, f32 first, and the f32 matrix itself.
struct Weight {
    k: usize,
    n: usize,
    raw: Vec<f32>,
    /// `None` for f32 on a tier without AVX-512, where the engine multiplies by the
    /// matrix itself (`gemm`'s kernels), as the bench then does.
    forms: [Option<PackedRhs>; 4],
}

/// The names of the forms, in `Weight::forms` order.
const DTYPES: [&str; 4] = ["f32", "bf16", "i8", "bf16x3"];

fn weight(k: usize, n: usize, seed: usize) -> Weight {
    let w: Vec<f32> = data(k * n + seed).split_off(seed);
    let l = Layout::contiguous(&[k, n]);
    let forms = [
        PackedRhs::pack(&w, &l),
        Some(PackedRhs::pack_bf16(&w, &l).unwrap()),
        Some(PackedRhs::pack_i8(&w, &l).unwrap()),
        Some(PackedRhs::pack_bf16x3(&w, &l).unwrap()),
    ];
    Weight {
        k,
        n,
        raw: w,
        forms,
    }
}

/// Runs the products of `weights` at `rows` rows in form `form`.
fn pass(weights: &[Weight], rows: usize, form: usize, a: &[f32], out: &mut [f32], par: Par) {
    for w in weights {
        let al = Layout::contiguous(&[rows, w.k]);
        let (a, out) = (&a[..rows * w.k], &mut out[..rows * w.n]);
        let wl = Layout::contiguous(&[w.k, w.n]);
        let packed = w.forms[form].as_ref();
        kernels::matmul_prepacked(a, &al, &w.raw, &wl, packed, out, par).unwrap();
    }
}

/// The calling thread's CPU time in ns (the first field of
/// `/proc/thread-self/schedstat`, Linux); 0 elsewhere (then wall time is taken).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn run(c: &mut Criterion, group: &str, weights: &[Weight]) {
    let mut group = c.benchmark_group(group);
    group.sample_size(10);
    for rows in [28usize, 896] {
        let a = data(rows * 1536);
        let mut out = vec![0.0f32; rows * 1536];
        let flops: usize = weights.iter().map(|w| 2 * rows * w.k * w.n).sum();
        group.throughput(Throughput::Elements(flops as u64));
        for (par_name, par) in [("serial", Par::serial()), ("all", Par::all())] {
            for (form, dtype) in DTYPES.iter().enumerate() {
                let id = BenchmarkId::new(format!("{dtype}_{par_name}"), rows);
                group.bench_function(id, |bench| {
                    if par.threads > 1 {
                        return bench.iter(|| pass(weights, rows, form, &a, &mut out, par));
                    }
                    // One thread: its CPU time, which a busy machine's other work
                    // does not add to.
                    bench.iter_custom(|iters| {
                        let (cpu, wall) = (thread_cpu_ns(), Instant::now());
                        for _ in 0..iters {
                            pass(weights, rows, form, &a, &mut out, par);
                        }
                        match thread_cpu_ns() - cpu {
                            0 => wall.elapsed(),
                            ns => Duration::from_nanos(ns),
                        }
                    })
                });
            }
        }
    }
    group.finish();
}

fn bench_pass(c: &mut Criterion) {
    let weights: Vec<Weight> = (0..6)
        .flat_map(|layer| SHAPES.iter().map(move |&(k, n)| weight(k, n, layer)))
        .collect();
    run(c, "lowp_pass", &weights);
}

fn bench_shapes(c: &mut Criterion) {
    for (k, n) in SHAPES {
        run(c, &format!("lowp_shape_{k}x{n}"), &[weight(k, n, 0)]);
    }
}

/// `lowp_alternate`, run only when named (`cargo bench --features internals --bench lowp --
/// lowp_alternate`): the f32 and bf16 passes over MiniLM's 24 weights alternated in
/// one process, 21 rounds at 12, 28 and 896 rows (`LOWP_ROWS=12,96,...` for others),
/// on one thread (its CPU time) and on all (wall time; `LOWP_SERIAL=1` skips it);
/// prints each form's median GFLOP/s and the median of the rounds' bf16/f32 ratios.
/// A busy machine's drift falls on both forms alike, which separate criterion runs do
/// not give.
fn bench_alternate(_c: &mut Criterion) {
    if !std::env::args().any(|a| a.contains("lowp_alternate")) {
        return;
    }
    let weights: Vec<Weight> = (0..6)
        .flat_map(|layer| SHAPES.iter().map(move |&(k, n)| weight(k, n, layer)))
        .collect();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rows: Vec<usize> = std::env::var("LOWP_ROWS")
        .ok()
        .and_then(|v| v.split(',').map(|x| x.parse().ok()).collect())
        .unwrap_or(vec![12, 28, 896]);
    for rows in rows {
        let a = data(rows * 1536);
        let mut out = vec![0.0f32; rows * 1536];
        let flops: usize = weights.iter().map(|w| 2 * rows * w.k * w.n).sum();
        // Passes per sample: about 6 GFLOP (over 100 ms: the thread CPU time of
        // `/proc/thread-self/schedstat` moves in scheduler ticks).
        let reps = (6_000_000_000 / flops).max(1);
        for (par_name, par) in [("serial", Par::serial()), ("all", Par::all())] {
            if par.threads > 1 && std::env::var_os("LOWP_SERIAL").is_some() {
                continue;
            }
            let mut rates = [Vec::new(), Vec::new()];
            for _ in 0..21 {
                for (slot, form) in [0, 1].into_iter().enumerate() {
                    pass(&weights, rows, form, &a, &mut out, par);
                    let (cpu, wall) = (thread_cpu_ns(), Instant::now());
                    for _ in 0..reps {
                        pass(&weights, rows, form, &a, &mut out, par);
                    }
                    let ns = match (par.threads, thread_cpu_ns() - cpu) {
                        (1, ns) if ns > 0 => ns as f64,
                        _ => wall.elapsed().as_nanos() as f64,
                    };
                    rates[slot].push((reps * flops) as f64 / ns);
                }
            }
            let ratios = rates[1].iter().zip(&rates[0]).map(|(b, f)| b / f).collect();
            println!(
                "lowp_alternate rows {rows} {par_name}: f32 {:.1} GFLOP/s, bf16 {:.1} GFLOP/s, \
                 bf16/f32 median of paired ratios {:.3}",
                median(rates[0].clone()),
                median(rates[1].clone()),
                median(ratios)
            );
        }
    }
}

criterion_group!(benches, bench_pass, bench_shapes, bench_alternate);
criterion_main!(benches);
