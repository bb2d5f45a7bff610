//! A differential fuzzer: random programs over every public op of `Tensor`, run by
//! eight threads at once and compared value by value with a single-threaded run of the
//! same program with fusion off.
//!
//! A program is plain data, made from a seed (`generate`): a list of steps in one global
//! order, each done by one of eight threads: record an op, read a value, drop a
//! handle, send a handle (still pending) to another thread through a crossbeam channel,
//! receive one, sync, run `rayon::spawn` / `rayon::scope` jobs that record and read,
//! trim the pools or set small plan-cache and pool limits (engine-wide, while the others
//! run), and end (normally, after a sync, or by a planned panic while holding tensors).
//! Threads end with pending work, some after running a matmul and with another one
//! pending; some index ops get indices computed at run time that are out of range, so
//! that the kernel fails and exactly the values computed from it must fail. Ops with
//! invalid arguments are generated too: they must return the same `Err` on both sides
//! and record nothing.
//!
//! While generating, a model follows every value: dims, dtype, whether it must fail,
//! and a bound on how far a fused run may drift from the unfused one (0 for ops that
//! must agree bit for bit; sums, matmuls, softmax and norms may reassociate). The
//! program is then interpreted twice: by one thread with `set_fusion(false)`
//! (`run_reference`) and by eight threads (`run_threads`); every outcome (record-time
//! errors, layouts, read values and errors) is compared, and after each program
//! `stats()` must show no live buffer and no stream beyond those of the threads still
//! alive (the test thread's and the rayon workers', which are flushed first).
//!
//! Environment:
//! - `STREAMFUSE_FUZZ_PROGRAMS=N`: run N programs (default sized for CI);
//! - `STREAMFUSE_FUZZ_SEED=S`: run the one program of seed S (to replay a failure);
//! - `STREAMFUSE_FUZZ_START=S`: the first seed (default 0);
//! - `STREAMFUSE_FUZZ_SKIP=a,b`: leave features out: `exit_matmul`, `rayon`, `poison`,
//!   `panic`, `invalid`, `big`, `limits`;
//! - `STREAMFUSE_FUZZ_TIMEOUT=secs`: the watchdog's limit per program (default 120);
//! - `STREAMFUSE_FUZZ_MAX_FAILURES=N`: stop after N failing programs (default 5);
//! - `STREAMFUSE_FUZZ_VERBOSE=1`: print each seed before it runs (uncaptured, so that an
//!   abort names its program) and the drift statistics at the end.
//!
//! A program depends on its seed and on the features left out: a replay needs both (the
//! failure report prints the line). A hang is ended by the watchdog with the seed and
//! the program; an abort is preceded by a line naming the seed.
//!
//! This file holds one test on purpose: it checks engine-wide counters.

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam::channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use streamfuse::{DType, Error, Tensor};
use streamfuse::{KeyWindow, Layout};

/// Threads per program.
const THREADS: usize = 8;
/// The queue limit of streams that must never flush by themselves.
const HUGE_QUEUE: usize = 1 << 30;
/// f32 rounding unit, rounded up.
const EPS: f64 = 1.2e-7;
/// The drift bound of ops that may reassociate even on exact inputs.
const TINY: f64 = 1e-30;
/// Programs run by default: sized so that a debug build on 2 cores stays well under a
/// minute.
const DEFAULT_PROGRAMS: u64 = 1000;

// ---------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------

/// Features that can be left out while developing (`STREAMFUSE_FUZZ_SKIP`).
#[derive(Clone, Copy, Debug, Default)]
struct Skip {
    /// Threads ending with a pending matmul after having run one.
    exit_matmul: bool,
    /// `rayon::spawn` / `rayon::scope` jobs.
    rayon: bool,
    /// Index ops that fail while running.
    poison: bool,
    /// Threads that panic on purpose.
    panic: bool,
    /// Ops with invalid arguments.
    invalid: bool,
    /// Programs with tensors large enough to split kernels across rayon.
    big: bool,
    /// Small plan-cache and pool limits changed while threads run, and `trim_pools()`.
    limits: bool,
}

const FEATURES: [&str; 7] = [
    "exit_matmul",
    "rayon",
    "poison",
    "panic",
    "invalid",
    "big",
    "limits",
];

impl Skip {
    fn parse(s: &str) -> Skip {
        let mut skip = Skip::default();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "exit_matmul" => skip.exit_matmul = true,
                "rayon" => skip.rayon = true,
                "poison" => skip.poison = true,
                "panic" => skip.panic = true,
                "invalid" => skip.invalid = true,
                "big" => skip.big = true,
                "limits" => skip.limits = true,
                _ => panic!("STREAMFUSE_FUZZ_SKIP: unknown feature {name:?} (known: {FEATURES:?})"),
            }
        }
        skip
    }
}

struct Config {
    first: u64,
    count: u64,
    skip: Skip,
    timeout: Duration,
    verbose: bool,
    max_failures: u64,
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

impl Config {
    fn from_env() -> Config {
        let (first, count) = match env_u64("STREAMFUSE_FUZZ_SEED") {
            Some(seed) => (seed, 1),
            None => (
                env_u64("STREAMFUSE_FUZZ_START").unwrap_or(0),
                env_u64("STREAMFUSE_FUZZ_PROGRAMS").unwrap_or(DEFAULT_PROGRAMS),
            ),
        };
        Config {
            first,
            count,
            skip: Skip::parse(&std::env::var("STREAMFUSE_FUZZ_SKIP").unwrap_or_default()),
            timeout: Duration::from_secs(env_u64("STREAMFUSE_FUZZ_TIMEOUT").unwrap_or(120)),
            verbose: std::env::var("STREAMFUSE_FUZZ_VERBOSE").is_ok_and(|v| v != "0"),
            max_failures: env_u64("STREAMFUSE_FUZZ_MAX_FAILURES").unwrap_or(5),
        }
    }
}

// ---------------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------------

/// splitmix64: small, fast, and the same everywhere.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    /// An integer in `lo..=hi`.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as usize) as i64
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i + 1));
        }
    }
}

// ---------------------------------------------------------------------------------
// Programs as plain data
// ---------------------------------------------------------------------------------

/// A value of the program (an op's output), numbered in order of creation.
type V = usize;

/// Contents of a tensor made by `from_vec`.
#[derive(Clone, Debug)]
enum Data {
    /// Uniform in [-2, 2).
    Uniform(u64),
    /// Integers in `lo..=hi`.
    Ints { seed: u64, lo: i64, hi: i64 },
    /// Mostly uniform, with NaN, infinities, signed zeros, huge, tiny and denormal values.
    Special(u64),
    /// Mostly small integers, with the extremes of the integer types.
    IntSpecial(u64),
    /// Exactly these integers.
    List(Vec<i64>),
}

const SPECIAL_F32: [f32; 13] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1e30,
    -1e30,
    1e-40,
    f32::MAX,
    f32::MIN_POSITIVE,
    88.0,
    -104.0,
    -1.0,
];
const SPECIAL_INT: [i64; 8] = [
    i64::MAX,
    i64::MIN,
    u32::MAX as i64,
    -1,
    1 << 31,
    1 << 53,
    -(1 << 40),
    7,
];

impl Data {
    fn f32s(&self, n: usize) -> Vec<f32> {
        match self {
            Data::Uniform(seed) => {
                let mut r = Rng::new(*seed);
                (0..n).map(|_| (r.unit() * 4.0 - 2.0) as f32).collect()
            }
            Data::Special(seed) => {
                let mut r = Rng::new(*seed);
                (0..n)
                    .map(|_| {
                        if r.chance(0.7) {
                            (r.unit() * 4.0 - 2.0) as f32
                        } else {
                            r.pick(&SPECIAL_F32)
                        }
                    })
                    .collect()
            }
            _ => self.ints(n).into_iter().map(|x| x as f32).collect(),
        }
    }

    fn ints(&self, n: usize) -> Vec<i64> {
        match self {
            Data::Ints { seed, lo, hi } => {
                let mut r = Rng::new(*seed);
                (0..n).map(|_| r.range(*lo, *hi)).collect()
            }
            Data::IntSpecial(seed) => {
                let mut r = Rng::new(*seed);
                (0..n)
                    .map(|_| {
                        if r.chance(0.75) {
                            r.range(0, 9)
                        } else {
                            r.pick(&SPECIAL_INT)
                        }
                    })
                    .collect()
            }
            Data::List(v) => (0..n).map(|i| v.get(i).copied().unwrap_or(0)).collect(),
            Data::Uniform(_) | Data::Special(_) => {
                self.f32s(n).into_iter().map(|x| x as i64).collect()
            }
        }
    }

    /// A bound on the magnitude of the values.
    fn mag(&self) -> f64 {
        match self {
            Data::Uniform(_) => 2.0,
            Data::Ints { lo, hi, .. } => lo.unsigned_abs().max(hi.unsigned_abs()) as f64,
            Data::List(v) => v.iter().map(|x| x.unsigned_abs()).max().unwrap_or(0) as f64,
            Data::Special(_) | Data::IntSpecial(_) => f64::INFINITY,
        }
    }

