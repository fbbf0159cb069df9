//! "Lesson 03: PyTorch GPU Acceleration" (docs/walkthroughs.md), replayed: moving tensors,
//! device-agnostic code, several GPUs with `set_device` and a device guard, `MyModel` moved
//! with `to(device)`, the training loop over a pinned `DataLoader` with workers and
//! non-blocking copies, evaluation under `no_grad` ([`run`]); mixed precision ([`run_amp`]:
//! the AMP loop, "How AMP Works", the BF16 loop, `benchmark_precision`); "Performance
//! Profiling" ([`run_profiler`]). The memory and data-loading sections are
//! `lesson_memory_and_data.rs`. What the text's comments claim, the program asserts.
//! `cargo run --example lesson_gpu_acceleration`

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ember::prelude::*;
use ember::profiler::{
    ProfileOptions, ProfilerActivity as Act, profile, record_function, schedule,
};
use ember::tensor::set_float32_matmul_precision;

/// `class MyModel(nn.Module)`: two linear layers with a ReLU between.
#[derive(Debug, Module)]
pub struct MyModel {
    fc1: Linear,
    fc2: Linear,
    relu: ReLU,
}

impl MyModel {
    /// `MyModel()`.
    pub fn new() -> Result<Self> {
        Ok(MyModel {
            fc1: Linear::new(100, 50, ())?,
            fc2: Linear::new(50, 10, ())?,
            relu: ReLU::new(),
        })
    }
}

impl Module for MyModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.call(&self.relu.call(&self.fc1.call(x)?)?)
    }
}

/// `train_epoch`: one epoch of `dataloader`, its mean loss.
pub fn train_epoch(model: &MyModel, dataloader: &DataLoader, optimizer: &mut Adam) -> Result<f64> {
    let (device, criterion) = (model.fc1.weight.device(), CrossEntropyLoss::new());
    model.train(true);
    let mut total_loss = 0.0;
    for batch in dataloader.iter()? {
        let batch = batch?;
        let data = batch[0].to_non_blocking(device)?; // pinned: without blocking the host
        let target = batch[1].to_non_blocking(device)?;
        optimizer.zero_grad(true)?;
        let loss = criterion.forward(&model.call(&data)?, &target)?;
        loss.backward()?;
        optimizer.step()?;
        total_loss += loss.item::<f64>()?;
    }
    Ok(total_loss / dataloader.len() as f64)
}

/// 512 inputs labelled by the arg-max of a fixed linear map, in pinned batches of 32 from
/// two workers.
fn task_loader() -> Result<(DataLoader, Tensor, Tensor)> {
    let inputs = Tensor::randn([512, 100], ())?;
    let labels = inputs.mm(&Tensor::randn([100, 10], ())?)?.argmax(1)?;
    let data = TensorDataset::new(vec![inputs.clone(), labels.clone()])?;
    let loader = DataLoader::new(data).batch_size(32).shuffle(true);
    Ok((loader.pin_memory(true).num_workers(2), inputs, labels))
}

/// The first sections with `device` (and `second` as the other GPU): the epoch losses and
/// the training accuracy.
pub fn run(device: Device, second: Device) -> Result<(Vec<f64>, f64)> {
    let x_cpu = Tensor::randn([100, 100], ())?;
    let x_gpu = x_cpu.to(device)?; // x_cpu.cuda()
    let y_gpu = Tensor::randn([100, 100], device)?; // created on the device
    assert_eq!(x_gpu.to(Device::Cpu)?.to_vec::<f32>()?, x_cpu.to_vec::<f32>()?);
    let x = Tensor::randn([100, 100], device)?; // device-agnostic
    assert_eq!(x.mm(&y_gpu)?.device(), device);
    for i in 0..cuda::device_count() {
        println!("GPU {i}: {}", cuda::get_device_name(i)?);
    }
    let (_a, _b) = (Tensor::randn([100], device)?, Tensor::randn([100], second)?);
    if let (Device::Cuda(i), Device::Cuda(j)) = (device, second) {
        cuda::set_device(i)?;
        let guard = cuda::DeviceGuard::new(j)?; // with torch.cuda.device(1):
        assert_eq!(Tensor::randn([10], ())?.cuda()?.device(), Device::Cuda(j));
        drop(guard);
        assert_eq!(cuda::current_device()?, i);
    }
    let model = MyModel::new()?;
    model.to(device)?;
    for (name, param) in model.named_parameters() {
        println!("{name}: {}", param.device());
    }
    let (train_loader, inputs, labels) = task_loader()?;
    let (mut optimizer, mut losses) = (Adam::new(model.parameters(), 0.01)?, vec![]);
    for epoch in 0..5 {
        losses.push(train_epoch(&model, &train_loader, &mut optimizer)?);
        println!("Epoch {epoch}: Loss = {:.4}", losses[epoch]);
    }
    model.eval();
    let _g = no_grad();
    let predictions = model.call(&inputs.to(device)?)?;
    assert!(predictions.grad_fn_name().is_none());
    let hits = predictions.argmax(1)?.eq(&labels.to(device)?)?.to_dtype(DType::F32)?;
    Ok((losses, hits.mean(())?.item::<f64>()?))
}

