//! Ops that move or reinterpret elements: `to_dtype` (cast), `contiguous` (a copy into
//! a fresh row-major buffer) and views (a new layout over the same buffer, no kernel).
//!
//! The file ends with its scalar reference (each cast value by the conversion rule,
//! each view's elements by coordinates) and the unit tests that hold the bindings to it.

use super::{checked_numel, dst, output, per_output_element, typed, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Layout};
use crate::kernels::{self, KernelError};
use crate::Result;

/// The layout `reshape` gives a tensor read through `layout` when its elements, in
/// row-major order, take `dims` (same element count): `Some` when the strides allow a
/// view, `None` when the elements must be copied first.
pub(crate) fn reshape(layout: &Layout, dims: &[usize]) -> Result<Option<Layout>> {
    let n = checked_numel(dims, "reshape")?;
    let from = layout.dims();
    if n != layout.numel() {
        return Err(Error::Shape {
            op: "reshape",
            msg: format!(
                "cannot reshape {from:?} ({} elements) to {dims:?} ({n} elements)",
                layout.numel()
            ),
        });
    }
    Ok(layout.reshape(dims))
}

/// The layout of `permute(perm)`: `perm` must name each dim once.
pub(crate) fn permute(layout: &Layout, perm: &[usize]) -> Result<Layout> {
    let rank = layout.dims().len();
    let mut seen = vec![false; rank];
    let ok = perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
    if !ok {
        return Err(Error::Arg {
            op: "permute",
            msg: format!(
                "{perm:?} is not a permutation of the {rank} dims of shape {:?}",
                layout.dims()
            ),
        });
    }
    Ok(layout.permute(perm))
}

/// The layout of `narrow(d, start, len)` (dim resolved): the range within the dim.
pub(crate) fn narrow(layout: &Layout, d: usize, start: usize, len: usize) -> Result<Layout> {
    let size = layout.dims()[d];
    if start.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::Arg {
            op: "narrow",
            msg: format!(
                "range {start}..{} is out of bounds for dim {d} of shape {:?}",
                start.saturating_add(len),
                layout.dims()
            ),
        });
    }
    Ok(layout.narrow(d, start, len))
}

/// The layout of `unsqueeze(d)` (insertion point resolved): within the rank limit.
pub(crate) fn unsqueeze(layout: &Layout, d: usize) -> Result<Layout> {
    let mut dims = layout.dims().to_vec();
    dims.insert(d, 1);
    checked_numel(&dims, "unsqueeze")?;
    Ok(layout.unsqueeze(d))
}

/// The layout of `squeeze(d)` (dim resolved): the dim has size 1.
pub(crate) fn squeeze(layout: &Layout, d: usize) -> Result<Layout> {
    let dims = layout.dims();
    if dims[d] != 1 {
        return Err(Error::Shape {
            op: "squeeze",
            msg: format!("dim {d} of shape {dims:?} has size {}, not 1", dims[d]),
        });
    }
    Ok(layout.squeeze(d))
}

/// The layout of `broadcast_as(dims)`: numpy broadcasting of the tensor's dims to
/// `dims`.
pub(crate) fn broadcast_as(layout: &Layout, dims: &[usize]) -> Result<Layout> {
    checked_numel(dims, "broadcast_as")?;
    layout.broadcast_as(dims).ok_or_else(|| Error::Shape {
        op: "broadcast_as",
        msg: format!("cannot broadcast shape {:?} to {dims:?}", layout.dims()),
    })
}

/// Checks `to_dtype` from `from` to the weight-only dtype `to` (packed at once): an f32
/// (or weight) matrix of rank 2.
pub(crate) fn to_weight(from: DType, dims: &[usize], to: DType) -> Result<()> {
    let op = "to_dtype";
    if !(from == DType::F32 || from.is_weight_only()) {
        return Err(Error::DType {
            op,
            msg: format!("only f32 matrices convert to {to}, got a {from} tensor"),
        });
    }
    if dims.len() != 2 {
        return Err(Error::Shape {
            op,
            msg: format!("a {to} tensor is a weight matrix [k, n], got dims {dims:?}"),
        });
    }
    Ok(())
}

/// The registry entry of `to_dtype`.
pub(super) static CAST: Family = Family {
    name: "to_dtype",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        with_dtype!(op.inputs[0].dtype, S => {
            with_dtype!(output(op)?.dtype, T => {
                kernels::cast::<S, T>(typed(inputs[0])?, &op.inputs[0].layout, dst(out)?, par)
            })
        })
    },
};

