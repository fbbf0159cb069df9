#![allow(clippy::unwrap_used)]
//! Modules, layers and losses against naive f64 references, on `cpu` and the emulated
//! `cuda:0`: parameter names, device moves, state_dict, train/eval, the device error.

use ember_autograd::{GradcheckOptions, gradcheck};
use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_nn::layers::{
    BatchNorm1d, BatchNorm2d, Conv2d, Conv2dConfig, Dropout, Embedding, Flatten, LayerNorm, Linear,
    MaxPool2d, ReLU, Sequential,
};
use ember_nn::loss::{BCEWithLogitsLoss, CrossEntropyLoss, Loss, MSELoss};
use ember_nn::{Module, NnError, StateDict, Tensor};
use ember_tensor::{DType, Device};

/// The random generators are process-wide, as PyTorch's: every test here draws from them
/// (layer initialisation, dropout, randn), and one checks that a seed reproduces a layer, so
/// the tests take turns rather than draw between another test's seed and its draws.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn devices() -> Vec<Device> {
    if std::env::var_os("EMBER_GPU_TEST").is_none() {
        cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
    }
    vec![Device::Cpu, Device::Cuda(0)]
}

/// Deterministic values in `[lo, hi)` (a small LCG keyed by `seed`).
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed ^ 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

fn tensor(v: Vec<f64>, shape: &[usize], dtype: DType, d: Device) -> Tensor {
    Tensor::from_vec(v, shape, d)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

fn mlp(d: Device) -> Sequential {
    Sequential::new()
        .add(Linear::new(4, 8, d).unwrap())
        .add(ReLU::new())
        .add(Dropout::new(0.5).unwrap())
        .add(Linear::new(8, 3, d).unwrap())
}

#[test]
fn parameters_have_pytorch_names_and_the_model_prints_like_pytorch() {
    let _rng = rng_lock();
    let m = mlp(Device::Cpu);
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "3.weight", "3.bias"]);
    assert_eq!(m.num_parameters(), 4 * 8 + 8 + 8 * 3 + 3);
    assert!(
        m.parameters()
            .iter()
            .all(|p| p.requires_grad() && p.is_leaf())
    );
    assert_eq!(
        m.describe(),
        "Sequential(\n  (0): Linear(in_features=4, out_features=8, bias=True)\n  (1): ReLU()\n  (2): Dropout(p=0.5, inplace=False)\n  (3): Linear(in_features=8, out_features=3, bias=True)\n)"
    );
    let bn = Sequential::new().add(BatchNorm1d::new(3, ()).unwrap());
    let bufs: Vec<String> = bn.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        bufs,
        ["0.running_mean", "0.running_var", "0.num_batches_tracked"]
    );
}

#[test]
fn linear_matches_a_naive_reference_and_pytorch_init_bounds() {
    let _rng = rng_lock();
    for d in devices() {
        ember_tensor::random::manual_seed(7);
        let l = Linear::new(5, 3, (d, DType::F64)).unwrap();
        let w = l.weight.to_vec::<f64>().unwrap();
        let b = l.bias.as_ref().unwrap().to_vec::<f64>().unwrap();
        let bound = 1.0 / 5f64.sqrt();
        assert!(w.iter().chain(&b).all(|v| v.abs() <= bound));
        assert!(
            w.iter().any(|v| v.abs() > bound / 2.0),
            "weights spread over the bound"
        );
        let xv = values(2 * 5, 1, -1.0, 1.0);
        let x = tensor(xv.clone(), &[2, 5], DType::F64, d);
        let y = l.forward(&x).unwrap().to_vec::<f64>().unwrap();
        let mut want = vec![0.0; 6];
        for r in 0..2 {
            for o in 0..3 {
                want[r * 3 + o] = b[o] + (0..5).map(|i| xv[r * 5 + i] * w[o * 5 + i]).sum::<f64>();
            }
        }
        close(&y, &want, 1e-12);
        // Same seed, same parameters.
        ember_tensor::random::manual_seed(7);
        let again = Linear::new(5, 3, (d, DType::F64)).unwrap();
        assert_eq!(again.weight.to_vec::<f64>().unwrap(), w);
    }
}

