//! The PyTorch walk-through "GPU Computing" (docs/walkthroughs.md), replayed in Rust: device
//! discovery and properties, creating tensors on a device and moving them with `to`, `cpu()`,
//! pinned memory with non-blocking copies, the allocator's statistics (`memory_allocated`, its
//! peak, `memory_reserved`, `memory_summary`), freeing memory (`drop` is `del`, then
//! `empty_cache`), `no_grad` inference, and gradient checkpointing of a model's blocks, with
//! the peak memory it saves.
//!
//! `cargo run --example gpu_computing_chapter`

use std::sync::Arc;

use ember::nn::{Linear, Module, ReLU, Sequential, checkpoint};
use ember::{Device, Error, Tensor, cuda, memory, no_grad};

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

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    run(ember::try_gpu(0), ember::try_gpu(1))
}
