//! Records a small program on many distinct shapes (each new symbol values of one
//! segment structure, so a new instance of its plan in the cache) and prints, every 1,000 shapes, the plan cache's size against its limit and the
//! process's resident memory: with the cache bounded, RSS stops growing once the cache
//! is full. Run by `scripts/memory-bounds.sh`.
//!
//! Usage: `plan_cache_growth [SHAPES] [CACHE_LIMIT_MIB] [POOL_LIMIT_MIB]` (defaults:
//! 10000 shapes and the default limits). The pooled bytes are printed too: the pools
//! keep up to their own limit (64 MiB at least by default) of free buffers and
//! arenas, which RSS includes.

use streamfuse::{Result, Tensor};

#[path = "common/tier.rs"]
mod tier;

/// Resident memory of this process in KiB (`VmRSS` of /proc/self/status), or 0 where
/// there is none.
fn rss_kib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One segment on `[2, n]` inputs: element-wise chains, a softmax, a reduction and a
/// second output, about a dozen ops.
fn program(n: usize) -> Result<f32> {
    let x = Tensor::from_vec((0..2 * n).map(|i| (i % 7) as f32 * 0.1).collect(), &[2, n])?;
    let y = x.affine(2.0, 1.0)?.exp()?.mul(&x)?.add(&x)?;
    let p = y.softmax(-1)?;
    let s = p.mul(&y)?.sum(-1)?;
    let m = y.max(-1)?;
    let out = s.add(&m)?;
    Ok(out.to_vec::<f32>()?[0])
}

fn main() -> Result<()> {
    tier::announce();
    let mut args = std::env::args().skip(1);
    let shapes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    if let Some(mib) = args.next().and_then(|a| a.parse::<usize>().ok()) {
        streamfuse::set_plan_cache_limit(mib << 20);
    }
    if let Some(mib) = args.next().and_then(|a| a.parse::<usize>().ok()) {
        streamfuse::set_pool_limit(mib << 20);
    }
    let limit = streamfuse::plan_cache_limit();
    println!(
        "{:>7} {:>9} {:>8} {:>11} {:>11} {:>10} {:>11} {:>9}",
        "shapes",
        "instances",
        "evicted",
        "cache KiB",
        "limit KiB",
        "B/instance",
        "pooled KiB",
        "RSS KiB"
    );
    let mut check = 0.0;
    for n in 1..=shapes {
        check += program(n)?;
        if n % 1000 == 0 || n == shapes {
            let stats = streamfuse::stats();
            let cache = stats.plan_cache;
            println!(
                "{n:>7} {:>9} {:>8} {:>11} {:>11} {:>10} {:>11} {:>9}",
                cache.instances,
                cache.evicted,
                cache.bytes >> 10,
                limit >> 10,
                cache.bytes / cache.instances.max(1),
                stats.pooled_bytes >> 10,
                rss_kib()
            );
        }
    }
    println!("(checksum {check:.3})");
    Ok(())
}
