//! Draws the memory plan of a BERT encoder layer as an SVG picture.
//!
//! `cargo run --release --example plan_picture -- [OUT.svg]` (default
//! `bert-layer-plan.svg`) runs one encoder layer (hidden 384, 12 heads, ffn 1536,
//! batch 8, sequence 128: the layer `benches/fusion.rs` times) and writes the picture
//! of the plan of its segment: each arena buffer over the plan's levels, the lower bound
//! and the arena, the peak marked (`FlushInfo::plan_svg`). The README shows it.

use streamfuse::Tensor;

#[path = "../tests/support/mod.rs"]
mod support;
#[path = "common/tier.rs"]
mod tier;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tier::announce();
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "bert-layer-plan.svg".to_string());
    let (batch, seq, h, ffn, heads) = (8, 128, 384, 1536, 12);
    let p = support::encoder_params(h, ffn);
    let x: Tensor = support::tensor(&[batch, seq, h], 3, 1.0);
    support::encoder(&x, &p, heads, None).to_vec::<f32>()?;
    let info = streamfuse::last_flush().ok_or("no segment ran")?;
    let svg = info
        .plan_svg()
        .ok_or("the layer's plan is not in the plan cache")?;
    std::fs::write(&out, svg)?;
    println!(
        "{out}: segment {:016x}, {} ops in {} kernels, arena {} bytes (lower bound {})",
        info.key, info.ops, info.kernels, info.arena_bytes, info.arena_lower_bound
    );
    Ok(())
}
