#![allow(clippy::unwrap_used)]
//! `GradScaler` against PyTorch (`reference/scaler_reference.json`, made by
//! `reference/make_scaler_reference.py`), its errors (each leaves the scaler unchanged), its
//! state dict, the pass-through when disabled, and the fused unscale op underneath
//! (`_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`): values, every float
//! dtype, non-contiguous and large gradients, and one CUDA launch per device and dtype. Each
//! runs on `cpu` and the emulated `cuda:0`.

use std::sync::OnceLock;

use ember_amp::scaler::{GradScaler, GradScalerOptions, STATE_KEYS};
use ember_autograd::{ErrorKind, Result};
use ember_nn::optim::{Optimizer, SGD, SgdOptions, clip_grad_norm_};
use ember_nn::{StateDict, Tensor, Value as V};
use ember_tensor::{DType, Device, Tensor as Raw};
use ember_testing::test_device;
use serde_json::Value;

fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| {
        serde_json::from_str(include_str!("reference/scaler_reference.json")).unwrap()
    })
}

/// A reference number: a JSON number or "inf", "-inf", "nan".
fn num(v: &Value) -> f32 {
    match v.as_str() {
        Some("inf") => f32::INFINITY,
        Some("-inf") => f32::NEG_INFINITY,
        Some("nan") => f32::NAN,
        _ => v.as_f64().unwrap() as f32,
    }
}

fn nums(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(num).collect()
}