#[test]
fn to_moves_parameters_buffers_and_grads_in_place() {
    let _rng = rng_lock();
    devices();
    let m = Sequential::new()
        .add(Linear::new(4, 2, ()).unwrap())
        .add(BatchNorm1d::new(2, ()).unwrap());
    let held = m.parameters();
    let x = Tensor::randn([3, 4], ()).unwrap();
    m.forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = held[0].grad().unwrap().to_vec::<f32>().unwrap();
    m.to(Device::Cuda(0)).unwrap();
    for t in held.iter().chain(&m.buffers()) {
        assert_eq!(t.device(), Device::Cuda(0));
    }
    assert_eq!(held[0].grad().unwrap().device(), Device::Cuda(0));
    assert_eq!(held[0].grad().unwrap().to_vec::<f32>().unwrap(), g);
    assert!(held[0].is_leaf() && held[0].requires_grad());
    // A dtype casts floating-point tensors only.
    m.to(DType::F64).unwrap();
    assert_eq!(held[0].dtype(), DType::F64);
    let nbt = &m.named_buffers()[2];
    assert_eq!(nbt.0, "1.num_batches_tracked");
    assert_eq!(nbt.1.dtype(), DType::I64);
    let y = m
        .forward(&x.to(Device::Cuda(0)).unwrap().to_dtype(DType::F64).unwrap())
        .unwrap();
    assert_eq!((y.device(), y.dtype()), (Device::Cuda(0), DType::F64));
}

#[test]
fn a_model_and_its_input_on_different_devices_name_the_parameter() {
    let _rng = rng_lock();
    devices();
    let m = mlp(Device::Cpu);
    let x = Tensor::randn([2, 4], Device::Cuda(0)).unwrap();
    let e = m.forward(&x).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e.downcast_ref::<NnError>(),
            Some(NnError::DeviceMismatch { .. })
        ),
        "{msg}"
    );
    assert!(
        msg.starts_with(
            "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
        ),
        "{msg}"
    );
    assert!(msg.contains("`0.weight`"), "{msg}");
}

#[test]
fn state_dict_round_trips_and_reports_bad_keys_by_name() {
    let _rng = rng_lock();
    for d in devices() {
        let a = mlp(d);
        let b = mlp(Device::Cpu);
        b.load_state_dict(&a.state_dict().unwrap()).unwrap();
        for ((na, pa), (nb, pb)) in a.named_parameters().iter().zip(b.named_parameters()) {
            assert_eq!(na, &nb);
            assert_eq!(
                pb.device(),
                Device::Cpu,
                "values land on the module's device"
            );
            assert_eq!(pa.to_vec::<f32>().unwrap(), pb.to_vec::<f32>().unwrap());
        }
        let mut sd: StateDict = a.state_dict().unwrap();
        sd.remove("3.bias");
        sd.insert("4.weight".into(), Tensor::zeros([1], ()).unwrap());
        sd.insert("0.weight".into(), Tensor::zeros([4, 4], ()).unwrap());
        let e = b.load_state_dict(&sd).unwrap_err().to_string();
        assert!(
            e.contains("Missing key(s) in state_dict: \"3.bias\"."),
            "{e}"
        );
        assert!(
            e.contains("Unexpected key(s) in state_dict: \"4.weight\"."),
            "{e}"
        );
        assert!(
            e.contains("size mismatch for 0.weight: copying a param with shape [4, 4] from checkpoint, the shape in current model is [8, 4]."),
            "{e}"
        );
        sd.insert(
            "0.weight".into(),
            a.state_dict().unwrap()["0.weight"].clone(),
        );
        let keys = b.load_state_dict_opts(&sd, false).unwrap();
        assert_eq!(keys.missing_keys, ["3.bias"]);
        assert_eq!(keys.unexpected_keys, ["4.weight"]);
    }
}

#[test]
fn zero_grad_clears_to_none_or_zeros() {
    let _rng = rng_lock();
    let m = mlp(Device::Cpu);
    let x = Tensor::randn([2, 4], ()).unwrap();
    m.forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    m.zero_grad(false).unwrap();
    let g = m.parameters()[0].grad().unwrap();
    assert!(g.to_vec::<f32>().unwrap().iter().all(|v| *v == 0.0));
    m.zero_grad(true).unwrap();
    assert!(m.parameters().iter().all(|p| p.grad().is_none()));
}

