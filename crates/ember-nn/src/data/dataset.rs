//! [`Dataset`], [`TensorDataset`] and [`default_collate`].

use std::sync::Arc;

use ember_tensor::Device;

use crate::Tensor;
use crate::error::{NnError, Result};

/// PyTorch's map-style `Dataset`: `len()` samples, sample `i` being `get(i)`, a list of fields
/// (e.g. `[x, y]`). Shared between the loader's worker threads, hence `Send + Sync`.
///
/// [`Dataset::get_batch`] makes a whole batch; its default calls `get` for each index and
/// stacks each field ([`default_collate`]). Datasets that can gather a batch at once
/// ([`TensorDataset`]) override it.
pub trait Dataset: Send + Sync {
    /// The number of samples.
    fn len(&self) -> usize;

    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `index`, as its fields. An index `>= len()` is an error naming the index and
    /// the length ([`check_index`]).
    fn get(&self, index: usize) -> Result<Vec<Tensor>>;

    /// The samples at `indices`, collated: field `k` of the result stacks field `k` of every
    /// sample along a new first dimension. The default calls [`Dataset::get`] per index and
    /// [`default_collate`].
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let samples = indices
            .iter()
            .map(|&i| self.get(i))
            .collect::<Result<Vec<_>>>()?;
        default_collate(samples)
    }
}

/// What takes a dataset ([`DataLoader::new`](super::DataLoader::new),
/// [`random_split`](super::random_split)): a dataset by value (`DataLoader::new(ds)`, as
/// PyTorch's `DataLoader(ds)`), or one already shared (`Arc<TensorDataset>`,
/// `Arc<dyn Dataset>`).
pub trait IntoDataset {
    /// The dataset, shared.
    fn into_dataset(self) -> Arc<dyn Dataset>;
}

impl<D: Dataset + 'static> IntoDataset for D {
    fn into_dataset(self) -> Arc<dyn Dataset> {
        Arc::new(self)
    }
}

impl<D: Dataset + 'static> IntoDataset for Arc<D> {
    fn into_dataset(self) -> Arc<dyn Dataset> {
        self
    }
}

impl IntoDataset for Arc<dyn Dataset> {
    fn into_dataset(self) -> Arc<dyn Dataset> {
        self
    }
}

/// An error unless `index < len`: `"index {index} is out of range for a dataset of length
/// {len}"`.
pub fn check_index(index: usize, len: usize) -> Result<()> {
    if index < len {
        Ok(())
    } else {
        Err(NnError::invalid(
            "Dataset::get",
            format!("index {index} is out of range for a dataset of length {len}"),
        )
        .into())
    }
}

/// PyTorch's `default_collate` for samples that are lists of tensors: field `k` of the batch
/// is `Tensor::stack` of field `k` of every sample along dim 0. An empty batch, samples
/// with different numbers of fields, or fields whose shapes, dtypes or devices differ are
/// errors.
pub fn default_collate(samples: Vec<Vec<Tensor>>) -> Result<Vec<Tensor>> {
    let Some(first) = samples.first() else {
        return Err(NnError::invalid("default_collate", "cannot collate an empty batch").into());
    };
    let fields = first.len();
    if let Some((i, s)) = samples.iter().enumerate().find(|(_, s)| s.len() != fields) {
        return Err(NnError::invalid(
            "default_collate",
            format!(
                "each sample in a batch should have the same number of fields: sample 0 has {fields}, sample {i} has {}",
                s.len()
            ),
        ).into());
    }
    (0..fields)
        .map(|k| {
            let column: Vec<&Tensor> = samples.iter().map(|s| &s[k]).collect();
            Tensor::stack(&column, 0)
        })
        .collect()
}

/// PyTorch's `TensorDataset`: sample `i` is `[t[i] for t in tensors]`. All tensors share
/// their first dimension. A batch is one `index_select` along dim 0 per tensor (on the
/// tensor's own device).
#[derive(Clone, Debug)]
pub struct TensorDataset {
    tensors: Vec<Tensor>,
    len: usize,
}

impl TensorDataset {
    /// A dataset over `tensors`. An error if there are none, if one is 0-dimensional, or if
    /// their first dimensions differ (`"Size mismatch between tensors: ..."`, naming the
    /// sizes).
    pub fn new(tensors: Vec<Tensor>) -> Result<TensorDataset> {
        let Some(first) = tensors.first() else {
            return Err(NnError::invalid("TensorDataset::new", "needs at least one tensor").into());
        };
        if let Some((i, t)) = tensors.iter().enumerate().find(|(_, t)| t.rank() == 0) {
            return Err(NnError::invalid(
                "TensorDataset::new",
                format!(
                    "tensor {i} is 0-dimensional (shape {}); every tensor needs a first dimension to index",
                    t.shape()
                ),
            ).into());
        }
        let len = first.dims()[0];
        if tensors.iter().any(|t| t.dims()[0] != len) {
            let sizes: Vec<usize> = tensors.iter().map(|t| t.dims()[0]).collect();
            return Err(NnError::invalid(
                "TensorDataset::new",
                format!(
                    "Size mismatch between tensors: their first dimensions are {sizes:?}, but must all be equal"
                ),
            ).into());
        }
        Ok(TensorDataset { tensors, len })
    }

    /// The tensors, in the order given.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The tensors, giving up the dataset.
    pub fn into_tensors(self) -> Vec<Tensor> {
        self.tensors
    }
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.len
    }

    /// `[t.select(0, index) for t in tensors]` (views of the tensors).
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        check_index(index, self.len)?;
        let i = isize::try_from(index)
            .map_err(|_| NnError::invalid("Dataset::get", format!("index {index} too large")))?;
        self.tensors.iter().map(|t| t.select(0, i)).collect()
    }

    /// One `index_select(0, indices)` per tensor.
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let mut idx = Vec::with_capacity(indices.len());
        for &i in indices {
            check_index(i, self.len)?;
            idx.push(i64::try_from(i).map_err(|_| {
                NnError::invalid("Dataset::get_batch", format!("index {i} too large"))
            })?);
        }
        let mut on: Vec<(Device, Tensor)> = Vec::new();
        let mut out = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let device = t.device();
            let index = match on.iter().find(|(d, _)| *d == device) {
                Some((_, index)) => index.clone(),
                None => {
                    let index = Tensor::from_slice(&idx, [idx.len()], device)?;
                    on.push((device, index.clone()));
                    index
                }
            };
            out.push(t.index_select(0, &index)?);
        }
        Ok(out)
    }
}
