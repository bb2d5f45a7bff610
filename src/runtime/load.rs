//! How many kernel threads the machine has room for: the flushes' thread cap under
//! other processes' load.
//!
//! A flush splits its kernels between threads on the assumption that each thread has
//! a core. When another process keeps a core busy (a second server process, a build, a
//! noisy neighbour's stolen time), the kernel thread that shares its core is
//! descheduled for whole time slices, and every split kernel waits for it. On the
//! 2-core Zen 5 with one busy loop beside it, one sentence a call ran at 155–170
//! sentences/s with p99 60–85 ms on two kernel threads, and at 313–323 sentences/s
//! with p99 5 ms pinned to one core (ONNX Runtime suffers alike: 152 sentences/s on two
//! threads, 193 on one).
//!
//! So, as OpenMP's dynamic teams do, the engine looks at the machine's load before a
//! flush ([`room`]); with this cap, the run beside the busy loop made 291–314
//! sentences/s with p99 5–9 ms (`scripts/compare-shared.sh` measures it against ONNX
//! Runtime). At most every [`WINDOW`], the flushing thread reads how much CPU
//! time the CPUs this process may run on spent busy (`/proc/stat`), and how much of it
//! was this process's own (`/proc/self/stat`). The rest is other processes' load, in
//! cores; the cores it leaves free, rounded, cap the threads a flush's kernels use,
//! with a margin against flipping back and forth near the line. Spinning kernel
//! workers count as this process's own time, so they never cap themselves.
//!
//! Only Linux has these files; elsewhere, and when they cannot be read, nothing is
//! capped. [`set_load_aware`] turns the cap off. The cap never changes results: the
//! kernels' splits give the same bits on any number of threads.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shortest time between two looks at the machine's load.
pub(crate) const WINDOW: Duration = Duration::from_millis(100);

/// Whether flushes take the machine's load into account ([`set_load_aware`]).
static AWARE: AtomicBool = AtomicBool::new(true);

/// The cap in force: the most kernel threads a flush may use (`usize::MAX`: none).
static CAP: AtomicUsize = AtomicUsize::new(usize::MAX);

/// When the next look is due, in nanoseconds since [`epoch`].
static NEXT_LOOK: AtomicU64 = AtomicU64::new(0);

/// Sets whether flushes cap their kernel threads by the cores other processes leave
/// free (on by default, Linux only).
///
/// With it on, a flush that could use several kernel threads uses no more than the
/// cores the machine's other processes have left idle over the last tenth of a second
/// or so, and at least one. Turn it off to keep every flush on its full thread budget
/// (`set_kernel_threads`) whatever else runs, for instance to measure the kernels'
/// parallel paths on a machine shared with other work. `STREAMFUSE_LOAD_AWARE=0` in
/// the environment turns it off from the start.
pub fn set_load_aware(on: bool) {
    read_env();
    AWARE.store(on, Ordering::Relaxed);
    if !on {
        CAP.store(usize::MAX, Ordering::Relaxed);
    }
}

/// Whether flushes cap their kernel threads by the machine's load ([`set_load_aware`]).
pub fn load_aware() -> bool {
    read_env();
    AWARE.load(Ordering::Relaxed)
}

/// Applies `STREAMFUSE_LOAD_AWARE=0` (the cap off from the start) once, before the
/// first use or change of the setting.
fn read_env() {
    static READ: std::sync::Once = std::sync::Once::new();
    READ.call_once(|| {
        if std::env::var("STREAMFUSE_LOAD_AWARE").is_ok_and(|v| v.trim() == "0") {
            AWARE.store(false, Ordering::Relaxed);
        }
    });
}

