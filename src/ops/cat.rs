//! `cat`: any number of inputs joined along one dim.

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
