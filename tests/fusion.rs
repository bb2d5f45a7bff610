//! Fused, planned execution against the op-by-op path: same results, fewer kernels,
//! cached plans, and an arena whose use (observed kernel by kernel) never clobbers a
//! value before its last read.

use proptest::prelude::*;
use streamfuse::inspect::observer;
use streamfuse::Tensor;

mod support;
use support::{assert_close, fused_and_unfused as both};

fn t(dims: &[usize], seed: u64) -> Tensor {
    support::tensor(dims, seed, 1.0)
}

#[test]
fn an_element_wise_chain_is_one_kernel_with_no_intermediate_memory() {
    let x = t(&[64, 100], 1);
    let b = t(&[100], 2);
    let chain = || {
        x.add(&b)
            .unwrap()
            .mul(&x)
            .unwrap()
            .affine(0.5, 1.0)
            .unwrap()
            .relu()
            .unwrap()
            .sub(&b)
            .unwrap()
            .abs()
            .unwrap()
            .sqrt()
            .unwrap()
            .maximum(&x)
            .unwrap()
    };
    let (fused, plain, info) = both(chain);
    assert_eq!(fused, plain);
    assert!(info.planned);
    assert_eq!(info.kernels, 1, "{info:?}");
    assert_eq!(info.arena_bytes, 0, "no intermediate is stored");
}

#[test]
fn a_repeated_program_hits_the_plan_cache() {
    let w = t(&[32, 16], 3);
    let run = |seed| {
        let x = t(&[8, 32], seed);
        let y = x
            .matmul(&w)
            .unwrap()
            .gelu()
            .unwrap()
            .softmax(-1)
            .unwrap()
            .sum(0)
            .unwrap();
        let v = y.to_vec::<f32>().unwrap();
        (v, streamfuse::last_flush().unwrap())
    };
    let (_, first) = run(10);
    let (_, second) = run(11);
    let (_, third) = run(12);
    assert!(second.cache_hit && third.cache_hit, "{second:?} {third:?}");
    assert_eq!(first.key, second.key);
    assert!(first.kernels < first.ops, "fusion cut kernels: {first:?}");
}

#[test]
fn intermediates_share_one_planned_arena_at_the_lower_bound() {
    // A chain where big and small tensors alternate (as in MobileNet-style blocks):
    // each matmul output lives only until the next one.
    let ws: Vec<Tensor> = [(64, 256), (256, 32), (32, 256), (256, 32), (32, 8)]
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| t(&[a, b], 20 + i as u64))
        .collect();
    let x = t(&[16, 64], 5);
    let f = || {
        let mut h = x.clone();
        for w in &ws {
            h = h
                .matmul(w)
                .unwrap()
                .tanh()
                .unwrap()
                .matmul(&Tensor::ones(&[w.dims()[1], w.dims()[1]], streamfuse::DType::F32).unwrap())
                .unwrap();
        }
        h
    };
    let (fused, plain, info) = both(f);
    for (a, b) in fused.iter().zip(&plain) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
    assert!(info.arena_bytes > 0);
    assert_eq!(info.arena_bytes, info.arena_lower_bound, "{info:?}");
}

#[test]
fn a_fused_kernel_overwrites_a_dying_input_in_place() {
    // e = exp(x) is stored (the sum reads it), then y = e / sum(e) is the last reader
    // of e, with e's length and layout: y may take e's bytes. z keeps y inside the
    // segment (y dies there too).
    let (rows, cols) = (64, 256);
    let x = t(&[rows, cols], 9);
    let f = || {
        let e = x.exp().unwrap();
        let s = e.sum_keepdim(1).unwrap();
        let y = e.div(&s).unwrap();
        y.sqrt().unwrap().sum_keepdim(1).unwrap()
    };
    let (fused, plain, info) = both(f);
    assert_eq!(fused, plain);
    let big = rows * cols * 4;
    assert!(
        info.arena_bytes < 2 * big,
        "e and y share their bytes: {info:?}"
    );
    // The observer sees every read of e before y is written over it, and the peak it
    // sees is the planner's bound.
    observer::start();
    f().to_vec::<f32>().unwrap();
    let records = observer::take();
    let peak = records.iter().map(|r| r.arena_live_bytes).max().unwrap();
    assert_eq!(peak, info.arena_lower_bound, "{records:?}");
    assert!(records.iter().any(|r| r.reads.iter().any(|a| r
        .writes
        .iter()
        .any(|w| w.offset == a.offset && w.value != a.value))));
}

