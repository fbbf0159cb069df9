//! A new user's program (issue 45), line for line with its PyTorch twin `digits_cnn.py`: a
//! custom CNN with a generic residual block under `#[derive(Module)]`, the digits under a
//! `DataLoader`, AdamW with OneCycleLR, gradient clipping and accumulation, autocast with a
//! `GradScaler`, five profiled steps, memory statistics, a checkpoint of model, optimizer
//! and scaler reloaded into fresh objects, and evaluation under `inference_mode`.
//!
//! `cargo run --release --example digits_cnn` (`EMBER_CUDA_EMULATOR=1` for the emulated
//! GPU). `tests/walkthroughs.rs` runs it for one epoch on the CPU and the emulated GPU.

use ember::data::digits;
use ember::optim::{OneCycleLR, OneCycleLrOptions};
use ember::prelude::*;
use ember::profiler::{ProfileOptions, ProfilerActivity, profile, schedule};

#[derive(Debug, Module)]
struct Residual<M: Module> {
    inner: M,
}

impl<M: Module> Module for Residual<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::relu(&x.add(&self.inner.call(x)?)?)
    }
}

fn conv_bn(c_in: usize, c_out: usize) -> Result<Sequential> {
    let conv = Conv2d::new(c_in, c_out, 3, ())?.padding(1).bias(false);
    Ok(Sequential::new().add(conv).add(BatchNorm2d::new(c_out, ())?))
}

#[derive(Debug, Module)]
struct Net {
    stem: Sequential,
    block: Residual<Sequential>,
    pool: MaxPool2d,
    head: Linear,
}

impl Net {
    fn new() -> Result<Net> {
        let stem = Sequential::new().add(conv_bn(1, 16)?).add(ReLU::new());
        let inner = Sequential::new().add(conv_bn(16, 16)?).add(ReLU::new());
        let block = Residual { inner: inner.add(conv_bn(16, 16)?) };
        let (pool, head) = (MaxPool2d::new(2), Linear::new(16 * 4 * 4, 10, ())?);
        Ok(Net { stem, block, pool, head })
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.pool.call(&self.block.call(&self.stem.call(x)?)?)?;
        self.head.call(&x.flatten(1, -1)?)
    }
}

fn evaluate(model: &Net, loader: &DataLoader, device: Device) -> Result<f64> {
    model.eval();
    let (_guard, mut correct) = (inference_mode(), 0.0);
    for batch in loader.iter()? {
        let batch = batch?;
        let (x, y) = (batch[0].to(device)?, batch[1].to(device)?);
        let hits = model.call(&x)?.argmax(1)?.eq(&y)?;
        correct += hits.to_dtype(DType::F64)?.sum(())?.item::<f64>()?;
    }
    Ok(correct / loader.dataset().len() as f64)
}

/// Trains for `epochs` on `device`: the accuracy, and the reloaded copy's.
pub fn run(device: Device, epochs: usize) -> Result<(f64, f64)> {
    let (accum, lr) = (2, 3e-3);
    manual_seed(0);
    let digits = digits::load()?;
    let x = digits.images.reshape([digits.len(), 1, 8, 8])?.div(16.0)?;
    let data = TensorDataset::new(vec![x, digits.labels])?;
    let [train, val] = random_split(data, [0.8, 0.2])?;
    let train_loader = DataLoader::new(train).batch_size(32).shuffle(true);
    let val_loader = DataLoader::new(val).batch_size(256);

    let model = Net::new()?;
    model.to(device)?;
    println!("{model}");
    let mut optimizer = AdamW::new(model.parameters(), lr)?;
    let steps = epochs * (train_loader.len() / accum);
    let opts = OneCycleLrOptions::default();
    let mut scheduler = OneCycleLR::new(&mut optimizer, lr, steps, opts)?;
    let mut scaler = GradScaler::new(device)?.enabled(device.is_cuda());
    let amp_dtype = if device.is_cuda() { DType::F16 } else { DType::Bf16 };
    let mut activities = vec![ProfilerActivity::Cpu];
    activities.extend(device.is_cuda().then_some(ProfilerActivity::Cuda));
    let sched = schedule().wait(1).warmup(1).active(5).repeat(1);
    let mut prof = Some(profile(ProfileOptions::new().activities(activities).schedule(sched))?);
    for epoch in 0..epochs {
        model.train(true);
        for (i, batch) in train_loader.iter()?.enumerate() {
            let batch = batch?;
            let (x, y) = (batch[0].to(device)?, batch[1].to(device)?);
            let loss = {
                let _autocast = amp::autocast(device, amp_dtype)?;
                F::cross_entropy(&model.call(&x)?, &y, ())?.div(accum as f64)?
            };
            scaler.scale(&loss)?.backward()?;
            if (i + 1) % accum == 0 {
                scaler.unscale_(&mut optimizer)?;
                clip_grad_norm_(&model.parameters(), 1.0, 2.0)?;
                scaler.step(&mut optimizer)?;
                scaler.update()?;
                optimizer.zero_grad(true)?;
                scheduler.step(&mut optimizer)?;
            }
            if let Some(p) = prof.as_mut() {
                p.step()?;
            }
        }
        if let Some(mut p) = prof.take() {
            p.stop()?;
            println!("{}", p.key_averages()?.table("cpu_time_total", 10)?);
        }
        println!("epoch {epoch}: accuracy {:.3}", evaluate(&model, &val_loader, device)?);
    }
    let (allocated, peak) =
        (memory::memory_allocated(device)?, memory::max_memory_allocated(device)?);
    println!("memory: {allocated} bytes allocated, peak {peak}");

    let path = std::env::temp_dir().join("digits_cnn.safetensors");
    let state = StateDict::new()
        .with("model", model.state_dict()?)
        .with("optimizer", optimizer.state_dict()?)
        .with("scaler", scaler.state_dict()?)
        .with("epoch", epochs);
    ember::save(&state, &path)?;
    let ckpt = ember::load(&path, device)?;
    let model2 = Net::new()?;
    model2.to(device)?;
    let mut optimizer2 = AdamW::new(model2.parameters(), lr)?;
    let mut scaler2 = GradScaler::new(device)?.enabled(device.is_cuda());
    model2.load_state_dict(&ckpt.sub("model"))?;
    optimizer2.load_state_dict(&ckpt.sub("optimizer"))?;
    scaler2.load_state_dict(&ckpt.sub("scaler"))?;
    let accuracy = evaluate(&model, &val_loader, device)?;
    let reloaded = evaluate(&model2, &val_loader, device)?;
    let epoch = ckpt.item::<usize>("epoch")?;
    println!("epoch {epoch}: accuracy {accuracy:.3}, reloaded {reloaded:.3}");
    Ok((accuracy, reloaded))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    run(Device::cuda_if_available(), 5).map(|_| ())
}
