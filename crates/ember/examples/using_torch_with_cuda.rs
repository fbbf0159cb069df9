//! The PyTorch walk-through "Using torch with CUDA" (docs/walkthroughs.md), replayed in Rust:
//! checking for CUDA, device-agnostic setup, moving tensors and models (to a second GPU too),
//! memory statistics and `empty_cache`, the common error of mixing CPU and GPU tensors, with
//! its fix, the AMP loop over a `DataLoader` ([`run_amp`]: `autocast()` and a
//! `GradScaler`, f16 with the scaler on CUDA, bf16 with the scaler disabled on the CPU), and
//! the cuDNN benchmark settings ([`run_cudnn`]: `benchmark = True` keeps a convolution's
//! results, `deterministic = True` repeats them exactly). 17.5's `DataParallel` is
//! `data_parallel.rs`.
//!
//! `cargo run --example using_torch_with_cuda`

use std::sync::Arc;

use ember::amp::{AutocastOptions, GradScaler, GradScalerOptions};
use ember::data::{DataLoader, Dataset, TensorDataset};
use ember::nn::{Conv2d, CrossEntropyLoss, Linear, Loss, Module, NnError};
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

    let (allocated, reserved) = (
        memory::memory_allocated(device)?,
        memory::memory_reserved(device)?,
    );
    println!("allocated {allocated} bytes, reserved {reserved} bytes");
    // empty_cache won't free memory tensors hold; it returns the cached rest.
    memory::empty_cache(device)?;
    ensure(
        memory::memory_allocated(device)? == allocated,
        "empty_cache frees no tensor's memory",
    )?;
    ensure(
        memory::memory_reserved(device)? <= reserved,
        "empty_cache gives cached memory back",
    )?;

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

/// What 17.9, "Benchmark Settings (CuDNN)", saw ([`run_cudnn`]).
#[derive(Debug)]
pub struct CudnnReport {
    /// The path convolutions took on the device (`cudnn`, or `im2col` and why; `None` on
    /// the CPU, which has no cuDNN).
    pub conv_path: Option<(String, String)>,
    /// The settings read back after `benchmark = True`, `deterministic = False`.
    pub benchmark: bool,
    /// See `benchmark`.
    pub deterministic: bool,
    /// The largest difference between the convolution's output and weight gradient with
    /// `benchmark` on and with the defaults (the algorithm may differ, the result not beyond
    /// rounding), relative to the largest value.
    pub benchmark_rel_diff: f64,
    /// With `deterministic = True`, whether two runs gave bit-identical outputs and
    /// gradients.
    pub deterministic_repeats: bool,
}

/// A convolution's output and weight gradient for `x` (forward and backward).
fn conv_step(conv: &Conv2d, x: &Tensor) -> Result<(Vec<f32>, Vec<f32>), Error> {
    conv.zero_grad(true)?;
    let y = conv.call(x)?;
    y.square()?.sum_all()?.backward()?;
    let grad = conv
        .weight
        .grad()
        .map_or(Ok(Vec::new()), |g| g.to_vec::<f32>())?;
    Ok((y.to_vec::<f32>()?, grad))
}

fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30) as f64;
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    if a.len() == b.len() {
        d as f64 / scale
    } else {
        f64::INFINITY
    }
}

/// 17.9 on `device`: `torch.backends.cudnn.benchmark = True` and `deterministic = False`
/// around a convolution, then `deterministic = True` for exact reproducibility. The
/// settings are process-wide: they are restored to the defaults at the end.
pub fn run_cudnn(device: Device) -> Result<CudnnReport, Error> {
    use ember::backends::cudnn;
    let conv = Conv2d::new(3, 8, 3, ())?;
    conv.to(device)?;
    let x = Tensor::randn([4, 3, 16, 16], device)?;
    let (y_default, g_default) = conv_step(&conv, &x)?;

    cudnn::set_benchmark(true); // let the library pick the fastest algorithm per shape
    cudnn::set_deterministic(false);
    let (benchmark, deterministic) = (cudnn::benchmark(), cudnn::deterministic());
    let (y_bench, g_bench) = conv_step(&conv, &x)?;
    let benchmark_rel_diff = rel_diff(&y_default, &y_bench).max(rel_diff(&g_default, &g_bench));

    // deterministic=True if you need exact reproducibility.
    cudnn::set_deterministic(true);
    let first = conv_step(&conv, &x)?;
    let second = conv_step(&conv, &x)?;
    cudnn::set_benchmark(false);
    cudnn::set_deterministic(false);
    let conv_path = match device {
        Device::Cuda(i) => {
            let (path, why) = cudnn::conv_path(i);
            println!("convolutions on {device}: {path} ({why})");
            Some((path.to_string(), why))
        }
        Device::Cpu => None,
    };
    Ok(CudnnReport {
        conv_path,
        benchmark,
        deterministic,
        benchmark_rel_diff,
        deterministic_repeats: first == second,
    })
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    let device = ember::try_gpu(0);
    run(device, ember::try_gpu(1))?;
    run_amp(device, 4)?;
    run_cudnn(device)?;
    Ok(())
}