#[test]
fn the_observer_sees_no_value_clobbered_before_its_last_read() {
    let p = support::encoder_params(32, 64);
    let x = t(&[2, 6, 32], 7);
    let mask = Tensor::from_vec(
        vec![
            0.0f32, 0.0, 0.0, 0.0, -1e4, -1e4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        ],
        &[2, 1, 1, 6],
    )
    .unwrap();
    let (fused, plain, info) = both(|| support::encoder(&x, &p, 4, Some(&mask)));
    for (a, b) in fused.iter().zip(&plain) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
    assert!(info.arena_bytes > 0 && info.arena_bytes >= info.arena_lower_bound);
    observer::start();
    let y = support::encoder(&x, &p, 4, Some(&mask));
    y.to_vec::<f32>().unwrap();
    let records = observer::take();
    assert!(!records.is_empty());
    // Replay: the last write to any byte a kernel reads must be that value's own.
    let mut writes: Vec<(usize, observer::Region)> = Vec::new();
    for (step, r) in records.iter().enumerate() {
        for read in &r.reads {
            let last = writes.iter().rev().find(|(_, w)| w.overlaps(read));
            let (_, w) = last.unwrap_or_else(|| {
                panic!("kernel {} reads r{} before any write", r.kernel, read.value)
            });
            assert_eq!(
                w.value, read.value,
                "kernel {} reads r{} but r{} wrote over it",
                r.kernel, read.value, w.value
            );
        }
        for w in &r.writes {
            writes.push((step, *w));
        }
        assert!(r.arena_live_bytes <= r.arena_bytes);
        assert!(r.bytes_touched > 0);
    }
    let peak = records.iter().map(|r| r.arena_live_bytes).max().unwrap();
    assert_eq!(
        peak, info.arena_lower_bound,
        "the observed peak is the planner's bound"
    );
}

#[test]
fn a_matmul_epilogue_is_one_kernel_and_the_product_gets_no_memory() {
    // 1500 rows of 256 (1.5 MiB): two panels per matrix, two matrices.
    let x = t(&[2, 1500, 256], 30);
    let w = support::tensor(&[256, 256], 31, 0.1);
    let b = t(&[256], 32);
    let f = || {
        x.matmul(&w)
            .unwrap()
            .add(&b)
            .unwrap()
            .gelu()
            .unwrap()
            .add(&x)
            .unwrap()
    };
    let (fused, plain, info) = both(f);
    assert_close(&fused, &plain);
    assert_eq!(info.kernels, 1, "{info:?}");
    assert_eq!(info.arena_bytes, 0, "the product is never stored");
}

#[test]
fn norm_and_softmax_prologues_are_one_kernel() {
    let x = t(&[4, 50, 96], 33);
    let r = t(&[4, 50, 96], 34);
    let b = t(&[96], 35);
    let w = t(&[96], 36);
    let ln = || {
        x.add(&b)
            .unwrap()
            .add(&r)
            .unwrap()
            .layer_norm(&w, &b, 1e-5)
            .unwrap()
    };
    let (fused, plain, info) = both(ln);
    assert_close(&fused, &plain);
    assert_eq!((info.kernels, info.arena_bytes), (1, 0), "{info:?}");
    let rms = || x.mul(&r).unwrap().rms_norm(&w, 1e-6).unwrap();
    let (fused, plain, info) = both(rms);
    assert_close(&fused, &plain);
    assert_eq!((info.kernels, info.arena_bytes), (1, 0), "{info:?}");
    // Scores: scale, mask, softmax; a 1-D row too.
    let mask = support::tensor(&[4, 1, 96], 37, 1e4);
    let sm = || {
        x.affine(0.125, 0.0)
            .unwrap()
            .add(&mask)
            .unwrap()
            .softmax(-1)
            .unwrap()
    };
    let (fused, plain, info) = both(sm);
    assert_close(&fused, &plain);
    assert_eq!((info.kernels, info.arena_bytes), (1, 0), "{info:?}");
    let row = || b.exp().unwrap().softmax(0).unwrap();
    let (fused, plain, info) = both(row);
    assert_close(&fused, &plain);
    assert_eq!(info.kernels, 1, "{info:?}");
    // The group's result is the norm's input and its weight: it must be stored.
    let own_weight = || {
        let u = b.add(&w).unwrap();
        u.layer_norm(&u, &b, 1e-5).unwrap()
    };
    let (fused, plain, info) = both(own_weight);
    assert_close(&fused, &plain);
    assert_eq!(info.kernels, 2, "{info:?}");
}

