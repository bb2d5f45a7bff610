//! Every error path of the public API: each call must fail (never panic) with a message
//! naming the op, record nothing, and leave the stream usable, including work queued
//! before the failure.

mod common;

use common::*;
use streamfuse::{DType, Tensor};

/// A pending computation queued before an error: after the error it must still give
/// the right values (the failed op recorded nothing and broke nothing).
struct Pending {
    t: Tensor,
    expected: Ref,
}

fn pending() -> Pending {
    let (x, rx) = rand_pair(&[3, 4], 999, -1.0, 1.0);
    let t = x.exp().unwrap().affine(2.0, 1.0).unwrap().sum(1).unwrap();
    Pending {
        t,
        expected: rx.exp().affine(2.0, 1.0).sum(1, false),
    }
}

impl Pending {
    #[track_caller]
    fn verify(&self) {
        check_tol(&self.t, &self.expected, 1e-5, 1e-5);
        assert_stream_usable();
    }
}

/// After a kernel error was reported by `to_vec`, the next sync may report it again
/// (sync returns the first kernel error since the last sync); the one after is clean.
#[track_caller]
fn drain_reported_kernel_error(op: &str) {
    if let Err(e) = streamfuse::sync() {
        assert!(
            e.to_string().contains(op),
            "sync reported an unrelated error: {e}"
        );
    }
    streamfuse::sync().expect("second sync after a kernel error");
}

fn f32t(dims: &[usize]) -> Tensor {
    rand_pair(dims, 1, -1.0, 1.0).0
}

// ---------------------------------------------------------------------------------
// shapes and dtypes of binary ops
// ---------------------------------------------------------------------------------

#[test]
fn binary_broadcast_mismatch() {
    let p = pending();
    let a = f32t(&[2, 3]);
    let b = f32t(&[4]);
    for name in BINARY_OPS {
        let msg = assert_err_names(apply_binary(name, &a, &b), name);
        assert!(
            msg.contains("[2, 3]") && msg.contains("[4]"),
            "{name}: message should name both shapes: {msg}"
        );
    }
    // mismatch in a leading dim, and with a rank difference
    let c = f32t(&[2, 3, 4]);
    let d = f32t(&[3, 3, 4]);
    assert_err_names(c.add(&d), "add");
    let e = f32t(&[5, 1, 4]);
    let f = f32t(&[2, 3, 5]);
    assert_err_names(e.mul(&f), "mul");
    // a view whose dims do not broadcast
    assert_err_names(a.transpose(0, 1).unwrap().sub(&a), "sub");
    p.verify();
}

#[test]
fn binary_dtype_mismatch() {
    let p = pending();
    let a = f32t(&[2, 3]);
    let i = Tensor::from_vec(vec![1i64; 6], &[2, 3]).unwrap();
    let u = Tensor::from_vec(vec![1u32; 6], &[2, 3]).unwrap();
    for name in BINARY_OPS {
        assert_err_names(apply_binary(name, &a, &i), name);
        assert_err_names(apply_binary(name, &i, &a), name);
        assert_err_names(apply_binary(name, &u, &i), name);
        assert_err_names(apply_binary(name, &a, &u), name);
    }
    let msg = assert_err_names(a.add(&i), "add");
    assert!(
        msg.contains("f32") && msg.contains("i64"),
        "message should name both dtypes: {msg}"
    );
    p.verify();
}

#[test]
fn float_only_ops_reject_integer_dtypes() {
    let p = pending();
    let u = Tensor::from_vec(vec![1u32, 2, 3], &[3]).unwrap();
    let i = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap();
    for t in [&u, &i] {
        assert_err_names(t.exp(), "exp");
        assert_err_names(t.log(), "log");
        assert_err_names(t.sqrt(), "sqrt");
        assert_err_names(t.recip(), "recip");
        assert_err_names(t.neg(), "neg");
        assert_err_names(t.abs(), "abs");
        assert_err_names(t.tanh(), "tanh");
        assert_err_names(t.sigmoid(), "sigmoid");
        assert_err_names(t.relu(), "relu");
        assert_err_names(t.gelu(), "gelu");
        assert_err_names(t.gelu_tanh(), "gelu_tanh");
        assert_err_names(t.silu(), "silu");
        assert_err_names(t.powf(2.0), "powf");
        assert_err_names(t.mean(0), "mean");
        assert_err_names(t.mean_keepdim(0), "mean");
        assert_err_names(t.softmax(0), "softmax");
    }
    let msg = assert_err_names(u.exp(), "exp");
    assert!(msg.contains("u32"), "message should name the dtype: {msg}");
    p.verify();
}

