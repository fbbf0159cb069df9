#![allow(clippy::unwrap_used)]
//! `cross_entropy` with class-probability targets (a floating target of the input's shape)
//! against the f64 loops of `ember_testing::reference::cross_entropy_probs` (PyTorch's
//! `cross_entropy_loss_prob_target`): shapes `[C]`, `[N, C]`, `[N, C, d...]`, weights, label
//! smoothing, reductions, dtypes, the backward to the scores and to the target, and the
//! errors; and against PyTorch's own numbers (`reference/cross_entropy_reference.json`, made
//! by `reference/make_cross_entropy_reference.py`) for class-index and probability targets
//! with label smoothing, weights, `ignore_index`, K-dim inputs and every reduction; on every
//! device (`test_device!`: `cpu` and the emulated or real `cuda:0`).

mod common_nn;

use common_nn::*;
use ember_tensor::{CrossEntropyOptions, DType, Device, Reduction, Tensor};
use ember_testing::reference::{self, CrossEntropy};
use ember_testing::{rand_vec, test_device, values};
use serde_json::Value;

/// Random probabilities (rows summing to 1 along the class dim) of `[N, C, L]`, and a few
/// rows that do not sum to 1 (PyTorch does not check).
fn probs(n: usize, c: usize, l: usize, seed: u64) -> Vec<f64> {
    let raw: Vec<f64> = rand_vec(n * c * l, seed).iter().map(|v| v + 1.1).collect();
    let mut out = raw.clone();
    for s in 0..n {
        for p in 0..l {
            let sum: f64 = (0..c).map(|k| raw[(s * c + k) * l + p]).sum();
            let unnormalised = (s + p) % 5 == 4;
            for k in 0..c {
                let i = (s * c + k) * l + p;
                out[i] = if unnormalised { raw[i] } else { raw[i] / sum };
            }
        }
    }
    out
}

fn matches_reference_forward_and_backward(device: &Device) {
    let shapes: [&[usize]; 5] = [&[4], &[3, 4], &[2, 5, 3], &[2, 3, 2, 2], &[1, 1]];
    let mut case = 0u64;
    for shape in shapes {
        let unbatched = shape.len() == 1;
        let (n, c) = if unbatched {
            (1, shape[0])
        } else {
            (shape[0], shape[1])
        };
        let l: usize = shape.iter().skip(2).product();
        for (di, dtype) in FLOAT_DTYPES.into_iter().enumerate() {
            for (weighted, eps, red) in [
                (false, 0.0, Reduction::Mean),
                (true, 0.0, Reduction::Sum),
                (false, 0.25, Reduction::None),
                (true, 0.1, Reduction::Mean),
                (true, 1.0, Reduction::None),
            ] {
                case += 1;
                let logits: Vec<f64> = rand_vec(n * c * l, case).iter().map(|v| v * 4.0).collect();
                let x = make(&logits, shape, dtype, (case % 3) as u8, device);
                let xv = values(&x);
                let x = x.detach().requires_grad_(true).unwrap();
                let pv = probs(n, c, l, case ^ 3);
                let t = make(&pv, shape, dtype, ((case + di as u64) % 3) as u8, device);
                let tv = values(&t);
                let w = Tensor::from_vec(
                    rand_vec(c, case ^ 9).iter().map(|v| v + 1.5).collect(),
                    [c],
                    device,
                )
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
                let wv = values(&w);
                let mut o = CrossEntropyOptions::new()
                    .reduction(red)
                    .label_smoothing(eps);
                if weighted {
                    o = o.weight(&w);
                }
                let what = format!("{shape:?} {dtype} weighted {weighted} ε {eps} {red:?}");
                let loss = x.cross_entropy(&t, &o).unwrap();
                assert_eq!(loss.dtype(), dtype, "{what}");
                let want_dims: Vec<usize> = match red {
                    Reduction::None => shape
                        .iter()
                        .enumerate()
                        .filter(|&(i, _)| i != usize::from(!unbatched))
                        .map(|(_, &d)| d)
                        .collect(),
                    _ => vec![],
                };
                assert_eq!(loss.dims(), want_dims, "{what}");
                let r = CrossEntropy {
                    weight: weighted.then_some(wv.as_slice()),
                    label_smoothing: eps,
                    reduction: red,
                    ..CrossEntropy::default()
                };
                let want = reference::cross_entropy_probs(&xv, (n, c, l), &tv, &r);
                within(tol(dtype) * 4.0, 1.0, &format!("forward {what}")).assert(&loss, &want);

                let gv: Vec<f64> = rand_vec(loss.numel(), case ^ 11)
                    .iter()
                    .map(|v| v + 0.25)
                    .collect();
                let g = Tensor::from_vec(gv, loss.dims(), device)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let gv = values(&g);
                loss.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
                let dx = x.grad().unwrap();
                assert_eq!((dx.dims(), dx.dtype()), (shape.to_vec(), dtype), "{what}");
                let want = reference::cross_entropy_probs_grad(&xv, (n, c, l), &tv, &r, &gv);
                within(tol(dtype) * 8.0, 1.0, &format!("backward {what}")).assert(&dx, &want);
            }
        }
    }
}
test_device!(
    matches_reference_forward_and_backward,
    matches_reference_forward_and_backward
);