#[test]
fn attention_scores_are_one_kernel_from_matmul_to_softmax() {
    let q = t(&[2, 3, 40, 16], 40);
    let k = t(&[2, 3, 40, 16], 41);
    let mask = t(&[2, 1, 1, 40], 42);
    let scores = || {
        q.matmul(&k.transpose(2, 3).unwrap())
            .unwrap()
            .affine(0.25, 0.0)
            .unwrap()
            .add(&mask)
            .unwrap()
            .softmax(-1)
            .unwrap()
    };
    let (fused, plain, info) = both(scores);
    assert_close(&fused, &plain);
    assert_eq!((info.kernels, info.arena_bytes), (1, 0), "{info:?}");
    // A matmul straight into a norm is a chain too.
    let w = t(&[16], 43);
    let direct = || {
        q.matmul(&k.transpose(2, 3).unwrap().narrow(3, 0, 16).unwrap())
            .unwrap()
            .rms_norm(&w, 1e-6)
            .unwrap()
    };
    let (fused, plain, info) = both(direct);
    assert_close(&fused, &plain);
    assert_eq!((info.kernels, info.arena_bytes), (1, 0), "{info:?}");
}

#[test]
fn a_product_read_elsewhere_takes_no_epilogue() {
    let x = t(&[64, 48], 50);
    let w = t(&[48, 48], 51);
    let b = t(&[48], 52);
    // The product is read by the element-wise group and by a reduction.
    let f = || {
        let y = x.matmul(&w).unwrap();
        let s = y.sum_keepdim(1).unwrap();
        y.add(&b).unwrap().gelu().unwrap().add(&s).unwrap()
    };
    let (fused, plain, info) = both(f);
    assert_close(&fused, &plain);
    assert_eq!(info.kernels, 3, "matmul, sum, fused: {info:?}");
    assert!(info.arena_bytes > 0, "the product is stored");
    // The group's result is read by a softmax and by a later add: no prologue.
    let g = || {
        let z = x.add(&b).unwrap().tanh().unwrap();
        z.softmax(-1).unwrap().add(&z).unwrap()
    };
    let (fused, plain, info) = both(g);
    assert_close(&fused, &plain);
    assert_eq!(info.kernels, 3, "fused, softmax, fused: {info:?}");
}

#[test]
fn escaping_intermediates_of_chains_are_materialised() {
    let x = t(&[3, 70, 32], 60);
    let w = t(&[32, 32], 61);
    let b = t(&[32], 62);
    let run = || {
        // The product escapes: plain matmul, then the fused group.
        let y = x.matmul(&w).unwrap();
        let z = y.add(&b).unwrap().relu().unwrap();
        // The biased product escapes from inside an epilogue.
        let t1 = x.matmul(&w).unwrap().add(&b).unwrap();
        let t2 = t1.gelu().unwrap().add(&x).unwrap();
        // The norm's input escapes: no prologue.
        let u = t2.affine(2.0, 1.0).unwrap();
        let n = u.layer_norm(&b, &b, 1e-5).unwrap();
        // The epilogue's result escapes and also feeds a norm tail.
        let v = x.matmul(&w).unwrap().add(&x).unwrap();
        let sm = v.add(&b).unwrap().softmax(-1).unwrap();
        [y, z, t1, t2, u, n, v, sm]
            .iter()
            .flat_map(|t| t.to_vec::<f32>().unwrap())
            .collect::<Vec<f32>>()
    };
    streamfuse::set_fusion(true);
    let fused = run();
    streamfuse::set_fusion(false);
    let plain = run();
    streamfuse::set_fusion(true);
    assert_close(&fused, &plain);
}

