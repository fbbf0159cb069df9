//! [`Sampler`]: which samples an epoch visits, in which order (PyTorch's
//! `torch.utils.data.Sampler`), for a [`DataLoader`](super::DataLoader) built with
//! [`DataLoader::sampler`](super::DataLoader::sampler).

use std::fmt;

use crate::error::Result;

/// The sample indices of an epoch, as PyTorch's `torch.utils.data.Sampler`: a
/// [`DataLoader`](super::DataLoader) given one (`DataLoader::sampler`) batches the indices
/// it yields, in its order, instead of `0..len` or a shuffle of it.
///
/// `ember-parallel`'s `DistributedSampler` is one: each rank's shard of the dataset.
///
/// ```
/// use std::sync::Arc;
/// use ember_nn::Tensor;
/// use ember_nn::data::{DataLoader, Sampler, TensorDataset};
/// use ember_tensor::Device;
///
/// /// Every other sample, from the last.
/// #[derive(Debug)]
/// struct EveryOther(usize);
/// impl Sampler for EveryOther {
///     fn indices(&self, _epoch: u64) -> ember_nn::Result<Vec<usize>> {
///         Ok((0..self.0).rev().step_by(2).collect())
///     }
///     fn len(&self) -> usize {
///         self.0.div_ceil(2)
///     }
/// }
///
/// let x = Tensor::from_vec((0..5).map(|i| i as f32).collect(), [5], &Device::Cpu)?;
/// let loader = DataLoader::new(Arc::new(TensorDataset::new(vec![x])?))
///     .sampler(Arc::new(EveryOther(5)))
///     .batch_size(2);
/// assert_eq!(loader.len(), 2);
/// assert_eq!(loader.batch_indices(0)?, vec![vec![4, 2], vec![0]]);
/// # Ok::<(), ember_nn::Error>(())
/// ```
pub trait Sampler: Send + Sync + fmt::Debug {
    /// The indices of epoch `epoch` (the loader's epoch counter, see
    /// [`DataLoader::iter`](super::DataLoader::iter)), in the order they are visited. A
    /// sampler may ignore `epoch` and keep its own, as `DistributedSampler` does (it follows
    /// its `set_epoch`, as PyTorch's).
    fn indices(&self, epoch: u64) -> Result<Vec<usize>>;

    /// How many indices an epoch yields.
    fn len(&self) -> usize;

    /// Whether an epoch yields no index.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
