//! `matmul`: `[.., m, k] x [.., k, n] -> [.., m, n]`, batch dims broadcast. A product
//! by a weight reads the weight's packed form; a product may head a chain.
//!
//! The file ends with its scalar reference (f64 sums by coordinates) and the unit test
//! that holds the kernel binding to it, bound each way the executors bind a product.

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

/// The file's scalar reference: the product of the dense `a` (`[.., m, k]`) and `b`
/// (`[.., k, n]`), their batch dims broadcast to those of `out`: each output element
/// the sum over `k` of the products read by coordinates, in f64.
#[cfg(test)]
fn reference(
    (a, a_dims): (&[f64], &[usize]),
    (b, b_dims): (&[f64], &[usize]),
    out: &[usize],
) -> Vec<f64> {
    use super::testing::flat;
    let (r, k) = (out.len(), a_dims[a_dims.len() - 1]);
    crate::kernels::testutil::indices(out)
        .into_iter()
        .map(|idx| {
            let (mut ai, mut bi) = (idx.clone(), idx);
            (0..k)
                .map(|p| {
                    (ai[r - 1], bi[r - 2]) = (p, p);
                    a[flat(&ai, a_dims)] * b[flat(&bi, b_dims)]
                })
                .sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::OpKind;
    use crate::kernels::testutil::gather;
    use crate::kernels::{PackedRhs, ProductPath};
    use crate::ops::testing::{self, assert_within, dense, run_op, view, PARS};
    use crate::ops::Data;

    /// Products through the binding, each bound every way the executors bind one:
    /// unplanned (op by op), planned by `gemm` on the right operand's elements, and
    /// planned on its packed form (a weight's, where this tier packs its dtype; a
    /// bf16 weight, row-major as `to_dtype` makes it, only that way). Operands are
    /// otherwise read transposed and padded, with batch dims broadcast (a 2-D weight
    /// under a batched left operand, a left operand of batch 1 under three right
    /// ones). Exact: the values are integers in [-3, 3], so every product and sum (at
    /// most 9 · 24 in size) is exact in f32 and bf16, in any order.
    #[test]
    fn the_binding_matches_the_reference_over_strided_and_broadcast_inputs() {
        type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a [usize], DType);
        let cases: [Case<'_>; 3] = [
            (
                &[2, 3, 20, 24],
                &[1, 0, 3, 2],
                &[24, 33],
                &[1, 0],
                DType::F32,
            ),
            (&[1, 17, 9], &[0, 2, 1], &[3, 9, 5], &[2, 0, 1], DType::F32),
            (&[2, 20, 24], &[1, 0, 2], &[24, 40], &[0, 1], DType::BF16),
        ];
        for (a_dims, a_order, b_dims, b_order, b_dtype) in cases {
            let (a, al) = view(a_dims, a_order, |i| ((i * 5) % 7) as f32 - 3.0);
            let (mut b, mut bl) = view(b_dims, b_order, |i| ((i * 3) % 7) as f32 - 3.0);
            if b_dtype != DType::F32 {
                // A weight kept in bf16 is a fresh row-major tensor (`to_dtype`'s).
                (b, bl) = (gather(&b, &bl), Layout::contiguous(b_dims));
            }
            let out = shape((a_dims, DType::F32), (b_dims, b_dtype)).unwrap();
            let op = testing::op(
                OpKind::MatMul,
                &[(DType::F32, al), (b_dtype, bl)],
                (DType::F32, &out),
            );
            let want = reference((&dense(&a, &al), a_dims), (&dense(&b, &bl), b_dims), &out);
            let (gemm, weight) = (plan(&op, false).unwrap(), plan(&op, true).unwrap());
            let packed = match b_dtype {
                DType::F32 => PackedRhs::pack(&b, &bl),
                dtype => Some(PackedRhs::pack_as(&b, &bl, dtype).unwrap()),
            };
            let mut bindings = Vec::new();
            if b_dtype == DType::F32 {
                bindings.push(None);
                bindings.push(Some(BoundProduct {
                    plan: &gemm,
                    packed: None,
                }));
            }
            if let (ProductPath::Packed(_), Some(p)) = (weight.path, &packed) {
                bindings.push(Some(BoundProduct {
                    plan: &weight,
                    packed: Some(p),
                }));
            }
            assert!(
                !bindings.is_empty(),
                "{b_dtype} weights are packed on every tier"
            );
            for bound in bindings {
                let how = bound.map_or("unplanned".into(), |b| b.plan.to_string());
                for par in PARS {
                    let got: Vec<f32> = run_op(&op, &[Data::F32(&a), Data::F32(&b)], bound, par);
                    let what = format_args!("{a_dims:?} x {b_dims:?} {b_dtype}, {how}, {par:?}");
                    assert_within(&got, &want, 0.0, 0.0, &what);
                }
            }
        }
    }
}
