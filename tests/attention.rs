//! `Tensor::attention` (the fused attention kernel) against the unfused composition
//! `q·kᵀ → scale → + bias → softmax → ·v`, over head sizes, lengths, masks, views of a
//! fused QKV projection and kernel-thread counts; and its argument errors.

mod support;
use streamfuse::{Error, Tensor};
use support::{data, tensor};

/// The unfused reference, as `[b, lq, heads, dh]` values.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, bias: Option<&Tensor>, scale: f32) -> Vec<f32> {
    let mut s = q
        .matmul(&k.transpose(-1, -2).unwrap())
        .unwrap()
        .affine(scale as f64, 0.0)
        .unwrap();
    if let Some(b) = bias {
        s = s.add(b).unwrap();
    }
    s.softmax(-1)
        .unwrap()
        .matmul(v)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

/// Worst `|got - want|` over the largest `|want|` (a context value is a weighted mean of
/// v's values, so the error scale is theirs); fails on a NaN or a length mismatch.
fn worst_rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f32, |m, w| m.max(w.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            assert!(g.is_finite() && w.is_finite(), "{g} vs {w}");
            (g - w).abs() / scale
        })
        .fold(0.0, f32::max)
}

/// The contract stated on `Tensor::attention`.
const BOUND: f32 = 1e-6;

fn check(b: usize, heads: usize, lq: usize, lk: usize, dh: usize, masked: bool, seed: u64) {
    let q = tensor(&[b, heads, lq, dh], seed, 2.0);
    let k = tensor(&[b, heads, lk, dh], seed + 1, 2.0);
    let v = tensor(&[b, heads, lk, dh], seed + 2, 1.0);
    // A padding mask: sequence i keeps its first lk - i keys (at least one).
    let bias = masked.then(|| {
        let m: Vec<f32> = (0..b * lk)
            .map(|x| {
                if x % lk < (lk - (x / lk) % lk).max(1) {
                    0.0
                } else {
                    -1e9
                }
            })
            .collect();
        Tensor::from_vec(m, &[b, 1, 1, lk]).unwrap()
    });
    let scale = 1.0 / (dh as f32).sqrt();
    let got = q
        .attention(&k, &v, bias.as_ref(), scale)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want = reference(&q, &k, &v, bias.as_ref(), scale);
    let w = worst_rel(&got, &want);
    assert!(
        w <= BOUND,
        "b {b} heads {heads} lq {lq} lk {lk} dh {dh} masked {masked}: worst relative {w:e}"
    );
}

#[test]
fn matches_the_unfused_path_over_shapes() {
    let mut seed = 10;
    for &(b, heads, lq, lk, dh) in &[
        (1, 1, 1, 1, 1),
        (1, 2, 3, 5, 7),
        (2, 3, 17, 17, 32),
        (2, 12, 20, 20, 32),
        (1, 4, 33, 65, 64),
        (3, 2, 16, 31, 100),
        (1, 1, 40, 129, 128),
        (1, 2, 5, 9, 256),
    ] {
        for masked in [false, true] {
            check(b, heads, lq, lk, dh, masked, seed);
            seed += 3;
        }
    }
}

#[test]
fn splits_over_kernel_threads_with_the_same_results() {
    // Enough work for the kernel to split, over 1 and 2 kernel threads.
    let (b, heads, l, dh) = (3, 4, 50, 32);
    let q = tensor(&[b, heads, l, dh], 1, 1.0);
    let k = tensor(&[b, heads, l, dh], 2, 1.0);
    let v = tensor(&[b, heads, l, dh], 3, 1.0);
    let run = |threads: usize| {
        std::thread::scope(|s| {
            s.spawn(|| {
                streamfuse::set_kernel_threads(threads);
                q.attention(&k, &v, None, 0.2)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()
            })
            .join()
            .unwrap()
        })
    };
    let one = run(1);
    assert_eq!(
        one,
        run(2),
        "each output row is computed by one task the same way"
    );
    assert!(worst_rel(&one, &reference(&q, &k, &v, None, 0.2)) <= BOUND);
}

