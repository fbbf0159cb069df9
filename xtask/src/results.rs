//! Saved benchmark results: `bench/results/<date>-<host>-<device>.json`.
//!
//! One file holds one run on one machine and one device kind (`cpu` or `cuda`):
//!
//! ```text
//! {
//!   "schema": "ember-bench-results/1",
//!   "kind": "ember" | "side-by-side",
//!   "date": "2026-11-25", "time": "17:00:09", "host": "...", "device": "cpu" | "cuda",
//!   "command": "cargo xtask bench --save --device cpu",
//!   "machine": { "cpu_model", "cpu_flags", "cores", "gpu", "gpu_driver", "notes" },
//!   "ember": { "version", "commit", "dirty" },
//!   "torch": { "version" },                       (side-by-side only)
//!   "imported_from": { "path", "commit", "section" },   (results copied from older docs)
//!   "records": [ ... ]
//! }
//! ```
//!
//! `kind: "ember"` records are `ember-bench --json`'s (`name`, `device`, `threads`, `value`,
//! `unit`, extras); `kind: "side-by-side"` records are `bench/torch_side_by_side.py`'s rows
//! (`name`, `unit`, `threads`, `ember`, `torch`, `ratio`, `ratio_min`, `ratio_max`, `rounds`,
//! `backend`). `cargo xtask bench --save` and `torch_side_by_side.py --save` write them;
//! `cargo xtask bench-report` renders the latest file of each machine into
//! `docs/performance.md`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::root;

/// The `schema` field of every saved file.
pub const SCHEMA: &str = "ember-bench-results/1";

/// Where saved results live.
pub fn results_dir() -> PathBuf {
    root().join("bench").join("results")
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Today's date in UTC, `YYYY-MM-DD`.
pub fn today() -> String {
    let (y, m, d) = civil_from_days((unix_now() / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The time of day in UTC, `HH:MM:SS` (orders two runs of one day).
pub fn now_time() -> String {
    let s = unix_now() % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `name` reduced to what a file name takes: lowercase letters, digits and `-`.
pub fn slug(name: &str) -> String {
    let s: String = name
        .trim()
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let parts: Vec<&str> = s.split('-').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        "unknown".into()
    } else {
        parts.join("-")
    }
}

/// This machine's name (the kernel's hostname).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| {
            Command::new("hostname")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        })
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The CPU flags worth keeping in a machine's description: the vector and matrix extensions
/// the kernels choose between.
fn interesting_flag(flag: &str) -> bool {
    flag.starts_with("avx")
        || flag.starts_with("amx")
        || matches!(flag, "fma" | "f16c" | "sse4_2" | "bmi2")
}

/// The CPU's model name and its interesting flags, from `/proc/cpuinfo` where there is one.
fn cpu_description() -> (Option<String>, Vec<String>) {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return (None, Vec::new());
    };
    let field = |key: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let mut flags: Vec<String> = field("flags")
        .unwrap_or_default()
        .split_whitespace()
        .filter(|f| interesting_flag(f))
        .map(String::from)
        .collect();
    flags.sort();
    flags.dedup();
    (field("model name"), flags)
}

/// The first GPU's name and driver version, as `nvidia-smi` reports them.
fn gpu_description() -> (Option<String>, Option<String>) {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=name,driver_version", "--format=csv,noheader"])
        .output();
    let Ok(out) = out else {
        return (None, None);
    };
    if !out.status.success() {
        return (None, None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(line) = text.lines().next() else {
        return (None, None);
    };
    let mut parts = line.split(',').map(|s| s.trim().to_string());
    (parts.next(), parts.next())
}

/// The machine's description: CPU model and flags, logical cores, GPU, free-form notes.
pub fn machine(notes: Option<&str>) -> Value {
    let (cpu_model, cpu_flags) = cpu_description();
    let (gpu, gpu_driver) = gpu_description();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    json!({
        "cpu_model": cpu_model,
        "cpu_flags": cpu_flags,
        "cores": cores,
        "gpu": gpu,
        "gpu_driver": gpu_driver,
        "notes": notes,
    })
}

/// Ember's version and the checkout's commit (with `dirty` when tracked files differ from it).
pub fn ember_version() -> Value {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = commit
        .as_ref()
        .and_then(|_| git(&["status", "--porcelain", "--untracked-files=no"]))
        .map(|s| !s.is_empty());
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "commit": commit,
        "dirty": dirty,
    })
}

/// `bench/results/<date>-<host>-<device>.json`, with `-2`, `-3`, ... when that name is taken.
pub fn file_name(dir: &Path, date: &str, host: &str, device: &str) -> PathBuf {
    let base = format!("{date}-{}-{device}", slug(host));
    let mut path = dir.join(format!("{base}.json"));
    let mut n = 2;
    while path.exists() {
        path = dir.join(format!("{base}-{n}.json"));
        n += 1;
    }
    path
}

/// Writes `doc` (pretty-printed, with a final newline) to a fresh file in `bench/results/`
/// and returns its path.
pub fn save(doc: &Value) -> Result<PathBuf, String> {
    let dir = results_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let field = |k: &str| doc[k].as_str().unwrap_or("unknown").to_string();
    let path = file_name(&dir, &field("date"), &field("host"), &field("device"));
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    std::fs::write(&path, format!("{text}\n")).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Reads every saved file, with its path; a file that is not valid JSON of this schema is an
/// error naming it.
pub fn load_all() -> Result<Vec<(PathBuf, Value)>, String> {
    let dir = results_dir();
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(out);
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", p.display()))?;
        if v["schema"] != SCHEMA {
            return Err(format!(
                "{}: schema {} (expected {SCHEMA:?})",
                p.display(),
                v["schema"]
            ));
        }
        for key in ["date", "host", "device", "kind", "command"] {
            if !v[key].is_string() {
                return Err(format!("{}: no string field {key:?}", p.display()));
            }
        }
        if !v["records"].is_array() {
            return Err(format!("{}: no \"records\" array", p.display()));
        }
        out.push((p, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_from_day_counts() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
        assert_eq!(civil_from_days(20_782), (2026, 11, 25));
    }

    #[test]
    fn slugs_and_names() {
        assert_eq!(slug("Epyc Zen4 (2 vCPU)"), "epyc-zen4-2-vcpu");
        assert_eq!(slug("  "), "unknown");
        assert!(interesting_flag("avx512_bf16") && interesting_flag("amx_tile"));
        assert!(!interesting_flag("sse2"));
    }
}