/// The registry entry of `contiguous`.
pub(super) static CONTIGUOUS: Family = Family {
    name: "contiguous",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        with_dtype!(output(op)?.dtype, T => {
            kernels::copy::<T>(typed(inputs[0])?, &op.inputs[0].layout, dst(out)?, par)
        })
    },
};

/// The registry entry of views (`reshape`, `transpose`, `narrow`, ...): they alias
/// their input, cost nothing and have no kernel.
pub(super) static VIEW: Family = Family {
    name: "view",
    class: FusionClass::Alias,
    work: |_| 0,
    run: |_, _, _, _, _| Err(KernelError("a view has no kernel (engine bug)".into())),
};

/// What the file's reference computes: a cast, a copy, or one of the views.
#[cfg(test)]
#[derive(Clone, Debug)]
enum Step {
    Cast(DType),
    Contiguous,
    Reshape(Vec<usize>),
    Permute(Vec<usize>),
    Narrow(usize, usize, usize),
    Unsqueeze(usize),
    Squeeze(usize),
    BroadcastAs(Vec<usize>),
}

/// The file's scalar reference: the dims and the elements (row-major) of `step` on the
/// dense `x` of `dims`, each element read by coordinates: a cast converts each value
/// (`testing::in_dtype`, the rule of every conversion), a copy keeps them, and the
/// element at `idx` of a view is x's at the coordinates it names: the same row-major
/// position (reshape), `idx[i]` as coordinate `perm[i]` (permute), `idx[d] + start`
/// along `d` (narrow), without the new dim (unsqueeze), with 0 put back (squeeze), and
/// matched from the right with the dims of 1 at 0 (broadcast).
#[cfg(test)]
fn reference(step: &Step, x: &[f64], dims: &[usize]) -> (Vec<usize>, Vec<f64>) {
    use super::testing::{flat, in_dtype};
    let mut out = dims.to_vec();
    match step {
        Step::Reshape(d) | Step::BroadcastAs(d) => out.clone_from(d),
        Step::Permute(perm) => out = perm.iter().map(|&p| dims[p]).collect(),
        &Step::Narrow(d, _, len) => out[d] = len,
        &Step::Unsqueeze(d) => out.insert(d, 1),
        &Step::Squeeze(d) => _ = out.remove(d),
        Step::Cast(_) | Step::Contiguous => {}
    }
    let values = crate::kernels::testutil::indices(&out)
        .into_iter()
        .map(|mut idx| {
            let at = match step {
                Step::Reshape(d) => flat(&idx, d),
                Step::Permute(perm) => {
                    let mut src = vec![0; dims.len()];
                    for (&p, &i) in perm.iter().zip(&idx) {
                        src[p] = i;
                    }
                    flat(&src, dims)
                }
                &Step::Narrow(d, start, _) => {
                    idx[d] += start;
                    flat(&idx, dims)
                }
                &Step::Unsqueeze(d) => {
                    idx.remove(d);
                    flat(&idx, dims)
                }
                &Step::Squeeze(d) => {
                    idx.insert(d, 0);
                    flat(&idx, dims)
                }
                _ => flat(&idx, dims),
            };
            match *step {
                Step::Cast(to) => in_dtype(x[at], to),
                _ => x[at],
            }
        })
        .collect();
    (out, values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::OpKind;
    use crate::kernels::Par;
    use crate::ops::testing::{self, assert_within, dense, run_op, view, Elem, PARS};
    use crate::ops::{Data, DataMut};

    /// Runs `family`'s binding on `src` read through `read` (`layout`, or a view of
    /// it) into `D` with each of [`PARS`], against the reference of `step` on `src`
    /// read through `layout`, exactly (a cast rounds or saturates one value at a time;
    /// a copy only copies).
    fn check<S: Elem, D: Elem>(
        family: &Family,
        step: &Step,
        src: &[S],
        layout: Layout,
        read: Layout,
    ) {
        let kind = match step {
            Step::Cast(_) => OpKind::Cast,
            _ => OpKind::Contiguous,
        };
        let (dims, want) = reference(step, &dense(src, &layout), layout.dims());
        assert_eq!(read.dims(), dims, "{step:?}");
        let op = testing::op(kind, &[(S::DTYPE, read)], (D::DTYPE, &dims));
        assert!(std::ptr::eq(crate::ops::family(&op.kind), family));
        for par in PARS {
            let got: Vec<D> = run_op(&op, &[S::data(src)], None, par);
            let what = format_args!("{step:?} of {} {layout:?} {par:?}", S::DTYPE);
            assert_within(&got, &want, 0.0, 0.0, &what);
        }
    }

    /// Values that casts round (f32 of large integers) and saturate (negative or huge
    /// to u32, huge to i64, NaN to 0).
    fn f32s(i: usize) -> f32 {
        let specials = [-1.5, 3e9, 7.9, f32::NAN, -1e20, 0.25, 2.5e9, 16_777_217.0];
        specials[i % 8] * (1 + i / 8) as f32
    }

    fn u32s(i: usize) -> u32 {
        (i as u32).wrapping_mul(2_654_435_761)
    }

    fn i64s(i: usize) -> i64 {
        (i as i64 - 20) * 1_234_567_891
    }

    /// Every cast between f32, u32 and i64 through `to_dtype`'s binding, and
    /// `contiguous`'s copy of each, of a `[3, 1, 4, 5]` tensor read permuted from a
    /// padded buffer.
    #[test]
    fn casts_and_copies_match_the_reference_over_strided_inputs() {
        let dims = [3, 1, 4, 5];
        let (f, fl) = view(&dims, &[3, 0, 1, 2], f32s);
        let (u, ul) = view(&dims, &[2, 3, 1, 0], u32s);
        let (i, il) = view(&dims, &[1, 3, 2, 0], i64s);
        for to in [DType::F32, DType::U32, DType::I64] {
            let step = Step::Cast(to);
            match to {
                DType::F32 => {
                    check::<f32, f32>(&CAST, &step, &f, fl, fl);
                    check::<u32, f32>(&CAST, &step, &u, ul, ul);
                    check::<i64, f32>(&CAST, &step, &i, il, il);
                }
                DType::U32 => {
                    check::<f32, u32>(&CAST, &step, &f, fl, fl);
                    check::<u32, u32>(&CAST, &step, &u, ul, ul);
                    check::<i64, u32>(&CAST, &step, &i, il, il);
                }
                _ => {
                    check::<f32, i64>(&CAST, &step, &f, fl, fl);
                    check::<u32, i64>(&CAST, &step, &u, ul, ul);
                    check::<i64, i64>(&CAST, &step, &i, il, il);
                }
            }
        }
        check::<f32, f32>(&CONTIGUOUS, &Step::Contiguous, &f, fl, fl);
        check::<u32, u32>(&CONTIGUOUS, &Step::Contiguous, &u, ul, ul);
        check::<i64, i64>(&CONTIGUOUS, &Step::Contiguous, &i, il, il);
    }

    /// Each view the file's functions make of a tensor read permuted from a padded
    /// buffer (and reshapes of a row-major one at an offset), read through
    /// `contiguous`'s binding (as a view handed to a kernel that needs rows is),
    /// against the reference; a view's own binding refuses to run.
    #[test]
    fn views_read_what_the_reference_says() {
        let dims = [3, 1, 4, 5];
        let (p, pl) = view(&dims, &[3, 0, 1, 2], i64s);
        let cases = [
            (Step::Permute(vec![2, 0, 3, 1]), permute(&pl, &[2, 0, 3, 1])),
            (Step::Narrow(2, 1, 2), narrow(&pl, 2, 1, 2)),
            (Step::Unsqueeze(4), unsqueeze(&pl, 4)),
            (Step::Squeeze(1), squeeze(&pl, 1)),
            (
                Step::BroadcastAs(vec![2, 3, 3, 4, 5]),
                broadcast_as(&pl, &[2, 3, 3, 4, 5]),
            ),
            (
                Step::Reshape(vec![3, 4, 5]),
                reshape(&pl, &[3, 4, 5]).map(Option::unwrap),
            ),
        ];
        for (step, read) in cases {
            check::<i64, i64>(&CONTIGUOUS, &step, &p, pl, read.unwrap());
        }
        let r: Vec<u32> = (0..67).map(u32s).collect();
        let rl = Layout::contiguous(&[67]).narrow(0, 7, 60);
        for dims in [vec![3, 4, 5], vec![12, 5], vec![3, 1, 20]] {
            let read = reshape(&rl, &dims).unwrap().unwrap();
            check::<u32, u32>(&CONTIGUOUS, &Step::Reshape(dims), &r, rl, read);
        }
        let op = testing::op(OpKind::View, &[(DType::I64, pl)], (DType::I64, &dims));
        let mut out = [0i64; 60];
        let run = crate::ops::run(
            &op,
            &[Data::I64(&p)],
            None,
            DataMut::I64(&mut out),
            Par::serial(),
        );
        assert!(run.is_err_and(|e| e.0.contains("no kernel")));
    }
}
