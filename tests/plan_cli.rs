//! The `streamfuse-plan` command line: output format, files, exit codes.

use std::path::PathBuf;
use std::process::Command;

mod emulated;

fn bin() -> Command {
    emulated::command(env!("CARGO_BIN_EXE_streamfuse-plan"))
}

fn temp(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("streamfuse-plan-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const EXAMPLE: &str = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n";

fn last_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .last()
        .unwrap_or("")
        .to_string()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

#[test]
fn plans_writes_offsets_and_summarises() {
    let input = temp("example.csv", EXAMPLE);
    let out = input.with_file_name("example.out.csv");
    let r = bin().arg(&input).arg("--out").arg(&out).output().unwrap();
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let line = last_line(&r.stdout);
    let keys: Vec<&str> = line
        .split(' ')
        .map(|kv| kv.split('=').next().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "buffers",
            "lower_bound",
            "arena",
            "ratio",
            "strategy",
            "millis"
        ]
    );
    assert_eq!(field(&line, "buffers"), "5");
    assert_eq!(field(&line, "lower_bound"), "12");
    assert_eq!(field(&line, "arena"), "12");
    assert_eq!(field(&line, "strategy"), "best");
    assert_eq!(field(&line, "ratio").parse::<f64>().unwrap(), 1.0);
    let written = std::fs::read_to_string(&out).unwrap();
    let rows: Vec<&str> = written.lines().collect();
    assert_eq!(rows[0], "id,lower,upper,size,offset");
    let ids: Vec<&str> = rows[1..]
        .iter()
        .map(|r| r.split(',').next().unwrap())
        .collect();
    assert_eq!(ids, ["b1", "b2", "b3", "b4", "b5"]);
    // The written plan reads back and validates.
    let t = streamfuse::memory_planner::csv::read(&written).unwrap();
    let offsets = t.offsets.clone().unwrap();
    let plan = streamfuse::memory_planner::Placement {
        offsets,
        arena: 12,
        lower_bound: 12,
        strategy: streamfuse::memory_planner::Strategy::Best,
    };
    streamfuse::memory_planner::validate(&t.problem, &plan).unwrap();
}

#[test]
fn every_strategy_and_flag_forms() {
    let input = temp("strategies.csv", EXAMPLE);
    for s in [
        "naive",
        "linear-scan",
        "greedy-size",
        "greedy-breadth",
        "best",
    ] {
        let r = bin()
            .arg(&input)
            .args(["--strategy", s, "--time-limit", "0.5"])
            .output()
            .unwrap();
        assert_eq!(r.status.code(), Some(0));
        assert_eq!(field(&last_line(&r.stdout), "strategy"), s);
    }
    let r = bin()
        .arg(&input)
        .arg("--strategy=greedy-size")
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(0));
}

#[test]
fn capacity_miss_exits_3() {
    let input = temp("cap.csv", EXAMPLE);
    let r = bin()
        .arg(&input)
        .args(["--capacity", "11", "--time-limit", "0.5"])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(3));
    let r = bin()
        .arg(&input)
        .args(["--capacity", "12"])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(0));
}

#[test]
fn bad_input_exits_2_with_the_reason() {
    let input = temp("bad.csv", "id,lower,upper,size\na,0,3,4\nb,5,5,4\n");
    let r = bin().arg(&input).output().unwrap();
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("line 3"), "{err}");
    let r = bin()
        .arg(&input)
        .args(["--strategy", "magic"])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("greedy-breadth"));
    let r = bin().arg("/nonexistent/trace.csv").output().unwrap();
    assert_eq!(r.status.code(), Some(2));
    let r = bin().output().unwrap();
    assert_eq!(r.status.code(), Some(2));
}

#[test]
fn repeated_or_unknown_column_exits_2_naming_it() {
    // Before the fix the first `size` won and the second vanished from --out.
    let input = temp("twice.csv", "id,lower,upper,size,size\na,0,3,4,8\n");
    let out = input.with_file_name("twice.out.csv");
    let r = bin().arg(&input).arg("--out").arg(&out).output().unwrap();
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("line 1") && err.contains("\"size\" twice"),
        "{err}"
    );
    assert!(!out.exists(), "no plan may be written for a bad header");
    let input = temp("unknown.csv", "id,lower,upper,size,colour\na,0,3,4,red\n");
    let r = bin().arg(&input).output().unwrap();
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("unknown column \"colour\""), "{err}");
}

/// Every trace of ../shared/data, release build recommended:
/// `cargo test --release --test plan_cli -- --ignored`.
#[test]
#[ignore]
fn shared_data_traces() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    let mut files = Vec::new();
    for sub in ["minimalloc", "idealloc/iopddl", "idealloc/somas_tensors"] {
        for e in std::fs::read_dir(root.join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "csv") {
                files.push(p);
            }
        }
    }
    files.sort();
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let mut cmd = bin();
        cmd.arg(&f);
        if name.contains(".1048576.") {
            cmd.args(["--capacity", "1048576"]);
        }
        let r = cmd.output().unwrap();
        assert_eq!(
            r.status.code(),
            Some(0),
            "{name}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        println!("{name}: {}", last_line(&r.stdout));
    }
}