#[test]
fn a_failing_input_fails_the_chains_that_read_it() {
    let x = t(&[4, 8], 70);
    let w = t(&[8, 8], 71);
    let b = t(&[8], 72);
    // Indices made lazily, out of range: index_select fails when it runs.
    let idx = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[4])
        .unwrap()
        .affine(1.0, 100.0)
        .unwrap()
        .to_dtype(streamfuse::DType::U32)
        .unwrap();
    let Ok(bad) = x.index_select(&idx, 0) else {
        return; // found at record time: nothing lazy to test
    };
    let epilogue = bad.matmul(&w).unwrap().add(&b).unwrap().gelu().unwrap();
    let prologue = bad.add(&b).unwrap().layer_norm(&b, &b, 1e-5).unwrap();
    let weights = x
        .transpose(0, 1)
        .unwrap()
        .matmul(&bad)
        .unwrap()
        .add(&w)
        .unwrap();
    let good = x.matmul(&w).unwrap().add(&b).unwrap().softmax(-1).unwrap();
    for failed in [&epilogue, &prologue, &weights] {
        let e = failed.to_vec::<f32>().unwrap_err();
        assert!(e.to_string().contains("index_select"), "{e}");
    }
    assert_eq!(good.to_vec::<f32>().unwrap().len(), 32);
    let e = streamfuse::sync().unwrap_err();
    assert!(e.to_string().contains("index_select"), "{e}");
    streamfuse::sync().unwrap();
}

#[derive(Clone, Debug)]
enum Step {
    Unary(usize),
    AddRow,
    MulSelf,
    MatMul,
    SumBroadcast,
    Softmax,
    TransposeTwice,
    Norm,
    Rms,
    /// Adds the value from before the previous step: a value read by two consumers
    /// (e.g. a matmul read by an epilogue and by a softmax).
    Residual,
    /// Matmul, bias, GELU, residual, layer norm: an epilogue and a prologue in one.
    Block,
    /// Matmul, scale, mask, softmax.
    Scores,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0usize..6).prop_map(Step::Unary),
        Just(Step::AddRow),
        Just(Step::MulSelf),
        Just(Step::MatMul),
        Just(Step::SumBroadcast),
        Just(Step::Softmax),
        Just(Step::TransposeTwice),
        Just(Step::Norm),
        Just(Step::Rms),
        Just(Step::Residual),
        Just(Step::Block),
        Just(Step::Scores),
    ]
}

fn apply(
    x: &Tensor,
    prev: &Tensor,
    s: &Step,
    row: &Tensor,
    sq: &Tensor,
    keep: bool,
    kept: &mut Vec<Tensor>,
) -> Tensor {
    let y = match s {
        Step::Unary(k) => match k {
            0 => x.tanh(),
            1 => x.affine(0.5, -0.1),
            2 => x.sigmoid(),
            3 => x.gelu(),
            4 => x.abs().and_then(|a| a.sqrt()),
            _ => x.neg(),
        }
        .unwrap(),
        Step::AddRow => x.add(row).unwrap(),
        Step::MulSelf => x.mul(x).unwrap(),
        Step::MatMul => x.matmul(sq).unwrap(),
        Step::SumBroadcast => x.sub(&x.mean_keepdim(1).unwrap()).unwrap(),
        Step::Softmax => x.softmax(-1).unwrap(),
        Step::TransposeTwice => x
            .transpose(0, 1)
            .unwrap()
            .exp()
            .unwrap()
            .transpose(0, 1)
            .unwrap(),
        Step::Norm => x.layer_norm(&row.exp().unwrap(), row, 1e-5).unwrap(),
        Step::Rms => x.rms_norm(row, 1e-5).unwrap(),
        Step::Residual => x.add(prev).unwrap(),
        Step::Block => x
            .matmul(sq)
            .and_then(|y| y.add(row))
            .and_then(|y| y.gelu())
            .and_then(|y| y.add(x))
            .and_then(|y| y.layer_norm(&row.exp().unwrap(), row, 1e-5))
            .unwrap(),
        Step::Scores => x
            .matmul(sq)
            .and_then(|y| y.affine(0.3, 0.0))
            .and_then(|y| y.add(row))
            .and_then(|y| y.softmax(-1))
            .unwrap(),
    };
    // Some intermediates stay alive (escape the segment), the rest die inside it.
    if keep && kept.len() < 3 {
        kept.push(y.clone());
    }
    y
}

