#![allow(clippy::unwrap_used)]
//! The user-facing surface through `ember::prelude::*`, on `cpu` and the emulated `cuda:0`:
//! the one error and its kinds, PyTorch's spellings (reductions with `keepdim`, `where`,
//! `clamp`, `gelu`, `addmm`), reading values back in another dtype, `(device, dtype)`
//! options, `io` round trips into `load_state_dict`, and `nn::functional` against naive
//! f64 references (PyTorch's numbers where noted).

use ember::nn::{BCEWithLogitsLoss, CrossEntropyLoss, Linear};
use ember::prelude::*;
use ember::tensor::Shape;
use ember::{Approximate, Reduction, cuda, memory};

fn devices() -> Vec<Device> {
    if std::env::var_os("EMBER_GPU_TEST").is_none() {
        cuda::use_emulator(ember::driver::emulator::EmulatorConfig::devices(2)).unwrap();
    }
    vec![Device::Cpu, Device::Cuda(0)]
}

fn each(f: impl Fn(Device) -> Result<()>) {
    for d in devices() {
        if let Err(e) = f(d) {
            panic!("on {d}: {e} ({:?})", e.kind());
        }
    }
}

fn t(v: &[f64], shape: &[usize], d: Device) -> Tensor {
    Tensor::from_slice(v, Shape::from(shape), d).unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
fn one_error_classifies_every_layer() {
    each(|d| {
        let a = Tensor::zeros([2, 3], d)?;
        let e = a.matmul(&a).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Shape, "{e}");
        assert!(e.downcast_ref::<ember::tensor::TensorError>().is_some());
        let e = a.sum(5).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Index, "{e}");
        let e = a
            .mean(())
            .and(Tensor::ones([2], (d, DType::I64))?.mean(()))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DType, "{e}");
        if d.is_cuda() {
            let e = a.add(&Tensor::zeros([2, 3], Device::Cpu)?).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DeviceMismatch, "{e}");
            // More than any emulated device holds: out of memory, as a value.
            let e = Tensor::empty([1usize << 45], d).unwrap_err();
            assert!(e.is_out_of_memory(), "{e}");
            assert_eq!(e.kind(), ErrorKind::OutOfMemory);
            assert!(
                e.downcast_ref::<ember::memory::MemoryError>().is_some(),
                "{e:?}"
            );
        }
        let e = a.sum(()).unwrap().backward();
        assert_eq!(e.unwrap_err().kind(), ErrorKind::Autograd);
        let model = Linear::new(3, 2, d)?;
        let mut sd = model.state_dict()?;
        sd.remove("bias");
        let e = model.load_state_dict(&sd).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::StateDict, "{e}");
        assert!(
            e.to_string()
                .contains("Missing key(s) in state_dict: \"bias\""),
            "{e}"
        );
        let e = ember::io::load("/nonexistent/ember/file.safetensors", d).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        let e = Linear::new(3, 2, d)?
            .forward(&Tensor::zeros([1, 4], d)?)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        Ok(())
    });
}