#[test]
fn norms_reject_integer_dtypes() {
    let p = pending();
    let x = Tensor::from_vec(vec![1u32; 6], &[2, 3]).unwrap();
    let w = Tensor::from_vec(vec![1u32; 3], &[3]).unwrap();
    assert_err_names(x.layer_norm(&w, &w, 1e-5), "layer_norm");
    assert_err_names(x.rms_norm(&w, 1e-5), "rms_norm");
    // f32 input with integer weight
    let xf = f32t(&[2, 3]);
    let wf = f32t(&[3]);
    assert_err_names(xf.layer_norm(&w, &wf, 1e-5), "layer_norm");
    assert_err_names(xf.layer_norm(&wf, &w, 1e-5), "layer_norm");
    assert_err_names(xf.rms_norm(&w, 1e-5), "rms_norm");
    p.verify();
}

// ---------------------------------------------------------------------------------
// matmul
// ---------------------------------------------------------------------------------

#[test]
fn matmul_errors() {
    let p = pending();
    let a = f32t(&[2, 3]);
    // inner dims
    let msg = assert_err_names(a.matmul(&f32t(&[4, 5])), "matmul");
    assert!(msg.contains("[2, 3]") && msg.contains("[4, 5]"), "{msg}");
    assert_err_names(a.matmul(&a), "matmul");
    // rank < 2 on either side, and rank 0
    assert_err_names(a.matmul(&f32t(&[3])), "matmul");
    assert_err_names(f32t(&[3]).matmul(&f32t(&[3, 2])), "matmul");
    assert_err_names(f32t(&[3]).matmul(&f32t(&[3])), "matmul");
    assert_err_names(f32t(&[]).matmul(&a), "matmul");
    // batch dims that do not broadcast
    assert_err_names(f32t(&[2, 2, 3]).matmul(&f32t(&[3, 3, 4])), "matmul");
    // dtypes
    let i = Tensor::from_vec(vec![1i64; 6], &[2, 3]).unwrap();
    let i2 = Tensor::from_vec(vec![1i64; 6], &[3, 2]).unwrap();
    assert_err_names(i.matmul(&i2), "matmul");
    let u = Tensor::from_vec(vec![1u32; 6], &[3, 2]).unwrap();
    assert_err_names(a.matmul(&u), "matmul");
    assert_err_names(i.matmul(&f32t(&[3, 2])), "matmul");
    p.verify();
}

// ---------------------------------------------------------------------------------
// dims out of range
// ---------------------------------------------------------------------------------

#[test]
fn dim_out_of_range_for_every_dim_op() {
    let p = pending();
    let t = f32t(&[2, 3, 4]);
    let idx = Tensor::from_vec(vec![0u32], &[1]).unwrap();
    for bad in [3i64, 7, -4, -100] {
        let m = assert_err_names(t.sum(bad), "sum");
        assert!(
            m.contains(&bad.to_string()),
            "message should name the dim: {m}"
        );
        assert_err_names(t.sum_keepdim(bad), "sum");
        assert_err_names(t.mean(bad), "mean");
        assert_err_names(t.mean_keepdim(bad), "mean");
        assert_err_names(t.max(bad), "max");
        assert_err_names(t.max_keepdim(bad), "max");
        assert_err_names(t.argmax(bad), "argmax");
        assert_err_names(t.softmax(bad), "softmax");
        assert_err_names(t.transpose(bad, 0), "transpose");
        assert_err_names(t.transpose(0, bad), "transpose");
        assert_err_names(t.narrow(bad, 0, 1), "narrow");
        assert_err_names(t.squeeze(bad), "squeeze");
        assert_err_names(Tensor::cat(&[&t, &t], bad), "cat");
        assert_err_names(t.index_select(&idx, bad), "index_select");
    }
    // unsqueeze accepts 0..=rank and -(rank+1)..=-1
    for bad in [4i64, 9, -5, -50] {
        assert_err_names(t.unsqueeze(bad), "unsqueeze");
    }
    // usize dims too
    assert_err_names(t.sum(3usize), "sum");
    assert_err_names(t.argmax(usize::MAX), "argmax");
    // rank 0: no dim at all is valid except unsqueeze(0) / unsqueeze(-1)
    let s = f32t(&[]);
    assert_err_names(s.sum(0), "sum");
    assert_err_names(s.max(-1), "max");
    assert_err_names(s.softmax(0), "softmax");
    assert_err_names(s.transpose(0, 0), "transpose");
    assert_err_names(s.unsqueeze(1), "unsqueeze");
    p.verify();
}

