//! The PyTorch walk-through "Lesson 03: PyTorch GPU Acceleration" (docs/walkthroughs.md),
//! replayed in Rust: moving tensors between devices, device-agnostic code, several GPUs with
//! `set_device` and a device guard, a custom model (`MyModel`) moved with `to(device)`, and the
//! complete training loop over a `DataLoader` with pinned memory, worker threads and
//! non-blocking copies, then evaluation under `no_grad`; and mixed precision ([`run_amp`]):
//! the AMP training loop (`autocast()` with a `GradScaler`: f16 and a scaler on CUDA; bf16
//! and the scaler disabled on the CPU, as PyTorch recommends), "How AMP works" (`mm` in
//! f16/bf16, `cross_entropy` in f32, the scaled loss, the unscaled gradients, the scale after
//! a clean step and after an overflow), the BF16 loop without a scaler, and
//! `benchmark_precision` (time and peak memory of f32, f16 with AMP and bf16 inference).
//!
//! The "Performance Profiling" section ([`run_profiler`]): the basic profile of ten training
//! steps with its table sorted by `cuda_time_total` and a Chrome trace, `record_function`
//! sections, a schedule (`skip_first=5, wait=1, warmup=2, active=3, repeat=2`) handing each
//! cycle to `tensorboard_trace_handler`, and memory profiling with its bottlenecks.
//!
//! The memory and data-loading sections are `lesson_memory_and_data.rs`.
//!
//! `cargo run --example lesson_gpu_acceleration`

use std::sync::Arc;
use std::time::Instant;

use ember::amp::{AutocastGuard, AutocastOptions, GradScaler, GradScalerOptions};
use ember::data::{DataLoader, Dataset, TensorDataset};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU, functional as F};
use ember::optim::{Adam, AdamOptions, Optimizer, SGD, SgdOptions};
use ember::tensor::{MatmulPrecision, matmul_precision, set_float32_matmul_precision};
use ember::{DType, Device, Error, Tensor, amp, cuda, memory, no_grad};

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(ember::nn::NnError::invalid("walk-through", what).into())
    }
}

/// `class MyModel(nn.Module)`: two linear layers with a ReLU between. `#[derive(Module)]`
/// registers the fields as `nn.Module.__setattr__` registers attributes in Python.
#[derive(Debug, Module)]
pub struct MyModel {
    fc1: Linear,
    fc2: Linear,
    relu: ReLU,
}

impl MyModel {
    /// `MyModel()`.
    pub fn new() -> Result<Self, Error> {
        Ok(MyModel {
            fc1: Linear::new(100, 50, ())?,
            fc2: Linear::new(50, 10, ())?,
            relu: ReLU::new(),
        })
    }
}

impl Module for MyModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        let x = self.relu.call(&self.fc1.call(x)?)?;
        self.fc2.call(&x)
    }
}

/// One epoch: the text's `train_epoch`, returning the mean loss.
pub fn train_epoch(
    model: &dyn Module,
    dataloader: &DataLoader,
    epoch: u64,
    optimizer: &mut dyn Optimizer,
    criterion: &dyn Loss,
    device: Device,
) -> Result<f64, Error> {
    model.train(true);
    let mut total_loss = 0.0;
    for batch in dataloader.epoch(epoch)? {
        let batch = batch?;
        // Move data to the GPU; pinned batches copy without blocking the host.
        let data = batch[0].to_non_blocking(device)?;
        let target = batch[1].to_non_blocking(device)?;
        optimizer.zero_grad(true)?;
        let output = model.call(&data)?;
        let loss = criterion.forward(&output, &target)?;
        loss.backward()?;
        optimizer.step()?;
        total_loss += loss.item::<f32>()? as f64;
    }
    Ok(total_loss / dataloader.len() as f64)
}

