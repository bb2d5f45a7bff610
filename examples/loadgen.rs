//! A load generator for sentence embeddings: C clients at once, each sending N
//! requests of 1..K texts drawn from a file, one request at a time, against the HTTP
//! server (`examples/serve.rs`) or a shared in-process `Embedder` (no HTTP, to tell
//! the engine from the transport).
//!
//! ```text
//! cargo run --release --example loadgen -- --clients 16 --requests 40 --max-texts 8 \
//!     --sentences scripts/data/sentences-512.txt (--url http://127.0.0.1:8080 | --in-process [--model DIR])
//!     [--seed S] [--workers N] [--max-batch-tokens N] [--kernel-threads N] [--max-wait-ms MS] [--linger SECS]
//! ```
//!
//! Client `c` draws its request sizes and sentences from its own generator seeded
//! with `S + c` (default S = 1), so every run (and every peer given the same seeds)
//! sends the same requests. `--workers`, `--max-batch-tokens`, `--kernel-threads` and
//! `--max-wait-ms` set the in-process embedder (defaults as
//! `EmbedderSettings::default()`); `--linger SECS` (in process)
//! waits that long after the load, idle, and prints `rss_after_idle_mib:` (the
//! embedder trims the engine's pools and plan cache after 2 s idle).
//!
//! The output ends with one line `texts/s: X requests: R p50_ms: A p90_ms: B p99_ms: C`
//! (latency of a request from send to answer; nearest-rank percentiles) and then
//! `peak RSS: X MiB` (this process's VmHWM; in process, the engine's too).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::json;
use streamfuse::embedder::{Embedder, EmbedderSettings};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/fetch.rs"]
mod fetch;
#[path = "common/http.rs"]
mod http;
#[path = "common/tier.rs"]
mod tier;

const USAGE: &str = "usage: loadgen --clients C --requests N --max-texts K --sentences FILE \
                     (--url http://ADDR | --in-process [--model DIR]) [--seed S] [--workers N] \
                     [--max-batch-tokens N] [--kernel-threads N] [--max-wait-ms MS] [--linger SECS]";

struct Args {
    clients: usize,
    requests: usize,
    max_texts: usize,
    sentences: PathBuf,
    url: Option<String>,
    in_process: bool,
    model: Option<PathBuf>,
    seed: u64,
    settings: EmbedderSettings,
    linger: Option<u64>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        clients: 16,
        requests: 40,
        max_texts: 8,
        sentences: PathBuf::from("scripts/data/sentences-512.txt"),
        url: None,
        in_process: false,
        model: None,
        seed: 1,
        settings: EmbedderSettings::default(),
        linger: None,
    };
    cli::each_flag(USAGE, |name, value| {
        match name {
            "--clients" => a.clients = cli::count(value()?, name)?,
            "--requests" => a.requests = cli::count(value()?, name)?,
            "--max-texts" => a.max_texts = cli::count(value()?, name)?,
            "--sentences" => a.sentences = PathBuf::from(value()?),
            "--url" => a.url = Some(value()?),
            "--in-process" => a.in_process = true,
            "--model" => a.model = Some(PathBuf::from(value()?)),
            "--seed" => {
                let v = value()?;
                a.seed = v
                    .parse()
                    .map_err(|_| format!("--seed must be a whole number, got `{v}`"))?;
            }
            "--workers" => a.settings.workers = cli::count(value()?, name)?,
            "--max-batch-tokens" => a.settings.max_batch_tokens = cli::count(value()?, name)?,
            "--kernel-threads" => a.settings.kernel_threads = cli::count(value()?, name)?,
            "--max-wait-ms" => a.settings.max_wait = cli::millis(value()?, name)?,
            "--linger" => a.linger = Some(cli::count(value()?, name)? as u64),
            other => return Err(format!("unknown argument `{other}`")),
        }
        Ok(())
    })?;
    if a.in_process == a.url.is_some() {
        return Err(format!(
            "give exactly one of --url and --in-process\n{USAGE}"
        ));
    }
    Ok(a)
}

/// SplitMix64: a small seeded generator (the same sequence in every run).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// Client `c`'s requests: `n` lists of 1..=`k` sentences.
fn requests(sentences: &[String], c: usize, a: &Args) -> Vec<Vec<String>> {
    let mut rng = Rng(a.seed.wrapping_add(c as u64));
    (0..a.requests)
        .map(|_| {
            let n = 1 + rng.below(a.max_texts);
            (0..n)
                .map(|_| sentences[rng.below(sentences.len())].clone())
                .collect()
        })
        .collect()
}

/// Each client's latencies in seconds, or the first error.
type Outcome = Result<Vec<f64>, String>;

