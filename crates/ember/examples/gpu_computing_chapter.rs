//! The PyTorch walk-through "GPU Computing" (docs/walkthroughs.md), replayed in Rust: device
//! discovery and properties, creating tensors on a device and moving them with `to`, `cpu()`,
//! pinned memory with non-blocking copies, the allocator's statistics (`memory_allocated`, its
//! peak, `memory_reserved`, `memory_summary`), freeing memory (`drop` is `del`, then
//! `empty_cache`), `no_grad` inference, gradient checkpointing of a model's blocks, with
//! the peak memory it saves, and automatic mixed precision ([`run_amp`]): the AMP training
//! loop with `autocast()` and a `GradScaler` (f16 with the scaler on CUDA, bf16 with the
//! scaler disabled on the CPU, as PyTorch recommends), on the model with and without
//! checkpointing, which must train alike.
//!
//! The profiler section ([`run_profiler`], `torch_profiler.py`): ten forward and backward
//! passes under `profile(activities=[CPU, CUDA], record_shapes, profile_memory)`, the table
//! sorted by `cuda_time_total`, `export_chrome_trace`, and a schedule
//! (`wait=1, warmup=1, active=3, repeat=2`) handing its cycles to `tensorboard_trace_handler`.
//!
//! `cargo run --example gpu_computing_chapter`

use std::sync::Arc;

use ember::amp::{AutocastOptions, GradScaler, GradScalerOptions};
use ember::data::{DataLoader, Dataset, TensorDataset};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU, Sequential, checkpoint};
use ember::optim::{Adam, AdamOptions, Optimizer};
use ember::{DType, Device, Error, Tensor, amp, cuda, memory, no_grad};

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(ember::nn::NnError::invalid("walk-through", what).into())
    }
}

/// `class LargeModel(nn.Module)` whose forward checkpoints its two blocks. The derive
/// registers `stem`, `block1` and `block2` as children (the flag is plain data).
#[derive(Debug, Module)]
pub struct LargeModel {
    stem: Linear,
    block1: Arc<dyn Module>,
    block2: Arc<dyn Module>,
    checkpointing: bool,
}

fn block(width: usize, depth: usize) -> Result<Sequential, Error> {
    let mut s = Sequential::new();
    for _ in 0..depth {
        s = s.add(Linear::new(width, width, ())?).add(ReLU::new());
    }
    Ok(s)
}

impl LargeModel {
    /// Two blocks of `depth` linear layers of `width`, with or without checkpointing.
    pub fn new(width: usize, depth: usize, checkpointing: bool) -> Result<Self, Error> {
        Ok(LargeModel {
            stem: Linear::new(width, width, ())?,
            block1: Arc::new(block(width, depth)?),
            block2: Arc::new(block(width, depth)?),
            checkpointing,
        })
    }
}

impl Module for LargeModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        let x = self.stem.call(x)?;
        if self.checkpointing {
            // Recompute activations during the backward pass instead of storing them.
            let x = checkpoint(self.block1.clone(), &x)?;
            checkpoint(self.block2.clone(), &x)
        } else {
            self.block2.call(&self.block1.call(&x)?)
        }
    }
}

