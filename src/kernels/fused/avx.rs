//! The vector paths of the fused kernel: while a [`Schedule`](super::schedule::Schedule) runs
//! over one tile, its accumulator is eight SIMD vectors held in registers (256-bit
//! with AVX2, 512-bit with AVX-512), so each element-wise op of a chain costs one or a
//! few vector instructions per vector and no memory traffic besides the program's
//! inputs, spills and outputs.
//!
//! The arithmetic ops (add, sub, mul, div, maximum, minimum, neg, abs, relu, sqrt,
//! recip, affine) are written with intrinsics that round exactly as the portable loops
//! do (IEEE operations, no fused multiply-add, the same NaN rules), so every path gives
//! the same bits. GELU and exp run in the registers too (`math::gelu_v512`,
//! `math::exp_v512` on AVX-512, `math::gelu_v256`, `math::exp_v256` on AVX2: the
//! scalar functions' operations in the same order); the other transcendental ops store
//! the accumulator to a tile and run the portable loop on it.
//!
//! The two widths share one tile loop, written once as a macro over a module of vector
//! operations (`v256`, `v512`). Everything is compiled with `#[target_feature]`; the
//! entry points are called only after `Path::detect` found the features on the CPU.
//!
//! The AVX-512 intrinsics, like the `avx512f` target feature, are stable since Rust
//! 1.89, the crate's `rust-version`.

use std::arch::x86_64::_mm_sfence;

use super::ops::{affine, unary_acc};
use super::run::Job;
use super::schedule::{AccInstr, Src};
use crate::ir::{BinaryOp, UnaryOp};
use crate::kernels::math;

/// Elements per tile of the AVX2 path (eight 256-bit vectors).
pub(super) const TILE_AVX2: usize = 64;
/// Elements per tile of the AVX-512 path (eight 512-bit vectors).
pub(super) const TILE_AVX512: usize = 128;

