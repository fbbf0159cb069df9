//! `cargo xtask mkl`: install Intel MKL from PyPI into `target/mkl`, where `ember-gemm` finds
//! it at run time (`target/mkl/lib/libmkl_rt.so*`). Optional: without it Ember's CPU GEMM
//! runs on the pure-Rust backend. MKL's licence is the Intel Simplified Software License
//! (proprietary, redistributable); Ember never ships it.

use std::path::PathBuf;
use std::process::Command;

use crate::{root, run_step};

/// The pinned MKL wheel.
const MKL: &str = "mkl==2026.2.0";

pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`mkl` takes no arguments, found {a:?}"));
    }
    let lib = install_wheel(MKL, "mkl", "libmkl_rt.so")?;
    eprintln!(
        "==> MKL installed in {}; `ember info` reports the backend",
        lib.display()
    );
    Ok(())
}

/// pip-installs `wheel` (no dependencies) into `target/<dir>` and returns its `lib`
/// directory, checked to hold a file whose name starts with `library`: the optional
/// run-time libraries (MKL, oneDNN) that Ember opens with `libloading`.
pub fn install_wheel(wheel: &str, dir: &str, library: &str) -> Result<PathBuf, String> {
    let prefix = root().join("target").join(dir);
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run_step(
        &format!("pip install {wheel} into {}", prefix.display()),
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-warn-script-location",
                "--prefix",
            ])
            .arg(&prefix)
            .arg(wheel),
    )?;
    let lib = prefix.join("lib");
    let found = std::fs::read_dir(&lib)
        .map_err(|e| format!("{}: {e}", lib.display()))?
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(library));
    if !found {
        return Err(format!("no {library} under {}", lib.display()));
    }
    Ok(lib)
}
