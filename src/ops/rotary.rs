//! `rotary`: rotary position embedding, the "rotate half" form of HF transformers
//! (ModernBERT, Qwen3, Llama). x is `[.., seq, dh]` or `[.., seq, heads, dh]`, cos and
//! sin are tables `[seq, dh/2]`; with `x1 = x[.., :dh/2]`, `x2 = x[.., dh/2:]` and the
//! row of the tables at each element's position:
//! `out[.., :dh/2] = x1·cos − x2·sin`, `out[.., dh/2:] = x2·cos + x1·sin`.
//!
//! Which dim of x holds the positions: dim −2 when its size is the tables' `seq`, else
//! dim −3 when that one's is (the `[.., seq, heads, dh]` form). Tables given as
//! `[seq, 1, dh/2]` always mean dim −3 (for `heads == seq`). This file holds the
//! whole op: shape rule, registry entry, kernel (portable scalar, one thread) and the
//! plain reference the tests compare it with.

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::error::{Error, Result};
use crate::ir::{DType, Dims, Layout};
use crate::kernels::KernelError;

/// The op's name in the `Tensor` API.
pub(crate) const NAME: &str = "rotary";

/// The output dims of `x.rotary(cos, sin)` (those of x; the dtype is f32), or the
/// error naming the op and the shapes.
pub(crate) fn shape(
    x: (&[usize], DType),
    cos: (&[usize], DType),
    sin: (&[usize], DType),
) -> Result<Dims> {
    if [x.1, cos.1, sin.1].iter().any(|&d| d != DType::F32) {
        return Err(Error::DType {
            op: NAME,
            msg: format!(
                "needs f32 x, cos and sin, got {}, {} and {}",
                x.1, cos.1, sin.1
            ),
        });
    }
    positions_dim(x.0, cos.0, sin.0)?;
    Ok(Dims::from_slice(x.0))
}

/// How far from the end x's position dim is (2 or 3), after checking the shapes.
fn positions_dim(x: &[usize], cos: &[usize], sin: &[usize]) -> Result<usize> {
    let fail = |msg: String| Error::Shape { op: NAME, msg };
    let rank = x.len();
    if rank < 2 {
        return Err(fail(format!(
            "needs x of rank 2 or more ([.., seq, dh] or [.., seq, heads, dh]), got shape {x:?}"
        )));
    }
    let dh = x[rank - 1];
    if !dh.is_multiple_of(2) {
        return Err(fail(format!(
            "needs an even head dim (the last of x), got shape {x:?}"
        )));
    }
    let seq = cos.first().copied().unwrap_or(0);
    let table_ok = |t: &[usize]| t == [seq, dh / 2] || t == [seq, 1, dh / 2];
    if cos != sin || !table_ok(cos) {
        return Err(fail(format!(
            "needs cos and sin of shape [seq, dh/2] = [seq, {}] for x of shape {x:?}, got {cos:?} and {sin:?}",
            dh / 2
        )));
    }
    match (cos.len(), rank) {
        (2, _) if x[rank - 2] == seq => Ok(2),
        (_, 3..) if x[rank - 3] == seq => Ok(3),
        _ => Err(fail(format!(
            "no dim of x {x:?} holds the {seq} positions of cos and sin {cos:?} (dim -2 for [.., seq, dh], dim -3 for [.., seq, heads, dh])"
        ))),
    }
}

/// The registry entry of `rotary`.
pub(super) static FAMILY: Family = Family {
    name: NAME,
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, _| {
        let lay = |i: usize| &op.inputs[i].layout;
        if output(op)?.layout.dims != lay(0).dims {
            return Err(KernelError(format!(
                "{op}: output dims differ from x's (engine bug)"
            )));
        }
        kernel(
            (typed(inputs[0])?, lay(0)),
            (typed(inputs[1])?, lay(1)),
            (typed(inputs[2])?, lay(2)),
            dst(out)?,
        )
    },
};

/// The largest element index `layout` reads plus one (0 when it reads none).
fn extent(layout: &Layout) -> usize {
    if layout.numel() == 0 {
        return 0;
    }
    let last = layout.dims.iter().zip(layout.strides.iter());
    layout.offset + last.map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
}

