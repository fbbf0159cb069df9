//! The `ember` program as a user runs it.
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn ember(args: &[&str], emulator: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(args)
        .env_remove("EMBER_CUDA_EMULATOR")
        .env_remove("EMBER_CUDA_EMULATOR_MEMORY")
        .env_remove("EMBER_CUDA_EMULATOR_CUDNN")
        .env_remove("EMBER_CUDA_EMULATOR_CUPTI");
    if let Some(n) = emulator {
        cmd.env("EMBER_CUDA_EMULATOR", n);
    }
    cmd.output().unwrap()
}

fn info_json(emulator: Option<&str>) -> serde_json::Value {
    let out = ember(&["info", "--json"], emulator);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn info_json_has_the_documented_keys() {
    let v = info_json(None);
    for key in [
        "cuda_available",
        "cuda_unavailable_reason",
        "device_count",
        "devices",
        "cpu",
        "memory",
    ] {
        assert!(v.get(key).is_some(), "missing key {key} in {v}");
    }
    assert!(v["cpu"]["cores"].as_u64().unwrap() >= 1);
    assert!(v["cpu"]["features"].is_array());
    let cpu_mem = &v["memory"]["cpu"];
    assert!(cpu_mem["allocated_bytes.all.current"].is_i64(), "{cpu_mem}");
    assert!(cpu_mem["num_ooms"].is_i64(), "{cpu_mem}");
    // Without the emulator this machine (and CI) has no usable CUDA; a real GPU would make
    // these differ, and then the reason must be null.
    let available = v["cuda_available"].as_bool().unwrap();
    assert_eq!(available, v["cuda_unavailable_reason"].is_null());
    assert_eq!(
        v["device_count"].as_u64().unwrap() as usize,
        v["devices"].as_array().unwrap().len()
    );
}

#[test]
fn info_lists_two_emulated_devices() {
    let v = info_json(Some("2"));
    assert_eq!(v["cuda_available"], true);
    assert!(v["cuda_unavailable_reason"].is_null());
    assert_eq!(v["cuda_driver"], "emulator");
    assert_eq!(v["device_count"], 2);
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["emulated"], true);
        assert!(
            d["name"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("emulat")
        );
        assert!(d["total_memory"].as_u64().unwrap() > 0);
        assert_eq!(d["compute_capability"].as_array().unwrap().len(), 2);
        assert!(d["multi_processor_count"].as_u64().unwrap() > 0);
    }
    assert!(v["memory"]["cuda:1"].is_object(), "{}", v["memory"]);
    // The emulator serves cuDNN's convolution calls.
    assert_eq!(v["conv"]["path"], "cudnn", "{}", v["conv"]);
    assert_eq!(v["conv"]["cudnn_version"], 90100);
    assert_eq!(v["conv"]["allow_tf32"], true);
    assert_eq!(v["conv"]["benchmark"], false);
    assert_eq!(v["conv"]["cudnn_api"], "emulated");
    // The profiler's device times: the (emulated) CUPTI activity records.
    let timing = v["profiler_device_timing"].as_str().unwrap();
    assert!(
        timing.starts_with("CUPTI activity records") && timing.contains("emulator"),
        "{timing}"
    );
    assert!(info_json(None)["profiler_device_timing"].is_null());
    // The host clock of the profiler: the time-stamp counter where the CPU vouches for it
    // (or the OS clock is slow beside a constant-rate one), the OS clock when asked for.
    let clock = v["profiler_clock"].as_str().unwrap();
    assert!(["tsc", "monotonic"].contains(&clock), "{clock}");
    assert_eq!(clock, ember_device::trace::clock::source());
    let why = v["profiler_clock_reason"].as_str().unwrap();
    assert!(!why.is_empty());
    let forced = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["info", "--json"])
        .env("EMBER_TRACE_CLOCK", "monotonic")
        .output()
        .unwrap();
    let forced: serde_json::Value = serde_json::from_slice(&forced.stdout).unwrap();
    assert_eq!(forced["profiler_clock"], "monotonic");
    assert_eq!(
        forced["profiler_clock_reason"],
        "EMBER_TRACE_CLOCK=monotonic"
    );
}