fn f32_param(values: Vec<f32>, shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_vec(values, shape.to_vec(), dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

fn scalar_loss(dev: &Device) -> Tensor {
    Tensor::from_vec(vec![1f32], Vec::<usize>::new(), dev).unwrap()
}

fn sgd(params: &[Tensor], lr: f64, momentum: f64) -> SGD {
    SGD::new(
        params.to_vec(),
        SgdOptions {
            lr,
            momentum,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The reference sequence: growth every 3 clean steps, backoff and skipped steps on injected
/// inf/NaN, `unscale_` + `clip_grad_norm_` + `step`, and `update(new_scale)`. Scales and
/// growth trackers exactly, skip decisions exactly, parameters to 1e-6.
fn matches_pytorch(dev: &Device) -> Result<()> {
    let r = reference();
    let shapes: Vec<Vec<usize>> = r["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| nums(s).into_iter().map(|d| d as usize).collect())
        .collect();
    let params: Vec<Tensor> = r["init_params"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&shapes)
        .map(|(v, s)| f32_param(nums(v), s, dev))
        .collect();
    let mut opt = sgd(
        &params,
        r["lr"].as_f64().unwrap(),
        r["momentum"].as_f64().unwrap(),
    );
    let mut scaler = GradScaler::with_options(
        *dev,
        GradScalerOptions {
            init_scale: r["init_scale"].as_f64().unwrap(),
            growth_factor: r["growth_factor"].as_f64().unwrap(),
            backoff_factor: r["backoff_factor"].as_f64().unwrap(),
            growth_interval: r["growth_interval"].as_i64().unwrap(),
            enabled: true,
        },
    )?;
    let max_norm = r["max_norm"].as_f64().unwrap();
    let (mut skipped, mut grew, mut clipped) = (0, 0, 0);
    for (k, step) in r["steps"].as_array().unwrap().iter().enumerate() {
        let scaled = scaler.scale(&scalar_loss(dev))?;
        assert_eq!(
            f64::from(scaled.item::<f32>()?),
            step["scale_before"].as_f64().unwrap(),
            "step {k}: scale"
        );
        for ((p, g), s) in params
            .iter()
            .zip(step["grads"].as_array().unwrap())
            .zip(&shapes)
        {
            p.set_grad(Some(&Tensor::from_vec(nums(g), s.clone(), dev)?))?;
        }
        if step["mode"] == "clip" {
            scaler.unscale_(&mut opt)?;
            clip_grad_norm_(&params, max_norm, 2.0)?;
            clipped += 1;
        }
        let stepped = scaler.step(&mut opt)?;
        assert_eq!(
            stepped,
            step["stepped"].as_bool().unwrap(),
            "step {k}: stepped"
        );
        skipped += usize::from(!stepped);
        let before = scaler.get_scale()?;
        match step["new_scale"].as_f64() {
            Some(s) => scaler.update_with(s)?,
            None => scaler.update()?,
        }
        grew += usize::from(stepped && scaler.get_scale()? > before);
        assert_eq!(
            scaler.get_scale()?,
            step["scale_after"].as_f64().unwrap(),
            "step {k}: scale after update"
        );
        assert_eq!(
            scaler.get_growth_tracker()?,
            step["growth_tracker_after"].as_i64().unwrap(),
            "step {k}: growth tracker"
        );
        for (i, (p, want)) in params
            .iter()
            .zip(step["params_after"].as_array().unwrap())
            .enumerate()
        {
            let got = p.to_vec::<f32>()?;
            for (j, (a, b)) in got.iter().zip(nums(want)).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6,
                    "step {k}: param {i}[{j}] is {a}, PyTorch's {b}"
                );
            }
        }
    }
    // The sequence exercises what it claims to.
    assert!(
        skipped >= 3 && grew >= 3 && clipped >= 3,
        "{skipped} {grew} {clipped}"
    );
    // The final state has PyTorch's keys and values.
    let want = r["state_dict"].as_object().unwrap();
    let got = scaler.state_dict()?;
    assert_eq!(got.len(), want.len());
    for (k, v) in want {
        match got.value(k).unwrap() {
            V::Float(x) => assert_eq!(*x, v.as_f64().unwrap(), "{k}"),
            V::Int(x) => assert_eq!(*x, i128::from(v.as_i64().unwrap()), "{k}"),
            other => panic!("{k} is {other:?}"),
        }
    }
    Ok(())
}
test_device!(scaler_matches_pytorch, matches_pytorch);

/// One parameter with gradient `g` (already scaled), its optimizer and a scaler that has
/// scaled a loss.
fn one_param_setup(dev: &Device, g: Vec<f32>) -> (Tensor, SGD, GradScaler) {
    let p = f32_param(vec![1.0; g.len()], &[g.len()], dev);
    let opt = sgd(std::slice::from_ref(&p), 0.5, 0.0);
    let mut scaler = GradScaler::new(*dev).unwrap();
    scaler.scale(&scalar_loss(dev)).unwrap();
    let n = g.len();
    p.set_grad(Some(&Tensor::from_vec(g, [n], dev).unwrap()))
        .unwrap();
    (p, opt, scaler)
}

fn unscale_twice_is_an_error(dev: &Device) -> Result<()> {
    let (p, mut opt, mut scaler) = one_param_setup(dev, vec![65536.0, 131072.0]);
    scaler.unscale_(&mut opt)?;
    assert_eq!(p.grad().unwrap().to_vec::<f32>()?, vec![1.0, 2.0]);
    let e = scaler.unscale_(&mut opt).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.to_string().contains(
            "unscale_() has already been called on this optimizer since the last update()"
        ),
        "{e}"
    );
    // Unchanged: the gradients were not divided again, and step/update go on.
    assert_eq!(p.grad().unwrap().to_vec::<f32>()?, vec![1.0, 2.0]);
    assert!(scaler.step(&mut opt)?);
    assert_eq!(p.to_vec::<f32>()?, vec![0.5, 0.0]);
    let e = scaler.step(&mut opt).unwrap_err();
    assert!(
        e.to_string().contains("step() has already been called"),
        "{e}"
    );
    let e = scaler.unscale_(&mut opt).unwrap_err();
    assert!(e.to_string().contains("after step()"), "{e}");
    scaler.update()?;
    assert_eq!(scaler.get_scale()?, 65536.0);
    assert_eq!(scaler.get_growth_tracker()?, 1);
    Ok(())
}
test_device!(unscale_twice, unscale_twice_is_an_error);

fn step_without_scale_is_an_error(dev: &Device) -> Result<()> {
    let p = f32_param(vec![1.0, 2.0], &[2], dev);
    let mut opt = sgd(std::slice::from_ref(&p), 0.5, 0.0);
    p.set_grad(Some(&Tensor::from_vec(vec![1f32, 1.], [2], dev)?))?;
    let mut scaler = GradScaler::new(*dev)?;
    for e in [
        scaler.step(&mut opt).unwrap_err(),
        scaler.unscale_(&mut opt).unwrap_err(),
        scaler.update().unwrap_err(),
    ] {
        assert!(
            e.to_string()
                .contains("did not use scaler.scale(loss or outputs)"),
            "{e}"
        );
    }
    // Nothing moved, and the scale was not made.
    assert_eq!(p.to_vec::<f32>()?, vec![1.0, 2.0]);
    assert_eq!(p.grad().unwrap().to_vec::<f32>()?, vec![1.0, 1.0]);
    assert_eq!(scaler.get_scale()?, 65536.0);
    // A scaled loss, but an optimizer without gradients: no inf checks recorded.
    p.set_grad(None)?;
    scaler.scale(&scalar_loss(dev))?;
    let e = scaler.step(&mut opt).unwrap_err();
    assert!(
        e.to_string()
            .contains("No inf checks were recorded for this optimizer"),
        "{e}"
    );
    let e = scaler.update().unwrap_err();
    assert!(
        e.to_string()
            .contains("No inf checks were recorded prior to update"),
        "{e}"
    );
    assert_eq!(scaler.get_scale()?, 65536.0);
    Ok(())
}
test_device!(step_without_scale, step_without_scale_is_an_error);

/// A scaler for one device with a loss or gradients on the other: an error, nothing changed.
fn other_device_is_an_error(dev: &Device) -> Result<()> {
    let other = if dev.is_cpu() {
        Device::Cuda(0)
    } else {
        Device::Cpu
    };
    let mut scaler = GradScaler::new(*dev)?;
    let e = scaler.scale(&scalar_loss(&other)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DeviceMismatch);
    scaler.scale(&scalar_loss(dev))?;
    let here = f32_param(vec![1.0], &[1], dev);
    let there = f32_param(vec![1.0], &[1], &other);
    here.set_grad(Some(&Tensor::from_vec(vec![65536f32], [1], dev)?))?;
    there.set_grad(Some(&Tensor::from_vec(vec![65536f32], [1], other)?))?;
    let mut opt = sgd(&[here.clone(), there.clone()], 0.5, 0.0);
    let e = scaler.step(&mut opt).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DeviceMismatch);
    assert!(
        e.to_string().contains("make one GradScaler per device"),
        "{e}"
    );
    // Neither gradient was unscaled, the optimizer did not step, and the scaler still works
    // with an optimizer on its own device.
    assert_eq!(here.grad().unwrap().to_vec::<f32>()?, vec![65536.0]);
    assert_eq!(there.grad().unwrap().to_vec::<f32>()?, vec![65536.0]);
    assert_eq!(here.to_vec::<f32>()?, vec![1.0]);
    let mut mine = sgd(std::slice::from_ref(&here), 0.5, 0.0);
    assert!(scaler.step(&mut mine)?);
    assert_eq!(here.to_vec::<f32>()?, vec![0.5]);
    scaler.update()?;
    Ok(())
}
test_device!(other_device, other_device_is_an_error, [cuda]);

fn state(pairs: &[(&str, V)]) -> StateDict {
    pairs
        .iter()
        .fold(StateDict::new(), |d, (k, v)| d.with(*k, v.clone()))
}

/// A state dict's plain values, in order.
fn values(d: &StateDict) -> Vec<(String, V)> {
    d.plain().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn state_dict_round_trip_and_errors(dev: &Device) -> Result<()> {
    let (_p, mut opt, mut scaler) = one_param_setup(dev, vec![1.0]);
    scaler.set_growth_interval(5)?;
    scaler.step(&mut opt)?;
    scaler.update()?;
    let sd = scaler.state_dict()?;
    // PyTorch's keys, as plain values (PyTorch's are Python numbers), no tensors.
    assert_eq!(
        sd.plain().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        STATE_KEYS
    );
    assert_eq!(sd.keys().count(), 0);
    assert_eq!(sd.value("scale"), Some(&V::Float(65536.0)));
    assert_eq!(sd.value("_growth_tracker"), Some(&V::Int(1)));
    assert_eq!(sd.value("growth_interval"), Some(&V::Int(5)));

    // Loaded into a fresh scaler (before its first scale) and into a running one.
    let mut fresh = GradScaler::new(*dev)?;
    fresh.load_state_dict(&sd)?;
    assert_eq!(values(&fresh.state_dict()?), values(&sd));
    fresh.scale(&scalar_loss(dev))?;
    assert_eq!(values(&fresh.state_dict()?), values(&sd));
    let other = state(&[
        ("scale", V::Float(8.0)),
        ("growth_factor", V::Float(4.0)),
        ("backoff_factor", V::Float(0.25)),
        ("growth_interval", V::Int(3)),
        ("_growth_tracker", V::Int(2)),
    ]);
    scaler.load_state_dict(&other)?;
    assert_eq!(values(&scaler.state_dict()?), values(&other));
    assert_eq!(scaler.get_growth_factor(), 4.0);
    assert_eq!(scaler.get_backoff_factor(), 0.25);
    assert_eq!(scaler.get_growth_interval(), 3);

    // Bad states: an error each, and the scaler keeps `other`.
    let mut missing = other.clone();
    missing.remove_value("_growth_tracker");
    let unknown = other.clone().with("scale_", 1.0);
    let bad = |k: &str, v: V| other.clone().with(k, v);
    let tensor_unknown = other
        .clone()
        .with("extra", Tensor::scalar(1f32, Device::Cpu)?);
    for (case, s, needle) in [
        ("empty", StateDict::new(), "source state dict is empty"),
        ("unknown tensor", tensor_unknown, "unexpected key \"extra\""),
        (
            "string",
            bad("scale", V::Str("big".into())),
            "must be a number, but is \"big\"",
        ),
        ("missing", missing, "missing key \"_growth_tracker\""),
        ("unknown", unknown, "unexpected key \"scale_\""),
        ("negative scale", bad("scale", V::Float(-1.0)), "scale"),
        ("nan scale", bad("scale", V::Float(f64::NAN)), "scale"),
        (
            "growth",
            bad("growth_factor", V::Float(0.5)),
            "growth factor",
        ),
        (
            "backoff",
            bad("backoff_factor", V::Float(1.5)),
            "backoff factor",
        ),
        (
            "interval",
            bad("growth_interval", V::Int(0)),
            "growth interval",
        ),
        (
            "float interval",
            bad("growth_interval", V::Float(2.0)),
            "integer",
        ),
        (
            "tracker",
            bad("_growth_tracker", V::Int(7)),
            "_growth_tracker",
        ),
    ] {
        let e = scaler.load_state_dict(&s).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::StateDict, "{case}: {e}");
        assert!(e.to_string().contains(needle), "{case}: {e}");
        assert_eq!(values(&scaler.state_dict()?), values(&other), "{case}");
    }
    // The numbers as 0-dim tensors (how a checkpoint may keep them) load too.
    let as_tensors = StateDict::new()
        .with("scale", Tensor::scalar(16f32, Device::Cpu)?)
        .with("growth_factor", Tensor::scalar(2f64, Device::Cpu)?)
        .with("backoff_factor", Tensor::scalar(0.5f64, Device::Cpu)?)
        .with("growth_interval", Tensor::scalar(9i64, Device::Cpu)?)
        .with("_growth_tracker", Tensor::scalar(1i64, Device::Cpu)?);
    scaler.load_state_dict(&as_tensors)?;
    assert_eq!(scaler.get_scale()?, 16.0);
    assert_eq!(scaler.get_growth_interval(), 9);
    scaler.load_state_dict(&other)?;
    // Setters refuse what the constructor refuses.
    assert!(scaler.set_growth_factor(1.0).is_err());
    assert!(scaler.set_backoff_factor(0.0).is_err());
    assert!(scaler.set_growth_interval(-1).is_err());
    assert!(
        GradScaler::with_options(
            *dev,
            GradScalerOptions {
                init_scale: f64::INFINITY,
                ..Default::default()
            }
        )
        .is_err()
    );
    Ok(())
}
test_device!(state_dict, state_dict_round_trip_and_errors);

fn disabled_is_a_pass_through(dev: &Device) -> Result<()> {
    let p = f32_param(vec![1.0], &[1], dev);
    let mut opt = sgd(std::slice::from_ref(&p), 0.5, 0.0);
    let mut scaler = GradScaler::with_options(
        *dev,
        GradScalerOptions {
            enabled: false,
            ..Default::default()
        },
    )?;
    assert!(!scaler.is_enabled());
    let loss = p.mul(&p)?.sum_all()?;
    let scaled = scaler.scale(&loss)?;
    assert_eq!(scaled.item::<f32>()?, 1.0);
    scaled.backward()?;
    // A non-finite gradient is not looked at: the step is taken.
    scaler.unscale_(&mut opt)?;
    scaler.unscale_(&mut opt)?;
    assert!(scaler.step(&mut opt)?);
    assert_eq!(p.to_vec::<f32>()?, vec![0.0]);
    scaler.update()?;
    scaler.update_with(3.0)?;
    assert_eq!(scaler.get_scale()?, 1.0);
    assert!(scaler.state_dict()?.is_empty());
    scaler.load_state_dict(&StateDict::new())?;
    Ok(())
}
test_device!(disabled, disabled_is_a_pass_through);

/// The op under `unscale_`, against a plain reference, for every float dtype (each dtype's
/// kernel runs on the emulator), with non-contiguous, empty, and large (parallel) tensors.
fn fused_unscale_values(dev: &Device) -> Result<()> {
    let found = Raw::zeros([], dev)?;
    let inv = Raw::scalar(0.25f32, dev)?;
    let f32s = Raw::from_slice(&[4f32, -8., 1e-3, 3e38], [4], dev)?;
    let f64s = Raw::from_slice(&[4f64, 1e300], [2], dev)?;
    let f16s = Raw::from_slice(&[4f32, 6e4, -2.0], [3], dev)?.to_dtype(DType::F16)?;
    let bf16s = Raw::from_slice(&[4f32, 1e30], [2], dev)?.to_dtype(DType::Bf16)?;
    // A transposed (non-contiguous) view: written back through the view.
    let base = Raw::from_slice(&[1f32, 2., 3., 4., 5., 6.], [2, 3], dev)?;
    let t = base.t()?;
    let empty = Raw::zeros([0], dev)?;
    let bf16_before = bf16s.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let all = [
        f32s.clone(),
        f64s.clone(),
        f16s.clone(),
        bf16s.clone(),
        t,
        empty,
    ];
    Raw::amp_foreach_non_finite_check_and_unscale_(&all, &found, &inv)?;
    assert_eq!(found.item::<f32>()?, 0.0);
    assert_eq!(f32s.to_vec::<f32>()?, vec![1.0, -2.0, 2.5e-4, 7.5e37]);
    assert_eq!(f64s.to_vec::<f64>()?, vec![1.0, 2.5e299]);
    assert_eq!(
        f16s.to_dtype(DType::F32)?.to_vec::<f32>()?,
        vec![1.0, 15000.0, -0.5]
    );
    assert_eq!(
        bf16s.to_dtype(DType::F32)?.to_vec::<f32>()?,
        // A power-of-two scale is exact in bf16.
        bf16_before.iter().map(|v| v * 0.25).collect::<Vec<_>>()
    );
    assert_eq!(base.to_vec::<f32>()?, vec![0.25, 0.5, 0.75, 1.0, 1.25, 1.5]);

    // Non-finite values of each dtype set found_inf; it is never cleared by a clean pass.
    for bad in [
        Raw::from_slice(&[1f32, f32::NAN], [2], dev)?,
        Raw::from_slice(&[f64::NEG_INFINITY], [1], dev)?,
        Raw::from_slice(&[f32::INFINITY], [1], dev)?.to_dtype(DType::F16)?,
        Raw::from_slice(&[f32::NAN], [1], dev)?.to_dtype(DType::Bf16)?,
    ] {
        let found = Raw::zeros([], dev)?;
        let clean = Raw::from_slice(&[2f32], [1], dev)?;
        Raw::amp_foreach_non_finite_check_and_unscale_(&[clean.clone(), bad], &found, &inv)?;
        assert_eq!(found.item::<f32>()?, 1.0);
        assert_eq!(clean.to_vec::<f32>()?, vec![0.5]);
        Raw::amp_foreach_non_finite_check_and_unscale_(&[clean], &found, &inv)?;
        assert_eq!(found.item::<f32>()?, 1.0);
    }

    // Large enough for the CPU's parallel loop (and several CUDA blocks): one inf far in.
    let n = 100_000;
    let mut v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    v[n - 7] = f32::INFINITY;
    let big = Raw::from_slice(&v, [n], dev)?;
    let small = Raw::from_slice(&[8f32], [1], dev)?;
    let found = Raw::zeros([], dev)?;
    Raw::amp_foreach_non_finite_check_and_unscale_(&[small.clone(), big.clone()], &found, &inv)?;
    assert_eq!(found.item::<f32>()?, 1.0);
    let got = big.to_vec::<f32>()?;
    assert_eq!(got[n - 8], (n - 8) as f32 * 0.25);
    assert_eq!(got[12345], 12345.0 * 0.25);
    assert_eq!(small.to_vec::<f32>()?, vec![2.0]);

    // Bad arguments.
    let e = Raw::amp_foreach_non_finite_check_and_unscale_(
        std::slice::from_ref(&small),
        &Raw::zeros([2], dev)?,
        &inv,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("found_inf must be a 1-element tensor"),
        "{e}"
    );
    let ints = Raw::from_slice(&[1i64], [1], dev)?;
    assert!(Raw::amp_foreach_non_finite_check_and_unscale_(&[ints], &found, &inv).is_err());
    Ok(())
}
test_device!(fused_unscale, fused_unscale_values);

/// `_amp_update_scale_` directly: growth capped at f32's range, backoff, tracker.
fn update_scale_values(dev: &Device) -> Result<()> {
    let scale = Raw::scalar(3e38f32, dev)?;
    let tracker = Raw::scalar(0i32, dev)?;
    let clean = Raw::zeros([], dev)?;
    let inf = Raw::scalar(1f32, dev)?;
    scale.amp_update_scale_(&tracker, &clean, 2.0, 0.5, 1)?;
    // 6e38 overflows f32: the scale stays, the tracker resets.
    assert_eq!((scale.item::<f32>()?, tracker.item::<i32>()?), (3e38, 0));
    scale.amp_update_scale_(&tracker, &inf, 2.0, 0.5, 1)?;
    assert_eq!((scale.item::<f32>()?, tracker.item::<i32>()?), (1.5e38, 0));
    scale.amp_update_scale_(&tracker, &clean, 2.0, 0.5, 3)?;
    assert_eq!((scale.item::<f32>()?, tracker.item::<i32>()?), (1.5e38, 1));
    let e = scale
        .amp_update_scale_(&scale, &clean, 2.0, 0.5, 3)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("growth_tracker must be a torch.int32 tensor"),
        "{e}"
    );
    Ok(())
}
test_device!(update_scale, update_scale_values);

/// On CUDA, `unscale_` launches one kernel per dtype for all gradients of the device (not
/// one per parameter) without making the host wait, and `update` one scale-update kernel.
fn one_launch_per_device_and_dtype(dev: &Device) -> Result<()> {
    use ember_device::driver::emulator::{thread_host_waits, thread_launch_counts};
    if ember_testing::real_gpu_requested() {
        ember_testing::skip!("counts the emulator's launches (the real driver keeps no count)");
    }
    let mut params = Vec::new();
    for i in 0..6 {
        let p = f32_param(vec![1.0; 3 + i], &[3 + i], dev);
        p.set_grad(Some(&Tensor::from_vec(
            vec![65536f32; 3 + i],
            [3 + i],
            dev,
        )?))?;
        params.push(p);
    }
    for i in 0..4 {
        let p = Tensor::from_vec(vec![1f32; 2 + i], [2 + i], dev)?
            .to_dtype(DType::Bf16)?
            .requires_grad_(true)?;
        p.set_grad(Some(
            &Tensor::from_vec(vec![65536f32; 2 + i], [2 + i], dev)?.to_dtype(DType::Bf16)?,
        ))?;
        params.push(p);
    }
    let mut opt = sgd(&params, 0.5, 0.0);
    let mut scaler = GradScaler::new(*dev)?;
    scaler.scale(&scalar_loss(dev))?;
    let before = thread_launch_counts();
    let waits_before: u64 = thread_host_waits().values().sum();
    scaler.unscale_(&mut opt)?;
    let after = thread_launch_counts();
    // Nothing in `unscale_` makes the host wait for the device: the address table is copied
    // from pinned memory, `found_inf` and `1 / scale` are made on the device.
    let waits: u64 = thread_host_waits().values().sum::<u64>() - waits_before;
    assert_eq!(waits, 0, "host waits in unscale_");
    let launched =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    assert_eq!(launched("amp_unscale_f32"), 1);
    assert_eq!(launched("amp_unscale_bf16"), 1);
    let unscale_launches: u64 = after
        .iter()
        .filter(|(k, _)| k.starts_with("amp_unscale"))
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0))
        .sum();
    assert_eq!(unscale_launches, 2);
    for p in &params {
        let g = p.grad().unwrap().to_dtype(DType::F32)?.to_vec::<f32>()?;
        assert!(g.iter().all(|&x| x == 1.0), "{g:?}");
    }
    assert!(scaler.step(&mut opt)?);
    let before = thread_launch_counts();
    scaler.update()?;
    let after = thread_launch_counts();
    assert_eq!(
        after.get("amp_update_scale_f32").copied().unwrap_or(0)
            - before.get("amp_update_scale_f32").copied().unwrap_or(0),
        1
    );
    Ok(())
}
test_device!(
    one_launch_per_dtype,
    one_launch_per_device_and_dtype,
    [cuda]
);

