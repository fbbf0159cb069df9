//! "GPU Computing", chapter 4 of a PyTorch course (docs/walkthroughs.md), replayed: device
//! discovery, tensors made on and moved between devices, a model on the data's device,
//! pinned memory and a pinned `DataLoader`, the allocator's statistics, `del` and
//! `empty_cache`, `no_grad`/`enable_grad`, `LargeModel` with checkpointed blocks ([`run`]);
//! the AMP loop with and without checkpointing ([`run_amp`]); `torch_profiler.py`
//! ([`run_profiler`]); `memory_profiling.py` ([`run_memory_history`]); "Minimize CPU-GPU
//! Transfers" and "Common Pitfalls and Debugging" ([`run_pitfalls`]). `DataParallel`:
//! `data_parallel.rs`; `distributed.py`: `distributed.rs`.
//! `cargo run --example gpu_computing_chapter`

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ember::nn::checkpoint;
use ember::prelude::*;
use ember::profiler::{ProfileOptions, ProfilerActivity, profile, schedule};

/// `LargeModel`: a stem and two blocks, checkpointed when `checkpointing`.
#[derive(Debug, Module)]
pub struct LargeModel {
    stem: Linear,
    block1: Arc<dyn Module>,
    block2: Arc<dyn Module>,
    checkpointing: bool,
}

fn block(width: usize, depth: usize) -> Result<Arc<dyn Module>> {
    let mut s = Sequential::new();
    for _ in 0..depth {
        s = s.add(Linear::new(width, width, ())?).add(ReLU::new());
    }
    Ok(Arc::new(s))
}

impl LargeModel {
    /// Two blocks of `depth` layers of `width`, with or without checkpointing.
    pub fn new(width: usize, depth: usize, checkpointing: bool) -> Result<Self> {
        let (block1, block2) = (block(width, depth)?, block(width, depth)?);
        let stem = Linear::new(width, width, ())?;
        Ok(LargeModel { stem, block1, block2, checkpointing })
    }
}

impl Module for LargeModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.stem.call(x)?;
        if !self.checkpointing {
            return self.block2.call(&self.block1.call(&x)?);
        }
        // Recompute activations during backward instead of storing them.
        let x = checkpoint(self.block1.clone(), &x)?;
        checkpoint(self.block2.clone(), &x)
    }
}

/// A step's peak memory above the start, and the gradients.
fn peak_step(model: &LargeModel, x: &Tensor) -> Result<(u64, Vec<Vec<f32>>)> {
    let base = memory::memory_allocated(x.device())?;
    memory::reset_peak_memory_stats(x.device())?;
    model.call(x)?.square()?.mean(())?.backward()?;
    let peak = memory::max_memory_allocated(x.device())? - base;
    let params = model.parameters();
    let grads = params.iter().map(|p| p.grad().expect("backward() ran").to_vec::<f32>());
    Ok((peak, grads.collect::<Result<_>>()?))
}

/// The chapter's first half on `device` (`second` as `cuda:1`): the peak memory of a step
/// of `LargeModel` without and with checkpointing.
pub fn run(device: Device, second: Device) -> Result<(u64, u64)> {
    println!("{} {}", cuda::is_available(), cuda::device_count());
    if cuda::device_count() > 0 {
        let props = cuda::get_device_properties(0)?;
        println!("{} {} {:?}", cuda::current_device()?, cuda::get_device_name(0)?, props);
    }
    let x = Tensor::randn([1000, 1000], device)?;
    let _y = Tensor::randn([1000, 1000], ())?.to(device)?; // or .cuda()
    let _z = Tensor::randn([1000, 1000], second)?; // cuda:1
    assert_eq!(x.zeros_like()?.device(), device); // same device as x

    let cpu_tensor = Tensor::randn([1000, 1000], ())?;
    let gpu_tensor = cpu_tensor.to(device)?;
    let _back_to_cpu = gpu_tensor.cpu()?;
    let model = Linear::new(1000, 100, ())?;
    model.to(device)?;
    let _output = model.call(&gpu_tensor)?; // works
    if device.is_cuda() {
        println!("model(cpu_tensor): {}", model.call(&cpu_tensor).expect_err("two devices"));
    }

    let pinned_tensor = cpu_tensor.pin_memory()?;
    let _gpu_tensor = pinned_tensor.to_non_blocking(device)?;
    let dataset = TensorDataset::new(vec![cpu_tensor.narrow(0, 0, 128)?])?;
    let train_loader = DataLoader::new(dataset).batch_size(32).pin_memory(true).num_workers(4);
    for batch in train_loader.iter()? {
        assert!(batch?[0].data().is_pinned());
    }

    let allocated = memory::memory_allocated(device)?;
    let max_allocated = memory::max_memory_allocated(device)?;
    let reserved = memory::memory_reserved(device)?;
    println!("Allocated {allocated}, peak {max_allocated}, reserved {reserved} bytes");
    println!("{}", memory::memory_summary(device)?);

    let large_tensor = Tensor::zeros([2048, 2048], device)?;
    let with_large = memory::memory_allocated(device)?;
    drop(large_tensor); // del large_tensor
    memory::empty_cache(device)?;
    assert!(with_large - memory::memory_allocated(device)? >= 2048 * 2048 * 4);

    let inputs = Tensor::randn([64, 1000], device)?;
    let predictions = {
        let _g = no_grad(); // gradient tensors are not stored
        model.call(&inputs)?
    };
    assert!(predictions.grad_fn_name().is_none());
    let outer = no_grad();
    let output = {
        let _g = enable_grad(); // training: gradients computed
        model.call(&inputs)?
    };
    assert!(output.grad_fn_name().is_some());
    assert_eq!(Tensor::zeros([100], device)?.device(), inputs.zeros_like()?.device());
    drop(outer);

    manual_seed(0);
    let plain = LargeModel::new(64, 8, false)?;
    manual_seed(0);
    let ckpt = LargeModel::new(64, 8, true)?;
    plain.to(device)?;
    ckpt.to(device)?;
    let xb = Tensor::randn([4096, 64], device)?;
    let ((peak_plain, g_plain), (peak_ckpt, g_ckpt)) =
        (peak_step(&plain, &xb)?, peak_step(&ckpt, &xb)?);
    assert_eq!(g_plain, g_ckpt); // the same gradients, with less memory
    println!("a step's peak: {peak_plain} bytes, {peak_ckpt} checkpointed");
    Ok((peak_plain, peak_ckpt))
}

