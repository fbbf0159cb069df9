//! The PyTorch walk-through "Lesson 03: PyTorch GPU Acceleration" (docs/walkthroughs.md),
//! its memory and data-loading sections, replayed in Rust beside
//! `lesson_gpu_acceleration.rs` (which replays the rest): "Monitoring Memory Usage" with
//! `reset_peak_memory_stats`, "Memory Profiling During Training" (`train_with_memory_tracking`),
//! the `CheckpointedModel` of "Handling Out of Memory", "Memory-Efficient Training
//! Techniques" (dropping `output` and `loss` then `empty_cache`, `validate` under
//! `no_grad`, `zero_grad(set_to_none=True)`), and "Common Performance Issues" (losses
//! accumulated on the device with one synchronisation, a preallocated buffer,
//! `set_per_process_memory_fraction`, the Tensor Core check) in [`run_memory`]; "Optimizing
//! Data Loading" and `benchmark_dataloader` in [`run_data_loading`].
//!
//! Python's `gc.collect()` has no counterpart: Rust frees a tensor's memory when its last
//! owner is dropped, so `drop` (the text's `del`) is all the collection there is.
//! `persistent_workers=True` has none either: the loader's workers are threads that live
//! for one epoch, with nothing costly to keep alive between epochs.
//!
//! `cargo run --example lesson_memory_and_data`

use std::sync::Arc;
use std::time::Instant;

use ember::data::{DataLoader, Dataset, TensorDataset};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU, checkpoint};
use ember::optim::{Adam, AdamOptions, Optimizer};
use ember::{Device, Error, Tensor, cuda, memory, no_grad};

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(ember::nn::NnError::invalid("walk-through", what).into())
    }
}

/// The lesson's `MyModel`, at a tenth of its width (100 -> 50 -> 10).
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
        self.fc2.call(&self.relu.call(&self.fc1.call(x)?)?)
    }
}

/// `class CheckpointedModel(nn.Module)`: a `ModuleList` of ten linear layers (`width`
/// wide; the text's are 1000), each run through `checkpoint` when `checkpointing`. It gives
/// the plain model's gradients, but not the lower memory the text promises: a checkpoint
/// keeps its layer's input, which is all a linear layer keeps for backward anyway (in
/// PyTorch too). Checkpointing pays off over blocks of several layers, as in the GPU
/// computing chapter's `LargeModel`.
#[derive(Debug, Module)]
pub struct CheckpointedModel {
    layers: Vec<Arc<dyn Module>>,
    checkpointing: bool,
}

impl CheckpointedModel {
    /// Ten `Linear(width, width)` layers.
    pub fn new(width: usize, checkpointing: bool) -> Result<Self, Error> {
        let layers = (0..10)
            .map(|_| Ok(Arc::new(Linear::new(width, width, ())?) as Arc<dyn Module>))
            .collect::<Result<_, Error>>()?;
        Ok(CheckpointedModel {
            layers,
            checkpointing,
        })
    }
}

impl Module for CheckpointedModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        let mut x = x.clone();
        for layer in &self.layers {
            // Use checkpointing for layers.
            x = if self.checkpointing {
                checkpoint(layer.clone(), &x)?
            } else {
                layer.call(&x)?
            };
        }
        Ok(x)
    }
}

/// The lesson's learnable task: `n` inputs of 100 features labelled by the arg-max of a
/// fixed linear map.
fn task(n: usize) -> Result<Arc<dyn Dataset>, Error> {
    let inputs = Tensor::randn([n, 100], ())?;
    let labels = inputs.mm(&Tensor::randn([100, 10], ())?)?.argmax(1)?;
    Ok(Arc::new(TensorDataset::new(vec![inputs, labels])?))
}

/// One batch's numbers in `train_with_memory_tracking`, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMemory {
    /// `memory_allocated()` before the batch, after its step, and the peak so far.
    pub before: u64,
    /// See `before`.
    pub after: u64,
    /// See `before`.
    pub peak: u64,
}

