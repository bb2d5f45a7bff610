//! Element-wise kernels: [`unary`] (f32 functions such as `exp` or `gelu`) and
//! [`binary`] (arithmetic with broadcasting), plus the generic strided map that
//! [`copy`](fn@super::copy) and [`cast`](fn@super::cast) share.
//!
//! Both kernels are a loop over the output in row-major order. The input layouts are
//! simplified into runs by a [`Walk`], and each run gets the tightest loop its inner
//! strides allow:
//!
//! | inner strides | loop |
//! | --- | --- |
//! | contiguous (1) | zip of slices, vectorised by the compiler |
//! | broadcast (0) | one value read once, the other side a slice |
//! | anything else | `step_by` iterators |
//!
//! So a same-layout contiguous add is one long zip, a scalar broadcast is a map with a
//! constant, and a bias add `[rows, n] + [n]` is `rows` zips of length `n`. The op is
//! matched once, outside the loop, so each op gets its own monomorphised loop.
//!
//! The one-input map (unary, copy, cast) differs in one respect: its function may be
//! large (`gelu`), and LLVM will not inline a large function called from three loops. So
//! strided and broadcast runs are first staged into a 256-element buffer, and the function
//! is applied in a single contiguous loop.

use super::math;
use super::par::for_each_chunk;
use super::strided::{run, Walk};
use super::{check_dst, check_input, error, KernelError, Par};
use crate::ir::{BinaryOp, Element, Layout, UnaryOp};

/// Writes `f(x)` for every element `x` of `src` (read through `layout`) into `dst`, in
/// row-major order. The caller has checked the layout and `dst.len()`. `cost` is the
/// rough price of one `f` in element operations (it decides when to go parallel).
pub(crate) fn map<S, D, F>(src: &[S], layout: &Layout, dst: &mut [D], par: Par, cost: usize, f: F)
where
    S: Element,
    D: Element,
    F: Fn(S) -> D + Sync + Send + Copy,
{
    /// Strided and broadcast runs are staged through a buffer of this many elements.
    const STAGE: usize = 256;
    let walk = Walk::new(&layout.dims, [&layout.strides], [layout.offset]);
    let stride = walk.inner_strides()[0];
    for_each_chunk(dst, 1, cost, par, |start, out| {
        let mut stage = [S::default(); STAGE];
        let mut pos = 0;
        walk.for_each_run(start, out.len(), |[first], len| {
            let mut done = 0;
            while done < len {
                // `f` is called from one loop only, so that it is inlined (and the loop
                // vectorised) even when it is large, like `gelu`: non-contiguous runs are
                // first copied into `stage`.
                let (input, n) = match stride {
                    1 => (&src[first..first + len], len),
                    0 => {
                        let n = (len - done).min(STAGE);
                        stage[..n].fill(src[first]);
                        (&stage[..n], n)
                    }
                    s => {
                        let n = (len - done).min(STAGE);
                        for (t, &x) in stage.iter_mut().zip(run(src, first + done * s, s, n)) {
                            *t = x;
                        }
                        (&stage[..n], n)
                    }
                };
                for (d, &x) in out[pos..pos + n].iter_mut().zip(input) {
                    *d = f(x);
                }
                pos += n;
                done += n;
            }
        });
    });
}

/// [`map`] for the branch-free functions of `math` (`exp`, `gelu`, ...): their loop is
/// compiled for the CPU's SIMD level by runtime dispatch (`math::map_into`), which
/// `map`'s generic loop is not. A contiguous source is read straight; any other is
/// gathered into `dst` first and transformed there.
fn map_simd<A>(src: &[f32], layout: &Layout, dst: &mut [f32], par: Par, f: A)
where
    A: math::Activation + Sync + Send,
{
    if layout.is_contiguous() {
        let src = &src[layout.offset..layout.offset + dst.len()];
        for_each_chunk(dst, 1, 8, par, |start, out| {
            math::map_into(&src[start..start + out.len()], out, f)
        });
    } else {
        map(src, layout, dst, par, 1, |x| x);
        for_each_chunk(dst, 1, 8, par, |_, out| math::in_place(out, f));
    }
}

