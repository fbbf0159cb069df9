//! `ember launch --nproc-per-node 2 -- ember train`: the digits trained with
//! DistributedDataParallel on two ranks reach the single-process bar (Note [Distributed
//! training]).
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

use std::process::Command;

/// rank 0's stdout lines, their `[rank0]:` prefix removed.
fn rank0_stdout(stdout: &[u8]) -> String {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("[rank0]:"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn two_ranks_train_the_digits_to_the_single_process_bar() {
    let ember = env!("CARGO_BIN_EXE_ember");
    let out = Command::new(ember)
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "29531",
            "--",
        ])
        .args([ember, "train", "--device", "cpu", "--json"])
        .env_remove("EMBER_CUDA_EMULATOR")
        .output()
        .unwrap();
    let stdout = rank0_stdout(&out.stdout);
    assert!(
        out.status.success(),
        "ember launch failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("rank 0's JSON ({e}):\n{stdout}"));
    assert_eq!(v["world_size"], 2, "{v}");
    // The same bar as one process's default run (tests/cli.rs).
    let acc = v["val_accuracy"].as_f64().unwrap();
    assert!(acc >= 0.95, "two ranks: validation accuracy {acc}");
    // Rank 1 prints no summary of its own.
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("[rank1]: {"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The gpt under two ranks: each draws half of every step's windows from its own stream,
/// and the summary says both trained.
#[test]
fn two_ranks_train_the_gpt() {
    let ember = env!("CARGO_BIN_EXE_ember");
    let out = Command::new(ember)
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "29532",
            "--",
        ])
        .args([
            ember, "train", "--device", "cpu", "--json", "--model", "gpt",
        ])
        .args([
            "--n-layer",
            "1",
            "--n-head",
            "2",
            "--d-model",
            "32",
            "--block-size",
            "16",
        ])
        .args([
            "--batch-size",
            "16",
            "--steps-per-epoch",
            "10",
            "--epochs",
            "2",
        ])
        .env_remove("EMBER_CUDA_EMULATOR")
        .output()
        .unwrap();
    let stdout = rank0_stdout(&out.stdout);
    assert!(
        out.status.success(),
        "ember launch failed: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("rank 0's JSON ({e}):\n{stdout}"));
    assert_eq!(v["world_size"], 2, "{v}");
    let h = v["history"].as_array().unwrap();
    let loss = |i: usize| h[i]["val_loss"].as_f64().unwrap();
    assert!(loss(1) < loss(0), "{v}");
}