/// The kernel threads a flush with a budget of `threads` may use now: `threads`, or
/// fewer while other processes keep some of this process's cores busy (never fewer
/// than 1). Looks at the load again when the last look is older than [`WINDOW`].
pub(crate) fn room(threads: usize) -> usize {
    if threads <= 1 || !load_aware() {
        return threads;
    }
    let now = epoch().elapsed().as_nanos() as u64;
    let due = NEXT_LOOK.load(Ordering::Relaxed);
    if now >= due
        && NEXT_LOOK
            .compare_exchange(due, u64::MAX, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    {
        // This thread looks; the others keep the cap in force until it is done.
        let took = Instant::now();
        look();
        let cost = took.elapsed();
        // Reading /proc/stat takes longer on a host of many CPUs: keep its cost below
        // half a percent of the time.
        let gap = WINDOW.max(cost * 200);
        NEXT_LOOK.store(
            epoch().elapsed().as_nanos() as u64 + gap.as_nanos() as u64,
            Ordering::Release,
        );
    }
    allowed(threads)
}

/// The kernel threads a flush with a budget of `threads` may use under the cap in
/// force, without looking at the load again ([`room`] looks).
pub(crate) fn allowed(threads: usize) -> usize {
    if load_aware() {
        threads.min(CAP.load(Ordering::Relaxed)).max(1)
    } else {
        threads
    }
}

/// The instant the engine's load clock starts.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Takes a new sample and updates [`CAP`] from the one before it.
fn look() {
    static SAMPLER: parking_lot::Mutex<Sampler> = parking_lot::Mutex::new(Sampler {
        stat: Vec::new(),
        own: Vec::new(),
        last: None,
    });
    let mut sampler = SAMPLER.lock();
    let Some(now) = sampler.sample() else {
        CAP.store(usize::MAX, Ordering::Relaxed);
        return;
    };
    if let Some(others) = sampler.last.and_then(|before| others_load(&before, &now)) {
        let current = CAP.load(Ordering::Relaxed).min(now.cpus);
        let cap = threads_for(now.cpus as f64 - others, now.cpus, current);
        if cap != current {
            log::debug!(
                "kernel threads now at most {cap} ({} CPUs; other processes kept {others:.2} cores busy)",
                now.cpus
            );
        }
        CAP.store(
            if cap >= now.cpus { usize::MAX } else { cap },
            Ordering::Relaxed,
        );
    }
    sampler.last = Some(now);
}

/// The reader of the load counters: its buffers are kept, so that after the first
/// look a flush's look allocates nothing (the engine's steady state allocates
/// nothing; `tests/alloc.rs`).
struct Sampler {
    /// The text of `/proc/stat`.
    stat: Vec<u8>,
    /// The text of `/proc/self/stat`.
    own: Vec<u8>,
    /// The sample before this one.
    last: Option<Sample>,
}

/// CPU time counters at one moment, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    /// Busy time of the CPUs this process may run on (user, nice, system, irq,
    /// softirq and steal: everything but idle and iowait).
    busy: u64,
    /// All time of those CPUs (busy, idle and iowait).
    total: u64,
    /// How many such CPUs there are.
    cpus: usize,
    /// This process's own CPU time (user and system, every thread).
    own: u64,
}

/// The cores other processes kept busy between two samples (`None` when no time
/// passed on the counters).
fn others_load(before: &Sample, now: &Sample) -> Option<f64> {
    let total = now.total.checked_sub(before.total)?;
    if total == 0 || now.cpus == 0 || now.cpus != before.cpus {
        return None;
    }
    let busy = now.busy.saturating_sub(before.busy);
    let own = now.own.saturating_sub(before.own);
    // Elapsed time in ticks of one CPU.
    let elapsed = total as f64 / now.cpus as f64;
    Some(busy.saturating_sub(own) as f64 / elapsed)
}

/// The thread cap for `spare` idle cores out of `cpus`, given the cap now in force
/// (`current`): `spare` rounded, but raised only once it reaches 0.3 below the next
/// whole core, so that a load near half a core does not flip the cap every window.
/// Always between 1 and `cpus`.
fn threads_for(spare: f64, cpus: usize, current: usize) -> usize {
    let up = (spare + 0.3).floor().max(1.0) as usize;
    let down = (spare + 0.5).floor().max(1.0) as usize;
    let cap = if up > current {
        up
    } else if down < current {
        down
    } else {
        current
    };
    cap.clamp(1, cpus.max(1))
}

impl Sampler {
    /// Reads a sample from `/proc` (Linux), or `None`.
    #[cfg(target_os = "linux")]
    fn sample(&mut self) -> Option<Sample> {
        static ALLOWED: OnceLock<Option<Vec<usize>>> = OnceLock::new();
        let allowed = ALLOWED.get_or_init(|| {
            let status = std::fs::read_to_string("/proc/self/status").ok()?;
            let list = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
            parse_cpu_list(list.trim())
        });
        let (busy, total, cpus) =
            parse_stat(read_into("/proc/stat", &mut self.stat)?, allowed.as_deref())?;
        Some(Sample {
            busy,
            total,
            cpus,
            own: parse_own_time(read_into("/proc/self/stat", &mut self.own)?)?,
        })
    }

    /// No load counters outside Linux: nothing is capped.
    #[cfg(not(target_os = "linux"))]
    fn sample(&mut self) -> Option<Sample> {
        None
    }
}

/// Reads the file at `path` into `buf` (kept: no allocation once it is large enough)
/// as text.
#[cfg(target_os = "linux")]
fn read_into<'a>(path: &str, buf: &'a mut Vec<u8>) -> Option<&'a str> {
    use std::io::Read;
    buf.clear();
    std::fs::File::open(path).ok()?.read_to_end(buf).ok()?;
    // Room for the counters' digits to grow, so that later reads never reallocate.
    if buf.capacity() < 2 * buf.len() {
        buf.reserve(buf.len());
    }
    std::str::from_utf8(buf).ok()
}

/// Busy and total ticks, summed over the `cpuN` lines of `/proc/stat` whose `N` is in
/// `allowed` (every CPU when `None`), and how many lines those were.
fn parse_stat(stat: &str, allowed: Option<&[usize]>) -> Option<(u64, u64, usize)> {
    let (mut busy, mut total, mut cpus) = (0u64, 0u64, 0usize);
    for line in stat.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(name) = fields.next() else { continue };
        let Some(Ok(n)) = name.strip_prefix("cpu").map(str::parse::<usize>) else {
            continue;
        };
        if allowed.is_some_and(|a| !a.contains(&n)) {
            continue;
        }
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let mut t = [0u64; 8];
        for slot in t.iter_mut() {
            *slot = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal] = t;
        let b = user + nice + system + irq + softirq + steal;
        busy += b;
        total += b + idle + iowait;
        cpus += 1;
    }
    (cpus > 0).then_some((busy, total, cpus))
}