#[test]
fn reductions_take_dims_and_keepdim_as_pytorch() {
    each(|d| {
        // torch.arange(6.).reshape(2, 3)
        let x = t(&[0., 1., 2., 3., 4., 5.], &[2, 3], d).requires_grad_(true)?;
        assert_eq!(x.sum(())?.item::<f64>()?, 15.0);
        assert_eq!(x.sum(())?.grad_fn_name(), Some("SumBackward0"));
        assert_eq!(x.sum(1)?.to_vec::<f64>()?, vec![3.0, 12.0]);
        assert_eq!(x.sum(1)?.grad_fn_name(), Some("SumBackward1"));
        assert_eq!(x.sum((1, true))?.dims(), vec![2, 1]);
        assert_eq!(x.sum(([0, 1], true))?.dims(), vec![1, 1]);
        assert_eq!(x.sum(((), true))?.dims(), vec![1, 1]);
        assert_eq!(x.mean(0)?.to_vec::<f64>()?, vec![1.5, 2.5, 3.5]);
        assert_eq!(x.mean(-1)?.to_vec::<f64>()?, vec![1.0, 4.0]);
        // torch.var defaults to correction=1: var([0,1,2]) = 1.
        assert_eq!(x.var(1)?.to_vec::<f64>()?, vec![1.0, 1.0]);
        assert_eq!(
            x.var_correction(1, 0.0)?.to_vec::<f64>()?,
            vec![2.0 / 3.0; 2]
        );
        assert_eq!(x.std(())?.item::<f64>()?, 3.5f64.sqrt());
        assert_eq!(x.amax(0)?.to_vec::<f64>()?, vec![3.0, 4.0, 5.0]);
        assert_eq!(x.argmax(())?.item::<i64>()?, 5);
        assert_eq!(x.argmax((1, true))?.dims(), vec![2, 1]);
        let (v, i) = x.max_dim(0)?;
        assert_eq!(
            (v.to_vec::<f64>()?, i.to_vec::<i64>()?),
            (vec![3., 4., 5.], vec![1, 1, 1])
        );
        assert_eq!(
            x.argmax([0, 1]).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            x.max_dim(()).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            x.norm(2.0, 1)?.to_vec::<f64>()?,
            vec![5f64.sqrt(), 50f64.sqrt()]
        );
        assert!((x.logsumexp(())?.item::<f64>()? - 5.456_193_316_018_123).abs() < 1e-12);
        // d(sum over dim 1, kept)/dx = 1 everywhere.
        x.sum((1, true))?.sum(())?.backward()?;
        assert_eq!(x.grad().unwrap().to_vec::<f64>()?, vec![1.0; 6]);
        Ok(())
    });
}

