//! The timeline (`streamfuse::trace`): the Chrome trace file of two threads names the
//! CPU tier in its process labels, has a lane per stream named after its thread,
//! flushes with their reason, key, cache hit, op and kernel counts and arena bytes, the
//! kernels inside them, plan builds and a drain as a flow between the lanes; the trace
//! is written at `stop()` or process exit; the memory plan of a flush can be drawn.

mod emulated;
mod support;
mod xml;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex};

use serde_json::Value;
use streamfuse::trace::{self, TraceError};
use streamfuse::Tensor;
use support::data;

/// One trace records at a time in a process: the tests that record, or that flush and
/// would land in another's trace, take turns.
static RECORDING: Mutex<()> = Mutex::new(());

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("streamfuse-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The multithread example's MLP, smaller, with dims no other test uses (so the first
/// pass builds its plan).
const LAYERS: [usize; 4] = [40, 72, 72, 24];
const BATCH: usize = 6;

fn forward(x: &Tensor, weights: &[(Tensor, Tensor)]) -> streamfuse::Result<Tensor> {
    let mut h = x.clone();
    for (i, (w, b)) in weights.iter().enumerate() {
        h = h.matmul(w)?.add(b)?;
        if i + 1 < weights.len() {
            h = h.gelu()?;
        }
    }
    h.softmax(-1)
}

fn load(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).expect("the trace is JSON");
    v["traceEvents"].as_array().expect("traceEvents").clone()
}

fn arg<'a>(e: &'a Value, name: &str) -> &'a Value {
    &e["args"][name]
}

/// Every lane's slices nest (a slice ends before the next one starts, or contains it),
/// as Perfetto and chrome://tracing need.
fn assert_nested(events: &[Value]) {
    let mut by_lane: HashMap<u64, Vec<(i64, i64)>> = HashMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let ts = (e["ts"].as_f64().unwrap() * 1000.0).round() as i64;
        let dur = (e["dur"].as_f64().unwrap() * 1000.0).round() as i64;
        by_lane
            .entry(e["tid"].as_u64().unwrap())
            .or_default()
            .push((ts, ts + dur));
    }
    for (lane, mut slices) in by_lane {
        slices.sort_by_key(|&(s, e)| (s, -e));
        let mut open: Vec<i64> = Vec::new();
        for (s, e) in slices {
            while open.last().is_some_and(|&end| end <= s) {
                open.pop();
            }
            if let Some(&end) = open.last() {
                assert!(
                    e <= end,
                    "lane {lane}: [{s}, {e}] overlaps a slice ending at {end}"
                );
            }
            open.push(e);
        }
    }
}

