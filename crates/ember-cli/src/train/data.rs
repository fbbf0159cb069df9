//! The data of a run: the shipped digits, split by the seed, a training loader (a
//! `DistributedSampler` shard per rank when distributed) and the validation set on the
//! device.

use std::sync::Arc;

use ember_autograd::Tensor;
use ember_device::Device;
use ember_nn::Error;
use ember_nn::data::{DataLoader, Dataset, TensorDataset, digits};
use ember_parallel::DistributedSampler;

use super::{ModelKind, TrainConfig};

/// The loaders and tensors a run reads.
pub(super) struct Data {
    pub(super) loader: DataLoader,
    /// The sampler of a distributed run (its epoch is set before each epoch).
    pub(super) sampler: Option<Arc<DistributedSampler>>,
    pub(super) val_x: Tensor,
    pub(super) val_y: Tensor,
    pub(super) train_samples: usize,
    pub(super) val_samples: usize,
}

impl Data {
    /// The digits, pixels scaled to [0, 1] and shaped for `cfg.model`, split by `seed`.
    /// `rank` is `(world, rank)` of a distributed run.
    pub(super) fn load(
        cfg: &TrainConfig,
        seed: u64,
        device: Device,
        rank: Option<(usize, usize)>,
    ) -> Result<Data, Error> {
        let (train_part, val_part) = digits::load()?.split(cfg.val_fraction, seed)?;
        let shape = |x: Tensor| -> Result<Tensor, Error> {
            let x = x.div(16.0)?;
            Ok(match cfg.model {
                ModelKind::Mlp => x,
                ModelKind::Cnn => x.reshape([x.dims()[0], 1, 8, 8])?,
            })
        };
        let (train_samples, val_samples) = (train_part.len(), val_part.len());
        let train_set: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![
            shape(train_part.images)?,
            train_part.labels,
        ])?);
        let (val_x, val_y) = (
            shape(val_part.images)?.to(device)?,
            val_part.labels.to(device)?,
        );
        // Alone: the loader shuffles. Distributed: each rank takes its shard of every
        // epoch's order (the ranks' orders differ from the single-process order) with a
        // per-rank batch.
        let world = rank.map_or(1, |(w, _)| w);
        let sampler = match rank {
            Some((world, rank)) => Some(Arc::new(
                DistributedSampler::with_replicas(train_set.as_ref(), world, rank)?.seed(seed),
            )),
            None => None,
        };
        let loader = DataLoader::new(train_set)
            .batch_size(cfg.batch_size / world)
            .seed(seed)
            .num_workers(cfg.num_workers)
            .pin_memory(device.is_cuda());
        let loader = match &sampler {
            Some(s) => loader.sampler(s.clone()),
            None => loader.shuffle(true),
        };
        Ok(Data {
            loader,
            sampler,
            val_x,
            val_y,
            train_samples,
            val_samples,
        })
    }
}
