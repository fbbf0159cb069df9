//! Datasets and the `DataLoader` (`torch.utils.data`).
//!
//! - [`Dataset`]: indexed samples, each a `Vec<Tensor>` of fields (e.g. `[x, y]`), with a
//!   batched [`Dataset::get_batch`] that defaults to [`default_collate`] (stack each field).
//! - [`TensorDataset`]: tensors sharing their first dimension; a batch is one `index_select`
//!   per tensor.
//! - [`DataLoader`]: batches, optional seeded shuffling (reproducible from the seed and the
//!   epoch, see [`shuffled_indices`]), `drop_last`, worker threads that prepare batches ahead
//!   and yield them in order (each with its own seeded generator and [`get_worker_info`]),
//!   pinned batches, a custom collate function, and a [`Sampler`] choosing each epoch's
//!   indices (PyTorch's `sampler=`; `ember-parallel`'s `DistributedSampler` is one).
//! - [`Subset`], [`ConcatDataset`], [`random_split`] (counts or fractions, drawn from the
//!   default generator): PyTorch's dataset utilities.
//! - [`digits`]: the 8x8 handwritten digits that scikit-learn distributes (1797 samples),
//!   embedded in the crate.
//!
//! ```
//! use std::sync::Arc;
//! use ember_nn::Tensor;
//! use ember_nn::data::{DataLoader, TensorDataset};
//! use ember_tensor::Device;
//!
//! let x = Tensor::from_vec((0..10).map(|i| i as f32).collect(), [10, 1], &Device::Cpu)?;
//! let y = Tensor::from_vec((0..10i64).collect(), [10], &Device::Cpu)?;
//! let loader = DataLoader::new(Arc::new(TensorDataset::new(vec![x, y])?))
//!     .batch_size(4)
//!     .shuffle(true)
//!     .seed(0);
//! assert_eq!(loader.len(), 3); // 4 + 4 + 2
//! let mut seen = 0;
//! for batch in loader.iter()? {
//!     let batch = batch?;
//!     seen += batch[1].numel();
//! }
//! assert_eq!(seen, 10);
//! # Ok::<(), ember_nn::Error>(())
//! ```

mod dataset;
pub mod digits;
mod loader;
mod sampler;
mod split;

pub use dataset::{Dataset, IntoDataset, TensorDataset, check_index, default_collate};
pub use loader::{
    CollateFn, DataLoader, DataLoaderIter, WorkerInfo, WorkerInitFn, get_worker_info,
    shuffled_indices, worker_base_seed,
};
pub use sampler::Sampler;
pub use split::{ConcatDataset, SplitLengths, Subset, random_split, random_split_with};
