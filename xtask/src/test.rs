//! `cargo xtask test`: the README's test command, and what `.ci/run` calls.

use std::process::Command;

use crate::{cargo, coverage, report, run_step};

/// The host's target triple, from `rustc -vV`'s `host:` line.
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("cannot run rustc -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host:"))
        .map(|h| h.trim().to_string())
        .ok_or_else(|| "rustc -vV printed no host line".to_string())
}

/// Cargo's variable for the runner of `triple`'s binaries: `CARGO_TARGET_<TRIPLE>_RUNNER`,
/// the triple upper-cased with `-` and `.` as `_`.
pub fn runner_variable(triple: &str) -> String {
    let t: String = triple
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("CARGO_TARGET_{t}_RUNNER")
}

pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`test` takes no arguments, found {a:?}"));
    }
    ensure_chromium()?;
    ensure_mpi()?;
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
            "--features",
            MPI_FEATURE,
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
            .args(["test", "--workspace", "--locked", "--features", MPI_FEATURE])
            .env_remove("EMBER_CUDA_EMULATOR")
            .env_remove("EMBER_CUDA_EMULATOR_MEMORY")
            .env_remove(coverage::ENV_TRACE)
            .env_remove(coverage::ENV_TABLE),
    )?;
    // The emulated pass records every kernel it launches (and the emulated symbol table) for
    // the launch-coverage check below.
    let files = coverage::prepare()?;
    run_step(
        "cargo test (EMBER_CUDA_EMULATOR=2, launch trace)",
        coverage::traced(
            cargo()
                .args(["test", "--workspace", "--locked", "--features", MPI_FEATURE])
                .env("EMBER_CUDA_EMULATOR", "2")
                .env_remove("EMBER_CUDA_EMULATOR_MEMORY"),
            &files,
            true,
        ),
    )?;
    // The emulated CUDA kernels once more under AddressSanitizer + UBSan: an out-of-bounds
    // access in a kernel fails here as compute-sanitizer would report it on a GPU. Its own
    // target directory, so the sanitizer build does not invalidate the ordinary one;
    // `--tests` because rustdoc crashes with libasan preloaded.
    let libasan = Command::new("g++")
        .arg("-print-file-name=libasan.so")
        .output()
        .map_err(|e| format!("cannot run g++ to find libasan: {e}"))?;
    let libasan = String::from_utf8_lossy(&libasan.stdout).trim().to_string();
    if !std::path::Path::new(&libasan).is_absolute() {
        return Err(format!(
            "g++ does not know libasan.so (it answered {libasan:?}); install the compiler's sanitizer runtime (Debian: libasan8)"
        ));
    }
    let target_dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let runner = runner_variable(&host_triple()?);
    // Traced too: its out-of-bounds test is what launches ember_test_out_of_bounds.
    run_step(
        "cargo test -p ember-kernels (emulated kernels under ASan + UBSan)",
        coverage::traced(
            cargo()
                .args(["test", "-p", "ember-kernels", "--tests", "--locked"])
                .env("EMBER_KERNELS_ASAN", "1")
                .env("CARGO_TARGET_DIR", format!("{target_dir}/asan"))
                .env(
                    &runner,
                    format!("env LD_PRELOAD={libasan} ASAN_OPTIONS=detect_leaks=0"),
                ),
            &files,
            false,
        ),
    )?;
    coverage::check(&files)?;
    // The performance page is generated: it must match the saved results.
    report::run(&["--check".to_string()])?;
    eprintln!("==> all checks passed");
    Ok(())
}

/// The features that build process groups' `mpi` backend and its tests: ember-parallel's,
/// and the `ember` crate's (its `ember launch -- ember train` test).
const MPI_FEATURE: &str = "ember-parallel/mpi,ember/mpi,ember-cli/mpi";

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .any(|d| d.join(name).is_file())
}

/// Installs Debian `packages` with apt-get when this process is root and apt-get exists;
/// `true` if it ran and succeeded.
fn apt_install(packages: &str, why: &str) -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !(root && on_path("apt-get")) {
        return false;
    }
    eprintln!("==> installing Debian's {packages} ({why})");
    Command::new("sh")
        .args([
            "-c",
            &format!(
                "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {packages} >/dev/null"
            ),
        ])
        .status()
        .is_ok_and(|s| s.success())
}

/// `true` when Open MPI (runtime and headers) and libclang (for the bindings' generator)
/// are installed.
pub(crate) fn mpi_present() -> bool {
    let libclang = Command::new("sh")
        .args(["-c", "ldconfig -p | grep -q 'libclang[-.0-9]*\\.so'"])
        .status()
        .is_ok_and(|s| s.success());
    on_path("mpirun") && on_path("mpicc") && libclang
}

/// Open MPI for the `mpi` backend's build and its multi-rank tests: installed with apt-get
/// when missing and this process may, else an error saying exactly what to install.
fn ensure_mpi() -> Result<(), String> {
    const PACKAGES: &str = "libopenmpi-dev openmpi-bin libclang-dev";
    if mpi_present() || (apt_install(PACKAGES, "Open MPI for the mpi backend") && mpi_present()) {
        return Ok(());
    }
    Err(format!(
        "Open MPI and libclang are needed to build and test the mpi backend (--features {MPI_FEATURE}) and were not found (mpirun, mpicc, libclang.so): install them (Debian: sudo apt-get install {PACKAGES})"
    ))
}

/// The browser the profiler's memory-timeline test renders its page in
/// (`crates/ember-profiler/tests/timeline.rs`): `EMBER_CHROMIUM`, or Debian's `chromium`
/// (or `chromium-browser`, `google-chrome`) on `PATH`; installed with apt-get when missing
/// and this process may, else an error saying what to install.
fn ensure_chromium() -> Result<(), String> {
    if std::env::var_os("EMBER_CHROMIUM").is_some()
        || ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .any(|n| on_path(n))
    {
        return Ok(());
    }
    if apt_install("chromium", "headless browser for the memory-timeline test")
        && on_path("chromium")
    {
        return Ok(());
    }
    Err(
        "headless Chromium is needed by the profiler's memory-timeline test and none was found \
         (chromium, chromium-browser or google-chrome on PATH, or EMBER_CHROMIUM): install it \
         (Debian: sudo apt-get install chromium)"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_variable_follows_the_triple() {
        assert_eq!(
            runner_variable("x86_64-unknown-linux-gnu"),
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER"
        );
        assert_eq!(
            runner_variable("aarch64-unknown-linux-gnu"),
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER"
        );
        assert_eq!(
            runner_variable("thumbv7em-none-eabihf.json"),
            "CARGO_TARGET_THUMBV7EM_NONE_EABIHF_JSON_RUNNER"
        );
        assert!(host_triple().is_ok_and(|t| t.contains('-')));
    }
}
