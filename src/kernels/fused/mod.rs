//! The fused element-wise kernel: a small register program run tile by tile, with the
//! values of a chain kept in vector registers.
//!
//! Fusion (module `fusion`) turns a chain of element-wise f32 ops into a
//! [`FusedProgram`]: a list of instructions in SSA form, where instruction `i` defines
//! register `i` (load input `k`, apply a unary op to a register, combine two registers).
//! [`fused`] first rewrites the program as a `Schedule` for an accumulator machine:
//! each instruction applies to the result of the one before it where it can (the
//! accumulator), reads its other operand straight from a contiguous input or from a
//! *spill tile*, and only registers that are read again later are saved to one. It
//! then runs the schedule over the output tile by tile: on x86-64 with AVX2 or AVX-512
//! (`avx`), the accumulator is eight vectors held in registers (tiles of 64 or 128
//! elements), so a chain costs a few vector instructions per op and element group and
//! memory is touched once per input and once per output, whatever the length of the
//! chain; elsewhere, portable loops the compiler vectorises run each step over tiles of
//! [`BLOCK`] elements in L1. Every path gives the same bits.
//!
//! Inputs that are not contiguous (broadcast, transposed, narrowed) are gathered into
//! a spill tile with the same strided walks as the single-op kernels; the last,
//! partial tile runs on the portable loops over its valid elements only. Large outputs
//! are split across rayon tasks of whole tiles, each at least `MIN_TASK_WORK` elements
//! long.

use std::cell::RefCell;
use std::fmt;
use std::thread::LocalKey;

use parking_lot::Mutex;

use super::math;
use super::par::{join_split, units_per_task, MIN_TASK_WORK};
use super::strided::{copy_runs, Walk};
use super::{check_input, error, KernelError, Par};
use crate::ir::{BinaryOp, Layout, UnaryOp};

#[cfg(target_arch = "x86_64")]
mod avx;

/// Elements per tile of the portable path, whose steps are loops over L1-resident
/// tiles, long enough to amortise their dispatch. (The vector paths use tiles of 64
/// (AVX2) or 128 (AVX-512) elements, held in registers.)
pub const BLOCK: usize = 512;

/// One instruction of a fused program; instruction `i` defines register `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Instr {
    /// Load input `k` (read through its layout).
    Input(u16),
    /// Apply a unary op to a register.
    Unary(UnaryOp, u16),
    /// Combine two registers.
    Binary(BinaryOp, u16, u16),
}

/// A fused element-wise program: instructions in SSA order and the registers written
/// to the outputs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FusedProgram {
    /// Number of inputs the program reads.
    pub inputs: usize,
    /// The instructions; each defines the register of its own index.
    pub instrs: Vec<Instr>,
    /// For each output, the register it receives.
    pub outputs: Vec<u16>,
}

impl FusedProgram {
    /// Element operations per output element: a rough cost, for parallel splitting.
    fn cost(&self) -> usize {
        self.instrs
            .iter()
            .map(|i| match i {
                Instr::Unary(UnaryOp::Gelu | UnaryOp::Powf(_), _) => 8,
                Instr::Unary(UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Sigmoid, _) => 4,
                _ => 1,
            })
            .sum()
    }

    /// Checks that every register is defined before it is used.
    pub(crate) fn check(&self) -> Result<(), KernelError> {
        for (i, ins) in self.instrs.iter().enumerate() {
            let ok = match *ins {
                Instr::Input(k) => (k as usize) < self.inputs,
                Instr::Unary(_, a) => (a as usize) < i,
                Instr::Binary(_, a, b) => (a as usize) < i && (b as usize) < i,
            };
            if !ok {
                return Err(error(
                    "fused",
                    format_args!("instruction {i} ({ins:?}) is malformed"),
                ));
            }
        }
        if let Some(r) = self
            .outputs
            .iter()
            .find(|&&r| r as usize >= self.instrs.len())
        {
            return Err(error(
                "fused",
                format_args!("output register {r} is undefined"),
            ));
        }
        Ok(())
    }
}

impl fmt::Display for FusedProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, ins) in self.instrs.iter().enumerate() {
            match ins {
                Instr::Input(k) => write!(f, "r{i}=in{k}")?,
                Instr::Unary(u, a) => write!(f, "r{i}={}(r{a})", u.name())?,
                Instr::Binary(b, x, y) => write!(f, "r{i}={}(r{x},r{y})", b.name())?,
            }
            f.write_str("; ")?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|r| format!("r{r}")).collect();
        write!(f, "-> [{}]", outs.join(", "))
    }
}

