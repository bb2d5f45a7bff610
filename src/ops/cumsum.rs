//! `cumsum`: the running (inclusive) sum along one dim, in the input's dtype: element
//! `i` of the dim is the sum of elements `0..=i`. For u32 and i64 the sums wrap on
//! overflow, as the integer types' `wrapping_add` does; for f32 they add in order, so
//! each element is the f32 sum of the one before and its own input. With lengths
//! `[3, 1, 2]`, `cumsum` gives `[3, 4, 6]`: the ends of packed sequences, a ragged
//! batch's offsets after its leading 0.
//!
//! Everything about the op is here: its shape rule ([`shape`]), its registry entry
//! (a single kernel of its own, one add per element), its kernel (a strided copy of the
//! input, then the sums in place along the dim) and the scalar reference the unit test
//! holds the kernel to.

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Layout, OpKind};
use crate::kernels::{self, KernelError, Par};

/// Checks `cumsum` over dim `d` (resolved) of a tensor of `dims` and `dtype`: f32, u32
/// or i64. The output has the input's dims and dtype.
pub(crate) fn shape(x: (&[usize], DType), d: usize) -> crate::Result<()> {
    match x.1 {
        DType::F32 | DType::U32 | DType::I64 if d < x.0.len() => Ok(()),
        DType::F32 | DType::U32 | DType::I64 => Err(Error::Shape {
            op: "cumsum",
            msg: format!("dim {d} is out of range for shape {:?}", x.0),
        }),
        t => Err(Error::DType {
            op: "cumsum",
            msg: format!(
                "needs an f32, u32 or i64 tensor, got {t} with shape {:?}",
                x.0
            ),
        }),
    }
}

/// The registry entry of `cumsum`.
pub(super) static FAMILY: Family = Family {
    name: "cumsum",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::Cumsum { dim } = op.kind else {
            return Err(KernelError(format!("{op} is not cumsum (engine bug)")));
        };
        let layout = &op.inputs[0].layout;
        match output(op)?.dtype {
            DType::F32 => run::<f32>(typed(inputs[0])?, layout, dim, dst(out)?, par),
            DType::U32 => run::<u32>(typed(inputs[0])?, layout, dim, dst(out)?, par),
            DType::I64 => run::<i64>(typed(inputs[0])?, layout, dim, dst(out)?, par),
            t => Err(KernelError(format!("cumsum of {t} (engine bug)"))),
        }
    },
};

/// An element type `cumsum` adds: wrapping for the integers.
trait RunningSum: crate::ir::Element {
    fn plus(self, other: Self) -> Self;
}

impl RunningSum for f32 {
    fn plus(self, other: f32) -> f32 {
        self + other
    }
}

impl RunningSum for u32 {
    fn plus(self, other: u32) -> u32 {
        self.wrapping_add(other)
    }
}

impl RunningSum for i64 {
    fn plus(self, other: i64) -> i64 {
        self.wrapping_add(other)
    }
}

/// The kernel: `src` read through `layout` (any strides, checked by the copy) into
/// `dst` (row-major, its element count), then the running sums along `dim`, in place:
/// each block of the dims before `dim` is a `[len, inner]` matrix whose rows add up.
fn run<T: RunningSum>(
    src: &[T],
    layout: &Layout,
    dim: usize,
    dst: &mut [T],
    par: Par,
) -> Result<(), KernelError> {
    let dims = layout.dims();
    if dim >= dims.len() {
        return Err(KernelError(format!(
            "cumsum over dim {dim} of dims {dims:?} (engine bug)"
        )));
    }
    kernels::copy(src, layout, dst, par)?;
    let len = dims[dim];
    let inner: usize = dims[dim + 1..].iter().product();
    if len < 2 || inner == 0 {
        return Ok(());
    }
    for block in dst.chunks_exact_mut(len * inner) {
        for i in 1..len {
            let (done, rest) = block.split_at_mut(i * inner);
            let before = &done[(i - 1) * inner..];
            for (x, &b) in rest[..inner].iter_mut().zip(before) {
                *x = b.plus(*x);
            }
        }
    }
    Ok(())
}

/// The scalar reference: each output element summed afresh from the input's elements
/// along `dim`, by coordinates (for the unit test).
#[cfg(test)]
fn reference(src: &[f64], dims: &[usize], dim: usize) -> Vec<f64> {
    let inner: usize = dims[dim + 1..].iter().product();
    let len = dims[dim];
    (0..src.len())
        .map(|flat| {
            let i = flat / inner % len;
            let first = flat - i * inner;
            (0..=i).map(|j| src[first + j * inner]).sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{self, assert_within, dense, run_op, view, Elem, PARS};

    /// Running sums of `T` through the binding over each dim of a `[4, 3, 5]` tensor
    /// read transposed as `[5, 3, 4]` from a padded buffer, with one thread and two,
    /// against the reference, exactly: small integers, so every sum is exact.
    fn check<T: Elem>(value: impl Fn(usize) -> T) {
        let dims = [5, 3, 4];
        let (src, layout) = view(&dims, &[2, 1, 0], value);
        let plain = dense(&src, &layout);
        for dim in 0..3 {
            let kind = OpKind::Cumsum { dim };
            let op = testing::op(kind, &[(T::DTYPE, layout)], (T::DTYPE, &dims));
            let want = reference(&plain, &dims, dim);
            for par in PARS {
                let got: Vec<T> = run_op(&op, &[T::data(&src)], None, par);
                let what = format_args!("{} over {dim} {par:?}", T::DTYPE);
                assert_within(&got, &want, 0.0, 0.0, &what);
            }
        }
    }

    #[test]
    fn the_binding_matches_the_reference_over_strided_inputs() {
        check(|i| ((i * 7) % 11) as f32 - 5.0);
        check(|i| ((i * 7) % 11) as i64 - 5);
        check(|i| ((i * 7) % 11) as u32);
    }

    #[test]
    fn integers_wrap_and_bad_arguments_are_errors() {
        let l = Layout::contiguous(&[3]);
        let mut out = [0u32; 3];
        run(&[u32::MAX, 2, 3], &l, 0, &mut out, Par::serial()).unwrap();
        assert_eq!(out, [u32::MAX, 1, 4]);
        let mut out = [0i64; 3];
        run(&[3, -1, 2], &l, 0, &mut out, Par::serial()).unwrap();
        assert_eq!(out, [3, 2, 4]);
        assert!(run(&[1u32, 2, 3], &l, 1, &mut out_u32(), Par::serial()).is_err());
        assert!(run(&[1u32, 2], &l, 0, &mut out_u32(), Par::serial()).is_err());
        assert!(shape((&[2, 3], DType::BF16), 0).is_err());
        assert!(shape((&[2, 3], DType::F32), 2).is_err());
        assert!(shape((&[2, 3], DType::I64), 1).is_ok());
    }

    fn out_u32() -> [u32; 3] {
        [0; 3]
    }
}
