//! [`Subset`], [`ConcatDataset`] and [`random_split`] (`torch.utils.data`'s).

use std::sync::Arc;

use ember_tensor::random::{Generator, default_generator};
use ember_tensor::{DType, Device, Tensor as Raw};

use super::dataset::{Dataset, IntoDataset, check_index, default_collate};
use super::loader::shuffled_indices;
use crate::Tensor;
use crate::error::{NnError, Result};

/// PyTorch's `Subset`: the samples of `dataset` at `indices`, in that order (sample `i` is
/// `dataset.get(indices[i])`). [`random_split`] makes them.
#[derive(Clone)]
pub struct Subset {
    dataset: Arc<dyn Dataset>,
    indices: Vec<usize>,
}

impl std::fmt::Debug for Subset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subset")
            .field("dataset_len", &self.dataset.len())
            .field("indices", &self.indices.len())
            .finish()
    }
}

impl Subset {
    /// The samples of `dataset` at `indices`. An index out of the dataset's range is an
    /// error naming it.
    pub fn new(dataset: Arc<dyn Dataset>, indices: Vec<usize>) -> Result<Subset> {
        let n = dataset.len();
        if let Some(&i) = indices.iter().find(|&&i| i >= n) {
            return Err(NnError::invalid(
                "Subset",
                format!("index {i} is out of range for a dataset of length {n}"),
            )
            .into());
        }
        Ok(Subset { dataset, indices })
    }

    /// The indices into the underlying dataset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The underlying dataset.
    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }
}

impl Dataset for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        check_index(index, self.indices.len())?;
        self.dataset.get(self.indices[index])
    }

    /// The underlying dataset's batch at the mapped indices (one gather for a
    /// `TensorDataset`).
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let mut mapped = Vec::with_capacity(indices.len());
        for &i in indices {
            check_index(i, self.indices.len())?;
            mapped.push(self.indices[i]);
        }
        self.dataset.get_batch(&mapped)
    }
}

/// PyTorch's `ConcatDataset`: the samples of several datasets, one after the other.
#[derive(Clone)]
pub struct ConcatDataset {
    datasets: Vec<Arc<dyn Dataset>>,
    /// `ends[k]`: the samples of datasets `0..=k`.
    ends: Vec<usize>,
}

impl std::fmt::Debug for ConcatDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcatDataset")
            .field("cumulative_sizes", &self.ends)
            .finish()
    }
}

impl ConcatDataset {
    /// The datasets, concatenated. No dataset is an error, as PyTorch's "datasets should
    /// not be an empty iterable".
    pub fn new(datasets: Vec<Arc<dyn Dataset>>) -> Result<ConcatDataset> {
        if datasets.is_empty() {
            return Err(NnError::invalid(
                "ConcatDataset",
                "datasets should not be an empty iterable",
            )
            .into());
        }
        let ends = datasets
            .iter()
            .scan(0, |sum, d| {
                *sum += d.len();
                Some(*sum)
            })
            .collect();
        Ok(ConcatDataset { datasets, ends })
    }

    /// PyTorch's `cumulative_sizes`: the samples of the first `k + 1` datasets.
    pub fn cumulative_sizes(&self) -> &[usize] {
        &self.ends
    }

    /// Which dataset sample `index` is in, and its index there.
    fn locate(&self, index: usize) -> Result<(usize, usize)> {
        check_index(index, self.len())?;
        let k = self.ends.partition_point(|&end| end <= index);
        let start = if k == 0 { 0 } else { self.ends[k - 1] };
        Ok((k, index - start))
    }
}

impl Dataset for ConcatDataset {
    fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        let (k, i) = self.locate(index)?;
        self.datasets[k].get(i)
    }

    /// One batch of the dataset the indices all fall in; sample by sample across datasets.
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let located = indices
            .iter()
            .map(|&i| self.locate(i))
            .collect::<Result<Vec<_>>>()?;
        match located.first() {
            Some(&(k, _)) if located.iter().all(|&(j, _)| j == k) => {
                let inner: Vec<usize> = located.iter().map(|&(_, i)| i).collect();
                self.datasets[k].get_batch(&inner)
            }
            _ => default_collate(
                located
                    .iter()
                    .map(|&(k, i)| self.datasets[k].get(i))
                    .collect::<Result<_>>()?,
            ),
        }
    }
}

/// The lengths of [`random_split`]: sample counts summing to the dataset's length
/// (`[1437, 360]`), or fractions summing to 1 (`[0.8, 0.2]`), as PyTorch's. An array gives
/// an array of subsets (`let [train, val] = random_split(ds, [0.8, 0.2])?;`), a slice or a
/// `Vec` gives a `Vec`.
pub trait SplitLengths {
    /// What the split returns: `[Subset; N]` for an array, `Vec<Subset>` otherwise.
    type Subsets;

    /// The sample counts for a dataset of `n` samples.
    fn counts(&self, n: usize) -> Result<Vec<usize>>;

