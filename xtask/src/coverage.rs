//! The launch-coverage check: no kernel ships that nothing has executed.
//!
//! The emulated test passes run with `EMBER_CUDA_EMULATOR_TRACE` naming one fresh file, to
//! which every test process appends the name of each kernel it launches (Note [Launch trace]
//! in `crates/ember-device/src/driver/emulator/launch_trace.rs`). The symbol table is the
//! union of
//!
//! - the emulated registry, `ember_kernels::emulated_kernel_names()`, which the test
//!   `emulated_kernel_table_for_the_launch_check` (`crates/ember-kernels/tests/emulator_runtime.rs`)
//!   writes to the file `EMBER_KERNELS_TABLE` names during the same pass, and
//! - the fatbin's entry points, `target/kernels/ember.kernels` (or the list beside the fatbin
//!   `EMBER_KERNELS_FATBIN` names), when there is one.
//!
//! Every name in the table must appear in the trace, or be listed in [`NEVER_LAUNCHED_ALLOWED`]
//! with the reason; otherwise the check fails with the list. The sets are compared at run
//! time, so kernels added anywhere are covered by whatever launches them.
//!
//! `cargo xtask test` runs it after the emulated pass and the AddressSanitizer pass (whose
//! test launches the deliberately out-of-bounds kernel); `cargo xtask coverage [CARGO TEST
//! ARGS]` runs only an emulated pass (default `--workspace`; e.g. `-p ember-kernels`) and
//! the check.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cargo, root, run_step};

/// Kernels that may stay unlaunched, each with the reason. Empty: every kernel, including the
/// emulator-only deliberately broken ones of `kernels/testing.cu`, is launched by a test.
pub const NEVER_LAUNCHED_ALLOWED: &[(&str, &str)] = &[];

/// The variable naming the trace file (`ember_device::driver::emulator::ENV_EMULATOR_TRACE`).
pub const ENV_TRACE: &str = "EMBER_CUDA_EMULATOR_TRACE";
/// The variable naming the file the kernel-table test writes.
pub const ENV_TABLE: &str = "EMBER_KERNELS_TABLE";

/// The files of one check, under `{target dir}/launch-coverage/`.
#[derive(Debug, Clone)]
pub struct Files {
    /// The launch trace.
    pub trace: PathBuf,
    /// The emulated registry's names, one a line.
    pub table: PathBuf,
}

/// The target directory cargo builds into (`CARGO_TARGET_DIR` or `target/`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() { d } else { root().join(d) }
        }
        None => root().join("target"),
    }
}

/// Fresh (deleted) trace and table files.
pub fn prepare() -> Result<Files, String> {
    let dir = target_dir().join("launch-coverage");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let files = Files {
        trace: dir.join("launched.txt"),
        table: dir.join("emulated-kernels.txt"),
    };
    for f in [&files.trace, &files.table] {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", f.display())),
        }
    }
    Ok(files)
}

/// Sets the variables of a traced, emulated test command.
pub fn traced<'a>(cmd: &'a mut Command, files: &Files, write_table: bool) -> &'a mut Command {
    cmd.env(ENV_TRACE, &files.trace);
    if write_table {
        cmd.env(ENV_TABLE, &files.table);
    } else {
        cmd.env_remove(ENV_TABLE);
    }
    cmd
}

fn read_names(path: &Path) -> Result<BTreeSet<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// The kernels of `table` that are neither in `launched` nor allowed, as report lines; and
/// the allowed entries that no longer need to be (launched, or not in the table).
pub fn compare(
    table: &BTreeSet<String>,
    launched: &BTreeSet<String>,
    allowed: &[(&str, &str)],
) -> (Vec<String>, Vec<String>) {
    let missing = table
        .iter()
        .filter(|n| !launched.contains(*n) && !allowed.iter().any(|(a, _)| a == n))
        .cloned()
        .collect();
    let stale = allowed
        .iter()
        .filter(|(a, _)| launched.contains(*a) || !table.contains(*a))
        .map(|(a, _)| (*a).to_string())
        .collect();
    (missing, stale)
}

