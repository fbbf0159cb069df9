//! `ember train` with checkpoints, as a user runs it: the split seed comes from the checkpoint
//! (a conflicting `--seed` is an error), `--lr` with `--resume` is a stated override, a loss
//! that becomes NaN stops the run with an error, `--save` through a symbolic link writes its
//! target; `--amp bf16|f16` learns as f32 does, and a resumed f16 run carries the
//! `GradScaler`'s state; on the CPU and on the emulated cuda:0.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// `ember train ARGS` on `device` (`cpu`, or `cuda` on one emulated GPU).
fn train(device: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(["train", "--device", device])
        .args(args)
        .env_remove("EMBER_CUDA_EMULATOR")
        .env_remove("EMBER_CUDA_EMULATOR_MEMORY");
    if device != "cpu" {
        cmd.env("EMBER_CUDA_EMULATOR", "1");
    }
    cmd.output().unwrap()
}

fn ok_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A fresh directory for one test on one device.
fn dir(name: &str, device: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ember-train-ck-{}-{name}-{device}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Both devices: the CPU always, the emulated cuda:0 when `EMBER_CUDA_EMULATOR` is set for
/// the test run (as the emulator pass of the test suite does).
fn devices() -> Vec<&'static str> {
    let mut v = vec!["cpu"];
    if std::env::var_os("EMBER_CUDA_EMULATOR").is_some() {
        v.push("cuda");
    }
    v
}

