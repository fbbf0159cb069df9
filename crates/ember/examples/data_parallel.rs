//! The walk-throughs' `nn.DataParallel` loop (docs/walkthroughs.md: "GPU Training with
//! PyTorch on CUDA", "Multi-GPU training with DataParallel"; the GPU-computing chapter's and
//! "Using Torch with CUDA"'s `model = DataParallel(model); model = model.to('cuda')`),
//! replayed in Rust: the model is wrapped when there is more than one GPU, moved to CUDA,
//! and trained with the unchanged loop; the batch is `128 * device_count()` so each GPU
//! gets 128 rows. The run is also repeated on one device from the same weights and the same
//! batches: the losses agree, as DataParallel computes the same thing split over devices.
//!
//! `cargo run --example data_parallel [samples]` (default 1000, the text's size)

use std::sync::Arc;

use ember::data::{DataLoader, Dataset, TensorDataset};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU, Replicate, Sequential};
use ember::optim::{Adam, AdamOptions, Optimizer};
use ember::{Device, Error, Tensor, cuda};
use ember_parallel::DataParallel;

fn ensure(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(ember::nn::NnError::invalid("walk-through", what).into())
    }
}

/// The text's model: `nn.Sequential(nn.Linear(1000, 512), nn.ReLU(), nn.Linear(512, 10))`.
fn model() -> Result<Sequential, Error> {
    Ok(Sequential::new()
        .add(Linear::new(1000, 512, ())?)
        .add(ReLU::new())
        .add(Linear::new(512, 10, ())?))
}

/// One epoch of the text's loop over `loader` with `model`; the batch losses.
fn epoch(model: &dyn Module, loader: &DataLoader) -> Result<Vec<f64>, Error> {
    let mut optimizer = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: 0.001,
            ..Default::default()
        },
    )?;
    let criterion = CrossEntropyLoss::new();
    let mut losses = Vec::new();
    for batch in loader.iter()? {
        let batch = batch?;
        let batch_x = batch[0].to("cuda")?;
        let batch_y = batch[1].to("cuda")?;
        let output = model.call(&batch_x)?;
        let loss = criterion.forward(&output, &batch_y)?;
        optimizer.zero_grad(true)?;
        loss.backward()?;
        optimizer.step()?;
        losses.push(loss.item::<f64>()?);
    }
    Ok(losses)
}

/// Runs the walk-through's DataParallel loop on `samples` samples; returns the batch losses
/// of the DataParallel run and of the same run on one device.
pub fn run(samples: usize) -> Result<(Vec<f64>, Vec<f64>), Error> {
    ensure(cuda::is_available(), "DataParallel needs CUDA")?;
    let x = Tensor::randn([samples, 1000], ())?;
    let y = Tensor::randint(0, 10, [samples], ())?;
    let dataset: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![x, y])?);
    let gpus = cuda::device_count();
    let net = model()?;
    // `copy.deepcopy(model)`: the same weights in tensors of its own, for the run on one device.
    let single = net.replicate()?;
    // Wrap with DataParallel (distributes batches across GPUs).
    let model: Box<dyn Module> = if gpus > 1 {
        println!("Using {gpus} GPUs");
        Box::new(DataParallel::new(net, None, None)?)
    } else {
        Box::new(net)
    };
    model.to_target(&Device::Cuda(0))?;
    // Batch size should be a multiple of the number of GPUs.
    let seed = ember::tensor::random::initial_seed();
    ember::tensor::random::manual_seed(seed);
    let loader = DataLoader::new(Arc::clone(&dataset))
        .batch_size(128 * gpus)
        .shuffle(true);
    let parallel = epoch(model.as_ref(), &loader)?;
    println!("Epoch 1 complete (DataParallel): losses {parallel:.4?}");
    // The same epoch on one device, same weights and batches.
    single.to(Device::Cuda(0))?;
    ember::tensor::random::manual_seed(seed);
    let loader = DataLoader::new(dataset)
        .batch_size(128 * gpus)
        .shuffle(true);
    let one = epoch(&single, &loader)?;
    println!("Epoch 1 complete (one device): losses {one:.4?}");
    ensure(
        parallel.len() == one.len(),
        "both runs see the same batches",
    )?;
    for (a, b) in parallel.iter().zip(&one) {
        ensure(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "DataParallel matches one device",
        )?;
    }
    Ok((parallel, one))
}

#[allow(dead_code)]
fn main() -> Result<(), Error> {
    let samples = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    run(samples)?;
    Ok(())
}