/// What becomes of one step's result in a random program.
#[derive(Clone, Debug)]
enum Fate {
    /// It is the next value; it is also kept to the end (it escapes) when `true`.
    Next(bool),
    /// A side branch from the current value, dropped unread: dead work.
    Dropped,
    /// A side branch whose handle is dropped while a transposed view of it is kept: it
    /// is live through the view.
    ViewKept,
    /// The value before the previous step is read first (a flush of a prefix of the
    /// queue, whose later Drops are not in it); then the result is the next value.
    ReadPrevThenNext,
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        6 => proptest::bool::weighted(0.2).prop_map(Fate::Next),
        3 => Just(Fate::Dropped),
        1 => Just(Fate::ViewKept),
        1 => Just(Fate::ReadPrevThenNext),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random programs with random drops give the unfused values, and the dead side
    /// branches cost nothing: the last segment has the kernels and arena of the same
    /// program without them.
    #[test]
    fn random_programs_agree_fused_and_unfused(steps in proptest::collection::vec((step(), fate()), 1..14), rows in 1usize..9, seed in 0u64..1000) {
        let n = 12;
        let x = t(&[rows, n], seed);
        let row = t(&[n], seed + 1);
        let sq = t(&[n, n], seed + 2);
        // Returns every value read and what the last segment (a sync) ran.
        let run = |with_dead: bool| {
            streamfuse::sync().unwrap();
            let mut keep = Vec::new();
            let mut all = Vec::new();
            let mut prev = x.clone();
            let mut h = x.clone();
            for (s, fate) in &steps {
                let next = match fate {
                    Fate::Dropped if !with_dead => continue,
                    Fate::Dropped => {
                        drop(apply(&h, &prev, s, &row, &sq, false, &mut keep));
                        continue;
                    }
                    Fate::ViewKept => {
                        let side = apply(&h, &prev, s, &row, &sq, false, &mut keep);
                        keep.push(side.transpose(0, 1).unwrap());
                        continue;
                    }
                    Fate::Next(k) => apply(&h, &prev, s, &row, &sq, *k, &mut keep),
                    Fate::ReadPrevThenNext => {
                        all.extend(prev.to_vec::<f32>().unwrap());
                        apply(&h, &prev, s, &row, &sq, false, &mut keep)
                    }
                };
                prev = std::mem::replace(&mut h, next);
            }
            drop(prev);
            streamfuse::sync().unwrap();
            let info = streamfuse::last_flush().unwrap();
            all.extend(h.to_vec::<f32>().unwrap());
            for k in keep {
                all.extend(k.to_vec::<f32>().unwrap());
            }
            (all, info)
        };
        streamfuse::set_fusion(true);
        let (fused, info) = run(true);
        let (_, live_only) = run(false);
        streamfuse::set_fusion(false);
        let (plain, _) = run(true);
        streamfuse::set_fusion(true);
        prop_assert_eq!(fused.len(), plain.len());
        for (a, b) in fused.iter().zip(&plain) {
            prop_assert!(a == b || (a - b).abs() <= 1e-4 * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()), "{} vs {}", a, b);
        }
        prop_assert_eq!(
            (info.kernels, info.arena_bytes),
            (live_only.kernels, live_only.arena_bytes),
            "dead branches ran: {:?} vs {:?}", info, live_only
        );
    }
}

