//! Fused, planned execution against the op-by-op path: same results, fewer kernels,
//! cached plans, and an arena whose use (observed kernel by kernel) never clobbers a
//! value before its last read.

use proptest::prelude::*;
use streamfuse::runtime::observer;
use streamfuse::{FlushInfo, Tensor};

mod support;

fn t(dims: &[usize], seed: u64) -> Tensor {
    support::tensor(dims, seed, 1.0)
}

/// Runs `f` with fusion on and off on this thread; returns both results and the
/// fused segment's flush info.
fn both(f: impl Fn() -> Tensor) -> (Vec<f32>, Vec<f32>, FlushInfo) {
    streamfuse::set_fusion(true);
    let fused = f().to_vec::<f32>().unwrap();
    let info = streamfuse::last_flush().unwrap();
    streamfuse::set_fusion(false);
    let plain = f().to_vec::<f32>().unwrap();
    streamfuse::set_fusion(true);
    (fused, plain, info)
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
    ]
}

fn apply(x: &Tensor, s: &Step, row: &Tensor, sq: &Tensor, keep: &mut Vec<Tensor>) -> Tensor {
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
    };
    // Some intermediates stay alive (escape the segment), the rest die inside it.
    if keep.len() < 3 && matches!(s, Step::MatMul | Step::Softmax) {
        keep.push(y.clone());
    }
    y
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_programs_agree_fused_and_unfused(steps in proptest::collection::vec(step(), 1..14), rows in 1usize..9, seed in 0u64..1000) {
        let n = 12;
        let x = t(&[rows, n], seed);
        let row = t(&[n], seed + 1);
        let sq = t(&[n, n], seed + 2);
        let run = || {
            let mut keep = Vec::new();
            let mut h = x.clone();
            for s in &steps {
                h = apply(&h, s, &row, &sq, &mut keep);
            }
            let mut all = h.to_vec::<f32>().unwrap();
            for k in keep {
                all.extend(k.to_vec::<f32>().unwrap());
            }
            all
        };
        streamfuse::set_fusion(true);
        let fused = run();
        streamfuse::set_fusion(false);
        let plain = run();
        streamfuse::set_fusion(true);
        prop_assert_eq!(fused.len(), plain.len());
        for (a, b) in fused.iter().zip(&plain) {
            prop_assert!(a == b || (a - b).abs() <= 1e-4 * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()), "{} vs {}", a, b);
        }
    }
}
