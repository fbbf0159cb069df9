//! The PyTorch walk-through "Working on GPUs" (docs/walkthroughs.md), replayed in Rust:
//! devices, `try_gpu`, tensors on devices, the cross-device error and the explicit copy, `to`
//! on the tensor's own device returning the same tensor, a network moved with `to(device)`,
//! an optimizer built *before* the move (the text's pitfall) that still trains correctly, and
//! the training loop's "sweet spot": the model moved once, the optimizer after it, each batch
//! moved at the loop's boundary.
//!
//! `cargo run --example d2l_working_on_gpus` (add `EMBER_CUDA_EMULATOR=2` to use two
//! emulated GPUs).

use std::sync::Arc;

use ember::data::{DataLoader, TensorDataset};
use ember::nn::{BatchNorm, Linear, Module, Sequential};
use ember::optim::{Optimizer, SGD, SgdOptions};
use ember::{Device, Error, Tensor, cuda, try_all_gpus, try_gpu};

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(ember::nn::NnError::invalid("walk-through", what).into())
    }
}

/// Runs the walk-through with `gpu0` and `gpu1` in the roles of `try_gpu()` and
/// `try_gpu(1)`.
pub fn run(gpu0: Device, gpu1: Device) -> Result<(), Error> {
    // What hardware do we have?
    println!("{}, {}, {}", Device::Cpu, Device::Cuda(0), Device::Cuda(1));
    println!("num_gpus() = {}", cuda::device_count());
    println!(
        "try_gpu() = {}, try_gpu(10) = {}, try_all_gpus() = {:?}",
        try_gpu(0),
        try_gpu(10),
        try_all_gpus()
    );

    // Tensors live on a device; a new one lives on the CPU.
    let x = Tensor::from_vec(vec![1i64, 2, 3], [3], Device::Cpu)?;
    ensure(x.device() == Device::Cpu, "a new tensor lives on the CPU")?;

    // X = torch.ones(2, 3, device=try_gpu()); Y = torch.rand(2, 3, device=try_gpu(1))
    let big_x = Tensor::ones([2, 3], gpu0)?;
    let big_y = Tensor::rand([2, 3], gpu1)?;
    println!("X = {big_x}\nY = {big_y}");

    // Tensors on different devices cannot be combined: copy explicitly.
    if gpu0 != gpu1 {
        let e = big_x
            .add(&big_y)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        println!("X + Y: {e}");
        ensure(
            e.starts_with(
                "Expected all tensors to be on the same device, but found at least two devices",
            ),
            "X + Y across devices is refused with PyTorch's message",
        )?;
    }
    let z = big_x.to(gpu1)?; // Z = X.cuda(1)
    let sum = big_y.add(&z)?;
    println!("Y + Z = {sum}");
    ensure(sum.device() == gpu1, "Y + Z lives on Y's device")?;
    // Z.cuda(1) is Z: no copy when the tensor is already there.
    ensure(
        z.to(gpu1)?.same(&z),
        "to(its own device) returns the same tensor",
    )?;

    // The model is a tree of parameters (and buffers): move it in one shot. Here the
    // optimizer is built *before* the move — the ordering the text warns about. In Ember
    // the optimizer holds the parameters themselves, so it follows them.
    let net = Sequential::new()
        .add(Linear::new(3, 1, ())?)
        .add(BatchNorm::new_1d(1, ())?);
    let mut opt = SGD::new(
        net.parameters(),
        SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        },
    )?;
    net.to(gpu0)?; // net = net.to(device=try_gpu())
    for (name, p) in net.named_parameters() {
        ensure(p.device() == gpu0, &format!("{name} moved"))?;
    }
    for (name, b) in net.named_buffers() {
        ensure(
            b.device() == gpu0,
            &format!("buffer {name} moved with the model"),
        )?;
    }
    let out = net.call(&big_x.add(&Tensor::randn([2, 3], gpu0)?)?)?;
    println!("net(X) = {out}");
    ensure(
        out.device() == gpu0,
        "the output lives where the model does",
    )?;

    // One training step with the optimizer built before the move.
    let before = net.parameters()[0].to_vec::<f32>()?;
    opt.zero_grad(true)?;
    out.square()?.mean_all()?.backward()?;
    opt.step()?;
    let after = net.parameters()[0].to_vec::<f32>()?;
    ensure(
        before != after,
        "the optimizer built before the move updated the moved weights",
    )?;
    ensure(
        net.parameters()[0].device() == gpu0,
        "the weights stayed on the device",
    )?;

    // Where to put the device move: the model once, before training, then the optimizer
    // (it picks up the device), and each batch at the loop's boundary.
    let model = Linear::new(3, 1, ())?;
    model.to(gpu0)?;
    let mut opt = SGD::new(
        model.parameters(),
        SgdOptions {
            lr: 0.1,
            ..Default::default()
        },
    )?;
    let inputs = Tensor::randn([64, 3], ())?;
    let targets = inputs.mm(&Tensor::from_vec(
        vec![1.0f32, -2.0, 0.5],
        [3, 1],
        Device::Cpu,
    )?)?;
    let loader =
        DataLoader::new(Arc::new(TensorDataset::new(vec![inputs, targets])?)).batch_size(16);
    let mut epoch_losses = Vec::new();
    for epoch in 0..5 {
        let mut total = 0.0;
        for batch in loader.epoch(epoch)? {
            let batch = batch?;
            let (x, y) = (batch[0].to(gpu0)?, batch[1].to(gpu0)?);
            opt.zero_grad(true)?;
            let loss = model.call(&x)?.sub(&y)?.square()?.mean_all()?;
            loss.backward()?;
            opt.step()?;
            total += loss.item::<f64>()?;
        }
        epoch_losses.push(total);
    }
    println!("epoch losses: {epoch_losses:.4?}");
    ensure(
        epoch_losses[4] < 0.5 * epoch_losses[0],
        "the loop on the device trains",
    )?;
    ensure(
        model.weight.device() == gpu0,
        "the model stayed on the device",
    )?;

    // Tensors created mid-forward should follow the input's device.
    let scratch = Tensor::zeros([10], big_x.device())?;
    ensure(
        scratch.device() == gpu0,
        "zeros(.., device=x.device) follows x",
    )?;
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    run(try_gpu(0), try_gpu(1))
}
