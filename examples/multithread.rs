//! Several threads run the same MLP at once on shared weights, each in its own stream.
//!
//! `cargo run --release --example multithread -- [THREADS] [ITERATIONS]`
//! (defaults: 2 threads, 200 forward passes each, each read back to the host, so the
//! throughput printed is of passes really computed). The weights are made once on the
//! main thread and shared by reference counting: no thread copies them. Each thread's
//! kernels are limited to one core, so T threads use T cores. With
//! `RUST_LOG=streamfuse=trace` the log narrates every register, flush (with its
//! reason), drain of another stream, deferred drop and stream close. With
//! `STREAMFUSE_TRACE=multithread.json` it writes a timeline (one lane per thread's
//! stream, its flushes and kernels) to open in Perfetto or chrome://tracing.

use std::time::Instant;

use streamfuse::Tensor;

#[path = "common/tier.rs"]
mod tier;

const LAYERS: [usize; 4] = [256, 512, 512, 64];
const BATCH: usize = 32;

fn data(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// The shared weights: (w, b) per layer.
fn weights() -> streamfuse::Result<Vec<(Tensor, Tensor)>> {
    LAYERS
        .windows(2)
        .enumerate()
        .map(|(i, io)| {
            let scale = 1.0 / (io[0] as f32).sqrt();
            Ok((
                Tensor::from_vec(data(io[0] * io[1], i as u64 + 1, scale), &[io[0], io[1]])?,
                Tensor::from_vec(data(io[1], i as u64 + 100, 0.1), &[io[1]])?,
            ))
        })
        .collect()
}

fn forward(x: &Tensor, weights: &[(Tensor, Tensor)]) -> streamfuse::Result<Tensor> {
    let mut h = x.clone();
    for (i, (w, b)) in weights.iter().enumerate() {
        h = h.matmul(w)?.add(b)?;
        if i + 1 < weights.len() {
            h = h.gelu()?;
        }
    }
    h.softmax(-1)
}

fn main() -> streamfuse::Result<()> {
    env_logger::init();
    tier::announce();
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let iterations: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let weights = weights()?;

    let start = Instant::now();
    let results: Vec<streamfuse::Result<(usize, f32, u32)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let weights = &weights;
                // Named, so that the trace's lanes carry the name.
                let worker = std::thread::Builder::new().name(format!("worker-{t}"));
                worker
                    .spawn_scoped(s, move || {
                        streamfuse::set_kernel_threads(1);
                        let x = Tensor::from_vec(
                            data(BATCH * LAYERS[0], 1000 + t as u64, 1.0),
                            &[BATCH, LAYERS[0]],
                        )?;
                        // Every pass is read back, as a caller would: a pass dropped
                        // unread would be pruned by the engine and not timed at all.
                        let mut sum = 0.0f64;
                        let (mut p, mut top) = (0.0f32, 0u32);
                        for _ in 0..iterations {
                            let probs = forward(&x, weights)?.to_vec::<f32>()?;
                            sum += probs.iter().map(|&v| f64::from(v)).sum::<f64>();
                            let row = &probs[..LAYERS[LAYERS.len() - 1]];
                            (top, p) = row.iter().enumerate().fold((0, f32::MIN), |b, (j, &v)| {
                                if v > b.1 {
                                    (j as u32, v)
                                } else {
                                    b
                                }
                            });
                        }
                        // Each softmax row sums to 1: the passes ran and were read.
                        let rows = (iterations * BATCH) as f64;
                        assert!(
                            (sum - rows).abs() < 1e-3 * rows,
                            "rows sum to {sum}, not {rows}"
                        );
                        Ok((t, p, top))
                    })
                    .expect("spawn a worker thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    for r in results {
        let (t, p, top) = r?;
        println!("thread {t}: row 0 -> class {top} with p = {p:.5}");
    }
    let passes = threads * iterations;
    println!(
        "{threads} threads x {iterations} passes of batch {BATCH}: {:.1} passes/s, {:.0} samples/s",
        passes as f64 / elapsed,
        (passes * BATCH) as f64 / elapsed
    );
    let stats = streamfuse::stats();
    println!("live streams after join: {}", stats.live_streams);
    Ok(())
}
