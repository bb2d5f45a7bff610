//! The quantisation of the activations, per row, inside the kernel: `sa = max_p |a[p]|
//! / 127`, `qa[p] = round(a[p] · 127 / max)` (ties to even, [`super::round_to_i8`]),
//! written into the chunk's scratch (`kp` bytes a row, the padding `qa = 0`) as signed
//! bytes, or shifted to u8 (`qa + 128`) for the AVX2 tile ([`Bytes`]), with the row's
//! scale and the sum of its quantised values (which takes the weight's shift off the
//! VNNI tiles' sums).
//!
//! A row holding a NaN or an infinity gets scale NaN (its outputs are NaN); an
//! all-zero row, or one so small that `127 / max` overflows f32 (every `|a| <
//! 127 / f32::MAX`, about 3.7e-37), scale 0 and zeros. Every path gives the same bytes,
//! scale and sum: [`slice`] here (the portable form, written to vectorise, and
//! compiled for AVX-512 by `avx512::quantize_slice`), `avx2::quantize_slice` (explicit
//! AVX2), and the element-by-element loop of a strided row; the tests hold them to it.

use super::{round_to_i8, Path};

/// How the scratch holds a quantised activation `qa`: the operand its tile takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bytes {
    /// `qa` as a signed byte.
    Signed,
    /// `qa + 128` as an unsigned byte (`qa ^ 0x80`): the u8 operand of AVX2's
    /// `vpmaddubsw` by `Narrow` weights.
    Unsigned,
}

impl Bytes {
    /// What `qa`'s signed byte is xored with.
    #[inline(always)]
    pub(super) fn mask(self) -> i8 {
        match self {
            Bytes::Signed => 0,
            Bytes::Unsigned => i8::MIN,
        }
    }
}

/// Quantises row `a[p * cs]`, `p < k`, into `out` (`kp` bytes, the padding `qa = 0`)
/// with `path`'s code, as `path`'s tile takes the bytes ([`Path::bytes`]), and
/// returns its scale and the sum of its quantised values.
pub(super) fn row(path: Path, a: &[f32], cs: usize, k: usize, out: &mut [i8]) -> (f32, i32) {
    let bytes = path.bytes();
    if cs == 1 {
        let row = &a[..k];
        #[cfg(target_arch = "x86_64")]
        match path {
            Path::Avx512 | Path::Avx512Vnni => {
                assert!(path.runs() && bytes == Bytes::Signed);
                // SAFETY: the CPU has AVX-512 F and BW (the path's tier; asserted).
                return unsafe { super::avx512::quantize_slice(row, out) };
            }
            Path::Avx2 | Path::Avx2Vnni => {
                assert!(path.runs());
                // SAFETY: the CPU has AVX2 (the path's tier; asserted).
                return unsafe { super::avx2::quantize_slice(row, out, bytes) };
            }
            Path::Portable | Path::NeonDotprod | Path::NeonI8mm => {}
        }
        return slice(row, out, bytes);
    }
    // A strided row (a transposed operand): the same arithmetic, element by element.
    let x = |p: usize| a[p * cs];
    let (mut max, mut bad) = (0.0f32, 0.0f32);
    for p in 0..k {
        let v = x(p).abs();
        max = if v > max { v } else { max };
        bad += x(p) * 0.0;
    }
    let inv = match factor(max, bad, out, bytes) {
        Ok(inv) => inv,
        Err(scale) => return (scale, 0),
    };
    let mut sum = 0i32;
    for (p, o) in out[..k].iter_mut().enumerate() {
        let q = round_to_i8(x(p) * inv);
        *o = q as i8 ^ bytes.mask();
        sum += q;
    }
    out[k..].fill(bytes.mask());
    (max / 127.0, sum)
}

/// The factor `127 / max` of a row whose largest magnitude is `max` and whose `bad`
/// (a sum of `x * 0`) is NaN when it holds a NaN or an infinity; or, when the row
/// quantises to zeros, `Err` with its scale (0 for an all-zero row or one whose factor
/// overflows, NaN for a non-finite one, so that its outputs are NaN), and `out`
/// filled with `qa = 0` as `bytes`. With a finite factor every `|a · 127 / max|` is at
/// most 127 (and a little): no NaN reaches the rounding.
#[inline(always)]
pub(super) fn factor(max: f32, bad: f32, out: &mut [i8], bytes: Bytes) -> Result<f32, f32> {
    if bad != 0.0 || !max.is_finite() {
        out.fill(bytes.mask());
        return Err(f32::NAN);
    }
    let inv = 127.0 / max;
    if max == 0.0 || !inv.is_finite() {
        out.fill(bytes.mask());
        return Err(0.0);
    }
    Ok(inv)
}