/// An AMP run: the epoch losses, the model, and the last output and loss.
type AmpRun = (Vec<f64>, LargeModel, Tensor, Tensor);

/// The AMP loop on `LargeModel` for `num_epochs`: the epoch losses, the model, and the last
/// output and loss.
pub fn amp_train(
    model: LargeModel,
    loader: &DataLoader,
    device: Device,
    num_epochs: usize,
) -> Result<AmpRun> {
    let mut scaler = GradScaler::new(device)?.enabled(device.is_cuda()); // GradScaler()
    model.to(device)?;
    let mut optimizer = Adam::new(model.parameters(), 0.01)?;
    let (criterion, mut losses, mut last) = (CrossEntropyLoss::new(), vec![], None);
    for _ in 0..num_epochs {
        let mut total = 0.0;
        for batch in loader.iter()? {
            let batch = batch?;
            let (inputs, targets) = (batch[0].to(device)?, batch[1].to(device)?);
            optimizer.zero_grad(true)?;
            let autocast = amp::autocast_with(device)?; // autocast to FP16
            let outputs = model.call(&inputs)?;
            let loss = criterion.forward(&outputs, &targets)?;
            drop(autocast);
            scaler.scale(&loss)?.backward()?; // scaled gradients
            scaler.step(&mut optimizer)?; // unscale and update
            scaler.update()?;
            total += loss.item::<f64>()?;
            last = Some((outputs, loss));
        }
        losses.push(total / loader.len() as f64);
    }
    let (outputs, loss) = last.ok_or_else(|| Error::invalid("amp_train", "no batches"))?;
    Ok((losses, model, outputs, loss))
}

/// The AMP loop for `epochs` on a learnable task, with and without checkpointing.
pub fn run_amp(device: Device, epochs: usize) -> Result<[AmpRun; 2]> {
    let inputs = Tensor::randn([256, 32], ())?;
    let labels = inputs.mm(&Tensor::randn([32, 32], ())?)?.argmax(1)?;
    let data = Arc::new(TensorDataset::new(vec![inputs, labels])?);
    let seed = ember::tensor::random::initial_seed();
    let run = |checkpointing| {
        manual_seed(seed); // the same weights and batches
        let loader = DataLoader::new(data.clone()).batch_size(32).shuffle(true);
        amp_train(LargeModel::new(32, 1, checkpointing)?, &loader, device, epochs)
    };
    Ok([run(false)?, run(true)?])
}

/// `torch_profiler.py` on `device`, writing `trace.json` and the TensorBoard `log/` under
/// `out`: the table, and the kernels and copies in the trace.
pub fn run_profiler(device: Device, out: &Path) -> Result<(String, usize)> {
    let model = LargeModel::new(32, 1, false)?;
    model.to(device)?;
    let inputs = Tensor::randn([32, 32], device)?;
    let activities = [ProfilerActivity::Cpu, ProfilerActivity::Cuda];
    let opts = ProfileOptions::new().activities(activities);
    let mut prof = profile(opts.record_shapes(true).profile_memory(true))?;
    for _ in 0..10 {
        model.call(&inputs)?.sum(())?.backward()?;
    }
    prof.stop()?;
    let table = prof.key_averages()?.table("cuda_time_total", 10)?;
    println!("{table}");
    prof.export_chrome_trace(out.join("trace.json"))?;
    let device_events = prof.profile()?.events.iter().filter(|e| e.kind.is_device()).count();
    drop(prof);

    let labels = Tensor::randint(0, 32, [32], ())?;
    let data = TensorDataset::new(vec![inputs.cpu()?, labels])?;
    let loader = DataLoader::new(data).batch_size(2);
    let (criterion, mut optimizer) =
        (CrossEntropyLoss::new(), Adam::new(model.parameters(), 1e-3)?);
    let handler = ember::profiler::tensorboard_trace_handler(out.join("log"), None);
    let sched = schedule().wait(1).warmup(1).active(3).repeat(2);
    let mut prof = profile(
        ProfileOptions::new().activities(activities).on_trace_ready(handler).schedule(sched),
    )?;
    for batch in loader.iter()? {
        let batch = batch?;
        let output = model.call(&batch[0].to(device)?)?;
        criterion.forward(&output, &batch[1].to(device)?)?.backward()?;
        optimizer.step()?;
        prof.step()?; // signal the next iteration
    }
    prof.stop()?;
    Ok((table, device_events))
}