/// Known values: a one-hot target is its class index (with weights and smoothing the
/// weighted mean divides by rows, not by weights, so only unweighted means agree); the
/// gradient reaches a target that requires grad as `-(1 - ε)·w_c·logp_c`.
fn one_hot_and_target_gradient(device: &Device) {
    let x = Tensor::from_vec(vec![0.5f64, -1., 2., 1., 0., 3.], [2, 3], device).unwrap();
    let idx = Tensor::new(&[2i64, 0], device).unwrap();
    let one_hot = Tensor::from_vec(vec![0f64, 0., 1., 1., 0., 0.], [2, 3], device).unwrap();
    for eps in [0.0, 0.3] {
        for red in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            let o = CrossEntropyOptions::new()
                .reduction(red)
                .label_smoothing(eps);
            let a = x.cross_entropy(&one_hot, &o).unwrap();
            let b = x.cross_entropy(&idx, &o).unwrap();
            within(1e-12, 1.0, "one-hot = index").assert(&a, &values(&b));
        }
    }
    // Hand-computed: logits [0, ln 3] against [1/2, 1/2]: logp = [ln 1/4, ln 3/4], loss
    // = -(ln 1/4 + ln 3/4) / 2 = ln 4 - ln 3 / 2.
    let x1 = Tensor::from_vec(vec![0f64, 3f64.ln()], [2], device).unwrap();
    let half = Tensor::full([2], 0.5, (device, DType::F64)).unwrap();
    let l = x1
        .cross_entropy(&half, &CrossEntropyOptions::new())
        .unwrap();
    assert_eq!(l.dims(), Vec::<usize>::new());
    assert!((l.item::<f64>().unwrap() - (4f64.ln() - 3f64.ln() / 2.0)).abs() < 1e-12);

    let w = Tensor::new(&[1f64, 2., 0.5], device).unwrap();
    let eps = 0.2;
    let t = Tensor::from_vec(vec![0.2f64, 0.3, 0.5, 0.6, 0.4, 0.], [2, 3], device)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let o = CrossEntropyOptions::new()
        .weight(&w)
        .label_smoothing(eps)
        .reduction(Reduction::Sum);
    x.cross_entropy(&t, &o).unwrap().backward().unwrap();
    let logp = values(&x.log_softmax(1).unwrap());
    let want: Vec<f64> = (0..6)
        .map(|i| -(1.0 - eps) * [1., 2., 0.5][i % 3] * logp[i])
        .collect();
    within(1e-12, 1.0, "d loss / d target").assert(&t.grad().unwrap(), &want);
}
test_device!(one_hot_and_target_gradient, one_hot_and_target_gradient);

/// Mean over no rows is NaN (PyTorch: `fill_(NAN)`); `f16` scores with an `f32` target
/// promote as `input * target` does.
fn empty_and_promotion(device: &Device) {
    let x = Tensor::zeros([0, 3], device).unwrap();
    let l = x.cross_entropy(&x, &CrossEntropyOptions::new()).unwrap();
    assert!(l.item::<f32>().unwrap().is_nan());
    let s = x
        .cross_entropy(&x, &CrossEntropyOptions::new().reduction(Reduction::Sum))
        .unwrap();
    assert_eq!(s.item::<f32>().unwrap(), 0.0);
    let xh = Tensor::from_vec(vec![1f32, 2., 3.], [1, 3], (device, DType::F16)).unwrap();
    let t = Tensor::from_vec(vec![0f32, 0., 1.], [1, 3], device).unwrap();
    let l = xh.cross_entropy(&t, &CrossEntropyOptions::new()).unwrap();
    assert_eq!(l.dtype(), DType::F32);
    let want = reference::cross_entropy(&[1., 2., 3.], (1, 3, 1), &[2], &CrossEntropy::default());
    within(4e-3, 1.0, "f16 scores, f32 target").assert(&l, &want);
}
test_device!(empty_and_promotion, empty_and_promotion);