/// Applies an element-wise function of one f32 input.
///
/// `src` is read through `layout`; `dst` receives the result contiguously and must have
/// exactly `layout.numel()` elements. The functions are those of [`UnaryOp`]; `Gelu`,
/// `Exp`, `Tanh`, `Sigmoid` and `Silu` are vectorised f32 forms within a few ulp (module
/// `math` states each bound), `Affine` computes `x * mul + add`
/// in f32 and `Powf` is `x.powf(e)`.
pub fn unary(
    op: UnaryOp,
    src: &[f32],
    layout: &Layout,
    dst: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "unary";
    let numel = check_input(kernel, "src", src.len(), layout)?;
    check_dst(kernel, dst.len(), numel)?;
    match op {
        UnaryOp::Exp => map_simd(src, layout, dst, par, math::Exp),
        UnaryOp::Log => map(src, layout, dst, par, 4, f32::ln),
        UnaryOp::Sqrt => map(src, layout, dst, par, 1, f32::sqrt),
        UnaryOp::Recip => map(src, layout, dst, par, 1, |x| 1.0 / x),
        UnaryOp::Neg => map(src, layout, dst, par, 1, |x: f32| -x),
        UnaryOp::Abs => map(src, layout, dst, par, 1, f32::abs),
        UnaryOp::Tanh => map_simd(src, layout, dst, par, math::Tanh),
        UnaryOp::Sigmoid => map_simd(src, layout, dst, par, math::Sigmoid),
        UnaryOp::Relu => map(src, layout, dst, par, 1, math::relu),
        UnaryOp::Gelu => map_simd(src, layout, dst, par, math::Gelu),
        UnaryOp::GeluTanh => map_simd(src, layout, dst, par, math::GeluTanh),
        UnaryOp::Silu => map_simd(src, layout, dst, par, math::Silu),
        UnaryOp::Affine { mul, add } => {
            let (m, a) = (f64::from_bits(mul) as f32, f64::from_bits(add) as f32);
            map(src, layout, dst, par, 1, move |x| x * m + a)
        }
        UnaryOp::Powf(e) => {
            let e = f64::from_bits(e) as f32;
            map(src, layout, dst, par, 8, move |x: f32| x.powf(e))
        }
    }
    Ok(())
}

/// Applies an element-wise function of two inputs of the same element type.
///
/// Both layouts must already have the output's dims (the caller broadcast them with
/// `Layout::broadcast_as`, so broadcast dims have stride 0). `dst` receives the result
/// contiguously and must have exactly the output's element count. Integer arithmetic wraps
/// and integer division by zero gives zero (see `Element`).
pub fn binary<T: Element>(
    op: BinaryOp,
    lhs: &[T],
    lhs_layout: &Layout,
    rhs: &[T],
    rhs_layout: &Layout,
    dst: &mut [T],
    par: Par,
) -> Result<(), KernelError> {
    let kernel = "binary";
    let numel = check_input(kernel, "lhs", lhs.len(), lhs_layout)?;
    check_input(kernel, "rhs", rhs.len(), rhs_layout)?;
    if lhs_layout.dims != rhs_layout.dims {
        return Err(error(
            kernel,
            format_args!(
                "{} of lhs dims {:?} and rhs dims {:?}: broadcast both to the output dims first",
                op.name(),
                lhs_layout.dims,
                rhs_layout.dims
            ),
        ));
    }
    check_dst(kernel, dst.len(), numel)?;
    match op {
        BinaryOp::Add => zip_map(lhs, lhs_layout, rhs, rhs_layout, dst, par, T::add),
        BinaryOp::Sub => zip_map(lhs, lhs_layout, rhs, rhs_layout, dst, par, T::sub),
        BinaryOp::Mul => zip_map(lhs, lhs_layout, rhs, rhs_layout, dst, par, T::mul),
        BinaryOp::Div => zip_map(lhs, lhs_layout, rhs, rhs_layout, dst, par, T::div),
        BinaryOp::Maximum => zip_map(lhs, lhs_layout, rhs, rhs_layout, dst, par, T::maximum),
        BinaryOp::Minimum => zip_map(lhs, lhs_layout, rhs, rhs_layout, dst, par, T::minimum),
    }
    Ok(())
}

