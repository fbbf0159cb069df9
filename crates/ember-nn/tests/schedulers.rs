#![allow(clippy::unwrap_used)]
//! Learning-rate schedulers and gradient clipping against PyTorch
//! (`reference/optim_reference.json`, made by `reference/make_optim_reference.py`).

mod common;

use common::*;

use ember_nn::Tensor;
use ember_nn::optim::{
    Adam, AdamOptions, AnnealStrategy, CosineAnnealingLR, Hyper, LrScheduler, OneCycleLR,
    OneCycleLrOptions, Optimizer, ParamGroupSpec, SGD, SgdOptions, StepLR, clip_grad_norm_,
    clip_grad_norm_opts, clip_grad_value_,
};
use ember_tensor::Device;
use serde_json::Value;

/// Two parameter groups, each with one f32 parameter, as the scheduler references use.
fn two_group_sgd() -> SGD {
    let (a, b) = (param(&[0.0], &[1], CPU), param(&[0.0], &[1], CPU));
    SGD::with_groups(
        vec![
            ParamGroupSpec::new(vec![a]),
            ParamGroupSpec::new(vec![b]).lr(0.05),
        ],
        SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Steps `sched` as the reference did and compares lr and momentum after every step.
fn check_schedule(name: &str, opt: &mut dyn Optimizer, sched: &mut dyn LrScheduler) {
    let r = &reference()["schedulers"][name];
    let (lrs, moms) = (
        r["lr"].as_array().unwrap(),
        r["momentum"].as_array().unwrap(),
    );
    for (k, (lr, mom)) in lrs.iter().zip(moms).enumerate() {
        if k > 0 {
            opt.step().unwrap();
            sched.step(opt).unwrap();
        }
        assert_eq!(sched.last_epoch(), k as i64);
        let what = format!("{name} after {k} steps");
        assert_close(
            &sched.get_last_lr(),
            &floats(lr),
            LR_TOL,
            &format!("{what}: lr"),
        );
        let group_lrs: Vec<f64> = opt.param_groups().iter().map(|g| g.lr).collect();
        assert_eq!(group_lrs, sched.get_last_lr(), "{what}: groups' lr");
        let m: Vec<f64> = opt.param_groups().iter().map(|g| g.momentum()).collect();
        assert_close(&m, &floats(mom), LR_TOL, &format!("{what}: momentum"));
    }
}

#[test]
fn step_lr_matches_pytorch() {
    let r = &reference()["schedulers"]["step_lr"];
    let mut opt = two_group_sgd();
    let step_size = r["step_size"].as_u64().unwrap() as usize;
    let mut sched = StepLR::new(&mut opt, step_size, r["gamma"].as_f64().unwrap()).unwrap();
    check_schedule("step_lr", &mut opt, &mut sched);
}

#[test]
fn cosine_annealing_lr_matches_pytorch() {
    let r = &reference()["schedulers"]["cosine_annealing_lr"];
    let mut opt = two_group_sgd();
    let t_max = r["t_max"].as_u64().unwrap() as usize;
    let mut sched =
        CosineAnnealingLR::new(&mut opt, t_max, r["eta_min"].as_f64().unwrap()).unwrap();
    check_schedule("cosine_annealing_lr", &mut opt, &mut sched);
}

#[test]
fn one_cycle_lr_matches_pytorch_and_stops_at_total_steps() {
    let r = &reference()["schedulers"]["one_cycle_lr_cos"];
    let mut opt = two_group_sgd();
    let total = r["total_steps"].as_u64().unwrap() as usize;
    let mut sched = OneCycleLR::new(
        &mut opt,
        r["max_lr"].as_f64().unwrap(),
        total,
        OneCycleLrOptions::default(),
    )
    .unwrap();
    check_schedule("one_cycle_lr_cos", &mut opt, &mut sched);
    // One step too many: PyTorch's error, and the learning rates stay.
    let before = sched.get_last_lr();
    let e = sched.step(&mut opt).unwrap_err().to_string();
    assert!(e.ends_with(r["error"].as_str().unwrap()), "{e}");
    assert_eq!(sched.get_last_lr(), before);
    assert_eq!(sched.last_epoch(), total as i64);
}

#[test]
fn one_cycle_lr_linear_three_phase_cycles_adam_beta1() {
    let r = &reference()["schedulers"]["one_cycle_lr_linear_three_phase"];
    let (a, b) = (param(&[0.0], &[1], CPU), param(&[0.0], &[1], CPU));
    let mut opt = Adam::with_groups(
        vec![
            ParamGroupSpec::new(vec![a]),
            ParamGroupSpec::new(vec![b]).lr(0.05),
        ],
        AdamOptions {
            lr: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    let options = OneCycleLrOptions {
        pct_start: r["pct_start"].as_f64().unwrap(),
        anneal_strategy: AnnealStrategy::Linear,
        three_phase: true,
        div_factor: r["div_factor"].as_f64().unwrap(),
        final_div_factor: r["final_div_factor"].as_f64().unwrap(),
        base_momentum: r["base_momentum"].as_f64().unwrap(),
        max_momentum: r["max_momentum"].as_f64().unwrap(),
        ..Default::default()
    };
    let total = r["total_steps"].as_u64().unwrap() as usize;
    let mut sched =
        OneCycleLR::with_max_lrs(&mut opt, floats(&r["max_lr"]), total, options).unwrap();
    check_schedule("one_cycle_lr_linear_three_phase", &mut opt, &mut sched);
    // beta2 is left alone.
    for g in opt.param_groups() {
        assert!(matches!(g.hyper, Hyper::Adam { betas: (_, b2), .. } if b2 == 0.999));
    }
}

#[test]
fn scheduler_errors() {
    let mut opt = two_group_sgd();
    let e = OneCycleLR::new(&mut opt, 0.1, 0, OneCycleLrOptions::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("Expected positive integer total_steps, but got 0"),
        "{e}"
    );
    let e = OneCycleLR::with_max_lrs(&mut opt, vec![0.1], 10, OneCycleLrOptions::default())
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("max_lr has 1 values, param_groups has 2"),
        "{e}"
    );
    let e = OneCycleLR::new(
        &mut opt,
        0.1,
        10,
        OneCycleLrOptions {
            pct_start: 1.5,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("Expected float between 0 and 1 pct_start, but got 1.5"),
        "{e}"
    );
    assert!(StepLR::new(&mut opt, 0, 0.1).is_err());
    assert!(CosineAnnealingLR::new(&mut opt, 0, 0.0).is_err());
    // A scheduler stepped with an optimizer of another shape.
    let mut sched = StepLR::new(&mut opt, 2, 0.1).unwrap();
    let mut other = SGD::new(vec![param(&[0.0], &[1], CPU)], SgdOptions::default()).unwrap();
    assert!(sched.step(&mut other).is_err());
}

/// A state dict's values as f64 lists, for comparing dicts.
fn values(sd: &ember_nn::StateDict) -> std::collections::BTreeMap<String, Vec<f64>> {
    sd.iter()
        .map(|(k, t)| {
            let v = t.data().to_dtype(ember_tensor::DType::F64).unwrap();
            (k.clone(), v.flatten_all().unwrap().to_vec::<f64>().unwrap())
        })
        .collect()
}

/// The scheduler kinds under test, each built on `opt` with settings picked by `variant`
/// (0: the ones whose run is saved, 1: other settings, overwritten by a load).
fn build(kind: usize, variant: usize, opt: &mut dyn Optimizer) -> Box<dyn LrScheduler> {
    let v = variant as f64;
    match kind {
        0 => Box::new(StepLR::new(opt, 2 + variant, 0.5 + v / 10.0).unwrap()),
        1 => Box::new(CosineAnnealingLR::new(opt, 3 + variant, 0.001 * (1.0 + v)).unwrap()),
        2 => Box::new(
            OneCycleLR::new(opt, 0.5 + v, 12 + variant, OneCycleLrOptions::default()).unwrap(),
        ),
        _ => Box::new(
            OneCycleLR::with_max_lrs(
                opt,
                vec![0.4, 0.2 + v],
                10 + 5 * variant,
                OneCycleLrOptions {
                    pct_start: 0.25 + v / 10.0,
                    anneal_strategy: if variant == 0 {
                        AnnealStrategy::Linear
                    } else {
                        AnnealStrategy::Cos
                    },
                    three_phase: variant == 0,
                    cycle_momentum: variant == 0,
                    ..Default::default()
                },
            )
            .unwrap(),
        ),
    }
}

/// (lr, momentum) of every group after each of `steps` steps.
fn run(opt: &mut dyn Optimizer, sched: &mut dyn LrScheduler, steps: usize) -> Vec<Vec<(f64, f64)>> {
    (0..steps)
        .map(|_| {
            opt.step().unwrap();
            sched.step(opt).unwrap();
            assert_eq!(
                sched.get_last_lr(),
                opt.param_groups().iter().map(|g| g.lr).collect::<Vec<_>>()
            );
            opt.param_groups()
                .iter()
                .map(|g| (g.lr, g.momentum()))
                .collect()
        })
        .collect()
}

#[test]
fn scheduler_state_dict_resumes_exactly() {
    for kind in 0..4 {
        // One run of 9 steps; a second that stops after 4, is saved (through a
        // safetensors file), and is resumed into objects built with other settings.
        let mut opt = two_group_sgd();
        let mut sched = build(kind, 0, &mut opt);
        let whole = run(&mut opt, sched.as_mut(), 9);

        let mut opt = two_group_sgd();
        let mut sched = build(kind, 0, &mut opt);
        run(&mut opt, sched.as_mut(), 4);
        let saved = sched.state_dict().unwrap();
        let dir = std::env::temp_dir().join(format!("ember-sched-{}-{kind}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sched.safetensors");
        let raw: Vec<(String, ember_tensor::Tensor)> =
            saved.iter().map(|(k, t)| (k.clone(), t.data())).collect();
        ember_tensor::io::save(raw.iter().map(|(k, t)| (k.as_str(), t)), &path).unwrap();
        let loaded: ember_nn::StateDict = ember_tensor::io::load(&path, CPU)
            .unwrap()
            .into_iter()
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            values(&loaded),
            values(&saved),
            "kind {kind}: file round trip"
        );
        let opt_saved = opt.state_dict().unwrap();
        // Stepping on does not change a dict already taken.
        run(&mut opt, sched.as_mut(), 1);
        assert_ne!(values(&sched.state_dict().unwrap()), values(&saved));

        let mut opt2 = two_group_sgd();
        let mut sched2 = build(kind, 1, &mut opt2);
        assert_ne!(
            values(&sched2.state_dict().unwrap()),
            values(&saved),
            "kind {kind}"
        );
        opt2.load_state_dict(&opt_saved).unwrap();
        sched2.load_state_dict(&loaded).unwrap();
        assert_eq!(
            values(&sched2.state_dict().unwrap()),
            values(&saved),
            "kind {kind}"
        );
        assert_eq!(sched2.last_epoch(), 4);
        let resumed = run(&mut opt2, sched2.as_mut(), 5);
        assert_eq!(resumed, whole[4..], "scheduler kind {kind}");
    }
}

#[test]
fn scheduler_load_state_dict_errors_leave_it_unchanged() {
    let mut opt = two_group_sgd();
    let mut step = StepLR::new(&mut opt, 2, 0.5).unwrap();
    let good = step.state_dict().unwrap();
    let keys: Vec<&str> = good.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["_last_lr", "base_lrs", "gamma", "last_epoch", "step_size"]
    );
    let check = |sched: &mut dyn LrScheduler, sd: &ember_nn::StateDict, want: &str| {
        let before = values(&sched.state_dict().unwrap());
        let e = sched.load_state_dict(sd).unwrap_err().to_string();
        assert!(e.contains(want), "{e}\nshould contain: {want}");
        assert_eq!(values(&sched.state_dict().unwrap()), before);
    };
    let scalar = |v: f64| Tensor::scalar(v, CPU).unwrap();
    let int = |v: i64| Tensor::scalar(v, CPU).unwrap();

    let mut sd = good.clone();
    sd.remove("gamma");
    sd.insert("gama".into(), scalar(0.1));
    check(&mut step, &sd, "Missing key(s)");
    check(&mut step, &sd, "\"gama\"");
    let mut sd = good.clone();
    sd.insert("step_size".into(), int(0));
    check(&mut step, &sd, "step_size must be positive, found 0");
    sd.insert("step_size".into(), scalar(2.5));
    check(&mut step, &sd, "step_size: expected a whole number");
    let mut sd = good.clone();
    sd.insert("last_epoch".into(), int(-3));
    check(&mut step, &sd, "last_epoch must be at least 0, found -3");
    let mut sd = good.clone();
    sd.insert(
        "gamma".into(),
        Tensor::from_vec(vec![0.5, 0.5], [2], CPU).unwrap(),
    );
    check(&mut step, &sd, "gamma: expected one value, found shape [2]");

    // Built for one group, loading a dict of two.
    let mut one = SGD::new(vec![param(&[0.0], &[1], CPU)], SgdOptions::default()).unwrap();
    let mut cos = CosineAnnealingLR::new(&mut one, 4, 0.0).unwrap();
    let mut sd = cos.state_dict().unwrap();
    sd.insert(
        "base_lrs".into(),
        Tensor::from_vec(vec![0.1, 0.2], [2], CPU).unwrap(),
    );
    check(&mut cos, &sd, "size mismatch for base_lrs");
    // Another kind of scheduler's dict.
    check(&mut cos, &good, "Missing key(s) in state_dict: \"T_max\"");

    let mut cycle = OneCycleLR::new(&mut opt, 0.5, 10, OneCycleLrOptions::default()).unwrap();
    let good = cycle.state_dict().unwrap();
    let mut sd = good.clone();
    sd.insert("anneal_strategy".into(), int(7));
    check(
        &mut cycle,
        &sd,
        "anneal_strategy must be 0 (cos) or 1 (linear), found 7",
    );
    let mut sd = good.clone();
    sd.insert("last_epoch".into(), int(11));
    check(&mut cycle, &sd, "last_epoch 11 is past total_steps 10");
    let mut sd = good.clone();
    sd.insert("pct_start".into(), scalar(2.0));
    check(
        &mut cycle,
        &sd,
        "Expected float between 0 and 1 pct_start, but got 2",
    );
    sd.insert("total_steps".into(), int(0));
    check(&mut cycle, &sd, "total_steps must be positive, found 0");
}

#[test]
fn clip_grad_norm_matches_pytorch() {
    let c = &reference()["clip"];
    let shapes = shapes();
    let grads: Vec<Vec<f64>> = (0..2).map(|i| floats(&c["grads"][i])).collect();
    let with_grads = |dev: Device| {
        let ps: Vec<Tensor> = shapes
            .iter()
            .map(|s| param(&vec![0.0; s.iter().product()], s, dev))
            .collect();
        for ((p, g), s) in ps.iter().zip(&grads).zip(&shapes) {
            p.set_grad(Some(&f32_tensor(g, s, dev))).unwrap();
        }
        ps
    };
    for dev in devices() {
        for case in c["cases"].as_array().unwrap() {
            let norm_type = match &case["norm_type"] {
                Value::String(s) if s == "inf" => f64::INFINITY,
                v => v.as_f64().unwrap(),
            };
            let max_norm = case["max_norm"].as_f64().unwrap();
            let ps = with_grads(dev);
            let total = clip_grad_norm_(&ps, max_norm, norm_type).unwrap();
            let what =
                format!("clip_grad_norm_(max_norm={max_norm}, norm_type={norm_type}) on {dev}");
            assert_eq!(total.dims(), Vec::<usize>::new());
            assert_eq!(total.device(), dev);
            let expected_total = case["total_norm"].as_f64().unwrap();
            assert_close(&vals(&total), &[expected_total], PARAM_TOL, &what);

            // By hand in f64: the norm of all elements, then the clamped coefficient.
            let all = grads.iter().flatten().map(|g| (*g as f32) as f64);
            let hand = if norm_type.is_infinite() {
                all.fold(0.0f64, |m, g| m.max(g.abs()))
            } else {
                all.map(|g| g.abs().powf(norm_type))
                    .sum::<f64>()
                    .powf(1.0 / norm_type)
            };
            assert_close(&[hand], &[expected_total], 1e-5, &what);
            let coef = (max_norm / (hand + 1e-6)).min(1.0);
            for (i, p) in ps.iter().enumerate() {
                let got = vals(&p.grad().unwrap());
                assert_close(&got, &floats(&case["clipped"][i]), PARAM_TOL, &what);
                let by_hand: Vec<f64> = grads[i].iter().map(|g| g * coef).collect();
                assert_close(&got, &by_hand, 1e-5, &what);
            }
        }
        // clip_grad_value_.
        let v = &c["value"];
        let ps = with_grads(dev);
        let clip = v["clip_value"].as_f64().unwrap();
        clip_grad_value_(&ps, clip).unwrap();
        for (i, p) in ps.iter().enumerate() {
            let got = vals(&p.grad().unwrap());
            // Exact, in f32 (the JSON's f64 text may parse one f64 ulp off).
            let expected: Vec<f64> = floats(&v["clipped"][i])
                .iter()
                .map(|e| (*e as f32) as f64)
                .collect();
            assert_eq!(got, expected, "clip_grad_value_");
            let by_hand: Vec<f64> = grads[i]
                .iter()
                .map(|g| ((*g as f32) as f64).clamp(-clip, clip))
                .collect();
            assert_eq!(got, by_hand);
        }
    }
}

#[test]
fn clip_grad_norm_edge_cases() {
    // No gradients: a zero norm, nothing to scale.
    let p = param(&[1.0], &[1], CPU);
    assert_eq!(
        vals(&clip_grad_norm_(std::slice::from_ref(&p), 1.0, 2.0).unwrap()),
        vec![0.0]
    );
    // A non-finite norm: NaN gradients, or an error when asked for.
    let g = Tensor::from_vec(vec![f32::INFINITY, 1.0], [2], CPU).unwrap();
    let q = param(&[0.0, 0.0], &[2], CPU);
    q.set_grad(Some(&g)).unwrap();
    let e = clip_grad_norm_opts(std::slice::from_ref(&q), 1.0, 2.0, true).unwrap_err();
    assert!(
        e.to_string()
            .contains("The total norm of order 2 for gradients from `parameters` is non-finite"),
        "{e}"
    );
    assert_eq!(vals(&q.grad().unwrap())[1], 1.0);
    let total = clip_grad_norm_(std::slice::from_ref(&q), 1.0, 2.0).unwrap();
    assert!(vals(&total)[0].is_infinite());
    assert!(vals(&q.grad().unwrap())[1] == 0.0);
}
