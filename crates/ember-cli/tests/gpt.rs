//! `ember train --model gpt` and `ember generate`, as a user runs them (tiny models, a few
//! steps), and the GPT itself: its output head is the token embedding, and it is causal.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

use ember_cli::train::gpt::{Gpt, GptConfig};
use ember_device::Device;
use ember_nn::{Module, Tensor};
use ember_tensor::DType;

/// A tiny gpt: one block, width 32, context 16, 16 windows per step (12 steps per epoch
/// unless `train`'s `args` say otherwise).
const TINY: [&str; 14] = [
    "--model",
    "gpt",
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--d-model",
    "32",
    "--block-size",
    "16",
    "--batch-size",
    "16",
    "--lr",
    "0.01",
];

fn ember(args: &[&str], emulator: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(args)
        .env_remove("EMBER_CUDA_EMULATOR")
        .env_remove("EMBER_CUDA_EMULATOR_MEMORY");
    if emulator {
        cmd.env("EMBER_CUDA_EMULATOR", "1");
    }
    cmd.output().unwrap()
}

/// `ember train --json` with the tiny gpt and `args`, on `device`.
fn train(device: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["train", "--json", "--device", device];
    all.extend_from_slice(&TINY);
    all.extend_from_slice(args);
    if !args.contains(&"--steps-per-epoch") {
        all.extend_from_slice(&["--steps-per-epoch", "12"]);
    }
    let out = ember(&all, device != "cpu");
    assert!(
        out.status.success(),
        "ember {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-gpt-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn val_loss(v: &serde_json::Value, epoch: usize) -> f64 {
    v["history"][epoch]["val_loss"].as_f64().unwrap()
}

#[test]
fn training_lowers_the_validation_loss_and_reports_perplexity() {
    let v = train("cpu", &["--epochs", "2"]);
    assert_eq!(v["model"], "gpt");
    assert_eq!(v["gpt"]["n_layer"], 1);
    assert_eq!(v["gpt"]["block_size"], 16);
    let vocab = v["gpt"]["vocab_size"].as_f64().unwrap();
    // Below a uniform guess after one epoch, and lower again after the second.
    assert!(val_loss(&v, 0) < vocab.ln(), "{v}");
    assert!(val_loss(&v, 1) < val_loss(&v, 0), "{v}");
    let ppl = v["val_perplexity"].as_f64().unwrap();
    assert!((ppl - v["val_loss"].as_f64().unwrap().exp()).abs() < 1e-9 * ppl);
    assert!(v["history"][1]["val_perplexity"].as_f64().is_some());
}

#[test]
fn save_resume_and_generate() {
    let d = dir("resume");
    let ck = d.join("ck.safetensors");
    let ck = ck.to_str().unwrap();
    let straight = train("cpu", &["--epochs", "2"]);
    train("cpu", &["--epochs", "1", "--save", ck]);
    let resumed = train("cpu", &["--epochs", "2", "--resume", ck, "--save", ck]);
    assert_eq!(resumed["epochs_run"], 1);
    assert_eq!(resumed["val_loss"], straight["val_loss"]);
    assert_eq!(resumed["final_loss"], straight["final_loss"]);

    let generate = |extra: &[&str]| {
        let mut args = vec!["generate", "--checkpoint", ck, "--prompt", "The "];
        args.extend_from_slice(extra);
        stdout(&ember(&args, false))
    };
    let sampled = generate(&["--max-new-tokens", "30", "--seed", "3", "--top-k", "5"]);
    assert_eq!(sampled.trim_end_matches('\n').chars().count(), 4 + 30);
    assert!(sampled.starts_with("The "));
    assert_eq!(
        sampled,
        generate(&["--max-new-tokens", "30", "--seed", "3", "--top-k", "5"])
    );
    let greedy = generate(&["--max-new-tokens", "20", "--temperature", "0"]);
    assert_eq!(greedy.trim_end_matches('\n').chars().count(), 24);
    assert_eq!(
        greedy,
        generate(&["--max-new-tokens", "20", "--top-k", "1"])
    );
    // Longer than the context: the model reads the last block_size characters.
    let long = generate(&["--max-new-tokens", "40", "--temperature", "0"]);
    assert!(long.starts_with(greedy.trim_end_matches('\n')));

    // A character outside the vocabulary is named.
    let out = ember(
        &["generate", "--checkpoint", ck, "--prompt", "snow☃"],
        false,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("'☃'"), "{}", stderr(&out));
    // A size that differs from the checkpoint's is an error naming it.
    let args = [
        "train",
        "--device",
        "cpu",
        "--model",
        "gpt",
        "--epochs",
        "3",
        "--resume",
        ck,
        "--d-model",
        "64",
    ];
    let out = ember(&args, false);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("holds a gpt with --d-model 32"), "{e}");
}

