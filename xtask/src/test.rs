//! `cargo xtask test`: the README's test command, and what `.ci/run` calls.

use crate::{cargo, run_step};

pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`test` takes no arguments, found {a:?}"));
    }
    run_step(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--", "--check"]),
    )?;
    run_step(
        "cargo clippy (all targets, -D warnings)",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // The same suite twice: once as a machine without CUDA sees it (whatever the environment
    // says), once with two emulated CUDA devices so every `cuda:N` path runs.
    run_step(
        "cargo test (no CUDA: EMBER_CUDA_EMULATOR unset)",
        cargo()
            .args(["test", "--workspace", "--locked"])
            .env_remove("EMBER_CUDA_EMULATOR")
            .env_remove("EMBER_CUDA_EMULATOR_MEMORY"),
    )?;
    run_step(
        "cargo test (EMBER_CUDA_EMULATOR=2)",
        cargo()
            .args(["test", "--workspace", "--locked"])
            .env("EMBER_CUDA_EMULATOR", "2")
            .env_remove("EMBER_CUDA_EMULATOR_MEMORY"),
    )?;
    eprintln!("==> all checks passed");
    Ok(())
}
