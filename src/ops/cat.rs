//! `cat`: any number of inputs joined along one dim.
//!
//! The file ends with its scalar reference (the parts joined by coordinates) and the
//! unit test that holds the kernel binding to it, for f32, u32 and i64.

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Dims, OpKind};
use crate::kernels::{self, KernelError};

/// The output dims of `cat` of `parts` (dims, dtype each, in order) along dim `d`
/// (already resolved against the first part's rank): at least one part, all of one
/// dtype and rank, equal outside `d`, whose sizes add up. The error names the op, the
/// part and the shapes.
pub(crate) fn shape<'a>(
    parts: impl IntoIterator<Item = (&'a [usize], DType)>,
    d: usize,
) -> crate::Result<Dims> {
    let op = "cat";
    let mut parts = parts.into_iter();
    let Some((first, dtype)) = parts.next() else {
        return Err(Error::Arg {
            op,
            msg: "needs at least one tensor".into(),
        });
    };
    let mut dims = Dims::from_slice(first);
    for (i, (t, t_dtype)) in parts.enumerate().map(|(i, p)| (i + 1, p)) {
        if t_dtype != dtype {
            return Err(Error::DType {
                op,
                msg: format!("tensor {i} is {t_dtype} but tensor 0 is {dtype}"),
            });
        }
        let same = t.len() == first.len()
            && t.iter()
                .zip(first)
                .enumerate()
                .all(|(j, (a, b))| j == d || a == b);
        if !same {
            return Err(Error::Shape {
                op,
                msg: format!(
                    "tensor {i} has shape {t:?}, which does not match {first:?} outside dim {d}"
                ),
            });
        }
        dims[d] = dims[d].checked_add(t[d]).ok_or_else(|| Error::Shape {
            op,
            msg: format!("joined dim {d} overflows"),
        })?;
    }
    Ok(dims)
}

/// The registry entry of `cat`.
pub(super) static FAMILY: Family = Family {
    name: "cat",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let OpKind::Cat { dim } = op.kind else {
            return Err(KernelError(format!("{op} is not cat (engine bug)")));
        };
        with_dtype!(output(op)?.dtype, T => {
            let srcs = inputs
                .iter()
                .zip(&op.inputs)
                .map(|(x, d)| Ok((typed::<T>(*x)?, &d.layout)))
                .collect::<Result<Vec<_>, KernelError>>()?;
            kernels::cat::<T>(&srcs, dim, dst(out)?, par)
        })
    },
};

/// The file's scalar reference: the dense `parts` (values and dims each) joined along
/// `dim`, in row-major order of the result: output `[.., i, ..]` is element
/// `[.., i − (the sizes of the parts before), ..]` of the part `i` falls in, read by
/// coordinates.
#[cfg(test)]
fn reference(parts: &[(Vec<f64>, Vec<usize>)], dim: usize) -> Vec<f64> {
    let mut out = parts[0].1.clone();
    out[dim] = parts.iter().map(|p| p.1[dim]).sum();
    crate::kernels::testutil::indices(&out)
        .into_iter()
        .map(|mut idx| {
            for (values, dims) in parts {
                if idx[dim] < dims[dim] {
                    return values[super::testing::flat(&idx, dims)];
                }
                idx[dim] -= dims[dim];
            }
            unreachable!("the sizes add up to the output's")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Layout;
    use crate::ops::testing::{self, assert_within, dense, run_op, view, Elem, PARS};

    /// `cat` of `T` through the binding along each dim of four parts of `[3, 4, 5]`
    /// but along that dim, of sizes 2, 1, 0 and 3 there: one read permuted from a
    /// padded buffer, one broadcast along the next dim, an empty one, one in row-major
    /// order with padded rows at an offset; against the reference, exactly (cat only
    /// copies).
    fn check<T: Elem>(value: impl Fn(usize) -> T) {
        for dim in 0..3 {
            let part = |size: usize, order: &[usize], seed: usize| {
                let mut dims = vec![3, 4, 5];
                dims[dim] = size;
                view(&dims, order, |i| value(i + seed))
            };
            // Size 1 along `dim` and broadcast along the dim after it.
            let bcast = {
                let mut dims = [3, 4, 5];
                dims[dim] = 1;
                let mut small = dims;
                small[(dim + 1) % 3] = 1;
                let (buf, l) = view(&small, &[2, 1, 0], |i| value(i + 40));
                (buf, l.broadcast_as(&dims).unwrap())
            };
            let parts: [(Vec<T>, Layout); 4] = [
                part(2, &[2, 0, 1], 0),
                bcast,
                part(0, &[1, 0, 2], 80),
                part(3, &[0, 1, 2], 120),
            ];
            let inputs: Vec<(DType, Layout)> = parts.iter().map(|p| (T::DTYPE, p.1)).collect();
            let out = shape(parts.iter().map(|p| (p.1.dims(), T::DTYPE)), dim).unwrap();
            let op = testing::op(OpKind::Cat { dim }, &inputs, (T::DTYPE, &out));
            let dense_parts: Vec<(Vec<f64>, Vec<usize>)> = parts
                .iter()
                .map(|(buf, l)| (dense(buf, l), l.dims().to_vec()))
                .collect();
            let want = reference(&dense_parts, dim);
            let data: Vec<_> = parts.iter().map(|p| T::data(&p.0)).collect();
            for par in PARS {
                let got: Vec<T> = run_op(&op, &data, None, par);
                let what = format_args!("{} along {dim} {par:?}", T::DTYPE);
                assert_within(&got, &want, 0.0, 0.0, &what);
            }
        }
    }

    #[test]
    fn the_binding_matches_the_reference_over_strided_and_broadcast_inputs() {
        check(|i| (i as f32 * 0.37).sin());
        check(|i| (i as u32).wrapping_mul(2_654_435_761));
        check(|i| i as i64 * -1_234_567_891);
    }
}