#[test]
fn generate_names_what_is_wrong_before_any_work() {
    let d = dir("bad");
    let missing = d.join("missing.safetensors");
    let out = ember(
        &[
            "generate",
            "--checkpoint",
            missing.to_str().unwrap(),
            "--prompt",
            "a",
        ],
        false,
    );
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("--checkpoint") && e.contains("missing.safetensors"),
        "{e}"
    );
    // A checkpoint of the digits' MLP is not a text model.
    let ck = d.join("mlp.safetensors");
    let out = ember(
        &[
            "train",
            "--json",
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--save",
            ck.to_str().unwrap(),
        ],
        false,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ember(
        &[
            "generate",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--prompt",
            "a",
        ],
        false,
    );
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("mlp") && e.contains("--model gpt"), "{e}");
}

#[test]
fn model_options_belong_to_their_model() {
    let cases: [(&[&str], &str); 3] = [
        (&["--model", "gpt", "--width", "8"], "--width"),
        (&["--model", "mlp", "--n-layer", "2"], "--n-layer"),
        (
            &["--model", "gpt", "--d-model", "30", "--n-head", "4"],
            "--n-head",
        ),
    ];
    for (args, named) in cases {
        let mut all = vec!["train", "--device", "cpu"];
        all.extend_from_slice(args);
        let out = ember(&all, false);
        assert!(!out.status.success(), "{all:?}");
        assert!(stderr(&out).contains(named), "{all:?}: {}", stderr(&out));
    }
}

#[test]
fn amp_bf16_trains_the_gpt() {
    let v = train("cpu", &["--epochs", "1", "--amp", "bf16"]);
    assert!(v["val_loss"].as_f64().unwrap().is_finite(), "{v}");
    assert_eq!(v["amp"], "bf16");
}

#[test]
fn trains_on_the_emulated_gpu() {
    let v = train("cuda", &["--epochs", "1", "--steps-per-epoch", "2"]);
    assert_eq!(v["device"], "cuda:0");
    assert!(v["val_loss"].as_f64().unwrap().is_finite(), "{v}");
}

fn tiny() -> Gpt {
    ember_tensor::random::manual_seed(0);
    let cfg = GptConfig {
        vocab_size: 11,
        block_size: 8,
        n_layer: 2,
        n_head: 2,
        d_model: 16,
    };
    Gpt::new(cfg, Device::Cpu).unwrap()
}

fn ids(v: &[i64]) -> Tensor {
    Tensor::from_slice(v, [1, v.len()], DType::I64).unwrap()
}

/// The head is the token embedding: no separate weight, and its use gives the embedding
/// a gradient in rows that no input token looks up.
#[test]
fn the_output_head_is_tied_to_the_token_embedding() {
    let m = tiny();
    let names: Vec<String> = m.state_dict().unwrap().keys().cloned().collect();
    assert!(names.contains(&"wte.weight".to_string()));
    assert!(names.contains(&"h.1.attn.c_attn.weight".to_string()));
    assert!(names.contains(&"h.0.mlp.c_fc.weight".to_string()));
    assert!(
        !names.iter().any(|n| n.contains("head")),
        "a separate head weight: {names:?}"
    );
    let with_head_of_its_own = m.num_parameters() + 11 * 16;
    let sum: usize = m.parameters().iter().map(Tensor::numel).sum();
    assert_eq!(sum, m.num_parameters());
    assert!(sum < with_head_of_its_own);

    let x = ids(&[0, 1, 2, 1, 0]);
    let y = ids(&[1, 2, 1, 0, 2]).reshape([5]).unwrap();
    let logits = m.forward(&x).unwrap().reshape([5, 11]).unwrap();
    let loss = ember_nn::functional::cross_entropy(&logits, &y, ()).unwrap();
    loss.backward().unwrap();
    let g = m.wte.weight.grad().unwrap().to_vec::<f32>().unwrap();
    let row_norm = |r: usize| g[r * 16..(r + 1) * 16].iter().map(|v| v.abs()).sum::<f32>();
    // Row 7 is never looked up: only the head's use of the weight gives it a gradient.
    assert!(row_norm(7) > 0.0);
    // Row 0 is looked up and scored: both uses.
    assert!(row_norm(0) > 0.0);
}

/// Changing a later token changes no earlier position's logits.
#[test]
fn the_gpt_is_causal() {
    let m = tiny();
    let _g = ember_autograd::no_grad();
    let a = m.forward(&ids(&[3, 1, 4, 1, 5, 9, 2, 6])).unwrap();
    let b = m.forward(&ids(&[3, 1, 4, 1, 5, 9, 2, 7])).unwrap();
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| (p - q).abs() <= 1e-6);
    let earlier = 7 * 11;
    assert!(same(&a[..earlier], &b[..earlier]));
    assert!(!same(&a[earlier..], &b[earlier..]));
    let c = m.forward(&ids(&[3, 1, 4, 0, 5, 9, 2, 6])).unwrap();
    let c = c.to_vec::<f32>().unwrap();
    assert!(same(&a[..3 * 11], &c[..3 * 11]));
    assert!(!same(&a[3 * 11..4 * 11], &c[3 * 11..4 * 11]));
}
