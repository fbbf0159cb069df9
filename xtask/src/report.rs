//! `cargo xtask bench-report [--check]`: renders `docs/performance.md` from the latest saved
//! result file of each machine and device in `bench/results/` (see `results.rs`).
//!
//! A machine is a saved file's `host` and `device`; its latest file of each `kind` (Ember
//! alone, or side by side with PyTorch) is the one with the latest `date` and `time` (then
//! the highest `-N` suffix of the file name). Its latest run is that file and the files of
//! the same date that measured cases the newer ones did not (several invocations with
//! different filters). Each file of it becomes a section: the machine, the
//! command that produced the numbers, a table of values (and ratios to PyTorch for
//! side-by-side runs), and links to the machine's earlier files.
//! `--check` renders to memory and fails if the page on disk differs (`cargo xtask test`
//! runs it, so the page never drifts from the saved files).
//!
//! Test-suite outcomes are rendered only from the records `gpu-session` generates (`kind:
//! "suites"`, checked by `suites::validate`); a file whose `tables` report suite results by
//! hand is refused, unless the table says it is `"unverified"` (why, in words), and it is
//! then rendered under that warning (Note [Suite results are generated] in `suites.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{results, root, suites};

/// The page this task writes.
pub fn page_path() -> PathBuf {
    root().join("docs").join("performance.md")
}

pub fn run(args: &[String]) -> Result<(), String> {
    let check = match args {
        [] => false,
        [a] if a == "--check" => true,
        _ => return Err(format!("`bench-report` takes only --check, found {args:?}")),
    };
    let files = results::load_all()?;
    check_suite_results(&files)?;
    let page = render(&files);
    let path = page_path();
    if check {
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        if on_disk != page {
            return Err(format!(
                "{} is not what bench/results/ renders to: run `cargo xtask bench-report`",
                path.display()
            ));
        }
        eprintln!("==> {} matches bench/results/", path.display());
        return Ok(());
    }
    std::fs::write(&path, &page).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!(
        "==> wrote {} from {} saved files",
        path.display(),
        files.len()
    );
    Ok(())
}

/// Refuses suite results that were not generated (Note [Suite results are generated]): a
/// `kind: "suites"` file must pass `suites::validate`, and a table in `tables` that reports
/// tests passing or failing must say it is `"unverified"`.
pub fn check_suite_results(files: &[(PathBuf, Value)]) -> Result<(), String> {
    for (p, v) in files {
        if text(v, "kind") == "suites" {
            suites::validate(v).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        for t in v["tables"].as_array().into_iter().flatten() {
            let unverified = t["unverified"]
                .as_str()
                .is_some_and(|w| !w.trim().is_empty());
            if suites::is_suite_table(t) && !unverified {
                return Err(format!(
                    "{}: the table {:?} reports test-suite results by hand; suite results come \
                     from `gpu-session`'s generated record (a `kind: \"suites\"` file, every \
                     test's outcome counted). Drop the table, or mark it \"unverified\" with \
                     why, and it is rendered as such",
                    p.display(),
                    text(t, "title")
                ));
            }
        }
    }
    Ok(())
}

/// A number as the page shows it: four significant digits, trailing zeros dropped.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    let decimals = if a >= 1000.0 || a == 0.0 {
        0
    } else {
        (3 - a.log10().floor() as i32).clamp(0, 6) as usize
    };
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn opt_num(v: &Value) -> String {
    v.as_f64().map_or_else(|| "–".to_string(), num)
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// The `N` of a file named `...-N.json` (a second run of the same day), else 1.
fn suffix(p: &Path) -> u64 {
    p.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.rsplit_once('-'))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1)
}

/// What orders a machine's files: date, time, then the file name's suffix.
fn order<'a>(p: &Path, v: &'a Value) -> (&'a str, &'a str, u64) {
    (text(v, "date"), text(v, "time"), suffix(p))
}