#[test]
fn two_threads_have_two_lanes_with_flushes_kernels_builds_and_a_drain() {
    let _turn = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("two");
    let path = dir.join("two.json");
    trace::start(&path).unwrap();
    assert!(trace::is_recording());
    assert!(matches!(
        trace::start(&path),
        Err(TraceError::AlreadyRecording { .. })
    ));
    let weights: Vec<(Tensor, Tensor)> = LAYERS
        .windows(2)
        .enumerate()
        .map(|(i, io)| {
            (
                Tensor::from_vec(data(io[0] * io[1], i as u64 + 1), &[io[0], io[1]]).unwrap(),
                Tensor::from_vec(data(io[1], i as u64 + 50), &[io[1]]).unwrap(),
            )
        })
        .collect();
    let (send, receive) = mpsc::channel::<Tensor>();
    let (done, wait_done) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let weights = &weights;
        let worker = |t: usize| {
            move || {
                streamfuse::set_kernel_threads(1);
                let x = Tensor::from_vec(data(BATCH * LAYERS[0], 100 + t as u64), &[BATCH, 40])
                    .unwrap();
                for _ in 0..3 {
                    forward(&x, weights).unwrap().to_vec::<f32>().unwrap();
                }
            }
        };
        let w0 = worker(0);
        std::thread::Builder::new()
            .name("worker-0".into())
            .spawn_scoped(s, move || {
                w0();
                // A tensor left pending here, needed by worker-1: it drains this stream.
                let x = Tensor::from_vec(data(33, 7), &[3, 11]).unwrap();
                send.send(x.exp().unwrap().affine(2.0, 1.0).unwrap())
                    .unwrap();
                wait_done.recv().unwrap();
            })
            .unwrap();
        let w1 = worker(1);
        std::thread::Builder::new()
            .name("worker-1".into())
            .spawn_scoped(s, move || {
                w1();
                let y = receive.recv().unwrap();
                let z = y.add(&y).unwrap();
                assert_eq!(z.to_vec::<f32>().unwrap().len(), 33);
                done.send(()).unwrap();
            })
            .unwrap();
    });
    let written = trace::stop().unwrap();
    assert!(!trace::is_recording());
    assert_eq!(trace::stop(), Err(TraceError::NotRecording));
    assert_eq!(written.path, path);

    let events = load(&path);
    assert_nested(&events);
    let slices: Vec<&Value> = events.iter().filter(|e| e["ph"] != "M").collect();
    assert_eq!(slices.len(), written.events);
    // The process's labels name the CPU tier the kernels ran on, and the CPU's tiers.
    let labels: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_labels")
        .collect();
    assert_eq!(labels.len(), 1, "one process_labels event");
    let tier = streamfuse::cpu::tier().name();
    let has: Vec<&str> = streamfuse::cpu::available()
        .iter()
        .map(|t| t.name())
        .collect();
    assert_eq!(arg(labels[0], "cpu_tier"), tier);
    assert_eq!(arg(labels[0], "cpu_tiers"), &serde_json::json!(has));
    assert_eq!(
        arg(labels[0], "labels"),
        &format!("cpu tier: {tier} (this CPU has: {})", has.join(", "))
    );
    // Lanes: tid -> name.
    let lanes: HashMap<u64, String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                arg(e, "name").as_str().unwrap().to_string(),
            )
        })
        .collect();
    let lane = |thread: &str| -> u64 {
        let found: Vec<u64> = lanes
            .iter()
            .filter(|(_, n)| n.starts_with(&format!("{thread} (stream")))
            .map(|(&t, _)| t)
            .collect();
        assert_eq!(found.len(), 1, "one lane for {thread}: {lanes:?}");
        found[0]
    };
    let (l0, l1) = (lane("worker-0"), lane("worker-1"));
    let of = |cat: &str, tid: u64| -> Vec<&Value> {
        slices
            .iter()
            .copied()
            .filter(|e| e["cat"] == cat && e["ph"] == "X" && e["tid"].as_u64() == Some(tid))
            .collect()
    };
    for l in [l0, l1] {
        let flushes = of("flush", l);
        assert!(flushes.len() >= 3, "{} flushes on lane {l}", flushes.len());
        for f in &flushes {
            assert!(f["name"].as_str().unwrap().starts_with("flush: "));
            assert!(arg(f, "reason").is_string());
            assert_eq!(arg(f, "key").as_str().unwrap().len(), 16, "{f}");
            assert!(arg(f, "cache_hit").is_boolean());
            for n in ["ops", "kernels", "arena_bytes", "arena_lower_bound"] {
                assert!(arg(f, n).is_u64(), "{n} of {f}");
            }
        }
        let hits: Vec<bool> = flushes
            .iter()
            .map(|f| arg(f, "cache_hit").as_bool().unwrap())
            .collect();
        assert!(
            hits.contains(&true),
            "the second pass hits the cache: {hits:?}"
        );
        let kernels = of("kernel", l);
        assert!(kernels.len() >= 3, "kernels on lane {l}");
        for k in &kernels {
            let kind = arg(k, "kind").as_str().unwrap();
            assert!(["op", "fused", "chain"].contains(&kind), "{k}");
            assert!(!arg(k, "ops").as_array().unwrap().is_empty(), "{k}");
            assert!(arg(k, "bytes_read").as_u64().unwrap() > 0, "{k}");
            assert!(arg(k, "bytes_written").as_u64().unwrap() > 0, "{k}");
            assert_eq!(arg(k, "stream").as_u64(), Some(l));
            // Inside one of its lane's flushes.
            let (ts, end) = (
                k["ts"].as_f64().unwrap(),
                k["ts"].as_f64().unwrap() + k["dur"].as_f64().unwrap(),
            );
            assert!(
                flushes.iter().any(|f| {
                    let fs = f["ts"].as_f64().unwrap();
                    fs <= ts && end <= fs + f["dur"].as_f64().unwrap() + 1e-3
                }),
                "kernel {k} is inside a flush"
            );
        }
        assert!(
            kernels.iter().any(|k| {
                let ops: Vec<&str> = arg(k, "ops")
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_str().unwrap())
                    .collect();
                arg(k, "kind") == "chain" && ops.starts_with(&["matmul", "add", "gelu"])
            }),
            "matmul, bias and GELU are one chain"
        );
    }
    // The first pass of one of the threads built the plans.
    let builds: Vec<&&Value> = slices
        .iter()
        .filter(|e| e["name"] == "plan build")
        .collect();
    assert!(!builds.is_empty());
    assert!(builds
        .iter()
        .any(|b| arg(b, "kernels").as_u64().unwrap() > 0));
    for b in &builds {
        assert!(
            [l0, l1].contains(&b["tid"].as_u64().unwrap()),
            "built on a stream's lane"
        );
    }
    assert!(slices.iter().any(|e| e["name"] == "memory plan"));
    // The drain: worker-1 drained worker-0, with an arrow from the flush to the drain.
    let drained: Vec<&Value> = of("flush", l0)
        .into_iter()
        .filter(|f| arg(f, "reason").as_str().unwrap().starts_with("drained by"))
        .collect();
    assert_eq!(drained.len(), 1, "worker-0 was drained once");
    assert_eq!(arg(drained[0], "ran_on"), "worker-1");
    let drains = of("drain", l1);
    assert_eq!(drains.len(), 1);
    assert_eq!(arg(drains[0], "from_stream").as_u64(), Some(l0));
    let flow = |ph: &str| -> &Value {
        let f: Vec<&&Value> = slices.iter().filter(|e| e["ph"] == ph).collect();
        assert_eq!(f.len(), 1, "one flow {ph}");
        f[0]
    };
    let (s, f) = (flow("s"), flow("f"));
    assert_eq!(s["id"], f["id"]);
    assert_eq!((s["tid"].as_u64(), f["tid"].as_u64()), (Some(l0), Some(l1)));
    assert_eq!(f["bp"], "e");
    let within = |e: &Value, slice: &Value| {
        let t = e["ts"].as_f64().unwrap();
        let st = slice["ts"].as_f64().unwrap();
        st <= t && t <= st + slice["dur"].as_f64().unwrap()
    };
    assert!(within(s, drained[0]) && within(f, drains[0]));
    // Flushes with an arena name the picture of their plan, written beside the trace.
    let with_picture: Vec<&&Value> = slices
        .iter()
        .filter(|e| e["cat"] == "flush" && arg(e, "plan_svg").is_string())
        .collect();
    assert!(!with_picture.is_empty());
    assert!(written.plan_pictures > 0);
    let svg = dir.join(arg(with_picture[0], "plan_svg").as_str().unwrap());
    let doc = std::fs::read_to_string(&svg).unwrap();
    xml::parse(&doc).unwrap();
    assert!(doc.contains(arg(with_picture[0], "key").as_str().unwrap()));
}

