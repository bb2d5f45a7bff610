//! Writing recorded events as a Chrome trace event file, with the pictures of their
//! plans beside it.
//!
//! The file is the JSON object format of the Trace Event Format (the one Perfetto and
//! `chrome://tracing` open): `{"traceEvents": [...], "displayTimeUnit": "ms"}`. The
//! process's labels (`process_labels`) name the CPU tier the kernels ran on. Lanes
//! are threads of one process (`tid`): a stream's lane is its id, named after the
//! thread that opened the stream by a `thread_name` metadata event (`ph: "M"`); kernel
//! pool threads get lanes of their own from [`WORKER_LANES`] on. Flushes, kernels,
//! plan builds, memory planning and drains are complete events (`ph: "X"`, times in
//! microseconds); a drain's arrow is a flow (`ph: "s"` inside the drained flush,
//! `ph: "f"` inside the drain, bound to the enclosing slice).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use super::plan::TracedPlan;
use super::record::{Event, ThreadBuf, What, WORKER_LANES};
use super::{io_error, TraceError, Written, MAX_PLAN_PICTURES};

/// Writes `threads`' events to `path` and the pictures of their plans beside it.
pub(super) fn write(path: &Path, threads: Vec<ThreadBuf>) -> Result<Written, TraceError> {
    let mut events: Vec<(usize, Event)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut lanes: HashMap<u64, String> = HashMap::new();
    for (t, buf) in threads.into_iter().enumerate() {
        if buf.own_lane != 0 {
            lanes.insert(
                buf.own_lane,
                format!("{} (stream{})", buf.thread, buf.own_lane),
            );
        }
        if let Some(w) = buf.worker_lane {
            lanes.insert(w, buf.thread.clone());
        }
        events.extend(buf.events.into_iter().map(|e| (t, e)));
        names.push(buf.thread);
    }
    // Enclosing slices first: a slice starting with its parent sorts after it.
    events.sort_by_key(|(_, e)| (e.start, std::cmp::Reverse(e.end)));
    let (plans, pictures) = write_pictures(path, &events)?;
    let file = File::create(path).map_err(|e| io_error(path, e))?;
    let mut out = Out {
        w: BufWriter::new(file),
        first: true,
        count: 0,
    };
    write_events(&mut out, &events, &names, &lanes, &plans)
        .and_then(|()| {
            out.w.write_all(b"\n],\"displayTimeUnit\":\"ms\"}\n")?;
            out.w.flush()
        })
        .map_err(|e| io_error(path, e))?;
    Ok(Written {
        path: path.to_path_buf(),
        events: out.count,
        plans: (pictures > 0).then(|| plans_dir(path)),
        plan_pictures: pictures,
    })
}

/// The trace file being written: events separated by commas.
struct Out {
    w: BufWriter<File>,
    first: bool,
    /// Events written, lane metadata not counted.
    count: usize,
}

impl Out {
    fn event(&mut self, v: &Value) -> std::io::Result<()> {
        self.w.write_all(if self.first {
            b"{\"traceEvents\":[\n"
        } else {
            b",\n"
        })?;
        self.first = false;
        serde_json::to_writer(&mut self.w, v).map_err(std::io::Error::from)
    }
}

/// The lane names, then every event.
fn write_events(
    out: &mut Out,
    events: &[(usize, Event)],
    names: &[String],
    lanes: &HashMap<u64, String>,
    plans: &HashMap<u64, String>,
) -> std::io::Result<()> {
    let pid = std::process::id();
    out.event(
        &json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                      "args": {"name": "streamfuse"}}),
    )?;
    out.event(&tier_labels(pid))?;
    let mut used: Vec<u64> = events.iter().map(|(_, e)| e.lane).collect();
    used.sort_unstable();
    used.dedup();
    for lane in used {
        let name = lanes.get(&lane).cloned().unwrap_or_else(|| match lane {
            0 => "outside a flush".to_string(),
            l if l >= WORKER_LANES => format!("kernel thread {}", l - WORKER_LANES),
            l => format!("stream{l}"),
        });
        out.event(
            &json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane,
                          "args": {"name": name}}),
        )?;
        out.event(
            &json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": lane,
                          "args": {"sort_index": lane}}),
        )?;
    }
    for (t, e) in events {
        for v in json_events(e, &names[*t], pid, plans) {
            out.event(&v)?;
            out.count += 1;
        }
    }
    if out.first {
        out.w.write_all(b"{\"traceEvents\":[\n")?;
    }
    Ok(())
}

/// The process's labels (shown beside its name): the CPU tier the kernels ran on and
/// the tiers this CPU has, also as `cpu_tier` and `cpu_tiers` for programs reading
/// the trace.
fn tier_labels(pid: u32) -> Value {
    use crate::kernels::cpu;
    let tier = cpu::tier().name();
    let has: Vec<&str> = cpu::available().iter().map(|t| t.name()).collect();
    json!({"name": "process_labels", "ph": "M", "pid": pid, "tid": 0,
           "args": {"labels": format!("cpu tier: {tier} (this CPU has: {})", has.join(", ")),
                    "cpu_tier": tier, "cpu_tiers": has}})
}