/// Runs `program` over an output of `numel` elements.
///
/// `inputs[k]` is input `k` with a layout already broadcast to the output's dims;
/// `outputs[j]` receives register `program.outputs[j]`, contiguously, and must hold
/// exactly `numel` elements.
pub fn fused(
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    outputs: &mut [&mut [f32]],
    par: Par,
) -> Result<(), KernelError> {
    fused_in_place(program, inputs, &[], outputs, par)
}

/// [`fused`] where some inputs are read from the buffers of the outputs that
/// overwrite them (in-place reuse of a dying input).
///
/// Each pair `(k, j)` of `in_place` says that input `k` is the current contents of
/// `outputs[j]`: its slice in `inputs` is ignored (it may be empty) and its layout
/// must be contiguous from offset 0 (element `i` of the input is element `i` of the
/// output). The kernel reads every element of such an input before it writes the
/// output element at the same index. An input or output may take part in one pair
/// at most.
pub fn fused_in_place(
    program: &FusedProgram,
    inputs: &[(&[f32], &Layout)],
    in_place: &[(usize, usize)],
    outputs: &mut [&mut [f32]],
    par: Par,
) -> Result<(), KernelError> {
    program.check()?;
    if inputs.len() != program.inputs || outputs.len() != program.outputs.len() {
        return Err(error(
            "fused",
            format_args!(
                "{} inputs and {} outputs given for a program of {} and {}",
                inputs.len(),
                outputs.len(),
                program.inputs,
                program.outputs.len()
            ),
        ));
    }
    let numel = match inputs.first() {
        Some((_, l)) => l.numel(),
        None => outputs.first().map_or(0, |o| o.len()),
    };
    for (i, &(k, j)) in in_place.iter().enumerate() {
        let twice = in_place[..i].iter().any(|&(k2, j2)| k2 == k || j2 == j);
        let bad = match inputs.get(k) {
            _ if twice => Some("input or output in two pairs"),
            None => Some("no such input"),
            _ if j >= outputs.len() => Some("no such output"),
            Some((_, l)) if !l.is_contiguous() || l.offset != 0 => {
                Some("the input is not contiguous from offset 0")
            }
            Some(_) => None,
        };
        if let Some(why) = bad {
            return Err(error(
                "fused",
                format_args!("in-place pair (input {k}, output {j}): {why}"),
            ));
        }
    }
    for (k, (src, layout)) in inputs.iter().enumerate() {
        if !in_place.iter().any(|&(i, _)| i == k) {
            check_input("fused", "input", src.len(), layout)?;
        }
        if layout.dims != inputs[0].1.dims {
            return Err(error(
                "fused",
                format_args!(
                    "input {k} has dims {:?}, input 0 {:?}",
                    layout.dims, inputs[0].1.dims
                ),
            ));
        }
    }
    if let Some(o) = outputs.iter().find(|o| o.len() != numel) {
        return Err(error(
            "fused",
            format_args!("an output holds {} elements, {numel} expected", o.len()),
        ));
    }
    run_on(
        Path::detect(),
        program,
        inputs,
        in_place,
        outputs,
        numel,
        par,
    );
    Ok(())
}

/// [`fused_in_place`] after its checks, on the given path (which the CPU must
/// support).
fn run_on(
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
    // Each task gets at least `MIN_TASK_WORK` elements, however cheap the program: a
    // memory-bound kernel streams best in long runs (and per-task costs stay small).
    let per_task = units_per_task(tiles, tile * program.cost(), par).max(MIN_TASK_WORK / tile);
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

/// What the schedule knows of one register.
#[derive(Clone, Copy)]
struct Reg {
    /// The instruction that finds it in the accumulator: the next one that
    /// computes something (inputs leave the accumulator alone).
    next: usize,
    /// Read by another instruction, so it must be kept in a spill tile.
    spill: bool,
    /// Where it is found when not in the accumulator. Every register read from
    /// there is an input or has `spill`, so this is set before it is read.
    at: Src,
}

/// Where a step reads its operand from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    /// Contiguous input `k`, read in place.
    Input(u16),
    /// A spill tile: a saved register or a gathered input.
    Tile(u16),
    /// Output `j`, read before it is written: an input that the output overwrites in
    /// place.
    Output(u16),
}

