//! Quickstart: a small two-layer MLP classifier written with the `Tensor` API.
//!
//! Every op below is checked and queued at once; nothing runs until `to_vec` asks for
//! the probabilities. Run with `cargo run --release --example quickstart`
//! (add `RUST_LOG=streamfuse=trace` to watch the stream record and flush).

use streamfuse::{DType, Tensor};

#[path = "common/tier.rs"]
mod tier;

/// Deterministic pseudo-random weights in [-scale, scale).
fn weights(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn main() -> streamfuse::Result<()> {
    env_logger::init();
    tier::announce();
    let (batch, input, hidden, classes) = (4, 16, 32, 3);

    let w1 = Tensor::from_vec(weights(input * hidden, 1, 0.25), &[input, hidden])?;
    let b1 = Tensor::zeros(&[hidden], DType::F32)?;
    let w2 = Tensor::from_vec(weights(hidden * classes, 2, 0.25), &[hidden, classes])?;
    let b2 = Tensor::full(0.1, &[classes])?;
    let x = Tensor::from_vec(weights(batch * input, 3, 1.0), &[batch, input])?;

    // Two layers: matmul + bias (broadcast over the batch) + GELU, then softmax.
    let h = x.matmul(&w1)?.add(&b1)?.gelu()?;
    let logits = h.matmul(&w2)?.add(&b2)?;
    let probs = logits.softmax(-1)?;
    let classes_picked = probs.argmax(-1)?;

    println!("input  {:?} -> probabilities {:?}", x.dims(), probs.dims());
    let p = probs.to_vec::<f32>()?;
    for (row, chosen) in p.chunks(classes).zip(classes_picked.to_vec::<u32>()?) {
        let row: Vec<String> = row.iter().map(|v| format!("{v:.4}")).collect();
        println!("  [{}]  -> class {chosen}", row.join(", "));
    }

    // Shape errors are reported when the op is recorded, and nothing is queued.
    match x.matmul(&w2) {
        Ok(_) => unreachable!("the shapes do not match"),
        Err(e) => println!("as expected: {e}"),
    }
    let info = streamfuse::last_flush().expect("to_vec flushed the stream");
    println!(
        "last segment: {} ops, key {:016x}, flushed by {}",
        info.ops, info.key, info.reason
    );
    Ok(())
}
