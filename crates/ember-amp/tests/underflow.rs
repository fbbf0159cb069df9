#![allow(clippy::unwrap_used)]
//! Why the `GradScaler` exists: a linear model whose forward runs in f16 on f32 master
//! weights, with a loss so small that its gradients underflow f16. Without a scaler every
//! gradient that reaches the weights is exactly zero and nothing is learned; with one the run
//! follows the all-f32 run. On `cpu` and the emulated `cuda:0`.

use ember_amp::scaler::GradScaler;
use ember_autograd::Result;
use ember_nn::Tensor;
use ember_nn::optim::{Optimizer, SGD, SgdOptions};
use ember_tensor::{DType, Device};
use ember_testing::{rand_vec, test_device};

const N: usize = 64;
const D: usize = 8;
const STEPS: usize = 40;
/// The loss is `LOSS_FACTOR * mean((x w - t)^2)`: d loss / d pred is about
/// `2 * 1e-7 / 64 * |x w - t|` ~ 3e-9, far under f16's smallest subnormal (6e-8), so it
/// rounds to zero when the backward pass casts it to f16. Scaled by 2^16 it is ~2e-4, a
/// normal f16 number.
const LOSS_FACTOR: f64 = 1e-7;
/// Large, to make steps of useful size from gradients that small.
const LR: f64 = 5e6;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    F32,
    F16,
    F16Scaled,
}

fn data(dev: &Device) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = rand_vec(N * D, 7).iter().map(|&v| v as f32).collect();
    let w_true: Vec<f32> = rand_vec(D, 8).iter().map(|&v| v as f32).collect();
    let t: Vec<f32> = (0..N)
        .map(|i| (0..D).map(|j| x[i * D + j] * w_true[j]).sum())
        .collect();
    Ok((
        Tensor::from_vec(x, [N, D], dev)?,
        Tensor::from_vec(t, [N], dev)?,
    ))
}

/// Trains from zero weights; returns the weights and the first and last losses (f32).
fn train(dev: &Device, mode: Mode) -> Result<(Vec<f32>, f32, f32)> {
    let (x, t) = data(dev)?;
    let w = Tensor::zeros([D, 1], dev)?.requires_grad_(true)?;
    let mut opt = SGD::new(
        vec![w.clone()],
        SgdOptions {
            lr: LR,
            ..Default::default()
        },
    )?;
    let mut scaler = GradScaler::new(*dev)?;
    let (mut first, mut last) = (0.0, 0.0);
    for step in 0..STEPS {
        let pred = if mode == Mode::F32 {
            x.matmul(&w)?
        } else {
            // The f16 forward: f16 copies of the data and of the f32 master weights (the
            // cast is differentiable: the gradient comes back to `w` in f32).
            x.to_dtype(DType::F16)?
                .matmul(&w.to_dtype(DType::F16)?)?
                .to_dtype(DType::F32)?
        };
        let diff = pred.reshape([N])?.sub(&t)?;
        let loss = diff.mul(&diff)?.mean_all()?.mul(LOSS_FACTOR)?;
        let value = loss.item::<f32>()?;
        if step == 0 {
            first = value;
        }
        last = value;
        opt.zero_grad(true)?;
        if mode == Mode::F16Scaled {
            scaler.scale(&loss)?.backward()?;
            assert!(scaler.step(&mut opt)?, "step {step} skipped");
            scaler.update()?;
        } else {
            loss.backward()?;
            opt.step()?;
        }
    }
    Ok((w.to_vec::<f32>()?, first, last))
}

fn scaler_rescues_underflowing_gradients(dev: &Device) -> Result<()> {
    let (w32, first32, last32) = train(dev, Mode::F32)?;
    // The f32 run learns: its loss falls by far more than 10x.
    assert!(last32 < first32 / 100.0, "f32: {first32} -> {last32}");

    // f16 without a scaler: every gradient underflowed, the weights never moved.
    let (w16, first16, last16) = train(dev, Mode::F16)?;
    assert!(w16.iter().all(|&v| v == 0.0), "{w16:?}");
    assert_eq!(first16, last16);

    // f16 with the scaler: the f32 run's weights, up to f16's rounding of the forward pass.
    let (ws, _, lasts) = train(dev, Mode::F16Scaled)?;
    for (a, b) in ws.iter().zip(&w32) {
        assert!(
            (a - b).abs() <= 1e-2 * (1.0 + b.abs()),
            "{ws:?} vs f32 {w32:?}"
        );
    }
    assert!(lasts < first32 / 100.0, "scaled f16: {first32} -> {lasts}");
    Ok(())
}
test_device!(scaler_rescues_f16, scaler_rescues_underflowing_gradients);
