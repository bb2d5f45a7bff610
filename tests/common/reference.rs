//! A naive, obviously-correct reference tensor in `f64`.
//!
//! Everything here is written the straightforward way: nested index loops over
//! row-major data, no strides, no views, no fusion. It knows nothing of streamfuse; the
//! tests compare the library against it.

use std::f64::consts::PI;

/// A dense row-major tensor of `f64`.
#[derive(Clone, Debug, PartialEq)]
pub struct Ref {
    pub dims: Vec<usize>,
    pub data: Vec<f64>,
}

// ---------------------------------------------------------------------------------
// index helpers
// ---------------------------------------------------------------------------------

/// Number of elements of a tensor with these dims (1 for rank 0).
pub fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row-major strides.
pub fn strides_of(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len()).rev() {
        if i + 1 < dims.len() {
            s[i] = s[i + 1] * dims[i + 1];
        }
    }
    s
}

/// Flat position -> multi-index.
pub fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0usize; dims.len()];
    for i in (0..dims.len()).rev() {
        idx[i] = flat % dims[i];
        flat /= dims[i];
    }
    idx
}

/// Multi-index -> flat position.
pub fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    assert_eq!(idx.len(), dims.len());
    let mut flat = 0usize;
    for i in 0..dims.len() {
        assert!(idx[i] < dims[i], "index {idx:?} out of {dims:?}");
        flat = flat * dims[i] + idx[i];
    }
    flat
}

/// Numpy broadcasting of two shapes, `None` when incompatible.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0usize; r];
    for i in 0..r {
        // i counts from the right
        let da = if i < a.len() { a[a.len() - 1 - i] } else { 1 };
        let db = if i < b.len() { b[b.len() - 1 - i] } else { 1 };
        let d = if da == db {
            da
        } else if da == 1 {
            db
        } else if db == 1 {
            da
        } else {
            return None;
        };
        out[r - 1 - i] = d;
    }
    Some(out)
}

/// Normalise a possibly negative dim against `rank` (panics when out of range).
pub fn norm_dim(dim: isize, rank: usize) -> usize {
    let d = if dim < 0 { dim + rank as isize } else { dim };
    assert!(
        d >= 0 && (d as usize) < rank,
        "dim {dim} out of range for rank {rank}"
    );
    d as usize
}

// ---------------------------------------------------------------------------------
// scalar functions
// ---------------------------------------------------------------------------------

/// erf(x) to close to f64 precision.
///
/// Uses the everywhere-convergent series with positive terms only
/// `erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n 2^n x^(2n+1) / (1*3*...*(2n+1))`,
/// and `erf(x) = sign(x)` for |x| >= 6 (erfc(6) ~ 2e-17).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return -erf(-x);
    }
    if x >= 6.0 {
        return 1.0;
    }
    let x2 = x * x;
    let mut term = x; // n = 0: x / 1
    let mut sum = x;
    let mut n = 0u32;
    loop {
        n += 1;
        term *= 2.0 * x2 / (2.0 * n as f64 + 1.0);
        sum += term;
        if term < sum * 1e-18 || n > 500 {
            break;
        }
    }
    2.0 / PI.sqrt() * (-x2).exp() * sum
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
}

pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

pub fn relu(x: f64) -> f64 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}

/// max with NaN propagation.
pub fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a >= b {
        a
    } else {
        b
    }
}

/// min with NaN propagation.
pub fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a <= b {
        a
    } else {
        b
    }
}

// ---------------------------------------------------------------------------------
// the reference tensor
// ---------------------------------------------------------------------------------

impl Ref {
    pub fn new(data: Vec<f64>, dims: &[usize]) -> Ref {
        assert_eq!(
            data.len(),
            numel(dims),
            "Ref::new: {} values for {dims:?}",
            data.len()
        );
        Ref {
            dims: dims.to_vec(),
            data,
        }
    }

    pub fn from_f32(data: &[f32], dims: &[usize]) -> Ref {
        Ref::new(data.iter().map(|&v| v as f64).collect(), dims)
    }

