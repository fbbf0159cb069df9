//! The PyTorch walk-through "GPU Training with PyTorch on CUDA" (docs/walkthroughs.md),
//! replayed in Rust: CUDA availability and properties, moving a model and its data, monitoring
//! memory around a forward pass and `empty_cache`, and gradient accumulation over
//! micro-batches; and mixed precision with a `GradScaler` ([`run_amp`]): one step with
//! `unscale_` and the gradient clipping it is there for, then the full AMP loop (f16 and the
//! scaler on CUDA; bf16 with the scaler disabled on the CPU, as PyTorch recommends); and the
//! timing of "Profiling and optimization strategies" ([`run_timing`]: warm-up, 100
//! iterations between two `torch.cuda.synchronize()` calls, the throughput and the memory).
//! The `DataParallel` section is `data_parallel.rs`. The layer sizes are a tenth of the
//! text's so that the CI runs it on the emulated GPU in seconds.
//!
//! `cargo run --example gpu_training_guide`

use ember::amp::{AutocastOptions, GradScaler, GradScalerOptions};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU, Sequential};
use ember::optim::{Adam, AdamOptions, Optimizer, clip_grad_norm_, get_total_norm};
use ember::{DType, Device, Error, Tensor, amp, cuda, memory};

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
    // Shorthand methods: x.cuda() as in PyTorch; model.cuda() is model.to(Device::Cuda(0)).
    let x = if device.is_cuda() {
        model.to(Device::Cuda(0))?;
        let (x, y) = (x.cuda()?, y.cuda()?);
        ensure(
            x.device() == Device::Cuda(0)
                && y.device() == Device::Cuda(0)
                && model.parameters()[0].device() == Device::Cuda(0),
            ".cuda() moves to the current GPU",
        )?;
        x
    } else {
        x
    };
    // Move back to the CPU.
    model.to(Device::Cpu)?;
    let x = x.cpu()?;
    ensure(
        model.parameters()[0].device() == Device::Cpu && x.device() == Device::Cpu,
        "model and data back on the CPU",
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

/// What the guide's mixed-precision section saw ([`run_amp`]), for the tests.
#[derive(Debug)]
pub struct AmpReport {
    /// The dtype `autocast()` computed the model's output in (f16 on CUDA, bf16 on the CPU).
    pub output_dtype: DType,
    /// The dtype of the loss (f32: `CrossEntropyLoss` runs in f32 under autocast).
    pub loss_dtype: DType,
    /// Whether the scaler was enabled (on CUDA only).
    pub scaler_enabled: bool,
    /// The total gradient norm after the scaled backward, and after `unscale_`.
    pub scaled_norm: f64,
    /// See `scaled_norm`.
    pub true_norm: f64,
    /// The scale of the first step (65536 on CUDA, 1 when disabled).
    pub first_scale: f64,
    /// `clip_grad_norm_`'s bound, what it returned (the norm before clipping) and the total
    /// norm after it.
    pub max_norm: f64,
    /// See `max_norm`.
    pub clip_returned: f64,
    /// See `max_norm`.
    pub clipped_norm: f64,
    /// The dtypes of the gradients in the loop (f32: the master weights' own).
    pub grad_dtypes: Vec<DType>,
    /// The mean loss of each epoch of the loop.
    pub epoch_losses: Vec<f64>,
    /// The scaler's steps in all (the single step and the loop's), and those it skipped.
    pub steps: usize,
    /// See `steps`.
    pub skipped: usize,
    /// The scale and the growth tracker after the last `update`.
    pub scale: f64,
    /// See `scale`.
    pub growth_tracker: i64,
}

/// `GradScaler()` on `device`: enabled on CUDA (f16), disabled on the CPU (bf16 needs no
/// scaling; `torch.cuda.amp.GradScaler` disables itself without CUDA).
fn grad_scaler(device: Device) -> Result<GradScaler, Error> {
    GradScaler::with_options(
        device,
        GradScalerOptions {
            enabled: device.is_cuda(),
            ..Default::default()
        },
    )
}

/// The total 2-norm of the gradients of `params`.
fn grad_norm(params: &[Tensor]) -> Result<f64, Error> {
    let grads: Vec<Tensor> = params.iter().filter_map(Tensor::grad).collect();
    Ok(get_total_norm(&grads, 2.0, false)?.item::<f32>()? as f64)
}

/// The guide's mixed precision with a `GradScaler` on `device` (`torch.cuda.amp.autocast()`
/// is an autocast region in the device's default dtype: f16 on CUDA, bf16 on the CPU), with
/// `batches` mini-batches in each of the loop's three epochs.
pub fn run_amp(device: Device, batches: usize) -> Result<AmpReport, Error> {
    // Model and optimizer.
    let model = Sequential::new()
        .add(Linear::new(100, 51, ())?)
        .add(ReLU::new())
        .add(Linear::new(51, 10, ())?);
    model.to(device)?;
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 0.001,
            ..Default::default()
        },
    )?;
    let criterion = CrossEntropyLoss::new();
    // GradScaler handles loss scaling for float16 stability.
    let mut scaler = grad_scaler(device)?;
    let first_scale = scaler.get_scale()?;
    // Synthetic data.
    let x = Tensor::randn([64, 100], ())?.to(device)?;
    let y = Tensor::randint(0, 10, [64], ())?.to(device)?;
    // Training step with mixed precision.
    let (output, loss) = {
        let _ac = amp::autocast_with(AutocastOptions::new(device))?; // float16 forward
        let output = model.call(&x)?;
        let loss = criterion.forward(&output, &y)?;
        (output, loss)
    };
    // Scale loss and backward (float32).
    optimizer.zero_grad(true)?;
    scaler.scale(&loss)?.backward()?;
    let params = model.parameters();
    let scaled_norm = grad_norm(&params)?;
    // Unscale, then clip the true gradients (what unscale_ is for), then step.
    scaler.unscale_(&mut optimizer)?;
    let true_norm = grad_norm(&params)?;
    let max_norm = 0.25;
    let clip_returned = clip_grad_norm_(&params, max_norm, 2.0)?.item::<f32>()? as f64;
    let clipped_norm = grad_norm(&params)?;
    println!(
        "gradient norm: {scaled_norm:.4e} scaled, {true_norm:.4} unscaled, {clipped_norm:.4} clipped to {max_norm}"
    );
    ensure(
        clipped_norm <= max_norm * (1.0 + 1e-4),
        "clipping bounds the norm",
    )?;
    let mut steps = 1;
    let mut skipped = usize::from(!scaler.step(&mut optimizer)?);
    scaler.update()?;
    println!("Loss (mixed precision): {:.4}", loss.item::<f32>()?);

    // Usage in a full training loop.
    let num_epochs = 3;
    let mut epoch_losses = Vec::new();
    let mut grad_dtypes = Vec::new();
    for epoch in 0..num_epochs {
        model.train(true);
        let mut epoch_loss = 0.0;
        for _ in 0..batches {
            let x_batch = Tensor::randn([64, 100], ())?.to(device)?;
            let y_batch = Tensor::randint(0, 10, [64], ())?.to(device)?;
            // Mixed precision forward.
            let loss = {
                let _ac = amp::autocast_with(AutocastOptions::new(device))?;
                criterion.forward(&model.call(&x_batch)?, &y_batch)?
            };
            optimizer.zero_grad(true)?;
            scaler.scale(&loss)?.backward()?;
            grad_dtypes = params
                .iter()
                .filter_map(|p| p.grad().map(|g| g.dtype()))
                .collect();
            steps += 1;
            skipped += usize::from(!scaler.step(&mut optimizer)?);
            scaler.update()?;
            epoch_loss += loss.item::<f32>()? as f64;
        }
        let mean = epoch_loss / batches as f64;
        println!("Epoch {}: Loss = {mean:.4}", epoch + 1);
        ensure(mean.is_finite(), "finite loss")?;
        epoch_losses.push(mean);
    }
    Ok(AmpReport {
        output_dtype: output.dtype(),
        loss_dtype: loss.dtype(),
        scaler_enabled: scaler.is_enabled(),
        scaled_norm,
        true_norm,
        first_scale,
        max_norm,
        clip_returned,
        clipped_norm,
        grad_dtypes,
        epoch_losses,
        steps,
        skipped,
        scale: scaler.get_scale()?,
        growth_tracker: scaler.get_growth_tracker()?,
    })
}