/// Runs the walk-through with `device` (and `second` as the other GPU when there are two).
pub fn run(device: Device, second: Device) -> Result<(), Error> {
    // Moving tensors between devices.
    let x_cpu = Tensor::randn([100, 100], ())?;
    let x_gpu = x_cpu.to(device)?; // x_cpu.cuda() / x_cpu.to('cuda')
    let y_gpu = Tensor::randn([100, 100], device)?; // created on the device directly
    let result_cpu = x_gpu.to("cpu")?;
    ensure(
        result_cpu.to_vec::<f32>()? == x_cpu.to_vec::<f32>()?,
        "the round trip is exact",
    )?;

    // Device-agnostic code.
    let x = Tensor::randn([100, 100], device)?;
    let result = x.mm(&y_gpu)?; // torch.mm(x, y)
    ensure(result.device() == device, "the product lives on the device")?;

    // Several GPUs.
    let n_gpus = cuda::device_count();
    for i in 0..n_gpus {
        println!("GPU {i}: {}", cuda::get_device_name(i)?);
    }
    let a = Tensor::randn([100], device)?; // on the first GPU
    let b = Tensor::randn([100], second)?; // on the second
    ensure(
        a.device() == device && b.device() == second,
        "tensors on their GPUs",
    )?;
    if let (Device::Cuda(i), Device::Cuda(j)) = (device, second) {
        cuda::set_device(i)?; // torch.cuda.set_device(0)
        ensure(
            Tensor::randn([10], ())?.cuda()?.device() == Device::Cuda(i),
            ".cuda() uses the current device",
        )?;
        {
            let _guard = cuda::DeviceGuard::new(j)?; // with torch.cuda.device(1):
            ensure(
                Tensor::randn([10], ())?.cuda()?.device() == Device::Cuda(j),
                "inside the guard",
            )?;
        }
        ensure(
            cuda::current_device()? == i,
            "the guard restores the device",
        )?;
    }

    // A custom model, moved: every parameter follows.
    let model = MyModel::new()?;
    model.to(device)?;
    for (name, param) in model.named_parameters() {
        println!("{name}: {}", param.device());
        ensure(param.device() == device, "parameters on the device")?;
    }

    // A learnable task: the labels are the arg-max of a fixed linear map of the inputs.
    let inputs = Tensor::randn([512, 100], ())?;
    let teacher = Tensor::randn([100, 10], ())?;
    let labels = inputs.mm(&teacher)?.argmax(1)?;
    let dataset: Arc<dyn Dataset> =
        Arc::new(TensorDataset::new(vec![inputs.clone(), labels.clone()])?);
    let train_loader = DataLoader::new(dataset)
        .batch_size(32)
        .shuffle(true)
        .pin_memory(true) // pinned batches, for non-blocking copies
        .num_workers(2);

    // The text uses Adam's defaults; a larger step lets this small example converge in a
    // few epochs.
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 0.01,
            ..Default::default()
        },
    )?;
    let criterion = CrossEntropyLoss::new();
    let mut losses = Vec::new();
    for epoch in 0..5 {
        let loss = train_epoch(
            &model,
            &train_loader,
            epoch,
            &mut optimizer,
            &criterion,
            device,
        )?;
        println!("Epoch {epoch}: Loss = {loss:.4}");
        losses.push(loss);
    }
    ensure(losses[4] < 0.7 * losses[0], "training lowers the loss")?;

    // Evaluation: no graph is recorded under no_grad.
    model.eval();
    let _g = no_grad();
    let predictions = model.call(&inputs.to(device)?)?;
    ensure(
        !predictions.requires_grad() && predictions.grad_fn_name().is_none(),
        "no graph under no_grad",
    )?;
    let correct = predictions
        .argmax(1)?
        .eq(&labels.to(device)?)?
        .to_dtype(ember::DType::F32)?
        .mean_all()?
        .item::<f32>()?;
    println!("training accuracy: {:.1}%", 100.0 * correct);
    ensure(correct > 0.5, "the model learned the task")?;
    Ok(())
}

/// The lesson's learnable task: 512 inputs of 100 features, labelled by the arg-max of a
/// fixed linear map, in pinned batches of 32 from two workers.
fn task_loader() -> Result<DataLoader, Error> {
    let inputs = Tensor::randn([512, 100], ())?;
    let teacher = Tensor::randn([100, 10], ())?;
    let labels = inputs.mm(&teacher)?.argmax(1)?;
    let dataset: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![inputs, labels])?);
    Ok(DataLoader::new(dataset)
        .batch_size(32)
        .shuffle(true)
        .pin_memory(true)
        .num_workers(2))
}

