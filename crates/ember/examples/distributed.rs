//! The GPU-computing chapter's `distributed.py` (docs/walkthroughs.md), replayed in Rust and
//! run as ranks: `dist.init_process_group(backend='nccl')`, `local_rank =
//! int(os.environ['LOCAL_RANK'])`, `model = MyModel().cuda(local_rank)`, `model = DDP(model,
//! device_ids=[local_rank])`, `sampler = DistributedSampler(dataset)` and `loader =
//! DataLoader(dataset, sampler=sampler, batch_size=32)`, then the training loop the text
//! leaves to the reader, with `sampler.set_epoch(epoch)` at the start of each epoch as
//! PyTorch's documentation asks.
//!
//! How the Python reads in Ember:
//! - `init_process_group(backend='nccl')` is `init_process_group_with(InitOptions::new(
//!   Backend::Nccl, InitMethod::Env).with_device(local_rank))`: rank and world size from the
//!   variables `ember launch` (torchrun) sets, the communicator on `cuda:LOCAL_RANK`. Where
//!   NCCL cannot serve, the `mpi` backend takes its place, as in `ember train` (Note
//!   [Distributed training]): on the CPU (where PyTorch would take `gloo`). On emulated
//!   GPUs the ranks meet over the emulator's NCCL, which joins separate processes (Note
//!   [NCCL across processes]); the tests also run the ranks as threads of one process
//!   (Note [Explicit groups]).
//! - `MyModel().cuda(local_rank)` is `model.to(Device::Cuda(local_rank))`.
//! - `DDP(model, device_ids=[local_rank])` is `DistributedDataParallel::new(model, &group,
//!   DdpOptions::default())`: the module is already on the rank's one device, which is all
//!   `device_ids=[local_rank]` says for a single-device module.
//! - `DistributedSampler(dataset)` takes its rank and world size from the group:
//!   `DistributedSampler::with_replicas(&dataset, world_size, rank)`.
//!
//! Each rank draws its own initial weights (seeded with its rank, so that it shows): DDP
//! replaces them with rank 0's. The chapter's claim, "DDP splits data and computation"
//! with synchronised gradients, is what [`one_process`] checks: one process training the
//! same model on the union of the ranks' batches (the global batch, 32 per rank) ends with
//! the same weights.
//!
//! ```sh
//! cargo build -p ember --features mpi --example distributed && cargo build -p ember-cli --features mpi
//! target/debug/ember launch --nproc-per-node 2 -- target/debug/examples/distributed
//! EMBER_CUDA_EMULATOR=2 target/debug/ember launch --nproc-per-node 2 -- target/debug/examples/distributed
//! ```

use std::sync::Arc;

use ember::data::{DataLoader, Dataset, Sampler, TensorDataset};
use ember::nn::{CrossEntropyLoss, Linear, Loss, Module, ReLU};
use ember::optim::{Optimizer, SGD, SgdOptions};
use ember::parallel::{
    Backend, DdpOptions, DistributedDataParallel, DistributedSampler, InitMethod, InitOptions,
    ProcessGroup, ReduceOp,
};
use ember::{Device, Error, Tensor, cuda, no_grad};

/// The loader's `batch_size=32`: each rank's batch.
pub const BATCH_SIZE: usize = 32;
/// The dataset: 256 samples of 20 features in 4 classes.
pub const SAMPLES: usize = 256;
const FEATURES: usize = 20;
const CLASSES: usize = 4;
const LR: f64 = 0.1;

/// The chapter's `MyModel` (it does not show one): a small MLP.
#[derive(Debug, Module)]
pub struct MyModel {
    fc1: Linear,
    relu: ReLU,
    fc2: Linear,
}

impl MyModel {
    /// `MyModel()`.
    pub fn new() -> Result<Self, Error> {
        Ok(MyModel {
            fc1: Linear::new(FEATURES, 32, ())?,
            relu: ReLU::new(),
            fc2: Linear::new(32, CLASSES, ())?,
        })
    }
}

impl Module for MyModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor, Error> {
        self.fc2.call(&self.relu.call(&self.fc1.call(x)?)?)
    }
}

