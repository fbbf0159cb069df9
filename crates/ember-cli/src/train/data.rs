//! The data of a run: the shipped digits, split by the seed, a training loader (a
//! `DistributedSampler` shard per rank when distributed) and the validation set on the
//! device; or, for the GPT, the shipped text, split by the seed, random windows per step and
//! fixed validation windows (Note [Text data] in `text`).

use std::sync::Arc;

use ember_autograd::Tensor;
use ember_device::Device;
use ember_nn::Error;
use ember_nn::data::{DataLoader, Dataset, TensorDataset, digits};
use ember_parallel::DistributedSampler;
use ember_tensor::DType;

use super::text::{Rng, TextSplit, Vocab, Windows, load_text};
use super::{ModelSpec, TrainConfig};

/// The shipped text as tokens, with its vocabulary.
pub(super) struct Corpus {
    pub(super) vocab: Vocab,
    pub(super) tokens: Vec<i64>,
}

impl Corpus {
    /// The embedded text and its character vocabulary.
    pub(super) fn load() -> Result<Corpus, Error> {
        let text = load_text()?;
        let vocab = Vocab::from_text(&text);
        let tokens = vocab.encode(&text).map_err(super::setup::invalid)?;
        Ok(Corpus { vocab, tokens })
    }
}

/// Where a run's training batches come from.
enum Source {
    /// The digits' loader, and the sampler of a distributed run (its epoch is set before
    /// each epoch).
    Loader {
        loader: DataLoader,
        sampler: Option<Arc<DistributedSampler>>,
    },
    /// Random text windows: `batch` per step (this rank's share), `steps` per epoch, drawn
    /// from a generator seeded by `(seed, epoch, rank)`.
    Text {
        windows: Windows,
        batch: usize,
        steps: usize,
        seed: u64,
        rank: usize,
    },
}

/// The batches and tensors a run reads.
pub(super) struct Data {
    source: Source,
    /// Validation batches `(inputs, targets)` on the device.
    pub(super) val: Vec<(Tensor, Tensor)>,
    /// Training samples (digits), or characters of the training text.
    pub(super) train_samples: usize,
    /// Validation samples (digits), or characters of the held-out text.
    pub(super) val_samples: usize,
}

/// An epoch's training batches `[inputs, targets]`.
pub(super) type Batches<'a> = Box<dyn Iterator<Item = Result<Vec<Tensor>, Error>> + 'a>;

/// Validation windows per batch.
const VAL_BATCH: usize = 64;

impl Data {
    /// The data of `spec`, split by `seed`. `rank` is `(world, rank)` of a distributed run.
    pub(super) fn load(
        cfg: &TrainConfig,
        (spec, corpus): (&ModelSpec, Option<&Corpus>),
        seed: u64,
        device: Device,
        rank: Option<(usize, usize)>,
    ) -> Result<Data, Error> {
        match (spec, corpus) {
            (ModelSpec::Gpt(g), Some(c)) => Data::text(cfg, (g.block_size, c), seed, device, rank),
            _ => Data::digits(cfg, spec, seed, device, rank),
        }
    }

    /// The digits, pixels scaled to [0, 1] and shaped for the model.
    fn digits(
        cfg: &TrainConfig,
        spec: &ModelSpec,
        seed: u64,
        device: Device,
        rank: Option<(usize, usize)>,
    ) -> Result<Data, Error> {
        let (train_part, val_part) = digits::load()?.split(cfg.val_fraction, seed)?;
        let shape = |x: Tensor| -> Result<Tensor, Error> {
            let x = x.div(16.0)?;
            Ok(match spec {
                ModelSpec::Cnn { .. } => x.reshape([x.dims()[0], 1, 8, 8])?,
                _ => x,
            })
        };
        let (train_samples, val_samples) = (train_part.len(), val_part.len());
        let train_set: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![
            shape(train_part.images)?,
            train_part.labels,
        ])?);
        let val = vec![(
            shape(val_part.images)?.to(device)?,
            val_part.labels.to(device)?,
        )];
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
            source: Source::Loader { loader, sampler },
            val,
            train_samples,
            val_samples,
        })
    }

    /// The text, split by `seed`, in windows of `block` characters (Note [Text data]).
    fn text(
        cfg: &TrainConfig,
        (block, corpus): (usize, &Corpus),
        seed: u64,
        device: Device,
        rank: Option<(usize, usize)>,
    ) -> Result<Data, Error> {
        let split = TextSplit::new(&corpus.tokens, cfg.val_fraction, seed);
        let windows = Windows::new(&split.train, block)?;
        let mut val = Vec::new();
        for chunk in split.val_windows(block).chunks(VAL_BATCH) {
            let (x, y): (Vec<i64>, Vec<i64>) = chunk
                .iter()
                .flat_map(|(x, y)| x.iter().copied().zip(y.iter().copied()))
                .unzip();
            let shape = [chunk.len(), block];
            val.push((
                Tensor::from_vec(x, shape, DType::I64)?.to(device)?,
                Tensor::from_vec(y, shape, DType::I64)?.to(device)?,
            ));
        }
        let (world, rank) = rank.unwrap_or((1, 0));
        Ok(Data {
            source: Source::Text {
                windows,
                batch: cfg.batch_size / world,
                steps: cfg
                    .steps_per_epoch
                    .unwrap_or(super::DEFAULT_STEPS_PER_EPOCH),
                seed,
                rank,
            },
            val,
            train_samples: split.train_len(),
            val_samples: split.val_len(),
        })
    }

    /// Optimizer steps in an epoch.
    pub(super) fn batches_per_epoch(&self) -> usize {
        match &self.source {
            Source::Loader { loader, .. } => loader.len(),
            Source::Text { steps, .. } => *steps,
        }
    }

    /// The training batches `[inputs, targets]` of epoch `epoch` (0-based), on the CPU.
    pub(super) fn epoch(&self, epoch: usize) -> Result<Batches<'_>, Error> {
        match &self.source {
            Source::Loader { loader, sampler } => {
                if let Some(s) = sampler {
                    s.set_epoch(epoch as u64);
                }
                Ok(Box::new(loader.epoch(epoch as u64)?))
            }
            Source::Text {
                windows,
                batch,
                steps,
                seed,
                rank,
            } => {
                let mut rng = Rng::new(*seed, &[epoch as u64, *rank as u64]);
                let (batch, block) = (*batch, windows.block());
                Ok(Box::new((0..*steps).map(move |_| {
                    let (x, y) = windows.draw(&mut rng, batch);
                    Ok(vec![
                        Tensor::from_vec(x, [batch, block], DType::I64)?,
                        Tensor::from_vec(y, [batch, block], DType::I64)?,
                    ])
                })))
            }
        }
    }
}