    /// The values as stored in a tensor of `dtype` (integers), when the generator
    /// knows them: small 1-D integer data.
    fn known(&self, dtype: DType, dims: &[usize]) -> Option<Vec<i64>> {
        if dims.len() != 1 || dims[0] > 16 {
            return None;
        }
        if !matches!(self, Data::Ints { .. } | Data::List(_)) {
            return None;
        }
        let v = self.ints(dims[0]);
        Some(match dtype {
            DType::U32 => v.iter().map(|&x| x as u32 as i64).collect(),
            DType::I64 => v,
            DType::F32 => v.iter().map(|&x| x as f32 as i64).collect(),
            _ => unreachable!("the fuzzer makes no weight-only tensors"),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Un {
    Exp,
    Log,
    Sqrt,
    Recip,
    Neg,
    Abs,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Affine(f32, f32),
    Powf(f32),
}

const UNARY: [Un; 14] = [
    Un::Exp,
    Un::Log,
    Un::Sqrt,
    Un::Recip,
    Un::Neg,
    Un::Abs,
    Un::Tanh,
    Un::Sigmoid,
    Un::Relu,
    Un::Gelu,
    Un::GeluTanh,
    Un::Silu,
    Un::Affine(1.0, 0.0),
    Un::Powf(2.0),
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
}

const BINARY: [Bin; 6] = [
    Bin::Add,
    Bin::Sub,
    Bin::Mul,
    Bin::Div,
    Bin::Maximum,
    Bin::Minimum,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Red {
    Sum,
    SumKeep,
    Mean,
    MeanKeep,
    Max,
    MaxKeep,
    ArgMax,
}

const REDUCE: [Red; 7] = [
    Red::Sum,
    Red::SumKeep,
    Red::Mean,
    Red::MeanKeep,
    Red::Max,
    Red::MaxKeep,
    Red::ArgMax,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum FillKind {
    Zeros,
    Ones,
    /// `Tensor::full` (f32 only).
    Full(f32),
}

/// One call of the `Tensor` API that makes a tensor.
#[derive(Clone, Debug)]
enum Op {
    /// `from_vec`; `extra` elements more than the dims hold (an error when not 0).
    FromVec {
        dtype: DType,
        dims: Vec<usize>,
        data: Data,
        extra: usize,
    },
    Fill {
        kind: FillKind,
        dims: Vec<usize>,
        dtype: DType,
    },
    Unary {
        u: Un,
        x: V,
    },
    Binary {
        b: Bin,
        x: V,
        y: V,
    },
    Cast {
        x: V,
        dtype: DType,
    },
    MatMul {
        x: V,
        y: V,
    },
    Reduce {
        r: Red,
        x: V,
        dim: i64,
    },
    Softmax {
        x: V,
        dim: i64,
    },
    Cumsum {
        x: V,
        dim: i64,
    },
    /// `q.attention_with(k, v, bias, scale, window)` (k and v may have fewer heads).
    Attention {
        q: V,
        k: V,
        v: V,
        bias: Option<V>,
        scale: f32,
        window: KeyWindow,
    },
    LayerNorm {
        x: V,
        w: V,
        b: V,
        eps: f64,
    },
    RmsNorm {
        x: V,
        w: V,
        eps: f64,
    },
    Rotary {
        x: V,
        cos: V,
        sin: V,
    },
    Reshape {
        x: V,
        dims: Vec<usize>,
    },
    Transpose {
        x: V,
        d0: i64,
        d1: i64,
    },
    Permute {
        x: V,
        perm: Vec<usize>,
    },
    Narrow {
        x: V,
        dim: i64,
        start: usize,
        len: usize,
    },
    Unsqueeze {
        x: V,
        dim: i64,
    },
    Squeeze {
        x: V,
        dim: i64,
    },
    BroadcastAs {
        x: V,
        dims: Vec<usize>,
    },
    Contiguous {
        x: V,
    },
    Cat {
        xs: Vec<V>,
        dim: i64,
    },
    IndexSelect {
        x: V,
        idx: V,
        dim: i64,
    },
}

impl Op {
    /// The values the op reads.
    fn inputs(&self) -> Vec<V> {
        match self {
            Op::FromVec { .. } | Op::Fill { .. } => vec![],
            Op::Unary { x, .. }
            | Op::Cast { x, .. }
            | Op::Reduce { x, .. }
            | Op::Softmax { x, .. }
            | Op::Cumsum { x, .. }
            | Op::Reshape { x, .. }
            | Op::Transpose { x, .. }
            | Op::Permute { x, .. }
            | Op::Narrow { x, .. }
            | Op::Unsqueeze { x, .. }
            | Op::Squeeze { x, .. }
            | Op::BroadcastAs { x, .. }
            | Op::Contiguous { x } => vec![*x],
            Op::Binary { x, y, .. } | Op::MatMul { x, y } => vec![*x, *y],
            Op::LayerNorm { x, w, b, .. } => vec![*x, *w, *b],
            Op::RmsNorm { x, w, .. } => vec![*x, *w],
            Op::Rotary { x, cos, sin } => vec![*x, *cos, *sin],
            Op::Attention { q, k, v, bias, .. } => {
                let mut i = vec![*q, *k, *v];
                i.extend(bias);
                i
            }
            Op::Cat { xs, .. } => xs.clone(),
            Op::IndexSelect { x, idx, .. } => vec![*x, *idx],
        }
    }
}

impl Op {
    /// The name of the `Tensor` method (for coverage counts).
    fn name(&self) -> String {
        match self {
            Op::FromVec { .. } => "from_vec".into(),
            Op::Fill { kind, .. } => match kind {
                FillKind::Zeros => "zeros".into(),
                FillKind::Ones => "ones".into(),
                FillKind::Full(_) => "full".into(),
            },
            Op::Unary { u, .. } => match u {
                Un::Affine(..) => "affine".into(),
                Un::Powf(_) => "powf".into(),
                u => format!("{u:?}").to_lowercase(),
            },
            Op::Binary { b, .. } => format!("{b:?}").to_lowercase(),
            Op::Reduce { r, .. } => format!("{r:?}").to_lowercase(),
            other => {
                let d = format!("{other:?}");
                d[..d.find([' ', '{']).unwrap_or(d.len())].to_lowercase()
            }
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::FromVec {
                dtype,
                dims,
                data,
                extra,
            } => {
                write!(f, "from_vec::<{dtype}>({dims:?}, {data:?}")?;
                if *extra != 0 {
                    write!(f, ", {extra} extra")?;
                }
                write!(f, ")")
            }
            Op::Fill { kind, dims, dtype } => write!(f, "{kind:?}({dims:?}, {dtype})"),
            Op::Unary { u, x } => write!(f, "{u:?}(v{x})"),
            Op::Binary { b, x, y } => write!(f, "{b:?}(v{x}, v{y})"),
            Op::Cast { x, dtype } => write!(f, "v{x}.to_dtype({dtype})"),
            Op::MatMul { x, y } => write!(f, "v{x}.matmul(v{y})"),
            Op::Reduce { r, x, dim } => write!(f, "v{x}.{r:?}({dim})"),
            Op::Softmax { x, dim } => write!(f, "v{x}.softmax({dim})"),
            Op::Cumsum { x, dim } => write!(f, "v{x}.cumsum({dim})"),
            Op::Attention {
                q,
                k,
                v,
                bias,
                scale,
                window,
            } => {
                let w = match (window.before, window.after) {
                    (None, None) => "KeyWindow::ALL".to_string(),
                    (b, a) => format!("KeyWindow {{ before: {b:?}, after: {a:?} }}"),
                };
                match bias {
                    Some(b) => write!(
                        f,
                        "v{q}.attention_with(v{k}, v{v}, Some(v{b}), {scale}, {w})"
                    ),
                    None => write!(f, "v{q}.attention_with(v{k}, v{v}, None, {scale}, {w})"),
                }
            }
            Op::LayerNorm { x, w, b, eps } => write!(f, "v{x}.layer_norm(v{w}, v{b}, {eps})"),
            Op::RmsNorm { x, w, eps } => write!(f, "v{x}.rms_norm(v{w}, {eps})"),
            Op::Rotary { x, cos, sin } => write!(f, "v{x}.rotary(v{cos}, v{sin})"),
            Op::Reshape { x, dims } => write!(f, "v{x}.reshape({dims:?})"),
            Op::Transpose { x, d0, d1 } => write!(f, "v{x}.transpose({d0}, {d1})"),
            Op::Permute { x, perm } => write!(f, "v{x}.permute({perm:?})"),
            Op::Narrow { x, dim, start, len } => write!(f, "v{x}.narrow({dim}, {start}, {len})"),
            Op::Unsqueeze { x, dim } => write!(f, "v{x}.unsqueeze({dim})"),
            Op::Squeeze { x, dim } => write!(f, "v{x}.squeeze({dim})"),
            Op::BroadcastAs { x, dims } => write!(f, "v{x}.broadcast_as({dims:?})"),
            Op::Contiguous { x } => write!(f, "v{x}.contiguous()"),
            Op::Cat { xs, dim } => {
                let names: Vec<String> = xs.iter().map(|v| format!("v{v}")).collect();
                write!(f, "cat([{}], {dim})", names.join(", "))
            }
            Op::IndexSelect { x, idx, dim } => write!(f, "v{x}.index_select(v{idx}, {dim})"),
        }
    }
}

/// Where the outputs of a rayon job go.
#[derive(Clone, Copy, Debug)]
enum Dest {
    /// Back to the thread that ran `rayon::scope`.
    Owner,
    /// Through the channel of this thread (which receives it later).
    Thread(usize),
}

/// A rayon job: clones of some of its thread's values in, steps, some values out.
#[derive(Clone, Debug)]
struct Job {
    inputs: Vec<V>,
    body: Vec<Step>,
    outputs: Vec<(V, Dest)>,
}

#[derive(Clone, Debug)]
enum Act {
    /// Record `op`; its output is value `out` (or the op must fail, per the model).
    Make { out: V, op: Op },
    /// `to_vec` as `as_dtype` (an error if that is not the value's dtype).
    Read { v: V, as_dtype: DType },
    /// Drop this holder's handle.
    Drop { v: V },
    /// `streamfuse::sync()` (its result is not compared: which stream holds which
    /// error depends on who drained what).
    Sync,
    /// Send a clone of the handle to thread `to`; drop ours unless `keep`.
    Send { v: V, to: usize, keep: bool },
    /// Wait for value `v` on this thread's channel.
    Recv { v: V },
    /// `rayon::spawn` a job.
    Spawn(Job),
    /// `rayon::scope` running these jobs; waits for them.
    Scope(Vec<Job>),
    /// The thread ends: after `sync()` if `sync`, by a panic if `panic`.
    End { panic: bool, sync: bool },
    /// `streamfuse::trim_pools()`.
    Trim,
    /// `set_plan_cache_limit(plan)` and `set_pool_limit(pool)` (engine-wide, while the
    /// other threads run; put back to the defaults after the program).
    Limits { plan: usize, pool: usize },
}

#[derive(Clone, Debug)]
struct Step {
    /// Unique in the program: the key of the step's outcome.
    id: usize,
    /// The thread (for job steps, the thread that started the job).
    who: usize,
    act: Act,
}

/// Per-thread settings.
#[derive(Clone, Copy, Debug)]
struct ThreadCfg {
    queue_limit: usize,
    kernel_threads: usize,
}

/// What the model knows of a value.
#[derive(Clone, Debug)]
struct Val {
    dims: Vec<usize>,
    dtype: DType,
    /// Whether the op that makes it succeeds at record time.
    ok: bool,
    /// Whether it is computed from an index op that fails while running.
    fails: bool,
    /// A bound on the magnitude of its (non-NaN) elements.
    mag: f64,
    /// A bound on how far a fused, threaded run may be from the reference: 0 means
    /// bit for bit, infinity means not compared.
    err: f64,
    /// Made by `from_vec` (or an alias of such): certainly ready.
    ready: bool,
    /// For integers: every element is in `0..bound`.
    bound: Option<u64>,
    /// For small 1-D integer-valued tensors: the elements.
    known: Option<Vec<i64>>,
}

impl Val {
    fn new(dims: Vec<usize>, dtype: DType, mag: f64, err: f64, fails: bool) -> Val {
        let err = if err > 0.0 && !(mag.is_finite() && mag < 1e30 && err < 1e30) {
            f64::INFINITY
        } else {
            err
        };
        Val {
            dims,
            dtype,
            ok: true,
            fails,
            mag,
            err,
            ready: false,
            bound: None,
            known: None,
        }
    }

    fn failed() -> Val {
        Val {
            ok: false,
            ..Val::new(vec![], DType::F32, 0.0, 0.0, false)
        }
    }

    fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// A generated program.
struct Program {
    seed: u64,
    steps: Vec<Step>,
    vals: Vec<Val>,
    threads: Vec<ThreadCfg>,
    /// Whether any step starts a rayon job.
    uses_rayon: bool,
}

impl Program {
    fn panics(&self, t: usize) -> bool {
        self.steps
            .iter()
            .any(|s| s.who == t && matches!(s.act, Act::End { panic: true, .. }))
    }
}

// ---------------------------------------------------------------------------------
// The model: what each op must give (mirrors the checks of `src/tensor`)
// ---------------------------------------------------------------------------------

enum Inferred {
    /// The op succeeds at record time and makes this value.
    Ok(Val),
    /// The op returns an error at record time.
    Err,
    /// The outcome depends on timing (an index tensor that may or may not be ready
    /// with out-of-range values): never generated.
    Unknown,
}

fn numel_ok(dims: &[usize]) -> bool {
    dims.len() <= 8
        && dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)))
            .is_some_and(|n| n <= isize::MAX as usize / 8)
}

fn resolve(d: i64, rank: usize) -> Option<usize> {
    let b = rank as i64;
    let i = if d < 0 { d + b } else { d };
    (0..b).contains(&i).then_some(i as usize)
}

fn resolve_insert(d: i64, rank: usize) -> Option<usize> {
    resolve(d, rank + 1)
}

fn bcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |x: &[usize], i: usize| {
        if i + x.len() >= rank {
            x[i + x.len() - rank]
        } else {
            1
        }
    };
    (0..rank)
        .map(|i| {
            let (da, db) = (at(a, i), at(b, i));
            match (da, db) {
                _ if da == db => Some(da),
                (1, d) | (d, 1) => Some(d),
                _ => None,
            }
        })
        .collect()
}

fn broadcasts_to(src: &[usize], dims: &[usize]) -> bool {
    dims.len() >= src.len()
        && src
            .iter()
            .zip(&dims[dims.len() - src.len()..])
            .all(|(&s, &d)| s == d || s == 1)
}

/// `a * b` for bounds, with `0 * inf = 0`.
fn prod(a: f64, b: f64) -> f64 {
    if a == 0.0 || b == 0.0 {
        0.0
    } else {
        a * b
    }
}

fn type_max(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f64::INFINITY,
        DType::U32 => u32::MAX as f64,
        DType::I64 => i64::MAX as f64,
        _ => unreachable!("the fuzzer makes no weight-only tensors"),
    }
}

fn unary_num(u: Un, a: &Val) -> (f64, f64) {
    let e = a.err;
    let (mag, err) = match u {
        Un::Neg | Un::Abs | Un::Relu => (a.mag, e),
        Un::Affine(m, c) => {
            let mag = prod(m.abs() as f64, a.mag) + c.abs() as f64;
            (mag, m.abs() as f64 * e + 4.0 * EPS * mag)
        }
        Un::Tanh => (a.mag.min(1.0), e + 4.0 * EPS),
        Un::Sigmoid => (1.0, 0.25 * e + 4.0 * EPS),
        Un::Gelu | Un::GeluTanh | Un::Silu => {
            let mag = a.mag.max(0.3) * 1.13;
            (mag, 1.2 * e + 8.0 * EPS * mag)
        }
        Un::Exp => {
            let mag = a.mag.exp();
            (mag, prod(mag, e.exp_m1()) + 4.0 * EPS * mag)
        }
        Un::Sqrt => (a.mag.sqrt(), f64::INFINITY),
        Un::Log | Un::Recip | Un::Powf(_) => (f64::INFINITY, f64::INFINITY),
    };
    (mag, if e == 0.0 { 0.0 } else { err })
}

fn binary_num(b: Bin, x: &Val, y: &Val) -> (f64, f64) {
    let (ex, ey) = (x.err, y.err);
    let int = x.dtype != DType::F32;
    let (mag, err) = match b {
        Bin::Add => {
            let m = x.mag + y.mag;
            (m, ex + ey + 4.0 * EPS * m)
        }
        Bin::Sub => {
            let m = if x.dtype == DType::U32 {
                u32::MAX as f64
            } else {
                x.mag + y.mag
            };
            (m, ex + ey + 4.0 * EPS * m)
        }
        Bin::Mul => {
            let m = prod(x.mag, y.mag);
            (
                m,
                prod(ex, y.mag) + prod(ey, x.mag) + prod(ex, ey) + 4.0 * EPS * m,
            )
        }
        Bin::Div if int => (x.mag, f64::INFINITY),
        Bin::Div => (f64::INFINITY, f64::INFINITY),
        Bin::Maximum | Bin::Minimum => (x.mag.max(y.mag), ex.max(ey)),
    };
    let mag = if int && mag > 2f64.powi(62) {
        f64::INFINITY
    } else {
        mag
    };
    let err = if ex == 0.0 && ey == 0.0 {
        0.0
    } else if int {
        f64::INFINITY
    } else {
        err
    };
    (mag, err)
}

/// Integer-valued results of an affine map of known integers, when exact in f32.
fn affine_known(k: &[i64], m: f32, c: f32) -> Option<Vec<i64>> {
    if m.fract() != 0.0 || c.fract() != 0.0 {
        return None;
    }
    let out: Vec<i64> = k.iter().map(|&x| x * m as i64 + c as i64).collect();
    out.iter()
        .all(|x| x.unsigned_abs() < 1 << 24)
        .then_some(out)
}

/// Known integers converted by a cast, as the engine does (saturating, via f64).
fn cast_known(k: &[i64], to: DType) -> Vec<i64> {
    k.iter()
        .map(|&x| match to {
            DType::U32 => x.clamp(0, u32::MAX as i64),
            _ => x,
        })
        .collect()
}

fn known_bound(k: &[i64]) -> Option<u64> {
    k.iter()
        .all(|&x| x >= 0)
        .then(|| k.iter().map(|&x| x as u64 + 1).max().unwrap_or(0))
}

/// The largest of the bounds, if every one is known.
fn max_bound(bounds: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    bounds
        .into_iter()
        .try_fold(0u64, |acc, b| b.map(|b| acc.max(b)))
}

struct Model<'a> {
    vals: &'a [Val],
}

impl Model<'_> {
    fn v(&self, x: V) -> &Val {
        &self.vals[x]
    }

    /// A value derived from `inputs` with this shape, dtype and drift.
    fn derived(&self, inputs: &[V], dims: Vec<usize>, dtype: DType, mag: f64, err: f64) -> Val {
        let fails = inputs.iter().any(|&i| self.v(i).fails);
        Val::new(dims, dtype, mag, err, fails)
    }

    /// A view or copy of `x` with new dims: same values.
    fn same_values(&self, x: V, dims: Vec<usize>) -> Inferred {
        let a = self.v(x);
        let mut out = self.derived(&[x], dims, a.dtype, a.mag, a.err);
        out.bound = a.bound;
        Inferred::Ok(out)
    }