#[test]
fn info_says_which_conv_path_runs_and_why() {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["info", "--json"])
        .env("EMBER_CUDA_EMULATOR", "1")
        .env("EMBER_CUDA_EMULATOR_CUDNN", "0")
        .env("EMBER_CUDA_EMULATOR_CUPTI", "0")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Without CUPTI the profiler falls back to events, and says why.
    let timing = v["profiler_device_timing"].as_str().unwrap();
    assert!(
        timing.starts_with("CUDA events") && timing.contains("EMBER_CUDA_EMULATOR_CUPTI=0"),
        "{timing}"
    );
    assert_eq!(v["conv"]["path"], "im2col", "{}", v["conv"]);
    let why = v["conv"]["reason"].as_str().unwrap();
    assert!(why.contains("EMBER_CUDA_EMULATOR_CUDNN"), "{why}");
    assert!(v["conv"]["cudnn_version"].is_null());
    let text = ember(&["info"], Some("1"));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("conv2d on CUDA:   cuDNN (cuDNN 9.1.0)"),
        "{text}"
    );
    assert!(
        text.contains("profiler (CUDA):  CUPTI activity records"),
        "{text}"
    );
    assert!(info_json(None)["conv"].is_null());
}

#[test]
fn info_text_says_why_cuda_is_missing() {
    let out = ember(&["info"], None);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("CUDA available:"), "{text}");
    if text.contains("CUDA available:   false") {
        assert!(text.contains("why not:"), "{text}");
    }
    assert!(text.contains("cpu"), "{text}");
}

#[test]
fn info_text_shows_emulated_devices() {
    let out = ember(&["info"], Some("2"));
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("cuda:0") && text.contains("cuda:1"), "{text}");
    assert!(text.contains("(emulated)"), "{text}");
}