/// Resuming takes the seed of the split from the checkpoint; a different `--seed` is an
/// error that says why, the same one is accepted.
#[test]
fn resume_takes_the_seed_from_the_checkpoint() {
    for device in devices() {
        let d = dir("seed", device);
        let ck = d.join("ck.safetensors");
        let ck = ck.to_str().unwrap();
        let straight = ok_json(&train(device, &["--json", "--epochs", "2", "--seed", "7"]));
        let first = ok_json(&train(
            device,
            &["--json", "--epochs", "1", "--seed", "7", "--save", ck],
        ));
        assert_eq!(first["seed"], 7);
        // No --seed: the checkpoint's (7), not the default (0): the same numbers as a run
        // that never stopped.
        let resumed = ok_json(&train(device, &["--json", "--epochs", "2", "--resume", ck]));
        assert_eq!(resumed["seed"], 7, "{device}");
        assert_eq!(
            resumed["val_accuracy"], straight["val_accuracy"],
            "{device}"
        );
        assert_eq!(resumed["final_loss"], straight["final_loss"], "{device}");
        // The same seed given again is fine; another one is an error naming both.
        let same = train(
            device,
            &["--json", "--epochs", "2", "--seed", "7", "--resume", ck],
        );
        assert_eq!(ok_json(&same)["seed"], 7);
        let out = train(device, &["--epochs", "2", "--seed", "3", "--resume", ck]);
        assert_eq!(out.status.code(), Some(1), "{device}");
        let err = stderr(&out);
        assert!(err.contains("--seed 3 conflicts with the seed 7"), "{err}");
        assert!(err.contains("split"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// `--lr` with `--resume` overrides the checkpoint's learning rate: said on stderr, in the
/// summary, and in the next checkpoint; without it, the checkpoint's stays.
#[test]
fn lr_with_resume_is_a_stated_override() {
    for device in devices() {
        let d = dir("lr", device);
        let ck = d.join("ck.safetensors");
        let ck = ck.to_str().unwrap();
        ok_json(&train(
            device,
            &["--json", "--epochs", "1", "--lr", "0.001", "--save", ck],
        ));
        let kept = ok_json(&train(device, &["--json", "--epochs", "2", "--resume", ck]));
        assert_eq!(kept["lr"], 0.001, "{device}");
        assert_eq!(kept["notes"].as_array().unwrap().len(), 0);
        let out = train(
            device,
            &[
                "--json", "--epochs", "2", "--lr", "0.01", "--resume", ck, "--save", ck,
            ],
        );
        let v = ok_json(&out);
        assert_eq!(v["lr"], 0.01, "{device}");
        let note = v["notes"][0].as_str().unwrap();
        assert!(
            note.contains("--lr 0.01 overrides the learning rate 0.001"),
            "{note}"
        );
        assert!(stderr(&out).contains(note), "{}", stderr(&out));
        // The checkpoint written after the override carries the new rate.
        let out = train(device, &["--json", "--epochs", "3", "--resume", ck]);
        assert_eq!(ok_json(&out)["lr"], 0.01, "{device}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// A loss that becomes NaN or infinite stops the run with a message and exit code 1, not
/// `"final_loss": null` and success.
#[test]
fn a_diverging_run_stops_with_an_error() {
    for device in devices() {
        let out = train(device, &["--json", "--epochs", "3", "--lr", "1e30"]);
        assert_eq!(out.status.code(), Some(1), "{device}: {}", stderr(&out));
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let err = stderr(&out);
        assert!(err.contains("the training loss became"), "{err}");
        assert!(err.contains("NaN") || err.contains("inf"), "{err}");
        assert!(err.contains("stopping"), "{err}");
    }
}

/// `--save` through a symbolic link writes the link's target; the link stays.
#[cfg(unix)]
#[test]
fn save_through_a_symbolic_link_writes_its_target() {
    for device in devices() {
        let d = dir("link", device);
        let target = d.join("run1.safetensors");
        let link = d.join("latest.safetensors");
        std::os::unix::fs::symlink("run1.safetensors", &link).unwrap();
        let l = link.to_str().unwrap();
        ok_json(&train(device, &["--json", "--epochs", "1", "--save", l]));
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(std::fs::metadata(&target).unwrap().len() > 0);
        let v = ok_json(&train(device, &["--json", "--epochs", "2", "--resume", l]));
        assert_eq!(v["epochs_run"], 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// The f32 run and the `--amp` runs of `args` on `device`, as JSON summaries.
fn f32_and_amp(device: &str, args: &[&str]) -> (serde_json::Value, Vec<serde_json::Value>) {
    let f32_run = ok_json(&train(device, args));
    assert_eq!(f32_run["amp"], serde_json::Value::Null);
    let amp = ["bf16", "f16"]
        .iter()
        .map(|a| {
            let v = ok_json(&train(device, &[args, &["--amp", a]].concat()));
            assert_eq!(v["amp"], *a, "{device}");
            v
        })
        .collect();
    (f32_run, amp)
}

/// The bar for `--amp`: the MLP and the CNN reach the validation accuracy of f32
/// within one percentage point, in bf16 (no scaler: `loss_scale` null) and in f16 (with a
/// scaler that started at 2^16 and, with nothing overflowing, kept it).
#[test]
fn amp_runs_learn_as_well_as_f32() {
    for device in devices() {
        // Three epochs of the CNN: after one (~75%) the runs still differ by more than a
        // point; after three (~90%) they agree within it.
        for args in [
            vec!["--json", "--epochs", "10"],
            vec!["--json", "--epochs", "3", "--model", "cnn"],
        ] {
            let (full, amp) = f32_and_amp(device, &args);
            let acc = full["val_accuracy"].as_f64().unwrap();
            for v in amp {
                let a = v["val_accuracy"].as_f64().unwrap();
                assert!(
                    (a - acc).abs() <= 0.01,
                    "{device} {args:?} --amp {}: accuracy {a} against f32's {acc}",
                    v["amp"]
                );
                let scale = &v["loss_scale"];
                if v["amp"] == "f16" {
                    assert_eq!(*scale, 65536.0, "{device}");
                    assert_eq!(v["skipped_steps"], 0, "{device}");
                } else {
                    assert_eq!(*scale, serde_json::Value::Null, "{device}");
                }
            }
        }
    }
}

/// The `scaler.*` and `amp` values of the checkpoint at `path`.
fn scaler_metadata(path: &str) -> Vec<(String, ember::Value)> {
    let ck = ember_cli::train::read_checkpoint(std::path::Path::new(path)).unwrap();
    ck.state
        .plain()
        .filter(|(k, _)| k.starts_with("scaler.") || *k == "amp")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// An f16 run stopped and resumed equals one that never stopped, scaler state included
/// (the growth tracker counts on from where it stopped); a resume in another precision,
/// and a checkpoint whose scaler state lost a key, are errors naming what is wrong.
#[test]
fn a_resumed_f16_run_carries_the_scaler() {
    for device in devices() {
        let d = dir("amp", device);
        let (a, b) = (d.join("a.safetensors"), d.join("b.safetensors"));
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        let amp = ["--json", "--amp", "f16"];
        let straight = ok_json(&train(
            device,
            &[&amp[..], &["--epochs", "3", "--save", a]].concat(),
        ));
        ok_json(&train(
            device,
            &[&amp[..], &["--epochs", "2", "--save", b]].concat(),
        ));
        let resumed = ok_json(&train(
            device,
            &[&amp[..], &["--epochs", "3", "--resume", b, "--save", b]].concat(),
        ));
        for key in ["val_accuracy", "final_loss", "loss_scale"] {
            assert_eq!(resumed[key], straight[key], "{device} {key}");
        }
        let meta = scaler_metadata(a);
        assert_eq!(meta, scaler_metadata(b), "{device}");
        let batches = straight["history"].as_array().unwrap().len() as u64
            * straight["train_samples"].as_u64().unwrap().div_ceil(64);
        let tracker = meta.iter().find(|(k, _)| k == "scaler._growth_tracker");
        assert_eq!(
            tracker.map(|(_, v)| v.clone()),
            Some(ember::Value::Int(i128::from(batches))),
            "{meta:?}"
        );
        assert!(
            meta.contains(&("amp".into(), ember::Value::Str("f16".into()))),
            "{meta:?}"
        );

        // Another precision than the checkpoint's.
        for other in [&["--amp", "bf16"][..], &[]] {
            let out = train(device, &[&["--epochs", "4", "--resume", a], other].concat());
            assert_eq!(out.status.code(), Some(1), "{device}");
            let err = stderr(&out);
            assert!(err.contains("was trained in f16, but"), "{err}");
        }
        // A scaler state without its scale: refused by the scaler's load_state_dict.
        let (tensors, mut meta) = ember::io::load_with_metadata(a, ember::Device::Cpu).unwrap();
        meta.remove("scaler.scale");
        ember::io::save_with_metadata(&tensors, &meta, a).unwrap();
        let out = train(
            device,
            &[&amp[..], &["--epochs", "4", "--resume", a]].concat(),
        );
        assert_eq!(out.status.code(), Some(1), "{device}");
        let err = stderr(&out);
        assert!(err.contains("missing key \"scale\""), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