#[test]
fn dropout_is_the_identity_in_eval_mode() {
    let _rng = rng_lock();
    for d in devices() {
        let m = mlp(d);
        let x = Tensor::ones([64, 4], d).unwrap();
        m.eval();
        assert!(!m.get(2).unwrap().is_training());
        let a = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
        let b = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(a, b);
        m.train(true);
        let drop = Dropout::new(0.5).unwrap();
        let y = drop.forward(&x).unwrap().to_vec::<f32>().unwrap();
        assert!(y.iter().all(|v| *v == 0.0 || *v == 2.0));
        let zeros = y.iter().filter(|v| **v == 0.0).count();
        assert!((64..=192).contains(&zeros), "{zeros} of 256 dropped");
    }
}

#[test]
fn batch_norm_matches_a_naive_reference_in_train_and_eval() {
    let _rng = rng_lock();
    for d in devices() {
        let (n, c, h, w) = (3, 2, 2, 2);
        let xv = values(n * c * h * w, 3, -2.0, 2.0);
        let x = tensor(xv.clone(), &[n, c, h, w], DType::F64, d);
        let bn = BatchNorm2d::new(c, (d, DType::F64)).unwrap();
        let y = bn.forward(&x).unwrap().to_vec::<f64>().unwrap();
        let m = (n * h * w) as f64;
        for ch in 0..c {
            let idx: Vec<usize> = (0..n)
                .flat_map(|i| (0..h * w).map(move |k| (i * c + ch) * h * w + k))
                .collect();
            let mean = idx.iter().map(|&i| xv[i]).sum::<f64>() / m;
            let var = idx.iter().map(|&i| (xv[i] - mean).powi(2)).sum::<f64>() / m;
            for &i in &idx {
                let want = (xv[i] - mean) / (var + 1e-5).sqrt();
                assert!((y[i] - want).abs() < 1e-10);
            }
            let rm = bn.running_mean.as_ref().unwrap().to_vec::<f64>().unwrap()[ch];
            let rv = bn.running_var.as_ref().unwrap().to_vec::<f64>().unwrap()[ch];
            assert!((rm - 0.1 * mean).abs() < 1e-12);
            assert!((rv - (0.9 + 0.1 * var * m / (m - 1.0))).abs() < 1e-12);
        }
        assert_eq!(
            bn.num_batches_tracked
                .as_ref()
                .unwrap()
                .item::<i64>()
                .unwrap(),
            1
        );
        bn.eval();
        let ye = bn.forward(&x).unwrap().to_vec::<f64>().unwrap();
        let rm = bn.running_mean.as_ref().unwrap().to_vec::<f64>().unwrap();
        let rv = bn.running_var.as_ref().unwrap().to_vec::<f64>().unwrap();
        for (i, v) in xv.iter().enumerate() {
            let ch = (i / (h * w)) % c;
            let want = (v - rm[ch]) / (rv[ch] + 1e-5).sqrt();
            assert!((ye[i] - want).abs() < 1e-10);
        }
        assert_eq!(
            bn.num_batches_tracked
                .as_ref()
                .unwrap()
                .item::<i64>()
                .unwrap(),
            1
        );
        let e = BatchNorm1d::new(3, ())
            .unwrap()
            .forward(&Tensor::ones([1, 3], ()).unwrap());
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("more than 1 value per channel")
        );
    }
}