/// One machine's files of one kind: the files holding its newest result of some case, and
/// the earlier files (latest first).
struct Machine<'a> {
    /// The latest file, then each older file that measured a case no newer file did (a
    /// session's run is often several invocations with different `--filter`s, and a later
    /// session may measure only some cases again); newest first.
    latest: Vec<Run<'a>>,
    earlier: Vec<&'a Path>,
}

/// A machine and a kind of run: (device, host, kind).
type MachineKey = (String, String, String);

/// One saved file: its path and contents.
type Run<'a> = (&'a Path, &'a Value);

/// The names of a file's records.
fn case_names(v: &Value) -> Vec<&str> {
    v["records"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|r| text(r, "name"))
        .collect()
}

/// The files per (device, host, kind), CPU machines first, then by host.
fn machines(files: &[(PathBuf, Value)]) -> Vec<Machine<'_>> {
    let mut by_machine: BTreeMap<MachineKey, Vec<Run<'_>>> = BTreeMap::new();
    for (p, v) in files {
        let key = (
            text(v, "device").to_string(),
            text(v, "host").to_string(),
            text(v, "kind").to_string(),
        );
        by_machine.entry(key).or_default().push((p.as_path(), v));
    }
    by_machine
        .into_values()
        .filter_map(|mut runs| {
            runs.sort_by(|a, b| order(b.0, b.1).cmp(&order(a.0, a.1)));
            runs.first()?;
            let mut seen: Vec<&str> = Vec::new();
            let (mut latest, mut earlier) = (Vec::new(), Vec::new());
            for run in runs {
                let names = case_names(run.1);
                let new = names.iter().any(|n| !seen.contains(n));
                if latest.is_empty() || new {
                    seen.extend(names);
                    latest.push(run);
                } else {
                    earlier.push(run.0);
                }
            }
            Some(Machine { latest, earlier })
        })
        .collect()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn machine_line(v: &Value) -> String {
    let m = &v["machine"];
    let mut parts = Vec::new();
    if let Some(gpu) = m["gpu"].as_str() {
        let driver = m["gpu_driver"]
            .as_str()
            .map(|d| format!(" (driver {d})"))
            .unwrap_or_default();
        parts.push(format!("{gpu}{driver}"));
    }
    let cpu = m["cpu_model"].as_str().unwrap_or("CPU model unknown");
    match m["cores"].as_u64() {
        Some(c) if c > 0 => parts.push(format!("{cpu}, {c} logical cores")),
        _ => parts.push(cpu.to_string()),
    }
    if let Some(flags) = m["cpu_flags"].as_array()
        && !flags.is_empty()
    {
        let f: Vec<&str> = flags.iter().filter_map(Value::as_str).collect();
        parts.push(format!("flags {}", f.join(" ")));
    }
    parts.join("; ")
}

fn versions_line(v: &Value) -> String {
    let e = &v["ember"];
    let mut s = format!("Ember {}", e["version"].as_str().unwrap_or("?"));
    if let Some(c) = e["commit"].as_str() {
        let short: String = c.chars().take(10).collect();
        let dirty = if e["dirty"] == true {
            " with local changes"
        } else {
            ""
        };
        let _ = write!(s, " at `{short}`{dirty}");
    }
    if let Some(t) = v["torch"]["version"].as_str() {
        let _ = write!(s, "; PyTorch {t}");
    }
    s
}

fn side_by_side_table(out: &mut String, records: &[Value]) {
    out.push_str("| case | unit | Ember | PyTorch | ratio | range | backend | note |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for r in records {
        let span = match (r["ratio_min"].as_f64(), r["ratio_max"].as_f64()) {
            (Some(a), Some(b)) if a != b => format!("{}–{}", num(a), num(b)),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |",
            text(r, "name"),
            text(r, "unit"),
            opt_num(&r["ember"]),
            opt_num(&r["torch"]),
            r["ratio"]
                .as_f64()
                .map_or_else(|| "–".to_string(), |x| format!("**{}**", num(x))),
            span,
            text(r, "backend"),
            text(r, "note"),
        );
    }
}

/// Extras worth a column in an Ember-only table, in this order.
const EXTRAS: [&str; 5] = [
    "backend",
    "speedup_vs_system",
    "fraction_of_h100_bound",
    "peak_memory_bytes",
    "note",
];