/// One step of a [`Schedule`]. Steps work on an accumulator (one register over one
/// tile, kept in vector registers by the vector paths) and on spill tiles in L1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Copy input `k` (read through its layout) into spill tile `t`.
    Gather(u16, u16),
    /// Copy output `j` (the input it overwrites in place) into spill tile `t`.
    Keep(u16, u16),
    /// `acc = src`.
    Load(Src),
    /// `acc = op(acc)`.
    Unary(UnaryOp),
    /// `acc = op(acc, src)`.
    AccOp(BinaryOp, Src),
    /// `acc = op(src, acc)`.
    OpAcc(BinaryOp, Src),
    /// `acc = op(acc, acc)`.
    Square(BinaryOp),
    /// `spill tile t = acc`.
    Save(u16),
    /// `output j = acc`.
    Output(u16),
}

/// A [`FusedProgram`] rewritten for an accumulator machine: each instruction works on
/// the result of the one before it where it can, so most values never leave vector
/// registers; a register read again later is saved to a spill tile, an input that is
/// not read in place is gathered into one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Schedule {
    steps: Vec<Step>,
    /// Number of spill tiles the steps use.
    tiles: usize,
}

impl Schedule {
    /// The schedule of a checked `program`; `contiguous(k)` says whether input `k` may
    /// be read in place rather than gathered; `(k, j)` in `aliases` says input `k` is
    /// read from output `j`. An aliased input is read straight from the output when
    /// every such read comes before the output is written; otherwise it is kept in a
    /// spill tile first.
    fn new(
        program: &FusedProgram,
        contiguous: impl Fn(usize) -> bool,
        aliases: &[(usize, usize)],
    ) -> Schedule {
        let alias = |k: usize| aliases.iter().find(|&&(i, _)| i == k).map(|&(_, j)| j);
        let direct = Schedule::build(program, &contiguous, &|k| alias(k).map(|j| (j, false)));
        // The steps reading output `j` that come after a step writing it.
        let late = |j: usize| {
            let (src, out) = (Src::Output(j as u16), Step::Output(j as u16));
            direct.steps.iter().skip_while(|&&s| s != out).any(
                |s| matches!(*s, Step::Load(x) | Step::AccOp(_, x) | Step::OpAcc(_, x) if x == src),
            )
        };
        if !aliases.iter().any(|&(_, j)| late(j)) {
            return direct;
        }
        Schedule::build(program, &contiguous, &|k| alias(k).map(|j| (j, late(j))))
    }

    /// [`Schedule::new`] once the aliased inputs are known: `alias(k)` is the output
    /// input `k` is read from and whether it must be kept in a spill tile first.
    fn build(
        program: &FusedProgram,
        in_place: &dyn Fn(usize) -> bool,
        alias: &dyn Fn(usize) -> Option<(usize, bool)>,
    ) -> Schedule {
        let instrs = &program.instrs;
        let n = instrs.len();
        let mut regs = take_scratch(&REG_SCRATCH, &REG_SPARES);
        regs.resize(
            n,
            Reg {
                next: n,
                spill: false,
                at: Src::Tile(0),
            },
        );
        let mut next = n;
        for i in (0..n).rev() {
            regs[i].next = next;
            if !matches!(instrs[i], Instr::Input(_)) {
                next = i;
            }
        }
        for (j, ins) in instrs.iter().enumerate() {
            let read = match *ins {
                Instr::Input(_) => continue,
                Instr::Unary(_, a) => [a, a],
                Instr::Binary(_, a, b) => [a, b],
            };
            for r in read.map(usize::from) {
                if !matches!(instrs[r], Instr::Input(_)) && regs[r].next != j {
                    regs[r].spill = true;
                }
            }
        }
        let mut steps = take_scratch(&STEP_SCRATCH, &STEP_SPARES);
        let mut tiles = 0u16;
        let mut acc: Option<u16> = None;
        for (i, ins) in instrs.iter().enumerate() {
            let r = i as u16;
            match *ins {
                Instr::Input(k) => {
                    regs[i].at = if let Some((j, keep)) = alias(k as usize) {
                        if keep {
                            // First of all, before any step writes the output.
                            steps.insert(0, Step::Keep(j as u16, tiles));
                            tiles += 1;
                            Src::Tile(tiles - 1)
                        } else {
                            Src::Output(j as u16)
                        }
                    } else if in_place(k as usize) {
                        Src::Input(k)
                    } else {
                        steps.push(Step::Gather(k, tiles));
                        tiles += 1;
                        Src::Tile(tiles - 1)
                    };
                    // An input that is also an output goes through the accumulator.
                    if program.outputs.contains(&r) {
                        steps.push(Step::Load(regs[i].at));
                        acc = Some(r);
                    }
                }
                Instr::Unary(op, a) => {
                    if acc != Some(a) {
                        steps.push(Step::Load(regs[a as usize].at));
                    }
                    steps.push(Step::Unary(op));
                    acc = Some(r);
                }
                Instr::Binary(op, a, b) => {
                    let (la, lb) = (regs[a as usize].at, regs[b as usize].at);
                    if a == b {
                        if acc != Some(a) {
                            steps.push(Step::Load(la));
                        }
                        steps.push(Step::Square(op));
                    } else if acc == Some(a) {
                        steps.push(Step::AccOp(op, lb));
                    } else if acc == Some(b) {
                        steps.push(Step::OpAcc(op, la));
                    } else {
                        steps.push(Step::Load(la));
                        steps.push(Step::AccOp(op, lb));
                    }
                    acc = Some(r);
                }
            }
            if acc != Some(r) {
                continue;
            }
            for (j, _) in program.outputs.iter().enumerate().filter(|(_, &o)| o == r) {
                steps.push(Step::Output(j as u16));
            }
            if regs[i].spill {
                steps.push(Step::Save(tiles));
                regs[i].at = Src::Tile(tiles);
                tiles += 1;
            }
        }
        give_scratch(&REG_SCRATCH, &REG_SPARES, regs);
        Schedule {
            steps,
            tiles: tiles as usize,
        }
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        give_scratch(&STEP_SCRATCH, &STEP_SPARES, std::mem::take(&mut self.steps));
    }
}

