//! `cargo xtask onednn`: install oneDNN (the library behind PyTorch's CPU convolutions) from
//! PyPI into `target/onednn`, where `ember-tensor` finds it at run time
//! (`target/onednn/lib/libdnnl.so.3`). Optional: without it Ember's CPU convolutions run on
//! its own kernels. The wheel is `onednn-cpu-gomp` (oneDNN 3.2, GNU OpenMP, no other
//! dependency than `libgomp`, which GCC's runtime provides); Apache-2.0. See
//! docs/convolutions.md.

use std::process::Command;

use crate::{root, run_step};

/// The pinned oneDNN wheel.
const ONEDNN: &str = "onednn-cpu-gomp==2023.2.0";

pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`onednn` takes no arguments, found {a:?}"));
    }
    let prefix = root().join("target").join("onednn");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run_step(
        &format!("pip install {ONEDNN} into {}", prefix.display()),
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
            .arg(ONEDNN),
    )?;
    let lib = prefix.join("lib");
    let found = std::fs::read_dir(&lib)
        .map_err(|e| format!("{}: {e}", lib.display()))?
        .flatten()
        .any(|e| e.file_name().to_string_lossy() == "libdnnl.so.3");
    if !found {
        return Err(format!("no libdnnl.so.3 under {}", lib.display()));
    }
    eprintln!(
        "==> oneDNN installed in {}; `ember info` reports the convolution backend",
        lib.display()
    );
    Ok(())
}