/// Quantises the contiguous `row` into `out` (`row.len()` rounded up to 4 bytes, the
/// padding `qa = 0`) as `bytes`; returns the scale and the sum of the quantised
/// values. Written to vectorise: 16 lanes of running maxima.
#[inline(always)]
pub(super) fn slice(row: &[f32], out: &mut [i8], bytes: Bytes) -> (f32, i32) {
    const L: usize = 16;
    let mut lanes = [0.0f32; L];
    let mut bad = [0.0f32; L];
    let chunks = row.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        let c: &[f32; L] = c.try_into().expect("chunks of L");
        for l in 0..L {
            let v = c[l].abs();
            lanes[l] = if v > lanes[l] { v } else { lanes[l] };
            bad[l] += c[l] * 0.0;
        }
    }
    for (l, &x) in tail.iter().enumerate() {
        let v = x.abs();
        lanes[l] = if v > lanes[l] { v } else { lanes[l] };
        bad[l] += x * 0.0;
    }
    let max = lanes.iter().fold(0.0f32, |m, &v| if v > m { v } else { m });
    let bad = bad.iter().sum::<f32>();
    let inv = match factor(max, bad, out, bytes) {
        Ok(inv) => inv,
        Err(scale) => return (scale, 0),
    };
    let mask = bytes.mask();
    let (body, pad) = out.split_at_mut(row.len());
    let mut sums = [0i32; L];
    let mut oc = body.chunks_exact_mut(L);
    let mut rc = row.chunks_exact(L);
    for (o, r) in (&mut oc).zip(&mut rc) {
        let o: &mut [i8; L] = o.try_into().expect("chunks of L");
        let r: &[f32; L] = r.try_into().expect("chunks of L");
        for l in 0..L {
            let q = round_to_i8(r[l] * inv);
            o[l] = q as i8 ^ mask;
            sums[l] += q;
        }
    }
    let mut sum: i32 = sums.iter().sum();
    for (o, &x) in oc.into_remainder().iter_mut().zip(rc.remainder()) {
        let q = round_to_i8(x * inv);
        *o = q as i8 ^ mask;
        sum += q;
    }
    pad.fill(mask);
    (max / 127.0, sum)
}

#[cfg(test)]
mod tests {
    use super::super::PATHS;
    use super::*;
    use crate::kernels::testutil::Rng;

    /// Quantises `row` on every path this CPU runs, contiguous and strided, and
    /// asserts the same scale (bits), sum and bytes (`qa`, taken back from the bytes
    /// of the path's tile), padding included; returns them.
    fn same_everywhere(row: &[f32]) -> (f32, i32, Vec<i8>) {
        let k = row.len();
        let kp = k.next_multiple_of(4);
        let run = |path: Path, cs: usize| {
            let spread: Vec<f32> = (0..k * cs)
                .map(|i| if i % cs == 0 { row[i / cs] } else { 9.0 })
                .collect();
            let mut out = vec![0x55i8; kp];
            let (s, sum) = super::row(path, &spread, cs, k, &mut out);
            let mask = path.bytes().mask();
            (s, sum, out.iter().map(|&b| b ^ mask).collect::<Vec<i8>>())
        };
        let want = run(Path::Portable, 1);
        let mut all = vec![];
        for path in PATHS.into_iter().filter(|p| p.runs()) {
            all.push((path_name(path), "contiguous", run(path, 1)));
            all.push((path_name(path), "strided", run(path, 3)));
        }
        for (path, what, got) in all {
            assert!(
                got.0.to_bits() == want.0.to_bits() && got.1 == want.1 && got.2 == want.2,
                "{path} {what}, k {k}: scale {} sum {} vs {} {}",
                got.0,
                got.1,
                want.0,
                want.1
            );
        }
        want
    }

    fn path_name(path: Path) -> &'static str {
        path.tier().name()
    }

    #[test]
    fn every_path_quantises_alike() {
        let mut rng = Rng::new(11);
        // Every length to 80 (each tail of the 8-, 16- and 32-element loops) and
        // MiniLM's, at scales from tiny to huge.
        for k in (0..=80).chain([383, 384, 1536]) {
            for scale in [1.0f32, 1e-30, 3e36] {
                let row: Vec<f32> = (0..k).map(|_| rng.f32() * scale).collect();
                let (s, sum, q) = same_everywhere(&row);
                if k > 0 {
                    let max = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    assert_eq!(s, max / 127.0);
                    assert_eq!(sum, q.iter().map(|&x| x as i32).sum::<i32>());
                    assert!(q.iter().any(|&x| x.abs() == 127));
                }
            }
        }
    }

    #[test]
    fn ties_round_to_even_and_odd_rows() {
        // max 127: the factor is 1, so each value is its own quotient; halves go to
        // the even neighbour, on every path.
        let mut row = vec![0.0f32; 40];
        let halves = [
            0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.49999, -3.50001,
        ];
        row[..halves.len()].copy_from_slice(&halves);
        row[39] = 127.0;
        let (s, _, q) = same_everywhere(&row);
        assert_eq!(s, 1.0);
        assert_eq!(&q[..halves.len()], &[0, 2, 2, 0, -2, -2, 126, -126, 3, -4]);
        // Zeros, non-finite values anywhere (body or tail), and a row too small for
        // its factor to be finite.
        for k in [5, 37] {
            let (s, sum, q) = same_everywhere(&vec![0.0; k]);
            assert!(s == 0.0 && sum == 0 && q.iter().all(|&x| x == 0));
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                for at in [0, k - 1] {
                    let mut row = vec![1.0; k];
                    row[at] = bad;
                    let (s, sum, q) = same_everywhere(&row);
                    assert!(s.is_nan() && sum == 0 && q.iter().all(|&x| x == 0));
                }
            }
            let mut tiny = vec![0.0; k];
            tiny[k / 2] = 1e-38;
            let (s, sum, q) = same_everywhere(&tiny);
            assert!(s == 0.0 && sum == 0 && q.iter().all(|&x| x == 0), "{s}");
        }
    }
}
