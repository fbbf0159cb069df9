//! The PyTorch walk-through "GPU Computing" (docs/walkthroughs.md), replayed in Rust: device
//! discovery and properties, creating tensors on a device and moving them with `to`, `cpu()`,
//! a model on the data's device (and the error for a CPU input), pinned memory with
//! non-blocking copies and a pinned `DataLoader` with workers, the allocator's statistics
//! (`memory_allocated`, its peak, `memory_reserved`, `memory_summary`), freeing memory (`drop`
//! is `del`, then `empty_cache`), `no_grad` inference and `enable_grad`, tensors made on the
//! device or like another, gradient checkpointing of a model's blocks, with
//! the peak memory it saves, and automatic mixed precision ([`run_amp`]): the AMP training
//! loop with `autocast()` and a `GradScaler` (f16 with the scaler on CUDA, bf16 with the
//! scaler disabled on the CPU, as PyTorch recommends), on the model with and without
//! checkpointing, which must train alike.
//!
//! The profiler section ([`run_profiler`], `torch_profiler.py`): ten forward and backward
//! passes under `profile(activities=[CPU, CUDA], record_shapes, profile_memory)`, the table
//! sorted by `cuda_time_total`, `export_chrome_trace`, and a schedule
//! (`wait=1, warmup=1, active=3, repeat=2`) handing its cycles to `tensorboard_trace_handler`.
//! "Memory Profiling" ([`run_memory_history`], `memory_profiling.py`): the allocator's
//! recorded history over a loop, dumped with the snapshot, then switched off. "Minimize
//! CPU-GPU Transfers" and "Common Pitfalls and Debugging" ([`run_pitfalls`]). The
//! multi-GPU section is `data_parallel.rs` (`DataParallel`) and `distributed.rs`
//! (`distributed.py`: DDP with a `DistributedSampler`, run as ranks).
//!
//! `cargo run --example gpu_computing_chapter`

use std::sync::Arc;

