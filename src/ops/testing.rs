//! What the family files' unit tests share: operands stored so that no kernel can read
//! them as row-major ([`view`]), their values read back by coordinates ([`dense`]), an
//! [`Op`] built for a test ([`op`]), its kernel binding run on typed slices ([`run_op`],
//! with each of [`PARS`]) and the comparison with a scalar reference ([`assert_within`]).
//! Each family file holds its own scalar reference; only this plumbing is shared.

use super::{BoundProduct, Data, DataElement, DataMut};
use crate::ir::{DType, Dims, Element, Layout, Op, OpKind, TensorDesc, TensorId};
use crate::kernels::testutil::gather;
use crate::kernels::Par;

/// The thread settings every binding test runs with: the calling thread alone, and two
/// threads (in test builds a kernel splits from a few dozen element operations, so the
/// small operands here do reach the split paths).
pub(crate) const PARS: [Par; 2] = [Par { threads: 1 }, Par { threads: 2 }];

/// An element type a binding reads and writes, with the slices' wrappers and a value
/// the output starts as (so an element the kernel never writes shows).
pub(crate) trait Elem: DataElement {
    /// What the output holds before the kernel runs.
    const UNSET: Self;
    /// `v` as an input of a binding.
    fn data(v: &[Self]) -> Data<'_>;
    /// `v` as the output of a binding.
    fn data_mut(v: &mut [Self]) -> DataMut<'_>;
}

macro_rules! elem {
    ($t:ty, $variant:ident, $unset:expr) => {
        impl Elem for $t {
            const UNSET: Self = $unset;
            fn data(v: &[Self]) -> Data<'_> {
                Data::$variant(v)
            }
            fn data_mut(v: &mut [Self]) -> DataMut<'_> {
                DataMut::$variant(v)
            }
        }
    };
}

elem!(f32, F32, f32::NAN);
elem!(u32, U32, 0xDEAD_BEEF);
elem!(i64, I64, -0x5EED_5EED);

/// A buffer and a layout of `dims` over it that is not row-major: the tensor is stored
/// with its dims in the order `order` (`order[0]` outermost), each stored dim one
/// longer than the tensor's, and read from index 1 of every stored dim: a permuted,
/// narrowed view at an offset, as a transposed slice of a larger tensor is. (With the
/// last dim last in `order`, rows stay contiguous.) Every buffer element, the unread
/// padding too, is `value(its index)`.
pub(crate) fn view<T>(
    dims: &[usize],
    order: &[usize],
    value: impl Fn(usize) -> T,
) -> (Vec<T>, Layout) {
    assert_eq!(dims.len(), order.len(), "order must name every dim once");
    let stored: Vec<usize> = order.iter().map(|&d| dims[d] + 1).collect();
    let mut stored_strides = vec![1usize; stored.len()];
    for j in (0..stored.len().saturating_sub(1)).rev() {
        stored_strides[j] = stored_strides[j + 1] * stored[j + 1];
    }
    let mut strides = vec![0usize; dims.len()];
    for (j, &d) in order.iter().enumerate() {
        strides[d] = stored_strides[j];
    }
    let layout = Layout {
        dims: Dims::from_slice(dims),
        strides: Dims::from_slice(&strides),
        offset: stored_strides.iter().sum(),
    };
    let buf: Vec<T> = (0..stored.iter().product()).map(value).collect();
    assert!(layout.fits_in(buf.len()));
    (buf, layout)
}

/// The elements `layout` reads from `buf`, in row-major order, as f64, each read at its
/// coordinates (`offset + Σ index · stride`).
pub(crate) fn dense<T: Element>(buf: &[T], layout: &Layout) -> Vec<f64> {
    gather(buf, layout).into_iter().map(T::to_f64).collect()
}

/// The row-major index, in a tensor of `dims`, of the element that the multi-index
/// `idx` of a tensor `dims` broadcasts to reads: dims matched from the right, a dim of
/// size 1 repeated. (For `idx` of the same dims, the plain row-major index.)
pub(crate) fn flat(idx: &[usize], dims: &[usize]) -> usize {
    let lead = idx.len() - dims.len();
    dims.iter().enumerate().fold(0, |acc, (i, &d)| {
        acc * d + if d == 1 { 0 } else { idx[lead + i] }
    })
}

/// An op of `kind` reading `inputs` (dtype, layout each) and making a row-major output
/// of `out` (dtype, dims), as the recorder would describe it.
pub(crate) fn op(kind: OpKind, inputs: &[(DType, Layout)], out: (DType, &[usize])) -> Op {
    let desc = |id: usize, dtype: DType, layout: Layout| TensorDesc {
        id: TensorId(id as u64),
        dtype,
        layout,
    };
    Op {
        kind,
        inputs: inputs
            .iter()
            .enumerate()
            .map(|(i, &(dtype, layout))| desc(i + 1, dtype, layout))
            .collect(),
        output: Some(desc(0, out.0, Layout::contiguous(out.1))),
    }
}

/// Runs `op`'s kernel binding through [`super::run`] on `inputs` (the product bound as
/// `product`) with `par`, and returns its output.
pub(crate) fn run_op<T: Elem>(
    op: &Op,
    inputs: &[Data<'_>],
    product: Option<BoundProduct<'_>>,
    par: Par,
) -> Vec<T> {
    let n = op.output.as_ref().map_or(0, |o| o.layout.numel());
    let mut out = vec![T::UNSET; n];
    super::run(op, inputs, product, T::data_mut(&mut out), par)
        .unwrap_or_else(|e| panic!("{op} with {par:?}: {e}"));
    out
}

/// Asserts that the kernel's output `got` is the reference's `want` within
/// `rel · |want| + abs` element by element (NaN where `want` is NaN, and only there;
/// both 0 for exact). `what` names the case in the message.
pub(crate) fn assert_within<T: Element>(
    got: &[T],
    want: &[f64],
    rel: f64,
    abs: f64,
    what: &dyn std::fmt::Display,
) {
    assert_eq!(got.len(), want.len(), "{what}: element counts differ");
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64();
        let ok = if w.is_nan() {
            g.is_nan()
        } else {
            g == w || (g - w).abs() <= rel * w.abs() + abs
        };
        assert!(ok, "{what}: element {i} is {g}, the reference {w}");
    }
}

/// `v` rounded to f32, as an f32 kernel's exact result would be.
pub(crate) fn f32_rounded(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x as f32)).collect()
}

/// `x` as a value of `dtype`, the rule of every conversion (`Element::from_f64`, Rust's
/// `as`): f32 rounds to nearest; the integers drop the fraction, saturate at their
/// range and take NaN to 0.
pub(crate) fn in_dtype(x: f64, dtype: DType) -> f64 {
    let (lo, hi) = match dtype {
        DType::U32 => (0.0, f64::from(u32::MAX)),
        DType::I64 => (-(2f64.powi(63)), 2f64.powi(63)),
        _ => return f64::from(x as f32),
    };
    if x.is_nan() {
        0.0
    } else {
        x.trunc().clamp(lo, hi)
    }
}