    /// The subsets, one per length, in order.
    fn collect(subsets: Vec<Subset>) -> Result<Self::Subsets>;
}

fn split_err(msg: impl Into<String>) -> crate::Error {
    NnError::invalid("random_split", msg).into()
}

/// Sample counts as given: they must sum to `n`.
fn exact_counts(lengths: &[usize], n: usize) -> Result<Vec<usize>> {
    let sum: usize = lengths.iter().sum();
    if sum != n {
        return Err(split_err(format!(
            "Sum of input lengths does not equal the length of the input dataset! (lengths {lengths:?} sum to {sum}, the dataset has {n} samples)"
        )));
    }
    Ok(lengths.to_vec())
}

/// PyTorch's rule for fractions: `floor(n * fraction)` each, the remainder handed out one
/// by one from the first split on.
fn fraction_counts(fractions: &[f64], n: usize) -> Result<Vec<usize>> {
    let sum: f64 = fractions.iter().sum();
    if (sum - 1.0).abs() > 1e-9 {
        return Err(split_err(format!(
            "fractions {fractions:?} sum to {sum}, expected 1 (or give sample counts that sum to the dataset's length, {n})"
        )));
    }
    let mut counts = Vec::with_capacity(fractions.len());
    for (i, &f) in fractions.iter().enumerate() {
        if !(0.0..=1.0).contains(&f) {
            return Err(split_err(format!(
                "Fraction at index {i} is not between 0 and 1 (it is {f})"
            )));
        }
        counts.push((n as f64 * f).floor() as usize);
    }
    let remainder = n.saturating_sub(counts.iter().sum());
    let k = counts.len();
    for i in 0..remainder {
        counts[i % k] += 1;
    }
    Ok(counts)
}

macro_rules! split_lengths {
    ($t:ty, $counts:ident) => {
        impl<const N: usize> SplitLengths for [$t; N] {
            type Subsets = [Subset; N];
            fn counts(&self, n: usize) -> Result<Vec<usize>> {
                $counts(self, n)
            }
            fn collect(subsets: Vec<Subset>) -> Result<[Subset; N]> {
                let got = subsets.len();
                subsets
                    .try_into()
                    .map_err(|_| split_err(format!("internal: {got} subsets for {N} lengths")))
            }
        }

        impl SplitLengths for &[$t] {
            type Subsets = Vec<Subset>;
            fn counts(&self, n: usize) -> Result<Vec<usize>> {
                $counts(self, n)
            }
            fn collect(subsets: Vec<Subset>) -> Result<Vec<Subset>> {
                Ok(subsets)
            }
        }

        impl SplitLengths for Vec<$t> {
            type Subsets = Vec<Subset>;
            fn counts(&self, n: usize) -> Result<Vec<usize>> {
                $counts(self, n)
            }
            fn collect(subsets: Vec<Subset>) -> Result<Vec<Subset>> {
                Ok(subsets)
            }
        }
    };
}
split_lengths!(usize, exact_counts);
split_lengths!(f64, fraction_counts);

/// PyTorch's `random_split(dataset, lengths)`: non-overlapping [`Subset`]s of the given
/// lengths (counts, or fractions of the dataset), covering it, in a random order drawn from
/// the CPU's default generator, so `ember::manual_seed(s)` fixes the split (and a split
/// moves the generator on, as PyTorch's).
///
/// ```
/// use ember_nn::data::{Dataset, TensorDataset, random_split};
/// use ember_nn::Tensor;
/// let x = Tensor::arange(0, 10, ember_tensor::DType::F32)?;
/// let [train, val] = random_split(TensorDataset::new(vec![x])?, [0.8, 0.2])?;
/// assert_eq!((train.len(), val.len()), (8, 2));
/// let mut all: Vec<usize> = train.indices().iter().chain(val.indices()).copied().collect();
/// all.sort();
/// assert_eq!(all, (0..10).collect::<Vec<_>>());
/// # Ok::<(), ember_nn::Error>(())
/// ```
pub fn random_split<L: SplitLengths>(dataset: impl IntoDataset, lengths: L) -> Result<L::Subsets> {
    random_split_with(dataset, lengths, &default_generator(Device::Cpu))
}

/// [`random_split`] drawing from `generator` (PyTorch's `generator=`).
pub fn random_split_with<L: SplitLengths>(
    dataset: impl IntoDataset,
    lengths: L,
    generator: &Generator,
) -> Result<L::Subsets> {
    let dataset = dataset.into_dataset();
    let n = dataset.len();
    let counts = lengths.counts(n)?;
    let seed = Raw::randint_with(0, i64::MAX, [1], DType::I64, generator)?.to_vec::<i64>()?[0];
    let order = shuffled_indices(n, seed.unsigned_abs(), 0);
    let mut out = Vec::with_capacity(counts.len());
    let mut start = 0;
    for c in counts {
        out.push(Subset {
            dataset: Arc::clone(&dataset),
            indices: order[start..start + c].to_vec(),
        });
        start += c;
    }
    L::collect(out)
}