/// Defines a module of vector operations on one SIMD width, all `#[inline(always)]`
/// so that they are compiled inside the target-feature function that uses them; the
/// few operations whose intrinsics differ in shape are given as `$extra` items.
macro_rules! vector_ops {
    ($(#[$doc:meta])* $module:ident, $lanes:expr, $v:ty,
     load: $load:ident, store: $store:ident, stream: $stream:ident, splat: $splat:ident,
     add: $add:ident, sub: $sub:ident, mul: $mul:ident, div: $div:ident, sqrt: $sqrt:ident,
     max: $max:ident, min: $min:ident, $($extra:item)*) => {
        $(#[$doc])*
        mod $module {
            #[allow(unused_imports)]
            use std::arch::x86_64::*;

            /// One vector.
            pub(super) type V = $v;
            /// f32 lanes per vector.
            pub(super) const LANES: usize = $lanes;

            /// Vector `i` of a tile (its elements `i * LANES ..`).
            #[inline(always)]
            pub(super) unsafe fn load<const N: usize>(x: &[f32; N], i: usize) -> V {
                assert!((i + 1) * LANES <= N);
                // SAFETY: the `LANES` f32 from `i * LANES` lie inside `x` (asserted;
                // the callers' loops are unrolled, so the check folds away); the load
                // is unaligned.
                unsafe { $load(x.as_ptr().add(i * LANES)) }
            }

            /// Stores `v` as vector `i` of a tile.
            #[inline(always)]
            pub(super) unsafe fn store<const N: usize>(x: &mut [f32; N], i: usize, v: V) {
                assert!((i + 1) * LANES <= N);
                // SAFETY: as in `load`; `x` is borrowed mutably.
                unsafe { $store(x.as_mut_ptr().add(i * LANES), v) }
            }

            /// Stores `v` as vector `i` of a tile with a non-temporal store (the line is
            /// not read first and bypasses the caches) when that vector is aligned to
            /// its size, with a plain store otherwise.
            #[inline(always)]
            pub(super) unsafe fn store_streaming<const N: usize>(x: &mut [f32; N], i: usize, v: V) {
                assert!((i + 1) * LANES <= N);
                // SAFETY: as in `store`; the non-temporal store also needs an address
                // aligned to the vector's size, checked just before.
                unsafe {
                    let p = x.as_mut_ptr().add(i * LANES);
                    if (p as usize) % (LANES * 4) == 0 {
                        $stream(p, v)
                    } else {
                        $store(p, v)
                    }
                }
            }

            /// `x` in every lane.
            #[inline(always)]
            pub(super) unsafe fn splat(x: f32) -> V {
                // SAFETY: the CPU has this module's instructions (every function's contract).
                unsafe {
                    $splat(x)
                }
            }

            /// `a + b`.
            #[inline(always)]
            pub(super) unsafe fn add(a: V, b: V) -> V {
                // SAFETY: the CPU has this module's instructions (every function's contract).
                unsafe {
                    $add(a, b)
                }
            }

            /// `a - b`.
            #[inline(always)]
            pub(super) unsafe fn sub(a: V, b: V) -> V {
                // SAFETY: the CPU has this module's instructions (every function's contract).
                unsafe {
                    $sub(a, b)
                }
            }

            /// `a * b`.
            #[inline(always)]
            pub(super) unsafe fn mul(a: V, b: V) -> V {
                // SAFETY: the CPU has this module's instructions (every function's contract).
                unsafe {
                    $mul(a, b)
                }
            }

            /// `a / b`.
            #[inline(always)]
            pub(super) unsafe fn div(a: V, b: V) -> V {
                // SAFETY: the CPU has this module's instructions (every function's contract).
                unsafe {
                    $div(a, b)
                }
            }

            /// `if a.is_nan() || a > b { a } else { b }`: the hardware max gives `b`
            /// for a NaN in either operand and for equal ones, so only a NaN `a` needs
            /// fixing.
            #[inline(always)]
            pub(super) unsafe fn maximum(a: V, b: V) -> V {
                // SAFETY: the CPU has this module's instructions (every function's contract).
                unsafe {
                    keep_nan(a, $max(a, b))
                }
            }

            /// `if a.is_nan() || a < b { a } else { b }`, likewise.
            #[inline(always)]
            pub(super) unsafe fn minimum(a: V, b: V) -> V {
                // SAFETY: the CPU has this module's instructions (every function's contract).
                unsafe {
                    keep_nan(a, $min(a, b))
                }
            }

            /// Correctly rounded square root.
            #[inline(always)]
            pub(super) unsafe fn sqrt(a: V) -> V {
                // SAFETY: the CPU has this module's instructions (every function's contract).
                unsafe {
                    $sqrt(a)
                }
            }

            $($extra)*
        }
    };
}

vector_ops!(
    /// AVX2 vectors of 8 f32.
    v256, 8, __m256,
    load: _mm256_loadu_ps, store: _mm256_storeu_ps, stream: _mm256_stream_ps,
    splat: _mm256_set1_ps,
    add: _mm256_add_ps, sub: _mm256_sub_ps, mul: _mm256_mul_ps, div: _mm256_div_ps,
    sqrt: _mm256_sqrt_ps, max: _mm256_max_ps, min: _mm256_min_ps,

    /// `a` where `a` is NaN, `r` elsewhere.
    #[inline(always)]
    unsafe fn keep_nan(a: V, r: V) -> V {
        // SAFETY: the CPU has this module's instructions (every function's contract).
        unsafe {
            _mm256_blendv_ps(r, a, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
        }
    }

    /// `-a` (the sign bit flipped).
    #[inline(always)]
    pub(super) unsafe fn neg(a: V) -> V {
        // SAFETY: the CPU has this module's instructions (every function's contract).
        unsafe {
            _mm256_xor_ps(a, _mm256_set1_ps(-0.0))
        }
    }

    /// `|a|` (the sign bit cleared).
    #[inline(always)]
    pub(super) unsafe fn abs(a: V) -> V {
        // SAFETY: the CPU has this module's instructions (every function's contract).
        unsafe {
            _mm256_andnot_ps(_mm256_set1_ps(-0.0), a)
        }
    }

    /// `if a < 0 { 0 } else { a }`: NaN and -0 stay as they are.
    #[inline(always)]
    pub(super) unsafe fn relu(a: V) -> V {
        // SAFETY: the CPU has this module's instructions (every function's contract).
        unsafe {
            _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_setzero_ps()), a)
        }
    }
);

vector_ops!(
    /// AVX-512 vectors of 16 f32.
    v512, 16, __m512,
    load: _mm512_loadu_ps, store: _mm512_storeu_ps, stream: _mm512_stream_ps,
    splat: _mm512_set1_ps,
    add: _mm512_add_ps, sub: _mm512_sub_ps, mul: _mm512_mul_ps, div: _mm512_div_ps,
    sqrt: _mm512_sqrt_ps, max: _mm512_max_ps, min: _mm512_min_ps,

    /// `a` where `a` is NaN, `r` elsewhere.
    #[inline(always)]
    unsafe fn keep_nan(a: V, r: V) -> V {
        // SAFETY: the CPU has this module's instructions (every function's contract).
        unsafe {
            _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), a)
        }
    }

    /// `-a` (the sign bit flipped).
    #[inline(always)]
    pub(super) unsafe fn neg(a: V) -> V {
        // SAFETY: the CPU has this module's instructions (every function's contract).
        unsafe {
            _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(a),
                _mm512_set1_epi32(i32::MIN),
            ))
        }
    }

    /// `|a|` (the sign bit cleared).
    #[inline(always)]
    pub(super) unsafe fn abs(a: V) -> V {
        // SAFETY: the CPU has this module's instructions (every function's contract).
        unsafe {
            _mm512_abs_ps(a)
        }
    }

    /// `if a < 0 { 0 } else { a }`: lanes not less than 0 (or unordered: NaN) are
    /// kept, so NaN and -0 stay as they are.
    #[inline(always)]
    pub(super) unsafe fn relu(a: V) -> V {
        // SAFETY: the CPU has this module's instructions (every function's contract).
        unsafe {
            _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a, _mm512_setzero_ps()), a)
        }
    }
);