/// `torch.cuda.amp.autocast()`: an autocast region on `device`'s type in its default dtype
/// (f16 on CUDA, bf16 on the CPU).
pub fn autocast(device: Device) -> Result<AutocastGuard, Error> {
    amp::autocast_with(AutocastOptions::new(device))
}

/// `GradScaler()` for a loop on `device`: enabled on CUDA, where autocast computes in f16;
/// disabled (every call a pass-through) on the CPU, where autocast computes in bf16, which
/// has f32's range and needs no scaling (as `torch.cuda.amp.GradScaler` disables itself
/// without CUDA).
pub fn grad_scaler(device: Device) -> Result<GradScaler, Error> {
    GradScaler::with_options(
        device,
        GradScalerOptions {
            enabled: device.is_cuda(),
            ..Default::default()
        },
    )
}

/// What the lesson's mixed-precision sections saw ([`run_amp`]), for the tests.
#[derive(Debug)]
pub struct AmpReport {
    /// The dtype `autocast()` took on the device (f16 on CUDA, bf16 on the CPU).
    pub autocast_dtype: DType,
    /// Whether the AMP loop's scaler was enabled (on CUDA only).
    pub scaler_enabled: bool,
    /// The mean loss of each epoch of the AMP loop.
    pub amp_losses: Vec<f64>,
    /// The dtype of the model's output inside `autocast()`.
    pub output_dtype: DType,
    /// The dtype of the loss (`CrossEntropyLoss` runs in f32 under autocast).
    pub loss_dtype: DType,
    /// The dtypes of the parameters' gradients after the scaled backward.
    pub grad_dtypes: Vec<DType>,
    /// The optimizer steps the AMP loop took and the ones the scaler skipped (inf/NaN).
    pub steps: usize,
    /// See `steps`.
    pub skipped: usize,
    /// The loop's scale after its last `update` (1 when the scaler is disabled).
    pub scale: f64,
    /// "How AMP works": the dtype of `torch.mm` under autocast.
    pub mm_dtype: DType,
    /// "How AMP works": the dtype of `F.cross_entropy` under autocast.
    pub cross_entropy_dtype: DType,
    /// The scaled loss over the loss (the scale, 65536).
    pub loss_scale: f64,
    /// Whether `unscale_` left exactly the scaled gradients over the scale.
    pub unscaled_exactly: bool,
    /// The largest difference between the unscaled AMP gradients and the f32 ones, relative
    /// to the largest f32 gradient.
    pub grad_rel_error: f64,
    /// The scale after a clean step (kept, growth comes after 2000), and after an
    /// overflowing one (halved).
    pub scale_after_clean: f64,
    /// See `scale_after_clean`.
    pub scale_after_overflow: f64,
    /// Whether the scaler stepped on the overflow (it must not).
    pub stepped_on_overflow: bool,
    /// The mean loss of each epoch of the BF16 loop (no scaler).
    pub bf16_losses: Vec<f64>,
    /// The dtype of the model's output in the BF16 loop.
    pub bf16_output_dtype: DType,
    /// `benchmark_precision`'s rows: f32, f16 with AMP, bf16.
    pub benchmark: Vec<PrecisionRun>,
}

/// One row of [`benchmark_precision`].
#[derive(Debug, Clone)]
pub struct PrecisionRun {
    /// "FP32", "FP16" or "BF16".
    pub name: &'static str,
    /// Wall time of the iterations, with the device synchronised at the end.
    pub seconds: f64,
    /// Peak bytes allocated on the device above what was allocated before the loop.
    pub peak_bytes: u64,
}