#[test]
fn reads_views_of_a_fused_qkv_projection() {
    // [b, l, 3, heads, dh] permuted to [3, b, heads, l, dh], as a BERT layer does.
    let (b, l, heads, dh) = (2, 19, 3, 16);
    let qkv = Tensor::from_vec(data(b * l * 3 * heads * dh, 7), &[b, l, 3, heads, dh])
        .unwrap()
        .permute(&[2, 0, 3, 1, 4])
        .unwrap();
    let part = |i: usize| qkv.narrow(0, i, 1).unwrap().squeeze(0).unwrap();
    let (q, k, v) = (part(0), part(1), part(2));
    let bias = Tensor::from_vec(data(b * l, 8), &[b, 1, 1, l]).unwrap();
    let got = q.attention(&k, &v, Some(&bias), 0.25).unwrap();
    assert_eq!(got.dims(), &[b, l, heads, dh]);
    let got = got
        .reshape(&[b * l, heads * dh])
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want = reference(&q, &k, &v, Some(&bias), 0.25);
    assert!(worst_rel(&got, &want) <= BOUND);
    // A per-query bias (a causal mask) and a head dim that is not contiguous.
    let causal: Vec<f32> = (0..l * l)
        .map(|x| if x % l <= x / l { 0.0 } else { -1e9 })
        .collect();
    let causal = Tensor::from_vec(causal, &[1, 1, l, l]).unwrap();
    let qt = q
        .transpose(2, 3)
        .unwrap()
        .contiguous()
        .unwrap()
        .transpose(2, 3)
        .unwrap();
    let got = qt
        .attention(&k, &v, Some(&causal), 0.5)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want = reference(&q, &k, &v, Some(&causal), 0.5);
    assert!(worst_rel(&got, &want) <= BOUND);
}