/// Compares the trace with the symbol table (see the module docs).
pub fn check(files: &Files) -> Result<(), String> {
    eprintln!("==> launch coverage: the launch trace against the kernel symbol table");
    let mut table = read_names(&files.table).map_err(|e| {
        format!("{e}: the test emulated_kernel_table_for_the_launch_check (ember-kernels) did not run in the emulated pass")
    })?;
    if table.is_empty() {
        return Err(format!(
            "the kernel table {} is empty",
            files.table.display()
        ));
    }
    let emulated = table.len();
    // The entry points of the fatbin the build embeds: the one `EMBER_KERNELS_FATBIN` names,
    // else `cargo xtask kernels`'s (each with its `.kernels` list beside it).
    let fatbin_names = std::env::var_os("EMBER_KERNELS_FATBIN").map_or_else(
        || root().join("target").join("kernels").join("ember.kernels"),
        |f| PathBuf::from(f).with_extension("kernels"),
    );
    let fatbin = if fatbin_names.is_file() {
        let names = read_names(&fatbin_names)?;
        let n = names.len();
        table.extend(names);
        Some(n)
    } else {
        None
    };
    // No file at all: nothing launched anything (a pass without the emulator).
    let launched = if files.trace.exists() {
        read_names(&files.trace)?
    } else {
        BTreeSet::new()
    };
    let (missing, stale) = compare(&table, &launched, NEVER_LAUNCHED_ALLOWED);
    for name in &stale {
        eprintln!(
            "    note: {name} is in NEVER_LAUNCHED_ALLOWED (xtask/src/coverage.rs) but was launched or no longer exists; remove it"
        );
    }
    for (name, reason) in NEVER_LAUNCHED_ALLOWED {
        eprintln!("    allowed never to be launched: {name}: {reason}");
    }
    eprintln!(
        "    {} kernels in the table ({emulated} emulated{}), {} launched names in {}",
        table.len(),
        fatbin.map_or(String::new(), |n| format!(", {n} in the fatbin")),
        launched.len(),
        files.trace.display()
    );
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} kernels were never launched by the test suite (add a test that launches each and checks its result against a reference, or list it with a reason in NEVER_LAUNCHED_ALLOWED in xtask/src/coverage.rs):\n  {}",
            missing.len(),
            missing.join("\n  ")
        ))
    }
}

/// `cargo xtask coverage [CARGO TEST ARGS]`: one emulated, traced test pass and the check.
pub fn run(args: &[String]) -> Result<(), String> {
    let files = prepare()?;
    let mut cmd = cargo();
    cmd.args(["test", "--locked"]);
    if args.is_empty() {
        cmd.arg("--workspace");
    } else {
        cmd.args(args);
    }
    cmd.env("EMBER_CUDA_EMULATOR", "2")
        .env_remove("EMBER_CUDA_EMULATOR_MEMORY");
    run_step(
        "cargo test (EMBER_CUDA_EMULATOR=2, launch trace)",
        traced(&mut cmd, &files, true),
    )?;
    check(&files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn reports_kernels_never_launched_and_stale_allowances() {
        let table = set(&["a_f32", "a_f16", "b_f32", "only_emulated"]);
        let launched = set(&["a_f32", "b_f32", "b_f32_extra", "c_from_a_test"]);
        let allowed = [
            ("only_emulated", "why"),
            ("b_f32", "now launched"),
            ("gone", "removed"),
        ];
        let (missing, stale) = compare(&table, &launched, &allowed);
        assert_eq!(missing, vec!["a_f16".to_string()]);
        assert_eq!(stale, vec!["b_f32".to_string(), "gone".to_string()]);
        let (missing, stale) = compare(&table, &set(&[]), &[]);
        assert_eq!(missing.len(), 4);
        assert!(stale.is_empty());
    }
}