/// A 16-bit input with f32 parameters and running statistics (what a convolution under
/// autocast feeds a batch norm) gives a 16-bit output, normalised in f32: the output is
/// the f64 reference rounded once, and the running statistics are f32 and accurate.
#[test]
fn batch_norm_of_a_16_bit_input_keeps_its_dtype_and_computes_in_f32() {
    let _rng = rng_lock();
    for d in devices() {
        for dt in [DType::F16, DType::Bf16] {
            let (n, c, h, w) = (4, 3, 2, 2);
            let xv = values(n * c * h * w, 7, -3.0, 3.0);
            let x16 = tensor(xv.clone(), &[n, c, h, w], DType::F64, d)
                .to_dtype(dt)
                .unwrap();
            let xq = x16.to_vec::<f64>().unwrap();
            let bn = BatchNorm2d::new(c, (d, DType::F32)).unwrap();
            let y = bn.forward(&x16).unwrap();
            assert_eq!(y.dtype(), dt);
            let y = y.to_vec::<f64>().unwrap();
            let m = (n * h * w) as f64;
            let tol = if dt == DType::F16 { 1e-3 } else { 8e-3 };
            for ch in 0..c {
                let idx: Vec<usize> = (0..n)
                    .flat_map(|i| (0..h * w).map(move |k| (i * c + ch) * h * w + k))
                    .collect();
                let mean = idx.iter().map(|&i| xq[i]).sum::<f64>() / m;
                let var = idx.iter().map(|&i| (xq[i] - mean).powi(2)).sum::<f64>() / m;
                for &i in &idx {
                    let want = (xq[i] - mean) / (var + 1e-5).sqrt();
                    assert!(
                        (y[i] - want).abs() <= tol * want.abs().max(1.0),
                        "{dt} on {d}: {} vs {want}",
                        y[i]
                    );
                }
                let rm = bn.running_mean.as_ref().unwrap();
                assert_eq!(rm.dtype(), DType::F32);
                let rm = rm.to_vec::<f64>().unwrap()[ch];
                assert!((rm - 0.1 * mean).abs() < 1e-6, "{rm} vs {}", 0.1 * mean);
            }
        }
    }
}

#[test]
fn layer_norm_matches_a_naive_reference() {
    let _rng = rng_lock();
    for d in devices() {
        let xv = values(2 * 6, 5, -3.0, 3.0);
        let x = tensor(xv.clone(), &[2, 6], DType::F64, d);
        let ln = LayerNorm::new(&[6], (d, DType::F64)).unwrap();
        let y = ln.forward(&x).unwrap().to_vec::<f64>().unwrap();
        for r in 0..2 {
            let row = &xv[r * 6..r * 6 + 6];
            let mean = row.iter().sum::<f64>() / 6.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 6.0;
            let want: Vec<f64> = row
                .iter()
                .map(|v| (v - mean) / (var + 1e-5).sqrt())
                .collect();
            close(&y[r * 6..r * 6 + 6], &want, 1e-10);
        }
        let e = ln
            .forward(&tensor(vec![0.0; 5], &[5], DType::F64, d))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("expected input with shape [*, 6], found [5]"),
            "{e}"
        );
    }
}

fn check_grad(f: impl Fn(&Tensor) -> ember_nn::Result<Tensor>, x: &Tensor) {
    let x = x.requires_grad_(true).unwrap();
    gradcheck(|v| f(&v[0]), &[x], GradcheckOptions::default()).unwrap();
}

#[test]
fn layers_and_losses_pass_gradcheck() {
    let _rng = rng_lock();
    for d in devices() {
        let o = (d, DType::F64);
        let x = tensor(values(4 * 6, 11, -2.0, 2.0), &[4, 6], DType::F64, d);
        let ln = LayerNorm::new(&[6], o).unwrap();
        check_grad(|x| ln.forward(x), &x);
        let bn = BatchNorm1d::new(6, o).unwrap();
        check_grad(|x| bn.forward(x), &x);
        let lin = Linear::new(6, 3, o).unwrap();
        check_grad(|x| lin.forward(x), &x);
        let y = tensor(values(4 * 6, 12, 0.0, 1.0), &[4, 6], DType::F64, d);
        check_grad(|x| BCEWithLogitsLoss::new().forward(x, &y), &x);
        check_grad(|x| MSELoss::new().forward(x, &y), &x);
        let img = tensor(
            values(2 * 2 * 5 * 5, 13, -1.0, 1.0),
            &[2, 2, 5, 5],
            DType::F64,
            d,
        );
        let conv = Conv2d::with_config(
            2,
            4,
            3,
            Conv2dConfig {
                padding: (1, 1).into(),
                groups: 2,
                ..Default::default()
            },
            o,
        )
        .unwrap();
        check_grad(|x| conv.forward(x), &img);
    }
}

