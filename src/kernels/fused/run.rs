//! Running a schedule: CPU feature detection ([`Path`]), the split of a large output
//! across rayon tasks, and the tile loop of the portable path ([`Job`]); the vector
//! paths' tile loops are in `avx`.

#[cfg(target_arch = "x86_64")]
use super::avx;
use super::ops::{binary_acc, unary_acc};
use super::program::FusedProgram;
use super::schedule::{AccInstr, Schedule, Src};
use super::scratch::with_tiles;
use super::BLOCK;
use crate::ir::Layout;
use crate::kernels::par::{join_split, units_per_task, MIN_TASK_WORK};
use crate::kernels::strided::{copy_runs, Walk};
use crate::kernels::Par;

/// [`fused_in_place`](super::fused_in_place) after its checks, on the given path (which the CPU must
/// support).
pub(super) fn run_on(
    path: Path,
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    in_place: &[(usize, usize)],
    outputs: &mut [&mut [f32]],
    numel: usize,
    par: Par,
) {
    const INLINE: usize = 8;
    let mut inline_walks = [Walk::<1>::EMPTY; INLINE];
    let heap_walks: Vec<Walk<1>>;
    let walk = |(_, l): &(&[f32], &Layout)| Walk::new(&l.dims, [&l.strides], [l.offset]);
    let walks: &[Walk<1>] = if inputs.len() <= INLINE {
        for (w, i) in inline_walks.iter_mut().zip(inputs) {
            *w = walk(i);
        }
        &inline_walks[..inputs.len()]
    } else {
        heap_walks = inputs.iter().map(walk).collect();
        &heap_walks
    };
    let sched = Schedule::new(program, |k| inputs[k].1.is_contiguous(), in_place);
    let tile = path.tile();
    let tiles = numel.div_ceil(tile);
    // Each task gets at least `MIN_TASK_WORK` elements for a cheap program: a
    // memory-bound kernel streams best in long runs (and per-task costs stay small).
    // An expensive one (a GELU epilogue, cost 8 and more per element) is compute-bound
    // and splits at an eighth of that: one request's 28 × 1536 GELU runs on both cores.
    let min_elements = if program.cost() >= 8 {
        MIN_TASK_WORK / 8
    } else {
        MIN_TASK_WORK
    };
    let per_task = units_per_task(tiles, tile * program.cost(), par).max(min_elements / tile);
    let job = Job {
        sched: &sched,
        inputs,
        walks,
        stream: numel >= STREAM_MIN_ELEMENTS,
    };
    if per_task >= tiles {
        job.run(path, outputs, 0);
        return;
    }
    job.split_run(path, outputs, 0, per_task * tile);
}

/// How the tiles are run: with AVX vectors held in registers, or with the portable
/// loops (vectorised by the compiler over larger tiles in L1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Path {
    /// The portable loops, over tiles of [`BLOCK`].
    Portable,
    /// AVX2 and FMA (`avx::run_range_avx2`).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 code compiled with AVX-512 enabled: twice the vector registers.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Path {
    /// The best path this CPU runs.
    pub(super) fn detect() -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::cpu;
            if cpu::has_avx512() {
                return Path::Avx512;
            }
            if cpu::has_avx2() {
                return Path::Avx2;
            }
        }
        Path::Portable
    }

    /// Elements per tile.
    fn tile(self) -> usize {
        match self {
            Path::Portable => BLOCK,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => avx::TILE_AVX2,
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => avx::TILE_AVX512,
        }
    }
}

/// What every task of one kernel call shares.
pub(super) struct Job<'a> {
    pub(super) sched: &'a Schedule,
    inputs: &'a [(&'a [f32], &'a Layout)],
    walks: &'a [Walk<1>],
    /// Write outputs with non-temporal stores: they are too large to stay in cache for
    /// their readers anyway ([`STREAM_MIN_ELEMENTS`]).
    // Read by the vector paths, x86-64 only so far.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) stream: bool,
}

/// Outputs of at least this many elements (16 MiB of f32, more than a core's share of
/// the last-level cache) are written with non-temporal stores by the vector paths.
const STREAM_MIN_ELEMENTS: usize = 4 << 20;