#[test]
fn kernels_of_one_level_run_at_once_on_lanes_of_their_threads() {
    let _turn = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let path = temp_dir("parallel").join("parallel.json");
    streamfuse::set_kernel_threads(2);
    let a = Tensor::from_vec(data(192 * 192, 4), &[192, 192]).unwrap();
    let b = Tensor::from_vec(data(192 * 192, 5), &[192, 192]).unwrap();
    trace::start(&path).unwrap();
    // Two products that read only inputs: one level, two kernels.
    let (x, y) = (a.matmul(&b).unwrap(), b.matmul(&a).unwrap());
    streamfuse::sync().unwrap();
    trace::stop().unwrap();
    streamfuse::set_kernel_threads(0);
    drop((x, y));
    let events = load(&path);
    assert_nested(&events);
    let kernels: Vec<&Value> = events.iter().filter(|e| e["cat"] == "kernel").collect();
    assert_eq!(kernels.len(), 2, "{kernels:?}");
    let flush = events.iter().find(|e| e["cat"] == "flush").unwrap();
    let lanes: Vec<u64> = kernels.iter().map(|k| k["tid"].as_u64().unwrap()).collect();
    assert!(
        lanes.iter().all(|&l| l != flush["tid"].as_u64().unwrap()),
        "kernels run at once are on their threads' lanes: {lanes:?}"
    );
    // (Both may be on one lane: `rayon::join` runs both halves on one thread when no
    // other thread takes one; they then follow each other, and still nest.)
    for k in kernels {
        assert_eq!(arg(k, "stream"), &flush["tid"], "{k}");
    }
}

