//! Pictures of memory plans: the SVG of every trace in ../shared/data is well-formed
//! XML and shows every buffer once, with its offset and lifetime; `streamfuse-plan
//! --svg` writes one.

mod emulated;
mod xml;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use streamfuse::memory_planner::{self as plan, csv, Options, SvgOptions};

/// Checks the picture `doc` of `trace` planned at `offsets`: well-formed XML, every
/// buffer once in the metadata with its id, lifetime, size and offset, every buffer
/// drawn alone there once as a rectangle whose title says the same, the arena and
/// lower-bound lines and the peak. Returns (drawn alone, aggregate rectangles).
fn check_picture(name: &str, doc: &str, trace: &csv::Trace, offsets: &[u64]) -> (usize, usize) {
    let els = xml::parse(doc).unwrap_or_else(|e| panic!("{name}: not well-formed: {e}"));
    assert_eq!(els[0].name, "svg", "{name}");
    let n = trace.problem.buffers.len();
    let meta = els
        .iter()
        .find(|e| e.name == "metadata" && e.attr("id") == Some("buffers"))
        .unwrap_or_else(|| panic!("{name}: no buffer metadata"));
    let mut lines = meta.text.lines().filter(|l| !l.trim().is_empty());
    assert_eq!(
        lines.next(),
        Some("index,id,lower,upper,size,offset,drawn"),
        "{name}"
    );
    let mut seen = vec![false; n];
    let mut drawn = vec![false; n];
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 7, "{name}: {line}");
        let i: usize = f[0].parse().unwrap();
        assert!(!seen[i], "{name}: buffer {i} listed twice");
        seen[i] = true;
        let b = &trace.problem.buffers[i];
        assert_eq!(f[1], trace.ids[i], "{name}: id of buffer {i}");
        let nums: Vec<u64> = f[2..6].iter().map(|x| x.parse().unwrap()).collect();
        assert_eq!(
            nums,
            [b.lower, b.upper, b.size, offsets[i]],
            "{name}: buffer {i}"
        );
        drawn[i] = f[6] == "1";
    }
    assert!(seen.iter().all(|&s| s), "{name}: a buffer is missing");
    let mut alone = vec![false; n];
    let mut aggregates = 0;
    for (k, e) in els.iter().enumerate() {
        if e.name != "rect" {
            continue;
        }
        if e.attr("class") != Some("b") {
            let in_small = e
                .parent
                .is_some_and(|p| els[p].attr("class") == Some("small"));
            aggregates += usize::from(in_small);
            continue;
        }
        let i: usize = e.attr("data-index").unwrap().parse().unwrap();
        assert!(drawn[i] && !alone[i], "{name}: rectangle of buffer {i}");
        alone[i] = true;
        let b = &trace.problem.buffers[i];
        let title = els
            .iter()
            .find(|t| t.name == "title" && t.parent == Some(k))
            .unwrap_or_else(|| panic!("{name}: buffer {i} has no title"));
        assert_eq!(
            title.text,
            format!(
                "{}: offset {}, {} bytes, steps [{}, {})",
                trace.ids[i], offsets[i], b.size, b.lower, b.upper
            ),
            "{name}"
        );
    }
    assert_eq!(alone, drawn, "{name}: drawn buffers and rectangles");
    for class in ["arena", "lb", "peak"] {
        assert!(
            els.iter()
                .any(|e| e.name == "line" && e.attr("class") == Some(class)),
            "{name}: no {class} line"
        );
    }
    (alone.iter().filter(|&&d| d).count(), aggregates)
}

fn shared_traces() -> Option<Vec<PathBuf>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    let mut files = Vec::new();
    for sub in ["minimalloc", "idealloc/iopddl", "idealloc/somas_tensors"] {
        for e in std::fs::read_dir(root.join(sub)).ok()? {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "csv") {
                files.push(p);
            }
        }
    }
    files.sort();
    Some(files)
}

/// Every trace of ../shared/data (up to 62,185 buffers), planned with the planner's
/// cheap first plan (time limit 0) so the test stays fast, drawn and checked.
#[test]
fn every_shared_trace_draws_every_buffer_once() {
    let Some(files) = shared_traces() else {
        eprintln!("../shared/data not found: skipped");
        return;
    };
    let start = Instant::now();
    let mut most = 0;
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let trace = csv::read_file(&f).unwrap();
        let options = Options {
            time_limit: Duration::ZERO,
            threads: 1,
            ..Options::default()
        };
        let p = plan::solve(&trace.problem, &options).unwrap();
        let svg_options = SvgOptions {
            title: name.clone(),
            names: trace.ids.clone(),
            ..SvgOptions::default()
        };
        let doc = plan::svg(&trace.problem, &p.offsets, &svg_options).unwrap();
        let (alone, aggregates) = check_picture(&name, &doc, &trace, &p.offsets);
        let n = trace.problem.buffers.len();
        println!(
            "{name}: {n} buffers, {alone} drawn alone, {aggregates} aggregate rectangles, {} KiB",
            doc.len() / 1024
        );
        if n > 10_000 {
            assert!(aggregates > 0, "{name}: small buffers are aggregated");
            assert!(doc.len() < 8 << 20, "{name}: {} bytes", doc.len());
        }
        most = most.max(n);
    }
    assert!(most > 60_000, "the largest trace was drawn");
    println!("all traces: {:?}", start.elapsed());
}

#[test]
fn the_cli_writes_the_picture() {
    let dir = std::env::temp_dir().join(format!("streamfuse-svg-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.csv");
    std::fs::write(
        &input,
        "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n",
    )
    .unwrap();
    let out = dir.join("plan.svg");
    let r = emulated::command(env!("CARGO_BIN_EXE_streamfuse-plan"))
        .arg(&input)
        .arg("--svg")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let doc = std::fs::read_to_string(&out).unwrap();
    let trace = csv::read_file(&input).unwrap();
    let els = xml::parse(&doc).unwrap();
    let meta = els.iter().find(|e| e.name == "metadata").unwrap();
    let offsets: Vec<u64> = meta
        .text
        .lines()
        .skip(2)
        .map(|l| l.split(',').nth(5).unwrap().parse().unwrap())
        .collect();
    let (alone, _) = check_picture("in.csv", &doc, &trace, &offsets);
    assert_eq!(alone, 5, "five large buffers, each drawn");
    assert!(doc.contains("arena = lower bound 12 B"));

    // A file that cannot be written is an error naming it.
    let bad = dir.join("no/such/dir/plan.svg");
    let r = emulated::command(env!("CARGO_BIN_EXE_streamfuse-plan"))
        .arg(&input)
        .arg("--svg")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("plan.svg"));
    let r = emulated::command(env!("CARGO_BIN_EXE_streamfuse-plan"))
        .arg(&input)
        .arg("--svg")
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(2), "--svg needs a value");
}
