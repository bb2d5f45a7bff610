//! What the timeline costs.
//!
//! - `trace/tiny_flush/off`: a segment of two element-wise ops on 64 floats, recorded,
//!   flushed from the plan cache and read back, with no trace recording: the path where
//!   the engine's per-flush overhead shows most. Compare it with the same bench on a
//!   commit before `streamfuse::trace` existed (`cargo bench --bench trace --
//!   tiny_flush/off`) to see what an idle trace costs (one relaxed atomic load per flush).
//! - `trace/tiny_flush/on`: the same while a trace records (the trace is written after
//!   each sample, outside the timing).
//! - `trace/bert_layer/{off,on}`: a BERT encoder layer (hidden 384, 12 heads, ffn 1536,
//!   batch 8, sequence 128; 9 kernels) without and with a trace recording.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use streamfuse::Tensor;

#[path = "../tests/support/mod.rs"]
mod support;
use support::tensor as t;

fn tiny(x: &Tensor) -> f32 {
    x.affine(2.0, 1.0)
        .unwrap()
        .relu()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()[0]
}

/// Times `iters` runs of `f` with a trace recording (when `on`), writing the trace
/// after the timing.
fn timed(iters: u64, on: bool, mut f: impl FnMut()) -> Duration {
    let path = std::env::temp_dir().join(format!("streamfuse-bench-{}.json", std::process::id()));
    if on {
        streamfuse::trace::start(&path).unwrap();
    }
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let elapsed = start.elapsed();
    if on {
        let w = streamfuse::trace::stop().unwrap();
        let _ = std::fs::remove_file(&w.path);
        if let Some(dir) = w.plans {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    elapsed
}

fn trace(c: &mut Criterion) {
    streamfuse::set_kernel_threads(1);
    let x = t(&[64], 1, 1.0);
    tiny(&x);
    let mut g = c.benchmark_group("trace");
    for on in [false, true] {
        let name = if on {
            "tiny_flush/on"
        } else {
            "tiny_flush/off"
        };
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed(iters, on, || {
                    std::hint::black_box(tiny(&x));
                })
            })
        });
    }
    streamfuse::set_kernel_threads(0);
    let (batch, seq, h, ffn, heads) = (8, 128, 384, 1536, 12);
    let p = support::encoder_params(h, ffn);
    let x = t(&[batch, seq, h], 3, 1.0);
    let layer = || {
        drop(
            support::encoder(&x, &p, heads, None)
                .to_vec::<f32>()
                .unwrap(),
        )
    };
    layer();
    g.sample_size(20);
    for on in [false, true] {
        let name = if on {
            "bert_layer/on"
        } else {
            "bert_layer/off"
        };
        g.bench_function(name, |b| b.iter_custom(|iters| timed(iters, on, layer)));
    }
    g.finish();
}

criterion_group!(benches, trace);
criterion_main!(benches);
