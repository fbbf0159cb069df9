//! "GPU Training with PyTorch on CUDA" (docs/walkthroughs.md), replayed: CUDA availability
//! and properties, moving a model and its data (and back), memory around a forward pass and
//! `empty_cache`, gradient accumulation; mixed precision with a `GradScaler` ([`run_amp`]:
//! one step with `unscale_` and the clipping it is there for, then the loop); the timing of
//! "Profiling and optimization strategies" ([`run_timing`]). Layers a tenth of the text's,
//! so the CI runs it on the emulated GPU in seconds. `DataParallel`: `data_parallel.rs`.
//! `cargo run --example gpu_training_guide`

use ember::prelude::*;

fn mlp(sizes: &[usize]) -> Result<Sequential> {
    let mut model = Sequential::new();
    for (i, w) in sizes.windows(2).enumerate() {
        model = model.add(Linear::new(w[0], w[1], ())?);
        if i + 2 < sizes.len() {
            model = model.add(ReLU::new());
        }
    }
    Ok(model)
}

/// Availability, moving, memory and accumulation on `device`: the memory allocated after
/// the model, after the forward, and after `empty_cache`.
pub fn run(device: Device) -> Result<[u64; 3]> {
    println!("CUDA available: {}", cuda::is_available());
    let num_gpus = cuda::device_count();
    println!("Number of GPUs: {num_gpus}");
    if num_gpus > 0 {
        println!("Current device index: {}", cuda::current_device()?);
    }
    for i in 0..num_gpus {
        let gpu_memory = cuda::get_device_properties(i)?.total_memory as f64 / 1e9;
        println!("GPU {i}: {}, Memory: {gpu_memory:.2} GB", cuda::get_device_name(i)?);
    }
    println!("Using device: {device}");

    let model = mlp(&[100, 51, 12, 10])?;
    model.to(device)?;
    println!("Model device: {}", model.parameters()[0].device());
    let x = Tensor::randn([32, 100], ())?.to(device)?;
    let y = Tensor::randint(0, 10, [32], ())?.to(device)?;
    let output = model.call(&x)?;
    println!("Output device: {}", output.device());
    assert!(output.device() == device && y.device() == device);
    if device.is_cuda() {
        model.to(Device::Cuda(0))?; // model.cuda()
        let (x, y) = (x.cuda()?, y.cuda()?);
        assert!(x.device() == Device::Cuda(0) && y.device() == Device::Cuda(0));
    }
    model.to(Device::Cpu)?; // model.cpu()
    assert_eq!(x.cpu()?.device(), Device::Cpu);

    let model = mlp(&[1000, 500, 200, 10])?;
    model.to(device)?;
    let gb = |b: u64| b as f64 / 1e9;
    let allocated = memory::memory_allocated(device)?;
    let reserved = memory::memory_reserved(device)?;
    println!("Allocated: {:.4} GB, Reserved: {:.4} GB", gb(allocated), gb(reserved));
    let x = Tensor::randn([256, 1000], ())?.to(device)?;
    let output = model.call(&x)?;
    let after_forward = memory::memory_allocated(device)?;
    println!("After forward: Allocated: {:.4} GB", gb(after_forward));
    drop((output, x));
    memory::empty_cache(device)?;
    let after_clear = memory::memory_allocated(device)?;
    println!("After cache clear: Allocated: {:.4} GB", gb(after_clear));

    let model = Linear::new(100, 10, ())?;
    model.to(device)?;
    let mut optimizer = Adam::new(model.parameters(), 0.001)?;
    let criterion = CrossEntropyLoss::new();
    let accumulation_steps = 4; // batch 256 as 4 x 64
    for epoch in 0..2 {
        let mut epoch_loss = 0.0;
        optimizer.zero_grad(true)?; // once per accumulation cycle
        for step in 0..16 {
            let x = Tensor::randn([64, 100], ())?.to(device)?;
            let y = Tensor::randint(0, 10, [64], ())?.to(device)?;
            let output = model.call(&x)?;
            let loss = criterion.forward(&output, &y)?.div(accumulation_steps as f64)?;
            loss.backward()?; // accumulates gradients
            if (step + 1) % accumulation_steps == 0 {
                optimizer.step()?;
                optimizer.zero_grad(true)?;
            }
            epoch_loss += loss.item::<f64>()? * accumulation_steps as f64;
        }
        println!("Epoch {}: Loss = {:.4}", epoch + 1, epoch_loss / 16.0);
    }
    Ok([allocated, after_forward, after_clear])
}

/// What the tests read of [`run_amp`]: the output and loss of the single step, the gradient
/// norms (scaled, after `unscale_`, clipped to `max_norm`, and what the clip returned), the
/// model, the scaler, and the loop's epoch losses.
#[derive(Debug)]
pub struct Amp {
    /// The single step's output, under autocast.
    pub output: Tensor,
    /// Its loss.
    pub loss: Tensor,
    /// The gradient norms: scaled, after `unscale_`, after the clip, and what the clip returned.
    pub norms: [f64; 4],
    /// The clip's bound.
    pub max_norm: f64,
    /// The model.
    pub model: Sequential,
    /// The scaler, after the loop.
    pub scaler: GradScaler,
    /// The loop's mean loss per epoch.
    pub epoch_losses: Vec<f64>,
}

