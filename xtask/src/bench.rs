//! `cargo xtask bench [ARGS] [--save [--host NAME] [--notes TEXT]]`: builds `ember-bench` in
//! release mode and runs it with `ARGS` (`--json`, `--filter S`, `--device cpu|cuda|all`).
//!
//! With `--save`, the records are also written to `bench/results/<date>-<host>-<device>.json`
//! with the machine's description (see `results.rs`), one file per device kind; records of
//! an emulated CUDA device are not saved (their rates mean nothing). `--host` names the
//! machine (default: the hostname), `--notes` adds free text to its description (a shared
//! or busy host, say). `cargo xtask bench-report` renders the saved files.

use serde_json::{Value, json};

use crate::{cargo, results, run_step};

/// The options of `bench` that xtask handles; the rest go to `ember-bench`.
#[derive(Debug, Default)]
struct SaveOptions {
    save: bool,
    host: Option<String>,
    notes: Option<String>,
}

fn split_args(args: &[String]) -> Result<(SaveOptions, Vec<String>), String> {
    let mut opts = SaveOptions::default();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--save" => opts.save = true,
            "--host" => opts.host = Some(it.next().ok_or("--host needs a name")?.clone()),
            "--notes" => opts.notes = Some(it.next().ok_or("--notes needs a text")?.clone()),
            _ => rest.push(a.clone()),
        }
    }
    if !opts.save && (opts.host.is_some() || opts.notes.is_some()) {
        return Err("--host and --notes go with --save".into());
    }
    Ok((opts, rest))
}

/// `ember-bench`'s features for this machine: `mpi` when Open MPI is installed.
fn features() -> Vec<&'static str> {
    if crate::test::mpi_present() {
        vec!["--features", "ember-bench/mpi"]
    } else {
        Vec::new()
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let (save, mut bench_args) = split_args(args)?;
    let features = features();
    run_step(
        &format!(
            "cargo build --release -p ember-bench {}",
            features.join(" ")
        ),
        cargo()
            .args(["build", "--release", "--quiet", "-p", "ember-bench"])
            .args(&features),
    )?;
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--quiet", "-p", "ember-bench"])
        .args(&features)
        .arg("--");
    if !save.save {
        let status = cmd
            .args(&bench_args)
            .status()
            .map_err(|e| format!("ember-bench: could not start: {e}"))?;
        return if status.success() {
            Ok(())
        } else {
            Err(format!("ember-bench failed ({status})"))
        };
    }
    let printed_json = bench_args.iter().any(|a| a == "--json");
    if !printed_json {
        bench_args.push("--json".into());
    }
    let out = cmd
        .args(&bench_args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("ember-bench: could not start: {e}"))?;
    if !out.status.success() {
        return Err(format!("ember-bench failed ({})", out.status));
    }
    let records: Vec<Value> = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("ember-bench --json printed no JSON array: {e}"))?;
    if printed_json {
        println!("{}", String::from_utf8_lossy(&out.stdout).trim_end());
    } else {
        for r in &records {
            println!(
                "{:<36} {:<10} {:>14.2}  {}",
                r["name"].as_str().unwrap_or("?"),
                r["device"].as_str().unwrap_or("?"),
                r["value"].as_f64().unwrap_or(f64::NAN),
                r["unit"].as_str().unwrap_or("")
            );
        }
    }
    let command = std::iter::once("cargo xtask bench".to_string())
        .chain(args.iter().map(|a| shell_word(a)))
        .collect::<Vec<_>>()
        .join(" ");
    for path in save_records(&records, &save, &command)? {
        eprintln!(
            "==> saved {}; `cargo xtask bench-report` renders docs/performance.md",
            path.display()
        );
    }
    Ok(())
}

/// `word` as a shell would need it written (quoted when it has spaces or is empty).
pub fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// The device kind of a record: `cpu` or `cuda`.
fn kind_of(record: &Value) -> &'static str {
    if record["device"]
        .as_str()
        .is_some_and(|d| d.starts_with("cuda"))
    {
        "cuda"
    } else {
        "cpu"
    }
}

/// One file per device kind; emulated CUDA records are left out.
fn save_records(
    records: &[Value],
    opts: &SaveOptions,
    command: &str,
) -> Result<Vec<std::path::PathBuf>, String> {
    let host = opts.host.clone().unwrap_or_else(results::hostname);
    let date = results::today();
    let mut saved = Vec::new();
    for device in ["cpu", "cuda"] {
        let group: Vec<&Value> = records.iter().filter(|r| kind_of(r) == device).collect();
        if group.is_empty() {
            continue;
        }
        if group.iter().all(|r| r["emulated"] == true) {
            eprintln!(
                "==> not saving the {} {device} records: the device is emulated, its rates mean nothing",
                group.len()
            );
            continue;
        }
        let doc = json!({
            "schema": results::SCHEMA,
            "kind": "ember",
            "date": date,
            "time": results::now_time(),
            "host": host,
            "device": device,
            "command": command,
            "machine": results::machine(opts.notes.as_deref()),
            "ember": results::ember_version(),
            "records": group,
        });
        saved.push(results::save(&doc)?);
    }
    if saved.is_empty() {
        return Err("--save: no records to save".into());
    }
    Ok(saved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_options_are_taken_out() {
        let args: Vec<String> = ["--filter", "sum", "--save", "--notes", "a busy VM"]
            .map(String::from)
            .to_vec();
        let (o, rest) = split_args(&args).unwrap();
        assert!(o.save);
        assert_eq!(o.notes.as_deref(), Some("a busy VM"));
        assert_eq!(rest, vec!["--filter".to_string(), "sum".to_string()]);
        assert!(split_args(&["--host".to_string(), "x".to_string()]).is_err());
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("--filter"), "--filter");
    }
}
