//! `streamfuse-plan`: plan a buffer trace from the command line.
//!
//! ```text
//! streamfuse-plan INPUT.csv [--out OUT.csv] [--svg PLAN.svg] [--capacity BYTES] [--strategy NAME] [--time-limit SECONDS]
//! ```
//!
//! INPUT is a MiniMalloc CSV trace (`id,lower,upper,size[,alignment]`). OUT, if
//! asked for, gets the input rows in input order with an `offset` column. The last
//! line on stdout is
//! `buffers=N lower_bound=L arena=A ratio=R strategy=S millis=T`.
//!
//! `--svg` draws the plan as an SVG picture (steps across, offsets up, one rectangle
//! per buffer with its id on hover, the lower bound and the arena as lines, the peak
//! marked; see `streamfuse::memory_planner::svg`).
//!
//! `--time-limit` bounds the planning of the `best` strategy: when it ends, the
//! best plan found so far is validated and used (a cheap first plan is always
//! made, in well under a second for a million buffers).
//!
//! Exit status: 0 when a plan was found (within the capacity, if one was given),
//! 3 when no plan within the capacity was found in the time limit, 2 on bad input
//! or bad arguments (with the reason on stderr), 1 on an internal error.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use streamfuse::memory_planner::{self as plan, csv, Options, PlanError, Strategy};

const USAGE: &str = "usage: streamfuse-plan INPUT.csv [--out OUT.csv] [--svg PLAN.svg] [--capacity BYTES] [--strategy NAME] [--time-limit SECONDS]
  --out          the input rows with an offset column
  --svg          a picture of the plan: steps across, offsets up, a rectangle per buffer
  --strategy     naive | linear-scan | greedy-size | greedy-breadth | best (default)
  --time-limit   seconds the best strategy may plan, all phases included (default 10);
                 when they run out, the best plan found so far is used
  --capacity     largest acceptable arena in bytes (exit 3 if none is found)";

struct Args {
    input: String,
    out: Option<String>,
    svg: Option<String>,
    options: Options,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut input = None;
    let mut out = None;
    let mut svg = None;
    let mut options = Options {
        time_limit: Duration::from_secs(10),
        ..Options::default()
    };
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--out" | "-o" => out = Some(value("--out")?),
            "--svg" => svg = Some(value("--svg")?),
            "--capacity" => {
                let v = value("--capacity")?;
                let c = v
                    .replace('_', "")
                    .parse::<u64>()
                    .map_err(|_| format!("--capacity {v:?} is not a number of bytes"))?;
                options.capacity = Some(c);
            }
            "--strategy" => {
                let v = value("--strategy")?;
                options.strategy = v.parse::<Strategy>().map_err(|e| e.to_string())?;
            }
            "--time-limit" => {
                let v = value("--time-limit")?;
                let s = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
                    .ok_or_else(|| format!("--time-limit {v:?} is not a number of seconds"))?;
                options.time_limit = Duration::from_secs_f64(s);
            }
            f if f.starts_with('-') && f.len() > 1 => return Err(format!("unknown option {f}")),
            _ => {
                if input.is_some() {
                    return Err(format!("unexpected argument {arg:?} (only one INPUT)"));
                }
                input = Some(arg);
            }
        }
    }
    let input = input.ok_or("missing INPUT.csv")?;
    Ok(Args {
        input,
        out,
        svg,
        options,
    })
}

fn summary(buffers: usize, lb: u64, arena: u64, strategy: Strategy, millis: u128) -> String {
    let ratio = if lb == 0 {
        1.0
    } else {
        arena as f64 / lb as f64
    };
    format!("buffers={buffers} lower_bound={lb} arena={arena} ratio={ratio:.6} strategy={strategy} millis={millis}")
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let trace = match csv::read_file(&args.input) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}: {e}", args.input);
            return ExitCode::from(2);
        }
    };
    let n = trace.problem.buffers.len();
    let start = Instant::now();
    let result = plan::solve(&trace.problem, &args.options);
    let millis = start.elapsed().as_millis();
    let strategy = args.options.strategy;
    match result {
        Ok(p) => {
            if let Some(out) = &args.out {
                if let Err(e) = csv::write_file(out, &trace, &p.offsets) {
                    eprintln!("error: {e}");
                    return ExitCode::from(1);
                }
            }
            if let Some(path) = &args.svg {
                let options = plan::SvgOptions {
                    title: args.input.clone(),
                    names: trace.ids.clone(),
                    ..plan::SvgOptions::default()
                };
                if let Err(e) = plan::write_svg(path, &trace.problem, &p.offsets, &options) {
                    eprintln!("error: {e}");
                    return ExitCode::from(1);
                }
            }
            println!(
                "planned {} buffers from {}: arena {} bytes, lower bound {}{}",
                n,
                args.input,
                p.arena,
                p.lower_bound,
                if p.arena == p.lower_bound {
                    " (optimal)"
                } else {
                    ""
                }
            );
            println!("{}", summary(n, p.lower_bound, p.arena, strategy, millis));
            ExitCode::SUCCESS
        }
        Err(PlanError::CapacityExceeded {
            capacity,
            best_arena,
            lower_bound,
        }) => {
            eprintln!(
                "no plan within capacity {capacity} found in the time limit (best arena {best_arena}, lower bound {lower_bound})"
            );
            println!("{}", summary(n, lower_bound, best_arena, strategy, millis));
            ExitCode::from(3)
        }
        Err(e @ PlanError::InvalidPlan { .. }) => {
            eprintln!("internal error: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {}: {e}", args.input);
            ExitCode::from(2)
        }
    }
}