#[test]
fn with_fusion_off_each_op_is_a_kernel_slice() {
    let _turn = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let path = temp_dir("unfused").join("unfused.json");
    streamfuse::set_fusion(false);
    let x = Tensor::from_vec(data(24, 6), &[4, 6]).unwrap();
    trace::start(&path).unwrap();
    let y = x.exp().unwrap().add(&x).unwrap().sum(-1).unwrap();
    y.to_vec::<f32>().unwrap();
    trace::stop().unwrap();
    streamfuse::set_fusion(true);
    let events = load(&path);
    assert_nested(&events);
    let flush = events.iter().find(|e| e["cat"] == "flush").unwrap();
    assert_eq!(arg(flush, "planned"), false);
    let ops: Vec<&str> = events
        .iter()
        .filter(|e| e["cat"] == "kernel")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["exp", "add", "sum"]);
    let sum = events.iter().find(|e| e["name"] == "sum").unwrap();
    assert_eq!(
        (
            arg(sum, "bytes_read").as_u64(),
            arg(sum, "bytes_written").as_u64()
        ),
        (Some(96), Some(16))
    );
}

#[test]
fn bad_paths_and_calls_out_of_turn_are_errors() {
    let _turn = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let bad = temp_dir("bad").join("no/such/folder/t.json");
    match trace::start(&bad) {
        Err(e @ TraceError::Io { .. }) => assert!(e.to_string().contains("t.json"), "{e}"),
        other => panic!("expected an I/O error, got {other:?}"),
    }
    assert!(!trace::is_recording());
    assert_eq!(trace::stop(), Err(TraceError::NotRecording));
}

#[test]
fn a_flush_draws_its_memory_plan() {
    // (Its flushes would land in another test's trace.)
    let _turn = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    // q·kᵀ → softmax → ·v with dims no other test uses: the probabilities live in the
    // arena.
    streamfuse::set_kernel_threads(1);
    let q = Tensor::from_vec(data(2 * 13 * 8, 1), &[2, 13, 8]).unwrap();
    let k = Tensor::from_vec(data(2 * 8 * 13, 2), &[2, 8, 13]).unwrap();
    let v = Tensor::from_vec(data(2 * 13 * 8, 3), &[2, 13, 8]).unwrap();
    let out = q
        .matmul(&k)
        .unwrap()
        .softmax(-1)
        .unwrap()
        .matmul(&v)
        .unwrap()
        .gelu()
        .unwrap()
        .matmul(&k)
        .unwrap();
    out.to_vec::<f32>().unwrap();
    let info = streamfuse::last_flush().unwrap();
    assert!(info.arena_bytes > 0, "{info:?}");
    let doc = info.plan_svg().expect("the plan is cached");
    let els = xml::parse(&doc).unwrap();
    let meta = els.iter().find(|e| e.name == "metadata").unwrap();
    let rows = meta
        .text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()));
    let mut end = 0;
    for row in rows {
        let f: Vec<&str> = row.split(',').collect();
        assert!(f[1].starts_with('r'), "named by relative value: {row}");
        let (size, offset): (usize, usize) = (f[4].parse().unwrap(), f[5].parse().unwrap());
        end = end.max(size + offset);
    }
    assert_eq!(
        end, info.arena_bytes,
        "the picture's buffers fill the arena"
    );
    assert!(doc.contains(&format!("{:016x}", info.key)));
    assert_eq!(streamfuse::plan_svg(info.key ^ 0x5eed), None);
}

/// Runs only as the child process of the next test (with `STREAMFUSE_TRACE` set): records
/// a little and exits without `stop()`.
#[test]
#[ignore]
fn child_records_until_exit() {
    if std::env::var_os(trace::ENV).is_none() {
        return;
    }
    let x = Tensor::from_vec(data(64, 9), &[8, 8]).unwrap();
    x.matmul(&x)
        .unwrap()
        .relu()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    std::process::exit(0);
}

#[test]
fn the_trace_is_written_when_the_process_exits() {
    let path = temp_dir("exit").join("exit.json");
    let _ = std::fs::remove_file(&path);
    let status = emulated::command(std::env::current_exe().unwrap())
        .args([
            "child_records_until_exit",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env(trace::ENV, &path)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let events = load(&path);
    assert!(events.iter().any(|e| e["cat"] == "flush"), "{events:?}");
    assert!(events.iter().any(|e| e["cat"] == "kernel"));
}