/// A pending result dropped unread, with everything it was made from, runs no kernel
/// and takes no memory (issue 10: a dropped `zeros(..).affine(..)` used to run two
/// kernels and hold both tensors at once).
#[test]
fn work_whose_results_are_all_dropped_unread_is_not_run() {
    let n = 1 << 24; // 64 MiB of f32
    streamfuse::sync().unwrap();
    streamfuse::reset_peak_bytes();
    {
        let z = Tensor::zeros(&[n], streamfuse::DType::F32).unwrap();
        let _y = z.affine(2.0, 1.0).unwrap();
    }
    streamfuse::sync().unwrap();
    let info = streamfuse::last_flush().unwrap();
    assert_eq!(
        (info.ops, info.kernels, info.arena_bytes),
        (4, 0, 0),
        "{info:?}"
    );
    // Other tests of this binary run at once and take a few MiB: far below one buffer.
    let peak = streamfuse::stats().peak_bytes;
    assert!(peak < n * 4 / 2, "peak {peak} B: a dead tensor was made");
    // A dead fused chain and a dead matmul chain too.
    let x = t(&[64, 64], 80);
    drop(
        x.exp()
            .unwrap()
            .tanh()
            .unwrap()
            .matmul(&x)
            .unwrap()
            .softmax(-1)
            .unwrap(),
    );
    streamfuse::sync().unwrap();
    assert_eq!(streamfuse::last_flush().unwrap().kernels, 0);
}

/// A reader whose result is dropped unread neither runs nor splits the fused chain it
/// reads from, nor keeps its input in memory.
#[test]
fn a_dead_reader_does_not_split_a_fused_chain() {
    let x = t(&[32, 48], 81);
    let f = || {
        let y = x.exp().unwrap();
        drop(y.sum_keepdim(1).unwrap()); // dead: would close y's group and store y
        drop(y.matmul(&x.transpose(0, 1).unwrap()).unwrap()); // dead
        y.tanh().unwrap().add(&x).unwrap()
    };
    let (fused, plain, info) = both(f);
    assert_eq!(fused, plain);
    assert_eq!((info.kernels, info.arena_bytes), (1, 0), "{info:?}");
}

/// A value whose handle is dropped inside the segment but whose view is kept is live:
/// the view reads its buffer.
#[test]
fn a_dropped_value_with_a_kept_view_is_made() {
    let x = t(&[16, 24], 82);
    let f = || {
        let y = x.exp().unwrap().affine(2.0, 0.0).unwrap();
        let v = y.transpose(0, 1).unwrap().narrow(0, 2, 5).unwrap();
        drop(y);
        v
    };
    let (fused, plain, info) = both(f);
    assert_eq!(fused, plain);
    assert_eq!(info.kernels, 1, "{info:?}");
}

/// A matmul→softmax chain whose panel count was rounded up for the kernel threads past
/// the matrix's rows (25 rows of a 30522-wide product with 8 kernel threads: panels of
/// 4 rows, the eighth would start at row 28) gives the unfused result.
#[test]
fn chain_panels_never_start_past_the_last_row() {
    streamfuse::set_kernel_threads(8);
    let x = t(&[25, 16], 1);
    let w = t(&[16, 30522], 2);
    // The product dies inside the segment (its handle is a temporary of this statement).
    let y = x.matmul(&w).unwrap().softmax(-1).unwrap();
    let got = y.to_vec::<f32>().unwrap();
    let info = streamfuse::last_flush().unwrap();
    assert_eq!(info.kernels, 1, "one chain: {info:?}");
    streamfuse::set_fusion(false);
    let y = x.matmul(&w).unwrap().softmax(-1).unwrap();
    let want = y.to_vec::<f32>().unwrap();
    streamfuse::set_fusion(true);
    streamfuse::set_kernel_threads(0);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= 1e-6, "{i}: {a} vs {b}");
    }
}
