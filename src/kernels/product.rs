//! A matrix product as its plan decided it: the path (a packed tile or `gemm`), the
//! split between threads, and whether the tile applies an epilogue.
//!
//! The plan builder decides each product once, when it builds the plan
//! ([`ProductPlan::of`], stored on the kernel it emits): a product whose right operand
//! is a weight (a segment input) that this tier packs goes by the weight's packed form
//! on the tier's tile ([`ProductPath::Packed`], naming the tile), any other by `gemm`;
//! the split is [`Split::of`] the product. At run time the executor only *binds* the
//! right operand ([`Rhs`]): the weight's packed form, which its buffer makes the
//! second time it is a right operand (`runtime/prepack.rs`: a one-off operand is never
//! copied), or, before that, its elements, and then the product runs by `gemm` with the
//! plan's split. [`product`] runs what it is bound to and checks that the binding
//! agrees with the plan; it decides nothing.

use std::fmt;

use super::matmul::matmul_split;
use super::packed::{matmul_packed_split, Epilogue, PackedRhs, Tile};
use super::par::Split;
use super::{error, KernelError, Par};
use crate::ir::{DType, Layout};

/// Smallest sides of a matrix worth packing: smaller products gain nothing from it.
const MIN_SIDE: usize = 16;

/// How one product runs, decided by the plan builder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProductPlan {
    /// By a packed form on a tile, or by `gemm`.
    pub(crate) path: ProductPath,
    /// How its work is shared between threads.
    pub(crate) split: Split,
}

/// Which code multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProductPath {
    /// The right operand's packed form, on this tile (a weight's, packed by its buffer:
    /// until it is, the product runs by `gemm` on its elements).
    Packed(Tile),
    /// `gemm` on the right operand's elements.
    Gemm,
}

/// The right operand as the executor binds it to a product.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rhs<'a> {
    /// Its packed form (the plan's path is `Packed`).
    Packed(&'a PackedRhs),
    /// Its elements, read through the product's right layout.
    Elements(&'a [f32]),
}

impl ProductPlan {
    /// The plan of the product `[b.., m, k] x [b.., k, n]` of operands read through
    /// `lhs` and `rhs` (batch dims broadcast to the output's), whose right operand is
    /// kept in `rhs_dtype` and is a weight (made before the segment) when `weight`:
    /// packed when it is a weight whose matrix is [`packable`] and the tier has a tile
    /// for its dtype, or whatever its sides when it is kept only packed (bf16, int8,
    /// bf16x3); by `gemm` otherwise.
    pub(crate) fn of(lhs: &Layout, rhs: &Layout, rhs_dtype: DType, weight: bool) -> ProductPlan {
        let tile = PackedRhs::tile(rhs_dtype)
            .filter(|_| weight && (rhs_dtype.is_weight_only() || packable(rhs)));
        ProductPlan::on(tile, lhs, rhs)
    }

    /// The plan of a direct call that has `packed`, the right operand's packed form,
    /// or not: packed on its tile whatever its sides (the caller packed it for this)
    /// when it packs `rhs` for this product, by `gemm` otherwise.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn with(lhs: &Layout, rhs: &Layout, packed: Option<&PackedRhs>) -> ProductPlan {
        let tile = packed
            .filter(|p| packs_for(p, lhs, rhs))
            .and_then(|p| PackedRhs::tile(p.dtype()));
        ProductPlan::on(tile, lhs, rhs)
    }

    /// The plan on `tile` (by `gemm` without one), split by [`Split::of`] the product
    /// of `lhs` and `rhs`.
    fn on(tile: Option<Tile>, lhs: &Layout, rhs: &Layout) -> ProductPlan {
        let r = lhs.dims.len();
        let batch: usize = lhs.dims[..r.saturating_sub(2)].iter().product();
        let dim = |l: &Layout, back: usize| l.dims.len().checked_sub(back).map_or(0, |i| l.dims[i]);
        ProductPlan {
            path: tile.map_or(ProductPath::Gemm, ProductPath::Packed),
            split: Split::of(batch, dim(lhs, 2), dim(rhs, 1), dim(lhs, 1)),
        }
    }

    /// Whether the tile applies a chain's epilogue to a product of `lhs` (the plan of
    /// a chain asks it once): a packed path whose tile takes one, one matrix (no batch
    /// dims), and a non-empty inner dim (with `k = 0` no tile runs).
    pub(crate) fn epilogue_in_tile(&self, lhs: &Layout) -> bool {
        matches!(self.path, ProductPath::Packed(t) if t.epilogue)
            && lhs.dims.len() == 2
            && lhs.dims[1] > 0
    }
}

