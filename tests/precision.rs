//! Weights kept in reduced precision (`DType::BF16`, `DType::I8`): what `to_dtype`
//! makes, products by them alone and heading chains, against a float64 reference of the
//! same rounded operands, and the errors for every other use.

mod common;

use common::*;
use streamfuse::{DType, Tensor};

/// `x` rounded to the nearest bfloat16 (ties to even), as f64.
fn bf16(x: f64) -> f64 {
    let b = (x as f32).to_bits();
    f32::from_bits((b.wrapping_add(0x7fff + ((b >> 16) & 1))) & 0xffff_0000) as f64
}

/// The left operand of a product by bf16 weights as the tier in use multiplies it:
/// rounded to bf16 (AMX, `vdpbf16ps`, `bfmmla`, the portable loops), or kept in f32
/// by the tiles that widen the weights to f32 (the AVX2 tiers, AVX-512 without
/// AVX512_BF16, and aarch64 CPUs without the bf16 instructions).
fn bf16_left(x: &Ref) -> Ref {
    use streamfuse::cpu::{tier, Tier};
    use streamfuse::inspect::{has_arm_bf16, has_avx512_bf16, has_neon};
    let widens = match tier() {
        Tier::Avx2 | Tier::Avx2Vnni | Tier::Avx512 => true,
        // The avx512-vnni tier includes AVX512_BF16 where the CPU has it.
        Tier::Avx512Vnni => !has_avx512_bf16(),
        _ => has_neon() && !has_arm_bf16(),
    };
    if widens {
        x.clone()
    } else {
        x.map(bf16)
    }
}

/// Cosine similarity of two vectors.
fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn bf16_weights_hold_the_rounded_values() {
    let (w, rw) = rand_pair(&[40, 72], 1, -1.0, 1.0);
    let w16 = w.to_dtype(DType::BF16).unwrap();
    assert_eq!(w16.dtype(), DType::BF16);
    assert_eq!(w16.dims(), &[40, 72]);
    check_tol(&w16.to_dtype(DType::F32).unwrap(), &rw.map(bf16), 0.0, 0.0);
    // A transposed source converts as the matrix it reads.
    let wt16 = w.transpose(0, 1).unwrap().to_dtype(DType::BF16).unwrap();
    check_tol(
        &wt16.to_dtype(DType::F32).unwrap(),
        &rw.transpose(0, 1).map(bf16),
        0.0,
        0.0,
    );
    // Converting again is the identity, and a pending source is computed first.
    let again = w16
        .to_dtype(DType::F32)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    check_tol(
        &again.to_dtype(DType::F32).unwrap(),
        &rw.map(bf16),
        0.0,
        0.0,
    );
    let pending = w.add(&w).unwrap().to_dtype(DType::BF16).unwrap();
    check_tol(
        &pending.to_dtype(DType::F32).unwrap(),
        &rw.add(&rw).map(bf16),
        0.0,
        0.0,
    );
}

#[test]
fn products_by_bf16_weights_match_the_rounded_reference() {
    let (w, rw) = rand_pair(&[40, 72], 2, -1.0, 1.0);
    let w16 = w.to_dtype(DType::BF16).unwrap();
    let rw16 = rw.map(bf16);
    let (b, rb) = rand_pair(&[72], 3, -1.0, 1.0);
    for (i, rows) in [1usize, 3, 14, 28, 33, 200].into_iter().enumerate() {
        let (x, rx) = rand_pair(&[rows, 40], 10 + i as u64, -1.0, 1.0);
        let rx16 = bf16_left(&rx);
        check_tol(&x.matmul(&w16).unwrap(), &rx16.matmul(&rw16), 1e-5, 1e-5);
        // A chain: bias and GELU epilogue, then a layer norm.
        let y = x.matmul(&w16).unwrap().add(&b).unwrap().gelu().unwrap();
        check_tol(&y, &rx16.matmul(&rw16).add(&rb).gelu(), 1e-5, 1e-5);
        let (g, rg) = rand_pair(&[72], 4, 0.5, 1.5);
        let z = y.layer_norm(&g, &b, 1e-5).unwrap();
        let rz = rx16
            .matmul(&rw16)
            .add(&rb)
            .gelu()
            .layer_norm(&rg, &rb, 1e-5);
        check_tol(&z, &rz, 1e-4, 1e-4);
        // Batched left operands broadcast over the weight.
        let (x3, rx3) = rand_pair(&[2, rows, 40], 20 + i as u64, -1.0, 1.0);
        check_tol(
            &x3.matmul(&w16).unwrap(),
            &bf16_left(&rx3).matmul(&rw16),
            1e-5,
            1e-5,
        );
        // The accuracy contract against the f32 product: every row's cosine ≥ 0.9999.
        let got = read_f32(&x.matmul(&w16).unwrap());
        let want = rx.matmul(&rw);
        for r in 0..rows {
            let c = cosine(&got[r * 72..(r + 1) * 72], &want.data[r * 72..(r + 1) * 72]);
            assert!(c >= 0.9999, "row {r}: cosine {c}");
        }
    }
    // Shared by threads.
    std::thread::scope(|s| {
        for t in 0..4 {
            let (w16, rw16) = (&w16, &rw16);
            s.spawn(move || {
                let (x, rx) = rand_pair(&[9, 40], 80 + t, -1.0, 1.0);
                check_tol(
                    &x.matmul(w16).unwrap(),
                    &bf16_left(&rx).matmul(rw16),
                    1e-5,
                    1e-5,
                );
            });
        }
    });
}

