#![allow(clippy::unwrap_used)]
//! Loaded optimizer and scheduler states are checked as the constructors check their
//! arguments: a corrupted checkpoint with `step = -1`, a learning rate of `inf`, a NaN
//! beta or a state of the wrong shape is an error value, on every device; the constructors
//! refuse `inf` too.

use ember_nn::optim::{
    Adam, AdamOptions, CosineAnnealingLR, LrScheduler, OneCycleLR, OneCycleLrOptions, Optimizer,
    SGD, SgdOptions, StepLR,
};
use ember_nn::{ErrorKind, StateDict, Tensor};
use ember_tensor::{DType, Device};
use ember_testing::test_device;

fn params(device: &Device) -> Vec<Tensor> {
    vec![
        Tensor::ones([2, 3], (device, DType::F32))
            .unwrap()
            .requires_grad_(true)
            .unwrap(),
        Tensor::ones([3], (device, DType::F32))
            .unwrap()
            .requires_grad_(true)
            .unwrap(),
    ]
}

/// An Adam that has stepped once (so it has per-parameter state), and its state dict.
fn stepped_adam(device: &Device) -> (Vec<Tensor>, Adam, StateDict) {
    let ps = params(device);
    let mut opt = Adam::new(ps.clone(), AdamOptions::default()).unwrap();
    let loss = ps[0]
        .sum_all()
        .unwrap()
        .add(&ps[1].sum_all().unwrap())
        .unwrap();
    loss.backward().unwrap();
    opt.step().unwrap();
    let sd = opt.state_dict().unwrap();
    (ps, opt, sd)
}

/// `sd` with `key` set to `value` (a 0-dim f64, or `value`'s own tensor).
fn with(sd: &StateDict, key: &str, value: Tensor) -> StateDict {
    let mut sd = sd.clone();
    assert!(sd.contains_key(key), "no {key} in the state dict");
    sd.insert(key.to_string(), value);
    sd
}

fn scalar(v: f64) -> Tensor {
    Tensor::scalar(v, Device::Cpu).unwrap()
}

fn adam_state_is_validated(device: &Device) {
    let (_, mut opt, sd) = stepped_adam(device);
    let before = opt.state_dict().unwrap();
    let step = |v: f32| Tensor::scalar(v, Device::Cpu).unwrap();
    let cases: Vec<(StateDict, &str)> = vec![
        (
            with(&sd, "state.0.step", step(-1.0)),
            "state.0.step: expected a whole number of steps >= 0, found -1",
        ),
        (with(&sd, "state.1.step", step(f32::NAN)), "found NaN"),
        (with(&sd, "state.1.step", step(f32::INFINITY)), "found inf"),
        (with(&sd, "state.0.step", step(1.5)), "found 1.5"),
        (
            with(&sd, "param_groups.0.lr", scalar(f64::INFINITY)),
            "Invalid learning rate: inf",
        ),
        (
            with(&sd, "param_groups.0.lr", scalar(-1.0)),
            "Invalid learning rate: -1",
        ),
        (
            with(&sd, "param_groups.0.eps", scalar(f64::NAN)),
            "Invalid epsilon value: NaN",
        ),
        (
            with(&sd, "param_groups.0.weight_decay", scalar(f64::INFINITY)),
            "Invalid weight_decay value: inf",
        ),
        (
            with(
                &sd,
                "param_groups.0.betas",
                Tensor::from_vec(vec![0.9f64, f64::NAN], [2], Device::Cpu).unwrap(),
            ),
            "Invalid beta parameter at index 1: NaN",
        ),
        (
            with(
                &sd,
                "param_groups.0.betas",
                Tensor::from_vec(vec![1.5f64, 0.9], [2], Device::Cpu).unwrap(),
            ),
            "Invalid beta parameter at index 0: 1.5",
        ),
        (
            with(
                &sd,
                "state.0.exp_avg",
                Tensor::zeros([3, 2], (device, DType::F32)).unwrap(),
            ),
            "state.0.exp_avg",
        ),
    ];
    for (bad, want) in cases {
        let e = opt.load_state_dict(&bad).unwrap_err();
        assert!(e.to_string().contains(want), "expected {want:?} in {e}");
        assert!(
            matches!(e.kind(), ErrorKind::InvalidArgument | ErrorKind::StateDict),
            "{:?}",
            e.kind()
        );
        // A refused dict leaves the optimizer as it was.
        let now = opt.state_dict().unwrap();
        for (k, v) in &before {
            assert_eq!(
                now[k.as_str()]
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec::<f64>()
                    .unwrap(),
                v.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                "{k}"
            );
        }
    }
    // The dict as saved loads, onto this device.
    opt.load_state_dict(&sd).unwrap();
    let now = opt.state_dict().unwrap();
    assert_eq!(now["state.0.step"].item::<f32>().unwrap(), 1.0);
}
test_device!(adam_state_is_validated, adam_state_is_validated);