/// The lesson's `train_with_memory_tracking`: one epoch, memory read around each batch,
/// printed every 10 batches, the cache emptied every 100.
pub fn train_with_memory_tracking(
    model: &dyn Module,
    dataloader: &DataLoader,
    optimizer: &mut dyn Optimizer,
    criterion: &dyn Loss,
    device: Device,
) -> Result<Vec<BatchMemory>, Error> {
    model.train(true);
    let mut seen = Vec::new();
    for (batch_idx, batch) in dataloader.epoch(0)?.enumerate() {
        let batch = batch?;
        // Track memory before the batch.
        let before = memory::memory_allocated(device)?;
        let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
        optimizer.zero_grad(true)?;
        let output = model.call(&data)?;
        let loss = criterion.forward(&output, &target)?;
        loss.backward()?;
        optimizer.step()?;
        // Track memory after the batch.
        let after = memory::memory_allocated(device)?;
        let peak = memory::max_memory_allocated(device)?;
        if batch_idx % 10 == 0 {
            let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
            println!("Batch {batch_idx}:");
            println!("  Memory: {:.2} MB", mb(after));
            println!("  Peak: {:.2} MB", mb(peak));
            println!("  Delta: {:.2} MB", mb(after) - mb(before));
        }
        // Clear the cache periodically (caution: can slow training).
        if batch_idx % 100 == 0 {
            memory::empty_cache(device)?;
        }
        seen.push(BatchMemory {
            before,
            after,
            peak,
        });
    }
    Ok(seen)
}

/// The lesson's `validate`, under `no_grad` (the text's `@torch.no_grad()`): the mean
/// loss, and whether any output carried a graph.
pub fn validate(
    model: &dyn Module,
    val_loader: &DataLoader,
    criterion: &dyn Loss,
    device: Device,
) -> Result<(f64, bool), Error> {
    let _g = no_grad();
    model.eval();
    let mut val_loss = 0.0;
    let mut graph = false;
    for batch in val_loader.epoch(0)? {
        let batch = batch?;
        let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
        let output = model.call(&data)?;
        graph |= output.grad_fn_name().is_some();
        val_loss += criterion.forward(&output, &target)?.item::<f64>()?;
    }
    model.train(true);
    Ok((val_loss / val_loader.len() as f64, graph))
}

/// What the memory sections showed ([`run_memory`]).
#[derive(Debug)]
pub struct MemoryReport {
    /// After `reset_peak_memory_stats()`: the peak and what is allocated.
    pub peak_after_reset: u64,
    /// See `peak_after_reset`.
    pub allocated_after_reset: u64,
    /// `train_with_memory_tracking`'s numbers, per batch.
    pub tracked: Vec<BatchMemory>,
    /// `CheckpointedModel`: whether it gives the plain model's gradients, and the peak
    /// bytes of a step of each.
    pub checkpoint_same_grads: bool,
    /// See `checkpoint_same_grads`.
    pub peak_plain: u64,
    /// See `checkpoint_same_grads`.
    pub peak_checkpointed: u64,
    /// `train_step` with `del output; del loss`: bytes allocated before it and after it (the
    /// gradients, now allocated, aside).
    pub before_step: u64,
    /// See `before_step`.
    pub after_step: u64,
    /// The gradients' bytes.
    pub grad_bytes: u64,
    /// `validate`: the loss and whether a graph was recorded.
    pub val_loss: f64,
    /// See `val_loss`.
    pub val_graph: bool,
    /// Bytes `zero_grad(set_to_none=True)` freed, and those `zero_grad()` without it freed.
    pub freed_set_to_none: u64,
    /// See `freed_set_to_none`.
    pub freed_zeroing: u64,
    /// Issue 1: the losses summed with `.item()` each step and with one `.item()` at the end
    /// of the losses kept (detached) on the device; whether those kept were detached.
    pub bad_total: f64,
    /// See `bad_total`.
    pub good_total: f64,
    /// See `bad_total`.
    pub good_detached: bool,
    /// Issue 2: whether the preallocated buffer is the same storage at each `get`.
    pub buffer_reused: bool,
    /// Issue 2 (CUDA): the error of an allocation beyond `set_per_process_memory_fraction(0.8)`.
    pub fraction_error: Option<String>,
    /// Issue 3 (CUDA): whether the device has Tensor Cores (`props.major >= 7`).
    pub tensor_cores: Option<bool>,
}

/// Peak bytes of a forward and backward of `model` on `x` above what was allocated, and
/// the gradients.
fn peak_step(
    model: &dyn Module,
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
        .map(|p| p.grad().map_or(Ok(Vec::new()), |g| g.to_vec::<f32>()))
        .collect::<Result<_, _>>()?;
    Ok((peak, grads))
}

fn grad_bytes(model: &dyn Module) -> u64 {
    model
        .parameters()
        .iter()
        .filter_map(|p| p.grad())
        .map(|g| 4 * g.numel() as u64)
        .sum()
}

