//! "Lesson 03: PyTorch GPU Acceleration", its memory and data-loading sections
//! (docs/walkthroughs.md), replayed beside `lesson_gpu_acceleration.rs`: monitoring memory,
//! `train_with_memory_tracking`, the `CheckpointedModel`, `del` and `empty_cache`,
//! `validate` under `no_grad`, `zero_grad(set_to_none=True)`, losses kept on the device
//! with one synchronisation, a preallocated buffer, `set_per_process_memory_fraction`, the
//! Tensor Core check ([`run_memory`]); the tuned `DataLoader` and `benchmark_dataloader`
//! ([`run_data_loading`]). `gc.collect()` has no counterpart: Rust frees a tensor when its
//! last owner drops it. `cargo run --example lesson_memory_and_data`

use std::sync::Arc;
use std::time::Instant;

use ember::nn::checkpoint;
use ember::prelude::*;

/// `CheckpointedModel`: ten linear layers, each run through `checkpoint`.
#[derive(Debug, Module)]
pub struct CheckpointedModel {
    layers: Vec<Arc<dyn Module>>,
}

impl Module for CheckpointedModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = checkpoint(layer.clone(), &x)?; // recomputed during backward
        }
        Ok(x)
    }
}

fn task(n: usize) -> Result<Arc<TensorDataset>> {
    let inputs = Tensor::randn([n, 100], ())?;
    let labels = inputs.mm(&Tensor::randn([100, 10], ())?)?.argmax(1)?;
    Ok(Arc::new(TensorDataset::new(vec![inputs, labels])?))
}

fn grads(model: &dyn Module) -> Result<Vec<Vec<f32>>> {
    model.parameters().iter().map(|p| p.grad().expect("backward() ran").to_vec::<f32>()).collect()
}

/// `train_with_memory_tracking` for one epoch: `(before, after)` bytes of each batch.
pub fn train_with_memory_tracking(
    (model, loader, device): (&Sequential, &DataLoader, Device),
    optimizer: &mut Adam,
    criterion: &CrossEntropyLoss,
) -> Result<Vec<(u64, u64)>> {
    let mut seen = vec![];
    for (batch_idx, batch) in loader.iter()?.enumerate() {
        let batch = batch?;
        let before = memory::memory_allocated(device)?;
        let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
        optimizer.zero_grad(true)?;
        criterion.forward(&model.call(&data)?, &target)?.backward()?;
        optimizer.step()?;
        let after = memory::memory_allocated(device)?;
        let peak = memory::max_memory_allocated(device)?;
        if batch_idx % 10 == 0 {
            println!("Batch {batch_idx}: Memory {after} B, Peak {peak} B");
        }
        if batch_idx % 100 == 0 {
            memory::empty_cache(device)?; // periodically (can slow training)
        }
        seen.push((before, after));
    }
    Ok(seen)
}

/// The memory sections' findings: per-batch (allocated, reserved), the bytes
/// `zero_grad(set_to_none=True)` freed, the error past the memory fraction.
type MemoryRun = (Vec<(u64, u64)>, u64, Option<String>);