thread_local! {
    /// Emptied step lists of finished schedules, for the next ones on this thread (a
    /// fixed array: keeping a vector never allocates).
    static STEP_SCRATCH: RefCell<[Option<Vec<Step>>; 2]> = const { RefCell::new([None, None]) };
    /// Emptied register tables of [`Schedule::build`].
    static REG_SCRATCH: RefCell<[Option<Vec<Reg>>; 2]> = const { RefCell::new([None, None]) };
}

/// Vectors made ahead for the threads that may run programs at once (rayon's workers,
/// the threads that flush, a few more), each with room for the usual program: a
/// thread whose own list is empty takes one instead of allocating, so which thread
/// rayon happens to pick for a kernel after warm-up never causes an allocation.
struct Spares<T> {
    list: Mutex<Option<Vec<Vec<T>>>>,
    capacity: usize,
}

impl<T> Spares<T> {
    const fn new(capacity: usize) -> Spares<T> {
        Spares {
            list: Mutex::new(None),
            capacity,
        }
    }

    fn take(&self) -> Vec<T> {
        let mut list = self.list.lock();
        let list = list.get_or_insert_with(|| {
            let n = threads_ahead();
            let mut list = Vec::with_capacity(2 * n);
            list.extend((0..n).map(|_| Vec::with_capacity(self.capacity)));
            list
        });
        list.pop()
            .unwrap_or_else(|| Vec::with_capacity(self.capacity))
    }

    /// Keeps an emptied vector for any thread (up to twice the number made ahead).
    fn give(&self, v: Vec<T>) {
        let mut list = self.list.lock();
        if let Some(list) = list.as_mut() {
            if list.len() < list.capacity() {
                list.push(v);
            }
        }
    }
}

/// Step lists made ahead (a 64-op program has at most about 200 steps).
static STEP_SPARES: Spares<Step> = Spares::new(256);
/// Register tables made ahead.
static REG_SPARES: Spares<Reg> = Spares::new(256);

/// An empty vector from this thread's kept ones, or from the spares made ahead.
fn take_scratch<T>(
    kept: &'static LocalKey<RefCell<[Option<Vec<T>>; 2]>>,
    spares: &Spares<T>,
) -> Vec<T> {
    kept.try_with(|k| {
        k.try_borrow_mut()
            .ok()
            .and_then(|mut k| k.iter_mut().find_map(Option::take))
    })
    .ok()
    .flatten()
    .unwrap_or_else(|| spares.take())
}

/// Keeps `v` (emptied) for this thread, or gives it back to the spares.
fn give_scratch<T>(
    kept: &'static LocalKey<RefCell<[Option<Vec<T>>; 2]>>,
    spares: &Spares<T>,
    mut v: Vec<T>,
) {
    v.clear();
    if v.capacity() == 0 {
        return;
    }
    let mut v = Some(v);
    let _ = kept.try_with(|k| {
        if let Ok(mut k) = k.try_borrow_mut() {
            if let Some(free) = k.iter_mut().find(|x| x.is_none()) {
                *free = v.take();
            }
        }
    });
    if let Some(v) = v {
        spares.give(v);
    }
}

