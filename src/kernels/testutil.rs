//! Test helpers: a tiny deterministic RNG, random strided layouts over random buffers,
//! and a naive gather that reads a layout element by element (the reference every
//! kernel test compares against).

use crate::ir::{Element, Layout};

/// xorshift64*: deterministic, dependency-free randomness for tests.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `[-1, 1)`.
    pub(crate) fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(crate) fn dims(&mut self, rank: usize, max: usize) -> Vec<usize> {
        (0..rank).map(|_| 1 + self.below(max)).collect()
    }
}

/// Builds a buffer and a layout of `dims` over it that is, at random, permuted
/// (transposed), narrowed with padding and an offset, and broadcast (stride 0) along some
/// dims of size 1 that were grown. Values come from `value`.
pub(crate) fn random_layout<T: Element>(
    rng: &mut Rng,
    dims: &[usize],
    mut value: impl FnMut(&mut Rng) -> T,
) -> (Vec<T>, Layout) {
    let rank = dims.len();
    // Which dims are broadcast (stored with size 1).
    let bcast: Vec<bool> = dims.iter().map(|_| rng.below(5) == 0).collect();
    let pads: Vec<usize> = (0..rank)
        .map(|_| if rng.below(3) == 0 { rng.below(3) } else { 0 })
        .collect();
    let store: Vec<usize> = (0..rank)
        .map(|i| if bcast[i] { 1 } else { dims[i] + pads[i] })
        .collect();
    // A random storage order.
    let mut perm: Vec<usize> = (0..rank).collect();
    if rng.below(2) == 0 {
        for i in (1..rank).rev() {
            perm.swap(i, rng.below(i + 1));
        }
    }
    let mut strides = vec![0usize; rank];
    let mut acc = 1;
    for &p in perm.iter().rev() {
        strides[p] = acc;
        acc *= store[p];
    }
    let base = rng.below(4);
    let mut offset = base;
    for i in 0..rank {
        if !bcast[i] && pads[i] > 0 {
            offset += rng.below(pads[i] + 1) * strides[i];
        }
    }
    let len = base + acc + rng.below(3);
    let buf: Vec<T> = (0..len).map(|_| value(rng)).collect();
    let strides = (0..rank)
        .map(|i| if bcast[i] { 0 } else { strides[i] })
        .collect();
    let layout = Layout {
        dims: dims.into(),
        strides,
        offset,
    };
    assert!(layout.fits_in(buf.len()));
    (buf, layout)
}

/// Random f32 values in `[-1, 1)`.
pub(crate) fn rand_f32(rng: &mut Rng, dims: &[usize]) -> (Vec<f32>, Layout) {
    random_layout(rng, dims, |r| r.f32())
}

/// Every multi-index of `dims` in row-major order.
pub(crate) fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = dims.iter().product();
    (0..n)
        .map(|mut lin| {
            let mut idx = vec![0; dims.len()];
            for i in (0..dims.len()).rev() {
                idx[i] = lin % dims[i];
                lin /= dims[i];
            }
            idx
        })
        .collect()
}

/// The element at a multi-index, read the slow obvious way.
pub(crate) fn at<T: Copy>(buf: &[T], layout: &Layout, idx: &[usize]) -> T {
    let off: usize = layout.offset
        + idx
            .iter()
            .zip(&layout.strides)
            .map(|(i, s)| i * s)
            .sum::<usize>();
    buf[off]
}

/// The elements of a layout in row-major order, read one by one.
pub(crate) fn gather<T: Copy>(buf: &[T], layout: &Layout) -> Vec<T> {
    indices(&layout.dims)
        .iter()
        .map(|i| at(buf, layout, i))
        .collect()
}

/// Asserts two f32 slices agree to a relative-or-absolute tolerance.
/// Whether `got` and `want` hold the same values bit for bit (and as many).
pub(crate) fn same_bits(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

pub(crate) fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "element {i}: got {g}, want {w} (tol {tol})");
    }
}

/// Both thread settings every test runs with.
pub(crate) fn pars() -> [super::Par; 2] {
    [super::Par::serial(), super::Par { threads: 3 }]
}
