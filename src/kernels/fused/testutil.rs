//! Helpers shared by the fused kernel's tests: every path this CPU runs, a run on
//! one path, and inputs with the special values.

use super::program::FusedProgram;
use super::run::{run_on, Path};
use crate::ir::{Layout, UnaryOp};
use crate::kernels::testutil::Rng;
use crate::kernels::Par;

/// Every path this CPU can run (whatever tier the environment forces: the tests hold
/// each path to the others).
pub(super) fn paths() -> Vec<Path> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v = vec![Path::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::cpu::{cpu_runs, Tier};
        if cpu_runs(Tier::Avx2) {
            v.push(Path::Avx2);
        }
        if cpu_runs(Tier::Avx512) {
            v.push(Path::Avx512);
        }
    }
    v
}

/// Runs `p` on `path` and returns its outputs.
pub(super) fn run(
    path: Path,
    p: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    par: Par,
) -> Vec<Vec<f32>> {
    let n = inputs[0].1.numel();
    let mut outs = vec![vec![0f32; n]; p.outputs.len()];
    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
    run_on(path, p, inputs, &[], &mut refs, n, par);
    outs
}

pub(super) fn affine_op(m: f64, c: f64) -> UnaryOp {
    UnaryOp::Affine {
        mul: m.to_bits(),
        add: c.to_bits(),
    }
}

/// Values that exercise the NaN, signed-zero and infinity rules, then random ones.
pub(super) fn specials(rng: &mut Rng, n: usize) -> Vec<f32> {
    let s = [
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        -f32::INFINITY,
    ];
    (0..n)
        .map(|i| {
            if i % 7 == 0 {
                s[(i / 7) % s.len()]
            } else {
                rng.f32() * 4.0
            }
        })
        .collect()
}

pub(super) fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    for (j, (x, y)) in a.iter().zip(b).enumerate() {
        for (i, (u, v)) in x.iter().zip(y).enumerate() {
            // A NaN's sign and payload are not specified by IEEE 754 for arithmetic
            // results and differ between vector widths (the vectorised `exp` and
            // its scalar remainder loop, say): any NaN matches any NaN.
            if u.is_nan() && v.is_nan() {
                continue;
            }
            assert_eq!(
                u.to_bits(),
                v.to_bits(),
                "{what}: output {j}[{i}]: {u} vs {v}"
            );
        }
    }
}
