//! Heap allocations of a repeated forward pass, counted with a counting global
//! allocator (this file holds one test so that no other test allocates meanwhile).
//!
//! Each allocation inside the measured window is attributed by its backtrace: the
//! `gemm` crate allocates its packing buffers on every call (it has no API that takes
//! caller memory), everything else — recording, the plan cache, the planned executor,
//! the kernels of streamfuse — must allocate nothing once a pass has run; and with
//! weights packed (AVX-512), a layer whose products are all by weights calls no gemm.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

mod emulated;
mod support;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static GEMM: AtomicUsize = AtomicUsize::new(0);
static OTHER: AtomicUsize = AtomicUsize::new(0);
static FIRST_OTHER: Mutex<Option<String>> = Mutex::new(None);

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Attributes one allocation (when counting) to gemm or to the rest.
fn count() {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    let _ = INSIDE.try_with(|inside| {
        if inside.replace(true) {
            return; // the backtrace's own allocations
        }
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        if trace.contains("gemm_common::") || trace.contains("gemm_f32::") {
            GEMM.fetch_add(1, Ordering::Relaxed);
        } else {
            OTHER.fetch_add(1, Ordering::Relaxed);
            FIRST_OTHER.lock().unwrap().get_or_insert(trace);
        }
        inside.set(false);
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (outside gemm, inside gemm) of `f`.
fn allocations(f: impl FnOnce()) -> (usize, usize) {
    OTHER.store(0, Ordering::SeqCst);
    GEMM.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    f();
    COUNTING.store(false, Ordering::SeqCst);
    (OTHER.load(Ordering::SeqCst), GEMM.load(Ordering::SeqCst))
}

fn first_other() -> String {
    FIRST_OTHER.lock().unwrap().take().unwrap_or_default()
}

#[test]
fn a_repeated_bert_layer_forward_pass_allocates_nothing_in_the_engine() {
    // Every rayon worker has started (a worker's own start-up allocates, whenever the
    // OS gets round to it).
    rayon::broadcast(|_| ());
    // The largest layer takes a batch of 8 sequences, 2 (still split by rows) under
    // STREAMFUSE_TEST_SCALE.
    for (h, ffn, heads, batch, seq) in [
        (32, 64, 4, 2, 8),
        (64, 256, 4, 4, 32),
        (128, 512, 4, emulated::scaled(8, 2), 128),
    ] {
        let p = support::encoder_params(h, ffn);
        let x = support::tensor(&[batch, seq, h], 99, 1.0);
        // Warm-up: fills the pools, free lists, scratch vectors, plan cache; the
        // second call packs the weights (a right operand is packed at its second use).
        let out = support::encoder(&x, &p, heads, None)
            .to_vec::<f32>()
            .unwrap();
        support::encoder(&x, &p, heads, None)
            .to_vec::<f32>()
            .unwrap();
        let mut y = None;
        let (rec, rec_gemm) = allocations(|| y = Some(support::encoder(&x, &p, heads, None)));
        let info_rec = first_other();
        let (run, run_gemm) = allocations(|| streamfuse::sync().unwrap());
        let info_run = first_other();
        let info = streamfuse::last_flush().unwrap();
        assert!(info.cache_hit);
        assert_eq!(y.unwrap().to_vec::<f32>().unwrap(), out);
        eprintln!(
            "hidden {h}: one forward pass after warm-up: {rec} allocations while recording {} ops, \
             {run} while running {} kernels (gemm's own packing buffers: {})",
            info.ops,
            info.kernels,
            rec_gemm + run_gemm
        );
        assert_eq!(rec, 0, "recording allocated; first at:\n{info_rec}");
        assert_eq!(run, 0, "running allocated; first at:\n{info_run}");

        // The layer as the BERT model runs it (attention as one op): every product is
        // by a packed weight, so not even gemm allocates (on CPUs with the packed
        // kernel, AVX-512; elsewhere gemm still packs on each call).
        let out = support::encoder_fused_attention(&x, &p, heads)
            .to_vec::<f32>()
            .unwrap();
        let mut y = None;
        let (rec, rec_gemm) =
            allocations(|| y = Some(support::encoder_fused_attention(&x, &p, heads)));
        let info_rec = first_other();
        let (run, run_gemm) = allocations(|| streamfuse::sync().unwrap());
        let info_run = first_other();
        assert!(streamfuse::last_flush().unwrap().cache_hit);
        assert_eq!(y.unwrap().to_vec::<f32>().unwrap(), out);
        eprintln!(
            "hidden {h}, attention as one op: {rec} + {run} allocations, gemm's {}",
            rec_gemm + run_gemm
        );
        assert_eq!(rec, 0, "recording allocated; first at:\n{info_rec}");
        assert_eq!(run, 0, "running allocated; first at:\n{info_run}");
        if streamfuse::inspect::product_tile(streamfuse::DType::F32).is_some() {
            assert_eq!(rec_gemm + run_gemm, 0, "a product went through gemm");
        }

        // The same layer with its weights kept in reduced precision: the products
        // round (or quantise) their left rows into per-thread scratch that is kept.
        for dtype in [
            streamfuse::DType::BF16,
            streamfuse::DType::I8,
            streamfuse::DType::BF16X3,
        ] {
            let q: Vec<streamfuse::Tensor> = p
                .iter()
                .map(|t| {
                    if t.rank() == 2 {
                        t.to_dtype(dtype).unwrap()
                    } else {
                        t.clone()
                    }
                })
                .collect();
            let out = support::encoder_fused_attention(&x, &q, heads)
                .to_vec::<f32>()
                .unwrap();
            let mut y = None;
            let (rec, rec_gemm) =
                allocations(|| y = Some(support::encoder_fused_attention(&x, &q, heads)));
            let info_rec = first_other();
            let (run, run_gemm) = allocations(|| streamfuse::sync().unwrap());
            let info_run = first_other();
            assert!(streamfuse::last_flush().unwrap().cache_hit);
            assert_eq!(y.unwrap().to_vec::<f32>().unwrap(), out);
            eprintln!("hidden {h}, {dtype} weights: {rec} + {run} allocations");
            assert_eq!(
                rec, 0,
                "{dtype}: recording allocated; first at:\n{info_rec}"
            );
            assert_eq!(run, 0, "{dtype}: running allocated; first at:\n{info_run}");
            assert_eq!(
                rec_gemm + run_gemm,
                0,
                "{dtype}: a product went through gemm"
            );
        }
    }
}
