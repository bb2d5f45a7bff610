//! Planning time against buffer count (1k, 10k, 60k buffers) for greedy by size
//! and the default `best` strategy, on synthetic traces shaped like model
//! graphs: mostly short-lived activations in program order, a few long-lived
//! tensors, sizes spread over four orders of magnitude.
//!
//! `cargo bench --bench plan`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use streamfuse::memory_planner::{self as plan, Buffer, Options, Problem, Strategy};

fn trace(n: usize, seed: u64) -> Problem {
    let mut s = seed;
    let mut next = move |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    let buffers = (0..n)
        .map(|id| {
            let lower = id as u64 / 2;
            let width = match next(100) {
                0..=79 => 1 + next(4),
                80..=97 => 4 + next(40),
                _ => 40 + next(n as u64 / 4 + 1),
            };
            let size = 64 << next(14);
            Buffer {
                id,
                lower,
                upper: lower + width,
                size,
                alignment: 64,
            }
        })
        .collect();
    Problem::new(buffers)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    for n in [1_000, 10_000, 60_000] {
        let p = trace(n, 42);
        for s in [Strategy::GreedySize, Strategy::Best] {
            let o = Options {
                strategy: s,
                time_limit: Duration::from_secs(2),
                ..Options::default()
            };
            g.bench_with_input(BenchmarkId::new(s.name(), n), &p, |b, p| {
                b.iter(|| plan::solve(p, &o).unwrap().arena)
            });
        }
    }
    // The engine's case: a couple of hundred buffers per segment.
    let p = trace(200, 7);
    let o = Options::default();
    g.bench_function("best/200", |b| {
        b.iter(|| plan::solve(&p, &o).unwrap().arena)
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
