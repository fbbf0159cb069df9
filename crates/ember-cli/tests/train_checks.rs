//! `ember train`'s checks before it trains and its messages (issue 45): a path that cannot
//! be read or written fails at once, naming its option; a file that is not a checkpoint of
//! this format says what it found in words; a negative `--lr` is refused as a value, not an
//! unknown flag; numbers print as a person reads them; a checkpoint edited in its header or
//! metadata (a dtype, the seed) is refused, not resumed.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ember(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .env_remove("EMBER_CUDA_EMULATOR")
        .env_remove("EMBER_CUDA_EMULATOR_MEMORY")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An error exit, before the run said it was training.
fn refused_before_training(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("training mlp on"), "{err}");
    assert!(!err.contains("epoch   1"), "{err}");
    err
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-train-checks-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_missing_resume_file_fails_at_once_naming_the_option() {
    let d = dir("resume");
    let missing = d.join("nope.safetensors");
    let out = ember(&["train", "--device", "cpu", "--resume", s(&missing)]);
    let err = refused_before_training(&out);
    assert!(err.contains("--resume"), "{err}");
    assert!(err.contains("nope.safetensors"), "{err}");
    assert!(err.contains("cannot read the checkpoint"), "{err}");
    // A directory is not a checkpoint either.
    let out = ember(&["train", "--device", "cpu", "--resume", s(&d)]);
    let err = refused_before_training(&out);
    assert!(
        err.contains("--resume") && err.contains("is a directory"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_save_path_in_a_missing_directory_fails_before_the_first_epoch() {
    let d = dir("save");
    let target = d.join("missing").join("ck.safetensors");
    let started = std::time::Instant::now();
    let out = ember(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "3",
        "--save",
        s(&target),
    ]);
    let err = refused_before_training(&out);
    assert!(err.contains("--save"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(!target.exists());
    eprintln!("refused in {:?}", started.elapsed());
    // A directory given as the file.
    let out = ember(&["train", "--device", "cpu", "--save", s(&d)]);
    let err = refused_before_training(&out);
    assert!(
        err.contains("--save") && err.contains("is a directory"),
        "{err}"
    );
    // Nothing left behind by the writability probe.
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_negative_lr_is_a_value_refused_in_words() {
    let out = ember(&["train", "--device", "cpu", "--lr", "-1"]);
    let err = refused_before_training(&out);
    assert!(err.contains("expected a positive --lr, found -1"), "{err}");
    assert!(!err.contains("unexpected argument"), "{err}");
    // The other numbers: clap's value error, not an unknown flag.
    let out = ember(&["train", "--device", "cpu", "--epochs", "-2"]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("invalid value '-2'"), "{err}");
}

#[test]
fn a_file_without_embers_metadata_says_what_it_lacks() {
    let d = dir("foreign");
    let path = d.join("weights.safetensors");
    let w = ember::Tensor::ones([2], ()).unwrap();
    ember::io::save_with_metadata([("w", &w)], &Default::default(), &path).unwrap();
    let out = ember(&["train", "--device", "cpu", "--resume", s(&path)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--resume"), "{err}");
    assert!(
        err.contains("its metadata has no \"format\" (expected ember-train-checkpoint-v3)"),
        "{err}"
    );
    assert!(!err.contains("None"), "{err}");
    // A checkpoint of the previous format: refused, saying why.
    let meta = [(
        "format".to_string(),
        "ember-train-checkpoint-v2".to_string(),
    )]
    .into();
    ember::io::save_with_metadata([("w", &w)], &meta, &path).unwrap();
    let err = stderr(&ember(&["train", "--device", "cpu", "--resume", s(&path)]));
    assert!(err.contains("format ember-train-checkpoint-v2"), "{err}");
    assert!(err.contains("start a new run"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn numbers_print_as_a_person_reads_them() {
    let out = ember(&["train", "--device", "cpu", "--epochs", "3", "--lr", "1e300"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the learning rate 1e300 may be too high"),
        "{err}"
    );
    assert!(!err.contains("000000000000"), "{err}");
    // A short run's time is not "0.0 s".
    let out = ember(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--batch-size",
        "512",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("done: 1 epoch(s) on cpu in "), "{text}");
    assert!(!text.contains(" in 0.0 s"), "{text}");
    assert_eq!(ember_cli::train::format_duration(0.0123), "12 ms");
    assert_eq!(ember_cli::train::format_duration(3.21), "3.2 s");
    assert_eq!(ember_cli::train::format_duration(95.4), "95 s");
    assert_eq!(ember_cli::train::show(1e300), "1e300");
    assert_eq!(ember_cli::train::show(0.002), "0.002");
    assert_eq!(ember_cli::train::show(1.5e-7), "1.5e-7");
}

/// Replaces the one occurrence of `from` in the file at `path` by `to`, of the same length:
/// the file stays well-formed, only the checksum can tell.
fn edit(path: &Path, from: &str, to: &str) {
    let mut bytes = std::fs::read(path).unwrap();
    // Searched in the bytes: the header's length before it need not be UTF-8, and a lossy
    // decoding would shift the offsets.
    let at = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from} not in the header"));
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_checkpoint_edited_in_its_header_or_metadata_is_refused() {
    let d = dir("edited");
    let ck = d.join("ck.safetensors");
    let out = ember(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--json",
        "--save",
        s(&ck),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let good = std::fs::read(&ck).unwrap();
    for (from, to, what) in [
        // An F32 tensor read as I32 (the same size): resumed on float bits as integers.
        ("\"dtype\":\"F32\"", "\"dtype\":\"I32\"", "dtype"),
        // Another seed: a new split that validates on trained samples.
        ("\"seed\":\"0\"", "\"seed\":\"1\"", "seed"),
    ] {
        std::fs::write(&ck, &good).unwrap();
        edit(&ck, from, to);
        let out = ember(&[
            "train",
            "--device",
            "cpu",
            "--epochs",
            "2",
            "--resume",
            s(&ck),
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains("checksum mismatch"), "{what}: {err}");
        assert!(err.contains("--resume"), "{what}: {err}");
    }
    // The untouched file resumes.
    std::fs::write(&ck, &good).unwrap();
    let out = ember(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--json",
        "--resume",
        s(&ck),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_dir_all(&d).unwrap();
}