// ---------------------------------------------------------------------------------
// views
// ---------------------------------------------------------------------------------

#[test]
fn narrow_out_of_range() {
    let p = pending();
    let t = f32t(&[2, 3, 4]);
    let m = assert_err_names(t.narrow(2, 3, 2), "narrow");
    assert!(
        m.contains("[2, 3, 4]"),
        "message should name the shape: {m}"
    );
    assert_err_names(t.narrow(1, 4, 0), "narrow");
    assert_err_names(t.narrow(0, 0, 3), "narrow");
    assert_err_names(t.narrow(-1, 1, 4), "narrow");
    assert_err_names(t.narrow(1, usize::MAX, 2), "narrow");
    assert_err_names(t.narrow(1, 1, usize::MAX), "narrow");
    // narrowing a narrowed view past the view's end
    let v = t.narrow(2, 1, 2).unwrap();
    assert_err_names(v.narrow(2, 1, 2), "narrow");
    p.verify();
}

#[test]
fn reshape_element_count_mismatch() {
    let p = pending();
    let t = f32t(&[2, 3, 4]);
    let m = assert_err_names(t.reshape(&[5, 5]), "reshape");
    assert!(m.contains("[2, 3, 4]") && m.contains("[5, 5]"), "{m}");
    assert_err_names(t.reshape(&[]), "reshape");
    assert_err_names(t.reshape(&[24, 0]), "reshape");
    assert_err_names(t.transpose(0, 2).unwrap().reshape(&[23]), "reshape");
    assert_err_names(t.reshape(&[usize::MAX, 2]), "reshape");
    p.verify();
}

#[test]
fn permute_not_a_permutation() {
    let p = pending();
    let t = f32t(&[2, 3, 4]);
    assert_err_names(t.permute(&[0, 1]), "permute");
    assert_err_names(t.permute(&[0, 1, 1]), "permute");
    assert_err_names(t.permute(&[0, 1, 3]), "permute");
    assert_err_names(t.permute(&[0, 1, 2, 3]), "permute");
    assert_err_names(t.permute(&[]), "permute");
    p.verify();
}

#[test]
fn squeeze_of_a_dim_not_of_size_one() {
    let p = pending();
    let t = f32t(&[2, 1, 4]);
    assert_err_names(t.squeeze(0), "squeeze");
    assert_err_names(t.squeeze(2), "squeeze");
    assert_err_names(t.squeeze(-1), "squeeze");
    // and the valid one still works after the errors
    check(
        &t.squeeze(1).unwrap(),
        &rand_ref(&[2, 1, 4], 1, -1.0, 1.0).squeeze(1),
        0.0,
    );
    p.verify();
}

#[test]
fn broadcast_as_incompatible() {
    let p = pending();
    let t = f32t(&[2, 3]);
    let m = assert_err_names(t.broadcast_as(&[2, 4]), "broadcast_as");
    assert!(m.contains("[2, 3]") && m.contains("[2, 4]"), "{m}");
    assert_err_names(t.broadcast_as(&[3]), "broadcast_as"); // fewer dims
    assert_err_names(t.broadcast_as(&[3, 2]), "broadcast_as");
    assert_err_names(t.broadcast_as(&[2, 3, 1]), "broadcast_as"); // right-aligned: 3 vs 1
    assert_err_names(t.broadcast_as(&[]), "broadcast_as");
    assert_err_names(f32t(&[2, 1]).broadcast_as(&[4, 3]), "broadcast_as");
    p.verify();
}

// ---------------------------------------------------------------------------------
// cat
// ---------------------------------------------------------------------------------

#[test]
fn cat_errors() {
    let p = pending();
    let a = f32t(&[2, 3]);
    let b = f32t(&[2, 4]);
    let c = f32t(&[3]);
    // shapes differ off the cat dim
    let m = assert_err_names(Tensor::cat(&[&a, &b], 0), "cat");
    assert!(m.contains("[2, 3]") && m.contains("[2, 4]"), "{m}");
    // ranks differ
    assert_err_names(Tensor::cat(&[&a, &c], 0), "cat");
    assert_err_names(Tensor::cat(&[&a, &a, &c], 1), "cat");
    // dtypes differ
    let i = Tensor::from_vec(vec![1i64; 6], &[2, 3]).unwrap();
    assert_err_names(Tensor::cat(&[&a, &i], 0), "cat");
    let u = Tensor::from_vec(vec![1u32; 6], &[2, 3]).unwrap();
    assert_err_names(Tensor::cat(&[&u, &i], 1), "cat");
    // empty list
    assert_err_names(Tensor::cat(&[], 0), "cat");
    // rank 0 pieces have no dim to join along
    let s = f32t(&[]);
    assert_err_names(Tensor::cat(&[&s, &s], 0), "cat");
    p.verify();
}