/// The kernel: reads x, cos and sin through their layouts, writes `out` row-major.
fn kernel(
    (x, xl): (&[f32], &Layout),
    (cos, cl): (&[f32], &Layout),
    (sin, sl): (&[f32], &Layout),
    out: &mut [f32],
) -> std::result::Result<(), KernelError> {
    let from_end =
        positions_dim(&xl.dims, &cl.dims, &sl.dims).map_err(|e| KernelError(e.to_string()))?;
    for (data, l, what) in [(x, xl, "x"), (cos, cl, "cos"), (sin, sl, "sin")] {
        if extent(l) > data.len() {
            return Err(KernelError(format!(
                "{NAME}: {what} reads past its buffer of {} (engine bug)",
                data.len()
            )));
        }
    }
    if out.len() != xl.numel() {
        return Err(KernelError(format!(
            "{NAME}: output of {} elements for x {:?} (engine bug)",
            out.len(),
            xl.dims
        )));
    }
    let rank = xl.rank();
    let (dh, pos_dim) = (xl.dims[rank - 1], rank - from_end);
    let half = dh / 2;
    let (xs, cs, ss) = (
        xl.strides[rank - 1],
        cl.strides[cl.rank() - 1],
        sl.strides[sl.rank() - 1],
    );
    // An empty x has no rows (and `dh` = 0 only then).
    for (r, row) in out.chunks_exact_mut(dh.max(1)).enumerate() {
        // The row's offset in x and its position, from its index over x's outer dims.
        let (mut rest, mut base, mut pos) = (r, xl.offset, 0);
        for d in (0..rank - 1).rev() {
            let i = rest % xl.dims[d];
            rest /= xl.dims[d];
            base += i * xl.strides[d];
            if d == pos_dim {
                pos = i;
            }
        }
        let (c0, s0) = (
            cl.offset + pos * cl.strides[0],
            sl.offset + pos * sl.strides[0],
        );
        for j in 0..half {
            let (x1, x2) = (x[base + j * xs], x[base + (half + j) * xs]);
            let (c, s) = (cos[c0 + j * cs], sin[s0 + j * ss]);
            row[j] = x1 * c - x2 * s;
            row[half + j] = x2 * c + x1 * s;
        }
    }
    Ok(())
}