/// How many threads may run programs at once, for the spares made ahead: the cores
/// (rayon's default pool size) and a few more. Asking rayon itself would start its
/// pool, whose idle workers then cost streams that never use it.
fn threads_ahead() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) + 4
}

/// Floats per spare block: 8 portable tiles or 32 AVX-512 ones (the usual schedule
/// has a handful). Kept small on purpose: every new thread takes one, and 64 KiB blocks
/// made a thread's first pass 4x slower (fresh pages on each thread's first use and
/// trimmed at its exit), which cost the two-thread MLP bench 20%.
const SPARE_TILE_FLOATS: usize = 8 * BLOCK;

/// Spill-tile memory made ahead (empty vectors with room for [`SPARE_TILE_FLOATS`]):
/// a thread's first program takes one instead of allocating.
static TILE_SPARES: Spares<f32> = Spares::new(SPARE_TILE_FLOATS);

/// Calls `f` with `count` spill tiles of `N` floats from this thread's scratch (grown
/// when too short, never shrunk), so running a program allocates nothing after
/// warm-up. Tiles hold stale values: a schedule writes a tile before reading it.
fn with_tiles<const N: usize, R>(count: usize, f: impl FnOnce(&mut [[f32; N]]) -> R) -> R {
    thread_local! {
        static TILES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    let len = count * N;
    let mut f = Some(f);
    let done = TILES.try_with(|t| {
        // A program never runs inside another on one thread; if one somehow did, the
        // borrow fails and that run gets tiles of its own.
        let mut t = t.try_borrow_mut().ok()?;
        if t.capacity() == 0 {
            *t = TILE_SPARES.take();
        }
        if t.len() < len {
            // Within the spare's room when it fits (no allocation), doubled beyond.
            let room = if len <= t.capacity() {
                t.capacity()
            } else {
                len.next_power_of_two()
            };
            t.resize(room, 0.0);
        }
        let (tiles, _) = t[..len].as_chunks_mut::<N>();
        Some((f.take().expect("called once"))(tiles))
    });
    match done {
        Ok(Some(r)) => r,
        _ => (f.take().expect("not called yet"))(&mut vec![[0f32; N]; count]),
    }
}

/// How the tiles are run: with AVX vectors held in registers, or with the portable
/// loops (vectorised by the compiler over larger tiles in L1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
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
    fn detect() -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Path::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
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
struct Job<'a> {
    sched: &'a Schedule,
    inputs: &'a [(&'a [f32], &'a Layout)],
    walks: &'a [Walk<1>],
    /// Write outputs with non-temporal stores: they are too large to stay in cache for
    /// their readers anyway ([`STREAM_MIN_ELEMENTS`]).
    stream: bool,
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
    fn run_tile<const N: usize>(
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
                Step::Gather(k, t) => self.gather(k, at, &mut regs[t as usize][..n]),
                Step::Keep(j, t) => {
                    regs[t as usize][..n].copy_from_slice(&outs[j as usize][done..done + n])
                }
                Step::Load(Src::Tile(t)) => acc = regs[t as usize],
                Step::Load(x) => acc[..n].copy_from_slice(self.part(outs, regs, x, at, done, n)),
                Step::Unary(op) => unary_acc(op, &mut acc),
                Step::AccOp(op, x) => {
                    binary_acc(op, &mut acc, self.part(outs, regs, x, at, done, n), true)
                }
                Step::OpAcc(op, x) => {
                    binary_acc(op, &mut acc, self.part(outs, regs, x, at, done, n), false)
                }
                Step::Square(op) => {
                    let a = acc;
                    binary_acc(op, &mut acc, &a, true)
                }
                Step::Save(t) => regs[t as usize] = acc,
                Step::Output(j) => outs[j as usize][done..done + n].copy_from_slice(&acc[..n]),
            }
        }
    }

    /// The first `n` elements of operand `x` for the tile at `at` (`done` in `outs`).
    #[inline(always)]
    fn part<'a, const N: usize>(
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
    fn gather(&self, k: u16, at: usize, dst: &mut [f32]) {
        let (data, l) = self.inputs[k as usize];
        if l.is_contiguous() {
            dst.copy_from_slice(&data[l.offset + at..l.offset + at + dst.len()]);
        } else {
            copy_runs(data, &self.walks[k as usize], at, dst);
        }
    }
}