    /// What `op` gives. `fresh` is the value made by the step just before on the same
    /// holder, when that holder's stream cannot have flushed it since.
    fn infer(&self, op: &Op, fresh: Option<V>) -> Inferred {
        use Inferred::{Err, Ok};
        match op {
            Op::FromVec {
                dtype,
                dims,
                data,
                extra,
            } => {
                if !numel_ok(dims) || *extra != 0 {
                    return Err;
                }
                let mut v = Val::new(dims.clone(), *dtype, data.mag(), 0.0, false);
                v.ready = true;
                v.known = data.known(*dtype, dims);
                v.bound = match (&v.known, data, dtype) {
                    (Some(k), _, _) => known_bound(k),
                    (None, Data::Ints { lo, hi, .. }, DType::U32 | DType::I64) if *lo >= 0 => {
                        Some(*hi as u64 + 1)
                    }
                    _ => None,
                };
                Ok(v)
            }
            Op::Fill { kind, dims, dtype } => {
                if !numel_ok(dims) {
                    return Err;
                }
                let (x, dtype) = match kind {
                    FillKind::Zeros => (0.0, *dtype),
                    FillKind::Ones => (1.0, *dtype),
                    FillKind::Full(x) => (*x, DType::F32),
                };
                let mag = if x.is_nan() {
                    f64::INFINITY
                } else {
                    x.abs() as f64
                };
                let mut v = Val::new(dims.clone(), dtype, mag, 0.0, false);
                if x.fract() == 0.0 && dims.len() == 1 && dims[0] <= 16 {
                    v.known = Some(vec![x as i64; dims[0]]);
                }
                if dtype != DType::F32 {
                    v.bound = Some(x as u64 + 1);
                }
                Ok(v)
            }
            Op::Unary { u, x } => {
                let a = self.v(*x);
                if a.dtype != DType::F32 {
                    return Err;
                }
                let (mag, err) = unary_num(*u, a);
                let mut v = self.derived(&[*x], a.dims.clone(), DType::F32, mag, err);
                if let (Un::Affine(m, c), Some(k)) = (u, &a.known) {
                    v.known = affine_known(k, *m, *c);
                }
                Ok(v)
            }
            Op::Binary { b, x, y } => {
                let (a, c) = (self.v(*x), self.v(*y));
                if a.dtype != c.dtype {
                    return Err;
                }
                let Some(dims) = bcast(&a.dims, &c.dims) else {
                    return Err;
                };
                if !numel_ok(&dims) {
                    return Err;
                }
                let (mag, err) = binary_num(*b, a, c);
                Ok(self.derived(&[*x, *y], dims, a.dtype, mag, err))
            }
            Op::Cast { x, dtype } => {
                let a = self.v(*x);
                if *dtype == a.dtype {
                    // `to_dtype` to the same dtype returns the tensor itself.
                    return Ok(a.clone());
                }
                let mag = a.mag.min(type_max(*dtype));
                let err = if a.err == 0.0 {
                    0.0
                } else if *dtype == DType::F32 && a.dtype != DType::F32 {
                    a.err
                } else {
                    f64::INFINITY
                };
                let mut v = self.derived(&[*x], a.dims.clone(), *dtype, mag, err);
                v.known = a.known.as_ref().map(|k| cast_known(k, *dtype));
                v.bound = match (&v.known, dtype) {
                    (Some(k), DType::U32 | DType::I64) => known_bound(k),
                    (None, DType::I64) if a.dtype == DType::U32 => a.bound,
                    _ => None,
                };
                Ok(v)
            }
            Op::MatMul { x, y } => self.infer_matmul(*x, *y),
            Op::Reduce { r, x, dim } => self.infer_reduce(*r, *x, *dim),
            Op::Cumsum { x, dim } => self.infer_cumsum(*x, *dim),
            Op::Softmax { x, dim } => {
                let a = self.v(*x);
                let Some(d) = resolve(*dim, a.dims.len()) else {
                    return Err;
                };
                if a.dtype != DType::F32 {
                    return Err;
                }
                let n = a.dims[d] as f64;
                let err = if a.mag.is_finite() {
                    2.0 * a.err + 16.0 * n * EPS * (1.0 + a.mag) + TINY
                } else {
                    f64::INFINITY
                };
                Ok(self.derived(&[*x], a.dims.clone(), DType::F32, 1.0, err))
            }
            Op::LayerNorm { x, w, b, eps } => self.infer_norm(*x, &[*w, *b], *eps),
            Op::RmsNorm { x, w, eps } => self.infer_norm(*x, &[*w], *eps),
            Op::Rotary { x, cos, sin } => self.infer_rotary(*x, *cos, *sin),
            Op::Attention {
                q,
                k,
                v,
                bias,
                scale,
                window,
            } => self.infer_attention(*q, *k, *v, *bias, *scale, *window),
            Op::Reshape { x, dims } => {
                if !numel_ok(dims) || dims.iter().product::<usize>() != self.v(*x).numel() {
                    return Err;
                }
                self.same_values(*x, dims.clone())
            }
            Op::Transpose { x, d0, d1 } => {
                let mut dims = self.v(*x).dims.clone();
                let (Some(a), Some(b)) = (resolve(*d0, dims.len()), resolve(*d1, dims.len()))
                else {
                    return Err;
                };
                dims.swap(a, b);
                self.same_values(*x, dims)
            }
            Op::Permute { x, perm } => {
                let src = &self.v(*x).dims;
                let mut seen = vec![false; src.len()];
                let ok = perm.len() == src.len()
                    && perm
                        .iter()
                        .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
                if !ok {
                    return Err;
                }
                self.same_values(*x, perm.iter().map(|&p| src[p]).collect())
            }
            Op::Narrow { x, dim, start, len } => {
                let mut dims = self.v(*x).dims.clone();
                let Some(d) = resolve(*dim, dims.len()) else {
                    return Err;
                };
                if start.checked_add(*len).is_none_or(|end| end > dims[d]) {
                    return Err;
                }
                dims[d] = *len;
                self.same_values(*x, dims)
            }
            Op::Unsqueeze { x, dim } => {
                let mut dims = self.v(*x).dims.clone();
                let Some(d) = resolve_insert(*dim, dims.len()) else {
                    return Err;
                };
                dims.insert(d, 1);
                if !numel_ok(&dims) {
                    return Err;
                }
                self.same_values(*x, dims)
            }
            Op::Squeeze { x, dim } => {
                let mut dims = self.v(*x).dims.clone();
                let Some(d) = resolve(*dim, dims.len()) else {
                    return Err;
                };
                if dims[d] != 1 {
                    return Err;
                }
                dims.remove(d);
                self.same_values(*x, dims)
            }
            Op::BroadcastAs { x, dims } => {
                if !numel_ok(dims) || !broadcasts_to(&self.v(*x).dims, dims) {
                    return Err;
                }
                self.same_values(*x, dims.clone())
            }
            Op::Contiguous { x } => self.same_values(*x, self.v(*x).dims.clone()),
            Op::Cat { xs, dim } => self.infer_cat(xs, *dim),
            Op::IndexSelect { x, idx, dim } => self.infer_index(*x, *idx, *dim, fresh),
        }
    }

    fn infer_matmul(&self, x: V, y: V) -> Inferred {
        let (a, b) = (self.v(x), self.v(y));
        if a.dtype != DType::F32 || b.dtype != DType::F32 {
            return Inferred::Err;
        }
        let (ra, rb) = (a.dims.len(), b.dims.len());
        if ra < 2 || rb < 2 || a.dims[ra - 1] != b.dims[rb - 2] {
            return Inferred::Err;
        }
        let Some(mut dims) = bcast(&a.dims[..ra - 2], &b.dims[..rb - 2]) else {
            return Inferred::Err;
        };
        dims.push(a.dims[ra - 2]);
        dims.push(b.dims[rb - 1]);
        if !numel_ok(&dims) {
            return Inferred::Err;
        }
        let k = a.dims[ra - 1] as f64;
        let ab = prod(a.mag, b.mag);
        let mag = prod(k, ab);
        let err = if k == 0.0 {
            0.0
        } else {
            k * (prod(a.err, b.mag) + prod(b.err, a.mag) + prod(a.err, b.err))
                + 2.0 * k * k * EPS * ab
                + TINY
        };
        Inferred::Ok(self.derived(&[x, y], dims, DType::F32, mag, err))
    }

    /// `Tensor::attention_with`'s checks, and a bound from those of matmul and softmax
    /// (a row that sees no key is zeros, within the bound).
    fn infer_attention(
        &self,
        q: V,
        k: V,
        v: V,
        bias: Option<V>,
        scale: f32,
        window: KeyWindow,
    ) -> Inferred {
        let (a, b, c) = (self.v(q), self.v(k), self.v(v));
        let bv = bias.map(|x| self.v(x));
        let all = [Some(a), Some(b), Some(c), bv];
        if all
            .iter()
            .flatten()
            .any(|t| t.dtype != DType::F32 || t.dims.len() != 4)
        {
            return Inferred::Err;
        }
        let (qd, kd) = (&a.dims, &b.dims);
        let grouped = qd[1].is_multiple_of(kd[1]);
        if kd[0] != qd[0] || !grouped || kd[3] != qd[3] || c.dims != *kd || qd[3] > 256 {
            return Inferred::Err;
        }
        let scores = [qd[0], qd[1], qd[2], kd[2]];
        if let Some(bv) = bv {
            if bv.dims.iter().zip(&scores).any(|(&x, &s)| x != s && x != 1) {
                return Inferred::Err;
            }
        }
        let dims = vec![qd[0], qd[2], qd[1], qd[3]];
        if !numel_ok(&dims) {
            return Inferred::Err;
        }
        let mut inputs = vec![q, k, v];
        inputs.extend(bias);
        let (dh, lk) = (qd[3] as f64, kd[2] as f64);
        let sc = (scale as f64).abs();
        let (bias_mag, bias_err) = bv.map_or((0.0, 0.0), |t| (t.mag, t.err));
        // Scores as a matmul scaled, plus the bias; then softmax's bound for the
        // probabilities; the output is their weighted mean of v.
        let s_mag = prod(sc, prod(dh, prod(a.mag, b.mag))) + bias_mag;
        let s_err = sc
            * (dh * (prod(a.err, b.mag) + prod(b.err, a.mag) + prod(a.err, b.err))
                + 2.0 * dh * dh * EPS * prod(a.mag, b.mag))
            + bias_err;
        let p_err = 2.0 * s_err + 16.0 * lk * EPS * (1.0 + s_mag);
        let (mag, err) = if lk == 0.0 && window != KeyWindow::ALL {
            // No keys under a window: zeros.
            (0.0, TINY)
        } else if lk == 0.0 || !s_mag.is_finite() || !c.mag.is_finite() {
            (f64::INFINITY, f64::INFINITY)
        } else {
            (
                c.mag,
                c.err + prod(c.mag, lk * p_err + 4.0 * lk * EPS) + TINY,
            )
        };
        Inferred::Ok(self.derived(&inputs, dims, DType::F32, mag, err))
    }

    fn infer_reduce(&self, r: Red, x: V, dim: i64) -> Inferred {
        let a = self.v(x);
        let Some(d) = resolve(dim, a.dims.len()) else {
            return Inferred::Err;
        };
        if matches!(r, Red::Mean | Red::MeanKeep) && a.dtype != DType::F32 {
            return Inferred::Err;
        }
        let n = a.dims[d];
        if n == 0 && !matches!(r, Red::Sum | Red::SumKeep) {
            return Inferred::Err;
        }
        let mut dims = a.dims.clone();
        if matches!(r, Red::SumKeep | Red::MeanKeep | Red::MaxKeep) {
            dims[d] = 1;
        } else {
            dims.remove(d);
        }
        let nf = n as f64;
        let float = a.dtype == DType::F32;
        let (dtype, mag, err) = match r {
            Red::Sum | Red::SumKeep if float => (
                a.dtype,
                prod(nf, a.mag),
                nf * a.err + 2.0 * nf * nf * EPS * a.mag + TINY,
            ),
            Red::Sum | Red::SumKeep => {
                let mag = prod(nf, a.mag);
                let mag = if mag > 2f64.powi(62) {
                    f64::INFINITY
                } else {
                    mag
                };
                (a.dtype, mag, a.err)
            }
            Red::Mean | Red::MeanKeep => (a.dtype, a.mag, a.err + 2.0 * nf * EPS * a.mag + TINY),
            Red::Max | Red::MaxKeep => (a.dtype, a.mag, a.err),
            Red::ArgMax => (
                DType::U32,
                nf,
                if a.err == 0.0 { 0.0 } else { f64::INFINITY },
            ),
        };
        let mut v = self.derived(&[x], dims, dtype, mag, err);
        v.bound = match r {
            Red::ArgMax => Some(n as u64),
            Red::Max | Red::MaxKeep => a.bound,
            _ => None,
        };
        Inferred::Ok(v)
    }

    /// `x.cumsum(dim)`: the input's dims and dtype (f32, u32 or i64); each output a
    /// sum of up to `n` inputs (the dim's size), drifting as a sum over the dim does.
    fn infer_cumsum(&self, x: V, dim: i64) -> Inferred {
        let a = self.v(x);
        let Some(d) = resolve(dim, a.dims.len()) else {
            return Inferred::Err;
        };
        if !matches!(a.dtype, DType::F32 | DType::U32 | DType::I64) {
            return Inferred::Err;
        }
        let nf = a.dims[d] as f64;
        let (mag, err) = if a.dtype == DType::F32 {
            (
                prod(nf, a.mag),
                nf * a.err + 2.0 * nf * nf * EPS * a.mag + TINY,
            )
        } else {
            let mag = prod(nf, a.mag);
            let mag = if mag > 2f64.powi(62) {
                f64::INFINITY
            } else {
                mag
            };
            (mag, a.err)
        };
        Inferred::Ok(self.derived(&[x], a.dims.clone(), a.dtype, mag, err))
    }

    /// `x.rotary(cos, sin)`: the op's shape rule (positions in dim -2 when the
    /// tables' `seq` matches it, else dim -3; tables `[seq, dh / 2]`, or
    /// `[seq, 1, dh / 2]` for dim -3 only), and each output a sum of two products.
    fn infer_rotary(&self, x: V, cos: V, sin: V) -> Inferred {
        let (a, c, s) = (self.v(x), self.v(cos), self.v(sin));
        if [a.dtype, c.dtype, s.dtype].iter().any(|&d| d != DType::F32) {
            return Inferred::Err;
        }
        let rank = a.dims.len();
        if rank < 2 || a.dims[rank - 1] % 2 != 0 || c.dims != s.dims {
            return Inferred::Err;
        }
        let (dh, seq) = (a.dims[rank - 1], c.dims.first().copied().unwrap_or(0));
        let two = c.dims == [seq, dh / 2];
        if !two && c.dims != [seq, 1, dh / 2] {
            return Inferred::Err;
        }
        let fits = (two && a.dims[rank - 2] == seq) || (rank >= 3 && a.dims[rank - 3] == seq);
        if !fits {
            return Inferred::Err;
        }
        let t = c.mag.max(s.mag);
        let mag = 2.0 * prod(a.mag, t);
        let err = if mag.is_finite() {
            2.0 * (prod(a.err, t) + prod(a.mag, c.err.max(s.err))) + 4.0 * EPS * mag + TINY
        } else {
            f64::INFINITY
        };
        Inferred::Ok(self.derived(&[x, cos, sin], a.dims.clone(), DType::F32, mag, err))
    }

    fn infer_norm(&self, x: V, params: &[V], eps: f64) -> Inferred {
        let a = self.v(x);
        if a.dtype != DType::F32 || a.dims.is_empty() {
            return Inferred::Err;
        }
        let n = *a.dims.last().expect("rank checked");
        for &p in params {
            let p = self.v(p);
            if p.dtype != DType::F32 || p.dims != [n] {
                return Inferred::Err;
            }
        }
        let w = self.v(params[0]);
        let (bm, be) = params
            .get(1)
            .map_or((0.0, 0.0), |&b| (self.v(b).mag, self.v(b).err));
        let nf = n as f64;
        let mag = prod(nf.sqrt(), w.mag) + bm;
        let s = eps.sqrt();
        let err = if a.mag.is_finite() && w.mag.is_finite() {
            (4.0 * nf.sqrt() * a.err + 16.0 * nf * EPS * (1.0 + a.mag)) / s * (1.0 + w.mag)
                + nf.sqrt() * w.err
                + be
                + 4.0 * EPS * mag
                + TINY
        } else {
            f64::INFINITY
        };
        let mut inputs = vec![x];
        inputs.extend_from_slice(params);
        Inferred::Ok(self.derived(&inputs, a.dims.clone(), DType::F32, mag, err))
    }