#[test]
fn where_clamp_gelu_addmm_spellings() {
    each(|d| {
        let x = t(&[-1.0, 2.0, -3.0], &[3], d).requires_grad_(true)?;
        let y = t(&[10.0, 20.0, 30.0], &[3], d);
        let cond = x.gt(0)?;
        let r = ember::r#where(&cond, &x, &y)?;
        assert_eq!(r.to_vec::<f64>()?, vec![10.0, 2.0, 30.0]);
        assert_eq!(x.r#where(&cond, 0.0)?.to_vec::<f64>()?, vec![0.0, 2.0, 0.0]);
        r.sum(())?.backward()?;
        assert_eq!(x.grad().unwrap().to_vec::<f64>()?, vec![0.0, 1.0, 0.0]);

        assert_eq!(x.clamp(-1.5, 1.0)?.to_vec::<f64>()?, vec![-1.0, 1.0, -1.5]);
        assert_eq!(x.clamp((), 0)?.to_vec::<f64>()?, vec![-1.0, 0.0, -3.0]);
        assert_eq!(x.clamp(0, ())?.to_vec::<f64>()?, vec![0.0, 2.0, 0.0]);
        assert_eq!(
            x.clamp((), ()).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );

        // torch.nn.functional.gelu(torch.tensor(1.0, dtype=torch.float64)) and approximate='tanh'
        let one = t(&[1.0], &[1], d);
        assert!((one.gelu(())?.item::<f64>()? - 0.841_344_746_068_542_9).abs() < 1e-15);
        let tanh = one.gelu(Approximate::Tanh)?.item::<f64>()?;
        assert!((tanh - 0.841_191_990_608_276_8).abs() < 1e-15, "{tanh}");
        assert_eq!("tanh".parse::<Approximate>()?, Approximate::Tanh);

        let bias = t(&[1.0, 2.0], &[2], d);
        let eye = t(&[1., 0., 0., 1.], &[2, 2], d);
        let m = t(&[1., 2., 3., 4.], &[2, 2], d);
        assert_eq!(bias.addmm(&eye, &m)?.to_vec::<f64>()?, vec![2., 4., 4., 6.]);
        let s = bias.addmm_scaled(&eye, &m, 0.5, 2.0)?;
        assert_eq!(s.to_vec::<f64>()?, vec![2.5, 5., 6.5, 9.]);
        Ok(())
    });
}

#[test]
fn values_read_back_in_another_dtype_and_options_take_device_then_dtype() {
    each(|d| {
        let x = Tensor::from_slice(&[0.1f32, 2.5, -1.0], [3], d)?;
        assert_eq!(x.to_vec::<f64>()?, vec![0.1f32 as f64, 2.5, -1.0]);
        assert_eq!(x.item::<f64>().unwrap_err().kind(), ErrorKind::Shape);
        let b = Tensor::ones([2], (d, DType::Bf16))?;
        assert_eq!(
            b.to_vec::<ember::half::bf16>()?,
            vec![ember::half::bf16::ONE; 2]
        );
        assert_eq!(b.to_vec::<f32>()?, vec![1.0; 2]);
        let h = Tensor::from_slice(&[1.5f32], [1], (&d, DType::F16))?;
        assert_eq!((h.dtype(), h.device()), (DType::F16, d));
        let z = Tensor::zeros([2], (d, DType::F64))?;
        assert_eq!((z.dtype(), z.device()), (DType::F64, d));
        let moved = z.to((Device::Cpu, DType::F32))?;
        assert_eq!((moved.dtype(), moved.device()), (DType::F32, Device::Cpu));
        // Devices by value or by reference.
        // (Other tests allocate on `d` meanwhile: the peak, read second, bounds the first read.)
        let now = memory::memory_allocated(d)?;
        assert!(memory::max_memory_allocated(d)? >= now);
        assert_eq!(x.to_device(d)?.device(), x.to_device(d)?.device());
        Ok(())
    });
}

#[test]
fn io_load_feeds_load_state_dict() {
    each(|d| {
        let model = Linear::new(4, 3, d)?;
        let dir = std::env::temp_dir().join(format!("ember-api-io-{}-{d}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("m.safetensors");
        ember::io::save(&model.state_dict()?, &path)?;
        let copy = Linear::new(4, 3, d)?;
        copy.load_state_dict(&ember::io::load(&path, d)?)?;
        for (k, v) in model.state_dict()? {
            assert_eq!(
                copy.state_dict()?[&k].to_vec::<f32>()?,
                v.to_vec::<f32>()?,
                "{k}"
            );
        }
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    });
}

/// Naive f64 layer norm over the last dim of a row-major `[rows, n]`.
fn layer_norm_ref(x: &[f64], n: usize, eps: f64) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let m = row.iter().sum::<f64>() / n as f64;
            let v = row.iter().map(|a| (a - m).powi(2)).sum::<f64>() / n as f64;
            row.iter()
                .map(move |a| (a - m) / (v + eps).sqrt())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn functional_matches_naive_references() {
    each(|d| {
        let xs: Vec<f64> = (0..12).map(|i| ((i * 7) % 11) as f64 / 3.0 - 1.5).collect();
        let x = t(&xs, &[3, 4], d);
        // layer_norm with weight 2, bias 1.
        let w = t(&[2.0; 4], &[4], d);
        let b = t(&[1.0; 4], &[4], d);
        let y = F::layer_norm(&x, &[4], Some(&w), Some(&b), 1e-5)?;
        let want: Vec<f64> = layer_norm_ref(&xs, 4, 1e-5)
            .iter()
            .map(|v| 2.0 * v + 1.0)
            .collect();
        assert!(close(&y.to_vec::<f64>()?, &want, 1e-12));
        assert_eq!(
            F::layer_norm(&x, &[3], None, None, 1e-5)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );

        // batch_norm on [N=3, C=4] in training: the columns normalised, running stats updated
        // with the unbiased variance and momentum 0.1.
        let rm = Tensor::zeros([4], (d, DType::F64))?;
        let rv = Tensor::ones([4], (d, DType::F64))?;
        let y = F::batch_norm(&x, Some(&rm), Some(&rv), None, None, true, 0.1, 1e-5)?;
        let cols: Vec<Vec<f64>> = (0..4)
            .map(|c| (0..3).map(|r| xs[r * 4 + c]).collect())
            .collect();
        let yv = y.to_vec::<f64>()?;
        for (c, col) in cols.iter().enumerate() {
            let got: Vec<f64> = (0..3).map(|r| yv[r * 4 + c]).collect();
            assert!(
                close(&got, &layer_norm_ref(col, 3, 1e-5), 1e-12),
                "column {c}"
            );
            let m = col.iter().sum::<f64>() / 3.0;
            let var_unbiased = col.iter().map(|a| (a - m).powi(2)).sum::<f64>() / 2.0;
            assert!((rm.to_vec::<f64>()?[c] - 0.1 * m).abs() < 1e-12);
            assert!((rv.to_vec::<f64>()?[c] - (0.9 + 0.1 * var_unbiased)).abs() < 1e-12);
        }
        // In eval the running statistics are used.
        let e = F::batch_norm(&x, Some(&rm), Some(&rv), None, None, false, 0.1, 0.0)?;
        let (rmv, rvv) = (rm.to_vec::<f64>()?, rv.to_vec::<f64>()?);
        let want: Vec<f64> = xs
            .iter()
            .enumerate()
            .map(|(i, v)| (v - rmv[i % 4]) / rvv[i % 4].sqrt())
            .collect();
        assert!(close(&e.to_vec::<f64>()?, &want, 1e-12));
        let e = F::batch_norm(&x, None, None, None, None, false, 0.1, 1e-5).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);

        // Elementwise losses.
        let ys: Vec<f64> = xs.iter().map(|v| (v * 0.3).sin().abs()).collect();
        let target = t(&ys, &[3, 4], d);
        let mse = F::mse_loss(&x, &target, ())?.item::<f64>()?;
        let mse_ref = xs
            .iter()
            .zip(&ys)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f64>()
            / 12.0;
        assert!((mse - mse_ref).abs() < 1e-12);
        let l1 = F::l1_loss(&x, &target, Reduction::Sum)?.item::<f64>()?;
        assert!((l1 - xs.iter().zip(&ys).map(|(a, b)| (a - b).abs()).sum::<f64>()).abs() < 1e-12);
        let bce = F::binary_cross_entropy_with_logits(&x, &target, None, ())?.item::<f64>()?;
        let bce_ref = xs
            .iter()
            .zip(&ys)
            .map(|(&a, &b)| {
                let p = 1.0 / (1.0 + (-a).exp());
                -(b * p.ln() + (1.0 - b) * (1.0 - p).ln())
            })
            .sum::<f64>()
            / 12.0;
        assert!((bce - bce_ref).abs() < 1e-12);
        let module = BCEWithLogitsLoss::new()
            .forward(&x, &target)?
            .item::<f64>()?;
        assert_eq!(module, bce);
        assert_eq!(
            F::mse_loss(&x, &t(&[0.0; 4], &[4], d), ())
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );

        // cross_entropy with an ember::Tensor weight equals the module's.
        let labels = Tensor::from_slice(&[0i64, 3, 1], [3], d)?;
        let cw = t(&[1.0, 2.0, 0.5, 1.5], &[4], d);
        let opts = ember::autograd::CrossEntropyOptions::new()
            .weight(&cw)
            .label_smoothing(0.1);
        let f = F::cross_entropy(&x, &labels, opts)?.item::<f64>()?;
        let m = CrossEntropyLoss {
            weight: Some(cw.clone()),
            label_smoothing: 0.1,
            ..CrossEntropyLoss::new()
        }
        .forward(&x, &labels)?
        .item::<f64>()?;
        assert_eq!(f, m);
        // The unweighted mean of -log_softmax at the labels.
        let plain = F::cross_entropy(&x, &labels, ())?.item::<f64>()?;
        let lsm = F::log_softmax(&x, 1)?.to_vec::<f64>()?;
        let want = -(lsm[0] + lsm[4 + 3] + lsm[8 + 1]) / 3.0;
        assert!((plain - want).abs() < 1e-12);
        assert_eq!(
            F::nll_loss(&F::log_softmax(&x, 1)?, &labels, ())?.item::<f64>()?,
            plain
        );

        // embedding(idx, w) picks rows; linear checks its shapes.
        let table = t(&[0., 1., 10., 11., 20., 21.], &[3, 2], d);
        let rows = F::embedding(&Tensor::from_slice(&[2i64, 0], [2], d)?, &table)?;
        assert_eq!(rows.to_vec::<f64>()?, vec![20., 21., 0., 1.]);
        let lin = F::linear(
            &x,
            &t(&[1.0; 8], &[2, 4], d),
            Some(&t(&[0.5, -0.5], &[2], d)),
        )?;
        assert_eq!(lin.dims(), vec![3, 2]);
        let e = F::linear(&x, &t(&[1.0; 6], &[2, 3], d), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        Ok(())
    });
}
