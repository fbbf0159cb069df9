//! A GPU machine whose `ember` was built without its CUDA kernels (no `cargo xtask
//! kernels`: Note [No fatbin] in `ember-kernels`), staged on the emulator with
//! `EMBER_PRETEND_NO_KERNELS=1`: `ember info` keeps CUDA available (the driver's answer, as
//! PyTorch's) and says the kernels are missing and how to build them, `ember train --device
//! auto` trains on the CPU saying why, and `--device cuda` is an error saying the same.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

const MISSING: &str = "CUDA kernels were not built: run `cargo xtask kernels --install-nvcc`";

/// `ember ARGS` on one emulated GPU, pretending the kernels were not built when `pretend`.
fn ember(args: &[&str], pretend: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(args)
        .env("EMBER_CUDA_EMULATOR", "1")
        .env_remove("EMBER_CUDA_EMULATOR_MEMORY")
        .env_remove("EMBER_PRETEND_NO_KERNELS");
    if pretend {
        cmd.env("EMBER_PRETEND_NO_KERNELS", "1");
    }
    cmd.output().unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn info_keeps_cuda_available_and_says_the_kernels_were_not_built() {
    let v = json(&ember(&["info", "--json"], true));
    assert_eq!(v["cuda_available"], true);
    assert!(v["cuda_unavailable_reason"].is_null());
    assert_eq!(v["cuda_kernels_missing"], MISSING);
    let text = String::from_utf8(ember(&["info"], true).stdout).unwrap();
    assert!(text.contains("CUDA available:   true"), "{text}");
    assert!(
        text.contains(&format!("  but:            {MISSING}")),
        "{text}"
    );
    // With the kernels (the emulator's, compiled into every build), nothing is missing.
    let v = json(&ember(&["info", "--json"], false));
    assert!(v["cuda_kernels_missing"].is_null(), "{v}");
}

#[test]
fn train_auto_trains_on_the_cpu_and_says_why() {
    let v = json(&ember(&["train", "--json", "--epochs", "1"], true));
    assert_eq!(v["device"], "cpu");
    let why = v["device_reason"].as_str().unwrap();
    assert!(
        why.starts_with("--device auto: CUDA is available") && why.contains(MISSING),
        "{why}"
    );
    assert!(why.ends_with("using the CPU"), "{why}");
}

#[test]
fn train_on_cuda_is_an_error_that_says_so() {
    let out = ember(&["train", "--device", "cuda", "--epochs", "1"], true);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--device cuda:0 was asked for, but {MISSING}")),
        "{err}"
    );
}