/// The loop of [`binary`]: `dst[i] = f(lhs[i], rhs[i])` in row-major order, one
/// specialised inner loop per run (see the module docs).
fn zip_map<T, F>(lhs: &[T], ll: &Layout, rhs: &[T], rl: &Layout, dst: &mut [T], par: Par, f: F)
where
    T: Element,
    F: Fn(T, T) -> T + Sync + Send + Copy,
{
    let walk = Walk::new(&ll.dims, [&ll.strides, &rl.strides], [ll.offset, rl.offset]);
    let [ls, rs] = walk.inner_strides();
    for_each_chunk(dst, 1, 1, par, |start, out| {
        let mut pos = 0;
        walk.for_each_run(start, out.len(), |[lo, ro], len| {
            let out = &mut out[pos..pos + len];
            pos += len;
            match (ls, rs) {
                (1, 1) => {
                    for ((d, &a), &b) in out
                        .iter_mut()
                        .zip(&lhs[lo..lo + len])
                        .zip(&rhs[ro..ro + len])
                    {
                        *d = f(a, b);
                    }
                }
                (1, 0) => {
                    let b = rhs[ro];
                    for (d, &a) in out.iter_mut().zip(&lhs[lo..lo + len]) {
                        *d = f(a, b);
                    }
                }
                (0, 1) => {
                    let a = lhs[lo];
                    for (d, &b) in out.iter_mut().zip(&rhs[ro..ro + len]) {
                        *d = f(a, b);
                    }
                }
                (0, 0) => out.fill(f(lhs[lo], rhs[ro])),
                (0, _) => {
                    let a = lhs[lo];
                    for (d, &b) in out.iter_mut().zip(run(rhs, ro, rs, len)) {
                        *d = f(a, b);
                    }
                }
                (_, 0) => {
                    let b = rhs[ro];
                    for (d, &a) in out.iter_mut().zip(run(lhs, lo, ls, len)) {
                        *d = f(a, b);
                    }
                }
                _ => {
                    for ((d, &a), &b) in out
                        .iter_mut()
                        .zip(run(lhs, lo, ls, len))
                        .zip(run(rhs, ro, rs, len))
                    {
                        *d = f(a, b);
                    }
                }
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::*;
    use proptest::prelude::{any, proptest, ProptestConfig, Strategy};

    #[test]
    fn unary_errors() {
        let x = [1.0f32; 4];
        let mut out = [0.0; 4];
        let e = unary(
            UnaryOp::Exp,
            &x,
            &Layout::contiguous(&[5]),
            &mut out,
            Par::serial(),
        )
        .unwrap_err();
        assert!(e.0.starts_with("unary: src layout"), "{e}");
        let e = unary(
            UnaryOp::Exp,
            &x,
            &Layout::contiguous(&[4]),
            &mut out[..3],
            Par::serial(),
        )
        .unwrap_err();
        assert!(
            e.0.contains("dst has 3 elements but the output has 4"),
            "{e}"
        );
    }

    fn naive_binary<T: Element>(op: BinaryOp, a: T, b: T) -> T {
        match op {
            BinaryOp::Add => a.add(b),
            BinaryOp::Sub => a.sub(b),
            BinaryOp::Mul => a.mul(b),
            BinaryOp::Div => a.div(b),
            BinaryOp::Maximum => a.maximum(b),
            BinaryOp::Minimum => a.minimum(b),
        }
    }

    /// Checks `binary` against the naive loop for inputs of `ldims` and `rdims` broadcast
    /// to their common dims.
    fn check_broadcast(seed: u64, ldims: &[usize], rdims: &[usize]) {
        let mut rng = Rng::new(seed);
        let rank = ldims.len().max(rdims.len());
        let pad = |d: &[usize]| {
            let mut v = vec![1; rank - d.len()];
            v.extend_from_slice(d);
            v
        };
        let (lp, rp) = (pad(ldims), pad(rdims));
        let out: Vec<usize> = lp
            .iter()
            .zip(&rp)
            .map(|(&a, &b)| if a == 1 { b } else { a })
            .collect();
        let (lb, ll) = rand_f32(&mut rng, ldims);
        let (rb, rl) = rand_f32(&mut rng, rdims);
        let (ll, rl) = (
            ll.broadcast_as(&out).unwrap(),
            rl.broadcast_as(&out).unwrap(),
        );
        let (lx, rx) = (gather(&lb, &ll), gather(&rb, &rl));
        for op in BinaryOp::ALL {
            let want: Vec<f32> = lx
                .iter()
                .zip(&rx)
                .map(|(&a, &b)| naive_binary(op, a, b))
                .collect();
            for par in pars() {
                let mut got = vec![0.0; want.len()];
                binary(op, &lb, &ll, &rb, &rl, &mut got, par).unwrap();
                assert_eq!(got, want, "{op:?} {ll:?} {rl:?}");
            }
        }
        // The same shapes in integers.
        let (lb, ll2) = random_layout(&mut rng, ldims, |r| r.below(7) as u32);
        let (rb, rl2) = random_layout(&mut rng, rdims, |r| r.below(7) as u32);
        let (ll2, rl2) = (
            ll2.broadcast_as(&out).unwrap(),
            rl2.broadcast_as(&out).unwrap(),
        );
        let (lx, rx) = (gather(&lb, &ll2), gather(&rb, &rl2));
        for op in BinaryOp::ALL {
            let want: Vec<u32> = lx
                .iter()
                .zip(&rx)
                .map(|(&a, &b)| naive_binary(op, a, b))
                .collect();
            let mut got = vec![0; want.len()];
            binary(op, &lb, &ll2, &rb, &rl2, &mut got, Par { threads: 2 }).unwrap();
            assert_eq!(got, want);
        }
    }

    /// Dims of two shapes that broadcast together: a common shape, with some dims set to 1
    /// on either side and leading dims dropped.
    fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        (0usize..5)
            .prop_flat_map(|rank| {
                (
                    proptest::collection::vec(1usize..6, rank),
                    proptest::collection::vec(0u8..4, rank),
                    0..=rank,
                    0..=rank,
                )
            })
            .prop_map(|(dims, mask, ldrop, rdrop)| {
                let l: Vec<usize> = dims
                    .iter()
                    .zip(&mask)
                    .map(|(&d, &m)| if m == 1 { 1 } else { d })
                    .collect();
                let r: Vec<usize> = dims
                    .iter()
                    .zip(&mask)
                    .map(|(&d, &m)| if m == 2 { 1 } else { d })
                    .collect();
                (
                    l[ldrop.min(l.len())..].to_vec(),
                    r[rdrop.min(r.len())..].to_vec(),
                )
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn binary_broadcasting((l, r) in broadcast_pair(), seed in any::<u64>()) {
            check_broadcast(seed, &l, &r);
        }
    }

    #[test]
    fn binary_fast_paths() {
        // Same-layout contiguous, scalar broadcast, bias add, and both sides strided.
        check_broadcast(1, &[40, 33], &[40, 33]);
        check_broadcast(2, &[40, 33], &[]);
        check_broadcast(3, &[], &[40, 33]);
        check_broadcast(4, &[40, 33], &[33]);
        check_broadcast(5, &[40, 1], &[1, 33]);
        check_broadcast(6, &[3, 40, 1], &[3, 1, 33]);
    }

    #[test]
    fn integer_semantics() {
        let a = [5u32, 0, 7];
        let b = [0u32, 3, 2];
        let l = Layout::contiguous(&[3]);
        let mut out = [9u32; 3];
        binary(BinaryOp::Div, &a, &l, &b, &l, &mut out, Par::serial()).unwrap();
        assert_eq!(out, [0, 0, 3]);
        binary(BinaryOp::Sub, &b, &l, &a, &l, &mut out, Par::serial()).unwrap();
        assert_eq!(out, [u32::MAX - 4, 3, u32::MAX - 4]);
    }

    #[test]
    fn binary_errors() {
        let a = [1.0f32; 6];
        let l = Layout::contiguous(&[2, 3]);
        let mut out = [0.0; 6];
        let e = binary(
            BinaryOp::Add,
            &a,
            &l,
            &a,
            &Layout::contiguous(&[3]),
            &mut out,
            Par::serial(),
        )
        .unwrap_err();
        assert!(
            e.0.contains("add of lhs dims [2, 3] and rhs dims [3]"),
            "{e}"
        );
        assert!(binary(BinaryOp::Add, &a[..5], &l, &a, &l, &mut out, Par::serial()).is_err());
        let e = binary(BinaryOp::Add, &a, &l, &a[..5], &l, &mut out, Par::serial()).unwrap_err();
        assert!(e.0.contains("rhs"), "{e}");
        assert!(binary(BinaryOp::Add, &a, &l, &a, &l, &mut out[..5], Par::serial()).is_err());
    }
}
