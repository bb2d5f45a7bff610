//! What a new sequence length costs: a full plan build against an instantiation of
//! the stored symbolic plan, against a plain cache hit.
//!
//! The segment is six BERT encoder layers (MiniLM's widths: hidden 384, 12 heads, FFN
//! 1536, attention as one op) over one sequence of 24 tokens, flushed by reading the
//! result. Each iteration records and runs the whole segment, so the three timings
//! differ only in how the plan is found:
//!
//! - `symbolic/full_build`: the plan cache is emptied first (`clear_plan_cache`): fusion,
//!   levels and the memory planner, as for a segment structure never seen;
//! - `symbolic/instantiate`: only the stored instances are forgotten
//!   (`forget_plan_instances`), so the structure's symbolic plan is instantiated for the
//!   length, as for a length never seen;
//! - `symbolic/hit`: the plan of this length is stored.
//!
//! `symbolic_tiny/*` does the same for the same six layers at widths 16 (2 heads, FFN
//! 32) over 4 tokens, where the kernels cost next to nothing, so the timings are
//! mostly recording and planning.
//!
//! `cargo bench --features internals --bench symbolic`

use criterion::{criterion_group, criterion_main, Criterion};
use streamfuse::clear_plan_cache;
use streamfuse::inspect::forget_plan_instances;
use streamfuse::Tensor;

#[path = "../tests/support/mod.rs"]
mod support;
use support::{encoder_fused_attention, encoder_params, tensor};

const LAYERS: usize = 6;

fn forward(x: &Tensor, p: &[Tensor], heads: usize) -> Vec<f32> {
    let mut h = x.clone();
    for _ in 0..LAYERS {
        h = encoder_fused_attention(&h, p, heads);
    }
    h.to_vec::<f32>().unwrap()
}

fn symbolic(c: &mut Criterion) {
    group(c, "symbolic", (24, 384, 12, 1536));
    group(c, "symbolic_tiny", (4, 16, 2, 32));
}

/// The three ways of finding the plan of six layers of `(tokens, hidden, heads, ffn)`.
fn group(c: &mut Criterion, name: &str, (len, h, heads, ffn): (usize, usize, usize, usize)) {
    let p = encoder_params(h, ffn);
    let x = tensor(&[1, len, h], 7, 1.0);
    // Warm up pools and check that each mode finds its plan the way it is named.
    let modes: [(&str, fn()); 3] = [
        ("full_build", clear_plan_cache),
        ("instantiate", forget_plan_instances),
        ("hit", || {}),
    ];
    for (mode, prepare) in modes {
        forward(&x, &p, heads);
        prepare();
        forward(&x, &p, heads);
        let info = streamfuse::last_flush().unwrap();
        let found = match (info.cache_hit, info.instantiated) {
            (true, _) => "hit",
            (_, true) => "instantiate",
            _ => "full_build",
        };
        assert_eq!(found, mode, "{info:?}");
        println!("{name}/{found}: {} ops, {} kernels", info.ops, info.kernels);
    }
    let mut g = c.benchmark_group(name);
    g.sample_size(30);
    for (mode, prepare) in modes {
        g.bench_function(mode, |b| {
            b.iter(|| {
                prepare();
                forward(&x, &p, heads)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, symbolic);
criterion_main!(benches);