// ---------------------------------------------------------------------------------
// index_select
// ---------------------------------------------------------------------------------

#[test]
fn index_select_wrong_index_dtype_or_rank() {
    let p = pending();
    let t = f32t(&[4, 3]);
    let fi = Tensor::from_vec(vec![0.0f32, 1.0], &[2]).unwrap();
    let m = assert_err_names(t.index_select(&fi, 0), "index_select");
    assert!(
        m.contains("f32"),
        "message should name the index dtype: {m}"
    );
    let i2 = Tensor::from_vec(vec![0u32, 1, 2, 3], &[2, 2]).unwrap();
    assert_err_names(t.index_select(&i2, 0), "index_select");
    let i0 = Tensor::from_vec(vec![1u32], &[]).unwrap();
    assert_err_names(t.index_select(&i0, 0), "index_select");
    p.verify();
}

#[test]
fn index_select_known_index_out_of_range_fails_at_record_time() {
    let p = pending();
    let t = f32t(&[4, 3]);
    let iu = Tensor::from_vec(vec![0u32, 4], &[2]).unwrap();
    let m = assert_err_names(t.index_select(&iu, 0), "index_select");
    assert!(m.contains('4'), "message should name the bad index: {m}");
    let iu = Tensor::from_vec(vec![3u32], &[1]).unwrap();
    assert_err_names(t.index_select(&iu, 1), "index_select");
    assert_err_names(t.index_select(&iu, -1), "index_select");
    let ii = Tensor::from_vec(vec![1i64, 100], &[2]).unwrap();
    assert_err_names(t.index_select(&ii, 0), "index_select");
    let neg = Tensor::from_vec(vec![-1i64], &[1]).unwrap();
    assert_err_names(t.index_select(&neg, 0), "index_select");
    let huge = Tensor::from_vec(vec![i64::MAX, 0], &[2]).unwrap();
    assert_err_names(t.index_select(&huge, 0), "index_select");
    let umax = Tensor::from_vec(vec![u32::MAX], &[1]).unwrap();
    assert_err_names(t.index_select(&umax, 1), "index_select");
    p.verify();
}

/// An index tensor produced by a lazy op: [100, 101] as u32.
fn lazy_bad_indices() -> Tensor {
    Tensor::from_vec(vec![0.0f32, 1.0], &[2])
        .unwrap()
        .affine(1.0, 100.0)
        .unwrap()
        .to_dtype(DType::U32)
        .unwrap()
}

#[test]
fn index_select_lazy_index_out_of_range_fails_at_read() {
    let p = pending();
    let t = f32t(&[4, 3]);
    let idx = lazy_bad_indices();
    match t.index_select(&idx, 0) {
        // found at record time (allowed if the engine computed the indices already)
        Err(e) => assert!(e.to_string().contains("index_select"), "{e}"),
        Ok(out) => {
            // a consumer of the bad output fails too, and so does the output itself
            let after = out.affine(2.0, 0.0).unwrap();
            let m = assert_err_names(out.to_vec::<f32>(), "index_select");
            assert!(
                m.contains("100") || m.contains("101"),
                "message should name the bad index: {m}"
            );
            let e2 = expect_err(after.to_vec::<f32>(), "consumer of a failed index_select");
            let _ = e2.to_string();
            drain_reported_kernel_error("index_select");
        }
    }
    // the same bad indices, now computed: fail at record time
    assert_eq!(idx.to_vec::<u32>().unwrap(), vec![100, 101]);
    assert_err_names(t.index_select(&idx, 0), "index_select");
    p.verify();
}

#[test]
fn index_select_lazy_index_out_of_range_fails_at_sync() {
    let t = f32t(&[4, 3]);
    let idx = lazy_bad_indices();
    let out = t.index_select(&idx, 0);
    if let Ok(out) = out {
        // nothing reads it; the next sync reports the failure
        let e = expect_err(streamfuse::sync(), "sync after a failing kernel");
        assert!(e.to_string().contains("index_select"), "{e}");
        drop(out);
    }
    // the stream works again, and a second sync is clean
    assert_stream_usable();
    streamfuse::sync().unwrap();
}