fn grad_norm(model: &Sequential) -> Result<f64> {
    let grads: Vec<Tensor> = model.parameters().iter().filter_map(Tensor::grad).collect();
    optim::get_total_norm(&grads, 2.0, false)?.item::<f64>()
}

/// Mixed precision with a `GradScaler` on `device`, `batches` mini-batches per epoch.
pub fn run_amp(device: Device, batches: usize) -> Result<Amp> {
    let model = mlp(&[100, 51, 10])?;
    model.to(device)?;
    let mut optimizer = Adam::new(model.parameters(), 0.001)?;
    let criterion = CrossEntropyLoss::new();
    let mut scaler = GradScaler::new(device)?.enabled(device.is_cuda()); // GradScaler()
    let x = Tensor::randn([64, 100], ())?.to(device)?;
    let y = Tensor::randint(0, 10, [64], ())?.to(device)?;
    let autocast = amp::autocast_with(device)?; // float16 forward
    let output = model.call(&x)?;
    let loss = criterion.forward(&output, &y)?;
    drop(autocast);
    optimizer.zero_grad(true)?;
    scaler.scale(&loss)?.backward()?;
    let scaled = grad_norm(&model)?;
    scaler.unscale_(&mut optimizer)?;
    // Unscaled: clip the true gradients, what `unscale_` is for.
    let (unscaled, max_norm) = (grad_norm(&model)?, 0.25);
    let returned = clip_grad_norm_(&model.parameters(), max_norm, 2.0)?.item::<f64>()?;
    let norms = [scaled, unscaled, grad_norm(&model)?, returned];
    scaler.step(&mut optimizer)?;
    scaler.update()?;
    println!("Loss (mixed precision): {:.4}", loss.item::<f32>()?);

    let mut epoch_losses = vec![];
    for epoch in 0..3 {
        model.train(true);
        let mut epoch_loss = 0.0;
        for _ in 0..batches {
            let x_batch = Tensor::randn([64, 100], ())?.to(device)?;
            let y_batch = Tensor::randint(0, 10, [64], ())?.to(device)?;
            let autocast = amp::autocast_with(device)?;
            let loss = criterion.forward(&model.call(&x_batch)?, &y_batch)?;
            drop(autocast);
            optimizer.zero_grad(true)?;
            scaler.scale(&loss)?.backward()?;
            scaler.step(&mut optimizer)?;
            scaler.update()?;
            epoch_loss += loss.item::<f64>()?;
        }
        epoch_losses.push(epoch_loss / batches as f64);
        println!("Epoch {}: Loss = {:.4}", epoch + 1, epoch_losses[epoch]);
    }
    Ok(Amp { output, loss, norms, max_norm, model, scaler, epoch_losses })
}

/// `iterations` training iterations timed between two `torch.cuda.synchronize()` after 5
/// warm-up forwards (printed, never asserted): whether the stream had nothing left to run
/// after the second (on CUDA), and the memory allocated.
pub fn run_timing(device: Device, iterations: usize) -> Result<(Option<bool>, u64)> {
    let model = mlp(&[200, 100, 10])?;
    model.to(device)?;
    let mut optimizer = Adam::new(model.parameters(), AdamOptions::default())?;
    let criterion = CrossEntropyLoss::new();
    let synchronize = || device.cuda_index().map_or(Ok(()), |i| cuda::synchronize(Some(i)));
    for _ in 0..5 {
        model.call(&Tensor::randn([128, 200], ())?.to(device)?)?; // warm up
    }
    synchronize()?;
    let start = std::time::Instant::now();
    for _ in 0..iterations {
        let x = Tensor::randn([128, 200], ())?.to(device)?;
        let y = Tensor::randint(0, 10, [128], ())?.to(device)?;
        let loss = criterion.forward(&model.call(&x)?, &y)?;
        optimizer.zero_grad(true)?;
        loss.backward()?;
        optimizer.step()?;
    }
    synchronize()?;
    let elapsed = start.elapsed().as_secs_f64();
    let idle = device.cuda_index().map(|i| cuda::Stream::default_stream(i)?.query()).transpose()?;
    println!("Time for {iterations} iterations: {elapsed:.3}s");
    println!("Throughput: {:.0} samples/sec", (iterations * 128) as f64 / elapsed);
    let allocated = memory::memory_allocated(device)?;
    println!("GPU Memory allocated: {:.4} GB", allocated as f64 / 1e9);
    println!("GPU Memory reserved: {:.4} GB", memory::memory_reserved(device)? as f64 / 1e9);
    Ok((idle, allocated))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let device = Device::cuda_if_available();
    run(device)?;
    run_amp(device, 10)?;
    run_timing(device, 100).map(|_| ())
}
