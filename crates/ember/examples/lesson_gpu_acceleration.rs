//! The PyTorch walk-through "Lesson 03: PyTorch GPU Acceleration" (docs/walkthroughs.md),
//! replayed in Rust: moving tensors between devices, device-agnostic code, several GPUs with
//! `set_device` and a device guard, a custom model (`MyModel`) moved with `to(device)`, and the
//! complete training loop over a `DataLoader` with pinned memory, worker threads and
//! non-blocking copies, then evaluation under `no_grad`. (Mixed precision comes with the AMP
//! crate.)
//!
//! `cargo run --example lesson_gpu_acceleration`

use std::sync::Arc;

use ember::data::{DataLoader, Dataset, TensorDataset};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU};
use ember::optim::{Adam, AdamOptions, Optimizer};
use ember::{Device, Error, Tensor, cuda, no_grad};

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(ember::nn::NnError::invalid("walk-through", what).into())
    }
}

/// `class MyModel(nn.Module)`: two linear layers with a ReLU between. `#[derive(Module)]`
/// registers the fields as `nn.Module.__setattr__` registers attributes in Python.
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
        let x = self.relu.call(&self.fc1.call(x)?)?;
        self.fc2.call(&x)
    }
}

/// One epoch: the text's `train_epoch`, returning the mean loss.
pub fn train_epoch(
    model: &dyn Module,
    dataloader: &DataLoader,
    epoch: u64,
    optimizer: &mut dyn Optimizer,
    criterion: &dyn Loss,
    device: Device,
) -> Result<f64, Error> {
    model.train(true);
    let mut total_loss = 0.0;
    for batch in dataloader.epoch(epoch)? {
        let batch = batch?;
        // Move data to the GPU; pinned batches copy without blocking the host.
        let data = batch[0].to_non_blocking(device)?;
        let target = batch[1].to_non_blocking(device)?;
        optimizer.zero_grad(true)?;
        let output = model.call(&data)?;
        let loss = criterion.forward(&output, &target)?;
        loss.backward()?;
        optimizer.step()?;
        total_loss += loss.item::<f32>()? as f64;
    }
    Ok(total_loss / dataloader.len() as f64)
}

/// Runs the walk-through with `device` (and `second` as the other GPU when there are two).
pub fn run(device: Device, second: Device) -> Result<(), Error> {
    // Moving tensors between devices.
    let x_cpu = Tensor::randn([100, 100], ())?;
    let x_gpu = x_cpu.to(device)?; // x_cpu.cuda() / x_cpu.to('cuda')
    let y_gpu = Tensor::randn([100, 100], device)?; // created on the device directly
    let result_cpu = x_gpu.to("cpu")?;
    ensure(
        result_cpu.to_vec::<f32>()? == x_cpu.to_vec::<f32>()?,
        "the round trip is exact",
    )?;

    // Device-agnostic code.
    let x = Tensor::randn([100, 100], device)?;
    let result = x.mm(&y_gpu)?; // torch.mm(x, y)
    ensure(result.device() == device, "the product lives on the device")?;

    // Several GPUs.
    let n_gpus = cuda::device_count();
    for i in 0..n_gpus {
        println!("GPU {i}: {}", cuda::get_device_name(i)?);
    }
    let a = Tensor::randn([100], device)?; // on the first GPU
    let b = Tensor::randn([100], second)?; // on the second
    ensure(
        a.device() == device && b.device() == second,
        "tensors on their GPUs",
    )?;
    if let (Device::Cuda(i), Device::Cuda(j)) = (device, second) {
        cuda::set_device(i)?; // torch.cuda.set_device(0)
        ensure(
            Tensor::randn([10], ())?.cuda()?.device() == Device::Cuda(i),
            ".cuda() uses the current device",
        )?;
        {
            let _guard = cuda::DeviceGuard::new(j)?; // with torch.cuda.device(1):
            ensure(
                Tensor::randn([10], ())?.cuda()?.device() == Device::Cuda(j),
                "inside the guard",
            )?;
        }
        ensure(
            cuda::current_device()? == i,
            "the guard restores the device",
        )?;
    }

    // A custom model, moved: every parameter follows.
    let model = MyModel::new()?;
    model.to(device)?;
    for (name, param) in model.named_parameters() {
        println!("{name}: {}", param.device());
        ensure(param.device() == device, "parameters on the device")?;
    }

    // A learnable task: the labels are the arg-max of a fixed linear map of the inputs.
    let inputs = Tensor::randn([512, 100], ())?;
    let teacher = Tensor::randn([100, 10], ())?;
    let labels = inputs.mm(&teacher)?.argmax(1)?;
    let dataset: Arc<dyn Dataset> =
        Arc::new(TensorDataset::new(vec![inputs.clone(), labels.clone()])?);
    let train_loader = DataLoader::new(dataset)
        .batch_size(32)
        .shuffle(true)
        .pin_memory(true) // pinned batches, for non-blocking copies
        .num_workers(2);

    // The text uses Adam's defaults; a larger step lets this small example converge in a
    // few epochs.
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 0.01,
            ..Default::default()
        },
    )?;
    let criterion = CrossEntropyLoss::new();
    let mut losses = Vec::new();
    for epoch in 0..5 {
        let loss = train_epoch(
            &model,
            &train_loader,
            epoch,
            &mut optimizer,
            &criterion,
            device,
        )?;
        println!("Epoch {epoch}: Loss = {loss:.4}");
        losses.push(loss);
    }
    ensure(losses[4] < 0.7 * losses[0], "training lowers the loss")?;

    // Evaluation: no graph is recorded under no_grad.
    model.eval();
    let _g = no_grad();
    let predictions = model.call(&inputs.to(device)?)?;
    ensure(
        !predictions.requires_grad() && predictions.grad_fn_name().is_none(),
        "no graph under no_grad",
    )?;
    let correct = predictions
        .argmax(1)?
        .eq(&labels.to(device)?)?
        .to_dtype(ember::DType::F32)?
        .mean_all()?
        .item::<f32>()?;
    println!("training accuracy: {:.1}%", 100.0 * correct);
    ensure(correct > 0.5, "the model learned the task")?;
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    run(ember::try_gpu(0), ember::try_gpu(1))
}
