//! Memory bounds: the plan cache stays within its limit, the buffer and arena pools
//! within theirs (and can be trimmed), and an allocation the system refuses is an
//! `Error::OutOfMemory`, not an abort, in both executors.
//!
//! The limits are process-wide and the pools are shared, so every test here takes
//! `LOCK` (tests of one binary run on parallel threads).

use std::sync::{Mutex, MutexGuard};

use streamfuse::{DType, Error, Tensor};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const MIB: usize = 1 << 20;

/// A shape whose f32 elements take 1 PiB: beyond any machine's address space, so the
/// allocation fails whatever the kernel's overcommit policy.
const IMPOSSIBLE: [usize; 2] = [1 << 25, 1 << 23];
const IMPOSSIBLE_BYTES: usize = (1 << 48) * 4;

/// A small program whose segment (and so plan) differs with `n`: an element-wise
/// chain, a reduction, and a second output.
fn program(n: usize) -> (Vec<f32>, Vec<f32>) {
    let x = Tensor::from_vec((0..n).map(|i| i as f32 / n as f32).collect(), &[n]).unwrap();
    let y = x.affine(2.0, 1.0).unwrap().exp().unwrap();
    let s = y.mul(&x).unwrap().sum(0).unwrap();
    (y.to_vec().unwrap(), s.to_vec().unwrap())
}

fn check_program(n: usize, (y, s): (Vec<f32>, Vec<f32>)) {
    let xs: Vec<f32> = (0..n).map(|i| i as f32 / n as f32).collect();
    let want_y: Vec<f32> = xs.iter().map(|x| (x * 2.0 + 1.0).exp()).collect();
    let want_s: f32 = want_y.iter().zip(&xs).map(|(y, x)| y * x).sum();
    for (got, want) in y.iter().zip(&want_y) {
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "n={n}: {got} vs {want}"
        );
    }
    assert!(
        (s[0] - want_s).abs() <= 1e-4 * want_s.abs().max(1.0),
        "n={n}: sum {} vs {want_s}",
        s[0]
    );
}

#[test]
fn plan_cache_stays_under_its_limit_and_rebuilds_evicted_plans() {
    let _g = lock();
    let limit = 128 << 10;
    streamfuse::set_plan_cache_limit(limit);
    let before = streamfuse::stats().plan_cache;
    for n in 1..=300 {
        check_program(n, program(n));
        let cache = streamfuse::stats().plan_cache;
        assert!(
            cache.bytes <= limit,
            "after {n} shapes: {} bytes cached, limit {limit}",
            cache.bytes
        );
    }
    let after = streamfuse::stats().plan_cache;
    assert!(after.evicted > before.evicted, "{after:?}");
    assert!(after.plans > 0 && after.bytes > 0, "{after:?}");
    // The first shapes' plans were evicted: they are built again, and right.
    for n in 1..=3 {
        let got = program(n);
        assert!(!streamfuse::last_flush().unwrap().cache_hit);
        check_program(n, got);
    }
    // A recent one is still there.
    check_program(300, program(300));
    assert!(streamfuse::last_flush().unwrap().cache_hit);
    // A limit of 0 keeps nothing.
    streamfuse::set_plan_cache_limit(0);
    assert_eq!(streamfuse::stats().plan_cache.bytes, 0);
    check_program(5, program(5));
    assert_eq!(streamfuse::stats().plan_cache.plans, 0);
    streamfuse::set_plan_cache_limit(streamfuse::DEFAULT_PLAN_CACHE_LIMIT);
}

/// Runs twelve segments whose arenas take 8, 16, ..., 96 MiB, and keeps nothing.
fn twelve_arenas() {
    for k in 1..=12 {
        let n = k * 8 * MIB / 4;
        let s = Tensor::zeros(&[n], DType::F32)
            .unwrap()
            .affine(1.0, 1.0)
            .unwrap()
            .sum(0)
            .unwrap();
        assert_eq!(s.to_vec::<f32>().unwrap(), vec![n as f32]);
        let info = streamfuse::last_flush().unwrap();
        assert!(info.arena_bytes >= n * 4, "{info:?}");
    }
}

#[test]
fn twelve_arenas_leave_no_more_than_the_pool_limit() {
    let _g = lock();
    // The default limit follows the peak of the last 64 to 128 segments: let what other
    // tests of this file kept alive (up to 624 MiB at once) fall out of that window.
    streamfuse::set_pool_limit(usize::MAX);
    let tiny = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    for _ in 0..130 {
        tiny.affine(2.0, 0.0).unwrap().to_vec::<f32>().unwrap();
    }
    twelve_arenas();
    let stats = streamfuse::stats();
    let limit = streamfuse::pool_limit();
    assert!(
        stats.pooled_bytes <= limit,
        "{} MiB pooled, limit {} MiB",
        stats.pooled_bytes / MIB,
        limit / MIB
    );
    // The default follows the recent peak (one 96 MiB arena and small buffers): about
    // twice that, far below the 624 MiB the twelve arenas take.
    assert!(limit <= 256 * MIB, "limit {} MiB", limit / MIB);
    streamfuse::trim_pools();
    assert_eq!(streamfuse::stats().pooled_bytes, 0);
}

