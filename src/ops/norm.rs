//! Normalisations over the last dim: `softmax`, `layer_norm`, `rms_norm`. Each may end
//! a chain (a product and its epilogue), else runs as its own kernel.
//!
//! The file ends with its scalar reference (each row's statistics in f64) and the unit
//! test that holds the kernel binding to it on strided x and parameters.

use super::{dst, per_output_element, typed, Family, FusionClass};
use crate::error::{Error, Result};
use crate::ir::{DType, Dims, OpKind};
use crate::kernels::{self, KernelError};

/// Checks softmax's input (over a dim the `Tensor` method has resolved, and moves last
/// by transposing around the op): f32. The error names the dtype and the shape.
pub(crate) fn softmax_shape(x: (&[usize], DType)) -> Result<()> {
    f32_only("softmax", x.0, x.1)
}

/// `Ok` for an f32 operand; the error names `op`, the dtype and the shape.
fn f32_only(op: &'static str, dims: &[usize], dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 => Ok(()),
        _ => Err(Error::DType {
            op,
            msg: format!("needs an f32 tensor, got {dtype} with shape {dims:?}"),
        }),
    }
}

/// The output dims of the norm `op` (`layer_norm`, `rms_norm`) of `x` with its
/// per-feature `params` (name, dims, dtype: `weight`, and `bias` for layer norm): x
/// f32 of rank 1 or more, each parameter f32 `[n]` with `n` x's last dim. The error
/// names the op and the shapes.
pub(crate) fn shape(
    op: &'static str,
    x: (&[usize], DType),
    params: &[(&str, &[usize], DType)],
) -> Result<Dims> {
    f32_only(op, x.0, x.1)?;
    let Some(&n) = x.0.last() else {
        return Err(Error::Shape {
            op,
            msg: "needs a tensor of rank 1 or more, got a scalar".into(),
        });
    };
    for &(name, dims, dtype) in params {
        f32_only(op, dims, dtype)?;
        if dims != [n] {
            return Err(Error::Shape {
                op,
                msg: format!(
                    "{name} has shape {dims:?} but the input {:?} needs [{n}] (its last dim)",
                    x.0
                ),
            });
        }
    }
    Ok(Dims::from_slice(x.0))
}

/// The registry entry of the row normalisations.
pub(super) static FAMILY: Family = Family {
    name: "norm",
    class: FusionClass::RowNorm,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        let lay = |i: usize| &op.inputs[i].layout;
        match op.kind {
            OpKind::Softmax => kernels::softmax(typed(inputs[0])?, lay(0), dst(out)?, par),
            OpKind::LayerNorm { eps } => kernels::layer_norm(
                typed(inputs[0])?,
                lay(0),
                typed(inputs[1])?,
                lay(1),
                typed(inputs[2])?,
                lay(2),
                f64::from_bits(eps),
                dst(out)?,
                par,
            ),
            OpKind::RmsNorm { eps } => kernels::rms_norm(
                typed(inputs[0])?,
                lay(0),
                typed(inputs[1])?,
                lay(1),
                f64::from_bits(eps),
                dst(out)?,
                par,
            ),
            _ => Err(KernelError(format!("{op} is not a norm (engine bug)"))),
        }
    },
};

