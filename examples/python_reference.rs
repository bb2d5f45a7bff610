//! What the Python package's tests compare against, computed by the Rust API alone:
//! finds (or fetches, as the examples do) all-MiniLM-L6-v2, embeds the lines of a
//! file with [`Embedder`], and scores (query, document) pairs with [`Reranker`],
//! writing the results as little-endian float32 files. scripts/test-python.sh runs it
//! before pytest; the tests (bindings/python/tests) then hold
//! `streamfuse.Embedder.encode` and `streamfuse.Reranker.predict` to these values bit
//! for bit. It is an example of the core crate, not of the bindings, so that CI runs
//! the binary `cargo test` already built (no second build of the engine).
//!
//! ```text
//! cargo run --example python_reference -- --out-dir DIR [--model DIR]
//!     [--sentences FILE] [--reranker DIR --pairs FILE]
//! ```
//!
//! Writes `DIR/model.txt` (the model folder used), `DIR/embeddings.f32` (one row of
//! `dim` values per line of `--sentences`, in order) and, with `--reranker`,
//! `DIR/logits.f32` and `DIR/scores.f32` (one value per line of `--pairs`, each line
//! `query<TAB>document`).

use std::path::{Path, PathBuf};

use streamfuse::embedder::{Embedder, Reranker};

#[path = "common/fetch.rs"]
mod fetch;

/// The command line.
#[derive(Default)]
struct Args {
    out_dir: Option<PathBuf>,
    model: Option<PathBuf>,
    sentences: Option<PathBuf>,
    reranker: Option<PathBuf>,
    pairs: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .map(PathBuf::from)
            .ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--out-dir" => a.out_dir = Some(value),
            "--model" => a.model = Some(value),
            "--sentences" => a.sentences = Some(value),
            "--reranker" => a.reranker = Some(value),
            "--pairs" => a.pairs = Some(value),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// `values` as little-endian float32 bytes in `path`.
fn write_f32(path: &Path, values: impl Iterator<Item = f32>) -> Result<(), String> {
    let bytes: Vec<u8> = values.flat_map(f32::to_le_bytes).collect();
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn lines(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(text.lines().map(str::to_string).collect())
}

fn run() -> Result<(), String> {
    let args = parse()?;
    let out = args.out_dir.ok_or("--out-dir is required")?;
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let model = fetch::find_or_fetch_model(args.model.as_deref())?;
    let model = model
        .canonicalize()
        .map_err(|e| format!("{}: {e}", model.display()))?;
    std::fs::write(out.join("model.txt"), model.display().to_string())
        .map_err(|e| format!("cannot write model.txt: {e}"))?;
    if let Some(path) = &args.sentences {
        let texts = lines(path)?;
        let e = Embedder::load(&model).map_err(|e| e.to_string())?;
        let vectors = e.embed_counted(&texts).map_err(|e| e.to_string())?.vectors;
        write_f32(&out.join("embeddings.f32"), vectors.into_iter().flatten())?;
        eprintln!("{} embeddings of {} values", texts.len(), e.dim());
    }
    if let Some(dir) = &args.reranker {
        let pairs = lines(args.pairs.as_deref().ok_or("--reranker needs --pairs")?)?;
        let r = Reranker::load(dir).map_err(|e| e.to_string())?;
        let (mut logits, mut scores) = (Vec::new(), Vec::new());
        for line in &pairs {
            let (q, d) = line.split_once('\t').ok_or("a --pairs line has no tab")?;
            let s = r.score(q, &[d]).map_err(|e| e.to_string())?;
            logits.extend(s.logits);
            scores.extend(s.scores);
        }
        write_f32(&out.join("logits.f32"), logits.into_iter())?;
        write_f32(&out.join("scores.f32"), scores.into_iter())?;
        eprintln!("{} pair scores", pairs.len());
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("python_reference: {e}");
        std::process::exit(1);
    }
}
