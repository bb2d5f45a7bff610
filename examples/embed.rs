//! Sentence embeddings from any sentence-transformers folder the `Embedder` loads
//! (BERT, RoBERTa's families, MPNet, ModernBERT, Qwen3: see the README's families
//! table), timed as sentence-transformers' `encode` batches them.
//!
//! ```text
//! cargo run --release --example embed -- --folder DIR [--sentences FILE] [--batch N]
//!     [--workers W] [--precision f32|bf16|int8|bf16x3] [--out FILE]
//! ```
//!
//! - `--folder DIR`: a sentence-transformers folder (`modules.json`, or a bare
//!   Hugging Face model folder), loaded with [`streamfuse::embedder::Embedder::load_with`].
//! - Without `--sentences`, embeds a few built-in sentences. `--sentences FILE` reads
//!   one sentence a line.
//! - `--batch N` (default 32): sentences per `embed` call. The sentences are sorted
//!   longest first by characters, as sentence-transformers' `encode` sorts them, and
//!   cut into calls of `N` neighbours; the calls run one after another.
//! - `--workers W` (default 1): the Embedder's worker threads (its streams); the
//!   kernel threads are shared between them over the cores.
//! - `--out FILE`: the embeddings as little-endian f32 rows, in input order.
//!
//! stdout ends with the plan cache's counters (`plan_cache: misses M, instantiated I,
//! hits H, structures S, instances N`; see `streamfuse::CacheStats`), then `p50_ms: X`, `p99_ms: Y` (the median and 99th-percentile time of
//! one `embed` call) and `sentences/s: X` (tokenising and embedding, after loading).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use streamfuse::embedder::{Embedder, EmbedderSettings};
use streamfuse::models::Precision;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/tier.rs"]
mod tier;

const BUILTIN: [&str; 4] = [
    "This is an example sentence",
    "Each sentence is converted",
    "The cat sits outside",
    "A man is playing guitar",
];

const USAGE: &str = "usage: embed --folder DIR [--sentences FILE] [--batch N] [--workers W] \
     [--precision f32|bf16|int8|bf16x3] [--out FILE]";

struct Args {
    folder: Option<PathBuf>,
    sentences: Option<PathBuf>,
    batch: usize,
    workers: usize,
    precision: Precision,
    out: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        folder: None,
        sentences: None,
        batch: 32,
        workers: 1,
        precision: Precision::F32,
        out: None,
    };
    cli::each_flag(USAGE, |name, value| {
        match name {
            "--folder" => args.folder = Some(PathBuf::from(value()?)),
            "--sentences" => args.sentences = Some(PathBuf::from(value()?)),
            "--batch" => args.batch = cli::count(value()?, "--batch")?,
            "--workers" => args.workers = cli::count(value()?, "--workers")?,
            "--precision" => args.precision = value()?.parse()?,
            "--out" => args.out = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument `{other}`")),
        }
        Ok(())
    })?;
    Ok(args)
}

fn run() -> Result<(), String> {
    tier::announce();
    let args = parse_args()?;
    let folder = args
        .folder
        .clone()
        .ok_or_else(|| format!("--folder is required\n{USAGE}"))?;
    let sentences: Vec<String> = match &args.sentences {
        None => BUILTIN.iter().map(|s| s.to_string()).collect(),
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read --sentences {}: {e}", path.display()))?
            .lines()
            .map(|l| l.trim_end_matches('\r').to_string())
            .filter(|l| !l.is_empty())
            .collect(),
    };
    if sentences.is_empty() {
        return Err("no sentences to embed (the --sentences file is empty)".into());
    }
    let t_load = Instant::now();
    let settings = EmbedderSettings {
        workers: args.workers,
        precision: args.precision,
        ..EmbedderSettings::default()
    };
    let e = Embedder::load_with(&folder, settings)
        .map_err(|e| format!("cannot load {}: {e}", folder.display()))?;
    println!(
        "model: {} ({}, dim {}, {} weights, {} workers), loaded in {:.0} ms",
        folder.display(),
        e.model().model_type(),
        e.dim(),
        e.model().precision(),
        args.workers,
        t_load.elapsed().as_secs_f64() * 1e3
    );
    // sentence-transformers' order: longest first by characters, ties in input order.
    let mut order: Vec<usize> = (0..sentences.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sentences[i].chars().count()));
    let mut vectors = vec![Vec::new(); sentences.len()];
    let mut latencies = Vec::new();
    let (mut tokens, start) = (0, Instant::now());
    for chunk in order.chunks(args.batch) {
        let texts: Vec<&str> = chunk.iter().map(|&i| sentences[i].as_str()).collect();
        let t = Instant::now();
        let got = e.embed_counted(&texts).map_err(|e| e.to_string())?;
        latencies.push(t.elapsed().as_secs_f64() * 1e3);
        tokens += got.tokens;
        for (&i, v) in chunk.iter().zip(got.vectors) {
            vectors[i] = v;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} sentences, {tokens} tokens, batch {}",
        sentences.len(),
        args.batch
    );
    if let Some(path) = &args.out {
        let mut f = std::fs::File::create(path)
            .map_err(|e| format!("cannot create --out {}: {e}", path.display()))?;
        for v in &vectors {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            f.write_all(&bytes)
                .map_err(|e| format!("cannot write --out {}: {e}", path.display()))?;
        }
    }
    latencies.sort_by(f64::total_cmp);
    let cache = streamfuse::stats().plan_cache;
    println!(
        "plan_cache: misses {}, instantiated {}, hits {}, structures {}, instances {}",
        cache.misses, cache.instantiated, cache.hits, cache.plans, cache.instances
    );
    if let Some(mib) = cli::status_mib("VmHWM") {
        println!("peak_rss_mib: {mib:.0}");
    }
    println!("p50_ms: {:.3}", cli::percentile(&latencies, 50.0));
    println!("p99_ms: {:.3}", cli::percentile(&latencies, 99.0));
    println!("sentences/s: {:.1}", sentences.len() as f64 / secs);
    Ok(())
}

fn main() -> ExitCode {
    cli::main_with(run)
}