#[test]
fn a_bad_emulator_setting_is_reported_not_a_crash() {
    let out = ember(&["info", "--json"], Some("two"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cuda_available"], false);
    let why = v["cuda_unavailable_reason"].as_str().unwrap();
    assert!(why.contains("EMBER_CUDA_EMULATOR"), "{why}");
    let ignored = v["ignored_settings"].as_array().unwrap();
    assert_eq!(ignored.len(), 1, "{ignored:?}");
    // The text report says so on a line of its own, for each malformed value.
    for bad in ["abc", "-1", "100000"] {
        let out = ember(&["info"], Some(bad));
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("ignored setting:"))
            .unwrap_or_else(|| panic!("{bad}: {text}"));
        assert!(
            line.contains("EMBER_CUDA_EMULATOR") && line.contains("ignored"),
            "{line}"
        );
    }
}

#[test]
fn unknown_subcommand_fails_with_usage() {
    let out = ember(&["frobnicate"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}

fn train_json(args: &[&str], emulator: Option<&str>) -> serde_json::Value {
    let mut all = vec!["train", "--json"];
    all.extend_from_slice(args);
    let out = ember(&all, emulator);
    assert!(
        out.status.success(),
        "ember {all:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn train_json_has_the_documented_keys_and_learns() {
    let v = train_json(&["--epochs", "3", "--device", "cpu"], None);
    // The keys are those docs/cli.md's table documents, no more and no fewer.
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md")).unwrap();
    let table = doc.split("### `ember train --json`").nth(1).unwrap();
    let documented: std::collections::BTreeSet<String> = table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .flat_map(|row| {
            row.split('|')
                .nth(1)
                .unwrap_or("")
                .split(',')
                .map(str::trim)
        })
        .map(|k| k.trim_matches('`').to_string())
        .collect();
    let found: std::collections::BTreeSet<String> =
        v.as_object().unwrap().keys().cloned().collect();
    assert_eq!(found, documented, "ember train --json against docs/cli.md");
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["epochs"], 3);
    assert_eq!(
        v["train_samples"].as_u64().unwrap() + v["val_samples"].as_u64().unwrap(),
        1797
    );
    let acc = v["val_accuracy"].as_f64().unwrap();
    assert!(
        (0.85..=1.0).contains(&acc),
        "val accuracy after 3 epochs: {acc}"
    );
    let hist = v["history"].as_array().unwrap();
    assert!(
        hist[2]["train_loss"].as_f64().unwrap() < hist[0]["train_loss"].as_f64().unwrap(),
        "{v}"
    );
    assert!(v["peak_memory_bytes"].as_u64().unwrap() > 0);
    assert!(v["samples_per_sec"].as_f64().unwrap() > 0.0);
}

/// The bar: the MLP in its default settings reaches 95% validation accuracy.
#[test]
fn train_defaults_reach_95_percent() {
    let v = train_json(&[], None);
    assert_eq!(v["model"], "mlp");
    let acc = v["val_accuracy"].as_f64().unwrap();
    assert!(acc >= 0.95, "default run: validation accuracy {acc}");
}

#[test]
fn train_auto_says_why_it_uses_the_cpu() {
    let v = train_json(&["--epochs", "1"], None);
    assert_eq!(v["device"], "cpu");
    let why = v["device_reason"].as_str().unwrap();
    assert!(why.contains("CUDA is not available"), "{why}");
    let out = ember(&["train", "--device", "cuda:0", "--epochs", "1"], None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CUDA is not available"), "{err}");
    let out = ember(&["train", "--device", "tpu"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tpu"));
}

/// `--width N` sets the cnn's channels (N, then 2N): its parameter count and `width` in
/// the JSON say so; the MLP reports no width.
#[test]
fn train_cnn_width_sets_its_channels() {
    let v = train_json(
        &[
            "--epochs", "1", "--model", "cnn", "--width", "8", "--device", "cpu",
        ],
        None,
    );
    assert_eq!(v["width"], 8);
    // conv 1→8 (3×3, bias), conv 8→16, linear 16·2·2→10.
    assert_eq!(
        v["parameters"],
        8 * 9 + 8 + 16 * 8 * 9 + 16 + 16 * 4 * 10 + 10
    );
    assert!(v["samples_per_sec"].as_f64().unwrap() > 0.0);
    let v = train_json(&["--epochs", "1", "--device", "cpu"], None);
    assert!(v["width"].is_null(), "{v}");
}

#[test]
fn train_runs_the_cnn_on_the_emulated_gpu() {
    let v = train_json(
        &["--epochs", "1", "--model", "cnn", "--device", "cuda"],
        Some("1"),
    );
    assert_eq!(v["device"], "cuda:0");
    assert_eq!(v["model"], "cnn");
    assert!(v["final_loss"].as_f64().unwrap().is_finite());
    let acc = v["val_accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc));
}

/// Stopping after epoch 2 and resuming gives the same numbers as never stopping
/// (Note [Resumable training]).
#[test]
fn a_resumed_run_matches_an_uninterrupted_one() {
    let dir = std::env::temp_dir().join(format!("ember-train-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("digits.safetensors");
    let ck = ckpt.to_str().unwrap();
    let straight = train_json(&["--epochs", "3", "--device", "cpu"], None);
    let first = train_json(&["--epochs", "2", "--device", "cpu", "--save", ck], None);
    assert_eq!(first["epochs_run"], 2);
    let resumed = train_json(&["--epochs", "3", "--device", "cpu", "--resume", ck], None);
    assert_eq!(resumed["epochs_run"], 1);
    assert_eq!(resumed["final_loss"], straight["final_loss"]);
    assert_eq!(resumed["val_accuracy"], straight["val_accuracy"]);
    // A checkpoint of another model, or one already at the asked epoch, is refused.
    let out = ember(
        &["train", "--epochs", "3", "--model", "cnn", "--resume", ck],
        None,
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds a mlp model"));
    let out = ember(&["train", "--epochs", "2", "--resume", ck], None);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds 2 epoch(s)"));
    // A truncated checkpoint is an error, not a crash.
    let bytes = std::fs::read(&ckpt).unwrap();
    std::fs::write(&ckpt, &bytes[..bytes.len() / 2]).unwrap();
    let out = ember(&["train", "--epochs", "3", "--resume", ck], None);
    assert!(!out.status.success());
    assert_eq!(out.status.code(), Some(1));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--profile DIR`: steps 4–6 recorded, one TensorBoard trace, the memory timeline, and the
/// top-10 table sorted by device time on CUDA (CPU time on the CPU), in the JSON summary and
/// printed (Note [Profiling a run]).
#[test]
fn train_profile_writes_a_trace_a_timeline_and_the_table() {
    for (device, emulator) in [("cpu", None), ("cuda", Some("1"))] {
        let dir =
            std::env::temp_dir().join(format!("ember-cli-profile-{}-{device}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let d = dir.to_str().unwrap();
        let v = train_json(
            &["--epochs", "1", "--device", device, "--profile", d],
            emulator,
        );
        let p = &v["profile"];
        assert_eq!(p["steps"], serde_json::json!([4, 5, 6]), "{p}");
        assert_eq!(p["dir"], d);
        let traces = p["traces"].as_array().unwrap();
        assert_eq!(traces.len(), 1, "{p}");
        let trace = traces[0].as_str().unwrap();
        assert!(
            trace.ends_with(".pt.trace.json") && trace.starts_with(d),
            "{trace}"
        );
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(trace).unwrap()).unwrap();
        let names: Vec<&str> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        for step in ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"] {
            assert_eq!(names.iter().filter(|n| **n == step).count(), 1, "{step}");
        }
        assert!(!names.contains(&"ProfilerStep#3") && !names.contains(&"ProfilerStep#7"));
        assert_eq!(
            names
                .iter()
                .filter(|n| **n == "Optimizer.step#Adam.step")
                .count(),
            3
        );
        let kernels = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "kernel")
            .count();
        assert_eq!(
            kernels > 0,
            device == "cuda",
            "{kernels} kernels on {device}"
        );
        let page = std::fs::read_to_string(p["memory_timeline"].as_str().unwrap()).unwrap();
        assert!(page.contains("<svg") && page.contains("class=\"series\""));
        let sort = if device == "cuda" {
            "cuda_time_total"
        } else {
            "cpu_time_total"
        };
        assert_eq!(p["sort_by"], sort);
        let table = p["table"].as_str().unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[1].contains("Name") && lines[1].contains("# of Calls"),
            "{table}"
        );
        assert_eq!(lines[1].contains("Self CUDA"), device == "cuda", "{table}");
        assert_eq!(
            lines.len(),
            3 + 10 + 2 + usize::from(device == "cuda"),
            "{table}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    // Printed, without --json.
    let dir = std::env::temp_dir().join(format!("ember-cli-profile-{}-text", std::process::id()));
    let out = ember(
        &[
            "train",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--profile",
            dir.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("profile of steps [4, 5, 6] (sorted by cpu_time_total):"),
        "{text}"
    );
    assert!(text.contains("Self CPU time total: "), "{text}");
    assert!(text.contains("memory timeline: "), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn info_says_whether_nccl_is_usable() {
    let v = info_json(Some("2"));
    assert_eq!(v["nccl"]["available"], true, "{}", v["nccl"]);
    assert_eq!(v["nccl"]["version"], 22304);
    assert_eq!(v["nccl"]["reason"], "2.23.4 (emulated)");
    let text = ember(&["info"], Some("2"));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("NCCL:             2.23.4 (emulated)"),
        "{text}"
    );
    // Without the emulator: a machine with a GPU and NCCL reports it; otherwise why not.
    let v = info_json(None);
    let nccl = &v["nccl"];
    assert_eq!(
        nccl["available"].as_bool().unwrap(),
        nccl["version"].is_i64(),
        "{nccl}"
    );
    if nccl["available"] == false {
        assert!(
            nccl["reason"].as_str().unwrap().contains("NCCL")
                || nccl["reason"].as_str().unwrap().contains("CUDA"),
            "{nccl}"
        );
        let text = ember(&["info"], None);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("NCCL:             not available ("), "{text}");
    }
}