    pub fn full(value: f64, dims: &[usize]) -> Ref {
        Ref::new(vec![value; numel(dims)], dims)
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.dims)
    }

    pub fn at(&self, idx: &[usize]) -> f64 {
        self.data[ravel(idx, &self.dims)]
    }

    pub fn to_f32(&self) -> Vec<f32> {
        self.data.iter().map(|&v| v as f32).collect()
    }

    /// Values rounded to f32 and back (what the library sees as input).
    pub fn round_f32(&self) -> Ref {
        self.map(|v| v as f32 as f64)
    }

    // ----- element-wise -----------------------------------------------------------

    pub fn map(&self, f: impl Fn(f64) -> f64) -> Ref {
        Ref::new(self.data.iter().map(|&v| f(v)).collect(), &self.dims)
    }

    /// The materialised numpy `broadcast_to`.
    pub fn broadcast_as(&self, dims: &[usize]) -> Ref {
        assert!(
            dims.len() >= self.rank(),
            "broadcast_as: rank {:?} -> {dims:?}",
            self.dims
        );
        let lead = dims.len() - self.rank();
        for i in 0..self.rank() {
            assert!(
                self.dims[i] == dims[lead + i] || self.dims[i] == 1,
                "broadcast_as: {:?} -> {dims:?}",
                self.dims
            );
        }
        let mut out = Vec::with_capacity(numel(dims));
        for flat in 0..numel(dims) {
            let oi = unravel(flat, dims);
            let mut si = vec![0usize; self.rank()];
            for i in 0..self.rank() {
                si[i] = if self.dims[i] == 1 { 0 } else { oi[lead + i] };
            }
            out.push(self.at(&si));
        }
        Ref::new(out, dims)
    }

    /// Element-wise function of two tensors with numpy broadcasting.
    pub fn zip(&self, other: &Ref, f: impl Fn(f64, f64) -> f64) -> Ref {
        let dims = broadcast_shape(&self.dims, &other.dims)
            .unwrap_or_else(|| panic!("zip: {:?} vs {:?}", self.dims, other.dims));
        let a = self.broadcast_as(&dims);
        let b = other.broadcast_as(&dims);
        let data = a.data.iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect();
        Ref::new(data, &dims)
    }

    pub fn add(&self, o: &Ref) -> Ref {
        self.zip(o, |a, b| a + b)
    }
    pub fn sub(&self, o: &Ref) -> Ref {
        self.zip(o, |a, b| a - b)
    }
    pub fn mul(&self, o: &Ref) -> Ref {
        self.zip(o, |a, b| a * b)
    }
    pub fn div(&self, o: &Ref) -> Ref {
        self.zip(o, |a, b| a / b)
    }
    pub fn maximum(&self, o: &Ref) -> Ref {
        self.zip(o, fmax)
    }
    pub fn minimum(&self, o: &Ref) -> Ref {
        self.zip(o, fmin)
    }

    pub fn affine(&self, mul: f64, add: f64) -> Ref {
        self.map(|x| x * mul + add)
    }
    pub fn exp(&self) -> Ref {
        self.map(f64::exp)
    }
    pub fn log(&self) -> Ref {
        self.map(f64::ln)
    }
    pub fn sqrt(&self) -> Ref {
        self.map(f64::sqrt)
    }
    pub fn recip(&self) -> Ref {
        self.map(|x| 1.0 / x)
    }
    pub fn neg(&self) -> Ref {
        self.map(|x| -x)
    }
    pub fn abs(&self) -> Ref {
        self.map(f64::abs)
    }
    pub fn tanh(&self) -> Ref {
        self.map(f64::tanh)
    }
    pub fn sigmoid(&self) -> Ref {
        self.map(sigmoid)
    }
    pub fn relu(&self) -> Ref {
        self.map(relu)
    }
    pub fn gelu(&self) -> Ref {
        self.map(gelu)
    }
    pub fn gelu_tanh(&self) -> Ref {
        self.map(gelu_tanh)
    }
    pub fn silu(&self) -> Ref {
        self.map(silu)
    }
    pub fn powf(&self, e: f64) -> Ref {
        self.map(|x| x.powf(e))
    }

    // ----- matmul -----------------------------------------------------------------

    /// numpy matmul for rank >= 2 operands, batch dims broadcast.
    pub fn matmul(&self, o: &Ref) -> Ref {
        assert!(self.rank() >= 2 && o.rank() >= 2, "matmul: rank < 2");
        let (m, k) = (self.dims[self.rank() - 2], self.dims[self.rank() - 1]);
        let (k2, n) = (o.dims[o.rank() - 2], o.dims[o.rank() - 1]);
        assert_eq!(k, k2, "matmul: inner dims {:?} x {:?}", self.dims, o.dims);
        let ba = &self.dims[..self.rank() - 2];
        let bb = &o.dims[..o.rank() - 2];
        let batch = broadcast_shape(ba, bb).expect("matmul: batch dims");
        let mut a_dims = batch.clone();
        a_dims.extend([m, k]);
        let mut b_dims = batch.clone();
        b_dims.extend([k, n]);
        let a = self.broadcast_as(&a_dims);
        let b = o.broadcast_as(&b_dims);
        let nb = numel(&batch);
        let mut out = vec![0.0; nb * m * n];
        for bi in 0..nb {
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0;
                    for p in 0..k {
                        acc += a.data[bi * m * k + i * k + p] * b.data[bi * k * n + p * n + j];
                    }
                    out[bi * m * n + i * n + j] = acc;
                }
            }
        }
        let mut dims = batch;
        dims.extend([m, n]);
        Ref::new(out, &dims)
    }

    // ----- reductions -------------------------------------------------------------

    /// Reduce `dim` with `f` applied to the values along it (in order).
    pub fn reduce_with(&self, dim: isize, keepdim: bool, f: impl Fn(&[f64]) -> f64) -> Ref {
        let d = norm_dim(dim, self.rank());
        let mut kept = self.dims.clone();
        kept[d] = 1;
        let mut out = Vec::with_capacity(numel(&kept));
        for flat in 0..numel(&kept) {
            let mut idx = unravel(flat, &kept);
            let mut vals = Vec::with_capacity(self.dims[d]);
            for i in 0..self.dims[d] {
                idx[d] = i;
                vals.push(self.at(&idx));
            }
            out.push(f(&vals));
        }
        let dims = if keepdim {
            kept
        } else {
            let mut v = self.dims.clone();
            v.remove(d);
            v
        };
        Ref::new(out, &dims)
    }

    pub fn sum(&self, dim: isize, keepdim: bool) -> Ref {
        self.reduce_with(dim, keepdim, |v| v.iter().sum())
    }
    pub fn mean(&self, dim: isize, keepdim: bool) -> Ref {
        self.reduce_with(dim, keepdim, |v| v.iter().sum::<f64>() / v.len() as f64)
    }
    pub fn max(&self, dim: isize, keepdim: bool) -> Ref {
        self.reduce_with(dim, keepdim, |v| {
            v.iter().copied().fold(f64::NEG_INFINITY, fmax)
        })
    }
    /// Index of the first largest element along `dim` (as f64), dim removed.
    pub fn argmax(&self, dim: isize) -> Ref {
        self.reduce_with(dim, false, |v| {
            let mut best = 0usize;
            for i in 1..v.len() {
                if v[i] > v[best] {
                    best = i;
                }
            }
            best as f64
        })
    }

    pub fn softmax(&self, dim: isize) -> Ref {
        let d = norm_dim(dim, self.rank());
        let mut out = self.data.clone();
        let mut kept = self.dims.clone();
        kept[d] = 1;
        for flat in 0..numel(&kept) {
            let mut idx = unravel(flat, &kept);
            let mut positions = Vec::new();
            for i in 0..self.dims[d] {
                idx[d] = i;
                positions.push(ravel(&idx, &self.dims));
            }
            let mx = positions
                .iter()
                .map(|&p| self.data[p])
                .fold(f64::NEG_INFINITY, fmax);
            let denom: f64 = positions.iter().map(|&p| (self.data[p] - mx).exp()).sum();
            for &p in &positions {
                out[p] = (self.data[p] - mx).exp() / denom;
            }
        }
        Ref::new(out, &self.dims)
    }

    /// Layer norm over the last dim, biased variance.
    pub fn layer_norm(&self, w: &Ref, b: &Ref, eps: f64) -> Ref {
        let h = *self.dims.last().unwrap();
        assert_eq!(w.dims, vec![h]);
        assert_eq!(b.dims, vec![h]);
        let rows = self.numel() / h;
        let mut out = vec![0.0; self.numel()];
        for r in 0..rows {
            let row = &self.data[r * h..(r + 1) * h];
            let mean = row.iter().sum::<f64>() / h as f64;
            let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / h as f64;
            let inv = 1.0 / (var + eps).sqrt();
            for i in 0..h {
                out[r * h + i] = (row[i] - mean) * inv * w.data[i] + b.data[i];
            }
        }
        Ref::new(out, &self.dims)
    }

    /// RMS norm over the last dim.
    pub fn rms_norm(&self, w: &Ref, eps: f64) -> Ref {
        let h = *self.dims.last().unwrap();
        assert_eq!(w.dims, vec![h]);
        let rows = self.numel() / h;
        let mut out = vec![0.0; self.numel()];
        for r in 0..rows {
            let row = &self.data[r * h..(r + 1) * h];
            let ms = row.iter().map(|x| x * x).sum::<f64>() / h as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            for i in 0..h {
                out[r * h + i] = row[i] * inv * w.data[i];
            }
        }
        Ref::new(out, &self.dims)
    }

    /// Rotary position embedding, "rotate half": `self` is `[.., seq, dh]`
    /// (`heads_form` false) or `[.., seq, heads, dh]` (true), cos and sin `[seq, dh/2]`.
    pub fn rotary(&self, cos: &Ref, sin: &Ref, heads_form: bool) -> Ref {
        let r = self.rank();
        let dh = self.dims[r - 1];
        let half = dh / 2;
        let pos_dim = if heads_form { r - 3 } else { r - 2 };
        assert_eq!(cos.dims, vec![self.dims[pos_dim], half]);
        assert_eq!(sin.dims, cos.dims);
        let mut out = vec![0.0; self.numel()];
        for row in 0..self.numel() / dh.max(1) {
            let p = unravel(row * dh, &self.dims)[pos_dim];
            for j in 0..half {
                let (x1, x2) = (self.data[row * dh + j], self.data[row * dh + half + j]);
                let (c, s) = (cos.data[p * half + j], sin.data[p * half + j]);
                out[row * dh + j] = x1 * c - x2 * s;
                out[row * dh + half + j] = x2 * c + x1 * s;
            }
        }
        Ref::new(out, &self.dims)
    }

    // ----- views (materialised) ---------------------------------------------------

    pub fn reshape(&self, dims: &[usize]) -> Ref {
        assert_eq!(
            numel(dims),
            self.numel(),
            "reshape {:?} -> {dims:?}",
            self.dims
        );
        Ref::new(self.data.clone(), dims)
    }

    pub fn permute(&self, perm: &[usize]) -> Ref {
        assert_eq!(perm.len(), self.rank());
        let dims: Vec<usize> = perm.iter().map(|&p| self.dims[p]).collect();
        let mut out = Vec::with_capacity(self.numel());
        for flat in 0..numel(&dims) {
            let oi = unravel(flat, &dims);
            let mut si = vec![0usize; self.rank()];
            for (k, &p) in perm.iter().enumerate() {
                si[p] = oi[k];
            }
            out.push(self.at(&si));
        }
        Ref::new(out, &dims)
    }

    pub fn transpose(&self, d0: isize, d1: isize) -> Ref {
        let a = norm_dim(d0, self.rank());
        let b = norm_dim(d1, self.rank());
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Ref {
        let d = norm_dim(dim, self.rank());
        assert!(start + len <= self.dims[d]);
        let mut dims = self.dims.clone();
        dims[d] = len;
        let mut out = Vec::with_capacity(numel(&dims));
        for flat in 0..numel(&dims) {
            let mut idx = unravel(flat, &dims);
            idx[d] += start;
            out.push(self.at(&idx));
        }
        Ref::new(out, &dims)
    }

    /// `dim` in `0..=rank`.
    pub fn unsqueeze(&self, dim: usize) -> Ref {
        assert!(dim <= self.rank());
        let mut dims = self.dims.clone();
        dims.insert(dim, 1);
        Ref::new(self.data.clone(), &dims)
    }

    pub fn squeeze(&self, dim: isize) -> Ref {
        let d = norm_dim(dim, self.rank());
        assert_eq!(self.dims[d], 1);
        let mut dims = self.dims.clone();
        dims.remove(d);
        Ref::new(self.data.clone(), &dims)
    }

    pub fn cat(parts: &[&Ref], dim: isize) -> Ref {
        assert!(!parts.is_empty());
        let d = norm_dim(dim, parts[0].rank());
        let mut dims = parts[0].dims.clone();
        dims[d] = 0;
        for p in parts {
            assert_eq!(p.rank(), parts[0].rank());
            for i in 0..p.rank() {
                if i != d {
                    assert_eq!(p.dims[i], parts[0].dims[i]);
                }
            }
            dims[d] += p.dims[d];
        }
        let mut out = Vec::with_capacity(numel(&dims));
        for flat in 0..numel(&dims) {
            let mut idx = unravel(flat, &dims);
            let mut k = idx[d];
            let mut which = 0;
            while k >= parts[which].dims[d] {
                k -= parts[which].dims[d];
                which += 1;
            }
            idx[d] = k;
            out.push(parts[which].at(&idx));
        }
        Ref::new(out, &dims)
    }

    pub fn index_select(&self, indices: &[usize], dim: isize) -> Ref {
        let d = norm_dim(dim, self.rank());
        let mut dims = self.dims.clone();
        dims[d] = indices.len();
        let mut out = Vec::with_capacity(numel(&dims));
        for flat in 0..numel(&dims) {
            let mut idx = unravel(flat, &dims);
            idx[d] = indices[idx[d]];
            out.push(self.at(&idx));
        }
        Ref::new(out, &dims)
    }
}