impl fmt::Display for ProductPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path {
            ProductPath::Packed(t) => write!(f, "packed {} on {}", t.dtype, t.name)?,
            ProductPath::Gemm => f.write_str("gemm")?,
        }
        write!(f, ", {}", self.split.name())
    }
}

/// Whether a weight read through `layout` (as a product's right operand, batch dims
/// broadcast) is worth packing: a matrix of at least [`MIN_SIDE`] rows and columns,
/// the same for every batch (every batch stride 0).
pub(crate) fn packable(layout: &Layout) -> bool {
    let r = layout.dims.len();
    r >= 2
        && layout.dims[r - 2] >= MIN_SIDE
        && layout.dims[r - 1] >= MIN_SIDE
        && layout.strides[..r - 2].iter().all(|&s| s == 0)
}

/// Runs the product `plan` decided of `lhs` (through `lhs_layout`) by the right operand
/// bound as `rhs` (read through `rhs_layout`), followed by `epilogue` in the tile (only
/// where the plan put one: [`ProductPlan::epilogue_in_tile`]), into `dst`.
///
/// Errors name a binding that disagrees with the plan (a packed form for a `gemm`
/// path, or one that does not pack `rhs_layout`), an epilogue without a packed form to
/// apply it, and whatever the kernel refuses.
#[allow(clippy::too_many_arguments)]
pub(crate) fn product(
    plan: &ProductPlan,
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: Rhs<'_>,
    rhs_layout: &Layout,
    epilogue: Epilogue<'_>,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    match rhs {
        Rhs::Packed(p) => {
            let planned = matches!(plan.path, ProductPath::Packed(t) if t.dtype == p.dtype());
            if !planned || !packs_for(p, lhs_layout, rhs_layout) {
                return Err(error(
                    "matmul",
                    format_args!(
                        "a {} matrix packed for {:?} is bound to a product planned as \
                         {plan} reading {:?} (engine bug)",
                        p.dtype(),
                        p.dims(),
                        rhs_layout.dims
                    ),
                ));
            }
            matmul_packed_split(lhs, lhs_layout, p, plan.split, epilogue, dst, par)
        }
        Rhs::Elements(_) if !epilogue.is_empty() => Err(error(
            "matmul",
            "an epilogue is bound to a product by an unpacked operand (engine bug)",
        )),
        Rhs::Elements(r) => {
            matmul_split(lhs, lhs_layout, r, rhs_layout, Some(plan.split), dst, par)
        }
    }
}

/// Whether `packed` stands for the right operand `rhs_layout` of a product with
/// `lhs_layout` (the same batch dims, the matrix it packs).
fn packs_for(packed: &PackedRhs, lhs_layout: &Layout, rhs_layout: &Layout) -> bool {
    let (l, r) = (&lhs_layout.dims, &rhs_layout.dims);
    l.len() == r.len()
        && l.len() >= 2
        && l[..l.len() - 2] == r[..r.len() - 2]
        && packed.packs(rhs_layout)
}