fn in_process(a: &Args, work: Vec<Vec<Vec<String>>>) -> Result<(Vec<Outcome>, f64), String> {
    let dir = fetch::find_or_fetch_model(a.model.as_deref())?;
    let embedder = Arc::new(
        Embedder::load_with(&dir, a.settings.clone())
            .map_err(|e| format!("cannot load the model: {e}"))?,
    );
    eprintln!(
        "in process: {} ({} workers, max_batch_tokens {})",
        dir.display(),
        embedder.settings().workers,
        embedder.settings().max_batch_tokens
    );
    let barrier = Arc::new(Barrier::new(work.len() + 1));
    let handles: Vec<_> = work
        .into_iter()
        .map(|reqs| {
            let (e, barrier) = (Arc::clone(&embedder), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let mut lat = Vec::with_capacity(reqs.len());
                for texts in reqs {
                    let t = Instant::now();
                    let v = e.embed_counted(&texts).map_err(|e| e.to_string())?;
                    if v.vectors.len() != texts.len() {
                        return Err(format!(
                            "{} vectors for {} texts",
                            v.vectors.len(),
                            texts.len()
                        ));
                    }
                    lat.push(t.elapsed().as_secs_f64());
                }
                Ok(lat)
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let outcomes = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| Err("a client panicked".into())))
        .collect();
    let secs = start.elapsed().as_secs_f64();
    let c = streamfuse::stats().plan_cache;
    eprintln!(
        "plan cache: {} structures, {} instances, {:.1} MiB; {} hits, {} instantiated, {} misses",
        c.plans,
        c.instances,
        c.bytes as f64 / (1 << 20) as f64,
        c.hits,
        c.instantiated,
        c.misses
    );
    if let Some(s) = a.linger {
        std::thread::sleep(Duration::from_secs(s));
        if let Some(mib) = cli::status_mib("VmRSS:") {
            println!("rss_after_idle_mib: {mib:.1} (after {s} s idle)");
        }
    }
    Ok((outcomes, secs))
}

fn over_http(
    a: &Args,
    url: &str,
    work: Vec<Vec<Vec<String>>>,
) -> Result<(Vec<Outcome>, f64), String> {
    let host = http::host_port(url)?;
    let runtime = cli::tokio_runtime(2)?;
    runtime.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..a.clients {
            conns.push(http::Conn::connect(&host).await?);
        }
        let start = Instant::now();
        let tasks: Vec<_> = conns
            .into_iter()
            .zip(work)
            .map(|(mut conn, reqs)| {
                tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(reqs.len());
                    for texts in reqs {
                        let body = json!({"input": texts, "model": "all-MiniLM-L6-v2"}).to_string();
                        let t = Instant::now();
                        let (status, body) = conn
                            .request(hyper::Method::POST, "/v1/embeddings", body.into_bytes())
                            .await?;
                        if !status.is_success() {
                            return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
                        }
                        let v: serde_json::Value = serde_json::from_slice(&body)
                            .map_err(|e| format!("the answer is not JSON: {e}"))?;
                        let n = v["data"].as_array().map_or(0, Vec::len);
                        if n != texts.len() {
                            return Err(format!("{n} embeddings for {} texts", texts.len()));
                        }
                        lat.push(t.elapsed().as_secs_f64());
                    }
                    Ok(lat)
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(
                t.await
                    .unwrap_or_else(|e| Err(format!("a client failed: {e}"))),
            );
        }
        Ok((outcomes, start.elapsed().as_secs_f64()))
    })
}

fn run() -> Result<(), String> {
    tier::announce();
    let a = parse_args()?;
    let sentences: Vec<String> = std::fs::read_to_string(&a.sentences)
        .map_err(|e| format!("cannot read --sentences {}: {e}", a.sentences.display()))?
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .filter(|l| !l.trim().is_empty())
        .collect();
    if sentences.is_empty() {
        return Err(format!("{} holds no sentences", a.sentences.display()));
    }
    let work: Vec<Vec<Vec<String>>> = (0..a.clients)
        .map(|c| requests(&sentences, c, &a))
        .collect();
    let texts: usize = work.iter().flatten().map(Vec::len).sum();
    eprintln!(
        "{} clients x {} requests of 1..{} texts ({texts} texts) from {}",
        a.clients,
        a.requests,
        a.max_texts,
        a.sentences.display()
    );
    let (outcomes, secs) = match &a.url {
        Some(url) => over_http(&a, url, work)?,
        None => in_process(&a, work)?,
    };
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    for o in outcomes {
        match o {
            Ok(l) => latencies.extend(l),
            Err(e) => errors.push(e),
        }
    }
    latencies.sort_by(f64::total_cmp);
    for e in &errors {
        eprintln!("client error: {e}");
    }
    println!(
        "texts/s: {:.1} requests: {} p50_ms: {:.2} p90_ms: {:.2} p99_ms: {:.2}",
        texts as f64 / secs,
        latencies.len(),
        cli::percentile(&latencies, 50.0) * 1e3,
        cli::percentile(&latencies, 90.0) * 1e3,
        cli::percentile(&latencies, 99.0) * 1e3
    );
    if let Some(mib) = cli::status_mib("VmHWM:") {
        println!("peak RSS: {mib:.1} MiB");
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{} of {} clients failed", errors.len(), a.clients))
    }
}

fn main() -> ExitCode {
    cli::main_with(run)
}