/// The memory sections on `device`: the per-batch memory of the tracked epoch, the bytes
/// `zero_grad(set_to_none=True)` freed after `zero_grad()` freed none, and the error of an
/// allocation past `set_per_process_memory_fraction(0.8)` (CUDA).
pub fn run_memory(device: Device) -> Result<MemoryRun> {
    let gb = |b: u64| b as f64 / 1e9;
    println!("Allocated: {:.2} GB", gb(memory::memory_allocated(device)?));
    println!("Reserved: {:.2} GB", gb(memory::memory_reserved(device)?));
    memory::reset_peak_memory_stats(device)?;
    assert_eq!(memory::max_memory_allocated(device)?, memory::memory_allocated(device)?);

    let model = Sequential::new().add(Linear::new(100, 50, ())?).add(ReLU::new());
    let model = model.add(Linear::new(50, 10, ())?);
    model.to(device)?;
    let mut optimizer = Adam::new(model.parameters(), AdamOptions::default())?;
    let criterion = CrossEntropyLoss::new();
    let loader = DataLoader::new(task(256)?).batch_size(32);
    let run = (&model, &loader, device);
    let tracked = train_with_memory_tracking(run, &mut optimizer, &criterion)?;

    let layers = (0..10).map(|_| Ok(Arc::new(Linear::new(64, 64, ())?) as Arc<dyn Module>));
    let ckpt = CheckpointedModel { layers: layers.collect::<Result<_>>()? };
    ckpt.to(device)?;
    let x = Tensor::randn([256, 64], device)?;
    ckpt.call(&x)?.square()?.mean(())?.backward()?;
    let checkpointed = grads(&ckpt)?;
    ckpt.zero_grad(true)?;
    let plain = ckpt.layers.iter().try_fold(x, |x, l| l.call(&x))?;
    plain.square()?.mean(())?.backward()?;
    assert_eq!(grads(&ckpt)?, checkpointed); // the same gradients, recomputed

    let batch = loader.iter()?.next().expect("a batch")?;
    let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
    let output = model.call(&data)?;
    let loss = criterion.forward(&output, &target)?;
    loss.backward()?;
    drop((output, loss)); // del output, loss
    memory::empty_cache(device)?;

    let guard = no_grad(); // validate(): no graph kept
    let val = criterion.forward(&model.call(&data)?, &target)?;
    assert!(val.grad_fn_name().is_none());
    let with_grads = memory::memory_allocated(device)?;
    optimizer.zero_grad(false)?; // zeroed: kept
    assert_eq!(memory::memory_allocated(device)?, with_grads);
    optimizer.zero_grad(true)?; // set to None: freed
    let freed = with_grads - memory::memory_allocated(device)?;
    drop(guard);

    let (mut bad_example, mut good_example) = (vec![], vec![]);
    for batch in loader.iter()? {
        let batch = batch?;
        let loss = criterion.forward(&model.call(&batch[0].to(device)?)?, &batch[1].to(device)?)?;
        bad_example.push(loss.item::<f64>()?); // a synchronisation
        good_example.push(loss.detach()); // none
    }
    let refs: Vec<&Tensor> = good_example.iter().collect();
    let total_loss = Tensor::stack(&refs, 0)?.mean(())?.item::<f64>()?; // one
    let bad = bad_example.iter().sum::<f64>() / bad_example.len() as f64;
    assert!((total_loss - bad).abs() <= 1e-5 * bad);

    let buffer = Tensor::empty([32, 100], device)?; // preallocated, reused
    assert!(buffer.clone().same(&buffer));
    let fraction_error = match device {
        Device::Cuda(i) => {
            memory::set_per_process_memory_fraction(0.8, device)?;
            let total = cuda::get_device_properties(i)?.total_memory as usize;
            let too_big = Tensor::empty([total * 17 / 20], (device, DType::U8));
            memory::set_per_process_memory_fraction(1.0, device)?;
            let props = cuda::get_device_properties(i)?;
            println!("Tensor Cores supported: {}", props.major >= 7);
            too_big.err().map(|e| e.to_string())
        }
        Device::Cpu => None,
    };
    Ok((tracked, freed, fraction_error))
}

/// `benchmark_dataloader`: `n` batches copied to `device`; the first value of each (to
/// compare the configurations' order) and whether every batch came pinned.
pub fn benchmark_dataloader(
    loader: &DataLoader,
    n: usize,
    device: Device,
) -> Result<(Vec<f32>, bool)> {
    let (start, mut firsts, mut pinned) = (Instant::now(), vec![], true);
    for batch in loader.iter()?.take(n) {
        let batch = batch?;
        pinned &= batch[0].data().is_pinned();
        let data = batch[0].to_non_blocking(device)?;
        let _target = batch[1].to_non_blocking(device)?;
        firsts.push(data.flatten(0, -1)?.narrow(0, 0, 1)?.item::<f32>()?);
    }
    println!("Batches/sec: {:.2}", firsts.len() as f64 / start.elapsed().as_secs_f64());
    Ok((firsts, pinned))
}

/// "Optimizing Data Loading": the tuned loader, then the four configurations, `n` batches
/// each: each configuration's first values.
pub fn run_data_loading(device: Device, n: usize) -> Result<Vec<Vec<f32>>> {
    let dataset = task(32 * n)?;
    let train_loader = DataLoader::new(dataset.clone()).batch_size(32).shuffle(true);
    let train_loader = train_loader.num_workers(4).pin_memory(true).prefetch_factor(2);
    let (firsts, pinned) = benchmark_dataloader(&train_loader, n, device)?;
    assert!(firsts.len() == n && pinned);
    let mut runs = vec![];
    for (num_workers, pin_memory) in [(0, false), (0, true), (4, true), (8, true)] {
        let loader = DataLoader::new(dataset.clone()).batch_size(32).num_workers(num_workers);
        println!("Config: num_workers {num_workers}, pin_memory {pin_memory}");
        let (firsts, pinned) = benchmark_dataloader(&loader.pin_memory(pin_memory), n, device)?;
        assert_eq!(pinned, pin_memory);
        runs.push(firsts);
    }
    Ok(runs)
}

#[allow(dead_code)]
fn main() -> Result<()> {
    run_memory(ember::try_gpu(0))?;
    run_data_loading(ember::try_gpu(0), 100).map(|_| ())
}