    fn infer_cat(&self, xs: &[V], dim: i64) -> Inferred {
        let Some(&first) = xs.first() else {
            return Inferred::Err;
        };
        let f = self.v(first);
        let Some(d) = resolve(dim, f.dims.len()) else {
            return Inferred::Err;
        };
        let mut dims = f.dims.clone();
        dims[d] = 0;
        for &x in xs {
            let t = self.v(x);
            let same = t.dims.len() == f.dims.len()
                && t.dims
                    .iter()
                    .zip(&f.dims)
                    .enumerate()
                    .all(|(j, (a, b))| j == d || a == b);
            if t.dtype != f.dtype || !same {
                return Inferred::Err;
            }
            dims[d] += t.dims[d];
        }
        if !numel_ok(&dims) {
            return Inferred::Err;
        }
        let mag = xs.iter().map(|&x| self.v(x).mag).fold(0.0, f64::max);
        let err = xs.iter().map(|&x| self.v(x).err).fold(0.0, f64::max);
        let mut v = self.derived(xs, dims, f.dtype, mag, err);
        v.bound = max_bound(xs.iter().map(|&x| self.v(x).bound));
        Inferred::Ok(v)
    }

    fn infer_index(&self, x: V, idx: V, dim: i64, fresh: Option<V>) -> Inferred {
        let (a, i) = (self.v(x), self.v(idx));
        let Some(d) = resolve(dim, a.dims.len()) else {
            return Inferred::Err;
        };
        if !matches!(i.dtype, DType::U32 | DType::I64) || i.dims.len() != 1 {
            return Inferred::Err;
        }
        let size = a.dims[d] as i64;
        let out_of_range = match (&i.known, i.bound) {
            (Some(k), _) => k.iter().any(|&j| j < 0 || j >= size),
            _ if i.dims[0] == 0 => false,
            (None, Some(b)) if b <= size as u64 => false,
            _ => return Inferred::Unknown,
        };
        let failing = match (out_of_range, i.ready) {
            (false, _) => false,
            // The engine reads ready indices at record time.
            (true, true) => return Inferred::Err,
            // Pending indices fail in the kernel, if certainly still pending.
            (true, false) if fresh == Some(idx) => true,
            (true, false) => return Inferred::Unknown,
        };
        let mut dims = a.dims.clone();
        dims[d] = i.dims[0];
        let err = if i.err == 0.0 { a.err } else { f64::INFINITY };
        let mut v = self.derived(&[x, idx], dims, a.dtype, a.mag, err);
        v.fails |= failing;
        v.bound = a.bound;
        Inferred::Ok(v)
    }
}

// ---------------------------------------------------------------------------------
// The generator
// ---------------------------------------------------------------------------------

/// Where steps are being generated: a thread, or a rayon job started by one.
struct Site {
    who: usize,
    held: Vec<V>,
    steps: Vec<Step>,
    /// The stream cannot flush by itself (queue limit out of reach), so a value just
    /// made is certainly pending: run-time index failures may be generated.
    poison_ok: bool,
}

/// What the generator knows of a thread.
#[derive(Default)]
struct ThreadModel {
    held: Vec<V>,
    /// Values sent to it that it has not received yet.
    inflight: Vec<V>,
    alive: bool,
}

struct Gen {
    rng: Rng,
    skip: Skip,
    big: bool,
    vals: Vec<Val>,
    next_id: usize,
    steps: Vec<Step>,
    threads: Vec<ThreadModel>,
    cfgs: Vec<ThreadCfg>,
    uses_rayon: bool,
}

fn generate(seed: u64, skip: Skip) -> Program {
    let mut rng = Rng::new(seed);
    let big = !skip.big && rng.chance(0.05);
    let cfgs = (0..THREADS)
        .map(|_| ThreadCfg {
            queue_limit: if rng.chance(0.7) {
                HUGE_QUEUE
            } else {
                rng.pick(&[1, 2, 3, 5, 8, 16, 64])
            },
            kernel_threads: if rng.chance(0.7) { 0 } else { 1 },
        })
        .collect();
    let mut g = Gen {
        rng,
        skip,
        big,
        vals: Vec::new(),
        next_id: 0,
        steps: Vec::new(),
        threads: (0..THREADS)
            .map(|_| ThreadModel {
                alive: true,
                ..ThreadModel::default()
            })
            .collect(),
        cfgs,
        uses_rayon: false,
    };
    let total = if big {
        10 + g.rng.below(30)
    } else {
        10 + g.rng.below(200)
    };
    for _ in 0..total {
        let alive: Vec<usize> = (0..THREADS).filter(|&t| g.threads[t].alive).collect();
        let t = g.rng.pick(&alive);
        g.thread_step(t);
        if alive.len() > 2 && g.rng.chance(0.01) {
            g.end_thread(t);
        }
    }
    let mut rest: Vec<usize> = (0..THREADS).filter(|&t| g.threads[t].alive).collect();
    g.rng.shuffle(&mut rest);
    for t in rest {
        g.end_thread(t);
    }
    Program {
        seed,
        steps: g.steps,
        vals: g.vals,
        threads: g.cfgs,
        uses_rayon: g.uses_rayon,
    }
}

impl Gen {
    fn emit(&mut self, s: &mut Site, act: Act) {
        let id = self.next_id;
        self.next_id += 1;
        s.steps.push(Step {
            id,
            who: s.who,
            act,
        });
    }

    fn open(&mut self, t: usize) -> Site {
        Site {
            who: t,
            held: std::mem::take(&mut self.threads[t].held),
            steps: Vec::new(),
            poison_ok: self.cfgs[t].queue_limit == HUGE_QUEUE,
        }
    }

    fn close(&mut self, s: Site) {
        self.threads[s.who].held = s.held;
        self.steps.extend(s.steps);
    }

    /// Records `op` at `s` if the model can tell its outcome; returns its value when it
    /// succeeds.
    fn make(&mut self, s: &mut Site, op: Op) -> Option<V> {
        let fresh = match s.steps.last() {
            Some(Step {
                act: Act::Make { out, .. },
                ..
            }) if s.poison_ok && self.vals[*out].ok => Some(*out),
            _ => None,
        };
        let inferred = Model { vals: &self.vals }.infer(&op, fresh);
        let out = self.vals.len();
        match inferred {
            Inferred::Unknown => None,
            Inferred::Err if self.skip.invalid => None,
            Inferred::Err => {
                self.vals.push(Val::failed());
                self.emit(s, Act::Make { out, op });
                None
            }
            Inferred::Ok(v) => {
                if v.fails && self.skip.poison {
                    return None;
                }
                self.vals.push(v);
                self.emit(s, Act::Make { out, op });
                s.held.push(out);
                Some(out)
            }
        }
    }

    fn val(&self, v: V) -> &Val {
        &self.vals[v]
    }

    /// A value held at `s` that satisfies `f`, preferring the latest.
    fn pick(&mut self, s: &Site, f: impl Fn(&Val) -> bool) -> Option<V> {
        let c: Vec<V> = s
            .held
            .iter()
            .copied()
            .filter(|&v| f(&self.vals[v]))
            .collect();
        if c.is_empty() {
            None
        } else if self.rng.chance(0.4) {
            c.last().copied()
        } else {
            Some(self.rng.pick(&c))
        }
    }

    fn dim_size(&mut self) -> usize {
        match self.rng.below(100) {
            0..=5 => 0,
            6..=27 => 1,
            28..=82 => self.rng.range(2, 6) as usize,
            _ => self.rng.range(7, 24) as usize,
        }
    }

    fn rand_dims(&mut self) -> Vec<usize> {
        if self.big && self.rng.chance(0.4) {
            let rows = self.rng.range(256, 600) as usize;
            return vec![rows, self.rng.pick(&[256, 512])];
        }
        let rank = match self.rng.below(100) {
            0..=7 => 0,
            8..=32 => 1,
            33..=62 => 2,
            63..=84 => 3,
            85..=94 => 4,
            _ => self.rng.range(5, 8) as usize,
        };
        loop {
            let dims: Vec<usize> = (0..rank)
                .map(|_| {
                    if rank > 4 {
                        self.rng.range(1, 3) as usize
                    } else {
                        self.dim_size()
                    }
                })
                .collect();
            if dims.iter().product::<usize>() <= 2048 {
                return dims;
            }
        }
    }

    fn rand_dtype(&mut self) -> DType {
        match self.rng.below(10) {
            0..=6 => DType::F32,
            7 | 8 => DType::I64,
            _ => DType::U32,
        }
    }

    fn rand_data(&mut self, dtype: DType) -> Data {
        let seed = self.rng.next();
        match (dtype, self.rng.below(20)) {
            (DType::F32, 0..=15) => Data::Uniform(seed),
            (DType::F32, 16..=17) => Data::Ints {
                seed,
                lo: -4,
                hi: 4,
            },
            (DType::F32, _) => Data::Special(seed),
            (_, 0..=17) => Data::Ints {
                seed,
                lo: if dtype == DType::I64 { -5 } else { 0 },
                hi: 9,
            },
            _ => Data::IntSpecial(seed),
        }
    }

    /// A new tensor of these dims and dtype: `from_vec` or a fill.
    fn fresh(&mut self, s: &mut Site, dtype: DType, mut dims: Vec<usize>) -> V {
        // Shapes derived from others may grow past the maximum rank: drop leading dims.
        while dims.len() > 8 {
            dims.remove(0);
        }
        let op = if self.rng.chance(0.15) {
            let kind = match self.rng.below(3) {
                0 => FillKind::Zeros,
                1 => FillKind::Ones,
                _ if dtype == DType::F32 => {
                    FillKind::Full(self.rng.pick(&[0.5, -1.25, 3.0, -0.0, f32::NAN, 1e-3]))
                }
                _ => FillKind::Ones,
            };
            Op::Fill { kind, dims, dtype }
        } else {
            let data = self.rand_data(dtype);
            Op::FromVec {
                dtype,
                dims,
                data,
                extra: 0,
            }
        };
        self.make(s, op).expect("a fresh tensor is valid")
    }

    fn fresh_any(&mut self, s: &mut Site) -> V {
        let (dtype, dims) = (self.rand_dtype(), self.rand_dims());
        self.fresh(s, dtype, dims)
    }

    /// A held value satisfying `f`, or a fresh one of `dtype` when there is none.
    fn input(&mut self, s: &mut Site, dtype: Option<DType>, min_rank: usize) -> V {
        let found = self.pick(s, |v| {
            dtype.is_none_or(|d| v.dtype == d) && v.dims.len() >= min_rank
        });
        match found {
            Some(v) if self.rng.chance(0.85) => v,
            _ => {
                let dtype = dtype.unwrap_or_else(|| self.rand_dtype());
                let mut dims = self.rand_dims();
                while dims.len() < min_rank {
                    dims.insert(0, self.rng.range(1, 4) as usize);
                }
                self.fresh(s, dtype, dims)
            }
        }
    }

    /// A dim of a tensor of `rank` (>= 1), written positive or negative.
    fn rand_dim(&mut self, rank: usize) -> i64 {
        let d = self.rng.below(rank) as i64;
        if self.rng.chance(0.3) {
            d - rank as i64
        } else {
            d
        }
    }

    /// Dims that `dims` broadcasts to: leading dims added, some 1s stretched.
    fn stretched(&mut self, dims: &[usize]) -> Vec<usize> {
        let mut out: Vec<usize> = dims
            .iter()
            .map(|&d| {
                if d == 1 && self.rng.chance(0.5) {
                    self.rng.range(0, 4) as usize
                } else {
                    d
                }
            })
            .collect();
        if out.len() < 6 && self.rng.chance(0.25) {
            for _ in 0..1 + self.rng.below(2) {
                out.insert(0, self.rng.range(1, 3) as usize);
            }
        }
        out
    }

    /// Dims that broadcast to `dims`: a suffix with some dims replaced by 1.
    fn shrunk(&mut self, dims: &[usize]) -> Vec<usize> {
        let keep = dims.len() - self.rng.below(dims.len() + 1);
        dims[dims.len() - keep..]
            .iter()
            .map(|&d| if self.rng.chance(0.3) { 1 } else { d })
            .collect()
    }

    fn thread_step(&mut self, t: usize) {
        let mut s = self.open(t);
        match self.rng.below(100) {
            0..=49 => self.gen_make(&mut s),
            50..=61 => self.gen_send(&mut s),
            62..=71 => self.gen_recv(&mut s),
            72..=79 => self.gen_drop(&mut s),
            80..=91 => self.gen_read(&mut s),
            92 => self.emit(&mut s, Act::Sync),
            93 if !self.skip.limits => self.gen_limits(&mut s),
            93 => self.emit(&mut s, Act::Sync),
            _ if !self.skip.rayon => self.gen_jobs(&mut s),
            _ => self.gen_make(&mut s),
        }
        self.close(s);
    }

    /// Trims the pools, or sets small (sometimes zero) plan-cache and pool limits.
    fn gen_limits(&mut self, s: &mut Site) {
        let act = if self.rng.chance(0.5) {
            Act::Trim
        } else {
            Act::Limits {
                plan: self.rng.pick(&[0, 4 << 10, 64 << 10, 1 << 20]),
                pool: self.rng.pick(&[0, 64 << 10, 1 << 20, usize::MAX]),
            }
        };
        self.emit(s, act);
    }

    fn gen_send(&mut self, s: &mut Site) {
        let Some(v) = self.pick(s, |_| true) else {
            return self.gen_make(s);
        };
        let to: Vec<usize> = (0..THREADS)
            .filter(|&u| {
                let m = &self.threads[u];
                u != s.who && m.alive && !m.held.contains(&v) && !m.inflight.contains(&v)
            })
            .collect();
        if to.is_empty() {
            return;
        }
        let to = self.rng.pick(&to);
        let keep = self.rng.chance(0.6);
        if !keep {
            s.held.retain(|&x| x != v);
        }
        self.threads[to].inflight.push(v);
        self.emit(s, Act::Send { v, to, keep });
    }

    fn gen_recv(&mut self, s: &mut Site) {
        let inflight = &mut self.threads[s.who].inflight;
        if inflight.is_empty() {
            return self.gen_make(s);
        }
        let v = inflight.remove(self.rng.below(inflight.len()));
        s.held.push(v);
        self.emit(s, Act::Recv { v });
    }

    fn gen_drop(&mut self, s: &mut Site) {
        if s.held.is_empty() {
            return;
        }
        let v = s.held.remove(self.rng.below(s.held.len()));
        self.emit(s, Act::Drop { v });
    }

    fn gen_read(&mut self, s: &mut Site) {
        let Some(v) = self.pick(s, |_| true) else {
            return;
        };
        let mut as_dtype = self.val(v).dtype;
        if !self.skip.invalid && self.rng.chance(0.04) {
            as_dtype = self.rng.pick(&[DType::F32, DType::U32, DType::I64]);
        }
        self.emit(s, Act::Read { v, as_dtype });
    }

