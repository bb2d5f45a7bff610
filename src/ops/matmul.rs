//! `matmul`: `[.., m, k] x [.., k, n] -> [.., m, n]`, batch dims broadcast. A product
//! by a weight reads the weight's packed form; a product may head a chain.

use super::{broadcast, dst, output, typed, BoundProduct, Family, FusionClass};
use crate::error::Error;
use crate::ir::{DType, Dims, Layout, Op};
use crate::kernels::{self, KernelError, ProductPlan, Rhs};

/// The output dims of `a.matmul(b)` (dims, dtype each): an f32 left operand and an
/// f32, bf16 or i8 right one, both of rank 2 or more, inner dims equal, batch dims
/// broadcast. The error names the op and the shapes.
pub(crate) fn shape(a: (&[usize], DType), b: (&[usize], DType)) -> crate::Result<Dims> {
    let op = "matmul";
    if a.1 != DType::F32 || !(b.1 == DType::F32 || b.1.is_weight_only()) {
        return Err(Error::DType {
            op,
            msg: format!(
                "needs an f32 left operand and an f32, bf16 or i8 right one, got {} and {}",
                a.1, b.1
            ),
        });
    }
    let (a, b) = (a.0, b.0);
    if a.len() < 2 || b.len() < 2 {
        return Err(Error::Shape {
            op,
            msg: format!("needs operands of rank 2 or more, got shapes {a:?} and {b:?}"),
        });
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return Err(Error::Shape {
            op,
            msg: format!(
                "inner dims differ: {a:?} x {b:?} ({k} columns on the left, {k2} rows on the right)"
            ),
        });
    }
    let mut dims = super::binary::broadcast_shape(&a[..a.len() - 2], &b[..b.len() - 2], op)
        .map_err(|_| Error::Shape {
            op,
            msg: format!("batch dims of {a:?} and {b:?} cannot be broadcast together"),
        })?;
    dims.push(m);
    dims.push(n);
    Ok(dims)
}

/// The registry entry of `matmul`.
pub(super) static FAMILY: Family = Family {
    name: "matmul",
    class: FusionClass::Product,
    work,
    run: |op, inputs, product, out, par| {
        let (l, r) = layouts(
            &op.inputs[0].layout,
            &op.inputs[1].layout,
            &output(op)?.layout.dims,
        )?;
        // Without a plan (the op-by-op executor): planned here, as a product by a
        // computed operand.
        let own;
        let (plan, rhs) = match product {
            Some(BoundProduct {
                plan,
                packed: Some(p),
            }) => (plan, Rhs::Packed(p)),
            Some(BoundProduct { plan, packed: None }) => (plan, Rhs::Elements(typed(inputs[1])?)),
            None => {
                own = ProductPlan::of(&l, &r, DType::F32, false);
                (&own, Rhs::Elements(typed(inputs[1])?))
            }
        };
        kernels::product(plan, typed(inputs[0])?, &l, rhs, &r, &[], dst(out)?, par)
    },
};

/// The plan of the product `op` (a matmul), whose right operand is a weight (made
/// before the segment) when `weight`: its path and split ([`ProductPlan::of`]); `None`
/// for an op that is not a product of a known output.
pub(crate) fn plan(op: &Op, weight: bool) -> Option<ProductPlan> {
    let ([a, b], Some(out)) = (op.inputs.as_slice(), op.output.as_ref()) else {
        return None;
    };
    let (l, r) = layouts(&a.layout, &b.layout, &out.layout.dims).ok()?;
    Some(ProductPlan::of(&l, &r, b.dtype, weight))
}

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