#[test]
fn index_select_lazy_i64_index_negative() {
    // -1 produced by a lazy op, through i64
    let t = f32t(&[4, 3]);
    let idx = Tensor::from_vec(vec![1.0f32, 0.0], &[2])
        .unwrap()
        .affine(-1.0, 0.0)
        .unwrap()
        .to_dtype(DType::I64)
        .unwrap(); // [-1, 0]
    match t.index_select(&idx, 0) {
        Err(e) => assert!(e.to_string().contains("index_select"), "{e}"),
        Ok(out) => {
            assert_err_names(out.to_vec::<f32>(), "index_select");
            drain_reported_kernel_error("index_select");
        }
    }
    assert_stream_usable();
}

// ---------------------------------------------------------------------------------
// creation and read back
// ---------------------------------------------------------------------------------

#[test]
fn from_vec_wrong_length() {
    let p = pending();
    let m = assert_err_names(Tensor::from_vec(vec![1.0f32; 5], &[2, 3]), "from_vec");
    assert!(m.contains("[2, 3]"), "{m}");
    assert_err_names(Tensor::from_vec(vec![1u32; 7], &[2, 3]), "from_vec");
    assert_err_names(Tensor::from_vec(vec![1i64; 0], &[1]), "from_vec");
    assert_err_names(Tensor::from_vec(vec![1.0f32; 2], &[]), "from_vec");
    assert_err_names(
        Tensor::from_vec(vec![1.0f32; 2], &[usize::MAX, 2]),
        "from_vec",
    );
    p.verify();
}

#[test]
fn to_vec_with_the_wrong_type() {
    let p = pending();
    let f = f32t(&[2, 2]);
    let m = assert_err_names(f.to_vec::<u32>(), "to_vec");
    assert!(m.contains("f32") && m.contains("u32"), "{m}");
    assert_err_names(f.to_vec::<i64>(), "to_vec");
    let u = Tensor::from_vec(vec![1u32, 2], &[2]).unwrap();
    assert_err_names(u.to_vec::<f32>(), "to_vec");
    assert_err_names(u.to_vec::<i64>(), "to_vec");
    // argmax gives u32, not i64 or f32
    let am = f.argmax(0).unwrap();
    assert_err_names(am.to_vec::<f32>(), "to_vec");
    assert_eq!(am.to_vec::<u32>().unwrap().len(), 2);
    // a pending (lazy) tensor read with the wrong type
    let lazy = f.exp().unwrap();
    assert_err_names(lazy.to_vec::<i64>(), "to_vec");
    assert_eq!(lazy.to_vec::<f32>().unwrap().len(), 4);
    p.verify();
}

#[test]
fn creation_with_an_absurd_shape() {
    let p = pending();
    assert!(Tensor::zeros(&[usize::MAX, 2], DType::F32).is_err());
    assert!(Tensor::ones(&[1 << 40, 1 << 40], DType::I64).is_err());
    assert!(Tensor::full(1.0, &[usize::MAX]).is_err());
    p.verify();
}

// ---------------------------------------------------------------------------------
// norms
// ---------------------------------------------------------------------------------

#[test]
fn layer_norm_and_rms_norm_weight_of_wrong_size() {
    let p = pending();
    let x = f32t(&[2, 3, 8]);
    let w8 = f32t(&[8]);
    let w7 = f32t(&[7]);
    let w2d = f32t(&[1, 8]);
    let m = assert_err_names(x.layer_norm(&w7, &w8, 1e-5), "layer_norm");
    assert!(
        m.contains("[7]"),
        "message should name the weight shape: {m}"
    );
    assert_err_names(x.layer_norm(&w8, &w7, 1e-5), "layer_norm");
    assert_err_names(x.layer_norm(&w2d, &w8, 1e-5), "layer_norm");
    assert_err_names(x.layer_norm(&w8, &w2d, 1e-5), "layer_norm");
    assert_err_names(x.rms_norm(&w7, 1e-5), "rms_norm");
    assert_err_names(x.rms_norm(&w2d, 1e-5), "rms_norm");
    // the weight size is that of the last dim, not of any other dim
    let w3 = f32t(&[3]);
    assert_err_names(x.layer_norm(&w3, &w3, 1e-5), "layer_norm");
    // rank 0 input has no last dim
    let s = f32t(&[]);
    let w1 = f32t(&[1]);
    assert_err_names(s.layer_norm(&w1, &w1, 1e-5), "layer_norm");
    assert_err_names(s.rms_norm(&w1, 1e-5), "rms_norm");
    p.verify();
}