    /// A `rayon::spawn` job or a `rayon::scope` of one to three.
    fn gen_jobs(&mut self, s: &mut Site) {
        self.uses_rayon = true;
        let scope = self.rng.chance(0.4);
        let n = if scope { 1 + self.rng.below(3) } else { 1 };
        let mut jobs = Vec::new();
        let mut returned = Vec::new();
        for _ in 0..n {
            let mut inputs = Vec::new();
            for _ in 0..self.rng.below(4) {
                if let Some(v) = self.pick(s, |_| true) {
                    if !inputs.contains(&v) {
                        inputs.push(v);
                    }
                }
            }
            let mut js = Site {
                who: s.who,
                held: inputs.clone(),
                steps: Vec::new(),
                poison_ok: true,
            };
            for _ in 0..1 + self.rng.below(6) {
                match self.rng.below(20) {
                    0..=11 => self.gen_make(&mut js),
                    12..=16 => self.gen_read(&mut js),
                    17 | 18 => self.gen_drop(&mut js),
                    _ if !self.skip.limits && self.rng.chance(0.5) => self.emit(&mut js, Act::Trim),
                    _ => self.emit(&mut js, Act::Sync),
                }
            }
            let made: Vec<V> = js
                .held
                .iter()
                .copied()
                .filter(|v| !inputs.contains(v))
                .collect();
            let mut outputs = Vec::new();
            for &v in &made {
                if outputs.len() >= 2 || !self.rng.chance(0.6) {
                    continue;
                }
                let dest = if scope {
                    // Held by the thread once the scope ends (not by the next job).
                    returned.push(v);
                    Dest::Owner
                } else {
                    let alive: Vec<usize> =
                        (0..THREADS).filter(|&u| self.threads[u].alive).collect();
                    let u = self.rng.pick(&alive);
                    self.threads[u].inflight.push(v);
                    Dest::Thread(u)
                };
                outputs.push((v, dest));
            }
            jobs.push(Job {
                inputs,
                body: js.steps,
                outputs,
            });
        }
        s.held.extend(returned);
        let act = if scope {
            Act::Scope(jobs)
        } else {
            Act::Spawn(jobs.pop().expect("one job"))
        };
        self.emit(s, act);
    }

    fn end_thread(&mut self, t: usize) {
        let mut s = self.open(t);
        let inflight = std::mem::take(&mut self.threads[t].inflight);
        for v in inflight {
            if self.rng.chance(0.8) {
                s.held.push(v);
                self.emit(&mut s, Act::Recv { v });
            }
        }
        for v in s.held.clone() {
            if self.rng.chance(0.3) {
                let as_dtype = self.val(v).dtype;
                self.emit(&mut s, Act::Read { v, as_dtype });
            }
        }
        if !self.skip.exit_matmul && self.rng.chance(0.35) {
            self.finale(&mut s);
        }
        let sync = self.skip.exit_matmul || self.rng.chance(0.2);
        let panic = !self.skip.panic && self.rng.chance(0.15);
        self.emit(&mut s, Act::End { panic, sync });
        s.held.clear();
        self.close(s);
        self.threads[t].alive = false;
    }

    /// Runs a matmul, then leaves another (maybe a chain) pending: kept, or sent away.
    fn finale(&mut self, s: &mut Site) {
        // Products of 16 x 16 and more go through `gemm`'s own thread-local buffers.
        let (m, k, n) = (
            self.rng.range(1, 40) as usize,
            self.rng.range(12, 40) as usize,
            self.rng.range(12, 40) as usize,
        );
        let a = self.fresh(s, DType::F32, vec![m, k]);
        let b = self.fresh(s, DType::F32, vec![k, n]);
        let Some(m1) = self.make(s, Op::MatMul { x: a, y: b }) else {
            return;
        };
        self.emit(
            s,
            Act::Read {
                v: m1,
                as_dtype: DType::F32,
            },
        );
        let Some(mut last) = self.make(s, Op::MatMul { x: a, y: b }) else {
            return;
        };
        if self.rng.chance(0.5) {
            let bias = self.fresh(s, DType::F32, vec![n]);
            if let Some(v) = self.make(
                s,
                Op::Binary {
                    b: Bin::Add,
                    x: last,
                    y: bias,
                },
            ) {
                last = self.make(s, Op::Unary { u: Un::Gelu, x: v }).unwrap_or(v);
            }
        }
        let to: Vec<usize> = (0..THREADS)
            .filter(|&u| u != s.who && self.threads[u].alive)
            .collect();
        if !to.is_empty() && self.rng.chance(0.5) {
            let to = self.rng.pick(&to);
            self.threads[to].inflight.push(last);
            s.held.retain(|&x| x != last);
            self.emit(
                s,
                Act::Send {
                    v: last,
                    to,
                    keep: false,
                },
            );
        }
    }

    fn gen_make(&mut self, s: &mut Site) {
        let wild = !self.skip.invalid && self.rng.chance(0.06);
        if wild {
            return self.gen_wild(s);
        }
        match self.rng.below(104) {
            0..=7 => {
                self.fresh_any(s);
            }
            8..=19 => self.gen_unary(s),
            20..=33 => self.gen_binary(s),
            34..=37 => {
                let x = self.input(s, None, 0);
                let dtype = self.rand_dtype();
                self.make(s, Op::Cast { x, dtype });
            }
            38..=45 => self.gen_matmul(s),
            46..=49 => self.gen_chain(s),
            50..=57 => {
                let x = self.input(s, None, 1);
                let (r, dim) = (
                    self.rng.pick(&REDUCE),
                    self.rand_dim(self.val(x).dims.len()),
                );
                self.make(s, Op::Reduce { r, x, dim });
            }
            58..=61 => {
                let x = self.input(s, Some(DType::F32), 1);
                let dim = self.rand_dim(self.val(x).dims.len());
                self.make(s, Op::Softmax { x, dim });
            }
            62..=64 => self.gen_norm(s),
            65..=66 => self.gen_rotary(s),
            67..=82 => self.gen_view(s),
            83..=84 => {
                let x = self.input(s, None, 1);
                let dim = self.rand_dim(self.val(x).dims.len());
                self.make(s, Op::Cumsum { x, dim });
            }
            85..=87 => {
                let x = self.input(s, None, 0);
                self.make(s, Op::Contiguous { x });
            }
            88..=91 => self.gen_cat(s),
            92..=94 => self.gen_index(s),
            95..=97 => self.gen_attention(s),
            _ if s.poison_ok && !self.skip.poison => self.gen_failing_index(s),
            _ => self.gen_index(s),
        }
    }

    fn gen_unary(&mut self, s: &mut Site) {
        let x = self.input(s, Some(DType::F32), 0);
        let u = match self.rng.pick(&UNARY) {
            Un::Affine(..) => Un::Affine(
                self.rng.pick(&[-2.0, -1.0, 0.5, 1.0, 2.0, 3.0, 0.0]),
                self.rng.pick(&[-1.0, 0.0, 0.25, 1.0, 3.0]),
            ),
            Un::Powf(_) => Un::Powf(self.rng.pick(&[0.5, 2.0, 3.0, -1.0, 1.5, 0.0])),
            u => u,
        };
        self.make(s, Op::Unary { u, x });
    }

    fn gen_binary(&mut self, s: &mut Site) {
        let x = self.input(s, None, 0);
        let (xd, dtype) = (self.val(x).dims.clone(), self.val(x).dtype);
        let out = self.stretched(&xd);
        let yd = self.shrunk(&out);
        let existing = if self.rng.chance(0.5) {
            self.pick(s, |v| v.dtype == dtype && bcast(&xd, &v.dims).is_some())
        } else {
            None
        };
        let y = match existing {
            Some(y) => y,
            None => self.fresh(s, dtype, yd),
        };
        let (x, y) = if self.rng.chance(0.5) { (x, y) } else { (y, x) };
        let b = self.rng.pick(&BINARY);
        self.make(s, Op::Binary { b, x, y });
    }

    fn gen_matmul(&mut self, s: &mut Site) {
        let x = self.input(s, Some(DType::F32), 2);
        let xd = self.val(x).dims.clone();
        let r = xd.len();
        let k = xd[r - 1];
        let existing = if self.rng.chance(0.4) {
            self.pick(s, |v| {
                let vr = v.dims.len();
                v.dtype == DType::F32
                    && vr >= 2
                    && v.dims[vr - 2] == k
                    && bcast(&xd[..r - 2], &v.dims[..vr - 2]).is_some()
            })
        } else {
            None
        };
        let y = match existing {
            Some(y) => y,
            None => {
                let batch = if self.rng.chance(0.5) {
                    self.shrunk(&xd[..r - 2])
                } else {
                    self.stretched(&xd[..r - 2])
                };
                let n = if self.big && self.rng.chance(0.5) {
                    256
                } else {
                    self.dim_size().min(12)
                };
                let mut yd = batch;
                yd.extend([k, n]);
                self.fresh(s, DType::F32, yd)
            }
        };
        self.make(s, Op::MatMul { x, y });
    }

    /// matmul → bias → activation or softmax or norm: the engine's chain kernels.
    fn gen_chain(&mut self, s: &mut Site) {
        let (m, k, n) = (
            self.dim_size().max(1),
            self.dim_size(),
            self.dim_size().max(1),
        );
        let (m, k) = if self.big { (512, 64) } else { (m, k) };
        let a = self.fresh(s, DType::F32, vec![m, k]);
        let b = self.fresh(s, DType::F32, vec![k, n]);
        let Some(p) = self.make(s, Op::MatMul { x: a, y: b }) else {
            return;
        };
        let bias = self.fresh(s, DType::F32, vec![n]);
        let Some(h) = self.make(
            s,
            Op::Binary {
                b: Bin::Add,
                x: p,
                y: bias,
            },
        ) else {
            return;
        };
        match self.rng.below(4) {
            0 => {
                self.make(s, Op::Unary { u: Un::Gelu, x: h });
            }
            1 => {
                self.make(s, Op::Softmax { x: h, dim: -1 });
            }
            2 => {
                let w = self.fresh(s, DType::F32, vec![n]);
                self.make(
                    s,
                    Op::LayerNorm {
                        x: h,
                        w,
                        b: bias,
                        eps: 1e-5,
                    },
                );
            }
            _ => {
                let w = self.fresh(s, DType::F32, vec![n]);
                self.make(s, Op::RmsNorm { x: h, w, eps: 1e-5 });
            }
        }
    }

    fn gen_attention(&mut self, s: &mut Site) {
        let f32_ = Some(DType::F32);
        let (q, k, v) = if self.rng.chance(0.3) {
            // Whatever rank-4 values are held (often mismatched: an error).
            (
                self.input(s, f32_, 4),
                self.input(s, f32_, 4),
                self.input(s, f32_, 4),
            )
        } else {
            let (b, h) = (1 + self.rng.below(3), 1 + self.rng.below(4));
            let (lq, lk) = (self.rng.below(20), self.rng.below(40));
            let dh = self.rng.pick(&[1, 3, 8, 16, 32, 33, 64]);
            // Grouped heads: k and v with a divisor of q's heads (1 of them one of 3).
            let kv = match self.rng.below(3) {
                0 => 1,
                1 if h % 2 == 0 => h / 2,
                _ => h,
            };
            let q = self.fresh(s, DType::F32, vec![b, h, lq, dh]);
            let k = self.fresh(s, DType::F32, vec![b, kv, lk, dh]);
            let v = self.fresh(s, DType::F32, vec![b, kv, lk, dh]);
            (q, k, v)
        };
        let scores = {
            let (qd, kd) = (&self.val(q).dims, &self.val(k).dims);
            [qd[0], qd[1], qd[2], kd[2]]
        };
        let bias = match self.rng.below(3) {
            0 => None,
            1 => Some(self.fresh(s, DType::F32, vec![scores[0], 1, 1, scores[3]])),
            _ => Some(self.fresh(s, DType::F32, vec![1, 1, scores[2], scores[3]])),
        };
        let scale = self.rng.pick(&[1.0f32, 0.125, 0.5]);
        let side = |g: &mut Gen| g.rng.pick(&[None, Some(0), Some(1), Some(5), Some(40)]);
        let window = match self.rng.below(4) {
            0 | 1 => KeyWindow::ALL,
            2 => KeyWindow::CAUSAL,
            _ => KeyWindow {
                before: side(self),
                after: side(self),
            },
        };
        self.make(
            s,
            Op::Attention {
                q,
                k,
                v,
                bias,
                scale,
                window,
            },
        );
    }

    fn gen_rotary(&mut self, s: &mut Site) {
        let f32_ = Some(DType::F32);
        if self.rng.chance(0.2) {
            // Whatever is held: often the wrong shapes (an error).
            let x = self.input(s, f32_, 2);
            let (cos, sin) = (self.input(s, f32_, 2), self.input(s, f32_, 2));
            self.make(s, Op::Rotary { x, cos, sin });
            return;
        }
        let (seq, dh) = (
            self.rng.range(1, 12) as usize,
            2 * self.rng.range(1, 9) as usize,
        );
        let heads_form = self.rng.chance(0.5);
        let mut dims = if heads_form {
            vec![seq, self.rng.range(1, 5) as usize, dh]
        } else {
            vec![seq, dh]
        };
        if self.rng.chance(0.5) {
            dims.insert(0, self.rng.range(1, 4) as usize);
        }
        let x = self.fresh(s, DType::F32, dims);
        let table = if heads_form && self.rng.chance(0.5) {
            vec![seq, 1, dh / 2]
        } else {
            vec![seq, dh / 2]
        };
        let cos = self.fresh(s, DType::F32, table.clone());
        let sin = self.fresh(s, DType::F32, table);
        self.make(s, Op::Rotary { x, cos, sin });
    }

    fn gen_norm(&mut self, s: &mut Site) {
        let x = self.input(s, Some(DType::F32), 1);
        let n = *self.val(x).dims.last().expect("rank >= 1");
        let param = |g: &mut Gen, s: &mut Site| match g
            .pick(s, |v| v.dtype == DType::F32 && v.dims == [n])
        {
            Some(v) if g.rng.chance(0.5) => v,
            _ => g.fresh(s, DType::F32, vec![n]),
        };
        let w = param(self, s);
        let eps = self.rng.pick(&[1e-5, 1e-3, 0.1]);
        let op = if self.rng.chance(0.5) {
            let b = param(self, s);
            Op::LayerNorm { x, w, b, eps }
        } else {
            Op::RmsNorm { x, w, eps }
        };
        self.make(s, op);
    }

    fn reshape_dims(&mut self, numel: usize) -> Vec<usize> {
        if numel == 0 {
            let mut d: Vec<usize> = (0..1 + self.rng.below(3))
                .map(|_| self.rng.range(1, 4) as usize)
                .collect();
            let i = self.rng.below(d.len());
            d[i] = 0;
            return d;
        }
        if numel == 1 && self.rng.chance(0.3) {
            return vec![];
        }
        let mut factors = Vec::new();
        let (mut n, mut p) = (numel, 2);
        while n > 1 {
            while n % p == 0 {
                factors.push(p);
                n /= p;
            }
            p += 1;
        }
        self.rng.shuffle(&mut factors);
        let rank = 1 + self.rng.below(4);
        let mut dims = vec![1; rank];
        for f in factors {
            dims[self.rng.below(rank)] *= f;
        }
        dims
    }

    fn gen_view(&mut self, s: &mut Site) {
        let x = self.input(s, None, 0);
        let xd = self.val(x).dims.clone();
        let r = xd.len();
        let op = match self.rng.below(7) {
            0 => Op::Reshape {
                x,
                dims: self.reshape_dims(xd.iter().product()),
            },
            1 if r >= 1 => Op::Transpose {
                x,
                d0: self.rand_dim(r),
                d1: self.rand_dim(r),
            },
            2 => {
                let mut perm: Vec<usize> = (0..r).collect();
                self.rng.shuffle(&mut perm);
                Op::Permute { x, perm }
            }
            3 if r >= 1 => {
                let dim = self.rand_dim(r);
                let size = xd[resolve(dim, r).expect("valid dim")];
                let start = self.rng.below(size + 1);
                let len = self.rng.below(size - start + 1);
                Op::Narrow { x, dim, start, len }
            }
            4 => {
                let d = self.rng.below(r + 1) as i64;
                let dim = if self.rng.chance(0.3) {
                    d - r as i64 - 1
                } else {
                    d
                };
                Op::Unsqueeze { x, dim }
            }
            5 => match (0..r).filter(|&i| xd[i] == 1).collect::<Vec<_>>() {
                ones if !ones.is_empty() => Op::Squeeze {
                    x,
                    dim: self.rng.pick(&ones) as i64,
                },
                _ => Op::Contiguous { x },
            },
            _ => Op::BroadcastAs {
                x,
                dims: self.stretched(&xd),
            },
        };
        self.make(s, op);
    }

