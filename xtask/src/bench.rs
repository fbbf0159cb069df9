//! `cargo xtask bench`: builds `ember-bench` in release mode and runs it with the given flags.

use crate::{cargo, run_step};

pub fn run(args: &[String]) -> Result<(), String> {
    run_step(
        "cargo build --release -p ember-bench",
        cargo().args(["build", "--release", "--quiet", "-p", "ember-bench"]),
    )?;
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--quiet", "-p", "ember-bench", "--"])
        .args(args);
    let status = cmd
        .status()
        .map_err(|e| format!("ember-bench: could not start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("ember-bench failed ({status})"))
    }
}
