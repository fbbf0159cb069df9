#![allow(clippy::unwrap_used)]
//! Device discovery, memory statistics, tensors and a `Sequential` training loop as a user
//! writes them, kept compiling and running on an emulated cuda:0.

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
    let w = Tensor::randn([784, 10], (device, DType::F32))?.requires_grad_(true)?;
    let logits = x.to_non_blocking(device)?.matmul(&w)?;
    let target = Tensor::randint(0, 10, [64], device)?;
    let loss = logits.cross_entropy(&target, &ember::autograd::CrossEntropyOptions::new())?;
    let shown = loss.to_string();
    assert!(
        shown.starts_with("tensor(")
            && shown.ends_with("device='cuda:0', grad_fn=<CrossEntropyLossBackward0>)"),
        "{shown}"
    );
    // The same on the CPU gives the same loss (within float tolerance).
    let cpu = x
        .matmul(&w.cpu()?)?
        .cross_entropy(&target.cpu()?, &ember::autograd::CrossEntropyOptions::new())?;
    let (a, b) = (cpu.item::<f32>()?, loss.cpu()?.item::<f32>()?);
    assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{a} vs {b}");
    loss.backward()?;
    let g = w.grad().ok_or("w.grad() is empty after backward")?;
    assert_eq!((g.device(), g.dims()), (device, vec![784, 10]));
    Ok(())
}

/// README.md's training loop (a `#[derive(Module)]` model through the prelude), three
/// epochs on an emulated cuda:0. README.md's block itself is compiled as a doctest of the
/// `ember` crate.
#[test]
fn readme_training_snippet_runs() -> Result<(), Box<dyn std::error::Error>> {
    use ember::data::{DataLoader, TensorDataset, digits};
    use ember::nn::{CrossEntropyLoss, Linear, ReLU};
    use ember::optim::{Adam, AdamOptions};
    use ember::prelude::*;
    use std::sync::Arc;

    #[derive(Debug, Module)]
    struct Mlp {
        fc1: Linear,
        act: ReLU,
        fc2: Linear,
    }

    impl Module for Mlp {
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            self.fc2.forward(&self.act.forward(&self.fc1.forward(x)?)?)
        }
    }

    cuda::use_emulator(EmulatorConfig::devices(2))?;
    let device = Device::cuda_if_available();
    let model = Mlp {
        fc1: Linear::new(64, 128, ())?,
        act: ReLU::new(),
        fc2: Linear::new(128, 10, ())?,
    };
    model.to(device)?;
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 2e-3,
            ..Default::default()
        },
    )?;
    let criterion = CrossEntropyLoss::new();
    let d = digits::load()?;
    let data = TensorDataset::new(vec![d.images.div(16.0)?, d.labels.clone()])?;
    let loader = DataLoader::new(Arc::new(data))
        .batch_size(64)
        .shuffle(true)
        .pin_memory(true);
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
            total += loss.item::<f64>()?;
        }
        losses.push(total / loader.len() as f64);
    }
    assert_eq!(model.parameters()[0].device(), device);
    assert!(losses[2] < 0.5 * losses[0], "{losses:?}");
    let _no_grad = no_grad();
    let predicted = model.forward(&d.images.div(16.0)?.to(device)?)?.argmax(1)?;
    let labels = d.labels.to_vec::<i64>()?;
    let hits = predicted
        .to_vec::<i64>()?
        .iter()
        .zip(&labels)
        .filter(|(p, l)| p == l)
        .count();
    assert!(hits * 10 > labels.len() * 8, "{hits} of {}", labels.len());
    Ok(())
}
