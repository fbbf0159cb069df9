//! "Chapter 17: Using torch with CUDA" (docs/walkthroughs.md), replayed: checking for CUDA,
//! the device, moving tensors and models (to a second GPU too), memory statistics and
//! `empty_cache`, the cuDNN settings ([`run`]), and the AMP loop over a `DataLoader`
//! ([`run_amp`]; the text's `model`, `optimizer` and `dataloader` are made by `main`, and
//! by the tests). 17.5's `DataParallel` is `data_parallel.rs`.
//! `cargo run --example using_torch_with_cuda`

use ember::prelude::*;

/// 17.2 to 17.7 and 17.9 on `device` (`second` as `cuda:1`): the tensor back on the CPU,
/// and the model.
pub fn run(device: Device, second: Device) -> Result<(Tensor, Linear)> {
    println!("{} {}", cuda::is_available(), cuda::device_count());
    let _x = Tensor::randn([5, 5], ())?.to(device)?;
    let model = Linear::new(5, 3, device)?; // model.to(device)
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    let x_cpu = x.to(device)?.to(Device::Cpu)?; // x_cuda, then back to the CPU
    for i in 0..cuda::device_count() {
        println!("{}", cuda::get_device_name(i)?);
    }
    model.to(second)?; // model = model.to('cuda:1')
    println!("{} {}", memory::memory_allocated(device)?, memory::memory_reserved(device)?);
    memory::empty_cache(device)?; // frees no tensor's memory
    ember::backends::cudnn::set_benchmark(true); // 17.9
    ember::backends::cudnn::set_deterministic(false);
    Ok((x_cpu, model))
}

/// 17.8: one epoch of the AMP loop over `dataloader`: its losses.
pub fn run_amp(model: &Linear, dataloader: &DataLoader, optimizer: &mut SGD) -> Result<Vec<f64>> {
    let (device, loss_fn, mut losses) = (model.weight.device(), CrossEntropyLoss::new(), vec![]);
    let mut scaler = GradScaler::new(device)?.enabled(device.is_cuda()); // GradScaler()
    for batch in dataloader.iter()? {
        let batch = batch?;
        let (input, target) = (batch[0].to(device)?, batch[1].to(device)?);
        optimizer.zero_grad(true)?;
        let autocast = amp::autocast_with(device)?; // with autocast():
        let output = model.call(&input)?;
        let loss = loss_fn.forward(&output, &target)?;
        drop(autocast);
        scaler.scale(&loss)?.backward()?;
        scaler.step(optimizer)?;
        scaler.update()?;
        losses.push(loss.item::<f64>()?);
    }
    Ok(losses)
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let (_, model) = run(Device::cuda_if_available(), ember::try_gpu(1))?;
    let data = vec![Tensor::randn([256, 5], ())?, Tensor::randint(0, 3, [256], ())?];
    let dataloader = DataLoader::new(TensorDataset::new(data)?).batch_size(32);
    run_amp(&model, &dataloader, &mut SGD::new(model.parameters(), 0.5)?).map(|_| ())
}
