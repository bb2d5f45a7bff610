//! candle peer for the MiniLM comparison (built by scripts/compare-peers.sh as a separate
//! cargo project under target/peers/candle-bench; not part of streamfuse's build).
//!
//! candle-transformers' BertModel on the same safetensors weights, token ids from the
//! tokenizers crate; sentences sorted by token length (longest first, ties in input
//! order: a stable sort, as streamfuse's and the Python peers') and batched with their
//! neighbours, each batch padded to its longest; mean pooling and L2 normalisation.
//! Threads: candle's CPU kernels use rayon, sized by RAYON_NUM_THREADS.
//!
//!     candle-bench MODEL_DIR SENTENCES_FILE BATCH [OUT_FILE]
//!
//! Prints `peak RSS: X MiB` (VmHWM), `p50_ms:`/`p99_ms:` (latency of one forward call:
//! padding a batch, the forward pass, pooling, the embeddings as Vecs; per sentence with
//! batch 1) and `sentences/s: X`.

use std::io::Write;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{Tokenizer, TruncationParams};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|v| v.to_string()))
        })
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// CPU seconds (user + system, all threads) from /proc/self/stat (USER_HZ = 100).
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let f: Vec<String> = s
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .map(String::from)
                .collect();
            Some((f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?) as f64 / 100.0)
        })
        .unwrap_or(0.0)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: candle-bench MODEL_DIR SENTENCES_FILE BATCH [OUT_FILE]".into());
    }
    let dir = std::path::Path::new(&args[1]);
    let batch: usize = args[3].parse()?;
    let sentences: Vec<String> = std::fs::read_to_string(&args[2])?
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect();

    let device = Device::Cpu;
    let config: Config = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &device)?
    };
    let model = BertModel::load(vb, &config)?;
    let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;
    tokenizer.with_padding(None);
    tokenizer.with_truncation(Some(TruncationParams {
        max_length: 256,
        ..Default::default()
    }))?;

    let start = Instant::now();
    let cpu_start = cpu_seconds();
    let ids: Vec<Vec<u32>> = sentences
        .iter()
        .map(|s| Ok(tokenizer.encode(s.as_str(), true)?.get_ids().to_vec()))
        .collect::<Res<_>>()?;
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
    let mut out = vec![Vec::new(); ids.len()];
    let mut latencies = Vec::with_capacity(ids.len().div_ceil(batch.max(1)));
    for chunk in order.chunks(batch.max(1)) {
        let t = Instant::now();
        let n = chunk.iter().map(|&i| ids[i].len()).max().unwrap_or(1);
        let mut flat = vec![0u32; chunk.len() * n];
        let mut mask = vec![0u32; chunk.len() * n];
        for (r, &i) in chunk.iter().enumerate() {
            flat[r * n..r * n + ids[i].len()].copy_from_slice(&ids[i]);
            mask[r * n..r * n + ids[i].len()].fill(1);
        }
        let input = Tensor::from_vec(flat, (chunk.len(), n), &device)?;
        let mask = Tensor::from_vec(mask, (chunk.len(), n), &device)?;
        let types = input.zeros_like()?;
        let hidden = model.forward(&input, &types, Some(&mask))?;
        let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&m)?.sum(1)?;
        let count = m.sum(1)?.clamp(1e-9, f64::MAX)?;
        let mean = summed.broadcast_div(&count)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        let emb = mean.broadcast_div(&norm)?.to_vec2::<f32>()?;
        latencies.push(t.elapsed().as_secs_f64());
        for (&i, e) in chunk.iter().zip(emb) {
            out[i] = e;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_start;

    if let Some(path) = args.get(4) {
        let mut f = std::fs::File::create(path)?;
        for e in &out {
            for v in e {
                f.write_all(&v.to_le_bytes())?;
            }
        }
    }
    println!("candle, {} rayon threads, batch {batch}", rayon_threads());
    println!(
        "embedding 0 begins: {}",
        out[0][..5]
            .iter()
            .map(|v| format!("{v:.7}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("peak RSS: {:.1} MiB", peak_rss_mib());
    println!("time: {secs:.3} s");
    println!("cpu: {cpu:.2} s");
    latencies.sort_by(f64::total_cmp);
    println!("calls: {}", latencies.len());
    println!("p50_ms: {:.3}", percentile(&latencies, 50.0) * 1e3);
    println!("p99_ms: {:.3}", percentile(&latencies, 99.0) * 1e3);
    println!("sentences/s: {:.1}", sentences.len() as f64 / secs);
    Ok(())
}

/// The `p`th percentile (nearest rank) of ascending `sorted`; 0 when it is empty.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn rayon_threads() -> String {
    std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into())
}