use ember::amp::{AutocastOptions, GradScaler, GradScalerOptions};
use ember::data::{DataLoader, Dataset, TensorDataset};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU, Sequential, checkpoint};
use ember::optim::{Adam, AdamOptions, Optimizer, SGD, SgdOptions};
use ember::{DType, Device, Error, Tensor, amp, cuda, enable_grad, memory, no_grad};

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
    println!("Model device: {}", model.parameters()[0].device());
    // Data and model must be on the same device.
    let output = model.call(&gpu_tensor)?; // works
    ensure(output.device() == device, "the output lives with the model")?;
    if device.is_cuda() {
        let e = model.call(&cpu_tensor).err().map(|e| e.to_string());
        ensure(
            e.is_some_and(|e| e.contains("Expected all tensors to be on the same device")),
            "model(cpu_tensor) is refused",
        )?;
    }

    // Non-blocking transfers from pinned memory.
    let pinned_tensor = cpu_tensor.pin_memory()?;
    let gpu_tensor = pinned_tensor.to_non_blocking(device)?;
    ensure(
        gpu_tensor.to_vec::<f32>()? == cpu_tensor.to_vec::<f32>()?,
        "non-blocking copy delivers the data",
    )?;
    // In the DataLoader, for automatic pinned memory.
    let dataset: Arc<dyn Dataset> =
        Arc::new(TensorDataset::new(vec![cpu_tensor.narrow(0, 0, 128)?])?);
    let train_loader = DataLoader::new(dataset)
        .batch_size(32)
        .pin_memory(true)
        .num_workers(4);
    for batch in train_loader.epoch(0)? {
        let batch = batch?;
        ensure(
            batch[0].data().is_pinned(),
            "the loader's batches are pinned",
        )?;
        ensure(
            batch[0].to_non_blocking(device)?.dims() == [32, 1000],
            "a batch of 32 on the device",
        )?;
    }

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
    // During training, enable_grad records the graph even inside a no_grad region.
    let output = {
        let _outer = no_grad();
        let _g = enable_grad();
        model.call(&inputs)?
    };
    ensure(output.grad_fn_name().is_some(), "a graph under enable_grad")?;
    output.square()?.mean_all()?.backward()?;
    model.eval();
    let predictions = {
        let _g = no_grad();
        model.call(&inputs)?
    };
    ensure(
        !predictions.requires_grad(),
        "no gradients during inference",
    )?;
    model.train(true);

    // Define the device once; create tensors on it, or like an existing one.
    let new_tensor = Tensor::zeros([100], device)?;
    let like_tensor = inputs.zeros_like()?;
    ensure(
        new_tensor.device() == device && like_tensor.device() == device,
        "zeros(.., device=device) and zeros_like(data)",
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

/// What "Common Pitfalls and Debugging" showed ([`run_pitfalls`]).
#[derive(Debug)]
pub struct PitfallsRun {
    /// `losses.append(loss)`: whether the kept losses still carry their graph, and the
    /// bytes the loop left allocated; the bytes `losses.append(loss.item())` left.
    pub kept_losses_have_graph: bool,
    /// See `kept_losses_have_graph`.
    pub kept_bytes: u64,
    /// See `kept_losses_have_graph`.
    pub item_bytes: u64,
    /// Without `zero_grad`, the gradient after two backward passes of one batch over the
    /// gradient after one (2: they add); with `zero_grad` before each (1).
    pub accumulated_ratio: f64,
    /// See `accumulated_ratio`.
    pub zeroed_ratio: f64,
    /// `verify_model_device` on the moved model, and its error for a model left on the CPU
    /// (on CUDA only).
    pub verified: bool,
    /// See `verified`.
    pub unmoved_error: Option<String>,
    /// `log_memory()`'s line.
    pub memory_line: String,
    /// The "GOOD" loop: the devices of its outputs and losses.
    pub loop_devices: Vec<Device>,
}

/// `print_tensor_info(name, tensor)`.
pub fn print_tensor_info(name: &str, tensor: &Tensor) {
    println!(
        "{name}: shape={:?}, device={}, dtype={:?}, requires_grad={}",
        tensor.dims(),
        tensor.device(),
        tensor.dtype(),
        tensor.requires_grad()
    );
}

/// `verify_model_device(model, expected_device)`: every parameter on a device of the
/// expected type, or an error naming the first that is not.
pub fn verify_model_device(model: &dyn Module, expected: &str) -> Result<(), Error> {
    for (name, param) in model.named_parameters() {
        let kind = if param.device().is_cuda() {
            "cuda"
        } else {
            "cpu"
        };
        ensure(
            kind == expected,
            &format!(
                "Parameter {name} on {}, expected {expected}",
                param.device()
            ),
        )?;
    }
    Ok(())
}

/// `log_memory()` for `device`.
pub fn log_memory(device: Device) -> Result<String, Error> {
    let allocated = memory::memory_allocated(device)? as f64 / 1e9;
    let reserved = memory::memory_reserved(device)? as f64 / 1e9;
    let line = format!("GPU Memory: {allocated:.4}GB allocated, {reserved:.4}GB reserved");
    println!("{line}");
    Ok(line)
}

/// The chapter's "Minimize CPU-GPU transfers" (the good loop) and "Common Pitfalls and
/// Debugging" on `device`: losses kept as tensors keep their graphs, gradients add up
/// without `zero_grad`, and the debugging helpers.
pub fn run_pitfalls(device: Device) -> Result<PitfallsRun, Error> {
    let model = Linear::new(100, 10, ())?;
    model.to(device)?;
    let criterion = CrossEntropyLoss::new();
    let inputs = Tensor::randn([128, 100], ())?;
    let targets = Tensor::randint(0, 10, [128], ())?;
    let dataset: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![inputs, targets])?);
    let loader = DataLoader::new(dataset).batch_size(32).pin_memory(true);

    // GOOD: keep everything on the GPU; non-blocking copies of pinned batches.
    let mut loop_devices = Vec::new();
    for batch in loader.epoch(0)? {
        let batch = batch?;
        let data = batch[0].to_non_blocking(device)?;
        let target = batch[1].to_non_blocking(device)?;
        let output = model.call(&data)?;
        let loss = criterion.forward(&output, &target)?; // all on the GPU
        loop_devices.extend([output.device(), loss.device()]);
    }

    // Memory leak: storing tensors with gradients keeps their graphs.
    let one_pass = |keep: bool| -> Result<(u64, bool), Error> {
        let base = memory::memory_allocated(device)?;
        let mut kept = Vec::new();
        let mut items = Vec::new();
        for batch in loader.epoch(0)? {
            let batch = batch?;
            let (x, y) = (batch[0].to(device)?, batch[1].to(device)?);
            let loss = criterion.forward(&model.call(&x)?, &y)?;
            loss.backward()?;
            if keep {
                kept.push(loss); // keeps the computation graph
            } else {
                items.push(loss.item::<f32>()?); // just the number
            }
        }
        let held = memory::memory_allocated(device)?.saturating_sub(base);
        Ok((
            held,
            kept.iter().all(|l| l.grad_fn_name().is_some()) && !kept.is_empty(),
        ))
    };
    // The `.item()` loop first, once to allocate the parameters' gradients (the later
    // loops accumulate into them), then measured.
    one_pass(false)?;
    let (held_items, _) = one_pass(false)?;
    let (held_kept, kept_losses_have_graph) = one_pass(true)?;

    // Forgetting to zero gradients: they add up.
    let x = Tensor::randn([32, 100], device)?;
    let y = Tensor::randint(0, 10, [32], device)?;
    let mut optimizer = SGD::new(model.parameters(), SgdOptions::default())?;
    let grad_after = |zero: bool, optimizer: &mut SGD| -> Result<f64, Error> {
        optimizer.zero_grad(true)?;
        criterion.forward(&model.call(&x)?, &y)?.backward()?;
        let once = model
            .weight
            .grad()
            .map_or(Ok(0.0), |g| g.abs()?.sum_all()?.item::<f64>())?;
        if zero {
            optimizer.zero_grad(true)?; // reset gradients
        }
        criterion.forward(&model.call(&x)?, &y)?.backward()?;
        let twice = model
            .weight
            .grad()
            .map_or(Ok(0.0), |g| g.abs()?.sum_all()?.item::<f64>())?;
        Ok(twice / once)
    };
    let accumulated_ratio = grad_after(false, &mut optimizer)?;
    let zeroed_ratio = grad_after(true, &mut optimizer)?;

    // Debugging tips.
    print_tensor_info("x", &x);
    let verified =
        verify_model_device(&model, if device.is_cuda() { "cuda" } else { "cpu" }).is_ok();
    let unmoved_error = if device.is_cuda() {
        let unmoved = Linear::new(100, 10, ())?;
        verify_model_device(&unmoved, "cuda")
            .err()
            .map(|e| e.to_string())
    } else {
        None
    };
    let memory_line = log_memory(device)?;
    Ok(PitfallsRun {
        kept_losses_have_graph,
        kept_bytes: held_kept,
        item_bytes: held_items,
        accumulated_ratio,
        zeroed_ratio,
        verified,
        unmoved_error,
        memory_line,
        loop_devices,
    })
}