/// The plain reference: x contiguous `[outer, seq, heads, dh]` (`heads` = 1 for the
/// `[.., seq, dh]` form), cos and sin contiguous `[seq, dh/2]`.
#[cfg(test)]
pub(crate) fn reference(
    x: &[f32],
    [outer, seq, heads, dh]: [usize; 4],
    cos: &[f32],
    sin: &[f32],
) -> Vec<f32> {
    let half = dh / 2;
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for p in 0..seq {
            for h in 0..heads {
                let at = ((o * seq + p) * heads + h) * dh;
                for j in 0..half {
                    let (x1, x2) = (x[at + j], x[at + half + j]);
                    let (c, s) = (cos[p * half + j], sin[p * half + j]);
                    out[at + j] = x1 * c - x2 * s;
                    out[at + half + j] = x2 * c + x1 * s;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::OpKind;
    use crate::kernels::testutil::gather;
    use crate::ops::{testing, Data};

    /// Values with no pattern a wrong index could reproduce.
    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(value(seed)).collect()
    }

    /// Element `i` of [`values`].
    fn value(seed: f32) -> impl Fn(usize) -> f32 {
        move |i| ((i as f32 + seed) * 0.37).sin()
    }

    fn run_kernel(x: &[f32], xl: &Layout, tables: &[usize], cos: &[f32], sin: &[f32]) -> Vec<f32> {
        let tl = Layout::contiguous(tables);
        let mut out = vec![f32::NAN; xl.numel()];
        kernel((x, xl), (cos, &tl), (sin, &tl), &mut out).unwrap();
        out
    }

    /// One row worked out by hand: x = [1, 2, 3, 4], cos = [0.5, 0], sin = [0.25, 1].
    #[test]
    fn one_row_by_hand() {
        let out = run_kernel(
            &[1.0, 2.0, 3.0, 4.0],
            &Layout::contiguous(&[1, 4]),
            &[1, 2],
            &[0.5, 0.0],
            &[0.25, 1.0],
        );
        // [1·.5 − 3·.25, 2·0 − 4·1, 3·.5 + 1·.25, 4·0 + 2·1]
        assert_eq!(out, [-0.25, -4.0, 1.75, 2.0]);
    }

    /// The kernel gives the reference's bits on both forms, batched.
    #[test]
    fn kernel_matches_the_reference() {
        for (dims, shape4) in [
            (vec![2, 5, 6], [2, 5, 1, 6]),
            (vec![2, 3, 4, 8], [2, 3, 4, 8]),
            (vec![3, 2], [1, 3, 1, 2]),
        ] {
            let (seq, dh) = (shape4[1], shape4[3]);
            let x = values(dims.iter().product(), 1.0);
            let (cos, sin) = (values(seq * dh / 2, 2.0), values(seq * dh / 2, 3.0));
            let got = run_kernel(&x, &Layout::contiguous(&dims), &[seq, dh / 2], &cos, &sin);
            assert_eq!(got, reference(&x, shape4, &cos, &sin), "{dims:?}");
        }
    }

    /// x read through a transposed layout ([seq, heads, dh] seen from a
    /// [heads, seq, dh] buffer) gives the rotation of the transposed values.
    #[test]
    fn kernel_reads_x_through_its_layout() {
        let (heads, seq, dh) = (3, 4, 6);
        let buf = values(heads * seq * dh, 4.0);
        let xl = Layout {
            dims: Dims::from_slice(&[seq, heads, dh]),
            strides: Dims::from_slice(&[dh, seq * dh, 1]),
            offset: 0,
        };
        let mut x = Vec::new();
        for p in 0..seq {
            for h in 0..heads {
                x.extend_from_slice(&buf[(h * seq + p) * dh..][..dh]);
            }
        }
        let (cos, sin) = (values(seq * dh / 2, 5.0), values(seq * dh / 2, 6.0));
        let got = run_kernel(&buf, &xl, &[seq, dh / 2], &cos, &sin);
        assert_eq!(got, reference(&x, [1, seq, heads, dh], &cos, &sin));
    }

    /// The binding, on x `[2, 4, 3, 6]` (`[.., seq, heads, dh]`) read transposed from
    /// a padded buffer and tables read transposed (stored `[dh/2, seq]`), with one
    /// thread and two, gives the reference's bits.
    #[test]
    fn the_binding_matches_the_reference_over_strided_inputs() {
        let dims = [2, 4, 3, 6];
        let (x, xl) = testing::view(&dims, &[0, 2, 1, 3], value(1.0));
        let (cos, cl) = testing::view(&[4, 3], &[1, 0], value(2.0));
        let (sin, sl) = testing::view(&[4, 3], &[1, 0], value(3.0));
        let f = crate::ir::DType::F32;
        let op = testing::op(OpKind::Rotary, &[(f, xl), (f, cl), (f, sl)], (f, &dims));
        let want = reference(
            &gather(&x, &xl),
            dims,
            &gather(&cos, &cl),
            &gather(&sin, &sl),
        );
        for par in testing::PARS {
            let inputs = [Data::F32(&x), Data::F32(&cos), Data::F32(&sin)];
            let got: Vec<f32> = testing::run_op(&op, &inputs, None, par);
            assert_eq!(got, want, "{par:?}");
        }
    }

    /// A layout reaching past its buffer is an error, not a panic.
    #[test]
    fn a_short_buffer_is_an_error() {
        let tl = Layout::contiguous(&[2, 2]);
        let mut out = vec![0.0; 8];
        let e = kernel(
            (&[0.0; 7], &Layout::contiguous(&[2, 4])),
            (&[0.0; 4], &tl),
            (&[0.0; 4], &tl),
            &mut out,
        )
        .unwrap_err();
        assert!(e.0.contains("x reads past"), "{}", e.0);
    }

    /// The shape rule: which dim holds the positions, and errors naming the shapes.
    #[test]
    fn shape_rule() {
        let f = DType::F32;
        let ok = |x: &[usize], t: &[usize]| positions_dim(x, t, t);
        assert_eq!(ok(&[2, 5, 8], &[5, 4]).unwrap(), 2);
        assert_eq!(ok(&[2, 5, 3, 8], &[5, 4]).unwrap(), 3);
        assert_eq!(ok(&[5, 5, 8], &[5, 1, 4]).unwrap(), 3);
        for (x, t, needle) in [
            (&[8][..], &[1, 4][..], "rank 2 or more"),
            (&[2, 7][..], &[2, 3][..], "even head dim"),
            (&[2, 8][..], &[2, 3][..], "[seq, 4]"),
            (&[3, 8][..], &[2, 4][..], "no dim of x [3, 8]"),
        ] {
            let e = shape((x, f), (t, f), (t, f)).unwrap_err().to_string();
            assert!(e.starts_with("rotary: ") && e.contains(needle), "{e}");
        }
        let e = shape((&[2, 8], f), (&[2, 4], f), (&[2, 4], DType::U32));
        assert!(e.unwrap_err().to_string().contains("got f32, f32 and u32"));
    }
}
