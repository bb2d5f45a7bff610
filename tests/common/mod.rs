//! Shared helpers for the integration tests: the f64 reference and the bridge between
//! it and `streamfuse::Tensor`.
#![allow(dead_code)]

pub mod reference;

pub use reference::*;

use streamfuse::{DType, Tensor};

/// A streamfuse f32 tensor holding the reference's values (rounded to f32).
pub fn tensor(r: &Ref) -> Tensor {
    Tensor::from_vec(r.to_f32(), &r.dims).expect("from_vec")
}

/// A random f32 tensor and its reference (same values).
pub fn rand_pair(dims: &[usize], seed: u64, lo: f32, hi: f32) -> (Tensor, Ref) {
    let r = rand_ref(dims, seed, lo, hi);
    (tensor(&r), r)
}

/// Read an f32 tensor back.
#[track_caller]
pub fn read_f32(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("to_vec::<f32>")
}

/// Assert dims, dtype F32 and values of `t` against the reference.
#[track_caller]
pub fn check(t: &Tensor, r: &Ref, tol: f64) {
    assert_eq!(t.dims(), &r.dims[..], "dims differ");
    assert_eq!(t.dtype(), DType::F32, "dtype differs");
    let v = t.to_vec::<f32>().expect("to_vec::<f32>");
    assert_close(&v, &r.data, tol);
}

/// As [`check`] with separate relative and absolute tolerances.
#[track_caller]
pub fn check_tol(t: &Tensor, r: &Ref, rtol: f64, atol: f64) {
    assert_eq!(t.dims(), &r.dims[..], "dims differ");
    assert_eq!(t.dtype(), DType::F32, "dtype differs");
    let v = t.to_vec::<f32>().expect("to_vec::<f32>");
    assert_close_tol(&v, &r.data, rtol, atol);
}

/// Assert that `t` is a U32 tensor equal to the (integer-valued) reference.
#[track_caller]
pub fn check_u32(t: &Tensor, r: &Ref) {
    assert_eq!(t.dims(), &r.dims[..], "dims differ");
    assert_eq!(t.dtype(), DType::U32, "dtype differs");
    let v = t.to_vec::<u32>().expect("to_vec::<u32>");
    let e: Vec<u32> = r.data.iter().map(|&x| x as u32).collect();
    assert_eq!(v, e);
}

/// Assert that `t` is an I64 tensor equal to the (integer-valued) reference.
#[track_caller]
pub fn check_i64(t: &Tensor, r: &Ref) {
    assert_eq!(t.dims(), &r.dims[..], "dims differ");
    assert_eq!(t.dtype(), DType::I64, "dtype differs");
    let v = t.to_vec::<i64>().expect("to_vec::<i64>");
    let e: Vec<i64> = r.data.iter().map(|&x| x as i64).collect();
    assert_eq!(v, e);
}

/// The error of a result that must have failed (works for any `T`, no `Debug` needed).
#[track_caller]
pub fn expect_err<T>(r: streamfuse::Result<T>, what: &str) -> streamfuse::Error {
    match r {
        Ok(_) => panic!("{what}: expected an error, got Ok"),
        Err(e) => e,
    }
}

/// Assert that `r` failed with a message naming `op`; returns the message.
#[track_caller]
pub fn assert_err_names<T>(r: streamfuse::Result<T>, op: &str) -> String {
    let e = expect_err(r, op);
    let msg = e.to_string();
    assert!(
        msg.contains(op),
        "error message for {op} does not name the op: {msg:?}"
    );
    msg
}

/// Run a fresh small computation and check its values: the stream must still work.
#[track_caller]
pub fn assert_stream_usable() {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).expect("from_vec");
    let b = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], &[3]).expect("from_vec");
    let c = a
        .mul(&a)
        .expect("mul")
        .add(&b)
        .expect("add")
        .sum(1)
        .expect("sum");
    let v = c.to_vec::<f32>().expect("to_vec after an error");
    // rows: 1+4+9 + 60 = 74, 16+25+36 + 60 = 137
    assert_eq!(v, vec![74.0, 137.0]);
    streamfuse::sync().expect("sync after an error");
}

