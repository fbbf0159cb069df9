//! The PyTorch walk-through "Using torch with CUDA" (docs/walkthroughs.md), replayed in Rust:
//! checking for CUDA, device-agnostic setup, moving tensors and models (to a second GPU too),
//! memory statistics and `empty_cache`, the common error of mixing CPU and GPU tensors, with
//! its fix, and the AMP loop over a `DataLoader` ([`run_amp`]: `autocast()` and a
//! `GradScaler`, f16 with the scaler on CUDA, bf16 with the scaler disabled on the CPU).
//! (`DataParallel` comes with the parallel crate.)
//!
//! `cargo run --example using_torch_with_cuda`

use std::sync::Arc;

use ember::amp::{AutocastOptions, GradScaler, GradScalerOptions};
use ember::data::{DataLoader, Dataset, TensorDataset};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, NnError};
use ember::optim::{Optimizer, SGD, SgdOptions};
use ember::{DType, Device, Error, Tensor, amp, cuda, memory, no_grad};

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(NnError::invalid("walk-through", what).into())
    }
}

/// Runs the walk-through on `device` (and `second` in the role of `cuda:1`).
pub fn run(device: Device, second: Device) -> Result<(), Error> {
    println!("CUDA ready: {}", cuda::is_available());
    println!("GPUs: {}", cuda::device_count());

    // device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    let x = Tensor::randn([5, 5], ())?.to(device)?;
    let model = Linear::new(5, 3, ())?;
    model.to(device)?;
    ensure(
        x.device() == device && model.weight.device() == device,
        "moved",
    )?;

    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    let x_cuda = x.to(device)?;
    let x_cpu = x_cuda.to("cpu")?;
    ensure(x_cpu.to_vec::<f32>()? == [1.0, 2.0], "there and back")?;

    for i in 0..cuda::device_count() {
        println!("{}", cuda::get_device_name(i)?);
    }
    model.to(second)?; // model = model.to('cuda:1')
    ensure(
        model.weight.device() == second
            && model.bias.as_ref().is_some_and(|b| b.device() == second),
        "model on the second GPU",
    )?;
    model.to(device)?;

    println!(
        "allocated {} bytes, reserved {} bytes",
        memory::memory_allocated(device)?,
        memory::memory_reserved(device)?
    );
    memory::empty_cache(device)?;

    // Mixing CPU and GPU tensors: .to(device) both inputs before the operation.
    let input = Tensor::randn([4, 5], ())?;
    if device != Device::Cpu {
        let e = model
            .call(&input)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        println!("model(cpu input): {e}");
        ensure(
            e.contains("Expected all tensors to be on the same device") && e.contains("`weight`"),
            "the mix is an error naming the parameter",
        )?;
    }
    let out = model.call(&input.to(device)?)?;
    ensure(out.device() == device, "fixed by moving the input")?;

    // Out of memory: smaller batches, or no_grad for inference.
    let _g = no_grad();
    ensure(
        model.call(&input.to(device)?)?.grad_fn_name().is_none(),
        "no graph kept",
    )?;
    Ok(())
}

/// What the AMP loop saw ([`run_amp`]), for the tests.
#[derive(Debug)]
pub struct AmpReport {
    /// The dtype of the model's output under `autocast()` (f16 on CUDA, bf16 on the CPU).
    pub output_dtype: DType,
    /// The dtype of the loss (f32).
    pub loss_dtype: DType,
    /// The dtypes of the parameters' gradients (f32, the master weights').
    pub grad_dtypes: Vec<DType>,
    /// The mean loss of each epoch.
    pub epoch_losses: Vec<f64>,
    /// Whether the scaler was enabled (on CUDA only).
    pub scaler_enabled: bool,
    /// The steps taken and those the scaler skipped.
    pub steps: usize,
    /// See `steps`.
    pub skipped: usize,
    /// The scale after the last `update`.
    pub scale: f64,
}

/// 17.8, AMP: the loop over a `DataLoader` with `autocast()` (the device's default dtype)
/// and a `GradScaler` (enabled on CUDA; on the CPU bf16 needs none, and
/// `torch.cuda.amp.GradScaler` disables itself without CUDA), for `epochs` epochs on a
/// learnable task (labels from a fixed linear map of the inputs).
pub fn run_amp(device: Device, epochs: u64) -> Result<AmpReport, Error> {
    let inputs = Tensor::randn([256, 5], ())?;
    let labels = inputs.mm(&Tensor::randn([5, 3], ())?)?.argmax(1)?;
    let dataset: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![inputs, labels])?);
    let dataloader = DataLoader::new(dataset).batch_size(32).shuffle(true);
    let model = Linear::new(5, 3, ())?;
    model.to(device)?;
    let loss_fn = CrossEntropyLoss::new();
    let mut optimizer = SGD::new(
        model.parameters(),
        SgdOptions {
            lr: 0.5,
            ..Default::default()
        },
    )?;

    let mut scaler = GradScaler::with_options(
        device,
        GradScalerOptions {
            enabled: device.is_cuda(),
            ..Default::default()
        },
    )?;
    let mut report = AmpReport {
        output_dtype: DType::F32,
        loss_dtype: DType::F32,
        grad_dtypes: Vec::new(),
        epoch_losses: Vec::new(),
        scaler_enabled: scaler.is_enabled(),
        steps: 0,
        skipped: 0,
        scale: 0.0,
    };
    for epoch in 0..epochs {
        let mut total = 0.0;
        for batch in dataloader.epoch(epoch)? {
            let batch = batch?;
            // .to(device) both inputs: never mix CPU and CUDA tensors in one operation.
            let (input, target) = (batch[0].to(device)?, batch[1].to(device)?);
            optimizer.zero_grad(true)?;
            let (output, loss) = {
                let _ac = amp::autocast_with(AutocastOptions::new(device))?; // autocast()
                let output = model.call(&input)?;
                let loss = loss_fn.forward(&output, &target)?;
                (output, loss)
            };
            scaler.scale(&loss)?.backward()?;
            report.output_dtype = output.dtype();
            report.loss_dtype = loss.dtype();
            report.grad_dtypes = model
                .parameters()
                .iter()
                .filter_map(|p| p.grad().map(|g| g.dtype()))
                .collect();
            report.steps += 1;
            report.skipped += usize::from(!scaler.step(&mut optimizer)?);
            scaler.update()?;
            total += loss.item::<f32>()? as f64;
        }
        report.epoch_losses.push(total / dataloader.len() as f64);
    }
    report.scale = scaler.get_scale()?;
    println!("AMP epoch losses: {:.4?}", report.epoch_losses);
    let (first, last) = (report.epoch_losses.first(), report.epoch_losses.last());
    if let (Some(first), Some(last)) = (first, last) {
        ensure(last < first, "AMP training lowers the loss")?;
    }
    Ok(report)
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    let device = ember::try_gpu(0);
    run(device, ember::try_gpu(1))?;
    run_amp(device, 4)?;
    Ok(())
}