// ---------------------------------------------------------------------------------
// errors do not panic, do not record, and do not leak into later work
// ---------------------------------------------------------------------------------

#[test]
fn many_errors_interleaved_with_work() {
    let (x, rx) = rand_pair(&[4, 5], 5, -1.0, 1.0);
    let mut acc = x.clone();
    let mut racc = rx.clone();
    for i in 0..10 {
        // a failing op of each family, then real work
        assert!(acc.add(&f32t(&[3])).is_err());
        assert!(acc.sum(5).is_err());
        assert!(acc.reshape(&[7]).is_err());
        assert!(acc.matmul(&f32t(&[4, 4])).is_err());
        acc = acc.tanh().unwrap().add(&x).unwrap();
        racc = racc.tanh().add(&rx);
        if i % 3 == 0 {
            check_tol(&acc, &racc, 1e-5, 1e-6);
        }
    }
    check_tol(&acc, &racc, 1e-5, 1e-6);
    assert_stream_usable();
}

#[test]
fn errors_on_another_thread_do_not_affect_this_stream() {
    let p = pending();
    let h = std::thread::spawn(|| {
        let t = f32t(&[4, 3]);
        let idx = lazy_bad_indices();
        if let Ok(out) = t.index_select(&idx, 0) {
            assert!(out.to_vec::<f32>().is_err());
            drain_reported_kernel_error("index_select");
        }
        assert_stream_usable();
    });
    h.join().unwrap();
    p.verify();
}

#[test]
fn independent_work_in_a_failing_segment_survives() {
    // one segment: good work, a failing index_select, more good work that does not
    // depend on it. Only the failed op and its dependents fail.
    let (x, rx) = rand_pair(&[4, 3], 1300, -1.0, 1.0);
    let before = x.exp().unwrap();
    let idx = lazy_bad_indices();
    let bad = x.index_select(&idx, 0);
    let after = x.tanh().unwrap().sum(1).unwrap();
    check_tol(&after, &rx.tanh().sum(1, false), 1e-5, 1e-6);
    check_tol(&before, &rx.exp(), 1e-6, 1e-6);
    if let Ok(bad) = bad {
        let dependent = bad.affine(2.0, 1.0).unwrap();
        assert_err_names(bad.to_vec::<f32>(), "index_select");
        assert!(dependent.to_vec::<f32>().is_err());
        drain_reported_kernel_error("index_select");
    }
    assert_stream_usable();
}

#[test]
fn sync_with_nothing_pending_is_ok() {
    streamfuse::sync().unwrap();
    streamfuse::sync().unwrap();
    std::thread::spawn(|| streamfuse::sync().unwrap())
        .join()
        .unwrap();
}

#[test]
fn rank_above_the_engine_limit_is_an_error_not_a_panic() {
    // the engine keeps dims inline up to a maximum rank (8); beyond it every entry point
    // must return an error
    let p = pending();
    let nine = [1usize; 9];
    assert_err_names(Tensor::from_vec(vec![1.0f32], &nine), "from_vec");
    assert!(Tensor::zeros(&nine, DType::F32).is_err());
    assert!(Tensor::ones(&nine, DType::I64).is_err());
    assert!(Tensor::full(1.0, &nine).is_err());
    let eight = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 1, 1, 1, 1, 1, 2]).unwrap();
    assert_err_names(eight.unsqueeze(0), "unsqueeze");
    assert_err_names(eight.reshape(&[1, 1, 1, 1, 1, 1, 1, 1, 2]), "reshape");
    assert_err_names(
        eight.broadcast_as(&[3, 1, 1, 1, 1, 1, 1, 1, 2]),
        "broadcast_as",
    );
    let two = f32t(&[2]);
    assert_err_names(two.reshape(&[1, 1, 1, 1, 1, 1, 1, 1, 1, 2]), "reshape");
    assert_err_names(
        two.broadcast_as(&[1, 1, 1, 1, 1, 1, 1, 1, 1, 2]),
        "broadcast_as",
    );
    // a binary op whose operands are at the limit is fine
    let s = eight.add(&two).unwrap();
    assert_eq!(s.dims(), &[1, 1, 1, 1, 1, 1, 1, 2]);
    assert_eq!(
        read_f32(&s),
        vec![1.0 + read_f32(&two)[0], 2.0 + read_f32(&two)[1]]
    );
    p.verify();
}