/// `acc[i] = op(acc[i])`; one loop per op so that each is vectorised.
#[inline(always)]
fn unary_acc(op: UnaryOp, acc: &mut [f32]) {
    #[inline(always)]
    fn map(acc: &mut [f32], f: impl Fn(f32) -> f32) {
        for x in acc.iter_mut() {
            *x = f(*x);
        }
    }
    match op {
        UnaryOp::Exp => map(acc, math::exp),
        UnaryOp::Log => map(acc, f32::ln),
        UnaryOp::Sqrt => map(acc, f32::sqrt),
        UnaryOp::Recip => map(acc, |x| 1.0 / x),
        UnaryOp::Neg => map(acc, |x| -x),
        UnaryOp::Abs => map(acc, f32::abs),
        UnaryOp::Tanh => map(acc, math::tanh),
        UnaryOp::Sigmoid => map(acc, math::sigmoid),
        UnaryOp::Relu => map(acc, math::relu),
        // The loop compiled for the CPU's SIMD level (scalar, it costs ~10x more).
        UnaryOp::Gelu => math::gelu_in_place(acc),
        UnaryOp::GeluTanh => map(acc, math::gelu_tanh),
        UnaryOp::Silu => map(acc, math::silu),
        UnaryOp::Affine { mul, add } => {
            let (m, c) = affine(mul, add);
            map(acc, move |x| x * m + c)
        }
        UnaryOp::Powf(e) => {
            let e = f64::from_bits(e) as f32;
            map(acc, move |x| x.powf(e))
        }
    }
}

/// The f32 multiplier and addend of an `Affine` op.
#[inline(always)]
fn affine(mul: u64, add: u64) -> (f32, f32) {
    (f64::from_bits(mul) as f32, f64::from_bits(add) as f32)
}