/// The fused batch norm's backward (`NativeBatchNormBackward0`: one per-channel reduction
/// and one elementwise kernel) against finite differences for the input, the weight and the
/// bias together, in training (batch statistics) and eval (running statistics), for
/// `[N, C]`, `[N, C, L]` and `[N, C, H, W]`, with and without affine parameters.
#[test]
fn fused_batch_norm_passes_gradcheck_for_input_weight_and_bias() {
    let _rng = rng_lock();
    for d in devices() {
        for (k, shape) in [vec![5usize, 3], vec![2, 3, 4], vec![2, 3, 2, 3]]
            .into_iter()
            .enumerate()
        {
            let n: usize = shape.iter().product();
            let x = tensor(values(n, 20 + k as u64, -2.0, 2.0), &shape, DType::F64, d)
                .requires_grad_(true)
                .unwrap();
            let w = tensor(values(3, 30, 0.5, 1.5), &[3], DType::F64, d)
                .requires_grad_(true)
                .unwrap();
            let b = tensor(values(3, 31, -0.5, 0.5), &[3], DType::F64, d)
                .requires_grad_(true)
                .unwrap();
            let rm = tensor(values(3, 32, -0.2, 0.2), &[3], DType::F64, d);
            let rv = tensor(values(3, 33, 0.5, 1.5), &[3], DType::F64, d);
            for training in [true, false] {
                let f = |v: &[Tensor]| {
                    ember_nn::functional::batch_norm(
                        &v[0],
                        Some(&rm),
                        Some(&rv),
                        Some(&v[1]),
                        Some(&v[2]),
                        training,
                        0.0,
                        1e-5,
                    )
                };
                gradcheck(
                    f,
                    &[x.clone(), w.clone(), b.clone()],
                    GradcheckOptions::default(),
                )
                .unwrap();
                let plain = |v: &[Tensor]| {
                    ember_nn::functional::batch_norm(
                        &v[0],
                        Some(&rm),
                        Some(&rv),
                        None,
                        None,
                        training,
                        0.0,
                        1e-5,
                    )
                };
                gradcheck(plain, std::slice::from_ref(&x), GradcheckOptions::default()).unwrap();
            }
            let y = ember_nn::functional::batch_norm(
                &x,
                None,
                None,
                Some(&w),
                Some(&b),
                true,
                0.1,
                1e-5,
            )
            .unwrap();
            assert_eq!(y.grad_fn_name(), Some("NativeBatchNormBackward0"));
        }
    }
}

/// The fused batch norm's backward on 16-bit input (read and written as f16/bf16, computed in
/// f32) against the same backward on the f32 copy of the input: the input gradient in the
/// input's dtype, the weight and bias gradients in the parameters' f32.
#[test]
fn fused_batch_norm_backward_of_16_bit_input_matches_f32() {
    let _rng = rng_lock();
    for d in devices() {
        for dt in [DType::F16, DType::Bf16] {
            let x32 = tensor(values(2 * 3 * 4, 40, -2.0, 2.0), &[2, 3, 4], DType::F32, d);
            let x16 = x32.to_dtype(dt).unwrap();
            let x32 = x16.to_dtype(DType::F32).unwrap();
            let run = |x: &Tensor| {
                let x = x.requires_grad_(true).unwrap();
                let w = tensor(values(3, 41, 0.5, 1.5), &[3], DType::F32, d)
                    .requires_grad_(true)
                    .unwrap();
                let b = tensor(values(3, 42, -0.5, 0.5), &[3], DType::F32, d)
                    .requires_grad_(true)
                    .unwrap();
                let y = ember_nn::functional::batch_norm(
                    &x,
                    None,
                    None,
                    Some(&w),
                    Some(&b),
                    true,
                    0.1,
                    1e-5,
                )
                .unwrap();
                let up = tensor(values(24, 43, -1.0, 1.0), &[2, 3, 4], DType::F32, d)
                    .to_dtype(y.dtype())
                    .unwrap();
                y.mul(&up).unwrap().sum_all().unwrap().backward().unwrap();
                let v = |t: Tensor| t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                (
                    y.dtype(),
                    x.grad().unwrap().dtype(),
                    v(x.grad().unwrap()),
                    v(w.grad().unwrap()),
                    v(b.grad().unwrap()),
                )
            };
            let (ydt, gdt, gx, gw, gb) = run(&x16);
            assert_eq!((ydt, gdt), (dt, dt));
            let (_, _, gx32, gw32, gb32) = run(&x32);
            let tol = if dt == DType::F16 { 1e-2 } else { 6e-2 };
            close(&gx, &gx32, tol);
            close(&gw, &gw32, tol);
            close(&gb, &gb32, tol);
        }
    }
}

