//! [`DistributedSampler`]: each rank's shard of a dataset, as PyTorch's
//! `torch.utils.data.distributed.DistributedSampler`.

use std::sync::atomic::{AtomicU64, Ordering};

use ember_nn::data::{Dataset, Sampler, shuffled_indices};
use ember_nn::{Error, Result};

/// The shard of a dataset that one rank of `num_replicas` visits, as PyTorch's
/// `DistributedSampler`: give it to the rank's loader with
/// [`DataLoader::sampler`](ember_nn::data::DataLoader::sampler).
///
/// Each epoch every rank draws the same order (a shuffle determined by `seed` and the epoch
/// set with [`set_epoch`](DistributedSampler::set_epoch) — call it at the start of each
/// epoch, or every epoch visits the same order, as in PyTorch — or `0..len` without
/// `shuffle`), makes it a multiple of `num_replicas` long, and takes every
/// `num_replicas`-th index from position `rank`. So the shards are disjoint and together
/// cover the dataset:
///
/// - without `drop_last` (the default) the order is padded by repeating its first indices,
///   so each rank has `ceil(len / num_replicas)` samples and a few samples are seen twice;
/// - with `drop_last` the tail is dropped, so each rank has `floor(len / num_replicas)` and
///   a few samples are not seen that epoch.
///
/// ```
/// use std::sync::Arc;
/// use ember_nn::Tensor;
/// use ember_nn::data::{DataLoader, Sampler, TensorDataset};
/// use ember_parallel::DistributedSampler;
/// use ember_tensor::Device;
///
/// let x = Tensor::from_vec((0..10).map(|i| i as f32).collect(), [10], &Device::Cpu)?;
/// let dataset = Arc::new(TensorDataset::new(vec![x])?);
/// let shard = |rank| DistributedSampler::with_replicas(dataset.as_ref(), 3, rank);
/// let (s0, s1, s2) = (shard(0)?, shard(1)?, shard(2)?);
/// assert_eq!(s0.len(), 4); // ceil(10 / 3): two indices are repeated as padding
/// let mut all: Vec<usize> = [&s0, &s1, &s2].iter().flat_map(|s| s.indices(0).unwrap()).collect();
/// all.sort();
/// all.dedup();
/// assert_eq!(all, (0..10).collect::<Vec<_>>());
///
/// let sampler = Arc::new(shard(1)?);
/// let loader = DataLoader::new(dataset.clone()).sampler(sampler.clone()).batch_size(2);
/// sampler.set_epoch(1); // a new order for every rank
/// assert_eq!(loader.len(), 2);
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug)]
pub struct DistributedSampler {
    dataset_len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: AtomicU64,
}

impl DistributedSampler {
    /// The shard of rank `rank` of `num_replicas` over `dataset`, shuffled with seed 0,
    /// without `drop_last`. An error unless `rank < num_replicas`.
    pub fn with_replicas(
        dataset: &dyn Dataset,
        num_replicas: usize,
        rank: usize,
    ) -> Result<DistributedSampler> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(Error::invalid(
                "DistributedSampler",
                format!(
                    "invalid rank {rank}, rank should be in the interval [0, {}] for num_replicas={num_replicas}",
                    num_replicas.saturating_sub(1)
                ),
            ));
        }
        Ok(DistributedSampler {
            dataset_len: dataset.len(),
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: AtomicU64::new(0),
        })
    }

    /// Whether each epoch's order is a seeded shuffle (the default) or `0..len`.
    pub fn shuffle(mut self, shuffle: bool) -> DistributedSampler {
        self.shuffle = shuffle;
        self
    }

    /// The shuffling seed (0 by default); every rank must use the same.
    pub fn seed(mut self, seed: u64) -> DistributedSampler {
        self.seed = seed;
        self
    }

    /// Whether to drop the tail that does not divide evenly (`true`) or pad by repeating
    /// indices (`false`, the default).
    pub fn drop_last(mut self, drop_last: bool) -> DistributedSampler {
        self.drop_last = drop_last;
        self
    }

    /// The epoch whose order the next epoch uses (PyTorch's `set_epoch`): call it with the
    /// epoch number before each epoch so that each epoch is shuffled differently.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The number of ranks.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// This shard's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Every rank's sample count times the ranks: the length of the padded (or cut) order.
    fn total_size(&self) -> usize {
        self.len() * self.num_replicas
    }
}

impl Sampler for DistributedSampler {
    /// This rank's indices for the epoch of the last [`DistributedSampler::set_epoch`]
    /// (the loader's `epoch` is not used, as in PyTorch).
    fn indices(&self, _loader_epoch: u64) -> Result<Vec<usize>> {
        let n = self.dataset_len;
        let mut order: Vec<usize> = if self.shuffle {
            shuffled_indices(n, self.seed, self.epoch.load(Ordering::Relaxed))
        } else {
            (0..n).collect()
        };
        let total = self.total_size();
        if order.len() < total {
            if order.is_empty() {
                return Ok(Vec::new());
            }
            // Pad by repeating the order from its start (as often as needed).
            let head = order.clone();
            order.extend(head.iter().cycle().take(total - n));
        } else {
            order.truncate(total);
        }
        Ok(order
            .into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect())
    }

    fn len(&self) -> usize {
        let (n, r) = (self.dataset_len, self.num_replicas);
        if self.drop_last { n / r } else { n.div_ceil(r) }
    }
}