    fn gen_cat(&mut self, s: &mut Site) {
        let x = self.input(s, None, 1);
        let (xd, dtype) = (self.val(x).dims.clone(), self.val(x).dtype);
        let dim = self.rand_dim(xd.len());
        let d = resolve(dim, xd.len()).expect("valid dim");
        let mut xs = vec![x];
        for _ in 0..1 + self.rng.below(3) {
            let other = if self.rng.chance(0.3) {
                x
            } else {
                let mut od = xd.clone();
                od[d] = self.rng.range(0, 5) as usize;
                self.fresh(s, dtype, od)
            };
            xs.push(other);
        }
        self.rng.shuffle(&mut xs);
        self.make(s, Op::Cat { xs, dim });
    }

    /// Index values in `0..size`, `n` of them (none when `size` is 0).
    fn indices_below(&mut self, size: usize, n: usize) -> Vec<i64> {
        if size == 0 {
            return vec![];
        }
        (0..n).map(|_| self.rng.below(size) as i64).collect()
    }

    /// A valid `index_select`, indices ready or computed while running.
    fn gen_index(&mut self, s: &mut Site) {
        let x = self.input(s, None, 1);
        let xd = self.val(x).dims.clone();
        let dim = self.rand_dim(xd.len());
        let size = xd[resolve(dim, xd.len()).expect("valid dim")];
        let n = self.rng.below(6);
        let idx_dtype = self.rng.pick(&[DType::U32, DType::I64]);
        let idx = match self.rng.below(4) {
            0 if size > 0 => {
                // Computed: argmax over a dim of `size`.
                let a = self.fresh(s, DType::F32, vec![n, size]);
                self.make(
                    s,
                    Op::Reduce {
                        r: Red::ArgMax,
                        x: a,
                        dim: 1,
                    },
                )
            }
            1 => {
                // Computed: integers cast to an index dtype.
                let vals = self.indices_below(size, n);
                let src = self.fresh_list(s, DType::F32, vals);
                self.make(
                    s,
                    Op::Cast {
                        x: src,
                        dtype: idx_dtype,
                    },
                )
            }
            2 => self
                .pick(s, |v| {
                    v.dims.len() == 1
                        && matches!(v.dtype, DType::U32 | DType::I64)
                        && (v.dims[0] == 0 || v.bound.is_some_and(|b| b <= size as u64))
                })
                .or_else(|| {
                    let vals = self.indices_below(size, n);
                    Some(self.fresh_list(s, idx_dtype, vals))
                }),
            _ => {
                let vals = self.indices_below(size, n);
                Some(self.fresh_list(s, idx_dtype, vals))
            }
        };
        if let Some(idx) = idx {
            self.make(s, Op::IndexSelect { x, idx, dim });
        }
    }

    fn fresh_list(&mut self, s: &mut Site, dtype: DType, vals: Vec<i64>) -> V {
        let dims = vec![vals.len()];
        self.make(
            s,
            Op::FromVec {
                dtype,
                dims,
                data: Data::List(vals),
                extra: 0,
            },
        )
        .expect("a list is valid")
    }

    /// An `index_select` whose indices, computed while running, are out of range: its
    /// kernel fails, and so must everything computed from it, and nothing else. Then
    /// the pattern of issue 10, item 3: `h = g.exp()`, `bad + h`, and `h` read.
    fn gen_failing_index(&mut self, s: &mut Site) {
        let x = self.input(s, Some(DType::F32), 1);
        let xd = self.val(x).dims.clone();
        let dim = self.rand_dim(xd.len());
        let size = xd[resolve(dim, xd.len()).expect("valid dim")];
        let n = 1 + self.rng.below(4);
        let idx_dtype = self.rng.pick(&[DType::U32, DType::I64]);
        let mut target = self.indices_below(size, n);
        target.resize(n, 0);
        let bad = if idx_dtype == DType::I64 && self.rng.chance(0.4) {
            -1 - self.rng.below(3) as i64
        } else {
            (size + self.rng.below(3)) as i64
        };
        let at = self.rng.below(n);
        target[at] = bad;
        // Sources: a fill of the bad value, or a list through an affine map.
        let idx_src = if self.rng.chance(0.2) {
            let src = self.make(
                s,
                Op::Fill {
                    kind: FillKind::Full(bad as f32),
                    dims: vec![n],
                    dtype: DType::F32,
                },
            );
            src.expect("a fill is valid")
        } else {
            let m = self.rng.pick(&[1.0f32, -1.0]);
            let c = self.rng.range(-3, 3) as f32;
            let pre: Vec<i64> = target.iter().map(|&t| (t - c as i64) * m as i64).collect();
            let src = self.fresh_list(s, DType::F32, pre);
            match self.make(
                s,
                Op::Unary {
                    u: Un::Affine(m, c),
                    x: src,
                },
            ) {
                Some(v) => v,
                None => return,
            }
        };
        let Some(idx) = self.make(
            s,
            Op::Cast {
                x: idx_src,
                dtype: idx_dtype,
            },
        ) else {
            return;
        };
        let Some(out) = self.make(s, Op::IndexSelect { x, idx, dim }) else {
            return;
        };
        if !self.rng.chance(0.7) {
            return;
        }
        let od = self.val(out).dims.clone();
        let g = self.fresh(s, DType::F32, od);
        let Some(h) = self.make(s, Op::Unary { u: Un::Exp, x: g }) else {
            return;
        };
        let b = self.rng.pick(&[Bin::Add, Bin::Mul, Bin::Maximum]);
        self.make(s, Op::Binary { b, x: out, y: h });
        if self.rng.chance(0.5) {
            self.make(s, Op::Binary { b, x: h, y: g });
        }
        self.emit(
            s,
            Act::Read {
                v: h,
                as_dtype: DType::F32,
            },
        );
    }

    /// An op with arguments picked with little care: most are invalid and must fail
    /// at record time, the same way on both sides.
    fn gen_wild(&mut self, s: &mut Site) {
        let x = self.input(s, None, 0);
        let y = self.pick(s, |_| true).unwrap_or(x);
        let r = self.val(x).dims.len();
        let d = self.rng.range(-(r as i64) - 2, r as i64 + 1);
        let d2 = self.rng.range(-(r as i64) - 2, r as i64 + 1);
        let mut dims = self.rand_dims();
        let op = match self.rng.below(18) {
            0 => Op::Binary {
                b: self.rng.pick(&BINARY),
                x,
                y,
            },
            1 => Op::MatMul { x, y },
            2 => Op::Reduce {
                r: self.rng.pick(&REDUCE),
                x,
                dim: d,
            },
            3 => Op::Softmax { x, dim: d },
            17 => Op::Cumsum { x, dim: d },
            4 => Op::LayerNorm {
                x,
                w: y,
                b: y,
                eps: 1e-5,
            },
            5 => Op::Reshape { x, dims },
            6 => Op::Transpose { x, d0: d, d1: d2 },
            7 => {
                let mut perm: Vec<usize> = (0..r + self.rng.below(2))
                    .map(|_| self.rng.below(r + 1))
                    .collect();
                perm.truncate(r + 1);
                Op::Permute { x, perm }
            }
            8 => Op::Narrow {
                x,
                dim: d,
                start: self.rng.below(6),
                len: self.rng.below(6),
            },
            9 => Op::Unsqueeze { x, dim: d },
            10 => Op::Squeeze { x, dim: d },
            11 => Op::BroadcastAs { x, dims },
            12 => Op::Cat {
                xs: if self.rng.chance(0.1) {
                    vec![]
                } else {
                    vec![x, y]
                },
                dim: d,
            },
            13 => {
                // Ready indices out of range (or of a wrong dtype or rank).
                let n = 1 + self.rng.below(3);
                let dtype = self.rng.pick(&[DType::U32, DType::I64, DType::F32]);
                let vals = (0..n).map(|_| self.rng.range(-2, 8)).collect();
                let idx = self.fresh_list(s, dtype, vals);
                Op::IndexSelect { x, idx, dim: d }
            }
            14 => Op::Unary {
                u: self.rng.pick(&UNARY),
                x,
            },
            15 => {
                if self.rng.chance(0.5) {
                    dims = vec![1; 9];
                } else {
                    dims = vec![1 << 40, 1 << 40];
                }
                Op::Fill {
                    kind: FillKind::Zeros,
                    dims,
                    dtype: DType::F32,
                }
            }
            _ => {
                let dtype = self.rand_dtype();
                let data = self.rand_data(dtype);
                Op::FromVec {
                    dtype,
                    dims,
                    data,
                    extra: 1,
                }
            }
        };
        self.make(s, op);
    }
}

// ---------------------------------------------------------------------------------
// Interpreting a program
// ---------------------------------------------------------------------------------

/// Elements read back.
#[derive(Clone, Debug, PartialEq)]
enum Vals {
    F32(Vec<f32>),
    U32(Vec<u32>),
    I64(Vec<i64>),
}

/// What a step gave.
#[derive(Clone, Debug)]
enum Outcome {
    /// A `Make`: the layout of the tensor, or the record-time error.
    Made(Result<Layout, Error>),
    /// A `Read`.
    Read(Result<Vals, Error>),
}

/// Something that went wrong, tied to a value when there is one.
#[derive(Clone, Debug)]
struct Problem {
    msg: String,
    focus: Option<V>,
}

/// What one run of a program observed.
#[derive(Default)]
struct Record {
    outcomes: Mutex<HashMap<usize, Outcome>>,
    problems: Mutex<Vec<Problem>>,
}

impl Record {
    fn outcome(&self, step: usize, o: Outcome) {
        self.outcomes.lock().unwrap().insert(step, o);
    }
    fn problem(&self, focus: Option<V>, msg: String) {
        self.problems.lock().unwrap().push(Problem { msg, focus });
    }
}

/// Why a holder stops interpreting its steps.
struct Stop;

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".into()
    }
}

/// Calls the `Tensor` API for `op` on the handles in `held`; `Err(v)` if an input is
/// missing (an earlier step went wrong).
fn apply(op: &Op, held: &HashMap<V, Tensor>) -> Result<streamfuse::Result<Tensor>, V> {
    let get = |v: &V| held.get(v).ok_or(*v);
    Ok(match op {
        Op::FromVec {
            dtype,
            dims,
            data,
            extra,
        } => {
            let n = dims.iter().product::<usize>() + extra;
            match dtype {
                DType::F32 => Tensor::from_vec(data.f32s(n), dims),
                DType::U32 => {
                    Tensor::from_vec(data.ints(n).into_iter().map(|x| x as u32).collect(), dims)
                }
                DType::I64 => Tensor::from_vec(data.ints(n), dims),
                _ => unreachable!("the fuzzer makes no weight-only tensors"),
            }
        }
        Op::Fill { kind, dims, dtype } => match kind {
            FillKind::Zeros => Tensor::zeros(dims, *dtype),
            FillKind::Ones => Tensor::ones(dims, *dtype),
            FillKind::Full(x) => Tensor::full(*x, dims),
        },
        Op::Unary { u, x } => {
            let x = get(x)?;
            match u {
                Un::Exp => x.exp(),
                Un::Log => x.log(),
                Un::Sqrt => x.sqrt(),
                Un::Recip => x.recip(),
                Un::Neg => x.neg(),
                Un::Abs => x.abs(),
                Un::Tanh => x.tanh(),
                Un::Sigmoid => x.sigmoid(),
                Un::Relu => x.relu(),
                Un::Gelu => x.gelu(),
                Un::GeluTanh => x.gelu_tanh(),
                Un::Silu => x.silu(),
                Un::Affine(m, c) => x.affine(*m as f64, *c as f64),
                Un::Powf(e) => x.powf(*e as f64),
            }
        }
        Op::Binary { b, x, y } => {
            let (x, y) = (get(x)?, get(y)?);
            match b {
                Bin::Add => x.add(y),
                Bin::Sub => x.sub(y),
                Bin::Mul => x.mul(y),
                Bin::Div => x.div(y),
                Bin::Maximum => x.maximum(y),
                Bin::Minimum => x.minimum(y),
            }
        }
        Op::Cast { x, dtype } => get(x)?.to_dtype(*dtype),
        Op::MatMul { x, y } => get(x)?.matmul(get(y)?),
        Op::Reduce { r, x, dim } => {
            let x = get(x)?;
            match r {
                Red::Sum => x.sum(*dim),
                Red::SumKeep => x.sum_keepdim(*dim),
                Red::Mean => x.mean(*dim),
                Red::MeanKeep => x.mean_keepdim(*dim),
                Red::Max => x.max(*dim),
                Red::MaxKeep => x.max_keepdim(*dim),
                Red::ArgMax => x.argmax(*dim),
            }
        }
        Op::Softmax { x, dim } => get(x)?.softmax(*dim),
        Op::Cumsum { x, dim } => get(x)?.cumsum(*dim),
        Op::Attention {
            q,
            k,
            v,
            bias,
            scale,
            window,
        } => {
            let bias = match bias {
                Some(b) => Some(get(b)?),
                None => None,
            };
            get(q)?.attention_with(get(k)?, get(v)?, bias, *scale, *window)
        }
        Op::LayerNorm { x, w, b, eps } => get(x)?.layer_norm(get(w)?, get(b)?, *eps),
        Op::RmsNorm { x, w, eps } => get(x)?.rms_norm(get(w)?, *eps),
        Op::Rotary { x, cos, sin } => get(x)?.rotary(get(cos)?, get(sin)?),
        Op::Reshape { x, dims } => get(x)?.reshape(dims),
        Op::Transpose { x, d0, d1 } => get(x)?.transpose(*d0, *d1),
        Op::Permute { x, perm } => get(x)?.permute(perm),
        Op::Narrow { x, dim, start, len } => get(x)?.narrow(*dim, *start, *len),
        Op::Unsqueeze { x, dim } => get(x)?.unsqueeze(*dim),
        Op::Squeeze { x, dim } => get(x)?.squeeze(*dim),
        Op::BroadcastAs { x, dims } => get(x)?.broadcast_as(dims),
        Op::Contiguous { x } => get(x)?.contiguous(),
        Op::Cat { xs, dim } => {
            let ts = xs.iter().map(get).collect::<Result<Vec<_>, V>>()?;
            Tensor::cat(&ts, *dim)
        }
        Op::IndexSelect { x, idx, dim } => get(x)?.index_select(get(idx)?, *dim),
    })
}

fn read(t: &Tensor, as_dtype: DType) -> Result<Vals, Error> {
    match as_dtype {
        DType::F32 => t.to_vec::<f32>().map(Vals::F32),
        DType::U32 => t.to_vec::<u32>().map(Vals::U32),
        DType::I64 => t.to_vec::<i64>().map(Vals::I64),
        _ => unreachable!("the fuzzer makes no weight-only tensors"),
    }
}