#[test]
fn a_fixed_pool_limit_bounds_the_pools_and_zero_pools_nothing() {
    let _g = lock();
    streamfuse::set_pool_limit(100 * MIB);
    assert_eq!(streamfuse::pool_limit(), 100 * MIB);
    twelve_arenas();
    assert!(streamfuse::stats().pooled_bytes <= 100 * MIB);
    // Twelve buffers of 8..96 MiB alive at once, then all dropped: the pool keeps
    // what fits in the limit, the most recently freed first.
    let held: Vec<Tensor> = (1..=12)
        .map(|k| Tensor::full(k as f32, &[k * 8 * MIB / 4]).unwrap())
        .collect();
    streamfuse::sync().unwrap();
    drop(held);
    let pooled = streamfuse::stats().pooled_bytes;
    assert!(pooled <= 100 * MIB, "{} MiB pooled", pooled / MIB);
    assert!(pooled >= 96 * MIB, "{} MiB pooled", pooled / MIB);
    // Lowering the limit frees the excess at once.
    streamfuse::set_pool_limit(10 * MIB);
    assert!(streamfuse::stats().pooled_bytes <= 10 * MIB);
    streamfuse::set_pool_limit(0);
    check_program(1000, program(1000));
    assert_eq!(streamfuse::stats().pooled_bytes, 0);
    streamfuse::set_pool_limit(usize::MAX);
}

fn assert_out_of_memory(e: &Error, op: &str, bytes: usize) {
    match e {
        Error::OutOfMemory { op: o, bytes: b } => {
            assert_eq!((*o, *b), (op, bytes), "{e}");
            assert!(e.to_string().contains("out of memory"), "{e}");
        }
        _ => panic!("expected OutOfMemory, got {e:?}"),
    }
}

/// Records an impossible tensor next to a good one, reads both, and checks the error,
/// the next sync, the bystander and that the stream still works. `op` is the name the
/// error carries.
fn impossible_output_is_an_error(op: &str) {
    let good = Tensor::from_vec(vec![0.0f32, 1.0], &[2])
        .unwrap()
        .exp()
        .unwrap();
    let big = Tensor::zeros(&IMPOSSIBLE, DType::F32).unwrap();
    let e = big.to_vec::<f32>().unwrap_err();
    assert_out_of_memory(&e, op, IMPOSSIBLE_BYTES);
    let e = streamfuse::sync().unwrap_err();
    assert_out_of_memory(&e, op, IMPOSSIBLE_BYTES);
    streamfuse::sync().unwrap();
    assert_eq!(good.to_vec::<f32>().unwrap(), vec![1.0, 1f32.exp()]);
    // Ops on the failed tensor fail with its error; the stream goes on.
    let e = big.affine(2.0, 0.0).unwrap().to_vec::<f32>().unwrap_err();
    assert_out_of_memory(&e, op, IMPOSSIBLE_BYTES);
    let _ = streamfuse::sync();
    let ok = good.add(&good).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(ok, vec![2.0, 2.0 * 1f32.exp()]);
}

#[test]
fn an_impossible_output_is_an_error_in_the_planned_executor() {
    let _g = lock();
    impossible_output_is_an_error("fill");
}

#[test]
fn an_impossible_output_is_an_error_in_the_op_by_op_executor() {
    let _g = lock();
    streamfuse::set_fusion(false);
    impossible_output_is_an_error("fill");
    streamfuse::set_fusion(true);
}

#[test]
fn an_impossible_arena_fails_only_what_it_holds() {
    let _g = lock();
    let good = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let good = good.affine(3.0, 0.0).unwrap();
    // The zeros and the affine's result are read only inside the segment: they live
    // in the arena (the fill is a kernel of its own, the first to write there).
    let s = Tensor::zeros(&IMPOSSIBLE, DType::F32)
        .unwrap()
        .affine(1.0, 1.0)
        .unwrap()
        .sum(1)
        .unwrap();
    let e = s.to_vec::<f32>().unwrap_err();
    assert_out_of_memory(&e, "fill", IMPOSSIBLE_BYTES);
    assert!(streamfuse::last_flush().unwrap().arena_bytes >= IMPOSSIBLE_BYTES);
    assert_out_of_memory(&streamfuse::sync().unwrap_err(), "fill", IMPOSSIBLE_BYTES);
    assert_eq!(good.to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
}

#[test]
fn the_issues_four_tib_zeros_is_an_error() {
    let _g = lock();
    // Linux refuses a 4 TiB request unless it overcommits always (mode 1).
    let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    if mode.trim() == "1" {
        return;
    }
    let big = Tensor::zeros(&[1 << 20, 1 << 20], DType::F32).unwrap();
    let e = big.to_vec::<f32>().unwrap_err();
    assert_out_of_memory(&e, "fill", 1 << 42);
    assert_eq!(
        e.to_string(),
        "fill: out of memory: could not allocate 4398046511104 bytes (4.0 TiB) for its result"
    );
    let _ = streamfuse::sync();
}

#[test]
fn reading_a_huge_broadcast_view_is_an_error() {
    let _g = lock();
    let one = Tensor::from_vec(vec![7.0f32], &[1, 1]).unwrap();
    let view = one.broadcast_as(&IMPOSSIBLE).unwrap();
    let e = view.to_vec::<f32>().unwrap_err();
    assert_out_of_memory(&e, "to_vec", IMPOSSIBLE_BYTES);
    assert_eq!(one.to_vec::<f32>().unwrap(), vec![7.0]);
    let small = one.broadcast_as(&[2, 3]).unwrap();
    assert_eq!(small.to_vec::<f32>().unwrap(), vec![7.0; 6]);
}
