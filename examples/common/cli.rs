//! What the examples' command-line programs share: hand-parsed flags (a few each, no
//! parser crate: `--name value`, `--name=value` and value-less switches), the figures
//! they report (percentiles, /proc memory lines) and `main`'s error handling.
#![allow(dead_code)]

/// Calls `on(name, value)` for each flag of the command line; `value()` takes the
/// flag's value (the part after `=`, else the next argument) and is not called by
/// switches. `-h`/`--help` prints `usage` and exits.
pub fn each_flag(
    usage: &str,
    mut on: impl FnMut(&str, &mut dyn FnMut() -> Result<String, String>) -> Result<(), String>,
) -> Result<(), String> {
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{usage}");
            std::process::exit(0);
        }
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.clone(), None),
        };
        let mut inline = inline;
        let mut value = || {
            inline
                .take()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        on(&name, &mut value).map_err(|e| format!("{e}\n{usage}"))?;
    }
    Ok(())
}

/// `v` as a whole number of at least 1, or an error naming `what`.
pub fn count(v: String, what: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{what} must be a whole number of at least 1, got `{v}`"
        )),
    }
}

/// `v` as a whole number of milliseconds, or an error naming `what`.
pub fn millis(v: String, what: &str) -> Result<std::time::Duration, String> {
    v.parse()
        .map(std::time::Duration::from_millis)
        .map_err(|_| format!("{what} must be a whole number of milliseconds, got `{v}`"))
}

/// A status line of /proc/self/status (`VmHWM`, `VmRSS`) in MiB, where /proc has it.
pub fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The `p`th percentile (nearest rank) of ascending `sorted`; 0 when it is empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `main` for a program whose `run` returns an error message: logging set up from
/// `RUST_LOG`, the message on stderr and a failing exit status.
pub fn main_with(run: fn() -> Result<(), String>) -> std::process::ExitCode {
    env_logger::init();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A tokio runtime with `threads` worker threads, for the HTTP side of a program.
pub fn tokio_runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}
