#![allow(clippy::unwrap_used)]
//! The README's "Using it" snippet, kept compiling and running (on an emulated cuda:0).

use ember::driver::emulator::EmulatorConfig;
use ember::{DType, Device, Tensor, cuda, memory};

#[test]
fn readme_snippet_runs() -> Result<(), Box<dyn std::error::Error>> {
    cuda::use_emulator(EmulatorConfig::devices(2))?;
    let device = Device::cuda_if_available();
    assert_eq!(device, Device::Cuda(0));
    let block = memory::allocator(device)?.allocate(1 << 20)?;
    println!("{}", memory::memory_summary(device)?);
    drop(block);
    memory::empty_cache(device)?;

    let x = Tensor::randn([64, 784], ())?.pin_memory()?;
    let w = Tensor::randn([784, 10], (DType::F32, device))?.requires_grad_(true)?;
    let logits = x.to_non_blocking(device)?.matmul(&w)?;
    let target = Tensor::randint(0, 10, [64], device)?;
    let loss = logits.cross_entropy(&target, &ember::tensor::CrossEntropyOptions::new())?;
    let shown = loss.to_string();
    assert!(
        shown.starts_with("tensor(")
            && shown.ends_with("device='cuda:0', grad_fn=<CrossEntropyLossBackward0>)"),
        "{shown}"
    );
    // The same on the CPU gives the same loss (within float tolerance).
    let cpu = x
        .matmul(&w.cpu()?)?
        .cross_entropy(&target.cpu()?, &ember::tensor::CrossEntropyOptions::new())?;
    let (a, b) = (cpu.item::<f32>()?, loss.cpu()?.item::<f32>()?);
    assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{a} vs {b}");
    loss.backward()?;
    let g = w.grad().ok_or("w.grad() is empty after backward")?;
    assert_eq!((g.device(), g.dims()), (device, vec![784, 10]));
    Ok(())
}

/// The README's training snippet, on an emulated cuda:0.
#[test]
fn readme_training_snippet_runs() -> Result<(), Box<dyn std::error::Error>> {
    use ember::data::{DataLoader, digits};
    use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU, Sequential};
    use ember::optim::{Adam, AdamOptions, Optimizer};
    use std::sync::Arc;

    cuda::use_emulator(EmulatorConfig::devices(2))?;
    let device = Device::cuda_if_available();
    let model = Sequential::new()
        .add(Linear::new(64, 128, ())?)
        .add(ReLU::new())
        .add(Linear::new(128, 10, ())?);
    model.to(device)?;
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 2e-3,
            ..Default::default()
        },
    )?;
    let d = digits::load()?;
    let data = ember::data::TensorDataset::new(vec![d.images.div(16.0)?, d.labels])?;
    let loader = DataLoader::new(Arc::new(data))
        .batch_size(64)
        .shuffle(true)
        .pin_memory(true);
    let criterion = CrossEntropyLoss::new();
    let mut losses = Vec::new();
    for epoch in 0..3 {
        let mut total = 0.0;
        for batch in loader.epoch(epoch)? {
            let batch = batch?;
            let (x, y) = (
                batch[0].to_non_blocking(device)?,
                batch[1].to_non_blocking(device)?,
            );
            optimizer.zero_grad(true)?;
            let loss = criterion.forward(&model.forward(&x)?, &y)?;
            loss.backward()?;
            optimizer.step()?;
            total += loss.item::<f32>()?;
        }
        losses.push(total / loader.len() as f32);
    }
    assert_eq!(model.parameters()[0].device(), device);
    assert!(losses[2] < 0.5 * losses[0], "{losses:?}");
    Ok(())
}