// ---------------------------------------------------------------------------------
// deterministic random data
// ---------------------------------------------------------------------------------

/// splitmix64: small, deterministic, good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform f32 in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        (lo as f64 + (hi as f64 - lo as f64) * self.unit()) as f32
    }
    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// `n` f32 values uniform in [lo, hi).
pub fn rand_vec(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

/// A random reference tensor whose values are exactly representable in f32.
pub fn rand_ref(dims: &[usize], seed: u64, lo: f32, hi: f32) -> Ref {
    Ref::from_f32(&rand_vec(numel(dims), seed, lo, hi), dims)
}

/// A random shape with the given number of elements (factors picked at random).
pub fn random_shape_with_numel(n: usize, max_rank: usize, rng: &mut Rng) -> Vec<usize> {
    let mut dims = Vec::new();
    let mut rest = n;
    while dims.len() + 1 < max_rank && rest > 1 {
        let divisors: Vec<usize> = (1..=rest).filter(|d| rest.is_multiple_of(*d)).collect();
        let d = divisors[rng.below(divisors.len() as u64) as usize];
        dims.push(d);
        rest /= d;
    }
    dims.push(rest);
    // sometimes add a unit dim
    if dims.len() < max_rank && rng.below(3) == 0 {
        let pos = rng.below(dims.len() as u64 + 1) as usize;
        dims.insert(pos, 1);
    }
    assert_eq!(numel(&dims), n);
    dims
}

// ---------------------------------------------------------------------------------
// comparison
// ---------------------------------------------------------------------------------

/// Whether `a` is within `atol + rtol * |e|` of `e` (NaN matches NaN, inf matches inf).
pub fn close(a: f64, e: f64, rtol: f64, atol: f64) -> bool {
    if e.is_nan() || a.is_nan() {
        return e.is_nan() && a.is_nan();
    }
    if e.is_infinite() || a.is_infinite() {
        return a == e;
    }
    (a - e).abs() <= atol + rtol * e.abs()
}

/// Assert that `actual` matches `expected` element by element within
/// `|a - e| <= tol + tol * |e|`; the message shows the first mismatch.
#[track_caller]
pub fn assert_close(actual: &[f32], expected: &[f64], tol: f64) {
    assert_close_tol(actual, expected, tol, tol)
}

/// As [`assert_close`] with separate relative and absolute tolerances.
#[track_caller]
pub fn assert_close_tol(actual: &[f32], expected: &[f64], rtol: f64, atol: f64) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "length mismatch: got {} values, expected {}",
        actual.len(),
        expected.len()
    );
    let mut bad = 0usize;
    let mut first = None;
    let mut worst = 0.0f64;
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        if !close(a as f64, e, rtol, atol) {
            bad += 1;
            if first.is_none() {
                first = Some(i);
            }
            let err = (a as f64 - e).abs();
            if err.is_nan() || err > worst {
                worst = err;
            }
        }
    }
    if let Some(i) = first {
        let lo = i.saturating_sub(2);
        let hi = (i + 3).min(actual.len());
        panic!(
            "values differ: first mismatch at flat index {i}: got {} expected {} \
             (rtol {rtol}, atol {atol}); {bad} of {} mismatched, worst abs error {worst}\n\
             got      [{lo}..{hi}] = {:?}\nexpected [{lo}..{hi}] = {:?}",
            actual[i],
            expected[i],
            actual.len(),
            &actual[lo..hi],
            &expected[lo..hi],
        );
    }
}