#[test]
fn bad_arguments_are_named_errors_and_the_stream_goes_on() {
    let q = tensor(&[1, 2, 4, 8], 1, 1.0);
    let k = tensor(&[1, 2, 5, 8], 2, 1.0);
    let is = |r: streamfuse::Result<Tensor>, what: &str| match r {
        Err(e @ (Error::Shape { .. } | Error::Arg { .. } | Error::DType { .. })) => {
            let m = e.to_string();
            assert!(m.contains("attention") && m.contains(what), "{m}");
        }
        other => panic!("expected an error naming {what}, got {other:?}"),
    };
    is(q.attention(&k, &q, None, 1.0), "must agree");
    is(
        q.attention(&tensor(&[1, 2, 5, 9], 3, 1.0), &k, None, 1.0),
        "must agree",
    );
    is(
        q.reshape(&[2, 4, 8])
            .and_then(|q3| q3.attention(&k, &k, None, 1.0)),
        "rank 4",
    );
    is(
        q.attention(&k, &k, Some(&tensor(&[1, 2, 3, 5], 4, 1.0)), 1.0),
        "bias",
    );
    is(q.attention(&k, &k, None, f32::NAN), "scale");
    is(
        q.to_dtype(streamfuse::DType::I64)
            .and_then(|qi| qi.attention(&k, &k, None, 1.0)),
        "f32",
    );
    let big = tensor(&[1, 1, 2, 300], 5, 1.0);
    is(big.attention(&big, &big, None, 1.0), "head_dim");
    // The stream is fine afterwards.
    let ok = q
        .attention(&k, &k, None, 1.0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(ok.len(), 2 * 4 * 8);
}

#[test]
fn empty_and_degenerate_shapes_do_not_panic() {
    // No queries: an empty result.
    let q = tensor(&[2, 3, 0, 8], 1, 1.0);
    let k = tensor(&[2, 3, 4, 8], 2, 1.0);
    let out = q.attention(&k, &k, None, 1.0).unwrap();
    assert_eq!(out.dims(), &[2, 0, 3, 8]);
    assert!(out.to_vec::<f32>().unwrap().is_empty());
    // No keys: the softmax of nothing is NaN, as on the unfused path.
    let q = tensor(&[1, 2, 3, 8], 1, 1.0);
    let k0 = tensor(&[1, 2, 0, 8], 2, 1.0);
    let out = q
        .attention(&k0, &k0, None, 1.0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(out.len(), 2 * 3 * 8);
    assert!(out.iter().all(|x| x.is_nan()));
    // A head size of 0: an empty context per head.
    let q = tensor(&[1, 2, 3, 0], 1, 1.0);
    let k = tensor(&[1, 2, 4, 0], 2, 1.0);
    assert!(q
        .attention(&k, &k, None, 1.0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .is_empty());
    // Every key masked: the same values as the unfused path (a uniform average).
    let q = tensor(&[1, 1, 5, 4], 3, 1.0);
    let k = tensor(&[1, 1, 6, 4], 4, 1.0);
    let v = tensor(&[1, 1, 6, 4], 5, 1.0);
    let all = Tensor::full(-1e9, &[1, 1, 1, 6]).unwrap();
    let got = q
        .attention(&k, &v, Some(&all), 1.0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want = reference(&q, &k, &v, Some(&all), 1.0);
    assert!(worst_rel(&got, &want) <= BOUND);
}

/// A packed batch of sequences of `lens` tokens: its total, its offsets and q, k and
/// v `[heads, total, dh]`.
fn packed_case(lens: &[usize], heads: usize, dh: usize) -> (usize, Vec<u32>, [Tensor; 3]) {
    let total: usize = lens.iter().sum();
    let mut offsets = vec![0u32];
    for l in lens {
        offsets.push(offsets.last().unwrap() + *l as u32);
    }
    let qkv = [(1, 2.0), (2, 2.0), (3, 1.0)].map(|(seed, x)| tensor(&[heads, total, dh], seed, x));
    (total, offsets, qkv)
}

/// Each sequence of a packed batch, run alone through `Tensor::attention`, as the
/// packed result's rows `[total, heads, dh]`.
fn per_sequence(q: &Tensor, k: &Tensor, v: &Tensor, offsets: &[u32], scale: f32) -> Vec<f32> {
    per_sequence_biased(q, k, v, offsets, None, scale)
}

/// [`per_sequence`] with each sequence of `n` tokens taking the top-left `[heads, n,
/// n]` corner of `bias` (`[heads | 1, len, len]`) as its bias.
fn per_sequence_biased(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offsets: &[u32],
    bias: Option<&Tensor>,
    scale: f32,
) -> Vec<f32> {
    let mut out = Vec::new();
    for w in offsets.windows(2) {
        let (s, n) = (w[0] as usize, (w[1] - w[0]) as usize);
        if n == 0 {
            continue;
        }
        let part = |t: &Tensor| t.narrow(1, s, n).unwrap().unsqueeze(0).unwrap();
        let corner = bias.map(|b| {
            b.narrow(1, 0, n)
                .and_then(|b| b.narrow(2, 0, n))
                .and_then(|b| b.unsqueeze(0))
                .unwrap()
        });
        out.extend(
            part(q)
                .attention(&part(k), &part(v), corner.as_ref(), scale)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
        );
    }
    out
}

#[test]
fn ragged_with_a_bias_by_position_equals_each_sequence_alone() {
    // A bias per head and one for every head; sides equal to the longest sequence and
    // longer; lengths around the 16-row and 32-key blocks.
    for (lens, heads, bias_heads, side, threads) in [
        (vec![5usize, 17, 0, 1, 33, 16], 3, 3, 33, 1),
        (vec![40, 3, 70], 2, 1, 80, 2),
        (vec![2; 30], 4, 4, 8, 2),
    ] {
        let dh = 16;
        let (total, offsets, [q, k, v]) = packed_case(&lens, heads, dh);
        // Large enough to matter: several units against scores of a few.
        let bias = tensor(&[bias_heads, side, side], 4, 6.0);
        let offs = Tensor::from_vec(offsets.clone(), &[offsets.len()]).unwrap();
        let got = std::thread::scope(|s| {
            s.spawn(|| {
                streamfuse::set_kernel_threads(threads);
                let out = q
                    .attention_ragged_biased(&k, &v, &offs, &bias, 0.3)
                    .unwrap();
                assert_eq!(out.dims(), &[total, heads, dh]);
                out.to_vec::<f32>().unwrap()
            })
            .join()
            .unwrap()
        });
        let want = per_sequence_biased(&q, &k, &v, &offsets, Some(&bias), 0.3);
        assert!(
            worst_rel(&got, &want) <= BOUND,
            "lengths {lens:?} heads {heads} bias heads {bias_heads}"
        );
        // And the bias mattered.
        let plain = per_sequence(&q, &k, &v, &offsets, 0.3);
        assert!(worst_rel(&got, &plain) > 100.0 * BOUND);
    }
}

#[test]
fn ragged_bias_errors_name_the_bias() {
    let q = tensor(&[2, 6, 8], 1, 1.0);
    let offs = Tensor::from_vec(vec![0u32, 2, 6], &[3]).unwrap();
    for (bias, what) in [
        (tensor(&[3, 6, 6], 2, 1.0), "[heads, len, len]"),
        (tensor(&[2, 6, 5], 2, 1.0), "[heads, len, len]"),
        (tensor(&[2, 6], 2, 1.0), "rank 3"),
    ] {
        let e = q
            .attention_ragged_biased(&q, &q, &offs, &bias, 1.0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("attention_ragged_biased") && e.contains(what),
            "{e}"
        );
    }
    // Too short for the longest sequence: the offsets are data, so it is the
    // result's error.
    let e = q
        .attention_ragged_biased(&q, &q, &offs, &tensor(&[1, 3, 3], 2, 1.0), 1.0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("up to 3 tokens, but one has 4"), "{e}");
    // The stream goes on.
    let ok = q.attention_ragged_biased(&q, &q, &offs, &tensor(&[1, 4, 4], 2, 1.0), 1.0);
    assert_eq!(ok.unwrap().to_vec::<f32>().unwrap().len(), 2 * 6 * 8);
}

#[test]
fn ragged_batches_equal_each_sequence_alone() {
    // Lengths around the 16-row blocks, an empty sequence, one of a single token.
    for (lens, heads, dh, threads) in [
        (vec![5usize, 17, 0, 1, 33, 16], 3, 32, 1),
        (vec![40, 3, 70], 2, 64, 2),
        (vec![9], 1, 7, 2),
        (vec![2; 30], 4, 16, 2),
    ] {
        let (total, offsets, [q, k, v]) = packed_case(&lens, heads, dh);
        let offs = Tensor::from_vec(offsets.clone(), &[offsets.len()]).unwrap();
        let got = std::thread::scope(|s| {
            s.spawn(|| {
                streamfuse::set_kernel_threads(threads);
                let out = q.attention_ragged(&k, &v, &offs, 0.3).unwrap();
                assert_eq!(out.dims(), &[total, heads, dh]);
                out.to_vec::<f32>().unwrap()
            })
            .join()
            .unwrap()
        });
        let want = per_sequence(&q, &k, &v, &offsets, 0.3);
        assert!(
            worst_rel(&got, &want) <= BOUND,
            "lengths {lens:?} heads {heads} dh {dh}"
        );
    }
}

#[test]
fn ragged_reads_views_of_a_packed_qkv_projection() {
    // [total, 3 · hidden] viewed as [3, heads, total, dh], as the packed BERT does.
    let (heads, dh) = (3, 16);
    let offsets = [0u32, 7, 19, 20];
    let total = 20;
    let qkv = Tensor::from_vec(data(total * 3 * heads * dh, 9), &[total, 3, heads, dh])
        .unwrap()
        .permute(&[1, 2, 0, 3])
        .unwrap();
    let part = |i: usize| qkv.narrow(0, i, 1).unwrap().squeeze(0).unwrap();
    let (q, k, v) = (part(0), part(1), part(2));
    let offs = Tensor::from_vec(offsets.to_vec(), &[4]).unwrap();
    let got = q
        .attention_ragged(&k, &v, &offs, 0.25)
        .unwrap()
        .reshape(&[total, heads * dh])
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(worst_rel(&got, &per_sequence(&q, &k, &v, &offsets, 0.25)) <= BOUND);
}

#[test]
fn ragged_bad_arguments_and_offsets_are_named_errors() {
    let q = tensor(&[2, 6, 8], 1, 1.0);
    let offs = |v: Vec<u32>| Tensor::from_vec(v.clone(), &[v.len()]).unwrap();
    let is = |r: streamfuse::Result<Tensor>, what: &str| match r {
        Err(e @ (Error::Shape { .. } | Error::Arg { .. } | Error::DType { .. })) => {
            let m = e.to_string();
            assert!(m.contains("attention_ragged") && m.contains(what), "{m}");
        }
        other => panic!("expected an error naming {what}, got {other:?}"),
    };
    is(
        q.attention_ragged(&tensor(&[2, 5, 8], 2, 1.0), &q, &offs(vec![0, 6]), 1.0),
        "same shape",
    );
    is(
        q.unsqueeze(0)
            .and_then(|q4| q4.attention_ragged(&q4, &q4, &offs(vec![0, 6]), 1.0)),
        "rank 3",
    );
    is(
        q.attention_ragged(&q, &q, &Tensor::full(0.0, &[2]).unwrap(), 1.0),
        "u32",
    );
    is(
        q.attention_ragged(&q, &q, &offs(vec![0, 6]), f32::INFINITY),
        "scale",
    );
    // Offsets are data: checked when the op runs, an error on its result.
    for (bad, what) in [
        (vec![0, 4], "from 0 to the 6 tokens"),
        (vec![1, 6], "from 0"),
        (vec![0, 4, 2, 6], "decrease"),
    ] {
        let e = q
            .attention_ragged(&q, &q, &offs(bad), 1.0)
            .unwrap()
            .to_vec::<f32>()
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{e}");
    }
    // The stream goes on.
    let ok = q
        .attention_ragged(&q, &q, &offs(vec![0, 2, 6]), 1.0)
        .unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap().len(), 2 * 6 * 8);
    let _ = streamfuse::sync();
}

// Key windows and grouped-query heads: `attention_with` and `attention_ragged_with`
// against the unfused path given the kv heads repeated and a -1e9 bias on the keys the
// window hides.

use streamfuse::KeyWindow;

/// The windows every case runs: all, causal, bands of several widths (0, narrower and
/// wider than the 16-row and 32-key blocks, wider than any sequence), and one-sided
/// ones (a sliding window before a causal query, keys only ahead).
fn windows() -> Vec<KeyWindow> {
    let w = |before, after| KeyWindow { before, after };
    vec![
        KeyWindow::ALL,
        KeyWindow::CAUSAL,
        KeyWindow::around(0),
        KeyWindow::around(1),
        KeyWindow::around(5),
        KeyWindow::around(20),
        KeyWindow::around(64),
        KeyWindow::around(1000),
        w(Some(7), Some(0)),
        w(Some(3), None),
        w(None, Some(2)),
    ]
}

/// Whether query `i` sees key `j` under `w` (the definition on `KeyWindow`).
fn sees(w: KeyWindow, i: usize, j: usize) -> bool {
    w.before.is_none_or(|b| j + b >= i) && w.after.is_none_or(|a| j <= i + a)
}

/// `x`, `[outer, kv, inner]`, with each kv head repeated `group` times: `[outer, kv ·
/// group, inner]`, head `h` a copy of kv head `h / group` (`repeat_kv`).
fn repeat_heads(x: &[f32], outer: usize, kv: usize, group: usize, inner: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len() * group);
    for o in 0..outer {
        for h in 0..kv * group {
            let at = (o * kv + h / group) * inner;
            out.extend_from_slice(&x[at..at + inner]);
        }
    }
    out
}

/// `n` values of `data(seed)` times `scale`.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    data(n, seed).into_iter().map(|x| x * scale).collect()
}

/// One padded case: q `[b, heads, lq, dh]`, k and v `[b, kv, lk, dh]`, with a bias of
/// every element when `biased`, under `window`; within [`BOUND`] of the reference, and
/// rows that see no key exactly zeros.
#[allow(clippy::too_many_arguments)]
fn check_window(
    b: usize,
    heads: usize,
    kv: usize,
    lq: usize,
    lk: usize,
    dh: usize,
    window: KeyWindow,
    biased: bool,
) {
    let g = heads / kv;
    let (qv, kvv, vv) = (
        values(b * heads * lq * dh, 1, 2.0),
        values(b * kv * lk * dh, 2, 2.0),
        values(b * kv * lk * dh, 3, 1.0),
    );
    let user = biased.then(|| values(b * heads * lq * lk, 4, 4.0));
    let q = Tensor::from_vec(qv, &[b, heads, lq, dh]).unwrap();
    let k = Tensor::from_vec(kvv.clone(), &[b, kv, lk, dh]).unwrap();
    let v = Tensor::from_vec(vv.clone(), &[b, kv, lk, dh]).unwrap();
    let bias = user
        .as_ref()
        .map(|u| Tensor::from_vec(u.clone(), &[b, heads, lq, lk]).unwrap());
    let scale = 1.0 / (dh as f32).sqrt();
    let got = q
        .attention_with(&k, &v, bias.as_ref(), scale, window)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    // The reference: kv heads repeated, the window as a -1e9 bias.
    let full: Vec<f32> = (0..b * heads * lq * lk)
        .map(|x| {
            let (i, j) = ((x / lk) % lq, x % lk);
            let mask = if sees(window, i, j) { 0.0 } else { -1e9 };
            mask + user.as_ref().map_or(0.0, |u| u[x])
        })
        .collect();
    let rep = |x: &[f32]| {
        let r = repeat_heads(x, b, kv, g, lk * dh);
        Tensor::from_vec(r, &[b, heads, lk, dh]).unwrap()
    };
    let full = Tensor::from_vec(full, &[b, heads, lq, lk]).unwrap();
    let mut want = reference(&q, &rep(&kvv), &rep(&vv), Some(&full), scale);
    // Rows that see no key are zeros (the reference averages every key).
    let row = heads * dh;
    for (x, w) in want.iter_mut().enumerate() {
        let i = (x / row) % lq;
        if !(0..lk).any(|j| sees(window, i, j)) {
            *w = 0.0;
        }
    }
    let worst = worst_rel(&got, &want);
    let what = format!("b {b} heads {heads} kv {kv} lq {lq} lk {lk} dh {dh} {window} {biased}");
    assert!(worst <= BOUND, "{what}: worst relative {worst:e}");
    for (x, (g, w)) in got.iter().zip(&want).enumerate() {
        if *w == 0.0 && !(0..lk).any(|j| sees(window, (x / row) % lq, j)) {
            assert_eq!(*g, 0.0, "{what}: element {x} of a row that sees no key");
        }
    }
}

#[test]
fn windows_and_grouped_heads_equal_a_mask_bias_and_repeated_heads() {
    for &(b, heads, lq, lk, dh) in &[
        (2, 4, 37, 37, 32),
        (1, 4, 20, 50, 16),
        (1, 4, 50, 20, 16),
        (1, 4, 70, 70, 64),
        (1, 2, 1, 1, 8),
    ] {
        for kv in [heads, heads / 2, 1] {
            for window in windows() {
                for biased in [false, true] {
                    check_window(b, heads, kv, lq, lk, dh, window, biased);
                }
            }
        }
    }
}

/// Rows of a padded batch with more queries than keys that see no key at all (only
/// possible when `lq > lk`) are zeros, never NaN, on every path the tier runs.
#[test]
fn padded_rows_that_see_no_key_are_zeros() {
    let (lq, lk, dh) = (40, 6, 16);
    let q = tensor(&[1, 2, lq, dh], 1, 1.0);
    let k = tensor(&[1, 1, lk, dh], 2, 1.0);
    let window = KeyWindow::around(3);
    let out = q
        .attention_with(&k, &k, None, 0.5, window)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for (x, o) in out.iter().enumerate() {
        let i = x / (2 * dh);
        assert!(o.is_finite(), "element {x}: {o}");
        if i > lk - 1 + 3 {
            assert_eq!(*o, 0.0, "row {i} sees no key");
        }
    }
    // No keys at all: zeros with a window, NaN (the unfused softmax of nothing) without.
    let k0 = tensor(&[1, 2, 0, dh], 2, 1.0);
    let causal = q.attention_with(&k0, &k0, None, 0.5, KeyWindow::CAUSAL);
    assert!(causal
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|&x| x == 0.0));
}