/// What the guide's "Profiling and optimization strategies" measured ([`run_timing`]).
#[derive(Debug)]
pub struct TimingReport {
    /// The training iterations timed (the text's 100), and the batch of each.
    pub iterations: usize,
    /// See `iterations`.
    pub batch: usize,
    /// Seconds between the two synchronisations, and samples per second.
    pub elapsed: f64,
    /// See `elapsed`.
    pub throughput: f64,
    /// On CUDA, whether the device's stream had finished every queued operation once
    /// `torch.cuda.synchronize()` returned (the FAQ: it "blocks until all GPU operations
    /// complete"). On a GPU this tells; the emulator runs each operation when it is
    /// issued, so there it is always true.
    pub idle_after_synchronize: Option<bool>,
    /// `memory_allocated` and `memory_reserved` after the loop.
    pub allocated: u64,
    /// See `allocated`.
    pub reserved: u64,
    /// The bytes of the model's parameters (f32).
    pub parameter_bytes: u64,
}

/// The guide's timing of `iterations` training iterations on `device` after 5 warm-up
/// forwards, between two `torch.cuda.synchronize()` calls, with the throughput and the
/// memory afterwards. Layers a tenth of the text's (2000 -> 1000 -> 100 there). The times
/// are printed, never asserted.
pub fn run_timing(device: Device, iterations: usize) -> Result<TimingReport, Error> {
    let model = Sequential::new()
        .add(Linear::new(200, 100, ())?)
        .add(ReLU::new())
        .add(Linear::new(100, 10, ())?);
    model.to(device)?;
    let mut optimizer = Adam::new(model.parameters(), AdamOptions::default())?;
    let criterion = CrossEntropyLoss::new();
    let synchronize = || match device {
        Device::Cuda(i) => cuda::synchronize(Some(i)),
        Device::Cpu => Ok(()),
    };
    // Warm up the GPU.
    for _ in 0..5 {
        let x = Tensor::randn([128, 200], ())?.to(device)?;
        model.call(&x)?;
    }
    synchronize()?;
    let start = std::time::Instant::now();
    let mut steps = 0;
    for _ in 0..iterations {
        let x = Tensor::randn([128, 200], ())?.to(device)?;
        let y = Tensor::randint(0, 10, [128], ())?.to(device)?;
        let output = model.call(&x)?;
        let loss = criterion.forward(&output, &y)?;
        optimizer.zero_grad(true)?;
        loss.backward()?;
        optimizer.step()?;
        steps += 1;
    }
    synchronize()?;
    let elapsed = start.elapsed().as_secs_f64();
    let idle_after_synchronize = match device {
        Device::Cuda(i) => Some(cuda::Stream::default_stream(i)?.query()?),
        Device::Cpu => None,
    };
    let throughput = (steps * 128) as f64 / elapsed;
    println!("Time for {iterations} iterations: {elapsed:.3}s");
    println!("Throughput: {throughput:.0} samples/sec");
    let (allocated, reserved) = (
        memory::memory_allocated(device)?,
        memory::memory_reserved(device)?,
    );
    if device.is_cuda() {
        println!("GPU Memory allocated: {:.4} GB", allocated as f64 / 1e9);
        println!("GPU Memory reserved: {:.4} GB", reserved as f64 / 1e9);
    }
    Ok(TimingReport {
        iterations: steps,
        batch: 128,
        elapsed,
        throughput,
        idle_after_synchronize,
        allocated,
        reserved,
        parameter_bytes: 4 * model.num_parameters() as u64,
    })
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    let device = Device::cuda_if_available();
    run(device)?;
    run_amp(device, 10)?;
    run_timing(device, 100)?;
    Ok(())
}