/// A floating target of another shape, an integer target of the input's shape, a
/// non-negative `ignore_index`, a bad weight or ε: errors naming what was expected.
fn errors(device: &Device) {
    let x = Tensor::zeros([2, 3], device).unwrap();
    let err = |t: &Tensor, o: &CrossEntropyOptions<'_>| x.cross_entropy(t, o).unwrap_err();
    let o = CrossEntropyOptions::new();
    let e = err(&Tensor::zeros([3, 2], device).unwrap(), &o);
    assert_eq!(e.kind(), ember_tensor::ErrorKind::InvalidArgument, "{e}");
    let e = e.to_string();
    assert!(
        e.contains("class probabilities shaped like the input [2, 3]") && e.contains("[3, 2]"),
        "{e}"
    );
    let e = err(&Tensor::zeros([2, 3], (device, DType::I64)).unwrap(), &o).to_string();
    assert!(
        e.contains(
            "Expected floating point type for target with class probabilities, got torch.int64"
        ),
        "{e}"
    );
    let t = Tensor::full([2, 3], 1.0 / 3.0, device).unwrap();
    let e = err(&t, &CrossEntropyOptions::new().ignore_index(0)).to_string();
    assert!(
        e.contains("ignore_index is not supported for floating point target"),
        "{e}"
    );
    let w = Tensor::ones([2], device).unwrap();
    let e = err(&t, &CrossEntropyOptions::new().weight(&w)).to_string();
    assert!(e.contains("for all 3 classes") && e.contains("[2]"), "{e}");
    let e = err(&t, &CrossEntropyOptions::new().label_smoothing(-0.1)).to_string();
    assert!(
        e.contains("label_smoothing must be between 0.0 and 1.0"),
        "{e}"
    );
    let s = Tensor::scalar(1f32, device).unwrap();
    assert!(
        s.cross_entropy(&s, &o).is_err(),
        "a 0-D input has no class dim"
    );
}
test_device!(errors, errors);

/// The cases of `reference/cross_entropy_reference.json`.
fn pytorch_cases() -> Value {
    serde_json::from_str(include_str!("reference/cross_entropy_reference.json")).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn dims(v: &Value) -> Vec<usize> {
    floats(v).into_iter().map(|d| d as usize).collect()
}

/// PyTorch's losses and gradients (to the input, and to a probability target) in f64 and
/// f32: class indices and probabilities, weights, `ignore_index` with smoothing, `[C]`,
/// `[N, C]` and `[N, C, d...]`, every reduction.
fn matches_pytorch(device: &Device) {
    let all = pytorch_cases();
    let cases = all["cases"].as_array().unwrap();
    assert_eq!(
        cases.len(),
        31,
        "the cases of make_cross_entropy_reference.py"
    );
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let shape = dims(&case["shape"]);
        let loss_shape = dims(&case["loss_shape"]);
        let probs = case["target_kind"] == "probs";
        let red = match case["reduction"].as_str().unwrap() {
            "none" => Reduction::None,
            "sum" => Reduction::Sum,
            _ => Reduction::Mean,
        };
        let eps = case["label_smoothing"].as_f64().unwrap();
        for dtype in [DType::F64, DType::F32] {
            let what = format!("{name} {dtype}");
            let rtol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
            let on = |v: Vec<f64>, d: &[usize]| {
                Tensor::from_vec(v, d.to_vec(), device)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let x = on(floats(&case["input"]), &shape)
                .requires_grad_(true)
                .unwrap();
            let t = if probs {
                on(floats(&case["target"]), &shape)
                    .requires_grad_(true)
                    .unwrap()
            } else {
                let idx: Vec<i64> = floats(&case["target"]).iter().map(|&v| v as i64).collect();
                let tdims: Vec<usize> = shape
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| shape.len() > 1 && i != 1)
                    .map(|(_, &d)| d)
                    .collect();
                Tensor::from_vec(idx, tdims, device).unwrap()
            };
            let w = (!case["weight"].is_null()).then(|| {
                let w = floats(&case["weight"]);
                let c = w.len();
                on(w, &[c])
            });
            let mut o = CrossEntropyOptions::new()
                .reduction(red)
                .label_smoothing(eps);
            if let Some(w) = &w {
                o = o.weight(w);
            }
            if let Some(i) = case["ignore_index"].as_i64() {
                o = o.ignore_index(i);
            }
            let loss = x.cross_entropy(&t, &o).unwrap();
            assert_eq!(loss.dims(), loss_shape, "{what}");
            within(rtol, 1.0, &format!("loss {what}")).assert(&loss, &floats(&case["loss"]));
            let dout = on(floats(&case["dout"]), &loss_shape);
            loss.mul(&dout)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            within(rtol, 1.0, &format!("d input {what}"))
                .assert(&x.grad().unwrap(), &floats(&case["dinput"]));
            if probs {
                within(rtol, 1.0, &format!("d target {what}"))
                    .assert(&t.grad().unwrap(), &floats(&case["dtarget"]));
            }
        }
    }
}
test_device!(matches_pytorch, matches_pytorch);