#[test]
fn weights_in_reduced_precision_refuse_every_other_use() {
    let (w, _) = rand_pair(&[16, 24], 5, -1.0, 1.0);
    let w16 = w.to_dtype(DType::BF16).unwrap();
    let (x, _) = rand_pair(&[3, 16], 6, -1.0, 1.0);
    let e = assert_err_names(w16.add(&w16), "add");
    assert!(e.contains("bf16") && e.contains("weight"), "{e}");
    assert_err_names(w16.transpose(0, 1), "view");
    assert_err_names(w16.exp(), "exp");
    assert_err_names(w16.sum(0), "sum");
    // As a left operand, or a product of two weights.
    let e = assert_err_names(w16.transpose(0, 1).and_then(|t| t.matmul(&x)), "view");
    assert!(e.contains("bf16"), "{e}");
    let e = assert_err_names(w16.matmul(&w16), "matmul");
    assert!(e.contains("f32 left operand"), "{e}");
    // Not made by filling, not from a non-matrix, not from integers.
    let e = assert_err_names(Tensor::zeros(&[2, 2], DType::BF16), "zeros");
    assert!(e.contains("to_dtype"), "{e}");
    let (v, _) = rand_pair(&[2, 3, 4], 7, -1.0, 1.0);
    let e = assert_err_names(v.to_dtype(DType::BF16), "to_dtype");
    assert!(e.contains("[2, 3, 4]"), "{e}");
    let ints = Tensor::from_vec(vec![1u32, 2, 3, 4], &[2, 2]).unwrap();
    assert_err_names(ints.to_dtype(DType::BF16), "to_dtype");
    // Reading the elements takes a conversion.
    assert!(w16.to_vec::<f32>().is_err());
    assert_stream_usable();
}

/// The largest integer an I8 weight holds and the rows of `k` that share a scale:
/// 127 and all of them, or on the AVX2 tier 63 and 64 (7-bit weights in groups, see
/// `Tensor::to_dtype`).
fn int8_form(k: usize) -> (f32, usize) {
    match streamfuse::cpu::tier() {
        streamfuse::cpu::Tier::Avx2 => (63.0, 64),
        _ => (127.0, k),
    }
}

/// Each column's int8 values times its scale, as f64 (the weight an I8 tensor holds).
fn dequantised(w: &[f32], k: usize, n: usize) -> Vec<f64> {
    let (levels, group) = int8_form(k);
    let mut out = vec![0.0; k * n];
    for j in 0..n {
        for p0 in (0..k).step_by(group) {
            let rows = p0..(p0 + group).min(k);
            let max = rows.clone().fold(0.0f32, |m, p| m.max(w[p * n + j].abs()));
            let scale = max / levels;
            for p in rows {
                let q = if scale > 0.0 {
                    (w[p * n + j] / scale).round_ties_even()
                } else {
                    0.0
                };
                out[p * n + j] = q as f64 * scale as f64;
            }
        }
    }
    out
}

#[test]
fn int8_weights_hold_their_quantised_values_and_products_stay_close() {
    let (k, n) = (150, 72);
    let (w, rw) = rand_pair(&[k, n], 8, -1.0, 1.0);
    let w8 = w.to_dtype(DType::I8).unwrap();
    assert_eq!(w8.dtype(), DType::I8);
    let wd = dequantised(&rw.to_f32(), k, n);
    let got = read_f32(&w8.to_dtype(DType::F32).unwrap());
    for (g, d) in got.iter().zip(&wd) {
        assert!(
            (*g as f64 - d).abs() <= 1e-6 * (1.0 + d.abs()),
            "{g} vs {d}"
        );
    }
    let (b, rb) = rand_pair(&[n], 9, -1.0, 1.0);
    for (i, rows) in [1usize, 3, 14, 28, 33, 200].into_iter().enumerate() {
        let (x, rx) = rand_pair(&[rows, k], 30 + i as u64, -1.0, 1.0);
        // Each activation is off by at most half its row's step (max|x| / 254), so
        // an output by at most that times Σ|ŵ| over its column.
        let y = read_f32(&x.matmul(&w8).unwrap().add(&b).unwrap());
        let want = rx.matmul(&rw).add(&rb);
        for r in 0..rows {
            let xs = &rx.data[r * k..(r + 1) * k];
            let step = xs.iter().fold(0.0f64, |m, v| m.max(v.abs())) / 127.0;
            for j in 0..n {
                let exact: f64 = (0..k).map(|p| xs[p] * wd[p * n + j]).sum::<f64>() + rb.data[j];
                let col: f64 = (0..k).map(|p| wd[p * n + j].abs()).sum();
                let g = y[r * n + j] as f64;
                assert!(
                    (g - exact).abs() <= 0.5001 * step * col + 1e-5,
                    "row {r} col {j}"
                );
            }
            let c = cosine(&y[r * n..(r + 1) * n], &want.data[r * n..(r + 1) * n]);
            assert!(c >= 0.999, "row {r}: cosine {c} to the f32 product");
        }
    }
    // The same refusals as bf16.
    let e = assert_err_names(w8.add(&w8), "add");
    assert!(e.contains("i8"), "{e}");
    let (bad, _) = rand_pair(&[4, 4], 10, -1.0, 1.0);
    let inf = bad.affine(f64::INFINITY, 0.0).unwrap();
    assert_err_names(inf.to_dtype(DType::I8), "to_dtype");
    assert_stream_usable();
}