impl Job<'_> {
    /// Runs the program for output elements `start..start + outs[0].len()` on `path`,
    /// which must have come from [`Path::detect`] (or be [`Path::Portable`]).
    fn run(&self, path: Path, outs: &mut [&mut [f32]], start: usize) {
        let tiles = self.sched.tiles;
        match path {
            Path::Portable => {
                with_tiles::<BLOCK, _>(tiles, |regs| self.run_portable(outs, start, regs))
            }
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => with_tiles::<{ avx::TILE_AVX2 }, _>(tiles, |regs| {
                // SAFETY: `Path::detect` returns `Avx2` only when the CPU has AVX2 and
                // FMA, the only requirement of `run_range_avx2`.
                // `fused::tests::vector_paths_match_the_generic_one` runs this path.
                unsafe { avx::run_range_avx2(self, outs, start, regs) }
            }),
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => with_tiles::<{ avx::TILE_AVX512 }, _>(tiles, |regs| {
                // SAFETY: as above; `Avx512` means AVX-512F/VL, AVX2 and FMA.
                unsafe { avx::run_range_avx512(self, outs, start, regs) }
            }),
        }
    }

    /// Runs the program over `outs` (output elements from `start` on), halving them at
    /// a tile boundary across `rayon::join` (which needs no allocation) while they are
    /// longer than `chunk` elements.
    fn split_run(&self, path: Path, outs: &mut [&mut [f32]], start: usize, chunk: usize) {
        let len = outs.first().map_or(0, |o| o.len());
        if len <= chunk {
            self.run(path, outs, start);
            return;
        }
        let tile = path.tile();
        let mid = (len / 2).div_ceil(tile) * tile;
        join_split(
            outs,
            mid,
            |left| self.split_run(path, left, start, chunk),
            |right| self.split_run(path, right, start + mid, chunk),
        );
    }

    /// The portable path: whole tiles of `N`, then the partial last one.
    fn run_portable<const N: usize>(
        &self,
        outs: &mut [&mut [f32]],
        start: usize,
        regs: &mut [[f32; N]],
    ) {
        let len = outs.first().map_or(0, |o| o.len());
        let mut done = 0;
        while done + N <= len {
            self.run_tile(outs, regs, start, done, N);
            done += N;
        }
        if done < len {
            self.run_tile(outs, regs, start, done, len - done);
        }
    }

    /// Runs the schedule over one tile with portable loops: the `n <= N` output
    /// elements from `done` on in `outs` (`start + done` in the whole output). With
    /// `n < N` (the last tile) only the first `n` elements of each register matter:
    /// contiguous inputs are read for those only, and the rest hold stale values
    /// that nothing reads.
    #[inline(always)]
    pub(super) fn run_tile<const N: usize>(
        &self,
        outs: &mut [&mut [f32]],
        regs: &mut [[f32; N]],
        start: usize,
        done: usize,
        n: usize,
    ) {
        let at = start + done;
        let mut acc = [0f32; N];
        for s in &self.sched.steps {
            match *s {
                AccInstr::Gather(k, t) => self.gather(k, at, &mut regs[t as usize][..n]),
                AccInstr::Keep(j, t) => {
                    regs[t as usize][..n].copy_from_slice(&outs[j as usize][done..done + n])
                }
                AccInstr::Load(Src::Tile(t)) => acc = regs[t as usize],
                AccInstr::Load(x) => {
                    acc[..n].copy_from_slice(self.part(outs, regs, x, at, done, n))
                }
                AccInstr::Unary(op) => unary_acc(op, &mut acc),
                AccInstr::AccOp(op, x) => {
                    binary_acc(op, &mut acc, self.part(outs, regs, x, at, done, n), true)
                }
                AccInstr::OpAcc(op, x) => {
                    binary_acc(op, &mut acc, self.part(outs, regs, x, at, done, n), false)
                }
                AccInstr::Square(op) => {
                    let a = acc;
                    binary_acc(op, &mut acc, &a, true)
                }
                AccInstr::Save(t) => regs[t as usize] = acc,
                AccInstr::Output(j) => outs[j as usize][done..done + n].copy_from_slice(&acc[..n]),
            }
        }
    }

    /// The first `n` elements of operand `x` for the tile at `at` (`done` in `outs`).
    #[inline(always)]
    pub(super) fn part<'a, const N: usize>(
        &'a self,
        outs: &'a [&mut [f32]],
        regs: &'a [[f32; N]],
        x: Src,
        at: usize,
        done: usize,
        n: usize,
    ) -> &'a [f32] {
        match x {
            Src::Input(k) => self.whole(k, at, n),
            Src::Tile(t) => &regs[t as usize][..n],
            Src::Output(j) => &outs[j as usize][done..done + n],
        }
    }

    /// Elements `at..at + n` of contiguous input `k` (inside the input: `at + n` is at
    /// most the output's length).
    #[inline(always)]
    fn whole(&self, k: u16, at: usize, n: usize) -> &[f32] {
        let (data, l) = self.inputs[k as usize];
        &data[l.offset + at..l.offset + at + n]
    }

    /// Copies elements `at..at + dst.len()` of input `k`, read through its layout.
    #[inline(always)]
    pub(super) fn gather(&self, k: u16, at: usize, dst: &mut [f32]) {
        let (data, l) = self.inputs[k as usize];
        if l.is_contiguous() {
            dst.copy_from_slice(&data[l.offset + at..l.offset + at + dst.len()]);
        } else {
            copy_runs(data, &self.walks[k as usize], at, dst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, UnaryOp};
    use crate::kernels::fused::program::Instr;
    use crate::kernels::fused::testutil::{affine_op, paths, run, same_bits, specials};
    use crate::kernels::testutil::Rng;

    /// Every path gives the same bits as the portable one, for every step kind
    /// (accumulator on either side, squares, spills, gathers of broadcast and
    /// transposed inputs, an input as an output, several outputs, partial tiles) and
    /// for every op, on NaNs, signed zeros and infinities.
    #[test]
    fn vector_paths_match_the_portable_one() {
        let mut rng = Rng::new(9);
        let (rows, cols) = (3, 700);
        let a = specials(&mut rng, rows * cols);
        let la = Layout::contiguous(&[rows, cols]);
        let b = specials(&mut rng, cols);
        let lb = Layout::contiguous(&[cols])
            .broadcast_as(&[rows, cols])
            .unwrap();
        let c = specials(&mut rng, rows * cols);
        let lc = Layout::contiguous(&[cols, rows]).permute(&[1, 0]);
        let mixed = FusedProgram {
            inputs: 3,
            instrs: vec![
                Instr::Input(0),
                Instr::Input(1),
                Instr::Binary(BinaryOp::Maximum, 0, 1), // r2: load a, then acc ⊕ b
                Instr::Binary(BinaryOp::Sub, 1, 2),     // b - acc
                Instr::Binary(BinaryOp::Div, 3, 3),     // square
                Instr::Binary(BinaryOp::Minimum, 0, 4), // a min acc
                Instr::Unary(UnaryOp::Relu, 5),
                Instr::Unary(UnaryOp::Sqrt, 6),
                Instr::Unary(UnaryOp::Recip, 7),
                Instr::Unary(UnaryOp::Neg, 8),
                Instr::Unary(UnaryOp::Abs, 9),
                Instr::Unary(affine_op(-1.5, 0.25), 10),
                Instr::Unary(UnaryOp::Exp, 11),
                Instr::Binary(BinaryOp::Mul, 2, 12), // r2 was spilled
                Instr::Input(2),
                Instr::Binary(BinaryOp::Maximum, 14, 12), // r12 spilled, c gathered
                Instr::Binary(BinaryOp::Minimum, 15, 13),
                Instr::Binary(BinaryOp::Add, 16, 0),
                Instr::Binary(BinaryOp::Div, 0, 17),
            ],
            outputs: vec![18, 13, 0, 2, 15],
        };
        let inputs = [(&a[..], &la), (&b[..], &lb), (&c[..], &lc)];
        let mut programs = vec![mixed];
        // One program per unary op (and per binary op in both orders) on inputs
        // holding the special values.
        for u in UnaryOp::ALL {
            programs.push(FusedProgram {
                inputs: 3,
                instrs: vec![Instr::Input(0), Instr::Unary(u, 0)],
                outputs: vec![1],
            });
        }
        for op in BinaryOp::ALL {
            programs.push(FusedProgram {
                inputs: 3,
                instrs: vec![
                    Instr::Input(0),
                    Instr::Input(2),
                    Instr::Unary(UnaryOp::Neg, 1),
                    Instr::Binary(op, 0, 2), // in ⊕ acc
                    Instr::Binary(op, 3, 2), // acc ⊕ spill
                    Instr::Binary(op, 2, 4), // spill ⊕ acc
                ],
                outputs: vec![3, 5],
            });
        }
        for p in &programs {
            let want = run(Path::Portable, p, &inputs, Par::serial());
            for path in paths() {
                for par in crate::kernels::testutil::pars() {
                    let got = run(path, p, &inputs, par);
                    same_bits(&want, &got, &format!("{path:?} {par:?} {p}"));
                }
            }
        }
    }

    /// Outputs large enough for non-temporal stores, at every misalignment (the
    /// aligned head first, the streaming stores after; two outputs misaligned unlike
    /// each other fall back to plain stores), give the portable path's bits.
    #[test]
    fn streaming_stores_match_the_portable_path() {
        let mut rng = Rng::new(31);
        let n = STREAM_MIN_ELEMENTS + 77;
        let x = specials(&mut rng, n);
        let l = Layout::contiguous(&[n]);
        let p = FusedProgram {
            inputs: 1,
            instrs: vec![
                Instr::Input(0),
                Instr::Unary(affine_op(1.5, 0.25), 0),
                Instr::Unary(UnaryOp::Sqrt, 1),
                Instr::Binary(BinaryOp::Maximum, 2, 0),
            ],
            outputs: vec![3, 1],
        };
        let want = run(Path::Portable, &p, &[(&x, &l)], Par::serial());
        for path in paths() {
            for (skip0, skip1) in [(0, 0), (1, 1), (3, 3), (5, 2)] {
                let mut a = vec![0f32; n + 8];
                let mut b = vec![0f32; n + 8];
                let mut outs: Vec<&mut [f32]> =
                    vec![&mut a[skip0..skip0 + n], &mut b[skip1..skip1 + n]];
                run_on(path, &p, &[(&x, &l)], &[], &mut outs, n, Par::all());
                let got = vec![a[skip0..skip0 + n].to_vec(), b[skip1..skip1 + n].to_vec()];
                same_bits(&want, &got, &format!("{path:?} skip {skip0}/{skip1}"));
            }
        }
    }
}
