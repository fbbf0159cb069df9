#![allow(clippy::unwrap_used)]
//! Optimizers against PyTorch (`reference/optim_reference.json`, made by
//! `reference/make_optim_reference.py`), plus param groups, `zero_grad`, `state_dict` round
//! trips, hyperparameter errors, device moves and gradient accumulation. Runs go over `cpu`
//! and the emulated `cuda:0`. Schedulers and clipping are in `schedulers.rs`.

mod common;

use common::*;

use std::collections::BTreeMap;

use ember_nn::optim::{
    Adam, AdamOptions, AdamW, AdamWOptions, Hyper, Optimizer, ParamGroupSpec, SGD, SgdOptions,
};
use ember_nn::{NnError, StateDict, Tensor};
use ember_tensor::DType;

#[test]
fn optimizers_match_pytorch() {
    let r = reference();
    let optimizers = r["optimizers"].as_object().unwrap();
    assert!(optimizers.len() >= 13);
    let steps = r["grads"].as_array().unwrap().len();
    for dev in devices() {
        for (name, cfg) in optimizers {
            let params = init_params(dev);
            let mut opt = build_optimizer(cfg, &params);
            let skip = cfg["skip"].as_str();
            for k in 0..steps {
                set_reference_grads(&params, k, skip);
                opt.step().unwrap();
                if let Some(expected) = cfg["params"].get((k + 1).to_string()) {
                    for (i, p) in params.iter().enumerate() {
                        assert_eq!(p.device(), dev);
                        assert_close(
                            &vals(p),
                            &floats(&expected[i]),
                            PARAM_TOL,
                            &format!("{name} on {dev}, param {i} after {} steps", k + 1),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn param_groups_have_their_own_lr() {
    let (a, b) = (param(&[1.0, 1.0], &[2], CPU), param(&[1.0], &[1], CPU));
    let mut opt = SGD::with_groups(
        vec![
            ParamGroupSpec::new(vec![a.clone()]),
            ParamGroupSpec::new(vec![b.clone()]).lr(0.5),
        ],
        SgdOptions {
            lr: 0.25,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(opt.param_groups()[0].lr, 0.25);
    assert_eq!(opt.param_groups()[1].lr, 0.5);
    for p in [&a, &b] {
        p.set_grad(Some(&p.ones_like().unwrap())).unwrap();
    }
    opt.step().unwrap();
    // p -= lr * 1
    assert_eq!(vals(&a), vec![0.75, 0.75]);
    assert_eq!(vals(&b), vec![0.5]);
    // Changing a group's lr takes effect at the next step.
    opt.param_groups_mut()[0].lr = 0.5;
    opt.step().unwrap();
    assert_eq!(vals(&a), vec![0.25, 0.25]);
    assert_eq!(vals(&b), vec![0.0]);
    // A group added later gets the defaults, or its overrides.
    let c = param(&[2.0], &[1], CPU);
    opt.add_param_group(ParamGroupSpec::new(vec![c.clone()]).lr(1.0))
        .unwrap();
    c.set_grad(Some(&c.ones_like().unwrap())).unwrap();
    opt.step().unwrap();
    assert_eq!(vals(&c), vec![1.0]);
    // A parameter in two groups is refused.
    let e = opt
        .add_param_group(ParamGroupSpec::new(vec![a.clone()]))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("some parameters appear in more than one parameter group"),
        "{e}"
    );
    // Another family's hyperparameters in a group are refused at the step.
    opt.param_groups_mut()[1].hyper = Hyper::Adam {
        betas: (0.9, 0.999),
        eps: 1e-8,
        amsgrad: false,
        decoupled_weight_decay: false,
    };
    let e = opt.step().unwrap_err().to_string();
    assert!(e.contains("another optimizer's hyperparameters"), "{e}");
}

#[test]
fn params_without_grad_are_skipped() {
    let (a, b) = (param(&[1.0], &[1], CPU), param(&[1.0], &[1], CPU));
    let mut opt = Adam::new(vec![a.clone(), b.clone()], AdamOptions::default()).unwrap();
    a.set_grad(Some(&a.ones_like().unwrap())).unwrap();
    opt.step().unwrap();
    assert_eq!(vals(&b), vec![1.0]);
    assert!(vals(&a)[0] < 1.0);
    let sd = opt.state_dict().unwrap();
    assert!(sd.contains_key("state.0.exp_avg"));
    assert!(
        !sd.keys().any(|k| k.starts_with("state.1.")),
        "{:?}",
        sd.keys()
    );
}

#[test]
fn zero_grad_drops_or_zeroes_in_place() {
    let a = param(&[1.0, 2.0], &[2], CPU);
    let mut opt = SGD::new(vec![a.clone()], SgdOptions::default()).unwrap();
    a.mul(&a).unwrap().sum_all().unwrap().backward().unwrap();
    let g = a.grad().unwrap();
    assert_eq!(vals(&g), vec![2.0, 4.0]);
    opt.zero_grad(false).unwrap();
    // Zeroed in place: the same storage, now zero.
    assert_eq!(vals(&g), vec![0.0, 0.0]);
    assert!(a.grad().unwrap().data().shares_storage(&g.data()));
    // Backward accumulates into the zeroed gradient.
    a.mul(&a).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&a.grad().unwrap()), vec![2.0, 4.0]);
    opt.zero_grad(true).unwrap();
    assert!(a.grad().is_none());
    // A step with no gradients changes nothing.
    opt.step().unwrap();
    assert_eq!(vals(&a), vec![1.0, 2.0]);
}

#[test]
fn invalid_hyperparameters_are_errors() {
    let p = || vec![param(&[0.0], &[1], CPU)];
    let sgd = |o: SgdOptions| SGD::new(p(), o).unwrap_err().to_string();
    let adam = |o: AdamOptions| Adam::new(p(), o).unwrap_err().to_string();
    let d = SgdOptions::default();
    assert_eq!(
        sgd(SgdOptions { lr: -1.0, ..d }),
        "SGD: Invalid learning rate: -1"
    );
    assert_eq!(
        sgd(SgdOptions {
            momentum: -0.5,
            ..d
        }),
        "SGD: Invalid momentum value: -0.5"
    );
    assert_eq!(
        sgd(SgdOptions {
            weight_decay: -0.1,
            ..d
        }),
        "SGD: Invalid weight_decay value: -0.1"
    );
    let nesterov = "SGD: Nesterov momentum requires a momentum and zero dampening";
    assert_eq!(
        sgd(SgdOptions {
            nesterov: true,
            ..d
        }),
        nesterov
    );
    assert_eq!(
        sgd(SgdOptions {
            nesterov: true,
            momentum: 0.9,
            dampening: 0.1,
            ..d
        }),
        nesterov
    );
    let d = AdamOptions::default();
    assert_eq!(
        adam(AdamOptions { lr: -1.0, ..d }),
        "Adam: Invalid learning rate: -1"
    );
    assert_eq!(
        adam(AdamOptions { eps: -1e-8, ..d }),
        "Adam: Invalid epsilon value: -0.00000001"
    );
    assert_eq!(
        adam(AdamOptions {
            betas: (1.0, 0.999),
            ..d
        }),
        "Adam: Invalid beta parameter at index 0: 1"
    );
    assert_eq!(
        adam(AdamOptions {
            betas: (0.9, -0.1),
            ..d
        }),
        "Adam: Invalid beta parameter at index 1: -0.1"
    );
    assert_eq!(
        adam(AdamOptions {
            weight_decay: -1.0,
            ..d
        }),
        "Adam: Invalid weight_decay value: -1"
    );
    let e = AdamW::new(
        p(),
        AdamWOptions {
            lr: f64::NAN,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "AdamW: Invalid learning rate: NaN");
    assert!(matches!(
        e.downcast_ref::<NnError>(),
        Some(NnError::Invalid { op: "AdamW", .. })
    ));
    // Per-group overrides are checked too.
    let e = SGD::with_groups(
        vec![ParamGroupSpec::new(p()).lr(-2.0)],
        SgdOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "SGD: Invalid learning rate: -2");
    // Parameter lists.
    assert_eq!(
        SGD::new(vec![], SgdOptions::default())
            .unwrap_err()
            .to_string(),
        "SGD: optimizer got an empty parameter list"
    );
    let x = param(&[1.0], &[1], CPU);
    let y = x.mul(2.0).unwrap();
    assert_eq!(
        SGD::new(vec![y], SgdOptions::default())
            .unwrap_err()
            .to_string(),
        "SGD: can't optimize a non-leaf Tensor"
    );
    assert!(SGD::new(vec![x.clone(), x], SgdOptions::default()).is_err());
}

/// Runs `steps` reference steps (from `first`) of `opt` over `params`.
fn run_steps(opt: &mut dyn Optimizer, params: &[Tensor], first: usize, steps: usize) {
    for k in first..first + steps {
        set_reference_grads(params, k, None);
        opt.step().unwrap();
    }
}

type Make = fn(Vec<Tensor>) -> Box<dyn Optimizer>;

fn makers() -> Vec<(&'static str, Make)> {
    vec![
        ("sgd nesterov", |p| {
            Box::new(
                SGD::new(
                    p,
                    SgdOptions {
                        lr: 0.01,
                        momentum: 0.9,
                        nesterov: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        }),
        ("adam amsgrad", |p| {
            Box::new(
                Adam::new(
                    p,
                    AdamOptions {
                        lr: 0.01,
                        amsgrad: true,
                        weight_decay: 0.1,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        }),
        ("adamw", |p| {
            Box::new(
                AdamW::new(
                    p,
                    AdamWOptions {
                        lr: 0.01,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        }),
    ]
}

#[test]
fn state_dict_round_trip_continues_identically() {
    for (name, make) in makers() {
        // Uninterrupted: 20 steps.
        let params = init_params(CPU);
        let mut opt = make(params.clone());
        run_steps(opt.as_mut(), &params, 0, 20);
        let expected: Vec<Vec<f64>> = params.iter().map(vals).collect();

        // Interrupted after 10: state_dict through a safetensors file into a fresh
        // optimizer over copies of the parameters.
        let params = init_params(CPU);
        let mut opt = make(params.clone());
        run_steps(opt.as_mut(), &params, 0, 10);
        let sd = opt.state_dict().unwrap();
        let raw: BTreeMap<String, ember_tensor::Tensor> =
            sd.iter().map(|(k, v)| (k.clone(), v.data())).collect();
        let bytes = ember_tensor::io::save_to_bytes(&raw, &BTreeMap::new()).unwrap();
        let (loaded, _) = ember_tensor::io::load_from_bytes(&bytes, CPU).unwrap();
        let loaded: StateDict = loaded.into_iter().collect();
        let resumed: Vec<Tensor> = params
            .iter()
            .map(|p| (p.data().copy().unwrap()).requires_grad_(true).unwrap())
            .collect();
        // The dict is a snapshot: stepping on does not change it.
        let snapshot: Vec<Vec<f64>> = sd.values().map(vals).collect();
        run_steps(opt.as_mut(), &params, 10, 1);
        assert_eq!(
            sd.values().map(vals).collect::<Vec<_>>(),
            snapshot,
            "{name}"
        );
        drop(opt);
        let mut opt = make(resumed.clone());
        opt.load_state_dict(&loaded).unwrap();
        run_steps(opt.as_mut(), &resumed, 10, 10);
        for (p, e) in resumed.iter().zip(&expected) {
            assert_eq!(&vals(p), e, "{name}: resumed run differs");
        }
    }
}

#[test]
fn state_dict_layout() {
    let params = init_params(CPU);
    let mut opt = Adam::with_groups(
        vec![
            ParamGroupSpec::new(vec![params[0].clone()]),
            ParamGroupSpec::new(vec![params[1].clone()]).lr(0.5),
        ],
        AdamOptions {
            amsgrad: true,
            ..Default::default()
        },
    )
    .unwrap();
    run_steps(&mut opt, &params, 0, 3);
    let sd = opt.state_dict().unwrap();
    let keys: Vec<&str> = sd.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        vec![
            "param_groups.0.amsgrad",
            "param_groups.0.betas",
            "param_groups.0.decoupled_weight_decay",
            "param_groups.0.eps",
            "param_groups.0.lr",
            "param_groups.0.maximize",
            "param_groups.0.params",
            "param_groups.0.weight_decay",
            "param_groups.1.amsgrad",
            "param_groups.1.betas",
            "param_groups.1.decoupled_weight_decay",
            "param_groups.1.eps",
            "param_groups.1.lr",
            "param_groups.1.maximize",
            "param_groups.1.params",
            "param_groups.1.weight_decay",
            "state.0.exp_avg",
            "state.0.exp_avg_sq",
            "state.0.max_exp_avg_sq",
            "state.0.step",
            "state.1.exp_avg",
            "state.1.exp_avg_sq",
            "state.1.max_exp_avg_sq",
            "state.1.step",
        ]
    );
    let step = &sd["state.1.step"];
    assert_eq!(
        (step.dtype(), step.dims(), step.device()),
        (DType::F32, vec![], CPU)
    );
    assert_eq!(step.item::<f32>().unwrap(), 3.0);
    assert_eq!(sd["param_groups.1.lr"].item::<f64>().unwrap(), 0.5);
    assert_eq!(
        sd["param_groups.1.params"].to_vec::<i64>().unwrap(),
        vec![1]
    );
    assert_eq!(vals(&sd["param_groups.0.betas"]), vec![0.9, 0.999]);
    assert!(sd["param_groups.0.amsgrad"].item::<bool>().unwrap());
    assert_eq!(sd["state.0.exp_avg"].dims(), vec![3, 4]);
}

#[test]
fn load_state_dict_checks_and_changes_nothing_on_error() {
    let params = init_params(CPU);
    let mut opt = SGD::new(
        params.clone(),
        SgdOptions {
            lr: 0.01,
            momentum: 0.9,
            ..Default::default()
        },
    )
    .unwrap();
    run_steps(&mut opt, &params, 0, 2);
    let good = opt.state_dict().unwrap();
    let fresh = || {
        SGD::new(
            init_params(CPU),
            SgdOptions {
                lr: 0.5,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let load = |sd: &StateDict| {
        let mut o = fresh();
        let e = o.load_state_dict(sd).unwrap_err().to_string();
        // Nothing changed.
        assert_eq!(o.param_groups()[0].lr, 0.5);
        assert!(
            o.state_dict()
                .unwrap()
                .keys()
                .all(|k| !k.starts_with("state."))
        );
        e
    };

    let mut sd = good.clone();
    sd.insert(
        "state.0.bogus".into(),
        sd["state.0.momentum_buffer"].clone(),
    );
    let e = load(&sd);
    assert!(
        e.contains("Unexpected key(s) in state_dict: \"state.0.bogus\""),
        "{e}"
    );

    let mut sd = good.clone();
    sd.remove("param_groups.0.momentum");
    let e = load(&sd);
    assert!(
        e.contains("Missing key(s) in state_dict: \"param_groups.0.momentum\""),
        "{e}"
    );

    let mut sd = good.clone();
    sd.insert(
        "state.1.momentum_buffer".into(),
        Tensor::zeros([5], ()).unwrap(),
    );
    let e = load(&sd);
    assert!(
        e.contains("size mismatch for state.1.momentum_buffer"),
        "{e}"
    );

    let mut sd = good.clone();
    sd.insert("param_groups.1.lr".into(), sd["param_groups.0.lr"].clone());
    let e = load(&sd);
    assert!(e.contains("different number of parameter groups"), "{e}");

    let one = SGD::new(vec![param(&[0.0], &[1], CPU)], SgdOptions::default()).unwrap();
    let e = load(&one.state_dict().unwrap());
    assert!(
        e.contains("doesn't match the size of optimizer's group"),
        "{e}"
    );

    // A dict of another optimizer family: its keys are unknown here.
    let adam = Adam::new(init_params(CPU), AdamOptions::default()).unwrap();
    let e = load(&adam.state_dict().unwrap());
    assert!(
        e.contains("Missing key(s)") && e.contains("Unexpected key(s)"),
        "{e}"
    );

    // The good one loads, with its hyperparameters.
    let mut o = fresh();
    o.load_state_dict(&good).unwrap();
    assert_eq!(o.param_groups()[0].lr, 0.01);
    assert_eq!(o.param_groups()[0].momentum(), 0.9);
}

#[test]
fn optimizer_state_follows_params_to_another_device() {
    let gpu = devices()[1];
    for (name, make) in makers() {
        // All on the CPU.
        let params = init_params(CPU);
        let mut opt = make(params.clone());
        run_steps(opt.as_mut(), &params, 0, 12);
        let expected: Vec<Vec<f64>> = params.iter().map(vals).collect();

        // 5 steps on the CPU, then the parameters move (as Module::to moves them: the same
        // tensors get new data) and 7 more steps run where they now are.
        let params = init_params(CPU);
        let mut opt = make(params.clone());
        run_steps(opt.as_mut(), &params, 0, 5);
        for p in &params {
            p.set_data(&p.data().to_device(gpu).unwrap());
        }
        run_steps(opt.as_mut(), &params, 5, 7);
        for (p, e) in params.iter().zip(&expected) {
            assert_eq!(p.device(), gpu);
            assert_close(&vals(p), e, PARAM_TOL, name);
        }
        // The state moved with them.
        for (k, t) in opt.state_dict().unwrap() {
            if k.starts_with("state.") && !k.ends_with(".step") {
                assert_eq!(t.device(), gpu, "{name}: {k}");
            }
        }
    }
}

#[test]
fn loaded_state_goes_to_the_params_device_and_dtype() {
    let gpu = devices()[1];
    let params = init_params(CPU);
    let mut opt = Adam::new(params.clone(), AdamOptions::default()).unwrap();
    run_steps(&mut opt, &params, 0, 2);
    let sd = opt.state_dict().unwrap();
    let on_gpu: Vec<Tensor> = params
        .iter()
        .map(|p| {
            (p.data().to((gpu, DType::F64)).unwrap())
                .requires_grad_(true)
                .unwrap()
        })
        .collect();
    let mut opt = Adam::new(on_gpu, AdamOptions::default()).unwrap();
    opt.load_state_dict(&sd).unwrap();
    for (k, t) in opt.state_dict().unwrap() {
        if k.starts_with("state.") {
            if k.ends_with(".step") {
                assert_eq!((t.device(), t.dtype()), (CPU, DType::F32), "{k}");
            } else {
                assert_eq!((t.device(), t.dtype()), (gpu, DType::F64), "{k}");
            }
        }
    }
    // Loading does not alias the dict: stepping leaves it as it was.
    let before = vals(&sd["state.0.exp_avg"]);
    opt.param_groups()[0].params[0]
        .set_grad(Some(&Tensor::ones([3, 4], (gpu, DType::F64)).unwrap()))
        .unwrap();
    opt.step().unwrap();
    assert_eq!(vals(&sd["state.0.exp_avg"]), before);
}

#[test]
fn gradient_accumulation_equals_full_batch() {
    // y = x w on 8 rows; loss = mean((x w - y_true)^2).
    let xs: Vec<f64> = (0..24).map(|i| ((i * 7 % 11) as f64 - 5.0) / 4.0).collect();
    let ys: Vec<f64> = (0..8).map(|i| (i as f64 - 3.5) / 2.0).collect();
    let x = Tensor::from_vec(xs, [8, 3], CPU)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let y = Tensor::from_vec(ys, [8, 1], CPU)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let loss = |w: &Tensor, x: &Tensor, y: &Tensor| {
        x.matmul(w)
            .unwrap()
            .sub(y)
            .unwrap()
            .square()
            .unwrap()
            .mean_all()
            .unwrap()
    };
    let w0 = [0.5, -0.25, 1.0];
    let sgd = |w: &Tensor| {
        SGD::new(
            vec![w.clone()],
            SgdOptions {
                lr: 0.1,
                momentum: 0.9,
                ..Default::default()
            },
        )
        .unwrap()
    };

    let full = param(&w0, &[3, 1], CPU);
    let mut opt = sgd(&full);
    loss(&full, &x, &y).backward().unwrap();
    opt.step().unwrap();

    // 4 micro-batches of 2 rows, each loss / 4, gradients accumulated, one step.
    let acc = param(&w0, &[3, 1], CPU);
    let mut opt = sgd(&acc);
    for i in 0..4 {
        let (xb, yb) = (
            x.narrow(0, 2 * i, 2).unwrap(),
            y.narrow(0, 2 * i, 2).unwrap(),
        );
        loss(&acc, &xb, &yb).div(4.0).unwrap().backward().unwrap();
    }
    assert_close(
        &vals(&acc.grad().unwrap()),
        &vals(&full.grad().unwrap()),
        1e-6,
        "accumulated gradient",
    );
    opt.step().unwrap();
    assert_close(&vals(&acc), &vals(&full), 1e-6, "weights after the step");
    // And the step did something.
    assert!(
        vals(&full)
            .iter()
            .zip(w0)
            .any(|(a, b)| (a - b).abs() > 1e-3)
    );
}
