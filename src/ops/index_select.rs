//! `index_select`: rows of one dim of a source picked by 1-D u32 or i64 indices.
//!
//! The file ends with its scalar reference (a gather by coordinates) and the unit test
//! that holds the kernel binding to it, for f32, u32 and i64 by u32 and i64 indices.

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Dims, OpKind};
use crate::kernels::{self, KernelError};

/// Index values known when the op is recorded (already computed), so a bad one is an
/// error at once rather than when the kernel runs.
pub(crate) enum Known {
    /// u32 indices.
    U32(Vec<u32>),
    /// i64 indices.
    I64(Vec<i64>),
}

/// The output dims of `index_select` over dim `d` (resolved) of a source of `dims`, by
/// `indices` (dims, dtype): 1-D u32 or i64 indices, each (when `known` gives their
/// values, asked only once the rest holds) within the dim; the dim's size becomes the
/// number of indices. Errors name the problem, the index and its position.
pub(crate) fn shape(
    dims: &[usize],
    d: usize,
    indices: (&[usize], DType),
    known: impl FnOnce() -> Option<Known>,
) -> crate::Result<Dims> {
    let op = "index_select";
    if !matches!(indices.1, DType::U32 | DType::I64) {
        return Err(Error::DType {
            op,
            msg: format!("indices must be u32 or i64, got {}", indices.1),
        });
    }
    if indices.0.len() != 1 {
        return Err(Error::Shape {
            op,
            msg: format!("indices must be 1-D, got shape {:?}", indices.0),
        });
    }
    let size = dims[d];
    let bad = match known() {
        Some(Known::U32(v)) => v
            .iter()
            .position(|&i| i as usize >= size)
            .map(|p| (p, i64::from(v[p]))),
        Some(Known::I64(v)) => v
            .iter()
            .position(|&i| i < 0 || i as u64 >= size as u64)
            .map(|p| (p, v[p])),
        None => None,
    };
    if let Some((pos, value)) = bad {
        return Err(Error::Arg {
            op,
            msg: format!(
                "index {value} at position {pos} is out of range for dim {d} of size {size} (shape {dims:?})"
            ),
        });
    }
    let mut out = Dims::from_slice(dims);
    out[d] = indices.0[0];
    Ok(out)
}

/// The registry entry of `index_select`.
pub(super) static FAMILY: Family = Family {
    name: "index_select",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::IndexSelect { dim } = op.kind else {
            return Err(KernelError(format!(
                "{op} is not index_select (engine bug)"
            )));
        };
        with_dtype!(output(op)?.dtype, T => {
            with_dtype!(op.inputs[1].dtype, I => kernels::index_select::<T, I>(
                typed(inputs[0])?,
                &op.inputs[0].layout,
                typed(inputs[1])?,
                &op.inputs[1].layout,
                dim,
                dst(out)?,
                par,
            ))
        })
    },
};

/// The file's scalar reference: the elements of the dense `src` (of `dims`) that
/// `indices` pick along `dim`, in row-major order of the output (`dims` with
/// `dims[dim]` the number of indices): output `[.., i, ..]` is `src[.., indices[i], ..]`,
/// read by coordinates.
#[cfg(test)]
fn reference(src: &[f64], dims: &[usize], dim: usize, indices: &[f64]) -> Vec<f64> {
    let mut out = dims.to_vec();
    out[dim] = indices.len();
    crate::kernels::testutil::indices(&out)
        .into_iter()
        .map(|mut idx| {
            idx[dim] = indices[idx[dim]] as usize;
            src[super::testing::flat(&idx, dims)]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Layout;
    use crate::ops::testing::{self, assert_within, dense, run_op, view, Elem, PARS};

    /// Gathers of `T` elements by `I` indices through the binding, along each dim of
    /// a source `[5, 4, 6]` read permuted from a padded buffer and of one `[5, 1, 6]`
    /// broadcast to it, by indices read with stride 2 at an offset (repeated, out of
    /// order), against the reference, exactly (a gather only copies).
    fn check<T: Elem, I: Elem>(value: impl Fn(usize) -> T, index: impl Fn(usize) -> I) {
        let dims = [5, 4, 6];
        let (a, al) = view(&dims, &[1, 2, 0], &value);
        let (b, bl) = view(&[5, 1, 6], &[2, 0, 1], &value);
        let picks = [3usize, 0, 3, 1, 2, 0, 3];
        for (src, layout) in [(&a, al), (&b, bl.broadcast_as(&dims).unwrap())] {
            for dim in 0..3 {
                // The picks within the dim, every other element of the buffer.
                let chosen: Vec<usize> = picks.iter().map(|&p| p % dims[dim]).collect();
                let idx: Vec<I> = chosen.iter().flat_map(|&p| [index(99), index(p)]).collect();
                let il = Layout::contiguous(&[chosen.len(), 2])
                    .narrow(1, 1, 1)
                    .squeeze(1);
                let out = shape(&dims, dim, (il.dims(), I::DTYPE), || None).unwrap();
                let kind = OpKind::IndexSelect { dim };
                let op = testing::op(
                    kind,
                    &[(T::DTYPE, layout), (I::DTYPE, il)],
                    (T::DTYPE, &out),
                );
                let want = reference(&dense(src, &layout), &dims, dim, &dense(&idx, &il));
                for par in PARS {
                    let got: Vec<T> = run_op(&op, &[T::data(src), I::data(&idx)], None, par);
                    let what = format_args!("{} by {} over {dim} {par:?}", T::DTYPE, I::DTYPE);
                    assert_within(&got, &want, 0.0, 0.0, &what);
                }
            }
        }
    }

    #[test]
    fn the_binding_matches_the_reference_over_strided_and_broadcast_inputs() {
        check(|i| (i as f32 * 0.37).sin(), |p| p as u32);
        check(|i| (i as f32 * 0.37).sin(), |p| p as i64);
        check(|i| (i as u32).wrapping_mul(2_654_435_761), |p| p as i64);
        check(|i| i as i64 * -1_234_567_891, |p| p as u32);
    }
}