#[test]
fn losses_match_naive_references() {
    let _rng = rng_lock();
    for d in devices() {
        let xv = values(6, 21, -4.0, 4.0);
        let yv = values(6, 22, 0.0, 1.0);
        let x = tensor(xv.clone(), &[2, 3], DType::F64, d);
        let y = tensor(yv.clone(), &[2, 3], DType::F64, d);
        let bce = BCEWithLogitsLoss::new()
            .forward(&x, &y)
            .unwrap()
            .item::<f64>()
            .unwrap();
        let want: f64 = xv
            .iter()
            .zip(&yv)
            .map(|(x, y)| {
                let s = 1.0 / (1.0 + (-x).exp());
                -(y * s.ln() + (1.0 - y) * (1.0 - s).ln())
            })
            .sum::<f64>()
            / 6.0;
        assert!((bce - want).abs() < 1e-12, "{bce} vs {want}");
        let pw = tensor(vec![2.0, 0.5, 1.0], &[3], DType::F64, d);
        let l = BCEWithLogitsLoss {
            pos_weight: Some(pw),
            ..Default::default()
        };
        let got = l.forward(&x, &y).unwrap().item::<f64>().unwrap();
        let want: f64 = (0..6)
            .map(|i| {
                let s = 1.0 / (1.0 + (-xv[i]).exp());
                let p = [2.0, 0.5, 1.0][i % 3];
                -(p * yv[i] * s.ln() + (1.0 - yv[i]) * (1.0 - s).ln())
            })
            .sum::<f64>()
            / 6.0;
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        let mse = MSELoss::new()
            .forward(&x, &y)
            .unwrap()
            .item::<f64>()
            .unwrap();
        let want = xv
            .iter()
            .zip(&yv)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f64>()
            / 6.0;
        assert!((mse - want).abs() < 1e-12);
        let e = MSELoss::new().forward(&x, &tensor(vec![0.0; 3], &[3], DType::F64, d));
        assert!(e.unwrap_err().to_string().contains("target size ([3])"));
        let t = Tensor::from_vec(vec![2i64, 0], [2], d).unwrap();
        let ce = CrossEntropyLoss::new()
            .forward(&x, &t)
            .unwrap()
            .item::<f64>()
            .unwrap();
        let want: f64 = [(0usize, 2usize), (1, 0)]
            .iter()
            .map(|&(r, k)| {
                let row = &xv[r * 3..r * 3 + 3];
                let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
                lse - row[k]
            })
            .sum::<f64>()
            / 2.0;
        assert!((ce - want).abs() < 1e-12);
        // Class probabilities: one-hot rows are the indices; soft rows with a weight and
        // label smoothing are -Σ w_c·((1 - ε)·p_c + ε/C)·logp_c, averaged over rows.
        let one_hot = tensor(vec![0., 0., 1., 1., 0., 0.], &[2, 3], DType::F64, d);
        let ce_p = CrossEntropyLoss::new().forward(&x, &one_hot).unwrap();
        assert!((ce_p.item::<f64>().unwrap() - want).abs() < 1e-12);
        let (pv, wv, eps) = ([0.1, 0.6, 0.3, 0.5, 0.5, 0.0], [1.0, 2.0, 0.5], 0.2);
        let loss = CrossEntropyLoss {
            weight: Some(tensor(wv.to_vec(), &[3], DType::F64, d)),
            label_smoothing: eps,
            ..CrossEntropyLoss::new()
        };
        let soft = tensor(pv.to_vec(), &[2, 3], DType::F64, d);
        let got = loss.forward(&x, &soft).unwrap().item::<f64>().unwrap();
        let want: f64 = (0..2)
            .map(|r| {
                let row = &xv[r * 3..r * 3 + 3];
                let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
                -(0..3)
                    .map(|k| wv[k] * ((1.0 - eps) * pv[r * 3 + k] + eps / 3.0) * (row[k] - lse))
                    .sum::<f64>()
            })
            .sum::<f64>()
            / 2.0;
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }
}

