//! `cargo xtask gpu-bundle [--arch N] [--fatbin PATH] [--out FILE]`: everything a GPU machine
//! without a Rust toolchain needs to check Ember on its GPU, in one archive.
//!
//! The archive (default `target/gpu/ember-gpu.tar.xz`) unpacks to `ember-gpu/`:
//!
//! - `bin/ember`, `bin/ember-bench` and `bin/xtask` (this program: its `gpu-session` task runs
//!   the checks there), release builds, stripped;
//! - `tests/<suite>`: the test binaries of [`GPU_SUITES`], which run on the real driver under
//!   `EMBER_GPU_TEST=1`;
//! - `data/` (the test data, found through `EMBER_DATA_DIR`, set by `gpu-session`),
//!   `bench/torch_side_by_side.py`, and `bundle.json` (Ember's version and commit, the
//!   architecture, the suites).
//!
//! The binaries embed a fatbin for one architecture (default sm_90, H100/H200), built here
//! with nvcc into `target/kernels-sm<N>/` (and reused while no kernel source is newer), or
//! the one `--fatbin` names (with its `ember.kernels` beside it). The build goes to
//! `target/gpu`, so the ordinary `target/release` stays as it is.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::{cargo, kernels, results, root, run_step};

/// The test suites that take `EMBER_GPU_TEST=1`: (package, test target). Every suite whose
/// tests run on `cuda:0` is here, unless [`NOT_BUNDLED`] says why not (the bundle names a
/// suite by its test target, so two targets of one name cannot both travel).
pub const GPU_SUITES: [(&str, &str); 32] = [
    ("ember-tensor", "cuda_ops"),
    ("ember-tensor", "activation_bwd"),
    ("ember-tensor", "batch_norm"),
    ("ember-tensor", "conv_pool"),
    ("ember-tensor", "cuda_bounds"),
    ("ember-tensor", "cudnn"),
    ("ember-tensor", "elementwise"),
    ("ember-tensor", "known_ranges"),
    ("ember-tensor", "loss"),
    ("ember-tensor", "matmul_gemm"),
    ("ember-tensor", "matmul_index"),
    ("ember-tensor", "reduce"),
    ("ember-tensor", "softmax"),
    ("ember-autograd", "gradcheck"),
    ("ember-nn", "nn"),
    ("ember-nn", "data"),
    ("ember-nn", "optim"),
    ("ember-nn", "optim_multi_tensor"),
    ("ember-nn", "schedulers"),
    ("ember-amp", "autocast"),
    ("ember-amp", "scaler"),
    ("ember-amp", "underflow"),
    ("ember-profiler", "profile"),
    ("ember-profiler", "device_timing"),
    ("ember-parallel", "nccl_group"),
    ("ember", "walkthroughs"),
    ("ember-nn", "pytorch_surface"),
    ("ember-tensor", "close"),
    ("ember-tensor", "loss_probs"),
    ("ember-tensor", "sdpa"),
    ("ember-nn", "transformer"),
    ("ember-autograd", "new_ops"),
];

/// Suites with device tests that the bundle leaves out, and why.
pub const NOT_BUNDLED: [(&str, &str, &str); 8] = [
    (
        "ember-tensor",
        "guarantees",
        "a second test target named `guarantees` (ember-autograd)",
    ),
    (
        "ember-autograd",
        "guarantees",
        "a second test target named `guarantees` (ember-tensor)",
    ),
    (
        "ember-tensor",
        "save_checksum",
        "checkpoint bytes on disk; the device half is a copy",
    ),
    (
        "ember-nn",
        "optim_validation",
        "argument checks before any launch",
    ),
    (
        "ember-profiler",
        "timeline",
        "the HTML page in a browser, which a GPU machine lacks",
    ),
    (
        "ember-cli",
        "checkpoint_fuzz",
        "checkpoint parsing on the host",
    ),
    (
        "ember-parallel",
        "rendezvous",
        "ranks as threads of one process need the emulator's NCCL (real GPUs: nccl_group)",
    ),
    (
        "ember-nn",
        "attention",
        "a second test target named `attention` (ember-kernels); `sdpa` runs the op on the GPU",
    ),
];

/// The programs in `bin/`: (package, binary).
const PROGRAMS: [(&str, &str); 3] = [
    ("ember-cli", "ember"),
    ("ember-bench", "ember-bench"),
    ("xtask", "xtask"),
];

/// The directory the archive unpacks to.
pub const BUNDLE_DIR: &str = "ember-gpu";

