//! Ops that move or reinterpret elements: `to_dtype` (cast), `contiguous` (a copy into
//! a fresh row-major buffer) and views (a new layout over the same buffer, no kernel).

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