/// Microseconds, from nanoseconds.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The JSON events of one recorded event (a slice, and a flow's end where it has one).
fn json_events(e: &Event, thread: &str, pid: u32, plans: &HashMap<u64, String>) -> Vec<Value> {
    let (ts, dur) = (us(e.start), us(e.end.saturating_sub(e.start)));
    let slice = |name: String, cat: &str, args: Value| {
        json!({"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid,
               "tid": e.lane, "args": args})
    };
    // A flow event a nanosecond before the end of its slice, so it binds to it.
    let flow = |ph: &str, id: u64| {
        let mut v = json!({"name": "drain", "cat": "drain", "ph": ph, "id": id,
                           "ts": us(e.end.saturating_sub(1).max(e.start)), "pid": pid,
                           "tid": e.lane});
        if ph == "f" {
            v["bp"] = json!("e");
        }
        v
    };
    match &e.what {
        What::Flush {
            info,
            plan,
            flow: f,
            ready,
        } => {
            let mut args = json!({
                "reason": info.reason,
                "key": format!("{:016x}", info.key),
                "cache_hit": info.cache_hit,
                "planned": info.planned,
                "ops": info.ops,
                "kernels": info.kernels,
                "arena_bytes": info.arena_bytes,
                "arena_lower_bound": info.arena_lower_bound,
                "kernel_threads": info.kernel_threads,
                "wait_us": us(ready.saturating_sub(e.start)),
                "ran_on": thread,
            });
            if let Some(svg) = plans.get(&info.key) {
                args["plan_svg"] = json!(svg);
            }
            if plan.is_none() && info.planned {
                args["error"] = json!("no plan");
            }
            let mut out = vec![slice(format!("flush: {}", info.reason_name), "flush", args)];
            if let Some(id) = f {
                out.push(flow("s", *id));
            }
            out
        }
        What::Kernel {
            plan,
            index,
            op,
            stream,
        } => {
            let k = plan.kernel(*index as usize, op);
            let args = json!({
                "kind": k.kind,
                "ops": k.ops,
                "bytes_read": k.bytes_read,
                "bytes_written": k.bytes_written,
                "index": index,
                "level": k.level,
                "stream": stream,
                "ran_on": thread,
            });
            vec![slice(k.name, "kernel", args)]
        }
        What::Op {
            name,
            read,
            written,
        } => vec![slice(
            name.to_string(),
            "kernel",
            json!({
                "kind": "op",
                "ops": [name],
                "bytes_read": read,
                "bytes_written": written,
                "stream": e.lane,
                "ran_on": thread,
                "fused": false,
            }),
        )],
        What::Build { key, plan } => {
            let p = plan.summary();
            vec![slice(
                "plan build".to_string(),
                "plan",
                json!({
                    "key": format!("{key:016x}"),
                    "ops": p.ops,
                    "dead_ops": p.dead_ops,
                    "kernels": p.kernels,
                    "arena_bytes": p.arena_bytes,
                    "arena_lower_bound": p.arena_lower_bound,
                    "plan_svg": plans.get(key),
                }),
            )]
        }
        What::Memory {
            buffers,
            arena,
            lower_bound,
        } => vec![slice(
            "memory plan".to_string(),
            "plan",
            json!({"buffers": buffers, "arena_bytes": arena, "lower_bound": lower_bound}),
        )],
        What::Drain {
            from,
            tensor,
            flow: id,
        } => vec![
            slice(
                format!("drain stream{from}"),
                "drain",
                json!({"from_stream": from, "tensor": format!("t{tensor}"), "ran_on": thread}),
            ),
            flow("f", *id),
        ],
    }
}

/// The folder of a trace's plan pictures: `trace.json` → `trace.plans`.
fn plans_dir(path: &Path) -> PathBuf {
    path.with_extension("plans")
}

/// Writes a picture of each plan (with an arena) the events ran, up to
/// [`MAX_PLAN_PICTURES`]; returns each picture's path as the trace names it (relative
/// to the trace's folder), by segment key, and how many were written.
fn write_pictures(
    path: &Path,
    events: &[(usize, Event)],
) -> Result<(HashMap<u64, String>, usize), TraceError> {
    let mut chosen: Vec<(u64, &Arc<dyn TracedPlan>)> = Vec::new();
    let mut seen: HashMap<u64, ()> = HashMap::new();
    for (_, e) in events {
        let (key, plan) = match &e.what {
            What::Flush {
                info,
                plan: Some(plan),
                ..
            } => (info.key, plan),
            What::Build { key, plan } => (*key, plan),
            _ => continue,
        };
        if plan.summary().arena_bytes > 0
            && chosen.len() < MAX_PLAN_PICTURES
            && seen.insert(key, ()).is_none()
        {
            chosen.push((key, plan));
        }
    }
    let mut names = HashMap::new();
    if chosen.is_empty() {
        return Ok((names, 0));
    }
    let dir = plans_dir(path);
    std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
    let folder = dir
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_default();
    for (key, plan) in chosen {
        let Some(svg) = plan.picture(key) else {
            continue;
        };
        let file = format!("{key:016x}.svg");
        let p = dir.join(&file);
        std::fs::write(&p, svg).map_err(|e| io_error(&p, e))?;
        names.insert(key, format!("{folder}/{file}"));
    }
    let n = names.len();
    Ok((names, n))
}