/// The product of `lhs` by `rhs` (any strides, batch dims equal), reading the right
/// operand from `packed` (its packed form, when the caller has one) when that form
/// packs `rhs_layout`, through `gemm` otherwise: a product planned on the spot
/// ([`ProductPlan::of`]), for benchmarks and direct calls. When the packed form is
/// used, `rhs` is not read (a buffer kept only packed passes an empty slice).
#[cfg(any(test, feature = "internals"))]
#[allow(clippy::too_many_arguments)]
pub fn matmul_prepacked(
    lhs: &[f32],
    lhs_layout: &Layout,
    rhs: &[f32],
    rhs_layout: &Layout,
    packed: Option<&PackedRhs>,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let plan = ProductPlan::with(lhs_layout, rhs_layout, packed);
    let bound = match (plan.path, packed) {
        (ProductPath::Packed(_), Some(p)) => Rhs::Packed(p),
        _ => Rhs::Elements(rhs),
    };
    product(&plan, lhs, lhs_layout, bound, rhs_layout, &[], dst, par)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::*;

    /// The naive product, the reference.
    fn naive(a: &[f32], al: &Layout, b: &[f32], bl: &Layout) -> Vec<f32> {
        let (m, k, n) = (al.dims[0], al.dims[1], bl.dims[1]);
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        out
    }

    #[test]
    fn a_weight_is_packed_where_the_tier_has_a_tile_and_computed_operands_never() {
        let lhs = Layout::contiguous(&[40, 64]);
        let rhs = Layout::contiguous(&[64, 96]);
        let f32_tile = PackedRhs::tile(DType::F32);
        let plan = ProductPlan::of(&lhs, &rhs, DType::F32, true);
        assert_eq!(
            plan.path,
            f32_tile.map_or(ProductPath::Gemm, ProductPath::Packed)
        );
        // A computed right operand (`q · kᵀ`) is never packed.
        let plan = ProductPlan::of(&lhs, &rhs, DType::F32, false);
        assert_eq!(plan.path, ProductPath::Gemm);
        // Too small a side: gemm; a weight kept only packed: packed whatever its sides.
        let small = Layout::contiguous(&[64, 8]);
        assert_eq!(
            ProductPlan::of(&lhs, &small, DType::F32, true).path,
            ProductPath::Gemm
        );
        for dtype in [DType::BF16, DType::I8, DType::BF16X3] {
            let plan = ProductPlan::of(&lhs, &small, dtype, true);
            assert!(
                matches!(plan.path, ProductPath::Packed(t) if t.dtype == dtype),
                "{plan}"
            );
        }
        // A weight broadcast over a batch (stride 0) packs; one that differs per batch
        // does not.
        let lhs3 = Layout::contiguous(&[2, 40, 64]);
        let shared = Layout {
            dims: [2, 64, 96].as_slice().into(),
            strides: [0, 96, 1].as_slice().into(),
            offset: 0,
        };
        assert_eq!(
            ProductPlan::of(&lhs3, &shared, DType::F32, true).path,
            plan_path(f32_tile)
        );
        let own = Layout::contiguous(&[2, 64, 96]);
        assert_eq!(
            ProductPlan::of(&lhs3, &own, DType::F32, true).path,
            ProductPath::Gemm
        );
    }

    fn plan_path(tile: Option<Tile>) -> ProductPath {
        tile.map_or(ProductPath::Gemm, ProductPath::Packed)
    }

    #[test]
    fn the_split_is_the_one_rule_of_the_product() {
        let plan = |m: usize, n: usize, k: usize, b: usize| {
            let lhs = Layout::contiguous(&[b, m, k]);
            let rhs = Layout::contiguous(&[b, k, n]);
            ProductPlan::of(&lhs, &rhs, DType::F32, false).split
        };
        assert_eq!(plan(2, 2, 2, 1), Split::Serial);
        assert_eq!(plan(2, 2, 2, 8), Split::Batch);
        assert_eq!(plan(4, 256, 256, 1), Split::Columns);
        assert_eq!(plan(400, 256, 256, 1), Split::Rows);
        assert_eq!(plan(4, 16, 4096, 1), Split::Rows);
    }

    #[test]
    fn a_binding_that_disagrees_with_the_plan_is_an_error() {
        let mut rng = Rng::new(5);
        let (m, k, n) = (3, 32, 48);
        let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
        let (al, bl) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
        let packed = PackedRhs::pack_bf16(&b, &bl).unwrap();
        let gemm = ProductPlan::of(&al, &bl, DType::F32, false);
        let bf16 = ProductPlan::of(&al, &bl, DType::BF16, true);
        let mut out = vec![0.0; m * n];
        let mut run = |plan: &ProductPlan, rhs: Rhs<'_>, rl: &Layout, steps: Epilogue<'_>| {
            product(plan, &a, &al, rhs, rl, steps, &mut out, Par::serial())
        };
        let e = run(&gemm, Rhs::Packed(&packed), &bl, &[]);
        assert!(e.unwrap_err().0.contains("engine bug"));
        let step = [crate::kernels::packed::Step::Gelu];
        let e = run(&gemm, Rhs::Elements(&b), &bl, &step);
        assert!(e.unwrap_err().0.contains("epilogue"));
        // The packed form of another matrix.
        let other = Layout::contiguous(&[k, n - 1]);
        assert!(run(&bf16, Rhs::Packed(&packed), &other, &[]).is_err());
        // What agrees runs: the plan's packed path, or its gemm fallback.
        run(&bf16, Rhs::Packed(&packed), &bl, &[]).unwrap();
        run(&bf16, Rhs::Elements(&b), &bl, &[]).unwrap();
        assert_close(&out, &naive(&a, &al, &b, &bl), 1e-5);
    }
}