/// Runs `iterations` forward passes of `model` on `data` under `no_grad` (and autocast in
/// `autocast_dtype` if given), timed to a synchronised device, with the peak memory above
/// the start.
fn time_inference(
    model: &MyModel,
    data: &Tensor,
    iterations: usize,
    autocast_dtype: Option<DType>,
) -> Result<(f64, u64), Error> {
    let device = data.device();
    let base = memory::memory_allocated(device)?;
    memory::reset_peak_memory_stats(device)?;
    let start = Instant::now();
    for _ in 0..iterations {
        let _g = no_grad();
        let _ac = match autocast_dtype {
            Some(dt) => Some(amp::autocast(device, dt)?),
            None => None,
        };
        model.call(data)?;
    }
    if let Device::Cuda(i) = device {
        cuda::synchronize(Some(i))?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let peak = memory::max_memory_allocated(device)?.saturating_sub(base);
    Ok((seconds, peak))
}

/// The lesson's `benchmark_precision`: the same inference in FP32 (the baseline), in FP16
/// with AMP (`model.half()`, `data.half()`, under autocast in f16) and in BF16
/// (`model.bfloat16()`), printing the time and speedup of each and its peak memory. Casts the
/// model in place, as `model.half()` does: it ends in bf16. (The FP16 row runs under
/// autocast in f16 on every device: on the CPU, `autocast()` alone would mean bf16.)
pub fn benchmark_precision(
    model: &MyModel,
    data: &Tensor,
    iterations: usize,
) -> Result<Vec<PrecisionRun>, Error> {
    let mut runs = Vec::new();
    for (name, dtype, autocast_dtype) in [
        ("FP32", DType::F32, None),
        ("FP16", DType::F16, Some(DType::F16)),
        ("BF16", DType::Bf16, None),
    ] {
        model.to(dtype)?; // model.float() / model.half() / model.bfloat16()
        let data = data.to_dtype(dtype)?;
        let (seconds, peak_bytes) = time_inference(model, &data, iterations, autocast_dtype)?;
        runs.push(PrecisionRun {
            name,
            seconds,
            peak_bytes,
        });
    }
    let base = runs[0].seconds;
    for r in &runs {
        let speed = if r.name == "FP32" {
            "baseline".to_string()
        } else {
            format!("{:.2}x speedup", base / r.seconds)
        };
        println!(
            "{}: {:.3}s ({speed}), peak memory {:.1} KiB",
            r.name,
            r.seconds,
            r.peak_bytes as f64 / 1024.0
        );
    }
    Ok(runs)
}

/// The mixed-precision sections of the lesson on `device`, with `epochs` epochs for each
/// training loop and `iterations` for the benchmark.
pub fn run_amp(device: Device, epochs: u64, iterations: usize) -> Result<AmpReport, Error> {
    let train_loader = task_loader()?;
    let criterion = CrossEntropyLoss::new();

    // Automatic Mixed Precision: the training loop.
    let mut scaler = grad_scaler(device)?; // scaler = GradScaler()
    let model = MyModel::new()?;
    model.to(device)?;
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 0.01,
            ..Default::default()
        },
    )?;
    let (mut output_dtype, mut loss_dtype, mut grad_dtypes) = (DType::F32, DType::F32, vec![]);
    let (mut steps, mut skipped) = (0, 0);
    let mut autocast_dtype = DType::F32;
    let mut amp_losses = Vec::new();
    for epoch in 0..epochs {
        let mut total = 0.0;
        for (batch_idx, batch) in train_loader.epoch(epoch)?.enumerate() {
            let batch = batch?;
            let data = batch[0].to_non_blocking(device)?;
            let target = batch[1].to_non_blocking(device)?;
            optimizer.zero_grad(true)?;
            // Forward pass with autocast.
            let (output, loss) = {
                let _ac = autocast(device)?;
                autocast_dtype = amp::get_autocast_dtype(device);
                let output = model.call(&data)?;
                let loss = criterion.forward(&output, &target)?;
                (output, loss)
            };
            // Backward pass with gradient scaling.
            scaler.scale(&loss)?.backward()?;
            if batch_idx == 0 && epoch == 0 {
                output_dtype = output.dtype();
                loss_dtype = loss.dtype();
                grad_dtypes = model
                    .parameters()
                    .iter()
                    .filter_map(|p| p.grad().map(|g| g.dtype()))
                    .collect();
            }
            // Optimizer step with unscaling.
            if !scaler.step(&mut optimizer)? {
                skipped += 1;
            }
            scaler.update()?;
            steps += 1;
            let loss = loss.item::<f32>()? as f64;
            if batch_idx % 100 == 0 {
                println!("Loss: {loss:.4}");
            }
            total += loss;
        }
        amp_losses.push(total / train_loader.len() as f64);
    }
    println!("AMP epoch losses: {amp_losses:.4?}");
    let first_last = (amp_losses.first(), amp_losses.last());
    if let (Some(&first), Some(&last)) = first_last {
        ensure(last < first, "AMP training lowers the loss")?;
    }
    ensure(
        grad_dtypes.iter().all(|&d| d == DType::F32),
        "f32 master weights get f32 gradients",
    )?;

    // How AMP works. 1. autocast() casts operations: mm in f16 (bf16 on the CPU),
    // cross_entropy in f32.
    let x = Tensor::randn([64, 100], device)?;
    let y = Tensor::randn([100, 10], device)?.requires_grad_(true)?; // a weight
    let target = Tensor::randint(0, 10, [64], device)?;
    let (z, loss) = {
        let _ac = autocast(device)?;
        let z = x.mm(&y)?; // FP16 matrix multiplication
        let loss = F::cross_entropy(&z, &target, ())?; // FP32 loss
        (z, loss)
    };
    println!("mm: {}, cross_entropy: {}", z.dtype(), loss.dtype());
    // 2. GradScaler prevents gradient underflow. Enabled here on every device, to show the
    // mechanism (`torch.amp.GradScaler("cpu")` works too; bf16 just does not need it).
    let mut demo = GradScaler::new(device);
    let mut sgd = SGD::new(
        vec![y.clone()],
        SgdOptions {
            lr: 0.1,
            ..Default::default()
        },
    )?;
    let scaled_loss = demo.scale(&loss)?; // loss * scale_factor, scale_factor = 65536
    let loss_scale = scaled_loss.item::<f32>()? as f64 / loss.item::<f32>()? as f64;
    scaled_loss.backward()?; // scaled gradients
    let scaled: Vec<f32> = grad_of(&y)?;
    demo.unscale_(&mut sgd)?; // unscaled_grads = grads / scale_factor
    let unscaled: Vec<f32> = grad_of(&y)?;
    let unscaled_exactly = scaled.iter().zip(&unscaled).all(|(s, u)| s / 65536.0 == *u);
    // The same gradients in f32, without autocast.
    let y32 = y.detach().requires_grad_(true)?;
    F::cross_entropy(&x.mm(&y32)?, &target, ())?.backward()?;
    let exact = grad_of(&y32)?;
    let largest = exact.iter().fold(0f32, |m, g| m.max(g.abs())) as f64;
    let grad_rel_error = unscaled
        .iter()
        .zip(&exact)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs() as f64))
        / largest;
    println!("unscaled AMP gradients within {grad_rel_error:.1e} of f32's (relative)");
    demo.step(&mut sgd)?; // optimizer.step()
    demo.update()?; // increase if no overflow (after 2000 clean steps), decrease if overflow
    let scale_after_clean = demo.get_scale()?;
    // An overflow: a loss so large that its scaled gradients are inf. The step is skipped
    // and the scale halved.
    sgd.zero_grad(true)?;
    let before = y.to_vec::<f32>()?;
    let huge = {
        let _ac = autocast(device)?;
        F::cross_entropy(&x.mm(&y)?, &target, ())?.mul(1e35)?
    };
    demo.scale(&huge)?.backward()?;
    let stepped_on_overflow = demo.step(&mut sgd)?;
    demo.update()?;
    let scale_after_overflow = demo.get_scale()?;
    ensure(
        y.to_vec::<f32>()? == before,
        "a skipped step leaves the weight",
    )?;
    println!(
        "scale: {scale_after_clean} after a clean step, {scale_after_overflow} after an overflow"
    );

    // BFloat16: f32's range, so no gradient scaling.
    let precision = matmul_precision();
    set_float32_matmul_precision("medium")?;
    let model = MyModel::new()?;
    model.to(device)?;
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 0.01,
            ..Default::default()
        },
    )?;
    let mut bf16_losses = Vec::new();
    let mut bf16_output_dtype = DType::F32;
    for epoch in 0..epochs {
        let mut total = 0.0;
        for batch in train_loader.epoch(epoch)? {
            let batch = batch?;
            let data = batch[0].to_non_blocking(device)?;
            let target = batch[1].to_non_blocking(device)?;
            optimizer.zero_grad(true)?;
            let (output, loss) = {
                let _ac = amp::autocast(device, DType::Bf16)?;
                let output = model.call(&data)?;
                let loss = criterion.forward(&output, &target)?;
                (output, loss)
            };
            bf16_output_dtype = output.dtype();
            loss.backward()?; // no scaler needed
            optimizer.step()?;
            total += loss.item::<f32>()? as f64;
        }
        bf16_losses.push(total / train_loader.len() as f64);
    }
    set_float32_matmul_precision(match precision {
        MatmulPrecision::Highest => "highest",
        MatmulPrecision::High => "high",
        MatmulPrecision::Medium => "medium",
    })?;
    println!("BF16 epoch losses: {bf16_losses:.4?}");

    // Comparing precision types (the text's data is 128 x 1000 for its wider MyModel; this
    // one takes 100 features).
    let model = MyModel::new()?;
    model.to(device)?;
    let data = Tensor::randn([128, 100], device)?;
    let benchmark = benchmark_precision(&model, &data, iterations)?;

    Ok(AmpReport {
        autocast_dtype,
        scaler_enabled: scaler.is_enabled(),
        amp_losses,
        output_dtype,
        loss_dtype,
        grad_dtypes,
        steps,
        skipped,
        scale: scaler.get_scale()?,
        mm_dtype: z.dtype(),
        cross_entropy_dtype: loss.dtype(),
        loss_scale,
        unscaled_exactly,
        grad_rel_error,
        scale_after_clean,
        scale_after_overflow,
        stepped_on_overflow,
        bf16_losses,
        bf16_output_dtype,
        benchmark,
    })
}