#[test]
fn a_small_cnn_runs_forward_and_backward_on_every_device() {
    let _rng = rng_lock();
    for d in devices() {
        ember_tensor::random::manual_seed(0);
        let m = Sequential::new()
            .add(
                Conv2d::with_config(
                    1,
                    4,
                    3,
                    Conv2dConfig {
                        padding: (1, 1).into(),
                        ..Default::default()
                    },
                    d,
                )
                .unwrap(),
            )
            .add(ReLU::new())
            .add(MaxPool2d::new(2))
            .add(Flatten::new())
            .add(Linear::new(4 * 4 * 4, 10, d).unwrap());
        let x = Tensor::randn([3, 1, 8, 8], d).unwrap();
        let y = m.forward(&x).unwrap();
        assert_eq!(y.dims(), [3, 10]);
        let t = Tensor::from_vec(vec![1i64, 2, 3], [3], d).unwrap();
        CrossEntropyLoss::new()
            .forward(&y, &t)
            .unwrap()
            .backward()
            .unwrap();
        for (n, p) in m.named_parameters() {
            let g = p.grad().unwrap_or_else(|| panic!("{n} has no grad"));
            assert_eq!(g.shape(), p.shape());
            assert_eq!(g.device(), d);
        }
        let emb = Embedding::new(10, 3, d).unwrap();
        let idx = Tensor::from_vec(vec![1i64, 1, 4], [3], d).unwrap();
        let e = emb.forward(&idx).unwrap();
        assert_eq!(e.dims(), [3, 3]);
        e.sum_all().unwrap().backward().unwrap();
        let g = emb.weight.grad().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(&g[3..6], &[2.0, 2.0, 2.0]);
        assert_eq!(&g[12..15], &[1.0, 1.0, 1.0]);
        assert_eq!(g.iter().sum::<f32>(), 9.0);
    }
}

/// `model.to(...)` is all or nothing: a target that does not exist (cuda:5) is an error and
/// leaves every parameter, buffer and gradient where it was (PyTorch: the model is unchanged
/// when `to` fails).
#[test]
fn a_failed_move_leaves_the_model_unchanged() {
    let _rng = rng_lock();
    devices();
    let model = Sequential::new()
        .add(Linear::new(3, 4, ()).unwrap())
        .add(BatchNorm1d::new(4, ()).unwrap());
    let x = Tensor::randn([5, 3], ()).unwrap();
    model
        .forward(&x)
        .unwrap()
        .sum(())
        .unwrap()
        .backward()
        .unwrap();
    type Seen = Vec<(Device, Vec<f32>, Option<Vec<f32>>)>;
    let seen = |m: &Sequential| -> Seen {
        m.parameters()
            .iter()
            .map(|p| {
                let g = p.grad().map(|g| g.to_vec::<f32>().unwrap());
                (p.device(), p.to_vec::<f32>().unwrap(), g)
            })
            .collect()
    };
    let before = seen(&model);
    assert!(before.iter().all(|(_, _, g)| g.is_some()));
    let e = model.to(Device::Cuda(5)).unwrap_err();
    assert_eq!(e.kind(), ember_nn::ErrorKind::Device, "{e}");
    assert_eq!(before, seen(&model));
    assert!(model.buffers().iter().all(|b| b.device() == Device::Cpu));
    // And a move that can succeed still does, gradients with it (to cuda:0, which every
    // test machine has: a lent machine may have a single GPU).
    model.to(Device::Cuda(0)).unwrap();
    for p in model.parameters() {
        assert_eq!(p.device(), Device::Cuda(0));
        assert_eq!(p.grad().unwrap().device(), Device::Cuda(0));
    }
}