/// The file's scalar reference: the norm `kind` of each row (the last `n` elements) of
/// the dense `x`, in f64: softmax `e^(x − max) / Σ e^(x − max)`; layer norm
/// `(x − mean) / √(var + eps) · w + b` with the biased variance (the mean of the
/// squared deviations); RMS norm `x / √(mean(x²) + eps) · w`.
#[cfg(test)]
fn reference(kind: &OpKind, x: &[f64], n: usize, w: &[f64], b: &[f64]) -> Vec<f64> {
    let mean = |v: &mut dyn Iterator<Item = f64>| v.sum::<f64>() / n as f64;
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(n) {
        match *kind {
            OpKind::Softmax => {
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = row.iter().map(|&v| (v - max).exp()).sum();
                out.extend(row.iter().map(|&v| (v - max).exp() / sum));
            }
            OpKind::LayerNorm { eps } => {
                let mu = mean(&mut row.iter().copied());
                let var = mean(&mut row.iter().map(|&v| (v - mu) * (v - mu)));
                let r = 1.0 / (var + f64::from_bits(eps)).sqrt();
                out.extend((0..n).map(|j| (row[j] - mu) * r * w[j] + b[j]));
            }
            OpKind::RmsNorm { eps } => {
                let ms = mean(&mut row.iter().map(|&v| v * v));
                let r = 1.0 / (ms + f64::from_bits(eps)).sqrt();
                out.extend((0..n).map(|j| row[j] * r * w[j]));
            }
            _ => unreachable!("not a norm: {kind:?}"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Layout;
    use crate::ops::testing::{self, assert_within, dense, run_op, view, PARS};
    use crate::ops::Data;

    /// A 1-D parameter of `n` values read with stride 3 at an offset (row 1 of a
    /// transposed `[2, n]` view), and its values.
    fn param(n: usize, value: impl Fn(usize) -> f32) -> (Vec<f32>, Layout, Vec<f64>) {
        let (buf, l) = view(&[2, n], &[1, 0], value);
        let l = l.narrow(0, 1, 1).squeeze(0);
        assert_eq!(l.strides(), [3]);
        let values = dense(&buf, &l);
        (buf, l, values)
    }

    /// Softmax, layer norm and RMS norm through the binding, on rows of 37 (a vector
    /// head and a scalar tail on every tier) of x read transposed from a padded buffer,
    /// broadcast along a dim, and in padded rows at an offset, with strided parameters,
    /// against the reference. The bound is 4e-6 relative plus 4e-6 absolute: the rows'
    /// statistics are f32 sums of 37 terms on several accumulators (each rounding
    /// 6e-8 relative of a partial sum), and exp is within 2 ulp; outputs are at most
    /// about 5 in size, so a wrong element, row or parameter is off by far more.
    #[test]
    fn the_binding_matches_the_reference_over_strided_and_broadcast_inputs() {
        let n = 37;
        let x = |i: usize| ((i as f64 * 0.377).sin() * 3.0) as f32;
        let (w, wl, wv) = param(n, |i| 1.0 + ((i as f64 * 0.91).cos() * 0.5) as f32);
        let (b, bl, bv) = param(n, |i| ((i as f64 * 1.3).sin()) as f32);
        let eps = 1e-5f64.to_bits();
        let kinds = [
            OpKind::Softmax,
            OpKind::LayerNorm { eps },
            OpKind::RmsNorm { eps },
        ];
        let (xt, tl) = view(&[4, 3, n], &[2, 0, 1], x);
        let (xb, bcl) = view(&[4, 1, n], &[0, 1, 2], x);
        let (xc, cl) = view(&[4, 3, n], &[0, 1, 2], x);
        let bcl = bcl.broadcast_as(&[4, 3, n]).unwrap();
        for (buf, layout) in [(&xt, tl), (&xb, bcl), (&xc, cl)] {
            let dims = layout.dims();
            for kind in &kinds {
                let mut inputs = vec![(DType::F32, layout)];
                let mut data = vec![Data::F32(buf)];
                let params = match kind {
                    OpKind::Softmax => 0,
                    OpKind::LayerNorm { .. } => 2,
                    _ => 1,
                };
                for (p, pl) in [(&w, wl), (&b, bl)].into_iter().take(params) {
                    inputs.push((DType::F32, pl));
                    data.push(Data::F32(p));
                }
                let op = testing::op(kind.clone(), &inputs, (DType::F32, dims));
                let want = reference(kind, &dense(buf, &layout), n, &wv, &bv);
                for par in PARS {
                    let got: Vec<f32> = run_op(&op, &data, None, par);
                    let what = format_args!("{kind:?} {layout:?} {par:?}");
                    assert_within(&got, &want, 4e-6, 4e-6, &what);
                }
            }
        }
    }
}