/// `memory_profiling.py` on `device`: the history recorded over a loop, dumped with the
/// snapshot to `out/memory_snapshot.json`, then switched off. The dump's path, and
/// `memory_allocated` and `memory_reserved` at the dump.
pub fn run_memory_history(device: Device, out: &Path) -> Result<(PathBuf, u64, u64)> {
    memory::record_memory_history(device, true)?; // the last 100000 events
    let model = LargeModel::new(32, 1, false)?;
    model.to(device)?;
    let data = TensorDataset::new(vec![Tensor::randn([64, 32], ())?])?;
    for batch in DataLoader::new(data).batch_size(16).iter()? {
        model.call(&batch?[0].to(device)?)?.sum(())?.backward()?;
    }
    let (snapshot, history) = (memory::memory_snapshot(device)?, memory::memory_history(device)?);
    let (allocated, reserved) =
        (memory::memory_allocated(device)?, memory::memory_reserved(device)?);
    let dump = out.join("memory_snapshot.json");
    let json = serde_json::json!({ "segments": snapshot.segments, "device_traces": history });
    std::fs::write(&dump, json.to_string())?;
    memory::record_memory_history(device, false)?; // enabled=None
    println!("Allocated {allocated}, cached {reserved} bytes");
    println!("Max allocated: {} bytes", memory::max_memory_allocated(device)?);
    Ok((dump, allocated, reserved))
}

/// `verify_model_device(model, expected_device)`.
pub fn verify_model_device(model: &dyn Module, expected: &str) -> Result<()> {
    for (name, param) in model.named_parameters() {
        let found = param.device().type_name();
        let msg = format!("Parameter {name} on {}, expected {expected}", param.device());
        (found == expected).then_some(()).ok_or(nn::NnError::invalid("verify", msg))?;
    }
    Ok(())
}

/// The GOOD loop, and the pitfalls on `device`: the bytes kept losses hold, the gradient
/// after two backward passes over one, and `verify_model_device` of a model left on the CPU.
pub fn run_pitfalls(device: Device) -> Result<(u64, f64, Result<()>)> {
    let model = Linear::new(100, 10, ())?;
    model.to(device)?;
    let criterion = CrossEntropyLoss::new();
    let data = TensorDataset::new(vec![
        Tensor::randn([128, 100], ())?,
        Tensor::randint(0, 10, [128], ())?,
    ])?;
    let loader = DataLoader::new(data).batch_size(32).pin_memory(true);
    let base = memory::memory_allocated(device)?;
    let mut losses = vec![];
    for batch in loader.iter()? {
        let batch = batch?;
        let data = batch[0].to_non_blocking(device)?;
        let target = batch[1].to_non_blocking(device)?;
        let loss = criterion.forward(&model.call(&data)?, &target)?; // all on the GPU
        losses.push(loss); // keeps the computation graph: use loss.item()
    }
    let kept = memory::memory_allocated(device)? - base;

    let (x, y) = (Tensor::randn([32, 100], device)?, Tensor::randint(0, 10, [32], device)?);
    let grad = || model.weight.grad().expect("backward() ran").abs()?.sum(())?.item::<f64>();
    criterion.forward(&model.call(&x)?, &y)?.backward()?;
    let once = grad()?;
    criterion.forward(&model.call(&x)?, &y)?.backward()?; // no zero_grad: they add up
    let ratio = grad()? / once;

    println!("x: shape={:?}, device={}, dtype={:?}", x.dims(), x.device(), x.dtype());
    verify_model_device(&model, device.type_name())?;
    let unmoved = verify_model_device(&Linear::new(100, 10, ())?, "cuda");
    let gb = |b: u64| b as f64 / 1e9;
    let (allocated, reserved) =
        (memory::memory_allocated(device)?, memory::memory_reserved(device)?);
    println!("GPU Memory: {:.4}GB allocated, {:.4}GB reserved", gb(allocated), gb(reserved));
    Ok((kept, ratio, unmoved))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let device = ember::try_gpu(0);
    run(device, ember::try_gpu(1))?;
    run_amp(device, 5)?;
    run_profiler(device, Path::new("."))?;
    run_memory_history(device, Path::new("."))?;
    run_pitfalls(device).map(|_| ())
}
