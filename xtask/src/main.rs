//! Ember's tasks, run as `cargo xtask <task>` (the alias lives in `.cargo/config.toml` and
//! builds this program in its own target directory, `target/xtask`).
//!
//! - `test`: what CI runs — `cargo fmt --check`, `cargo clippy --all-targets -D warnings`, and
//!   the whole test suite twice: once as a machine without CUDA sees it, once with two emulated
//!   CUDA devices (`EMBER_CUDA_EMULATOR=2`), the kernels under AddressSanitizer, then the
//!   launch-coverage check (every kernel in the symbol table was launched by some test;
//!   `coverage.rs`) and a check that `docs/performance.md` matches `bench/results/`.
//! - `coverage [CARGO TEST ARGS]`: only the emulated pass (default `--workspace`) and the
//!   launch-coverage check.
//! - `bench`: builds the benchmark program in release mode and runs it; `--json` prints one
//!   JSON array of records, `--filter S` selects cases whose name contains `S`, `--save`
//!   writes them to `bench/results/` with the machine's description (`results.rs`).
//! - `bench-report [--check]`: renders `docs/performance.md` from `bench/results/`.
//! - `kernels`: compiles `kernels/*.cu` with nvcc into `target/kernels/ember.fatbin`
//!   (`--install-nvcc` first installs CUDA 13.0's nvcc from PyPI into `target/nvcc`).
//! - `gpu-test`: the test suite on this machine's real GPUs (device-generic tests on the real
//!   driver, `EMBER_GPU_TEST=1`); says clearly when there is no GPU and runs nothing.
//! - `gpu-bundle`: release binaries, test binaries, this program and the data in one archive
//!   for a GPU machine without a Rust toolchain; `gpu-session` runs the GPU checks from it.
//! - `mkl`: installs Intel MKL from PyPI into `target/mkl` (optional; the CPU GEMM then uses it).
//! - `onednn`: installs oneDNN from PyPI into `target/onednn` (optional; CPU convolutions then
//!   use it).

mod bench;
mod coverage;
mod gpu_bundle;
mod gpu_session;
mod gpu_test;
mod kernels;
mod mkl;
mod onednn;
mod report;
mod results;
mod suites;
mod test;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((t, r)) => (t.as_str(), r),
        None => {
            eprintln!("{}", usage());
            return ExitCode::FAILURE;
        }
    };
    let result = match task {
        "test" => test::run(rest),
        "bench" => bench::run(rest),
        "bench-report" => report::run(rest),
        "gpu-bundle" => gpu_bundle::run(rest),
        "gpu-session" => gpu_session::run(rest),
        "kernels" => kernels::run(rest),
        "gpu-test" => gpu_test::run(rest),
        "coverage" => coverage::run(rest),
        "mkl" => mkl::run(rest),
        "onednn" => onednn::run(rest),
        "-h" | "--help" | "help" => {
            println!("{}", usage());
            Ok(())
        }
        other => Err(format!("unknown task {other:?}\n{}", usage())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> &'static str {
    "usage: cargo xtask <task>\n\
     tasks:\n  \
       test                      fmt check, clippy -D warnings, all tests (without CUDA and on the emulator),\n                            \
       kernels under ASan, launch coverage, docs/performance.md up to date\n  \
       coverage [CARGO TEST ARGS] emulated tests (default --workspace, e.g. -p ember-kernels) + the launch-coverage check\n  \
       bench [--json] [--filter S] [--device cpu|cuda|all] [--save [--host NAME] [--notes TEXT]]\n                            \
       benchmarks (release build); --save writes bench/results/<date>-<host>-<device>.json\n  \
       bench-report [--check]    render docs/performance.md from bench/results/ (--check: fail if it differs)\n  \
       kernels [--install-nvcc]  nvcc-compile kernels/*.cu into target/kernels/ember.fatbin (SASS sm_75..sm_120\n                            \
       + compute_90 PTX); fails on PTX ISA != 9.0 or register spills; --install-nvcc: CUDA 13.0 from PyPI\n  \
       gpu-test                  the tests on this machine's real GPUs (says so and runs nothing without one)\n  \
       gpu-bundle [--arch N] [--fatbin PATH] [--out FILE]\n                            \
       release binaries, GPU test suites, xtask, data and the side-by-side script in one archive\n  \
       gpu-session [--out DIR] [--budget S] [--filter CASES] [--host NAME] [info|tests|train|nccl|bench|sanitize|ncu...]\n                            \
       from an unpacked bundle on a GPU machine (no Rust needed): the GPU checks (every test's\n                            \
       outcome recorded) and benchmarks\n  \
       mkl                       install Intel MKL from PyPI into target/mkl (optional faster CPU GEMM)\n  \
       onednn                    install oneDNN from PyPI into target/onednn (optional faster CPU convolutions)"
}

/// The workspace root (the parent of this crate's manifest directory).
fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// `cargo`, as the one running this task.
fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root());
    cmd
}

/// Run a command, echoing it, failing with its name if it fails.
fn run_step(label: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("==> {label}");
    let status = cmd
        .status()
        .map_err(|e| format!("{label}: could not start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{label}: failed ({status})"))
    }
}