/// The same dataset on every rank: drawn from a generator of its own, seeded with 0, so
/// every process (or thread) builds the same samples. Labels are the arg-max of a fixed
/// linear map of the inputs, a task the model can learn.
pub fn dataset() -> Result<Arc<dyn Dataset>, Error> {
    let _own = ember::tensor::random::ThreadGenerator::with_seed(0);
    let inputs = Tensor::randn([SAMPLES, FEATURES], ())?;
    let labels = inputs.mm(&Tensor::randn([FEATURES, CLASSES], ())?)?.argmax(1)?;
    Ok(Arc::new(TensorDataset::new(vec![inputs, labels])?))
}

/// What one rank saw, for the tests (printed as JSON by [`main`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RankReport {
    /// The group's rank and world size, and its backend.
    pub rank: usize,
    /// See `rank`.
    pub world_size: usize,
    /// See `rank`.
    pub backend: String,
    /// The device the rank trains on (`cuda:LOCAL_RANK`, or `cpu`).
    pub device: String,
    /// The device of every parameter of the wrapped model.
    pub param_devices: Vec<String>,
    /// This rank's own initial weights, before `DDP(..)`.
    pub initial: Vec<Vec<f32>>,
    /// The weights right after `DDP(..)` (rank 0's on every rank).
    pub wrapped: Vec<Vec<f32>>,
    /// The sample indices of this rank's shard, per epoch.
    pub shards: Vec<Vec<usize>>,
    /// `len(loader)`, and the size of each batch of the first epoch.
    pub batches_per_epoch: usize,
    /// See `batches_per_epoch`.
    pub batch_sizes: Vec<usize>,
    /// Each epoch's mean loss, averaged over the ranks (an `all_reduce` with `Avg`).
    pub epoch_losses: Vec<f64>,
    /// The weights after training.
    pub weights: Vec<Vec<f32>>,
}

fn weights(model: &dyn Module) -> Result<Vec<Vec<f32>>, Error> {
    model.parameters().iter().map(|p| p.to_vec::<f32>()).collect()
}

fn sgd(params: Vec<Tensor>) -> Result<SGD, Error> {
    SGD::new(params, SgdOptions { lr: LR, ..Default::default() })
}

/// The text's program on one rank of `group`, training on `device` (the rank's
/// `cuda:LOCAL_RANK`, or the CPU) for `epochs` epochs.
pub fn run(group: &ProcessGroup, device: Device, epochs: u64) -> Result<RankReport, Error> {
    let (rank, world_size) = (group.rank(), group.world_size());
    let dataset = dataset()?;

    // Create model and move to correct GPU: model = MyModel().cuda(local_rank). Each rank
    // draws different weights here (the seed is its rank).
    ember::tensor::random::manual_seed(100 + rank as u64);
    let model = MyModel::new()?;
    model.to(device)?;
    let initial = weights(&model)?;

    // Wrap with DDP: model = DDP(model, device_ids=[local_rank]). Rank 0's weights are
    // broadcast to every rank.
    let model = DistributedDataParallel::new(model, group, DdpOptions::default())?;
    let wrapped = weights(&model)?;
    let param_devices = model.parameters().iter().map(|p| p.device().to_string()).collect();

    // Use DistributedSampler for data loading.
    let sampler = Arc::new(DistributedSampler::with_replicas(dataset.as_ref(), world_size, rank)?);
    let loader =
        DataLoader::new(Arc::clone(&dataset)).sampler(sampler.clone()).batch_size(BATCH_SIZE);

    // The training loop: DDP averages the gradients over the ranks during backward.
    let mut optimizer = sgd(model.parameters())?;
    let criterion = CrossEntropyLoss::new();
    let mut report = RankReport {
        rank,
        world_size,
        backend: group.backend().to_string(),
        device: device.to_string(),
        param_devices,
        initial,
        wrapped,
        shards: Vec::new(),
        batches_per_epoch: loader.len(),
        batch_sizes: Vec::new(),
        epoch_losses: Vec::new(),
        weights: Vec::new(),
    };
    for epoch in 0..epochs {
        sampler.set_epoch(epoch); // a new shuffle each epoch, the same on every rank
        report.shards.push(sampler.indices(epoch)?);
        let mut total = Tensor::zeros([], device)?;
        for batch in loader.epoch(epoch)? {
            let batch = batch?;
            if epoch == 0 {
                report.batch_sizes.push(batch[0].dims()[0]);
            }
            let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
            optimizer.zero_grad(true)?;
            let loss = criterion.forward(&model.call(&data)?, &target)?;
            loss.backward()?;
            optimizer.step()?;
            total = total.add(&loss.detach())?;
        }
        // The epoch's loss over every rank's samples: each rank's mean, averaged.
        let mean = total.div(loader.len() as f64)?;
        group.all_reduce(&mean, ReduceOp::Avg)?;
        let mean = mean.item::<f64>()?;
        if rank == 0 {
            println!("epoch {epoch}: loss {mean:.4} (world size {world_size})");
        }
        report.epoch_losses.push(mean);
    }
    report.weights = weights(&model)?;
    Ok(report)
}