/// The binary ops, by name.
pub const BINARY_OPS: [&str; 6] = ["add", "sub", "mul", "div", "maximum", "minimum"];

/// Apply the binary op `name` with streamfuse.
pub fn apply_binary(name: &str, a: &Tensor, b: &Tensor) -> streamfuse::Result<Tensor> {
    match name {
        "add" => a.add(b),
        "sub" => a.sub(b),
        "mul" => a.mul(b),
        "div" => a.div(b),
        "maximum" => a.maximum(b),
        "minimum" => a.minimum(b),
        _ => panic!("unknown binary op {name}"),
    }
}

/// Apply the binary op `name` with the reference.
pub fn ref_binary(name: &str, a: &Ref, b: &Ref) -> Ref {
    match name {
        "add" => a.add(b),
        "sub" => a.sub(b),
        "mul" => a.mul(b),
        "div" => a.div(b),
        "maximum" => a.maximum(b),
        "minimum" => a.minimum(b),
        _ => panic!("unknown binary op {name}"),
    }
}

/// The unary f32 ops, by name, with an input range on which each is well defined.
pub const UNARY_OPS: [(&str, f32, f32); 17] = [
    ("exp", -4.0, 4.0),
    ("log", 0.01, 10.0),
    ("sqrt", 0.0, 10.0),
    ("recip", 0.1, 5.0),
    ("neg", -4.0, 4.0),
    ("abs", -4.0, 4.0),
    ("tanh", -4.0, 4.0),
    ("sigmoid", -8.0, 8.0),
    ("relu", -4.0, 4.0),
    ("gelu", -6.0, 6.0),
    ("gelu_tanh", -6.0, 6.0),
    ("silu", -6.0, 6.0),
    ("affine", -4.0, 4.0),
    ("powf2", 0.0, 3.0),
    ("powf0.5", 0.0, 9.0),
    ("powf-1.5", 0.2, 4.0),
    ("powf3.3", 0.0, 3.0),
];

/// Apply the unary op `name` with streamfuse.
pub fn apply_unary(name: &str, t: &Tensor) -> streamfuse::Result<Tensor> {
    match name {
        "exp" => t.exp(),
        "log" => t.log(),
        "sqrt" => t.sqrt(),
        "recip" => t.recip(),
        "neg" => t.neg(),
        "abs" => t.abs(),
        "tanh" => t.tanh(),
        "sigmoid" => t.sigmoid(),
        "relu" => t.relu(),
        "gelu" => t.gelu(),
        "gelu_tanh" => t.gelu_tanh(),
        "silu" => t.silu(),
        "affine" => t.affine(-1.5, 0.25),
        "powf2" => t.powf(2.0),
        "powf0.5" => t.powf(0.5),
        "powf-1.5" => t.powf(-1.5),
        "powf3.3" => t.powf(3.3),
        _ => panic!("unknown unary op {name}"),
    }
}

/// Apply the unary op `name` with the reference.
pub fn ref_unary(name: &str, r: &Ref) -> Ref {
    match name {
        "exp" => r.exp(),
        "log" => r.log(),
        "sqrt" => r.sqrt(),
        "recip" => r.recip(),
        "neg" => r.neg(),
        "abs" => r.abs(),
        "tanh" => r.tanh(),
        "sigmoid" => r.sigmoid(),
        "relu" => r.relu(),
        "gelu" => r.gelu(),
        "gelu_tanh" => r.gelu_tanh(),
        "silu" => r.silu(),
        "affine" => r.affine(-1.5, 0.25),
        "powf2" => r.powf(2.0),
        "powf0.5" => r.powf(0.5),
        "powf-1.5" => r.powf(-1.5),
        "powf3.3" => r.powf(3.3),
        _ => panic!("unknown unary op {name}"),
    }
}