/// Interprets the steps every holder does the same way: records, reads, drops, syncs.
/// `single` is set in the reference run, where nothing else touches the stream.
fn exec_local(
    p: &Program,
    step: &Step,
    held: &mut HashMap<V, Tensor>,
    rec: &Record,
    single: bool,
) -> Result<(), Stop> {
    match &step.act {
        Act::Make { out, op } => {
            let val = &p.vals[*out];
            let key = single.then(streamfuse::pending_key);
            let made = match apply(op, held) {
                Ok(made) => made,
                Err(v) => {
                    rec.problem(Some(*out), format!("#{}: input v{v} is missing", step.id));
                    return Err(Stop);
                }
            };
            match made {
                Ok(t) => {
                    if !val.ok {
                        rec.problem(
                            Some(*out),
                            format!("#{}: {op} should fail at record time, got Ok", step.id),
                        );
                    } else if t.dims() != val.dims
                        || t.dtype() != val.dtype
                        || t.rank() != val.dims.len()
                        || t.numel() != val.numel()
                    {
                        rec.problem(
                            Some(*out),
                            format!(
                                "#{}: {op} gave {:?} {}, the model says {:?} {}",
                                step.id,
                                t.dims(),
                                t.dtype(),
                                val.dims,
                                val.dtype
                            ),
                        );
                    }
                    rec.outcome(step.id, Outcome::Made(Ok(*t.layout())));
                    if val.ok {
                        held.insert(*out, t);
                    }
                }
                Err(e) => {
                    if val.ok {
                        rec.problem(
                            Some(*out),
                            format!("#{}: {op} failed at record time: {e}", step.id),
                        );
                        rec.outcome(step.id, Outcome::Made(Err(e)));
                        return Err(Stop);
                    }
                    if key.is_some_and(|k| k != streamfuse::pending_key()) {
                        rec.problem(
                            Some(*out),
                            format!("#{}: {op} failed but recorded something", step.id),
                        );
                    }
                    rec.outcome(step.id, Outcome::Made(Err(e)));
                }
            }
        }
        Act::Read { v, as_dtype } => {
            let Some(t) = held.get(v) else {
                rec.problem(Some(*v), format!("#{}: read of missing v{v}", step.id));
                return Err(Stop);
            };
            rec.outcome(step.id, Outcome::Read(read(t, *as_dtype)));
        }
        Act::Drop { v } => {
            held.remove(v);
        }
        Act::Sync => {
            let _ = streamfuse::sync();
        }
        Act::Trim => streamfuse::trim_pools(),
        Act::Limits { plan, pool } => {
            streamfuse::set_plan_cache_limit(*plan);
            streamfuse::set_pool_limit(*pool);
        }
        _ => unreachable!("not a local step"),
    }
    Ok(())
}

/// Runs a job's body on handles of its inputs; returns its outputs.
fn run_job(
    p: &Program,
    job: &Job,
    inputs: Vec<(V, Tensor)>,
    rec: &Record,
    single: bool,
) -> Vec<(V, Tensor, Dest)> {
    if !single {
        // Keeps the worker's stream from flushing by itself (see `Site::poison_ok`).
        streamfuse::set_queue_limit(HUGE_QUEUE);
    }
    let mut held: HashMap<V, Tensor> = inputs.into_iter().collect();
    for step in &job.body {
        if exec_local(p, step, &mut held, rec, single).is_err() {
            break;
        }
    }
    job.outputs
        .iter()
        .filter_map(|(v, dest)| held.remove(v).map(|t| (*v, t, *dest)))
        .collect()
}

fn job_inputs(job: &Job, held: &HashMap<V, Tensor>) -> Vec<(V, Tensor)> {
    job.inputs
        .iter()
        .filter_map(|v| held.get(v).map(|t| (*v, t.clone())))
        .collect()
}

/// The single-threaded run: every step in program order on the calling thread, whose
/// stream has fusion off.
fn run_reference(p: &Program) -> Record {
    let rec = Record::default();
    let mut held: Vec<HashMap<V, Tensor>> = (0..THREADS).map(|_| HashMap::new()).collect();
    let mut inflight: HashMap<(usize, V), Vec<Tensor>> = HashMap::new();
    let mut stopped = false;
    for step in &p.steps {
        if stopped {
            break;
        }
        let t = step.who;
        match &step.act {
            Act::Send { v, to, keep } => {
                if let Some(x) = held[t].get(v) {
                    inflight.entry((*to, *v)).or_default().push(x.clone());
                }
                if !keep {
                    held[t].remove(v);
                }
            }
            Act::Recv { v } => match inflight.get_mut(&(t, *v)).and_then(Vec::pop) {
                Some(x) => {
                    held[t].insert(*v, x);
                }
                None => {
                    rec.problem(Some(*v), format!("#{}: nothing to receive", step.id));
                    stopped = true;
                }
            },
            Act::Spawn(job) => {
                let inputs = job_inputs(job, &held[t]);
                for (v, x, dest) in run_job(p, job, inputs, &rec, true) {
                    if let Dest::Thread(u) = dest {
                        inflight.entry((u, v)).or_default().push(x);
                    }
                }
            }
            Act::Scope(jobs) => {
                for job in jobs {
                    let inputs = job_inputs(job, &held[t]);
                    for (v, x, _) in run_job(p, job, inputs, &rec, true) {
                        held[t].insert(v, x);
                    }
                }
            }
            Act::End { sync, .. } => {
                held[t].clear();
                if *sync {
                    let _ = streamfuse::sync();
                }
            }
            _ => stopped = exec_local(p, step, &mut held[t], &rec, true).is_err(),
        }
    }
    drop(held);
    drop(inflight);
    let _ = streamfuse::sync();
    rec
}

/// The payload of a planned panic.
struct Planned;

/// What the threads of one run share.
struct Shared {
    rec: Record,
    senders: Vec<Sender<(V, Tensor)>>,
    /// Set when a thread or job stopped early: the others stop waiting.
    abort: AtomicBool,
    /// `rayon::spawn` jobs not finished yet.
    jobs: AtomicUsize,
}

fn thread_main(t: usize, p: &Arc<Program>, sh: &Arc<Shared>, rx: Receiver<(V, Tensor)>) {
    let cfg = p.threads[t];
    streamfuse::set_queue_limit(cfg.queue_limit);
    streamfuse::set_kernel_threads(cfg.kernel_threads);
    let body = catch_unwind(AssertUnwindSafe(|| thread_body(t, p, sh, &rx)));
    match body {
        Ok(Ok(())) => {}
        Ok(Err(Stop)) => sh.abort.store(true, Ordering::SeqCst),
        Err(payload) if payload.is::<Planned>() => resume_unwind(payload),
        Err(payload) => {
            sh.abort.store(true, Ordering::SeqCst);
            sh.rec.problem(
                None,
                format!("thread {t} panicked: {}", panic_message(payload.as_ref())),
            );
        }
    }
}

fn thread_body(
    t: usize,
    p: &Arc<Program>,
    sh: &Arc<Shared>,
    rx: &Receiver<(V, Tensor)>,
) -> Result<(), Stop> {
    let mut held: HashMap<V, Tensor> = HashMap::new();
    let mut arrived: HashMap<V, Vec<Tensor>> = HashMap::new();
    for step in p.steps.iter().filter(|s| s.who == t) {
        if sh.abort.load(Ordering::SeqCst) {
            return Err(Stop);
        }
        match &step.act {
            Act::Send { v, to, keep } => {
                let Some(x) = held.get(v) else {
                    sh.rec
                        .problem(Some(*v), format!("#{}: send of missing v{v}", step.id));
                    return Err(Stop);
                };
                // The receiver may have ended (it does not have to receive).
                let _ = sh.senders[*to].send((*v, x.clone()));
                if !keep {
                    held.remove(v);
                }
            }
            Act::Recv { v } => {
                let x = receive(*v, rx, &mut arrived, sh)?;
                held.insert(*v, x);
            }
            Act::Spawn(job) => spawn_job(p, sh, job, &held),
            Act::Scope(jobs) => scope_jobs(p, sh, jobs, &mut held),
            Act::End { panic, sync } => {
                if *sync {
                    let _ = streamfuse::sync();
                }
                if *panic {
                    resume_unwind(Box::new(Planned));
                }
                return Ok(());
            }
            _ => exec_local(p, step, &mut held, &sh.rec, false)?,
        }
    }
    Ok(())
}

fn receive(
    v: V,
    rx: &Receiver<(V, Tensor)>,
    arrived: &mut HashMap<V, Vec<Tensor>>,
    sh: &Shared,
) -> Result<Tensor, Stop> {
    loop {
        if let Some(x) = arrived.get_mut(&v).and_then(Vec::pop) {
            return Ok(x);
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok((w, x)) => arrived.entry(w).or_default().push(x),
            Err(RecvTimeoutError::Timeout) if !sh.abort.load(Ordering::SeqCst) => {}
            Err(_) => return Err(Stop),
        }
    }
}

fn spawn_job(p: &Arc<Program>, sh: &Arc<Shared>, job: &Job, held: &HashMap<V, Tensor>) {
    let inputs = job_inputs(job, held);
    let (p, sh, job) = (p.clone(), sh.clone(), job.clone());
    sh.jobs.fetch_add(1, Ordering::SeqCst);
    rayon::spawn(move || {
        let outs = catch_unwind(AssertUnwindSafe(|| {
            run_job(&p, &job, inputs, &sh.rec, false)
        }));
        match outs {
            Ok(outs) => {
                if outs.len() != job.outputs.len() {
                    sh.abort.store(true, Ordering::SeqCst);
                }
                for (v, x, dest) in outs {
                    if let Dest::Thread(u) = dest {
                        let _ = sh.senders[u].send((v, x));
                    }
                }
            }
            Err(payload) => {
                sh.abort.store(true, Ordering::SeqCst);
                sh.rec.problem(
                    None,
                    format!("a rayon job panicked: {}", panic_message(payload.as_ref())),
                );
            }
        }
        sh.jobs.fetch_sub(1, Ordering::SeqCst);
    });
}

fn scope_jobs(p: &Program, sh: &Shared, jobs: &[Job], held: &mut HashMap<V, Tensor>) {
    let mut results: Vec<Option<Vec<(V, Tensor, Dest)>>> = jobs.iter().map(|_| None).collect();
    let inputs: Vec<Vec<(V, Tensor)>> = jobs.iter().map(|j| job_inputs(j, held)).collect();
    rayon::scope(|s| {
        for ((job, inputs), slot) in jobs.iter().zip(inputs).zip(results.iter_mut()) {
            s.spawn(move |_| {
                let outs =
                    catch_unwind(AssertUnwindSafe(|| run_job(p, job, inputs, &sh.rec, false)));
                match outs {
                    Ok(outs) => *slot = Some(outs),
                    Err(payload) => {
                        sh.abort.store(true, Ordering::SeqCst);
                        sh.rec.problem(
                            None,
                            format!("a scoped job panicked: {}", panic_message(payload.as_ref())),
                        );
                    }
                }
            });
        }
    });
    for (v, x, _) in results.into_iter().flatten().flatten() {
        held.insert(v, x);
    }
}

/// The threaded run: eight threads, each doing its own steps in order.
fn run_threads(p: &Arc<Program>) -> Record {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| unbounded()).unzip();
    let sh = Arc::new(Shared {
        rec: Record::default(),
        senders,
        abort: AtomicBool::new(false),
        jobs: AtomicUsize::new(0),
    });
    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, rx)| {
            let (p, sh) = (p.clone(), sh.clone());
            thread::Builder::new()
                .name(format!("fuzz-{t}"))
                .spawn(move || thread_main(t, &p, &sh, rx))
                .expect("spawn a thread")
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        let joined = h.join();
        // A thread that stopped early (after a problem already recorded) never got to
        // its planned panic.
        let planned = p.panics(t) && !sh.abort.load(Ordering::SeqCst);
        match joined {
            Ok(()) if planned => sh.rec.problem(None, format!("thread {t} did not panic")),
            Ok(()) => {}
            Err(payload) if payload.is::<Planned>() => {}
            Err(payload) => sh.rec.problem(
                None,
                format!("thread {t} panicked: {}", panic_message(payload.as_ref())),
            ),
        }
    }
    while sh.jobs.load(Ordering::SeqCst) > 0 {
        thread::sleep(Duration::from_micros(200));
    }
    if p.uses_rayon {
        // Workers keep their streams (and whatever jobs left queued there).
        rayon::broadcast(|_| {
            let _ = streamfuse::sync();
        });
    }
    // A finished job may still be letting go of its `Arc` (it holds no tensor).
    let mut sh = sh;
    loop {
        match Arc::try_unwrap(sh) {
            Ok(done) => return done.rec,
            Err(back) => sh = back,
        }
        thread::sleep(Duration::from_micros(100));
    }
}

// ---------------------------------------------------------------------------------
// Comparing the runs
// ---------------------------------------------------------------------------------

/// The largest drift seen, as a fraction of its bound (for tuning the bounds), and
/// what was covered.
#[derive(Default)]
struct Drift {
    worst: f64,
    compared: u64,
    exact: u64,
    /// Reads expected to fail (computed from a failing index op), and done so.
    failed: u64,
    /// Per op: made, failed at record time.
    ops: std::collections::BTreeMap<String, (u64, u64)>,
}

impl Drift {
    fn count_ops(&mut self, p: &Program) {
        fn walk(steps: &[Step], p: &Program, d: &mut Drift) {
            for s in steps {
                match &s.act {
                    Act::Make { out, op } => {
                        let e = d.ops.entry(op.name()).or_default();
                        if p.vals[*out].ok {
                            e.0 += 1;
                        } else {
                            e.1 += 1;
                        }
                    }
                    Act::Spawn(j) => walk(&j.body, p, d),
                    Act::Scope(js) => js.iter().for_each(|j| walk(&j.body, p, d)),
                    _ => {}
                }
            }
        }
        walk(&p.steps, p, self);
    }
}

fn same_f32(a: f32, b: f32, err: f64) -> Option<f64> {
    if a.is_nan() && b.is_nan() {
        return Some(0.0);
    }
    if err == 0.0 {
        return (a.to_bits() == b.to_bits()).then_some(0.0);
    }
    if a == b {
        return Some(0.0);
    }
    if !a.is_finite() || !b.is_finite() {
        return None;
    }
    let d = (a as f64 - b as f64).abs();
    let bound = err + 4.0 * EPS * (b as f64).abs();
    (d <= bound).then_some(d / bound)
}

/// Compares what the threads read with what the reference read; `None` if equal.
fn compare_vals(val: &Val, got: &Vals, want: &Vals, drift: &mut Drift) -> Option<String> {
    if val.err.is_infinite() {
        let same_len = match (got, want) {
            (Vals::F32(a), Vals::F32(b)) => a.len() == b.len(),
            (Vals::U32(a), Vals::U32(b)) => a.len() == b.len(),
            (Vals::I64(a), Vals::I64(b)) => a.len() == b.len(),
            _ => false,
        };
        return (!same_len).then(|| "a different length or dtype".into());
    }
    match (got, want) {
        (Vals::F32(a), Vals::F32(b)) if a.len() == b.len() => {
            if val.err == 0.0 {
                drift.exact += 1;
            } else {
                drift.compared += 1;
            }
            for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
                match same_f32(x, y, val.err) {
                    Some(r) => drift.worst = drift.worst.max(r),
                    None => {
                        return Some(format!(
                            "element {i} of {}: {x:e} ({:#010x}), the reference has {y:e} \
                             ({:#010x}); allowed drift {:e}",
                            a.len(),
                            x.to_bits(),
                            y.to_bits(),
                            val.err
                        ))
                    }
                }
            }
            None
        }
        _ if got == want => None,
        _ => Some(format!("{got:?}, the reference has {want:?}")),
    }
}

