//! The `ember` program as a user runs it.
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn ember(args: &[&str], emulator: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(args)
        .env_remove("EMBER_CUDA_EMULATOR")
        .env_remove("EMBER_CUDA_EMULATOR_MEMORY");
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
}

#[test]
fn unknown_subcommand_fails_with_usage() {
    let out = ember(&["frobnicate"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}
