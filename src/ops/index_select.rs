//! `index_select`: rows of one dim of a source picked by 1-D u32 or i64 indices.

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