/// One ragged case: sequences of `lens` tokens, q `[heads, total, dh]`, k and v
/// `[kv, total, dh]`, with a bias `[heads, len, len]` by position when `biased`;
/// every sequence within [`BOUND`] of the reference run alone.
fn check_ragged_window(lens: &[usize], heads: usize, kv: usize, window: KeyWindow, biased: bool) {
    let (dh, g) = (16, heads / kv);
    let total: usize = lens.iter().sum();
    let longest = lens.iter().copied().max().unwrap_or(0);
    let mut offsets = vec![0u32];
    for l in lens {
        offsets.push(offsets.last().unwrap() + *l as u32);
    }
    let (qv, kvv, vv) = (
        values(heads * total * dh, 5, 2.0),
        values(kv * total * dh, 6, 2.0),
        values(kv * total * dh, 7, 1.0),
    );
    let user = biased.then(|| values(heads * longest * longest, 8, 4.0));
    let t = |x: &[f32], h: usize| Tensor::from_vec(x.to_vec(), &[h, total, dh]).unwrap();
    let bias = user
        .as_ref()
        .map(|u| Tensor::from_vec(u.clone(), &[heads, longest, longest]).unwrap());
    let offs = Tensor::from_vec(offsets.clone(), &[offsets.len()]).unwrap();
    let scale = 0.25;
    let got = t(&qv, heads)
        .attention_ragged_with(
            &t(&kvv, kv),
            &t(&vv, kv),
            &offs,
            bias.as_ref(),
            scale,
            window,
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut want = Vec::new();
    for w in offsets.windows(2) {
        let (s, n) = (w[0] as usize, (w[1] - w[0]) as usize);
        if n == 0 {
            continue;
        }
        // The sequence's rows of every head, `[1, h, n, dh]`.
        let part = |x: &[f32], h: usize| {
            let mut rows = Vec::new();
            for hh in 0..h {
                rows.extend_from_slice(&x[(hh * total + s) * dh..(hh * total + s + n) * dh]);
            }
            rows
        };
        let rep = |x: &[f32]| {
            let r = repeat_heads(&part(x, kv), 1, kv, g, n * dh);
            Tensor::from_vec(r, &[1, heads, n, dh]).unwrap()
        };
        let q = Tensor::from_vec(part(&qv, heads), &[1, heads, n, dh]).unwrap();
        let full: Vec<f32> = (0..heads * n * n)
            .map(|x| {
                let (h, i, j) = (x / (n * n), (x / n) % n, x % n);
                let mask = if sees(window, i, j) { 0.0 } else { -1e9 };
                mask + user
                    .as_ref()
                    .map_or(0.0, |u| u[(h * longest + i) * longest + j])
            })
            .collect();
        let full = Tensor::from_vec(full, &[1, heads, n, n]).unwrap();
        want.extend(reference(&q, &rep(&kvv), &rep(&vv), Some(&full), scale));
    }
    let worst = worst_rel(&got, &want);
    assert!(
        worst <= BOUND,
        "lens {lens:?} heads {heads} kv {kv} {window} biased {biased}: worst relative {worst:e}"
    );
}

#[test]
fn ragged_windows_and_grouped_heads_equal_each_sequence_masked_alone() {
    // Lengths around the 16-row and 32-key blocks, an empty sequence, one token.
    let lens = [15, 16, 17, 31, 32, 0, 33, 1, 48, 65];
    for kv in [4, 2, 1] {
        for window in windows() {
            for biased in [false, true] {
                check_ragged_window(&lens, 4, kv, window, biased);
            }
        }
    }
}

#[test]
fn window_and_group_errors_name_the_shapes() {
    let q = tensor(&[1, 4, 5, 8], 1, 1.0);
    let k3 = tensor(&[1, 3, 5, 8], 2, 1.0);
    let k2 = tensor(&[1, 2, 5, 8], 3, 1.0);
    let msg = |r: streamfuse::Result<Tensor>| match r {
        Err(e @ Error::Shape { .. }) => e.to_string(),
        other => panic!("expected a shape error, got {other:?}"),
    };
    let m = msg(q.attention_with(&k3, &k3, None, 1.0, KeyWindow::CAUSAL));
    assert!(
        m.contains("attention_with") && m.contains("multiple") && m.contains("[1, 3, 5, 8]"),
        "{m}"
    );
    // k and v must have the same heads.
    let m = msg(q.attention_with(&k2, &k3, None, 1.0, KeyWindow::ALL));
    assert!(m.contains("must agree"), "{m}");
    // Ragged: 4 heads over 3.
    let (q3, k3r) = (tensor(&[4, 5, 8], 4, 1.0), tensor(&[3, 5, 8], 5, 1.0));
    let offs = Tensor::from_vec(vec![0u32, 5], &[2]).unwrap();
    let m = msg(q3.attention_ragged_with(&k3r, &k3r, &offs, None, 1.0, KeyWindow::around(2)));
    assert!(
        m.contains("attention_ragged_with") && m.contains("multiple"),
        "{m}"
    );
    // A bias with the kv heads' count, not the query heads', is refused.
    let k2r = tensor(&[2, 5, 8], 6, 1.0);
    let bias = tensor(&[2, 5, 5], 7, 1.0);
    let m = msg(q3.attention_ragged_with(&k2r, &k2r, &offs, Some(&bias), 1.0, KeyWindow::ALL));
    assert!(m.contains("bias"), "{m}");
    // The stream goes on.
    let ok = q3
        .attention_ragged_with(&k2r, &k2r, &offs, None, 1.0, KeyWindow::CAUSAL)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(ok.len(), 4 * 5 * 8);
}

#[test]
fn key_windows_say_what_they_are() {
    assert_eq!(KeyWindow::ALL.to_string(), "all");
    assert_eq!(KeyWindow::CAUSAL.to_string(), "causal");
    assert_eq!(KeyWindow::around(64).to_string(), "around(64)");
    let sliding = KeyWindow {
        before: Some(7),
        after: Some(0),
    };
    assert_eq!(sliding.to_string(), "before 7, after 0");
    assert_eq!(
        KeyWindow::around(3),
        KeyWindow {
            before: Some(3),
            after: Some(3)
        }
    );
    assert!(sees(KeyWindow::around(64), 100, 36) && !sees(KeyWindow::around(64), 100, 35));
    assert!(sees(KeyWindow::CAUSAL, 5, 5) && !sees(KeyWindow::CAUSAL, 5, 6));
}