fn same_error(a: &Error, b: &Error) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b) && a.op() == b.op()
}

/// Finds the value each step is about (for messages).
fn step_values(steps: &[Step], out: &mut HashMap<usize, (V, DType, bool)>) {
    for s in steps {
        match &s.act {
            Act::Make { out: v, .. } => {
                out.insert(s.id, (*v, DType::F32, false));
            }
            Act::Read { v, as_dtype } => {
                out.insert(s.id, (*v, *as_dtype, true));
            }
            Act::Spawn(job) => step_values(&job.body, out),
            Act::Scope(jobs) => jobs.iter().for_each(|j| step_values(&j.body, out)),
            _ => {}
        }
    }
}

/// Every difference between the two runs and the model.
fn compare(p: &Program, reference: &Record, threads: &Record, drift: &mut Drift) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (side, rec) in [("reference", reference), ("threads", threads)] {
        for pr in rec.problems.lock().unwrap().iter() {
            problems.push(Problem {
                msg: format!("{side}: {}", pr.msg),
                focus: pr.focus,
            });
        }
    }
    let aborted = !problems.is_empty();
    let mut about = HashMap::new();
    step_values(&p.steps, &mut about);
    let want = reference.outcomes.lock().unwrap();
    let got = threads.outcomes.lock().unwrap();
    let mut ids: Vec<&usize> = want.keys().collect();
    ids.sort();
    for id in ids {
        let (v, as_dtype, _) = about[id];
        let val = &p.vals[v];
        let mut bad = |msg: String| {
            problems.push(Problem {
                msg: format!("#{id} (v{v}): {msg}"),
                focus: Some(v),
            })
        };
        let Some(g) = got.get(id) else {
            if !aborted {
                bad("not run by the threads".into());
            }
            continue;
        };
        match (&want[id], g) {
            (Outcome::Made(w), Outcome::Made(g)) => {
                if w != g {
                    bad(format!("made {g:?}, the reference made {w:?}"));
                }
            }
            (Outcome::Read(w), Outcome::Read(g)) => {
                if as_dtype != val.dtype {
                    if w != g || w.is_ok() {
                        bad(format!("read as {as_dtype}: {g:?}, reference {w:?}"));
                    }
                    continue;
                }
                match (w, g) {
                    (Ok(_), _) if val.fails => bad(
                        "the reference computed a value that depends on a failing index op".into(),
                    ),
                    (Err(e), _) if !val.fails => bad(format!("the reference failed: {e}")),
                    (Err(e), Ok(_)) => {
                        bad(format!("computed by the threads, but should fail with {e}"))
                    }
                    (Err(e), Err(f)) if !same_error(e, f) => {
                        bad(format!("failed with {f}, the reference with {e}"))
                    }
                    (Ok(_), Err(f)) => bad(format!(
                        "failed in the threads, but depends on no failing op: {f}"
                    )),
                    (Ok(w), Ok(g)) => {
                        if let Some(msg) = compare_vals(val, g, w, drift) {
                            bad(msg);
                        }
                    }
                    (Err(_), Err(_)) => drift.failed += 1,
                }
            }
            (w, g) => bad(format!("outcomes of different kinds: {g:?} vs {w:?}")),
        }
    }
    problems
}

// ---------------------------------------------------------------------------------
// Describing programs
// ---------------------------------------------------------------------------------

fn describe_act(p: &Program, act: &Act) -> String {
    match act {
        Act::Make { out, op } => {
            let v = &p.vals[*out];
            if !v.ok {
                return format!("{op}  (must fail at record time)");
            }
            let mut s = format!("v{out} = {op}  : {:?} {}", v.dims, v.dtype);
            if v.fails {
                s += ", fails";
            }
            match v.err {
                0.0 => s += ", exact",
                e if e.is_infinite() => s += ", not compared",
                e => s += &format!(", drift <= {e:.1e}"),
            }
            s
        }
        Act::Read { v, as_dtype } => format!("read v{v} as {as_dtype}"),
        Act::Drop { v } => format!("drop v{v}"),
        Act::Sync => "sync()".into(),
        Act::Trim => "trim_pools()".into(),
        Act::Limits { plan, pool } => {
            format!("set_plan_cache_limit({plan}), set_pool_limit({pool})")
        }
        Act::Send { v, to, keep } => {
            format!(
                "send v{v} to t{to}{}",
                if *keep { " (keep a clone)" } else { "" }
            )
        }
        Act::Recv { v } => format!("receive v{v}"),
        Act::Spawn(job) => format!(
            "rayon::spawn(inputs {:?}, outputs {:?})",
            job.inputs, job.outputs
        ),
        Act::Scope(jobs) => format!("rayon::scope with {} jobs", jobs.len()),
        Act::End { panic, sync } => format!(
            "end{}{}",
            if *sync {
                " after sync()"
            } else {
                " with work pending"
            },
            if *panic { ", by a planned panic" } else { "" }
        ),
    }
}

/// The steps, one a line; with `focus`, only those that lead to that value (its
/// ancestors, how they travelled) and the thread ends.
fn describe(p: &Program, focus: Option<V>) -> String {
    let keep: Option<Vec<bool>> = focus.map(|f| {
        let mut makers: HashMap<V, (usize, &Op)> = HashMap::new();
        fn collect<'a>(steps: &'a [Step], makers: &mut HashMap<V, (usize, &'a Op)>) {
            for s in steps {
                match &s.act {
                    Act::Make { out, op } => {
                        makers.insert(*out, (s.who, op));
                    }
                    Act::Spawn(j) => collect(&j.body, makers),
                    Act::Scope(js) => js.iter().for_each(|j| collect(&j.body, makers)),
                    _ => {}
                }
            }
        }
        collect(&p.steps, &mut makers);
        // The focus, and the failing index ops with their direct readers: a value
        // poisoned by a failure it does not depend on is explained by those.
        let mut stack = vec![f];
        let who = makers.get(&f).map(|m| m.0);
        for (&v, &(t, op)) in &makers {
            let source = p.vals[v].fails && op.inputs().iter().all(|&i| !p.vals[i].fails);
            if source && Some(t) == who {
                stack.push(v);
                let readers = makers.iter().filter(|(_, m)| m.1.inputs().contains(&v));
                stack.extend(readers.map(|(&w, _)| w));
            }
        }
        let mut need = vec![false; p.vals.len()];
        while let Some(v) = stack.pop() {
            if v < need.len() && !std::mem::replace(&mut need[v], true) {
                if let Some((_, op)) = makers.get(&v) {
                    stack.extend(op.inputs());
                }
            }
        }
        need
    });
    let about = |act: &Act, need: &[bool]| match act {
        Act::Make { out, .. } => need[*out],
        Act::Read { v, .. } | Act::Drop { v } | Act::Send { v, .. } | Act::Recv { v } => need[*v],
        Act::Spawn(_) | Act::Scope(_) => true,
        Act::End { .. } | Act::Sync | Act::Trim | Act::Limits { .. } => false,
    };
    // Threads that take part in the slice (their ends are shown).
    let mut active = [false; THREADS];
    if let Some(need) = &keep {
        fn mark(steps: &[Step], f: &dyn Fn(&Act) -> bool, active: &mut [bool; THREADS]) {
            for s in steps {
                if f(&s.act) {
                    active[s.who] = true;
                }
                match &s.act {
                    Act::Spawn(j) => mark(&j.body, f, active),
                    Act::Scope(js) => js.iter().for_each(|j| mark(&j.body, f, active)),
                    _ => {}
                }
            }
        }
        let f = |a: &Act| !matches!(a, Act::Spawn(_) | Act::Scope(_)) && about(a, need);
        mark(&p.steps, &f, &mut active);
    }
    let wanted = |act: &Act| -> bool {
        let Some(need) = &keep else { return true };
        match act {
            Act::End { .. } => true,
            _ => about(act, need),
        }
    };
    let wanted = |s: &Step| {
        wanted(&s.act) && (!matches!(s.act, Act::End { .. }) || keep.is_none() || active[s.who])
    };
    let mut out = String::new();
    fn lines(
        p: &Program,
        steps: &[Step],
        indent: &str,
        wanted: &dyn Fn(&Step) -> bool,
        out: &mut String,
    ) {
        for s in steps {
            if !wanted(s) {
                continue;
            }
            out.push_str(&format!(
                "{indent}#{} t{}: {}\n",
                s.id,
                s.who,
                describe_act(p, &s.act)
            ));
            match &s.act {
                Act::Spawn(j) => lines(p, &j.body, &format!("{indent}    "), wanted, out),
                Act::Scope(js) => {
                    for (i, j) in js.iter().enumerate() {
                        out.push_str(&format!(
                            "{indent}    job {i}: inputs {:?}, outputs {:?}\n",
                            j.inputs, j.outputs
                        ));
                        lines(p, &j.body, &format!("{indent}        "), wanted, out);
                    }
                }
                _ => {}
            }
        }
    }
    lines(p, &p.steps, "  ", &wanted, &mut out);
    out
}

// ---------------------------------------------------------------------------------
// The watchdog, and the test
// ---------------------------------------------------------------------------------

/// The program running now and since when (for the watchdog).
static RUNNING: Mutex<Option<(Arc<Program>, Instant, String)>> = Mutex::new(None);

/// Writes to the process's stderr, bypassing the test harness's capture (so that it
/// is seen even when the process is then ended).
fn shout(msg: &str) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(msg.as_bytes());
    let _ = e.flush();
}

/// Ends the process with a message if one program runs longer than `limit` (a hang
/// would otherwise stall CI forever).
fn start_watchdog(limit: Duration) {
    thread::spawn(move || loop {
        thread::sleep(Duration::from_millis(250));
        let running = RUNNING.lock().unwrap();
        if let Some((p, since, replay)) = running.as_ref() {
            if since.elapsed() > limit {
                shout(&format!(
                    "\nfuzz: the program of seed {} hung: still running after {:?}\n\
                     replay: {replay}\n{}",
                    p.seed,
                    limit,
                    describe(p, None)
                ));
                std::process::exit(3);
            }
        }
    });
}

/// Names the running program on every unplanned panic (planned ones are raised with
/// `resume_unwind`, which skips the hook), uncaptured: a panic inside a thread-local
/// destructor aborts the process right after the hook, and the harness's captured
/// output is lost with it.
fn name_the_program_on_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Ok(running) = RUNNING.try_lock() {
            if let Some((p, _, replay)) = running.as_ref() {
                shout(&format!(
                    "fuzz: a panic while running the program of seed {}; replay: {replay}\n",
                    p.seed
                ));
            }
        }
        default(info);
    }));
}

fn replay_line(seed: u64, skip: &str) -> String {
    let mut s = format!("STREAMFUSE_FUZZ_SEED={seed}");
    if !skip.is_empty() {
        s += &format!(" STREAMFUSE_FUZZ_SKIP={skip}");
    }
    s + " cargo test --test fuzz"
}

/// Engine counters must show nothing left behind by the program.
fn leftovers(baseline_streams: usize) -> Option<String> {
    let s = streamfuse::stats();
    (s.live_buffers != 0 || s.live_bytes != 0 || s.live_streams != baseline_streams).then(|| {
        format!(
            "left behind: {} live buffers, {} live bytes, {} streams ({} expected): {s:?}",
            s.live_buffers, s.live_bytes, s.live_streams, baseline_streams
        )
    })
}

#[test]
fn random_programs_on_eight_threads_match_one_unfused_thread() {
    let cfg = Config::from_env();
    let skip_names = std::env::var("STREAMFUSE_FUZZ_SKIP").unwrap_or_default();
    start_watchdog(cfg.timeout);
    name_the_program_on_panics();
    // The reference runs on this thread: no fusion, no flush but reads and syncs.
    streamfuse::set_fusion(false);
    streamfuse::set_queue_limit(HUGE_QUEUE);
    if !cfg.skip.rayon {
        // Rayon workers get their streams now; they live as long as the process.
        rayon::broadcast(|_| streamfuse::sync().unwrap());
    }
    let baseline = streamfuse::stats().live_streams;
    let start = Instant::now();
    let mut drift = Drift::default();
    let mut failures = Vec::new();
    let mut ran = 0u64;
    for seed in cfg.first..cfg.first + cfg.count {
        ran += 1;
        if ran.is_multiple_of(1000) {
            // Every distinct segment leaves a plan in the cache (up to its limit), and
            // `stats()` walks them all: this keeps long runs from slowing down.
            streamfuse::clear_plan_cache();
        }
        let p = Arc::new(generate(seed, cfg.skip));
        let replay = replay_line(seed, &skip_names);
        if cfg.verbose {
            shout(&format!("fuzz: seed {seed} ({} steps)\n", p.steps.len()));
        }
        *RUNNING.lock().unwrap() = Some((p.clone(), Instant::now(), replay.clone()));
        if cfg.verbose {
            drift.count_ops(&p);
        }
        let reference = run_reference(&p);
        let threads = run_threads(&p);
        streamfuse::set_plan_cache_limit(streamfuse::DEFAULT_PLAN_CACHE_LIMIT);
        streamfuse::set_pool_limit(usize::MAX);
        let mut problems = compare(&p, &reference, &threads, &mut drift);
        drop((reference, threads));
        if let Some(msg) = leftovers(baseline) {
            problems.push(Problem { msg, focus: None });
        }
        *RUNNING.lock().unwrap() = None;
        if problems.is_empty() {
            continue;
        }
        let focus = problems.iter().find_map(|pr| pr.focus);
        let mut report = format!(
            "fuzz: seed {seed} failed ({} problems); replay: {replay}\n",
            problems.len()
        );
        for pr in problems.iter().take(8) {
            report += &format!("  {}\n", pr.msg);
        }
        report += &format!(
            "the program{}:\n{}",
            if focus.is_some() {
                " (the steps that lead to the first problem)"
            } else {
                ""
            },
            describe(&p, focus)
        );
        eprintln!("{report}");
        if cfg.verbose {
            shout(&report);
        }
        failures.push(seed);
        if failures.len() as u64 >= cfg.max_failures {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let summary = format!(
        "fuzz: {} programs from seed {} in {secs:.1} s ({:.1}/s); {} exact and {} approximate \
         reads compared, worst drift {:.2} of its bound",
        ran,
        cfg.first,
        ran as f64 / secs,
        drift.exact,
        drift.compared,
        drift.worst
    );
    if cfg.verbose {
        let ops: Vec<String> = drift
            .ops
            .iter()
            .map(|(name, (ok, err))| format!("{name} {ok}/{err}"))
            .collect();
        shout(&format!(
            "{summary}; {} reads failed as they must\nops (made/failing at record time): {}\n",
            drift.failed,
            ops.join(", ")
        ));
    }
    println!("{summary}");
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
}
