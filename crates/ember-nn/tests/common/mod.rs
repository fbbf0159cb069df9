//! Helpers shared by `optim.rs` and `schedulers.rs`: the PyTorch reference, devices,
//! tensors from reference values, closeness checks.
#![allow(dead_code)]

use std::sync::OnceLock;

use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_nn::Tensor;
use ember_nn::optim::{
    Adam, AdamOptions, AdamW, AdamWOptions, Optimizer, ParamGroupSpec, SGD, SgdOptions,
};
use ember_tensor::{DType, Device};
use serde_json::Value;

pub const CPU: Device = Device::Cpu;
/// f32 parameters after up to 100 steps: PyTorch's CPU kernels fuse some multiply-adds
/// (`lerp_`, `add_` with `alpha`), Ember rounds twice, so the last bits may differ.
pub const PARAM_TOL: f64 = 1e-6;
/// Learning rates are f64 arithmetic done in the same order as PyTorch's.
pub const LR_TOL: f64 = 1e-12;

pub fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| {
        serde_json::from_str(include_str!("../reference/optim_reference.json")).unwrap()
    })
}

pub fn devices() -> Vec<Device> {
    if std::env::var_os("EMBER_GPU_TEST").is_none() {
        cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
    }
    vec![CPU, Device::Cuda(0)]
}

pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

pub fn shapes() -> Vec<Vec<usize>> {
    reference()["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| floats(s).into_iter().map(|d| d as usize).collect())
        .collect()
}

/// An f32 tensor of `values` on `dev`.
pub fn f32_tensor(values: &[f64], shape: &[usize], dev: Device) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape.to_vec(), CPU)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// A leaf parameter (f32, requires grad) of `values` on `dev`.
pub fn param(values: &[f64], shape: &[usize], dev: Device) -> Tensor {
    f32_tensor(values, shape, dev).requires_grad_(true).unwrap()
}

pub fn vals(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// `|a - e| <= tol * max(1, |e|)` elementwise.
pub fn assert_close(actual: &[f64], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tol * e.abs().max(1.0),
            "{what}[{i}]: got {a}, PyTorch {e} (diff {:e})",
            (a - e).abs()
        );
    }
}

/// The reference's initial parameters on `dev`.
pub fn init_params(dev: Device) -> Vec<Tensor> {
    let r = reference();
    shapes()
        .iter()
        .enumerate()
        .map(|(i, s)| param(&floats(&r["init"][i]), s, dev))
        .collect()
}

/// Sets the gradients of reference step `k` (none for parameter 1 on every third step
/// under the `p1_every_3rd` rule).
pub fn set_reference_grads(params: &[Tensor], k: usize, skip: Option<&str>) {
    let r = reference();
    for (i, (p, shape)) in params.iter().zip(shapes()).enumerate() {
        if skip == Some("p1_every_3rd") && i == 1 && k.is_multiple_of(3) {
            p.set_grad(None).unwrap();
        } else {
            let g = f32_tensor(&floats(&r["grads"][k][i]), &shape, p.device());
            p.set_grad(Some(&g)).unwrap();
        }
    }
}

pub fn opt_f64(o: &Value, key: &str) -> Option<f64> {
    o.get(key).and_then(Value::as_f64)
}

pub fn opt_bool(o: &Value, key: &str) -> bool {
    o.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// The optimizer a reference entry describes, over `params`.
pub fn build_optimizer(cfg: &Value, params: &[Tensor]) -> Box<dyn Optimizer> {
    let o = &cfg["options"];
    let specs: Vec<ParamGroupSpec> = match cfg["groups"].as_array() {
        None => vec![ParamGroupSpec::new(params.to_vec())],
        Some(groups) => groups
            .iter()
            .zip(params)
            .map(|(g, p)| ParamGroupSpec {
                params: vec![p.clone()],
                lr: opt_f64(g, "lr"),
                weight_decay: opt_f64(g, "weight_decay"),
                momentum: opt_f64(g, "momentum"),
            })
            .collect(),
    };
    let betas = o.get("betas").map(|b| {
        let b = floats(b);
        (b[0], b[1])
    });
    match cfg["optimizer"].as_str().unwrap() {
        "SGD" => {
            let d = SgdOptions::default();
            Box::new(
                SGD::with_groups(
                    specs,
                    SgdOptions {
                        lr: opt_f64(o, "lr").unwrap_or(d.lr),
                        momentum: opt_f64(o, "momentum").unwrap_or(d.momentum),
                        dampening: opt_f64(o, "dampening").unwrap_or(d.dampening),
                        weight_decay: opt_f64(o, "weight_decay").unwrap_or(d.weight_decay),
                        nesterov: opt_bool(o, "nesterov"),
                        maximize: opt_bool(o, "maximize"),
                    },
                )
                .unwrap(),
            )
        }
        "Adam" => {
            let d = AdamOptions::default();
            Box::new(
                Adam::with_groups(
                    specs,
                    AdamOptions {
                        lr: opt_f64(o, "lr").unwrap_or(d.lr),
                        betas: betas.unwrap_or(d.betas),
                        eps: opt_f64(o, "eps").unwrap_or(d.eps),
                        weight_decay: opt_f64(o, "weight_decay").unwrap_or(d.weight_decay),
                        amsgrad: opt_bool(o, "amsgrad"),
                        maximize: opt_bool(o, "maximize"),
                    },
                )
                .unwrap(),
            )
        }
        "AdamW" => {
            let d = AdamWOptions::default();
            Box::new(
                AdamW::with_groups(
                    specs,
                    AdamWOptions {
                        lr: opt_f64(o, "lr").unwrap_or(d.lr),
                        betas: betas.unwrap_or(d.betas),
                        eps: opt_f64(o, "eps").unwrap_or(d.eps),
                        weight_decay: opt_f64(o, "weight_decay").unwrap_or(d.weight_decay),
                        amsgrad: opt_bool(o, "amsgrad"),
                        maximize: opt_bool(o, "maximize"),
                    },
                )
                .unwrap(),
            )
        }
        other => panic!("unknown optimizer {other}"),
    }
}