/// What the "Performance Profiling" section's runs showed.
#[derive(Debug)]
pub struct ProfilerReport {
    /// "Basic profiling": the table sorted by `cuda_time_total`.
    pub basic_table: String,
    /// Rows of that table's `key_averages()` with device time.
    pub basic_device_rows: usize,
    /// "Detailed profiling with record_function", with `activities=[CUDA]` as the text has
    /// it: the rows (name, host time, device time in ns); device work only, so none on the
    /// CPU.
    pub cuda_only_rows: Vec<(String, u64, u64)>,
    /// "Advanced profiling": the trace files `tensorboard_trace_handler('./log')` wrote.
    pub tensorboard_files: Vec<std::path::PathBuf>,
    /// The `ProfilerStep#N` of each of those traces.
    pub recorded_steps: Vec<Vec<String>>,
    /// "Memory profiling": the table sorted by `self_cuda_memory_usage`.
    pub memory_table: String,
    /// Its memory bottlenecks: `(key, self_cuda_memory_usage)`, largest first, at most 5.
    pub memory_events: Vec<(String, i64)>,
}

/// The lesson's "Performance Profiling" section on `device`, writing the TensorBoard traces
/// under `log_dir` (the text's `./log`).
pub fn run_profiler(device: Device, log_dir: &std::path::Path) -> Result<ProfilerReport, Error> {
    use ember::profiler::{
        ProfileOptions, ProfilerActivity, profile, record_function, schedule,
        tensorboard_trace_handler,
    };
    let model = MyModel::new()?;
    model.to(device)?;
    let criterion = CrossEntropyLoss::new();
    let mut optimizer = Adam::new(model.parameters(), AdamOptions::default())?;
    let inputs = Tensor::randn([400, 100], ())?;
    let labels = Tensor::randint(0, 10, [400], ())?;
    let dataset: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![inputs, labels])?);
    let train_loader = DataLoader::new(dataset).batch_size(16).shuffle(true);
    let mut batches = train_loader.epoch(0)?;
    let mut next_batch = || -> Result<(Tensor, Tensor), Error> {
        let b = match batches.next() {
            Some(b) => b?,
            None => {
                return Err(ember::nn::NnError::invalid("walk-through", "out of batches").into());
            }
        };
        Ok((b[0].to(device)?, b[1].to(device)?))
    };
    let step = |optimizer: &mut Adam, data: &Tensor, target: &Tensor| -> Result<(), Error> {
        let output = model.call(data)?;
        let loss = criterion.forward(&output, target)?;
        loss.backward()?;
        optimizer.step()?;
        optimizer.zero_grad(true)
    };

    // Basic profiling.
    let mut prof =
        profile(ProfileOptions::new().activities([ProfilerActivity::Cpu, ProfilerActivity::Cuda]))?;
    for _ in 0..10 {
        let (data, target) = next_batch()?;
        step(&mut optimizer, &data, &target)?;
    }
    prof.stop()?;
    let averages = prof.key_averages()?;
    let basic_table = averages.table("cuda_time_total", 10)?;
    println!("{basic_table}");
    let basic_device_rows = averages
        .rows
        .iter()
        .filter(|r| r.device_time_total > 0)
        .count();
    prof.export_chrome_trace(log_dir.join("trace.json"))?;
    drop(prof);

    // Detailed profiling with record_function.
    let mut prof = profile(ProfileOptions::new().activities([ProfilerActivity::Cuda]))?;
    {
        let (data, target) = {
            let _r = record_function("data_loading");
            next_batch()?
        };
        let output = {
            let _r = record_function("forward");
            model.call(&data)?
        };
        let loss = {
            let _r = record_function("loss");
            criterion.forward(&output, &target)?
        };
        {
            let _r = record_function("backward");
            loss.backward()?;
        }
        let _r = record_function("optimizer");
        optimizer.step()?;
    }
    prof.stop()?;
    let averages = prof.key_averages()?;
    println!("{}", averages.table("cuda_time_total", 100)?);
    let cuda_only_rows = averages
        .rows
        .iter()
        .map(|r| (r.key.clone(), r.cpu_time_total, r.device_time_total))
        .collect();
    drop(prof);

    // Advanced profiling: skip 5 batches, wait 1, warm up 2, record 3, twice.
    let recorded: Arc<std::sync::Mutex<Vec<Vec<String>>>> = Arc::default();
    let seen = recorded.clone();
    let mut handler = tensorboard_trace_handler(log_dir, None);
    let mut prof = profile(
        ProfileOptions::new()
            .activities([ProfilerActivity::Cpu, ProfilerActivity::Cuda])
            .schedule(schedule(5, 1, 2, 3, 2)?)
            .on_trace_ready(move |p| {
                seen.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(
                        p.events
                            .iter()
                            .filter(|e| e.name.starts_with("ProfilerStep#"))
                            .map(|e| e.name.clone())
                            .collect(),
                    );
                handler(p)
            })
            .record_shapes(true)
            .profile_memory(true)
            .with_stack(true),
    )?;
    for batch in train_loader.epoch(1)? {
        let batch = batch?;
        let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
        step(&mut optimizer, &data, &target)?;
        prof.step()?; // Signal end of step
    }
    prof.stop()?;
    drop(prof);
    let mut tensorboard_files: Vec<std::path::PathBuf> = std::fs::read_dir(log_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".pt.trace.json"))
        .collect();
    tensorboard_files.sort();

    // Memory profiling.
    let mut prof = profile(
        ProfileOptions::new()
            .activities([ProfilerActivity::Cuda])
            .profile_memory(true)
            .record_shapes(true),
    )?;
    for _ in 0..10 {
        let (data, target) = next_batch()?;
        step(&mut optimizer, &data, &target)?;
    }
    prof.stop()?;
    let averages = prof.key_averages()?;
    let memory_table = averages.table("self_cuda_memory_usage", 10)?;
    println!("{memory_table}");
    // Find memory bottlenecks.
    let mut memory_events: Vec<(String, i64)> = averages
        .rows
        .iter()
        .filter(|e| e.self_device_memory_usage > 0)
        .map(|e| (e.key.clone(), e.self_device_memory_usage))
        .collect();
    memory_events.sort_by_key(|e| std::cmp::Reverse(e.1));
    memory_events.truncate(5);
    for (key, bytes) in &memory_events {
        println!("{key}: {:.2} MB", *bytes as f64 / (1024.0 * 1024.0));
    }
    let recorded_steps = recorded
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok(ProfilerReport {
        basic_table,
        basic_device_rows,
        cuda_only_rows,
        tensorboard_files,
        recorded_steps,
        memory_table,
        memory_events,
    })
}

/// The gradient of `t` as f32 values (empty without one).
fn grad_of(t: &Tensor) -> Result<Vec<f32>, Error> {
    t.grad().map_or(Ok(Vec::new()), |g| g.to_vec::<f32>())
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    let device = ember::try_gpu(0);
    run(device, ember::try_gpu(1))?;
    run_amp(device, 5, 100)?;
    run_profiler(device, std::path::Path::new("log"))?;
    Ok(())
}