/// The lesson's memory sections on `device`.
pub fn run_memory(device: Device) -> Result<MemoryReport, Error> {
    // Monitoring memory usage.
    let gb = |b: u64| b as f64 / (1024.0 * 1024.0 * 1024.0);
    println!("Allocated: {:.2} GB", gb(memory::memory_allocated(device)?));
    println!("Peak: {:.2} GB", gb(memory::max_memory_allocated(device)?));
    println!("Reserved: {:.2} GB", gb(memory::memory_reserved(device)?));
    if let Device::Cuda(i) = device {
        println!(
            "Total: {:.2} GB",
            gb(cuda::get_device_properties(i)?.total_memory)
        );
    }
    memory::reset_peak_memory_stats(device)?;
    let peak_after_reset = memory::max_memory_allocated(device)?;
    let allocated_after_reset = memory::memory_allocated(device)?;

    // Memory profiling during training.
    let model = MyModel::new()?;
    model.to(device)?;
    let mut optimizer = Adam::new(model.parameters(), AdamOptions::default())?;
    let criterion = CrossEntropyLoss::new();
    let loader = DataLoader::new(task(256)?).batch_size(32);
    let tracked = train_with_memory_tracking(&model, &loader, &mut optimizer, &criterion, device)?;

    // Gradient checkpointing: the same gradients.
    let width = 64;
    ember::tensor::random::manual_seed(7);
    let plain = CheckpointedModel::new(width, false)?;
    ember::tensor::random::manual_seed(7);
    let ckpt = CheckpointedModel::new(width, true)?;
    plain.to(device)?;
    ckpt.to(device)?;
    let x = Tensor::randn([2048, width], device)?;
    let (peak_plain, g_plain) = peak_step(&plain, &x, device)?;
    let (peak_checkpointed, g_ckpt) = peak_step(&ckpt, &x, device)?;
    println!("peak of a step: {peak_plain} bytes plain, {peak_checkpointed} checkpointed");

    // Technique 1: delete unnecessary variables, then empty the cache.
    model.zero_grad(true)?;
    let batch = loader.epoch(1)?.next().transpose()?;
    let batch = batch.ok_or_else(|| ember::nn::NnError::invalid("walk-through", "no batch"))?;
    let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
    let before_step = memory::memory_allocated(device)?;
    {
        let output = model.call(&data)?;
        let loss = criterion.forward(&output, &target)?;
        loss.backward()?;
        drop(output); // del output
        drop(loss); // del loss
        memory::empty_cache(device)?;
    }
    let after_step = memory::memory_allocated(device)?;
    let grads = grad_bytes(&model);

    // Technique 2: validation under no_grad.
    let (val_loss, val_graph) = validate(&model, &loader, &criterion, device)?;

    // Technique 3: zero_grad(set_to_none=True) frees the gradients; zeroing keeps them.
    let with_grads = memory::memory_allocated(device)?;
    optimizer.zero_grad(false)?;
    let freed_zeroing = with_grads.saturating_sub(memory::memory_allocated(device)?);
    optimizer.zero_grad(true)?;
    let freed_set_to_none = with_grads.saturating_sub(memory::memory_allocated(device)?);
    // Technique 4: empty the cache between phases.
    memory::empty_cache(device)?;

    // Issue 1: avoid a synchronisation per step; accumulate on the device, sync once.
    let mut bad_example = Vec::new();
    let mut good_example = Vec::new();
    for batch in loader.epoch(2)? {
        let batch = batch?;
        let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
        optimizer.zero_grad(true)?;
        let loss = criterion.forward(&model.call(&data)?, &target)?;
        loss.backward()?;
        optimizer.step()?;
        bad_example.push(loss.item::<f64>()?); // a synchronisation
        good_example.push(loss.detach()); // none
    }
    let good_detached = good_example.iter().all(|l| l.grad_fn_name().is_none());
    let refs: Vec<&Tensor> = good_example.iter().collect();
    let mean = Tensor::stack(&refs, 0)?.mean_all()?.item::<f64>()?; // one sync
    let good_total = mean * good_example.len() as f64;
    let bad_total: f64 = bad_example.iter().sum();

    // Issue 2: preallocate a buffer and reuse it.
    let buffer = Tensor::empty([32, 100], device)?;
    let get = || buffer.clone();
    let buffer_reused = get().same(&get());
    let fraction_error = match device {
        Device::Cuda(i) => {
            memory::set_per_process_memory_fraction(0.8, device)?;
            let total = cuda::get_device_properties(i)?.total_memory as usize;
            let too_big = Tensor::empty([total * 17 / 20], (device, ember::DType::U8));
            memory::set_per_process_memory_fraction(1.0, device)?;
            too_big.err().map(|e| e.to_string())
        }
        Device::Cpu => None,
    };

    // Issue 3: do Tensor Cores help? (Dimensions in multiples of 8 suit them.)
    let tensor_cores = match device {
        Device::Cuda(i) => {
            let props = cuda::get_device_properties(i)?;
            let yes = props.major >= 7;
            if yes {
                println!("Tensor Cores supported");
            } else {
                println!("No Tensor Cores - FP16 may not help");
            }
            Some(yes)
        }
        Device::Cpu => None,
    };
    ensure(
        g_plain.iter().all(|g| !g.is_empty()),
        "every layer got a gradient",
    )?;
    Ok(MemoryReport {
        peak_after_reset,
        allocated_after_reset,
        tracked,
        checkpoint_same_grads: g_plain == g_ckpt,
        peak_plain,
        peak_checkpointed,
        before_step,
        after_step,
        grad_bytes: grads,
        val_loss,
        val_graph,
        freed_set_to_none,
        freed_zeroing,
        bad_total,
        good_total,
        good_detached,
        buffer_reused,
        fraction_error,
        tensor_cores,
    })
}