/// `unscale_` refuses f16 gradients, as PyTorch ("Attempting to unscale FP16 gradients."),
/// and leaves them as they were.
fn f16_gradients_are_refused(dev: &Device) -> Result<()> {
    let p = Tensor::from_vec(vec![1f32], [1], dev)?
        .to_dtype(DType::F16)?
        .requires_grad_(true)?;
    p.set_grad(Some(
        &Tensor::from_vec(vec![2f32], [1], dev)?.to_dtype(DType::F16)?,
    ))?;
    let mut opt = sgd(std::slice::from_ref(&p), 0.5, 0.0);
    let mut scaler = GradScaler::new(*dev)?;
    scaler.scale(&scalar_loss(dev))?;
    let e = scaler.unscale_(&mut opt).unwrap_err();
    assert!(
        e.to_string()
            .contains("Attempting to unscale FP16 gradients"),
        "{e}"
    );
    assert_eq!(
        p.grad().unwrap().to_dtype(DType::F32)?.to_vec::<f32>()?,
        vec![2.0]
    );
    Ok(())
}
test_device!(f16_gradients, f16_gradients_are_refused);

/// `scale` is differentiable: the gradient of `scale(loss)` is `scale` times the loss's.
fn scale_is_differentiable(dev: &Device) -> Result<()> {
    let w = f32_param(vec![3.0], &[1], dev);
    let mut scaler = GradScaler::with_options(
        *dev,
        GradScalerOptions {
            init_scale: 1024.0,
            ..Default::default()
        },
    )?;
    // d(1024 * w^2)/dw = 2048 w.
    scaler.scale(&w.mul(&w)?.sum_all()?)?.backward()?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![6144.0]);
    let mut opt = sgd(std::slice::from_ref(&w), 0.1, 0.0);
    scaler.unscale_(&mut opt)?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![6.0]);
    Ok(())
}
test_device!(scale_differentiable, scale_is_differentiable);

#[test]
fn optimizer_is_object_safe_here() {
    // `step` takes `&mut dyn Optimizer` as training loops hold it.
    let p = f32_param(vec![1.0], &[1], &Device::Cpu);
    let mut opt: Box<dyn Optimizer> = Box::new(sgd(std::slice::from_ref(&p), 0.5, 0.0));
    let mut scaler = GradScaler::new(Device::Cpu).unwrap();
    scaler.scale(&scalar_loss(&Device::Cpu)).unwrap();
    p.set_grad(Some(
        &Tensor::from_vec(vec![65536f32], [1], Device::Cpu).unwrap(),
    ))
    .unwrap();
    assert!(scaler.step(opt.as_mut()).unwrap());
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.5]);
}
