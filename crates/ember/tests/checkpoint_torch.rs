#![allow(clippy::unwrap_used)]
//! A checkpoint of everything written by `ember::save` — model, optimizer, scaler and plain
//! values — read by PyTorch: `safetensors.torch.load_file` loads the model part into the
//! same `nn.Sequential` with `load_state_dict(strict=True)`, which computes Ember's output,
//! and `json.loads` reads the values in the metadata
//! (`tests/reference/load_checkpoint_in_torch.py`).
//!
//! The script needs PyTorch and safetensors: from the bench venv (`target/bench-venv`,
//! which `bench/torch_side_by_side.py` installs, as does `cargo xtask torch-venv`), or
//! `EMBER_TORCH_PYTHON`, or the system's `python3`. Where none imports them the test says it
//! skipped and why; with `EMBER_REQUIRE_TORCH=1` (CI where the venv is made) that is a
//! failure instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use ember::amp::GradScaler;
use ember::nn::{BatchNorm2d, Conv2d, Flatten, Linear, Module, ReLU, Sequential};
use ember::optim::{Adam, AdamOptions, Optimizer};
use ember::{Device, StateDict, Tensor};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A Python that imports torch and safetensors, or why there is none.
fn torch_python() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    let candidates = std::env::var_os("EMBER_TORCH_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            root().join("target/bench-venv/bin/python"),
            PathBuf::from("python3"),
        ]);
    for py in candidates {
        let out = Command::new(&py)
            .args(["-c", "import torch, safetensors.torch"])
            .output();
        match out {
            Ok(o) if o.status.success() => return Ok(py),
            Ok(o) => tried.push(format!(
                "{}: {}",
                py.display(),
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("import failed")
            )),
            Err(e) => tried.push(format!("{}: {e}", py.display())),
        }
    }
    Err(tried.join("; "))
}

#[test]
fn pytorch_reads_the_model_part_of_a_checkpoint() {
    let python = match torch_python() {
        Ok(p) => p,
        Err(why) => {
            assert!(
                std::env::var_os("EMBER_REQUIRE_TORCH").is_none(),
                "EMBER_REQUIRE_TORCH is set, but no Python imports torch and safetensors: {why}"
            );
            ember_testing::skip!(
                "no Python imports torch and safetensors ({why}); `cargo xtask torch-venv` makes target/bench-venv"
            );
        }
    };
    ember::manual_seed(0);
    let device = Device::Cpu;
    let model = Sequential::new()
        .add(Conv2d::new(1, 2, 3, ()).unwrap().padding(1))
        .add(BatchNorm2d::new(2, ()).unwrap())
        .add(ReLU::new())
        .add(Flatten::new())
        .add(Linear::new(32, 3, ()).unwrap());
    let mut opt = Adam::new(model.parameters(), AdamOptions::default()).unwrap();
    let mut scaler = GradScaler::new(device).unwrap();
    // Two steps: the running statistics, Adam's moments and the scaler have state.
    for _ in 0..2 {
        opt.zero_grad(true).unwrap();
        let x = Tensor::randn([5, 1, 4, 4], device).unwrap();
        let loss = model
            .call(&x)
            .unwrap()
            .square()
            .unwrap()
            .mean_all()
            .unwrap();
        scaler.scale(&loss).unwrap().backward().unwrap();
        scaler.step(&mut opt).unwrap();
        scaler.update().unwrap();
    }
    model.eval();
    let x = Tensor::randn([3, 1, 4, 4], device).unwrap();
    let y = model.call(&x).unwrap();

    let dir = std::env::temp_dir().join(format!("ember-ck-torch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ckpt, inputs) = (dir.join("ckpt.safetensors"), dir.join("io.safetensors"));
    let state = StateDict::new()
        .with("model", model.state_dict().unwrap())
        .with("optimizer", opt.state_dict().unwrap())
        .with("scaler", scaler.state_dict().unwrap())
        .with("epoch", 3)
        .with("config.arch", "cnn")
        .with("config.lr", 0.001);
    ember::save(&state, &ckpt).unwrap();
    ember::save(&StateDict::new().with("x", x).with("y", y), &inputs).unwrap();

    let out = Command::new(&python)
        .arg(root().join("crates/ember/tests/reference/load_checkpoint_in_torch.py"))
        .args([&ckpt, &inputs])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("PyTorch {} read the checkpoint: {v}", v["torch"]);
    assert!(v["max_abs_diff"].as_f64().unwrap() <= 1e-5, "{v}");
    let keys: Vec<String> = model
        .state_dict()
        .unwrap()
        .keys()
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(v["model_keys"], serde_json::json!(keys));
    assert_eq!(v["num_batches_tracked"], 2);
    assert_eq!(v["values"]["epoch"], 3);
    assert_eq!(v["values"]["config.arch"], "cnn");
    assert_eq!(v["values"]["config.lr"], 0.001);
    assert_eq!(v["values"]["scaler.scale"], 65536.0);
    assert_eq!(v["values"]["scaler._growth_tracker"], 2);
    assert_eq!(v["exp_avg_shape"], v["weight_shape"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