/// User plus system ticks of `/proc/self/stat` (fields 14 and 15; the command name in
/// parentheses may hold spaces, so fields are counted after its closing one).
fn parse_own_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, so utime (14) is the 12th from here.
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The CPUs of a list such as `0-3,8,10-11`.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  300 10 100 1000 20 0 5 7 0 0\n\
        cpu0 100 5 50 500 10 0 2 3 0 0\n\
        cpu1 200 5 50 500 10 0 3 4 0 0\n\
        intr 32022000 0 0 0\n\
        ctxt 123\n\
        cpus_running 2\n";

    #[test]
    fn stat_sums_the_allowed_cpus() {
        // cpu0: busy 100+5+50+0+2+3 = 160, total 160+500+10 = 670.
        assert_eq!(parse_stat(STAT, Some(&[0])), Some((160, 670, 1)));
        // cpu1: busy 200+5+50+3+4 = 262, total 772. The aggregate line is not a CPU.
        assert_eq!(parse_stat(STAT, None), Some((422, 1442, 2)));
        assert_eq!(parse_stat(STAT, Some(&[5])), None);
        assert_eq!(parse_stat("intr 1 2\n", None), None);
    }

    #[test]
    fn own_time_is_user_plus_system() {
        let line = "17699 (a b) c) R 17695 17695 16534 0 -1 4194304 102 0 0 0 \
                    40 2 0 0 20 0 1 0 3721373 3133440 387";
        assert_eq!(parse_own_time(line), Some(42));
        assert_eq!(parse_own_time("17699 (cat) R 1 2"), None);
        assert_eq!(parse_own_time("no name here"), None);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(
            parse_cpu_list("0-2,8,10-11"),
            Some(vec![0, 1, 2, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("2-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn others_load_leaves_out_the_own_time() {
        let before = Sample {
            busy: 1000,
            total: 4000,
            cpus: 2,
            own: 500,
        };
        // 200 ticks passed on 2 CPUs: 100 of wall time. 150 busy, 50 of them own.
        let now = Sample {
            busy: 1150,
            total: 4200,
            cpus: 2,
            own: 550,
        };
        assert_eq!(others_load(&before, &now), Some(1.0));
        // Own time counted in more finely than the CPUs' ticks: never below 0.
        let own_ahead = Sample { own: 800, ..now };
        assert_eq!(others_load(&before, &own_ahead), Some(0.0));
        assert_eq!(others_load(&now, &before), None);
        assert_eq!(others_load(&before, &before), None);
    }

    #[test]
    fn the_cap_rounds_with_a_margin_upwards() {
        // Two CPUs, no cap: half a core of load or more takes one thread away.
        assert_eq!(threads_for(2.0, 2, 2), 2);
        assert_eq!(threads_for(1.6, 2, 2), 2);
        assert_eq!(threads_for(1.4, 2, 2), 1);
        // Capped at 1: the second thread comes back below 0.3 cores of load.
        assert_eq!(threads_for(1.6, 2, 1), 1);
        assert_eq!(threads_for(1.75, 2, 1), 2);
        // Never 0, never above the CPUs.
        assert_eq!(threads_for(0.0, 2, 2), 1);
        assert_eq!(threads_for(-3.0, 2, 1), 1);
        assert_eq!(threads_for(9.0, 4, 4), 4);
        // Many CPUs: the idle cores, rounded.
        assert_eq!(threads_for(30.2, 64, 64), 30);
        assert_eq!(threads_for(30.8, 64, 30), 31);
    }

    #[test]
    fn off_means_the_whole_budget() {
        set_load_aware(false);
        assert_eq!(room(2), 2);
        assert_eq!(room(7), 7);
        set_load_aware(true);
        assert_eq!(room(1), 1);
        assert!((1..=2).contains(&room(2)));
    }

    /// On Linux the sampler sees another process's busy loop as load (at least 0.3
    /// of a core over half a second, whatever else this machine runs).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_busy_process_is_load() {
        let Ok(mut child) = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
        else {
            return; // no shell to run the load with
        };
        let mut sampler = Sampler {
            stat: Vec::new(),
            own: Vec::new(),
            last: None,
        };
        std::thread::sleep(Duration::from_millis(50));
        let before = sampler.sample().expect("a Linux /proc sample");
        std::thread::sleep(Duration::from_millis(500));
        let now = sampler.sample().expect("a Linux /proc sample");
        let _ = child.kill();
        let _ = child.wait();
        let others = others_load(&before, &now).expect("time passed");
        assert!(others >= 0.3, "a busy loop counted as {others:.2} cores");
    }
}