#[derive(Debug)]
struct Options {
    arch: u32,
    fatbin: Option<PathBuf>,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        arch: 90,
        fatbin: None,
        out: root().join("target").join("gpu").join("ember-gpu.tar.xz"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--arch" => {
                let v = value()?;
                o.arch = v
                    .trim_start_matches("sm_")
                    .parse()
                    .map_err(|_| format!("--arch: expected a number such as 90, found {v:?}"))?;
            }
            "--fatbin" => o.fatbin = Some(PathBuf::from(value()?)),
            "--out" => o.out = PathBuf::from(value()?),
            other => {
                return Err(format!(
                    "`gpu-bundle` takes --arch N, --fatbin PATH, --out FILE; found {other:?}"
                ));
            }
        }
    }
    Ok(o)
}

/// The newest modification time among the kernel sources.
fn newest_source() -> Option<std::time::SystemTime> {
    let mut newest = None;
    let mut stack = vec![root().join("kernels")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                newest = newest.max(Some(t));
            }
        }
    }
    newest
}

/// The fatbin to embed: `--fatbin`, or one built for `arch` (reused while fresh).
fn fatbin(o: &Options) -> Result<PathBuf, String> {
    if let Some(f) = &o.fatbin {
        if !f.is_file() || !f.with_extension("kernels").is_file() {
            return Err(format!(
                "--fatbin {}: the file and its entry-point list ({}) must both exist",
                f.display(),
                f.with_extension("kernels").display()
            ));
        }
        return Ok(f.clone());
    }
    let dir = root().join("target").join(format!("kernels-sm{}", o.arch));
    let fatbin = dir.join("ember.fatbin");
    let names = dir.join("ember.kernels");
    let built = names.metadata().and_then(|m| m.modified()).ok();
    if fatbin.is_file() && built.is_some() && newest_source() <= built {
        eprintln!(
            "==> reusing {} (no kernel source is newer)",
            fatbin.display()
        );
        return Ok(fatbin);
    }
    let nvcc = kernels::find_nvcc()?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let report = kernels::build(&nvcc, &dir, &[o.arch], o.arch)?;
    eprintln!(
        "==> {} kernels for sm_{} in {}",
        report.kernel_count(),
        o.arch,
        fatbin.display()
    );
    Ok(fatbin)
}

/// `strip -o to from`, or a plain copy where there is no `strip`.
fn strip_copy(from: &Path, to: &Path) -> Result<(), String> {
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(from, to)
            .map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))?;
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for e in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        let p = e.path();
        let dest = to.join(e.file_name());
        if p.is_dir() {
            copy_dir(&p, &dest)?;
        } else {
            std::fs::copy(&p, &dest).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    Ok(())
}

/// The executables of `cargo build --message-format=json`'s output, by target name, for the
/// targets of the given kinds.
fn executables(messages: &str, kinds: &[&str]) -> Vec<(String, PathBuf)> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| kinds.contains(&k.as_str().unwrap_or(""))))
        })
        .filter_map(|m| {
            let exe = m["executable"].as_str()?;
            Some((
                m["target"]["name"].as_str()?.to_string(),
                PathBuf::from(exe),
            ))
        })
        .collect()
}

pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let fatbin = fatbin(&o)?;
    let target = root().join("target").join("gpu");
    std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;

    // One cargo invocation: one feature resolution, so the libraries are compiled once for
    // the programs and the tests alike.
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--locked",
        "--message-format=json-render-diagnostics",
    ])
    .env("CARGO_TARGET_DIR", &target)
    .env("EMBER_KERNELS_FATBIN", &fatbin)
    .stderr(std::process::Stdio::inherit());
    let mut packages: Vec<&str> = PROGRAMS
        .iter()
        .map(|(p, _)| *p)
        .chain(GPU_SUITES.iter().map(|(p, _)| *p))
        .collect();
    packages.sort_unstable();
    packages.dedup();
    for p in packages {
        cmd.args(["-p", p]);
    }
    for (_, bin) in PROGRAMS {
        cmd.args(["--bin", bin]);
    }
    for (_, t) in GPU_SUITES {
        cmd.args(["--test", t]);
    }
    eprintln!(
        "==> cargo build --release (ember, ember-bench, xtask, {} test suites) against {}",
        GPU_SUITES.len(),
        fatbin.display()
    );
    let out = cmd
        .output()
        .map_err(|e| format!("cargo build: could not start: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo build failed ({})", out.status));
    }
    let messages = String::from_utf8_lossy(&out.stdout);

    let stage = target.join("bundle");
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    }
    let top = stage.join(BUNDLE_DIR);
    for d in ["bin", "tests", "bench"] {
        std::fs::create_dir_all(top.join(d)).map_err(|e| format!("{d}: {e}"))?;
    }
    let bins = executables(&messages, &["bin"]);
    for (_, bin) in PROGRAMS {
        let (_, exe) = bins
            .iter()
            .find(|(n, _)| n == bin)
            .ok_or(format!("cargo built no binary {bin}"))?;
        strip_copy(exe, &top.join("bin").join(bin))?;
    }
    let tests = executables(&messages, &["test"]);
    for (_, t) in GPU_SUITES {
        let (_, exe) = tests
            .iter()
            .find(|(n, _)| n == t)
            .ok_or(format!("cargo built no test binary {t}"))?;
        strip_copy(exe, &top.join("tests").join(t))?;
    }
    copy_dir(&root().join("data"), &top.join("data"))?;
    let script = root().join("bench").join("torch_side_by_side.py");
    std::fs::copy(&script, top.join("bench").join("torch_side_by_side.py"))
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let manifest = json!({
        "ember": results::ember_version(),
        "built": results::today(),
        "arch": format!("sm_{}", o.arch),
        "fatbin": fatbin.file_name().map(|n| n.to_string_lossy().into_owned()),
        "suites": GPU_SUITES.iter().map(|(_, t)| *t).collect::<Vec<_>>(),
        "not_bundled": NOT_BUNDLED
            .iter()
            .map(|(p, t, why)| json!({"suite": format!("{p}/{t}"), "why": why}))
            .collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| e.to_string())?;
    std::fs::write(top.join("bundle.json"), format!("{text}\n"))
        .map_err(|e| format!("bundle.json: {e}"))?;

    if let Some(dir) = o.out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    run_step(
        &format!("tar -cJf {} {BUNDLE_DIR}", o.out.display()),
        Command::new("tar")
            .env("XZ_OPT", "-9 -T0")
            .arg("-C")
            .arg(&stage)
            .arg("-cJf")
            .arg(&o.out)
            .arg(BUNDLE_DIR),
    )?;
    let size = std::fs::metadata(&o.out).map_or(0, |m| m.len());
    eprintln!(
        "==> {} ({:.1} MB). On the GPU machine: tar -xf {} && {BUNDLE_DIR}/bin/xtask gpu-session",
        o.out.display(),
        size as f64 / 1e6,
        o.out
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned())
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A suite that runs tests on `cuda:0` either travels in the bundle or says why not, so
    /// a new suite of device tests cannot be left to the emulator alone.
    #[test]
    fn every_device_suite_is_bundled_or_excused() {
        let marks = [
            "test_device!",
            "ember_testing::prepare",
            "real_gpu_requested",
        ];
        let mut missing = Vec::new();
        let crates = std::fs::read_dir(root().join("crates")).unwrap();
        for krate in crates.flatten() {
            let package = krate.file_name().to_string_lossy().into_owned();
            let Ok(files) = std::fs::read_dir(krate.path().join("tests")) else {
                continue;
            };
            for f in files.flatten() {
                let path = f.path();
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                if !marks.iter().any(|m| text.contains(m)) {
                    continue;
                }
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                let known = GPU_SUITES.iter().any(|&(p, t)| p == package && t == name)
                    || NOT_BUNDLED
                        .iter()
                        .any(|&(p, t, _)| p == package && t == name);
                if !known {
                    missing.push(format!("{package}/tests/{name}.rs"));
                }
            }
        }
        missing.sort();
        assert!(
            missing.is_empty(),
            "device test suites neither in GPU_SUITES nor in NOT_BUNDLED: {missing:?}"
        );
        let mut names: Vec<_> = GPU_SUITES.iter().map(|(_, t)| *t).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "two bundled suites share a name");
    }

    #[test]
    fn options_and_artifacts() {
        let o = parse(&["--arch".into(), "sm_80".into()]).unwrap();
        assert_eq!(o.arch, 80);
        assert!(parse(&["--arch".into(), "x".into()]).is_err());
        assert!(parse(&["--bogus".into()]).is_err());
        let msgs = r#"{"reason":"compiler-artifact","target":{"name":"nn","kind":["test"]},"executable":"t/nn-1"}
{"reason":"compiler-artifact","target":{"name":"ember","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"ember","kind":["bin"]},"executable":"t/ember"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            executables(msgs, &["test"]),
            vec![("nn".to_string(), PathBuf::from("t/nn-1"))]
        );
        assert_eq!(
            executables(msgs, &["bin"]),
            vec![("ember".to_string(), PathBuf::from("t/ember"))]
        );
    }
}