fn ember_table(out: &mut String, records: &[Value]) {
    out.push_str("| case | device | threads | value | unit | details |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for r in records {
        let details: Vec<String> = EXTRAS
            .iter()
            .filter_map(|k| {
                let v = &r[*k];
                match v {
                    Value::String(s) => Some(format!("{k}: {s}")),
                    Value::Number(n) => n.as_f64().map(|x| format!("{k}: {}", num(x))),
                    _ => None,
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} |",
            text(r, "name"),
            text(r, "device"),
            r["threads"]
                .as_u64()
                .map_or(String::new(), |t| t.to_string()),
            opt_num(&r["value"]),
            text(r, "unit"),
            details.join("; ")
        );
    }
}

/// Optional extra tables of a file: `{"title", "columns": [...], "rows": [[...]]}`.
fn extra_tables(out: &mut String, v: &Value) {
    let Some(tables) = v["tables"].as_array() else {
        return;
    };
    for t in tables {
        let Some(cols) = t["columns"].as_array() else {
            continue;
        };
        if let Some(why) = t["unverified"].as_str() {
            let _ = writeln!(
                out,
                "**Written by hand, not generated; unverified:** {why}\n"
            );
        }
        let _ = writeln!(out, "{}\n", text(t, "title"));
        let cells = |row: &[Value]| -> String {
            row.iter()
                .map(|c| match c {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), num),
                    Value::Null => "–".into(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let _ = writeln!(out, "| {} |", cells(cols));
        let _ = writeln!(out, "|{}", " --- |".repeat(cols.len()));
        for row in t["rows"].as_array().into_iter().flatten() {
            if let Some(row) = row.as_array() {
                let _ = writeln!(out, "| {} |", cells(row));
            }
        }
        out.push('\n');
    }
}

/// The whole page.
pub fn render(files: &[(PathBuf, Value)]) -> String {
    let mut out = String::new();
    out.push_str(
        "# Performance\n\n\
         <!-- Generated by `cargo xtask bench-report` from bench/results/*.json: do not edit by hand. -->\n\n\
         Ember's benchmarks, as saved in [`bench/results/`](../bench/results/): the newest result of \
         each case on each machine, CPU and GPU (the newest file, and each older file holding a case no newer file measured). Side-by-side runs time each case in Ember and then in \
         PyTorch on the same machine, round after round, and report the median of the \
         per-round ratios: **above 1 means Ember is ahead** (rates Ember/PyTorch, times \
         PyTorch/Ember). How to measure, what each case is, and the file format: \
         [benchmarks.md](benchmarks.md).\n\n",
    );
    let chosen = machines(files);
    if chosen.is_empty() {
        out.push_str("No saved results yet: run `cargo xtask bench --save`.\n");
        return out;
    }
    out.push_str("| machine | device | date | kind | file |\n| --- | --- | --- | --- | --- |\n");
    for (p, v) in chosen.iter().flat_map(|m| &m.latest) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | [{}](../bench/results/{}) |",
            text(v, "host"),
            text(v, "device"),
            text(v, "date"),
            text(v, "kind"),
            file_name(p),
            file_name(p)
        );
    }
    out.push('\n');
    for device in ["cpu", "cuda"] {
        let here: Vec<&Machine<'_>> = chosen
            .iter()
            .filter(|m| {
                m.latest
                    .first()
                    .is_some_and(|r| text(r.1, "device") == device)
            })
            .collect();
        if here.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "## {}\n",
            if device == "cpu" { "CPU" } else { "GPU (CUDA)" }
        );
        for (m, &(p, v)) in here
            .iter()
            .flat_map(|m| m.latest.iter().map(move |r| (m, r)))
        {
            let first = m.latest.first().is_some_and(|r| r.0 == p);
            let _ = writeln!(
                out,
                "### {} — {} ({})\n",
                text(v, "host"),
                text(v, "date"),
                text(v, "kind")
            );
            let _ = writeln!(out, "- Machine: {}", machine_line(v));
            if let Some(n) = v["machine"]["notes"].as_str() {
                let _ = writeln!(out, "- Notes: {n}");
            }
            let _ = writeln!(out, "- Versions: {}", versions_line(v));
            let _ = writeln!(out, "- Command: `{}`", text(v, "command"));
            if let Some(src) = v["imported_from"].as_object() {
                let commit: String = src
                    .get("commit")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .chars()
                    .take(10)
                    .collect();
                let _ = writeln!(
                    out,
                    "- Imported from `{}` at `{commit}` ({})",
                    src.get("path").and_then(Value::as_str).unwrap_or("?"),
                    src.get("section").and_then(Value::as_str).unwrap_or("")
                );
            }
            let _ = writeln!(out, "- File: [`{0}`](../bench/results/{0})", file_name(p));
            if first && !m.earlier.is_empty() {
                let links: Vec<String> = m
                    .earlier
                    .iter()
                    .map(|q| format!("[`{0}`](../bench/results/{0})", file_name(q)))
                    .collect();
                let _ = writeln!(out, "- Earlier runs: {}", links.join(", "));
            }
            out.push('\n');
            let records = v["records"].as_array().map_or(&[][..], Vec::as_slice);
            match text(v, "kind") {
                "side-by-side" => side_by_side_table(&mut out, records),
                "suites" => suites::render(&mut out, records),
                _ => ember_table(&mut out, records),
            }
            out.push('\n');
            extra_tables(&mut out, v);
        }
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_keep_four_significant_digits() {
        assert_eq!(num(16.5), "16.5");
        assert_eq!(num(15.94), "15.94");
        assert_eq!(num(0.09), "0.09");
        assert_eq!(num(1919.0), "1919");
        assert_eq!(num(11163.4), "11163");
        assert_eq!(num(2.0), "2");
        assert_eq!(num(0.123456), "0.1235");
        assert_eq!(num(0.0), "0");
    }

    #[test]
    fn the_latest_file_of_each_machine_is_rendered() {
        let doc = |date: &str, host: &str, value: f64| {
            json!({
                "schema": results::SCHEMA, "kind": "ember", "date": date, "host": host,
                "device": "cpu", "command": "cargo xtask bench --save",
                "machine": {"cpu_model": "Test CPU", "cores": 2, "cpu_flags": ["avx2"]},
                "ember": {"version": "0.1.0", "commit": "0123456789abcdef"},
                "records": [{"name": "sum_f32_16m", "device": "cpu", "threads": 2,
                             "value": value, "unit": "GB/s"}]
            })
        };
        let files = vec![
            (
                PathBuf::from("a/2026-01-01-m1-cpu.json"),
                doc("2026-01-01", "m1", 1.0),
            ),
            (
                PathBuf::from("a/2026-02-01-m1-cpu.json"),
                doc("2026-02-01", "m1", 2.0),
            ),
            (
                PathBuf::from("a/2026-01-15-m2-cpu.json"),
                doc("2026-01-15", "m2", 3.0),
            ),
        ];
        let page = render(&files);
        assert!(
            page.contains("| `sum_f32_16m` | cpu | 2 | 2 | GB/s |"),
            "{page}"
        );
        assert!(
            page.contains("| `sum_f32_16m` | cpu | 2 | 3 | GB/s |"),
            "{page}"
        );
        assert!(
            !page.contains("| `sum_f32_16m` | cpu | 2 | 1 | GB/s |"),
            "{page}"
        );
        assert!(page.contains("at `0123456789`"), "{page}");
        assert!(
            page.contains("- Earlier runs: [`2026-01-01-m1-cpu.json`]"),
            "{page}"
        );
        assert!(page.ends_with("|\n"), "{page:?}");
    }

    /// A session that saved several filtered runs shows them all; a file whose cases a
    /// newer one measured again is only linked.
    #[test]
    fn the_same_days_files_of_other_cases_are_rendered() {
        let doc = |time: &str, name: &str, value: f64| {
            let date = if time < "09" {
                "2026-02-01"
            } else {
                "2026-03-01"
            };
            json!({
                "schema": results::SCHEMA, "kind": "ember", "date": date,
                "time": time, "host": "m1", "device": "cpu", "command": "cargo xtask bench --save",
                "machine": {"cpu_model": "Test CPU", "cores": 2, "cpu_flags": ["avx2"]},
                "ember": {"version": "0.1.0", "commit": "0123456789abcdef"},
                "records": [{"name": name, "device": "cpu", "threads": 2,
                             "value": value, "unit": "GB/s"}]
            })
        };
        let files = vec![
            (
                PathBuf::from("a/2026-03-01-m1-cpu.json"),
                doc("10:00:00", "add_f32_16m", 1.0),
            ),
            (
                PathBuf::from("a/2026-03-01-m1-cpu-2.json"),
                doc("11:00:00", "sum_f32_16m", 2.0),
            ),
            (
                PathBuf::from("a/2026-03-01-m1-cpu-3.json"),
                doc("12:00:00", "add_f32_16m", 3.0),
            ),
            // An earlier session's only result of a case: still its newest.
            (
                PathBuf::from("a/2026-02-01-m1-cpu.json"),
                doc("08:00:00", "mul_f32_16m", 4.0),
            ),
        ];
        let page = render(&files);
        assert!(
            page.contains("| `mul_f32_16m` | cpu | 2 | 4 | GB/s |"),
            "{page}"
        );
        assert!(
            page.contains("| `add_f32_16m` | cpu | 2 | 3 | GB/s |"),
            "{page}"
        );
        assert!(
            page.contains("| `sum_f32_16m` | cpu | 2 | 2 | GB/s |"),
            "{page}"
        );
        assert!(
            !page.contains("| `add_f32_16m` | cpu | 2 | 1 | GB/s |"),
            "{page}"
        );
        assert!(
            page.contains("- Earlier runs: [`2026-03-01-m1-cpu.json`]"),
            "{page}"
        );
    }

    #[test]
    fn suite_results_written_by_hand_are_refused_or_marked() {
        let table = json!({"title": "The GPU suites", "columns": ["step", "result"],
                           "rows": [["tests: cudnn", "all passed (9 tests)"]]});
        let doc = |t: Value| {
            json!({
                "schema": results::SCHEMA, "kind": "side-by-side", "date": "2026-01-01",
                "host": "gpu", "device": "cuda", "command": "x", "records": [], "tables": [t]
            })
        };
        let files = vec![(PathBuf::from("a/gpu.json"), doc(table.clone()))];
        let e = check_suite_results(&files).unwrap_err();
        assert!(e.contains("reports test-suite results by hand"), "{e}");
        let mut marked = table;
        marked["unverified"] = json!("the suites ran without recording skips");
        let files = vec![(PathBuf::from("a/gpu.json"), doc(marked))];
        check_suite_results(&files).unwrap();
        let page = render(&files);
        assert!(
            page.contains("**Written by hand, not generated; unverified:** the suites ran"),
            "{page}"
        );
        // A generated record renders; one whose counts were edited is refused.
        let tests = suites::parse_libtest_json(
            "{ \"type\": \"test\", \"name\": \"t\", \"event\": \"ok\", \"stdout\": \"ember-skip: why\\n\" }",
            "exit 0",
        );
        let record = suites::suite_record("s", None, "tests/s", Some(0), 1.0, &tests);
        let mut generated = doc(json!({}));
        generated["kind"] = json!("suites");
        generated["generator"] = json!(suites::GENERATOR);
        generated["records"] = json!([record]);
        let files = vec![(PathBuf::from("a/gpu-suites.json"), generated.clone())];
        check_suite_results(&files).unwrap();
        assert!(render(&files).contains("| `s` | 0 | 0 | 1 | 0 | 1 s |"));
        generated["records"][0]["passed"] = json!(1);
        generated["records"][0]["skipped"] = json!(0);
        let files = vec![(PathBuf::from("a/gpu-suites.json"), generated)];
        assert!(check_suite_results(&files).is_err());
    }
}