/// One process training `MyModel` from `initial` on `device` with the global batch: at each
/// step the union of the batches the `world_size` ranks' samplers give (32 each). Returns
/// the weights and each epoch's mean loss; DDP on `world_size` ranks must end with the same.
pub fn one_process(
    initial: &[Vec<f32>],
    world_size: usize,
    device: Device,
    epochs: u64,
) -> Result<(Vec<Vec<f32>>, Vec<f64>), Error> {
    let dataset = dataset()?;
    let model = MyModel::new()?;
    model.to(device)?;
    {
        let _g = no_grad();
        for (p, w) in model.parameters().iter().zip(initial) {
            p.copy_(&Tensor::from_vec(w.clone(), p.dims(), device)?)?;
        }
    }
    let mut optimizer = sgd(model.parameters())?;
    let criterion = CrossEntropyLoss::new();
    let mut losses = Vec::new();
    for epoch in 0..epochs {
        let shards = (0..world_size)
            .map(|r| {
                let s = DistributedSampler::with_replicas(dataset.as_ref(), world_size, r)?;
                s.set_epoch(epoch);
                s.indices(epoch)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let steps = shards[0].len().div_ceil(BATCH_SIZE);
        let mut total = 0.0;
        for step in 0..steps {
            let global: Vec<usize> = shards
                .iter()
                .flat_map(|s| s.chunks(BATCH_SIZE).nth(step).unwrap_or(&[]).to_vec())
                .collect();
            let batch = dataset.get_batch(&global)?;
            let (data, target) = (batch[0].to(device)?, batch[1].to(device)?);
            optimizer.zero_grad(true)?;
            let loss = criterion.forward(&model.call(&data)?, &target)?;
            loss.backward()?;
            optimizer.step()?;
            total += loss.item::<f64>()?;
        }
        losses.push(total / steps as f64);
    }
    Ok((weights(&model)?, losses))
}

/// The program each rank runs (started by `ember launch`, torchrun's role): prints its
/// [`RankReport`] as one JSON line after `DDP-REPORT `.
#[allow(dead_code)]
pub fn main() -> Result<(), Error> {
    let local_rank: usize = match std::env::var("LOCAL_RANK") {
        Ok(v) => v.trim().parse().map_err(|_| {
            ember::nn::NnError::invalid("walk-through", format!("LOCAL_RANK={v:?}"))
        })?,
        Err(_) => {
            return Err(ember::nn::NnError::invalid(
                "walk-through",
                "LOCAL_RANK is not set: start the ranks with `ember launch --nproc-per-node 2 -- PROGRAM`",
            )
            .into());
        }
    };
    let device = if cuda::is_available() { Device::Cuda(local_rank) } else { Device::Cpu };
    // Initialize distributed process group: backend='nccl' where NCCL can join the ranks'
    // devices, else `mpi` (see the header).
    let nccl = device.is_cuda() && cuda::driver().and_then(|d| d.nccl_version()).is_ok();
    let backend = if nccl { Backend::Nccl } else { Backend::Mpi };
    let mut opts = InitOptions::new(backend, InitMethod::Env);
    if let Device::Cuda(d) = device {
        opts = opts.with_device(d);
    }
    let group = ember::parallel::init_process_group_with(opts)?;
    let report = run(&group, device, 3)?;
    if report.epoch_losses.last() >= report.epoch_losses.first() {
        let losses = format!("training did not lower the loss: {:?}", report.epoch_losses);
        return Err(ember::nn::NnError::invalid("walk-through", losses).into());
    }
    let json = serde_json::to_string(&report)
        .map_err(|e| ember::nn::NnError::invalid("walk-through", e.to_string()))?;
    println!("DDP-REPORT {json}");
    ember::parallel::destroy_process_group()
}