/// One configuration of `benchmark_dataloader`.
#[derive(Debug, Clone)]
pub struct LoaderRun {
    /// `num_workers` and `pin_memory`.
    pub num_workers: usize,
    /// See `num_workers`.
    pub pin_memory: bool,
    /// Batches loaded and copied to the device, and their rate (printed, never asserted).
    pub batches: usize,
    /// See `batches`.
    pub batches_per_sec: f64,
    /// Whether every batch was pinned.
    pub pinned: bool,
    /// The first feature of each batch's first row, to compare the configurations' order.
    pub firsts: Vec<f32>,
}

/// The lesson's `benchmark_dataloader`: load up to `num_batches` batches of `loader` and
/// copy each to `device` without blocking.
pub fn benchmark_dataloader(
    loader: &DataLoader,
    num_batches: usize,
    device: Device,
) -> Result<(usize, f64, bool, Vec<f32>), Error> {
    let start = Instant::now();
    let (mut count, mut pinned, mut firsts) = (0, true, Vec::new());
    for (i, batch) in loader.epoch(0)?.enumerate() {
        if i >= num_batches {
            break;
        }
        let batch = batch?;
        pinned &= batch[0].data().is_pinned();
        // Simulate the transfer to the GPU.
        let data = batch[0].to_non_blocking(device)?;
        let _target = batch[1].to_non_blocking(device)?;
        firsts.push(data.narrow(0, 0, 1)?.narrow(1, 0, 1)?.item::<f32>()?);
        count += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let per_sec = count as f64 / elapsed;
    println!("Batches/sec: {per_sec:.2}");
    println!(
        "Time/batch: {:.2} ms",
        elapsed / count.max(1) as f64 * 1000.0
    );
    Ok((count, per_sec, pinned, firsts))
}

/// "Optimizing Data Loading" on `device`: the tuned loader (4 workers, pinned memory,
/// `prefetch_factor=2`), then `benchmark_dataloader` over the text's four configurations,
/// `num_batches` batches each.
pub fn run_data_loading(device: Device, num_batches: usize) -> Result<Vec<LoaderRun>, Error> {
    let dataset = task(32 * num_batches)?;
    // Optimize the DataLoader for GPU training.
    let train_loader = DataLoader::new(Arc::clone(&dataset))
        .batch_size(32)
        .shuffle(true)
        .num_workers(4) // parallel data loading
        .pin_memory(true) // faster transfer to the GPU
        .prefetch_factor(2); // batches prefetched per worker
    let (count, _, pinned, _) = benchmark_dataloader(&train_loader, num_batches, device)?;
    ensure(count == num_batches && pinned, "the tuned loader")?;

    // Test different configurations.
    let configs = [(0, false), (0, true), (4, true), (8, true)];
    let mut runs = Vec::new();
    for (num_workers, pin_memory) in configs {
        let loader = DataLoader::new(Arc::clone(&dataset))
            .batch_size(32)
            .num_workers(num_workers)
            .pin_memory(pin_memory);
        println!("\nConfig: {{'num_workers': {num_workers}, 'pin_memory': {pin_memory}}}");
        let (batches, batches_per_sec, pinned, firsts) =
            benchmark_dataloader(&loader, num_batches, device)?;
        runs.push(LoaderRun {
            num_workers,
            pin_memory,
            batches,
            batches_per_sec,
            pinned,
            firsts,
        });
    }
    Ok(runs)
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    let device = ember::try_gpu(0);
    run_memory(device)?;
    run_data_loading(device, 100)?;
    Ok(())
}
