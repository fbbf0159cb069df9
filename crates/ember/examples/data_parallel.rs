//! The walk-throughs' `nn.DataParallel` loop (docs/walkthroughs.md: the guide's
//! "Multi-GPU training with DataParallel", the chapter's and the handbook's
//! `model = DataParallel(model); model = model.to('cuda')`), replayed: the model wrapped when
//! there is more than one GPU, moved to CUDA, trained with the unchanged loop on batches of
//! `128 * device_count()`. The epoch is repeated on one device from the same weights and
//! batches: the losses agree. `cargo run --example data_parallel [samples]` (default 1000).

use ember::prelude::*;
use ember_parallel::DataParallel;

/// One epoch of the text's loop over `loader`: the batch losses.
fn epoch(model: &dyn Module, loader: &DataLoader) -> Result<Vec<f64>> {
    let (mut optimizer, criterion) =
        (Adam::new(model.parameters(), 0.001)?, CrossEntropyLoss::new());
    let mut losses = vec![];
    for batch in loader.iter()? {
        let batch = batch?;
        let (batch_x, batch_y) = (batch[0].to("cuda")?, batch[1].to("cuda")?);
        let output = model.call(&batch_x)?;
        let loss = criterion.forward(&output, &batch_y)?;
        optimizer.zero_grad(true)?;
        loss.backward()?;
        optimizer.step()?;
        losses.push(loss.item::<f64>()?);
    }
    Ok(losses)
}

/// The DataParallel loop on `samples` samples: the batch losses of the DataParallel run and
/// of the same run on one device.
pub fn run(samples: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let net = Sequential::new().add(Linear::new(1000, 512, ())?).add(ReLU::new());
    let net = net.add(Linear::new(512, 10, ())?);
    let single = net.replicate()?; // copy.deepcopy(model), for the run on one device
    let gpus = cuda::device_count();
    let model: Box<dyn Module> = if gpus > 1 {
        println!("Using {gpus} GPUs");
        Box::new(DataParallel::new(net, None, None)?)
    } else {
        Box::new(net)
    };
    model.to_target(&Device::Cuda(0))?; // model.cuda()
    let data = TensorDataset::new(vec![
        Tensor::randn([samples, 1000], ())?,
        Tensor::randint(0, 10, [samples], ())?,
    ])?;
    let loader = DataLoader::new(data).batch_size(128 * gpus).shuffle(true); // a multiple of the GPUs
    loader.set_epoch(0);
    let parallel = epoch(model.as_ref(), &loader)?;
    println!("Epoch 1 complete (DataParallel): losses {parallel:.4?}");
    single.to(Device::Cuda(0))?;
    loader.set_epoch(0); // the same batches
    let one = epoch(&single, &loader)?;
    println!("Epoch 1 complete (one device): losses {one:.4?}");
    Ok((parallel, one))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    run(std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1000)).map(|_| ())
}