/// What the chapter's "Memory Profiling" (`memory_profiling.py`) recorded.
#[derive(Debug)]
pub struct MemoryHistoryRun {
    /// The allocator events recorded while the loop ran.
    pub events: usize,
    /// Of those, the allocations and the frees.
    pub allocs: usize,
    /// See `allocs`.
    pub frees: usize,
    /// `memory_snapshot.json`, the dump (`torch.cuda.memory._dump_snapshot`): the
    /// segments and blocks, and the recorded events.
    pub dump: std::path::PathBuf,
    /// The bytes in allocated blocks and in segments, by the snapshot, and as
    /// `memory_allocated`/`memory_reserved` said at the dump.
    pub snapshot_allocated: u64,
    /// See `snapshot_allocated`.
    pub snapshot_reserved: u64,
    /// See `snapshot_allocated`.
    pub allocated: u64,
    /// See `snapshot_allocated`.
    pub reserved: u64,
    /// Events recorded after `_record_memory_history(enabled=None)` and one more
    /// allocation (none: recording is off).
    pub after_disable: usize,
}

/// The chapter's memory profiling on `device`: record the allocator's history
/// (`torch.cuda.memory._record_memory_history(max_entries=100000)`), run the model over a
/// loader with a backward per batch, dump the snapshot with the history to
/// `out/memory_snapshot.json`, stop recording, and print the quick stats.
pub fn run_memory_history(
    device: Device,
    out: &std::path::Path,
) -> Result<MemoryHistoryRun, Error> {
    use ember::memory::HistoryAction;
    // Snapshot memory state: keep the last 100000 events (Ember's default bound).
    memory::record_memory_history(device, true)?;

    // Run your code.
    let model = LargeModel::new(32, 1, false)?;
    model.to(device)?;
    let dataset: Arc<dyn Dataset> =
        Arc::new(TensorDataset::new(vec![Tensor::randn([64, 32], ())?])?);
    let loader = DataLoader::new(dataset).batch_size(16);
    for data in loader.epoch(0)? {
        let data = data?;
        let output = model.call(&data[0].to(device)?)?;
        output.sum_all()?.backward()?;
    }

    // Save snapshot for visualization: the segments and the recorded events, as JSON.
    let snapshot = memory::memory_snapshot(device)?;
    let history = memory::memory_history(device)?;
    let (allocated, reserved) = (
        memory::memory_allocated(device)?,
        memory::memory_reserved(device)?,
    );
    let dump = out.join("memory_snapshot.json");
    let json = serde_json::json!({ "segments": snapshot.segments, "device_traces": history });
    std::fs::write(&dump, json.to_string())?;
    memory::record_memory_history(device, false)?; // _record_memory_history(enabled=None)
    let after = Tensor::zeros([1024], device)?;
    let after_disable = memory::memory_history(device)?.len();
    drop(after);

    // Quick memory stats.
    println!("Allocated: {:.4} GB", allocated as f64 / 1e9);
    println!("Cached: {:.4} GB", reserved as f64 / 1e9);
    let peak = memory::max_memory_allocated(device)?;
    println!("Max allocated: {:.4} GB", peak as f64 / 1e9);
    ensure(allocated <= peak, "the peak is at least what is allocated")?;
    let count = |a: HistoryAction| history.iter().filter(|e| e.action == a).count();
    Ok(MemoryHistoryRun {
        events: history.len(),
        allocs: count(HistoryAction::Alloc),
        frees: count(HistoryAction::FreeRequested),
        dump,
        snapshot_allocated: snapshot.segments.iter().map(|s| s.allocated_size).sum(),
        snapshot_reserved: snapshot.segments.iter().map(|s| s.total_size).sum(),
        allocated,
        reserved,
        after_disable,
    })
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    let device = ember::try_gpu(0);
    run(device, ember::try_gpu(1))?;
    run_amp(device, 5)?;
    run_profiler(device, std::path::Path::new("."))?;
    run_memory_history(device, std::path::Path::new("."))?;
    run_pitfalls(device)?;
    Ok(())
}