/// Peak bytes allocated on `device` during forward and backward, and the gradients.
fn train_step(
    model: &LargeModel,
    x: &Tensor,
    device: Device,
) -> Result<(u64, Vec<Vec<f32>>), Error> {
    model.zero_grad(true)?;
    let base = memory::memory_allocated(device)?;
    memory::reset_peak_memory_stats(device)?;
    model.call(x)?.square()?.mean_all()?.backward()?;
    let peak = memory::max_memory_allocated(device)? - base;
    let grads = model
        .parameters()
        .iter()
        .map(|p| {
            p.grad()
                .map(|g| g.to_vec::<f32>())
                .unwrap_or(Ok(Vec::new()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((peak, grads))
}

/// Runs the walk-through on `device` (and `second` as `cuda:1`).
pub fn run(device: Device, second: Device) -> Result<(), Error> {
    println!("{}", cuda::is_available()); // True if a GPU is available
    println!("{}", cuda::device_count());
    if cuda::device_count() > 0 {
        println!("{}", cuda::current_device()?);
        println!("{}", cuda::get_device_name(0)?);
        let props = cuda::get_device_properties(0)?;
        println!(
            "{} {} bytes, compute capability {}.{}, {} SMs",
            props.name, props.total_memory, props.major, props.minor, props.multi_processor_count
        );
    }

    // Creating tensors on a device, and moving them.
    let x = Tensor::randn([1000, 1000], device)?;
    let y = Tensor::randn([1000, 1000], ())?.to(device)?; // or y.cuda()
    let z = Tensor::randn([1000, 1000], second)?; // cuda:1
    let w = x.zeros_like()?; // same device as x
    ensure(
        y.device() == device && z.device() == second && w.device() == device,
        "tensors where asked",
    )?;

    // The .to() method.
    let cpu_tensor = Tensor::randn([1000, 1000], ())?;
    let gpu_tensor = cpu_tensor.to(device)?;
    let back_to_cpu = gpu_tensor.cpu()?; // or .to("cpu")
    ensure(
        back_to_cpu.to_vec::<f32>()? == cpu_tensor.to_vec::<f32>()?,
        "exact round trip",
    )?;
    let model = Linear::new(1000, 100, ())?;
    model.to(device)?;

    // Non-blocking transfers from pinned memory.
    let pinned_tensor = cpu_tensor.pin_memory()?;
    let gpu_tensor = pinned_tensor.to_non_blocking(device)?;
    ensure(
        gpu_tensor.to_vec::<f32>()? == cpu_tensor.to_vec::<f32>()?,
        "non-blocking copy delivers the data",
    )?;

    // Monitoring memory.
    let allocated = memory::memory_allocated(device)?;
    let max_allocated = memory::max_memory_allocated(device)?;
    let reserved = memory::memory_reserved(device)?;
    println!("Allocated: {:.3} GB", allocated as f64 / 1e9);
    println!("Peak allocated: {:.3} GB", max_allocated as f64 / 1e9);
    println!("Reserved: {:.3} GB", reserved as f64 / 1e9);
    if let Device::Cuda(i) = device {
        let total = cuda::get_device_properties(i)?.total_memory;
        println!("Total: {:.3} GB", total as f64 / 1e9);
        ensure(reserved <= total, "reserved fits in the device")?;
    }
    ensure(
        allocated <= max_allocated && allocated <= reserved,
        "allocated <= peak, allocated <= reserved",
    )?;
    println!("{}", memory::memory_summary(device)?);

    // Freeing memory: del large_tensor; torch.cuda.empty_cache().
    let reserved_before = memory::memory_reserved(device)?;
    let large_tensor = Tensor::zeros([2048, 2048], device)?;
    let with_large = memory::memory_allocated(device)?;
    // Whether the allocator made a segment for it (rather than reusing a cached block).
    let new_segment = memory::memory_reserved(device)? > reserved_before;
    drop(large_tensor);
    // Its block goes back: at least its 16 MiB, and less than 1 MiB more (a cached block up
    // to 1 MiB larger than a large request is handed out whole, as PyTorch's allocator does,
    // and memory_allocated counts blocks).
    let after = memory::memory_allocated(device)?;
    let freed = with_large.saturating_sub(after);
    const LARGE: u64 = 2048 * 2048 * 4;
    ensure(
        (LARGE..LARGE + (1 << 20)).contains(&freed),
        &format!("del frees the tensor's block ({freed} bytes freed, the tensor has {LARGE})"),
    )?;
    let cached = memory::memory_reserved(device)?;
    memory::empty_cache(device)?;
    // empty_cache returns whole free segments: the tensor's, if it had one of its own.
    let released = memory::memory_reserved(device)?;
    ensure(
        released <= cached && (!new_segment || released < cached),
        "empty_cache releases the cached block",
    )?;
    // empty_cache does not free memory held by tensors.
    ensure(
        memory::memory_allocated(device)? == after,
        "live tensors stay",
    )?;

    // no_grad: gradient tensors are not stored.
    let inputs = Tensor::randn([64, 1000], device)?;
    let predictions = {
        let _g = no_grad();
        model.call(&inputs)?
    };
    ensure(
        predictions.grad_fn_name().is_none(),
        "no graph under no_grad",
    )?;

    // Gradient checkpointing: same gradients, lower peak memory.
    // Narrow layers and a large batch: activations, not weights, fill the memory.
    let (width, depth) = (64, 8);
    ember::tensor::random::manual_seed(0);
    let plain = LargeModel::new(width, depth, false)?;
    ember::tensor::random::manual_seed(0);
    let ckpt = LargeModel::new(width, depth, true)?;
    plain.to(device)?;
    ckpt.to(device)?;
    let xb = Tensor::randn([4096, width], device)?;
    let (peak_plain, g_plain) = train_step(&plain, &xb, device)?;
    let (peak_ckpt, g_ckpt) = train_step(&ckpt, &xb, device)?;
    println!("peak memory of a step: {peak_plain} bytes plain, {peak_ckpt} bytes checkpointed");
    ensure(
        g_plain.iter().all(|g| !g.is_empty()),
        "every parameter got a gradient",
    )?;
    ensure(g_plain == g_ckpt, "checkpointing gives the same gradients")?;
    // With two checkpointed blocks, about half of the activations are alive at a time.
    ensure(
        peak_ckpt * 10 < peak_plain * 8,
        "checkpointing lowers the peak by more than 20%",
    )?;
    Ok(())
}

/// One AMP training run ([`amp_train`]).
#[derive(Debug)]
pub struct AmpRun {
    /// The mean loss of each epoch.
    pub epoch_losses: Vec<f64>,
    /// The dtype of the model's output under `autocast()` (f16 on CUDA, bf16 on the CPU).
    pub output_dtype: DType,
    /// The dtype of the loss (f32: cross-entropy runs in f32 under autocast).
    pub loss_dtype: DType,
    /// The dtypes of the parameters' gradients after the scaled backward (f32).
    pub grad_dtypes: Vec<DType>,
    /// Whether the scaler was enabled (on CUDA only).
    pub scaler_enabled: bool,
    /// The optimizer steps, those the scaler skipped, and the scale after the last update.
    pub steps: usize,
    /// See `steps`.
    pub skipped: usize,
    /// See `steps`.
    pub scale: f64,
    /// The parameters after training.
    pub weights: Vec<Vec<f32>>,
}

/// The chapter's AMP loop: `scaler = GradScaler()`, Adam, and for each batch the forward
/// and the loss under `autocast()` (the device's default dtype), `scaler.scale(loss)
/// .backward()`, `scaler.step(optimizer)`, `scaler.update()`.
pub fn amp_train(
    model: &LargeModel,
    train_loader: &DataLoader,
    device: Device,
    num_epochs: u64,
) -> Result<AmpRun, Error> {
    // Initialize the gradient scaler: f16 on CUDA needs it; on the CPU autocast computes in
    // bf16 (f32's range) and the scaler is disabled, as `torch.cuda.amp.GradScaler` disables
    // itself without CUDA.
    let mut scaler = GradScaler::with_options(
        device,
        GradScalerOptions {
            enabled: device.is_cuda(),
            ..Default::default()
        },
    )?;
    model.to(device)?;
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 0.01,
            ..Default::default()
        },
    )?;
    let criterion = CrossEntropyLoss::new();
    let mut run = AmpRun {
        epoch_losses: Vec::new(),
        output_dtype: DType::F32,
        loss_dtype: DType::F32,
        grad_dtypes: Vec::new(),
        scaler_enabled: scaler.is_enabled(),
        steps: 0,
        skipped: 0,
        scale: 0.0,
        weights: Vec::new(),
    };
    for epoch in 0..num_epochs {
        let mut total = 0.0;
        for batch in train_loader.epoch(epoch)? {
            let batch = batch?;
            let inputs = batch[0].to(device)?; // inputs.cuda()
            let targets = batch[1].to(device)?;
            optimizer.zero_grad(true)?;
            // Forward pass with automatic casting to FP16.
            let (outputs, loss) = {
                let _ac = amp::autocast_with(AutocastOptions::new(device))?;
                let outputs = model.call(&inputs)?;
                let loss = criterion.forward(&outputs, &targets)?;
                (outputs, loss)
            };
            // Backward pass with scaled gradients.
            scaler.scale(&loss)?.backward()?;
            run.output_dtype = outputs.dtype();
            run.loss_dtype = loss.dtype();
            run.grad_dtypes = model
                .parameters()
                .iter()
                .filter_map(|p| p.grad().map(|g| g.dtype()))
                .collect();
            // Unscale and update.
            run.steps += 1;
            run.skipped += usize::from(!scaler.step(&mut optimizer)?);
            scaler.update()?;
            total += loss.item::<f32>()? as f64;
        }
        run.epoch_losses.push(total / train_loader.len() as f64);
    }
    run.scale = scaler.get_scale()?;
    run.weights = model
        .parameters()
        .iter()
        .map(|p| p.to_vec::<f32>())
        .collect::<Result<_, _>>()?;
    Ok(run)
}

/// Mixed precision on `device`: the AMP loop for `epochs` epochs on a learnable task (the
/// labels are the arg-max of a fixed linear map of the inputs), on the chapter's model
/// without and with gradient checkpointing. Returns both runs.
pub fn run_amp(device: Device, epochs: u64) -> Result<(AmpRun, AmpRun), Error> {
    let width = 32;
    let inputs = Tensor::randn([256, width], ())?;
    let labels = inputs.mm(&Tensor::randn([width, width], ())?)?.argmax(1)?;
    let dataset: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![inputs, labels])?);
    let train_loader = DataLoader::new(dataset).batch_size(32).shuffle(true);
    let seed = ember::tensor::random::initial_seed();
    ember::tensor::random::manual_seed(seed);
    let plain = amp_train(
        &LargeModel::new(width, 1, false)?,
        &train_loader,
        device,
        epochs,
    )?;
    ember::tensor::random::manual_seed(seed);
    let ckpt = amp_train(
        &LargeModel::new(width, 1, true)?,
        &train_loader,
        device,
        epochs,
    )?;
    println!("AMP epoch losses: {:.4?}", plain.epoch_losses);
    println!("  checkpointed:   {:.4?}", ckpt.epoch_losses);
    let (first, last) = (plain.epoch_losses.first(), plain.epoch_losses.last());
    if let (Some(first), Some(last)) = (first, last) {
        ensure(last < first, "AMP training lowers the loss")?;
    }
    ensure(
        plain.grad_dtypes.iter().all(|&d| d == DType::F32),
        "f32 master weights get f32 gradients",
    )?;
    ensure(
        plain.weights == ckpt.weights,
        "checkpointing under autocast trains exactly as without it",
    )?;
    Ok((plain, ckpt))
}

