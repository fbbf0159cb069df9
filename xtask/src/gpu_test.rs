//! `cargo xtask gpu-test`: the test suite against the real GPUs of this machine.
//!
//! It asks `ember info --json` (built from this workspace, emulator variables removed)
//! whether real CUDA is available. Without it, it says so — naming the reason — and runs
//! nothing: there is no GPU to test, which is not a failure of the code. With it, it needs the
//! fatbin of `cargo xtask kernels` (or the one `EMBER_KERNELS_FATBIN` names) and runs `cargo
//! test --workspace` with `EMBER_GPU_TEST=1`, under which the device-generic suites (those
//! `gpu_bundle::GPU_SUITES` lists: `cuda_ops`, `gradcheck`, `nn`, ...) use the real driver
//! instead of the emulator and fail if it is missing, all of them on cuDNN's graph API
//! (`EMBER_CUDNN_API=graph`), then the `cudnn` suite again on the legacy API. Only exit
//! statuses are seen here: a test that skips (Note [Skipped tests]) is not told from one that
//! passed; `gpu-session` records every test's outcome (Note [Suite results are generated]).

use std::path::Path;

use crate::{cargo, root, run_step};

pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`gpu-test` takes no arguments, found {a:?}"));
    }
    eprintln!("==> probing for a CUDA GPU (`ember info --json`, emulator off)");
    let out = cargo()
        .args([
            "run",
            "-q",
            "--locked",
            "-p",
            "ember-cli",
            "--",
            "info",
            "--json",
        ])
        .env_remove("EMBER_CUDA_EMULATOR")
        .env_remove("EMBER_CUDA_EMULATOR_MEMORY")
        .output()
        .map_err(|e| format!("cannot run `ember info`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ember info --json` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let info = String::from_utf8_lossy(&out.stdout);
    let compact: String = info.chars().filter(|c| !c.is_whitespace()).collect();
    if !compact.contains("\"cuda_available\":true") {
        // The reason's text, from the original (spaced) JSON.
        let reason = info
            .split("\"cuda_unavailable_reason\"")
            .nth(1)
            .and_then(|r| r.split('"').nth(1))
            .unwrap_or("unknown");
        eprintln!(
            "gpu-test: NO CUDA GPU FOUND on this machine ({reason}); nothing ran on a GPU. \
             The emulated CUDA suite is `cargo xtask test`."
        );
        return Ok(());
    }
    let parsed: serde_json::Value = serde_json::from_str(&info).unwrap_or_default();
    if let Some(why) = parsed["cuda_kernels_missing"].as_str() {
        return Err(format!(
            "a GPU is present but `ember` cannot run on it: {why}"
        ));
    }
    let fatbin = std::env::var_os("EMBER_KERNELS_FATBIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root().join("target/kernels/ember.fatbin"));
    if !Path::new(&fatbin).exists() {
        return Err(format!(
            "a GPU is present but {} is missing: run `cargo xtask kernels` first",
            fatbin.display()
        ));
    }
    run_step(
        "cargo test --workspace (EMBER_GPU_TEST=1: device-generic tests on the real GPUs)",
        cargo()
            .args(["test", "--workspace", "--locked"])
            .env("EMBER_GPU_TEST", "1")
            .env("EMBER_CUDNN_API", "graph")
            .env_remove("EMBER_CUDA_EMULATOR")
            .env_remove("EMBER_CUDA_EMULATOR_MEMORY"),
    )?;
    run_step(
        "cargo test -p ember-tensor --test cudnn (EMBER_GPU_TEST=1, EMBER_CUDNN_API=legacy)",
        cargo()
            .args(["test", "--locked", "-p", "ember-tensor", "--test", "cudnn"])
            .env("EMBER_GPU_TEST", "1")
            .env("EMBER_CUDNN_API", "legacy")
            .env_remove("EMBER_CUDA_EMULATOR")
            .env_remove("EMBER_CUDA_EMULATOR_MEMORY"),
    )?;
    eprintln!("==> gpu-test passed on the real GPU(s)");
    Ok(())
}
