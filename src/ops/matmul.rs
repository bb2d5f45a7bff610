//! `matmul`: `[.., m, k] x [.., k, n] -> [.., m, n]`, batch dims broadcast. A product
//! by a weight reads the weight's packed form; a product may head a chain.

use super::{broadcast, dst, output, typed, Family, FusionClass};
use crate::ir::{Dims, Layout, Op};
use crate::kernels::{self, KernelError};

/// The registry entry of `matmul`.
pub(super) static FAMILY: Family = Family {
    name: "matmul",
    class: FusionClass::Product,
    work,
    run: |op, inputs, packed, out, par| {
        let (l, r) = layouts(
            &op.inputs[0].layout,
            &op.inputs[1].layout,
            &output(op)?.layout.dims,
        )?;
        kernels::matmul_prepacked(
            typed(inputs[0])?,
            &l,
            typed(inputs[1])?,
            &r,
            packed,
            dst(out)?,
            par,
        )
    },
};

/// The output's element count times the inner dim.
fn work(op: &Op) -> usize {
    let n = super::per_output_element(op);
    let k = op
        .inputs
        .first()
        .and_then(|l| l.layout.dims.last().copied());
    n.saturating_mul(k.unwrap_or(1))
}

/// The operand layouts of a batched matmul with their batch dims broadcast to the
/// output's.
fn layouts(l: &Layout, r: &Layout, out_dims: &[usize]) -> Result<(Layout, Layout), KernelError> {
    let batch = &out_dims[..out_dims.len() - 2];
    let with_batch = |x: &Layout| {
        let mut dims = Dims::from_slice(batch);
        for &d in &x.dims[x.rank() - 2..] {
            dims.push(d);
        }
        broadcast(x, &dims)
    };
    Ok((with_batch(l)?, with_batch(r)?))
}
