//! The benchmark program runs its training cases end to end, f32 and under autocast, on the
//! CPU and on the emulated `cuda:0` (so the AMP paths of `nn.rs` stay exercised on machines
//! without a GPU), with `--quick` (one timed call per case). Only the records' presence and
//! shape are checked, never their values' size: timings belong in saved results, not in
//! tests.

use std::process::Command;

use serde_json::Value;

/// `ember-bench --json --quick --device DEVICE --filter FILTER` with one emulated CUDA
/// device: its records.
fn quick_records(device: &str, filter: &str) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_ember-bench"))
        .args(["--json", "--quick", "--device", device, "--filter", filter])
        .env("EMBER_CUDA_EMULATOR", "1")
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .expect("ember-bench starts");
    assert!(
        out.status.success(),
        "ember-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON array")
}

#[test]
fn training_cases_run_f32_and_under_autocast_on_cpu_and_emulated_cuda() {
    let records = quick_records("all", "train_mlp_1000_512_10_b64");
    let find = |name: &str, device: &str| {
        records
            .iter()
            .find(|r| r["name"] == name && r["device"] == device)
            .unwrap_or_else(|| panic!("no record {name} on {device} in {records:?}"))
    };
    for (name, device, amp) in [
        ("train_mlp_1000_512_10_b64", "cpu", None),
        ("train_mlp_1000_512_10_b64_bf16", "cpu", Some("bf16")),
        ("train_mlp_1000_512_10_b64", "cuda:0", None),
        ("train_mlp_1000_512_10_b64_f16", "cuda:0", Some("f16")),
        ("train_mlp_1000_512_10_b64_bf16", "cuda:0", Some("bf16")),
    ] {
        let r = find(name, device);
        assert_eq!(r["unit"], "samples/s", "{name}");
        assert!(r["value"].as_f64().is_some_and(f64::is_finite), "{r}");
        assert_eq!(r["autocast"].as_str(), amp, "{r}");
        assert_eq!(r["quick"], true, "{r}");
        if device.starts_with("cuda") {
            assert_eq!(r["emulated"], true, "{r}");
            assert_eq!(r["batch"], 4, "{r}");
        }
    }
}

/// ResNet-18's forward case runs on the emulated `cuda:0` at its reduced size (the training
/// step takes minutes in a debug build on the emulator; it runs the same layers, each
/// tested in `ember-nn`, and is measured on a real GPU).
#[test]
fn resnet18_forward_runs_on_emulated_cuda() {
    let records = quick_records("cuda", "fwd_resnet18_b32");
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    assert_eq!(r["name"], "fwd_resnet18_b32");
    assert_eq!(r["unit"], "ms");
    assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    assert!(
        r["peak_memory_bytes"].as_u64().is_some_and(|b| b > 0),
        "{r}"
    );
    assert_eq!(r["emulated"], true, "{r}");
    assert_eq!(
        (r["batch"].as_u64(), r["image"].as_u64()),
        (Some(2), Some(32))
    );
}

/// `ember-bench --json --quick --device cpu --filter FILTER --exact`: its records and what it
/// said on stderr.
fn quick_cpu_case(name: &str) -> (Vec<Value>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember-bench"))
        .args([
            "--json", "--quick", "--device", "cpu", "--filter", name, "--exact",
        ])
        .env("RAYON_NUM_THREADS", "2")
        .env("EMBER_BENCH_RANK_THREADS", "1")
        .output()
        .expect("ember-bench starts");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "ember-bench failed: {stderr}");
    (
        serde_json::from_slice(&out.stdout).expect("a JSON array"),
        stderr,
    )
}

/// The multi-rank cases start their 2 ranks under `mpirun` and come back as the parent's
/// records; in a build without MPI support they are skipped, saying so, never faked.
#[test]
fn multi_rank_cases_run_on_two_ranks_or_say_why_not() {
    for (name, unit) in [
        ("all_reduce_mpi_1kib", "GB/s"),
        ("ddp_train_mlp_2000_1000_100_b128_2ranks", "samples/s"),
    ] {
        let (records, stderr) = quick_cpu_case(name);
        if !ember_parallel::group::mpi_built() {
            assert!(records.is_empty(), "{records:?}");
            assert!(stderr.contains("built without MPI support"), "{stderr}");
            continue;
        }
        assert_eq!(records.len(), 1, "{records:?} {stderr}");
        let r = &records[0];
        assert_eq!(
            (r["name"].as_str(), r["unit"].as_str()),
            (Some(name), Some(unit))
        );
        assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "{r}");
        assert_eq!(r["ranks"], 2, "{r}");
        assert_eq!(r["threads"], 1, "{r}");
        assert_eq!(r["quick"], true, "{r}");
        if unit == "GB/s" {
            assert_eq!(r["bytes"], 1024, "{r}");
            assert!(
                r["busbw_check_off"].as_f64().is_some_and(|v| v > 0.0),
                "{r}"
            );
        } else {
            assert_eq!(r["batch_per_rank"], 64, "{r}");
            assert!(
                r["vs_one_process"].as_f64().is_some_and(f64::is_finite),
                "{r}"
            );
        }
    }
}