/// What the chapter's "Profiling GPU Performance" (`torch_profiler.py`) showed.
#[derive(Debug)]
pub struct ProfilerRun {
    /// The summary sorted by GPU time (`sort_by="cuda_time_total", row_limit=10`).
    pub table: String,
    /// `trace.json` (`prof.export_chrome_trace`).
    pub trace: std::path::PathBuf,
    /// Kernels and copies in that trace.
    pub device_events: usize,
    /// The files `tensorboard_trace_handler('./log')` wrote, one per cycle.
    pub tensorboard_files: Vec<std::path::PathBuf>,
}

/// The chapter's profiler section on `device`, writing under `out` (its `trace.json` and
/// `./log`).
pub fn run_profiler(device: Device, out: &std::path::Path) -> Result<ProfilerRun, Error> {
    use ember::profiler::{
        ProfileOptions, ProfilerActivity, profile, schedule, tensorboard_trace_handler,
    };
    let width = 32;
    let model = LargeModel::new(width, 1, false)?;
    model.to(device)?;
    let inputs = Tensor::randn([32, width], device)?;

    // Basic profiling.
    let mut prof = profile(
        ProfileOptions::new()
            .activities([ProfilerActivity::Cpu, ProfilerActivity::Cuda])
            .record_shapes(true)
            .profile_memory(true),
    )?;
    for _ in 0..10 {
        let output = model.call(&inputs)?;
        output.sum_all()?.backward()?;
    }
    prof.stop()?;
    // Print summary sorted by GPU time.
    let table = prof.key_averages()?.table("cuda_time_total", 10)?;
    println!("{table}");
    // Export to Chrome trace (open in chrome://tracing).
    let trace = out.join("trace.json");
    prof.export_chrome_trace(&trace)?;
    let device_events = prof
        .profile()?
        .events
        .iter()
        .filter(|e| e.kind.is_device())
        .count();
    drop(prof);

    // TensorBoard integration.
    let labels = inputs
        .mm(&Tensor::randn([width, width], device)?)?
        .argmax(1)?;
    let dataset: Arc<dyn Dataset> =
        Arc::new(TensorDataset::new(vec![inputs.cpu()?, labels.cpu()?])?);
    let loader = DataLoader::new(dataset).batch_size(2);
    let criterion = CrossEntropyLoss::new();
    let mut optimizer = Adam::new(model.parameters(), AdamOptions::default())?;
    let log = out.join("log");
    let mut prof = profile(
        ProfileOptions::new()
            .activities([ProfilerActivity::Cpu, ProfilerActivity::Cuda])
            .on_trace_ready(tensorboard_trace_handler(&log, None))
            // wait=1 (skip the first iteration), warmup=1, active=3, repeat=2.
            .schedule(schedule(0, 1, 1, 3, 2)?),
    )?;
    for batch in loader.epoch(0)? {
        let batch = batch?;
        let (data, target) = (&batch[0], &batch[1]);
        let output = model.call(&data.to(device)?)?;
        let loss = criterion.forward(&output, &target.to(device)?)?;
        loss.backward()?;
        optimizer.step()?;
        prof.step()?; // Signal next iteration
    }
    prof.stop()?;
    let mut tensorboard_files: Vec<std::path::PathBuf> = std::fs::read_dir(&log)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    tensorboard_files.sort();
    Ok(ProfilerRun {
        table,
        trace,
        device_events,
        tensorboard_files,
    })
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    let device = ember::try_gpu(0);
    run(device, ember::try_gpu(1))?;
    run_amp(device, 5)?;
    run_profiler(device, std::path::Path::new("."))?;
    Ok(())
}
