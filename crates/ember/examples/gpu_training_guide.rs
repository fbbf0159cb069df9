//! The PyTorch walk-through "GPU Training with PyTorch on CUDA" (docs/walkthroughs.md),
//! replayed in Rust: CUDA availability and properties, moving a model and its data, monitoring
//! memory around a forward pass and `empty_cache`, and gradient accumulation over
//! micro-batches. (Mixed precision and `DataParallel` come with the AMP and parallel crates.)
//! The layer sizes are a tenth of the text's so that the CI runs it on the emulated GPU in
//! seconds.
//!
//! `cargo run --example gpu_training_guide`

use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU, Sequential};
use ember::optim::{Adam, AdamOptions, Optimizer};
use ember::{Device, Error, Tensor, cuda, memory};

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(ember::nn::NnError::invalid("walk-through", what).into())
    }
}

/// Runs the walk-through on `device` (the text's `device`).
pub fn run(device: Device) -> Result<(), Error> {
    // Checking CUDA availability and GPU properties.
    println!("CUDA available: {}", cuda::is_available());
    let num_gpus = cuda::device_count();
    println!("Number of GPUs: {num_gpus}");
    if num_gpus > 0 {
        println!("Current device index: {}", cuda::current_device()?);
    }
    for i in 0..num_gpus {
        let name = cuda::get_device_name(i)?;
        let gpu_memory = cuda::get_device_properties(i)?.total_memory as f64 / 1e9;
        println!("GPU {i}: {name}, Memory: {gpu_memory:.2} GB");
    }
    println!("Using device: {device}");

    // Moving models and data to the GPU.
    let model = Sequential::new()
        .add(Linear::new(100, 51, ())?)
        .add(ReLU::new())
        .add(Linear::new(51, 12, ())?)
        .add(ReLU::new())
        .add(Linear::new(12, 10, ())?);
    model.to(device)?;
    println!("Model device: {}", model.parameters()[0].device());
    let x = Tensor::randn([32, 100], ())?.to(device)?;
    let y = Tensor::randint(0, 10, [32], ())?.to(device)?;
    let output = model.call(&x)?;
    println!("Output device: {}", output.device());
    ensure(
        output.device() == device && y.device() == device,
        "output and labels on the device",
    )?;
    model.to(Device::Cpu)?; // move back to the CPU
    ensure(
        model.parameters()[0].device() == Device::Cpu,
        "model back on the CPU",
    )?;

    // Monitoring and managing memory.
    let model = Sequential::new()
        .add(Linear::new(1000, 500, ())?)
        .add(ReLU::new())
        .add(Linear::new(500, 200, ())?)
        .add(ReLU::new())
        .add(Linear::new(200, 10, ())?);
    model.to(device)?;
    let params_bytes = 4 * model.num_parameters() as u64;
    let allocated = memory::memory_allocated(device)?;
    let reserved = memory::memory_reserved(device)?;
    println!(
        "Allocated: {:.4} GB, Reserved: {:.4} GB",
        allocated as f64 / 1e9,
        reserved as f64 / 1e9
    );
    ensure(
        allocated >= params_bytes,
        "the parameters are allocated on the device",
    )?;
    let x = Tensor::randn([256, 1000], ())?.to(device)?;
    let output = model.call(&x)?;
    let after_forward = memory::memory_allocated(device)?;
    println!(
        "After forward: Allocated: {:.4} GB",
        after_forward as f64 / 1e9
    );
    // The input, the output and the activations kept for backward.
    ensure(
        after_forward >= allocated + 4 * (256 * 1000 + 256 * 10),
        "forward allocates its activations",
    )?;
    drop(output);
    drop(x);
    let cached = memory::memory_reserved(device)?;
    memory::empty_cache(device)?;
    let after_clear = memory::memory_allocated(device)?;
    println!(
        "After cache clear: Allocated: {:.4} GB",
        after_clear as f64 / 1e9
    );
    ensure(
        after_clear <= allocated,
        "dropping the output frees what the forward kept",
    )?;
    let reserved_now = memory::memory_reserved(device)?;
    println!(
        "After cache clear: Reserved: {:.4} GB",
        reserved_now as f64 / 1e9
    );
    ensure(
        reserved_now < cached,
        "empty_cache gives the freed blocks back",
    )?;
    ensure(
        reserved_now >= after_clear,
        "what tensors hold stays reserved",
    )?;

    // Gradient accumulation for simulating large batches: batch 256 as 4 x 64.
    let model = Linear::new(100, 10, ())?;
    model.to(device)?;
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 0.001,
            ..Default::default()
        },
    )?;
    let criterion = CrossEntropyLoss::new();
    let accumulation_steps = 4;
    for epoch in 0..2 {
        let mut epoch_loss = 0.0;
        optimizer.zero_grad(true)?; // zero once per accumulation cycle
        for step in 0..16 {
            let x = Tensor::randn([64, 100], ())?.to(device)?;
            let y = Tensor::randint(0, 10, [64], ())?.to(device)?;
            let output = model.call(&x)?;
            let loss = criterion
                .forward(&output, &y)?
                .div(accumulation_steps as f64)?;
            let before = model.weight.to_vec::<f32>()?;
            loss.backward()?; // accumulates gradients
            if (step + 1) % accumulation_steps == 0 {
                optimizer.step()?;
                optimizer.zero_grad(true)?;
                ensure(
                    model.weight.to_vec::<f32>()? != before,
                    "a step every 4 micro-batches",
                )?;
            } else {
                ensure(model.weight.to_vec::<f32>()? == before, "no step between")?;
            }
            epoch_loss += loss.item::<f32>()? as f64 * accumulation_steps as f64;
        }
        println!("Epoch {}: Loss = {:.4}", epoch + 1, epoch_loss / 16.0);
        ensure(epoch_loss.is_finite(), "finite loss")?;
    }
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    run(Device::cuda_if_available())
}