fn sgd_state_is_validated(device: &Device) {
    let ps = params(device);
    let mut opt = SGD::new(
        ps.clone(),
        SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        },
    )
    .unwrap();
    let sd = opt.state_dict().unwrap();
    for (key, v, want) in [
        (
            "param_groups.0.lr",
            f64::INFINITY,
            "Invalid learning rate: inf",
        ),
        (
            "param_groups.0.momentum",
            f64::NAN,
            "Invalid momentum value: NaN",
        ),
        (
            "param_groups.0.dampening",
            f64::INFINITY,
            "Invalid dampening value: inf",
        ),
    ] {
        let e = opt.load_state_dict(&with(&sd, key, scalar(v))).unwrap_err();
        assert!(e.to_string().contains(want), "{key}: {e}");
    }
    opt.load_state_dict(&sd).unwrap();
}
test_device!(sgd_state_is_validated, sgd_state_is_validated);

#[test]
fn constructors_refuse_an_infinite_learning_rate() {
    let e = Adam::new(
        params(&Device::Cpu),
        AdamOptions {
            lr: f64::INFINITY,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "Adam: Invalid learning rate: inf");
    let e = SGD::new(
        params(&Device::Cpu),
        SgdOptions {
            lr: 0.1,
            weight_decay: f64::INFINITY,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "SGD: Invalid weight_decay value: inf");
    let mut opt = SGD::new(params(&Device::Cpu), SgdOptions::default()).unwrap();
    assert!(StepLR::new(&mut opt, 2, f64::NAN).is_err());
    assert!(CosineAnnealingLR::new(&mut opt, 2, f64::INFINITY).is_err());
    let e = OneCycleLR::new(&mut opt, f64::INFINITY, 10, OneCycleLrOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_lr must be finite"), "{e}");
}

#[test]
fn loaded_scheduler_states_are_validated() {
    let mut opt = SGD::new(params(&Device::Cpu), SgdOptions::default()).unwrap();
    let mut sched = StepLR::new(&mut opt, 2, 0.5).unwrap();
    sched.step(&mut opt).unwrap();
    let sd = sched.state_dict().unwrap();
    let lrs = |v: f64| Tensor::from_vec(vec![v], [1], Device::Cpu).unwrap();
    for (bad, want) in [
        (
            with(&sd, "base_lrs", lrs(f64::INFINITY)),
            "base_lrs must be finite and >= 0, found inf",
        ),
        (
            with(&sd, "_last_lr", lrs(-0.5)),
            "_last_lr must be finite and >= 0, found -0.5",
        ),
        (
            with(&sd, "gamma", scalar(f64::NAN)),
            "gamma must be finite, found NaN",
        ),
        (
            with(
                &sd,
                "last_epoch",
                Tensor::scalar(-1i64, Device::Cpu).unwrap(),
            ),
            "last_epoch must be at least 0",
        ),
    ] {
        let e = sched.load_state_dict(&bad).unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?} in {e}");
    }
    sched.load_state_dict(&sd).unwrap();
    let mut cos = CosineAnnealingLR::new(&mut opt, 4, 0.0).unwrap();
    let csd = cos.state_dict().unwrap();
    let e = cos
        .load_state_dict(&with(&csd, "eta_min", scalar(f64::INFINITY)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("eta_min must be finite"), "{e}");
    let mut one = OneCycleLR::new(&mut opt, 0.1, 10, OneCycleLrOptions::default()).unwrap();
    let osd = one.state_dict().unwrap();
    let e = one
        .load_state_dict(&with(&osd, "div_factor", scalar(0.0)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("div_factor must be finite and > 0"), "{e}");
    let e = one
        .load_state_dict(&with(&osd, "max_lr", lrs(f64::NAN)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_lr must be finite"), "{e}");
    one.load_state_dict(&osd).unwrap();
}