/// `$acc[i] = f($acc[i])` for every vector of the accumulator (a loop, not a closure,
/// so that it is compiled with the caller's target features).
macro_rules! each {
    ($acc:ident, $a:ident => $e:expr) => {
        for slot in $acc.iter_mut() {
            let $a = *slot;
            *slot = $e;
        }
    };
}

/// The whole tile a step reads: of a contiguous input (in place), a spill tile, or
/// an output not yet written (the input it overwrites).
#[inline(always)]
fn operand<'a, const N: usize>(
    job: &'a Job<'_>,
    outs: &'a [&mut [f32]],
    regs: &'a [[f32; N]],
    x: Src,
    at: usize,
    done: usize,
) -> &'a [f32; N] {
    job.part(outs, regs, x, at, done, N)
        .try_into()
        .expect("part() gives the N elements asked for")
}

/// `$acc[$i] = op($a, $b)` for every vector `$i` of the accumulator, with the match on
/// `op` outside the loop.
macro_rules! each_binary {
    ($v:ident, $op:expr, $acc:ident, $i:ident => $a:expr, $b:expr) => {
        match $op {
            BinaryOp::Add => {
                for $i in 0..$acc.len() {
                    $acc[$i] = $v::add($a, $b)
                }
            }
            BinaryOp::Sub => {
                for $i in 0..$acc.len() {
                    $acc[$i] = $v::sub($a, $b)
                }
            }
            BinaryOp::Mul => {
                for $i in 0..$acc.len() {
                    $acc[$i] = $v::mul($a, $b)
                }
            }
            BinaryOp::Div => {
                for $i in 0..$acc.len() {
                    $acc[$i] = $v::div($a, $b)
                }
            }
            BinaryOp::Maximum => {
                for $i in 0..$acc.len() {
                    $acc[$i] = $v::maximum($a, $b)
                }
            }
            BinaryOp::Minimum => {
                for $i in 0..$acc.len() {
                    $acc[$i] = $v::minimum($a, $b)
                }
            }
        }
    };
}