/// What [`run_amp`] measured: the AMP and BF16 loops' epoch losses, the AMP loop's scaler,
/// the unscaled gradients' largest difference from f32's (relative), and each precision's
/// benchmark row (name, seconds, peak bytes).
#[derive(Debug)]
pub struct Amp {
    /// The AMP loop's mean loss per epoch.
    pub losses: Vec<f64>,
    /// Its scaler.
    pub scaler: GradScaler,
    /// The unscaled gradients' largest difference from f32's, relative to the largest.
    pub grad_rel_error: f64,
    /// The BF16 loop's mean loss per epoch.
    pub bf16_losses: Vec<f64>,
    /// `benchmark_precision`'s rows: name, seconds, peak bytes.
    pub benchmark: Vec<(&'static str, f64, u64)>,
}

/// The mixed-precision sections on `device`: `epochs` for each loop, `iterations` for the
/// benchmark.
pub fn run_amp(device: Device, epochs: usize, iterations: usize) -> Result<Amp> {
    let low = if device.is_cuda() { DType::F16 } else { DType::Bf16 };
    let (train_loader, ..) = task_loader()?;
    let criterion = CrossEntropyLoss::new();
    let mut scaler = GradScaler::new(device)?.enabled(device.is_cuda()); // GradScaler()
    let model = MyModel::new()?;
    model.to(device)?;
    let (mut optimizer, mut losses) = (Adam::new(model.parameters(), 0.01)?, vec![]);
    for _ in 0..epochs {
        let mut total = 0.0;
        for (batch_idx, batch) in train_loader.iter()?.enumerate() {
            let batch = batch?;
            let data = batch[0].to_non_blocking(device)?;
            let target = batch[1].to_non_blocking(device)?;
            optimizer.zero_grad(true)?;
            let autocast = amp::autocast_with(device)?; // forward pass with autocast
            let output = model.call(&data)?;
            let loss = criterion.forward(&output, &target)?;
            drop(autocast);
            assert_eq!((output.dtype(), loss.dtype()), (low, DType::F32));
            scaler.scale(&loss)?.backward()?; // backward pass with gradient scaling
            let params = model.parameters();
            assert!(params.iter().all(|p| p.grad().is_some_and(|g| g.dtype() == DType::F32)));
            scaler.step(&mut optimizer)?; // optimizer step with unscaling
            scaler.update()?;
            if batch_idx % 100 == 0 {
                println!("Loss: {:.4}", loss.item::<f32>()?);
            }
            total += loss.item::<f64>()?;
        }
        losses.push(total / train_loader.len() as f64);
    }

    // How AMP works: mm in FP16 (BF16 on the CPU), cross_entropy in FP32.
    let x = Tensor::randn([64, 100], device)?;
    let y = Tensor::randn([100, 10], device)?.requires_grad_(true)?;
    let target = Tensor::randint(0, 10, [64], device)?;
    let autocast = amp::autocast_with(device)?;
    let z = x.mm(&y)?; // FP16 matrix multiplication
    let loss = F::cross_entropy(&z, &target, ())?; // FP32 loss
    drop(autocast);
    assert_eq!((z.dtype(), loss.dtype()), (low, DType::F32));
    let mut demo = GradScaler::new(device)?; // enabled on every device, to show it
    let mut sgd = SGD::new(vec![y.clone()], 0.1)?;
    let scaled_loss = demo.scale(&loss)?; // loss * 65536
    assert_eq!(scaled_loss.item::<f64>()?, loss.item::<f64>()? * 65536.0);
    scaled_loss.backward()?;
    let scaled = y.grad().expect("backward() ran").to_vec::<f32>()?;
    demo.unscale_(&mut sgd)?; // unscaled_grads = grads / scale_factor
    let unscaled = y.grad().expect("backward() ran").to_vec::<f32>()?;
    assert!(scaled.iter().zip(&unscaled).all(|(s, u)| s / 65536.0 == *u));
    let y32 = y.detach().requires_grad_(true)?; // the f32 gradients, without autocast
    F::cross_entropy(&x.mm(&y32)?, &target, ())?.backward()?;
    let exact = y32.grad().expect("backward() ran").to_vec::<f32>()?;
    let largest = exact.iter().fold(0f32, |m, g| m.max(g.abs()));
    let diff = unscaled.iter().zip(&exact).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    demo.step(&mut sgd)?;
    demo.update()?; // no overflow: kept (it grows after 2000 clean steps)
    assert_eq!(demo.get_scale()?, 65536.0);
    sgd.zero_grad(true)?;
    let huge = F::cross_entropy(&x.mm(&y)?, &target, ())?.mul(1e35)?;
    demo.scale(&huge)?.backward()?; // overflows to inf
    assert!(!demo.step(&mut sgd)?); // skipped
    demo.update()?;
    assert_eq!(demo.get_scale()?, 32768.0); // halved

    // BFloat16: no gradient scaling.
    set_float32_matmul_precision("medium")?;
    let model = MyModel::new()?;
    model.to(device)?;
    let (mut optimizer, mut bf16_losses) = (Adam::new(model.parameters(), 0.01)?, vec![]);
    for _ in 0..epochs {
        let mut total = 0.0;
        for batch in train_loader.iter()? {
            let batch = batch?;
            let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
            optimizer.zero_grad(true)?;
            let autocast = amp::autocast(device, DType::Bf16)?;
            let loss = criterion.forward(&model.call(&data)?, &target)?;
            drop(autocast);
            loss.backward()?; // no scaler needed
            optimizer.step()?;
            total += loss.item::<f64>()?;
        }
        bf16_losses.push(total / train_loader.len() as f64);
    }
    set_float32_matmul_precision("highest")?;

    let data = Tensor::randn([128, 100], device)?;
    let benchmark = benchmark_precision(&MyModel::new()?, &data, iterations)?;
    let grad_rel_error = (diff / largest) as f64;
    Ok(Amp { losses, scaler, grad_rel_error, bf16_losses, benchmark })
}

/// `benchmark_precision`: `iterations` inferences in FP32, FP16 under autocast and BF16,
/// each timed to a synchronised device with its peak memory (printed, never asserted).
pub fn benchmark_precision(
    model: &MyModel,
    data: &Tensor,
    iterations: usize,
) -> Result<Vec<(&'static str, f64, u64)>> {
    let (device, mut results) = (data.device(), vec![]);
    model.to(device)?;
    for (name, dtype, fp16) in
        [("FP32", DType::F32, false), ("FP16", DType::F16, true), ("BF16", DType::Bf16, false)]
    {
        model.to(dtype)?; // model.half(), model.bfloat16()
        let data = data.to_dtype(dtype)?;
        let base = memory::memory_allocated(device)?;
        memory::reset_peak_memory_stats(device)?;
        let (start, _g) = (Instant::now(), no_grad());
        for _ in 0..iterations {
            let _autocast = if fp16 { Some(amp::autocast(device, DType::F16)?) } else { None };
            model.call(&data)?;
        }
        device.cuda_index().map(|i| cuda::synchronize(Some(i))).transpose()?;
        let peak = memory::max_memory_allocated(device)? - base;
        results.push((name, start.elapsed().as_secs_f64(), peak));
        println!("{name}: {:.3}s, peak memory {peak} bytes", results[results.len() - 1].1);
    }
    Ok(results)
}

/// What [`run_profiler`] showed: the basic table, the `record_function` rows (name, host
/// and device time) under `activities=[CUDA]`, the steps of each scheduled trace, the
/// memory table and its bottlenecks (key, bytes).
#[derive(Debug)]
pub struct Profiled {
    /// The basic profile's table.
    pub table: String,
    /// The `record_function` rows (name, host time, device time) under `activities=[CUDA]`.
    pub cuda_only_rows: Vec<(String, u64, u64)>,
    /// The steps of each scheduled trace.
    pub recorded_steps: Vec<Vec<String>>,
    /// The memory profile's table.
    pub memory_table: String,
    /// Its bottlenecks: key, bytes, largest first.
    pub memory_events: Vec<(String, i64)>,
}

/// "Performance Profiling" on `device`, writing `trace.json` and the TensorBoard traces
/// under `log_dir` (the text's `./log`).
pub fn run_profiler(device: Device, log_dir: &Path) -> Result<Profiled> {
    let model = MyModel::new()?;
    model.to(device)?;
    let (criterion, mut optimizer) =
        (CrossEntropyLoss::new(), Adam::new(model.parameters(), 1e-3)?);
    let data = TensorDataset::new(vec![
        Tensor::randn([400, 100], ())?,
        Tensor::randint(0, 10, [400], ())?,
    ])?;
    let train_loader = DataLoader::new(data).batch_size(16).shuffle(true);
    let mut batches = train_loader.iter()?;
    let mut step = |optimizer: &mut Adam| -> Result<()> {
        let batch = batches.next().expect("enough batches")?;
        let loss = criterion.forward(&model.call(&batch[0].to(device)?)?, &batch[1].to(device)?)?;
        loss.backward()?;
        optimizer.step()?;
        optimizer.zero_grad(true)
    };

    let mut prof = profile(ProfileOptions::new().activities([Act::Cpu, Act::Cuda]))?; // basic
    for _ in 0..10 {
        step(&mut optimizer)?;
    }
    prof.stop()?;
    let table = prof.key_averages()?.table("cuda_time_total", 10)?;
    println!("{table}");
    prof.export_chrome_trace(log_dir.join("trace.json"))?;
    drop(prof);

    let mut prof = profile(ProfileOptions::new().activities([Act::Cuda]))?; // record_function
    let (data, target) = (Tensor::randn([16, 100], device)?, Tensor::randint(0, 10, [16], device)?);
    let output = {
        let _r = record_function("forward");
        model.call(&data)?
    };
    let loss = {
        let _r = record_function("loss");
        criterion.forward(&output, &target)?
    };
    let r = record_function("backward");
    loss.backward()?;
    drop(r);
    prof.stop()?;
    let averages = prof.key_averages()?;
    println!("{}", averages.table("cuda_time_total", 100)?);
    let cuda_only_rows = averages
        .rows
        .iter()
        .map(|r| (r.key.clone(), r.cpu_time_total, r.device_time_total))
        .collect();
    drop(prof);

    let recorded: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let (seen, mut handler) =
        (recorded.clone(), ember::profiler::tensorboard_trace_handler(log_dir, None));
    let on_ready = move |p: &ember::profiler::Profile| {
        let steps = p.events.iter().filter(|e| e.name.starts_with("ProfilerStep#"));
        seen.lock().expect("not poisoned").push(steps.map(|e| e.name.clone()).collect());
        handler(p)
    };
    let sched = schedule().skip_first(5).wait(1).warmup(2).active(3).repeat(2);
    let opts = ProfileOptions::new()
        .activities([Act::Cpu, Act::Cuda])
        .schedule(sched)
        .on_trace_ready(on_ready);
    let mut prof = profile(opts.record_shapes(true).profile_memory(true).with_stack(true))?;
    for batch in train_loader.iter()? {
        let batch = batch?;
        criterion
            .forward(&model.call(&batch[0].to(device)?)?, &batch[1].to(device)?)?
            .backward()?;
        optimizer.step()?;
        optimizer.zero_grad(true)?;
        prof.step()?; // signal the end of a step
    }
    prof.stop()?;
    drop(prof);

    let opts =
        ProfileOptions::new().activities([Act::Cuda]).profile_memory(true).record_shapes(true);
    let mut prof = profile(opts)?; // memory profiling
    for _ in 0..10 {
        step(&mut optimizer)?;
    }
    prof.stop()?;
    let averages = prof.key_averages()?;
    let memory_table = averages.table("self_cuda_memory_usage", 10)?;
    println!("{memory_table}");
    let rows = averages.rows.iter().filter(|e| e.self_device_memory_usage > 0);
    let mut memory_events: Vec<(String, i64)> =
        rows.map(|e| (e.key.clone(), e.self_device_memory_usage)).collect();
    memory_events.sort_by_key(|e| std::cmp::Reverse(e.1)); // memory bottlenecks
    memory_events.truncate(5);
    let recorded_steps = recorded.lock().expect("not poisoned").clone();
    Ok(Profiled { table, cuda_only_rows, recorded_steps, memory_table, memory_events })
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let device = ember::try_gpu(0);
    run(device, ember::try_gpu(1))?;
    run_amp(device, 5, 100)?;
    run_profiler(device, Path::new("log")).map(|_| ())
}