/// `acc[i] = op(acc[i], x[i])` (`acc_left`) or `op(x[i], acc[i])`, for the elements
/// both have; one loop per op so that each is vectorised.
#[inline(always)]
fn binary_acc(op: BinaryOp, acc: &mut [f32], x: &[f32], acc_left: bool) {
    use crate::ir::Element;
    #[inline(always)]
    fn zip(acc: &mut [f32], x: &[f32], f: impl Fn(f32, f32) -> f32) {
        for (a, &y) in acc.iter_mut().zip(x) {
            *a = f(*a, y);
        }
    }
    let (max, min) = (<f32 as Element>::maximum, <f32 as Element>::minimum);
    match (op, acc_left) {
        (BinaryOp::Add, _) => zip(acc, x, |a, y| a + y),
        (BinaryOp::Mul, _) => zip(acc, x, |a, y| a * y),
        (BinaryOp::Sub, true) => zip(acc, x, |a, y| a - y),
        (BinaryOp::Sub, false) => zip(acc, x, |a, y| y - a),
        (BinaryOp::Div, true) => zip(acc, x, |a, y| a / y),
        (BinaryOp::Div, false) => zip(acc, x, |a, y| y / a),
        (BinaryOp::Maximum, true) => zip(acc, x, max),
        (BinaryOp::Maximum, false) => zip(acc, x, move |a, y| max(y, a)),
        (BinaryOp::Minimum, true) => zip(acc, x, min),
        (BinaryOp::Minimum, false) => zip(acc, x, move |a, y| min(y, a)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{rand_f32, Rng};
    use crate::kernels::{binary, unary};

    /// `gelu(a * b + a)` and `exp(-a)` over broadcast and transposed inputs, fused,
    /// against the same ops one kernel at a time.
    #[test]
    fn matches_single_op_kernels() {
        let mut rng = Rng::new(5);
        for dims in [
            vec![3usize, 700],
            vec![2, 5, 7],
            vec![1],
            vec![BLOCK * 3 + 5],
        ] {
            let (a, la) = rand_f32(&mut rng, &dims);
            let (b, lb) = rand_f32(&mut rng, &dims);
            let p = FusedProgram {
                inputs: 2,
                instrs: vec![
                    Instr::Input(0),
                    Instr::Input(1),
                    Instr::Binary(BinaryOp::Mul, 0, 1),
                    Instr::Binary(BinaryOp::Add, 2, 0),
                    Instr::Unary(UnaryOp::Gelu, 3),
                    Instr::Unary(UnaryOp::Neg, 0),
                    Instr::Unary(UnaryOp::Exp, 5),
                ],
                outputs: vec![4, 6],
            };
            let n = la.numel();
            for par in crate::kernels::testutil::pars() {
                let (mut o1, mut o2) = (vec![0f32; n], vec![0f32; n]);
                fused(&p, &[(&a, &la), (&b, &lb)], &mut [&mut o1, &mut o2], par).unwrap();
                let c = Layout::contiguous(&dims);
                let (mut ab, mut s, mut g, mut na, mut e) = (
                    vec![0f32; n],
                    vec![0f32; n],
                    vec![0f32; n],
                    vec![0f32; n],
                    vec![0f32; n],
                );
                binary(BinaryOp::Mul, &a, &la, &b, &lb, &mut ab, par).unwrap();
                binary(BinaryOp::Add, &ab, &c, &a, &la, &mut s, par).unwrap();
                unary(UnaryOp::Gelu, &s, &c, &mut g, par).unwrap();
                unary(UnaryOp::Neg, &a, &la, &mut na, par).unwrap();
                unary(UnaryOp::Exp, &na, &c, &mut e, par).unwrap();
                assert_eq!(o1, g, "{dims:?}");
                assert_eq!(o2, e, "{dims:?}");
            }
        }
    }

    /// Every path this CPU can run.
    fn paths() -> Vec<Path> {
        let mut v = vec![Path::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(Path::Avx2);
            }
            if Path::detect() == Path::Avx512 {
                v.push(Path::Avx512);
            }
        }
        v
    }

    /// Runs `p` on `path` and returns its outputs.
    fn run(path: Path, p: &FusedProgram, inputs: &[(&[f32], &Layout)], par: Par) -> Vec<Vec<f32>> {
        let n = inputs[0].1.numel();
        let mut outs = vec![vec![0f32; n]; p.outputs.len()];
        let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
        run_on(path, p, inputs, &[], &mut refs, n, par);
        outs
    }

    fn affine_op(m: f64, c: f64) -> UnaryOp {
        UnaryOp::Affine {
            mul: m.to_bits(),
            add: c.to_bits(),
        }
    }

    /// Values that exercise the NaN, signed-zero and infinity rules, then random ones.
    fn specials(rng: &mut Rng, n: usize) -> Vec<f32> {
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

    fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
        for (j, (x, y)) in a.iter().zip(b).enumerate() {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                assert_eq!(
                    u.to_bits(),
                    v.to_bits(),
                    "{what}: output {j}[{i}]: {u} vs {v}"
                );
            }
        }
    }

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
        let unary = [
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Recip,
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Relu,
            UnaryOp::Gelu,
            UnaryOp::GeluTanh,
            UnaryOp::Silu,
            affine_op(0.5, -2.0),
            UnaryOp::Powf(1.5f64.to_bits()),
        ];
        for u in unary {
            programs.push(FusedProgram {
                inputs: 3,
                instrs: vec![Instr::Input(0), Instr::Unary(u, 0)],
                outputs: vec![1],
            });
        }
        let binary = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Maximum,
            BinaryOp::Minimum,
        ];
        for op in binary {
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

    /// A chain that reads its input three times keeps everything in the accumulator:
    /// no spill, no gather, one step per op plus the load and the store.
    #[test]
    fn chains_stay_in_the_accumulator() {
        let p = FusedProgram {
            inputs: 1,
            instrs: vec![
                Instr::Input(0),
                Instr::Unary(affine_op(1.5, 0.1), 0),
                Instr::Unary(UnaryOp::Relu, 1),
                Instr::Unary(UnaryOp::Sqrt, 2),
                Instr::Binary(BinaryOp::Mul, 3, 0),
                Instr::Unary(UnaryOp::Neg, 4),
                Instr::Unary(UnaryOp::Abs, 5),
                Instr::Binary(BinaryOp::Maximum, 6, 0),
                Instr::Unary(affine_op(0.5, 0.0), 7),
            ],
            outputs: vec![8],
        };
        let s = Schedule::new(&p, |_| true, &[]);
        assert_eq!(s.tiles, 0);
        assert_eq!(s.steps.len(), 10, "{:?}", s.steps);
        assert_eq!(s.steps[0], Step::Load(Src::Input(0)));
        assert_eq!(s.steps[4], Step::AccOp(BinaryOp::Mul, Src::Input(0)));
        assert_eq!(s.steps[9], Step::Output(0));
        // Not read in place: the input is gathered once into a tile.
        let s = Schedule::new(&p, |_| false, &[]);
        assert_eq!(s.tiles, 1);
        assert_eq!(s.steps[0], Step::Gather(0, 0));
    }

    /// An input read from the output that overwrites it gives what a separate input
    /// gives, on every path, whether it can be read straight from the output or must
    /// be kept first (read again after the output is written).
    #[test]
    fn in_place_inputs_match_separate_ones() {
        let mut rng = Rng::new(3);
        let n = 1000;
        let x = specials(&mut rng, n);
        let y = specials(&mut rng, n);
        let l = Layout::contiguous(&[n]);
        let direct = FusedProgram {
            inputs: 2,
            instrs: vec![
                Instr::Input(0),
                Instr::Input(1),
                Instr::Binary(BinaryOp::Sub, 1, 0),
                Instr::Unary(UnaryOp::Sqrt, 2),
                Instr::Binary(BinaryOp::Maximum, 0, 3),
            ],
            outputs: vec![4],
        };
        let late = FusedProgram {
            inputs: 2,
            instrs: vec![
                Instr::Input(0),
                Instr::Input(1),
                Instr::Unary(UnaryOp::Neg, 0),
                Instr::Binary(BinaryOp::Mul, 2, 0), // reads input 0 after output 0
                Instr::Binary(BinaryOp::Minimum, 1, 3),
            ],
            outputs: vec![2, 4],
        };
        assert!(!Schedule::new(&direct, |_| true, &[(0, 0)])
            .steps
            .iter()
            .any(|s| matches!(s, Step::Keep(..))));
        assert_eq!(
            Schedule::new(&late, |_| true, &[(0, 0)]).steps[0],
            Step::Keep(0, 0)
        );
        // Input 1 is loaded after output 0 is written.
        let after = FusedProgram {
            inputs: 2,
            instrs: vec![
                Instr::Input(0),
                Instr::Unary(affine_op(2.0, 1.0), 0),
                Instr::Input(1),
                Instr::Binary(BinaryOp::Maximum, 2, 1),
            ],
            outputs: vec![1, 3],
        };
        assert_eq!(
            Schedule::new(&after, |_| true, &[(1, 0)]).steps[0],
            Step::Keep(0, 0)
        );
        for (p, pairs) in [
            (&direct, vec![(0, 0)]),
            (&late, vec![(0, 0), (1, 1)]),
            (&after, vec![(1, 0)]),
        ] {
            let want = run(Path::Portable, p, &[(&x, &l), (&y, &l)], Par::serial());
            for path in paths() {
                for par in crate::kernels::testutil::pars() {
                    let mut outs = vec![x.clone(); p.outputs.len()];
                    for &(k, j) in &pairs {
                        outs[j] = [&x, &y][k].clone();
                    }
                    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                    let ins = [(&x[..], &l), (&y[..], &l)];
                    let ins: Vec<(&[f32], &Layout)> = ins
                        .iter()
                        .enumerate()
                        .map(|(k, &(d, l))| {
                            let aliased = pairs.iter().any(|&(i, _)| i == k);
                            (if aliased { &[][..] } else { d }, l)
                        })
                        .collect();
                    run_on(path, p, &ins, &pairs, &mut refs, n, par);
                    same_bits(&want, &outs, &format!("{path:?} {par:?} {p}"));
                }
            }
        }
        // Bad pairs are errors.
        let mut o = vec![0f32; n];
        for pairs in [vec![(2, 0)], vec![(0, 1)], vec![(0, 0), (1, 0)]] {
            let r = fused_in_place(
                &direct,
                &[(&x, &l), (&y, &l)],
                &pairs,
                &mut [&mut o],
                Par::serial(),
            );
            assert!(r.is_err(), "{pairs:?}");
        }
        let t = Layout::contiguous(&[2, n / 2]).permute(&[1, 0]);
        let neg = FusedProgram {
            inputs: 1,
            instrs: vec![Instr::Input(0), Instr::Unary(UnaryOp::Neg, 0)],
            outputs: vec![1],
        };
        assert!(
            fused_in_place(&neg, &[(&x, &t)], &[(0, 0)], &mut [&mut o], Par::serial()).is_err()
        );
    }

    #[test]
    fn malformed_programs_and_sizes_are_errors() {
        let a = vec![1.0f32; 4];
        let l = Layout::contiguous(&[4]);
        let bad = FusedProgram {
            inputs: 1,
            instrs: vec![Instr::Unary(UnaryOp::Neg, 0)],
            outputs: vec![0],
        };
        let mut o = vec![0f32; 4];
        assert!(fused(&bad, &[(&a, &l)], &mut [&mut o], Par::serial()).is_err());
        let ok = FusedProgram {
            inputs: 1,
            instrs: vec![Instr::Input(0)],
            outputs: vec![0],
        };
        let mut short = vec![0f32; 3];
        assert!(fused(&ok, &[(&a, &l)], &mut [&mut short], Par::serial()).is_err());
        assert!(fused(&ok, &[(&a[..2], &l)], &mut [&mut o], Par::serial()).is_err());
        fused(&ok, &[(&a, &l)], &mut [&mut o], Par::serial()).unwrap();
        assert_eq!(o, a);
    }
}