/// Defines `$name`, the tile loop over vectors of module `$v`, compiled with the
/// target features `$features`, for tiles of `$tile` elements; each unary op `$op`
/// listed after them runs on the accumulator in registers as `acc = $f(acc)` (`$f` a
/// function with target features among `$features`; the other transcendental ops go
/// through a tile and the portable loop).
macro_rules! variant {
    ($name:ident, $features:literal, $v:ident, $tile:expr $(, $op:ident => $f:path)* $(,)?) => {
        /// Runs `job` for output elements `start..start + outs[0].len()`: whole tiles
        /// with the accumulator in vector registers, the last partial tile with the
        /// portable loop. `regs` holds the schedules' spill tiles.
        ///
        /// # Safety
        ///
        #[doc = concat!("The CPU must support `", $features, "`.")]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(
            job: &Job<'_>,
            outs: &mut [&mut [f32]],
            start: usize,
            regs: &mut [[f32; $tile]],
        ) {
            const VECS: usize = $tile / $v::LANES;
            const ALIGN: usize = $v::LANES * 4;
            let len = outs.first().map_or(0, |o| o.len());
            let mut done = 0;
            // Large outputs are written with non-temporal stores (no read of each line
            // before it is written: a third less memory traffic). They need aligned
            // vectors, so a short head runs first when every output is misaligned
            // by the same amount.
            let misalign = |o: &&mut [f32]| (o.as_ptr() as usize) % ALIGN;
            let stream = job.stream
                && outs.first().is_some_and(|first| {
                    let m = misalign(first);
                    m % 4 == 0 && outs.iter().all(|o| misalign(o) == m)
                });
            if stream {
                let head = outs.first().map_or(0, |o| ((ALIGN - misalign(o)) % ALIGN) / 4);
                let head = head.min(len);
                if head > 0 {
                    job.run_tile(outs, regs, start, 0, head);
                    done = head;
                }
            }
            // SAFETY: the CPU has `$features` (this function's contract), which every
            // vector operation below needs; each load and store checks its own bounds.
            while done + $tile <= len { unsafe {
                let at = start + done;
                let mut acc: [$v::V; VECS] = [$v::splat(0.0); VECS];
                for s in &job.sched.steps {
                    match *s {
                        AccInstr::Gather(k, t) => job.gather(k, at, &mut regs[t as usize]),
                        AccInstr::Keep(j, t) => regs[t as usize]
                            .copy_from_slice(&outs[j as usize][done..done + $tile]),
                        AccInstr::Load(x) => {
                            let x = operand(job, outs, regs, x, at, done);
                            for (i, a) in acc.iter_mut().enumerate() {
                                *a = $v::load(x, i);
                            }
                        }
                        AccInstr::Unary(op) => match op {
                            $(UnaryOp::$op => acc = $f(acc),)*
                            UnaryOp::Neg => each!(acc, a => $v::neg(a)),
                            UnaryOp::Abs => each!(acc, a => $v::abs(a)),
                            UnaryOp::Relu => each!(acc, a => $v::relu(a)),
                            UnaryOp::Sqrt => each!(acc, a => $v::sqrt(a)),
                            UnaryOp::Recip => {
                                let one = $v::splat(1.0);
                                each!(acc, a => $v::div(one, a))
                            }
                            UnaryOp::Affine { mul, add } => {
                                // `x * m + c` with two roundings, as the portable loop.
                                let (m, c) = affine(mul, add);
                                let (m, c) = ($v::splat(m), $v::splat(c));
                                each!(acc, a => $v::add($v::mul(a, m), c))
                            }
                            _ => {
                                let mut tile = [0f32; $tile];
                                for (i, &a) in acc.iter().enumerate() {
                                    $v::store(&mut tile, i, a);
                                }
                                unary_acc(op, &mut tile);
                                for (i, a) in acc.iter_mut().enumerate() {
                                    *a = $v::load(&tile, i);
                                }
                            }
                        },
                        AccInstr::AccOp(op, x) => {
                            let x = operand(job, outs, regs, x, at, done);
                            each_binary!($v, op, acc, i => acc[i], $v::load(x, i));
                        }
                        AccInstr::OpAcc(op, x) => {
                            let x = operand(job, outs, regs, x, at, done);
                            each_binary!($v, op, acc, i => $v::load(x, i), acc[i]);
                        }
                        AccInstr::Square(op) => each_binary!($v, op, acc, i => acc[i], acc[i]),
                        AccInstr::Save(t) => {
                            for (i, &a) in acc.iter().enumerate() {
                                $v::store(&mut regs[t as usize], i, a);
                            }
                        }
                        AccInstr::Output(j) => {
                            let out: &mut [f32; $tile] = (&mut outs[j as usize][done..done + $tile])
                                .try_into()
                                .expect("a whole tile");
                            if stream {
                                for (i, &a) in acc.iter().enumerate() {
                                    $v::store_streaming(out, i, a);
                                }
                            } else {
                                for (i, &a) in acc.iter().enumerate() {
                                    $v::store(out, i, a);
                                }
                            }
                        }
                    }
                }
                done += $tile;
            } }
            if done < len {
                job.run_tile(outs, regs, start, done, len - done);
            }
            if stream {
                // Non-temporal stores are weakly ordered: make them visible before the
                // kernel returns (and its outputs are read, on any thread).
                _mm_sfence();
            }
        }
    };
}

variant!(
    run_range_avx2,
    "avx2,fma",
    v256,
    TILE_AVX2,
    Gelu => math::gelu_v256,
    Exp => math::exp_v256,
);
variant!(
    run_range_avx512,
    "avx512f,avx512vl,avx2,fma",
    v512,
    TILE_AVX512,
    Gelu => math::gelu_v512,
    Exp => math::exp_v512,
);
