//! Views (new layouts over the same storage) and the ops that assemble tensors from parts
//! (`cat`, `stack`, `chunk`, `split`).

use std::ops::{Bound, RangeBounds};

use crate::dtype::{Operand, result_type};
use crate::error::{Result, TensorError};
use crate::layout::{infer_size, norm_dim};
use crate::raw::{RawTensor, same_device};
use crate::shape::{Dim, Shape};

/// A shape argument that may contain one `-1` (to be inferred), as `reshape`/`view` take:
/// arrays, slices or `Vec`s of integers, or a [`Shape`].
pub trait ShapeSpec {
    /// The sizes, `-1` for "infer".
    fn spec(&self) -> Vec<isize>;
}

impl<D: Dim, const N: usize> ShapeSpec for [D; N] {
    fn spec(&self) -> Vec<isize> {
        self.iter().map(|d| d.as_isize()).collect()
    }
}
impl<D: Dim> ShapeSpec for &[D] {
    fn spec(&self) -> Vec<isize> {
        self.iter().map(|d| d.as_isize()).collect()
    }
}
impl<D: Dim> ShapeSpec for Vec<D> {
    fn spec(&self) -> Vec<isize> {
        self.iter().map(|d| d.as_isize()).collect()
    }
}
impl<D: Dim, const N: usize> ShapeSpec for &[D; N] {
    fn spec(&self) -> Vec<isize> {
        self.iter().map(|d| d.as_isize()).collect()
    }
}
impl ShapeSpec for Shape {
    fn spec(&self) -> Vec<isize> {
        self.dims().iter().map(|&d| d.as_isize()).collect()
    }
}
impl ShapeSpec for &Shape {
    fn spec(&self) -> Vec<isize> {
        self.dims().iter().map(|&d| d.as_isize()).collect()
    }
}

impl RawTensor {
    fn dim_index(&self, dim: impl Dim, op: &'static str) -> Result<usize> {
        norm_dim(dim.as_isize(), self.rank(), op)
    }

    /// A view with another shape: shares storage when the strides allow (PyTorch's
    /// `computeStride`), otherwise an error — use [`Tensor::reshape`] then.
    pub fn view(&self, shape: impl ShapeSpec) -> Result<RawTensor> {
        let shape = infer_size("view", &shape.spec(), self.numel())?;
        let strides = self
            .layout()
            .view_strides(&shape)
            .ok_or(TensorError::ViewStrides)?;
        Ok(self.view_with(crate::layout::Layout::new(
            shape,
            strides,
            self.storage_offset(),
        )))
    }

    /// Another shape with the same elements: a view when possible, else a copy.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let t = Tensor::arange(0, 6, ())?.reshape([2, -1])?;
    /// assert_eq!(t.dims(), &[2, 3]);
    /// let u = t.t()?.reshape([6])?; // not viewable: copies
    /// assert_eq!(u.to_vec::<i64>()?, vec![0, 3, 1, 4, 2, 5]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn reshape(&self, shape: impl ShapeSpec) -> Result<RawTensor> {
        let shape = infer_size("reshape", &shape.spec(), self.numel())?;
        match self.layout().view_strides(&shape) {
            Some(strides) => Ok(self.view_with(crate::layout::Layout::new(
                shape,
                strides,
                self.storage_offset(),
            ))),
            None => self.copy()?.view(&shape),
        }
    }

    /// Dims reordered: output dim `i` is input dim `dims[i]`.
    pub fn permute<D: Dim>(&self, dims: impl AsRef<[D]>) -> Result<RawTensor> {
        let rank = self.rank();
        let perm = dims
            .as_ref()
            .iter()
            .map(|d| d.index(rank, "permute"))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.view_with(self.layout().permute(&perm)?))
    }

    /// Two dims swapped.
    pub fn transpose(&self, dim0: impl Dim, dim1: impl Dim) -> Result<RawTensor> {
        let a = self.dim_index(dim0, "transpose")?;
        let b = self.dim_index(dim1, "transpose")?;
        Ok(self.view_with(self.layout().transpose(a, b)))
    }

    /// PyTorch's `t()`: transpose of a matrix; vectors and scalars unchanged.
    pub fn t(&self) -> Result<RawTensor> {
        match self.rank() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            r => Err(TensorError::invalid(
                "t",
                format!("t() expects a tensor with <= 2 dimensions, but self is {r}D"),
            )),
        }
    }

    /// `len` elements of `dim` from `start`.
    pub fn narrow(&self, dim: impl Dim, start: usize, len: usize) -> Result<RawTensor> {
        let d = self.dim_index(dim, "narrow")?;
        if self.rank() == 0 {
            return Err(TensorError::invalid(
                "narrow",
                "narrow() cannot be applied to a 0-dim tensor",
            ));
        }
        Ok(self.view_with(self.layout().narrow(d, start, len)?))
    }

    /// Python's `t[..., start:end:step, ...]` on `dim` with a Rust range: `..`, `2..`,
    /// `..-1`, `-3..`; bounds may be negative (from the end) and are clamped; `step` must be
    /// positive. For a literal range that ends below its start, like Python's `1:-1`, use
    /// [`Tensor::slice_with`] (clippy rejects `1..-1` as an empty range).
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let t = Tensor::arange(0, 10, ())?;
    /// assert_eq!(t.slice(0, ..3, 1)?.to_vec::<i64>()?, vec![0, 1, 2]);
    /// assert_eq!(t.slice(0, -3.., 2)?.to_vec::<i64>()?, vec![7, 9]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn slice(
        &self,
        dim: impl Dim,
        range: impl RangeBounds<isize>,
        step: usize,
    ) -> Result<RawTensor> {
        let start = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => Some(s.saturating_add(1)),
            Bound::Unbounded => None,
        };
        let end = match range.end_bound() {
            Bound::Included(&-1) => None,
            Bound::Included(&e) => Some(e.saturating_add(1)),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => None,
        };
        self.slice_with(dim, start, end, step)
    }

    /// Python's `t[..., start:end:step, ...]` on `dim` with optional bounds, as Python
    /// writes them: `slice_with(0, Some(1), Some(-1), 3)` is `t[1:-1:3]`.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let t = Tensor::arange(0, 10, ())?;
    /// assert_eq!(t.slice_with(0, Some(1), Some(-1), 3)?.to_vec::<i64>()?, vec![1, 4, 7]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn slice_with(
        &self,
        dim: impl Dim,
        start: Option<isize>,
        end: Option<isize>,
        step: usize,
    ) -> Result<RawTensor> {
        if self.rank() == 0 {
            return Err(TensorError::invalid(
                "slice",
                "slice() cannot be applied to a 0-dim tensor",
            ));
        }
        let d = self.dim_index(dim, "slice")?;
        Ok(self.view_with(self.layout().slice(d, start, end, step)?))
    }

    /// The slice at `index` of `dim`, with that dim removed (negative index from the end).
    pub fn select(&self, dim: impl Dim, index: isize) -> Result<RawTensor> {
        if self.rank() == 0 {
            return Err(TensorError::invalid(
                "select",
                "select() cannot be applied to a 0-dim tensor",
            ));
        }
        let d = self.dim_index(dim, "select")?;
        Ok(self.view_with(self.layout().select(d, index)?))
    }

    /// All size-1 dims removed.
    pub fn squeeze(&self) -> Result<RawTensor> {
        let all: Vec<usize> = (0..self.rank()).collect();
        Ok(self.view_with(self.layout().squeeze(&all)))
    }

    /// `dim` removed if its size is 1 (unchanged otherwise, as PyTorch).
    pub fn squeeze_dim(&self, dim: impl Dim) -> Result<RawTensor> {
        let d = self.dim_index(dim, "squeeze")?;
        Ok(self.view_with(self.layout().squeeze(&[d])))
    }

    /// A size-1 dim inserted at `dim` (in `[-rank-1, rank]`).
    pub fn unsqueeze(&self, dim: impl Dim) -> Result<RawTensor> {
        Ok(self.view_with(self.layout().unsqueeze(dim.as_isize())?))
    }

    /// PyTorch's `expand`: size-1 dims repeated (stride 0, no copy); `-1` keeps a size;
    /// new leading dims may be added.
    pub fn expand(&self, sizes: impl ShapeSpec) -> Result<RawTensor> {
        let spec = sizes.spec();
        let rank = self.rank();
        if spec.len() < rank {
            return Err(TensorError::invalid(
                "expand",
                format!(
                    "the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({rank})",
                    spec.len()
                ),
            ));
        }
        let extra = spec.len() - rank;
        let mut target = Vec::with_capacity(spec.len());
        for (i, &s) in spec.iter().enumerate() {
            if s == -1 {
                if i < extra {
                    return Err(TensorError::invalid(
                        "expand",
                        format!(
                            "the expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension {i}"
                        ),
                    ));
                }
                target.push(self.dims()[i - extra]);
            } else if s < 0 {
                return Err(TensorError::invalid("expand", format!("invalid size {s}")));
            } else {
                target.push(s as usize);
            }
        }
        self.broadcast_to(target)
    }

    /// This tensor broadcast to `shape` (a view with stride-0 dims).
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<RawTensor> {
        let shape = shape.into();
        if shape == *self.shape() {
            return Ok(self.clone());
        }
        shape.checked_numel("broadcast_to")?;
        Ok(self.view_with(self.layout().broadcast_as("expand", &shape)?))
    }

    /// Dims `start..=end` merged into one (a view when possible).
    pub fn flatten(&self, start: impl Dim, end: impl Dim) -> Result<RawTensor> {
        if self.rank() == 0 {
            return self.reshape([1usize]);
        }
        let s = self.dim_index(start, "flatten")?;
        let e = self.dim_index(end, "flatten")?;
        if s > e {
            return Err(TensorError::invalid(
                "flatten",
                "flatten() has invalid args: start_dim cannot come after end_dim",
            ));
        }
        let dims = self.dims();
        let mut new: Vec<usize> = dims[..s].to_vec();
        new.push(dims[s..=e].iter().product());
        new.extend_from_slice(&dims[e + 1..]);
        self.reshape(new)
    }

    /// All dims merged into one.
    pub fn flatten_all(&self) -> Result<RawTensor> {
        self.flatten(0, -1)
    }

    /// Pieces of at most `size` along `dim` (the last may be smaller).
    pub fn split(&self, size: usize, dim: impl Dim) -> Result<Vec<RawTensor>> {
        let d = self.dim_index(dim, "split")?;
        let n = self.size(d)?;
        if size == 0 {
            if n == 0 {
                return Ok(vec![self.clone()]);
            }
            return Err(TensorError::invalid(
                "split",
                "split_size can only be 0 if dimension size is 0",
            ));
        }
        (0..n.div_ceil(size).max(1))
            .map(|i| self.narrow(d, (i * size).min(n), size.min(n - (i * size).min(n))))
            .collect()
    }

    /// Pieces of the given sizes along `dim`; the sizes must add up to the dim's size.
    pub fn split_sizes(&self, sizes: &[usize], dim: impl Dim) -> Result<Vec<RawTensor>> {
        let d = self.dim_index(dim, "split_with_sizes")?;
        let n = self.size(d)?;
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(n) {
            return Err(TensorError::invalid(
                "split_with_sizes",
                format!("split_sizes {sizes:?} must sum to the size of dimension {d} ({n})"),
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let t = self.narrow(d, start, s);
                start += s;
                t
            })
            .collect()
    }

    /// `chunks` pieces along `dim` as `torch.chunk`: each of `ceil(size / chunks)`, so
    /// fewer pieces may come back.
    pub fn chunk(&self, chunks: usize, dim: impl Dim) -> Result<Vec<RawTensor>> {
        if chunks == 0 {
            return Err(TensorError::invalid(
                "chunk",
                "chunk expects `chunks` to be greater than 0",
            ));
        }
        let d = self.dim_index(dim, "chunk")?;
        let n = self.size(d)?;
        self.split(n.div_ceil(chunks), d)
    }

    /// Tensors joined along an existing `dim`; shapes must match elsewhere. Dtypes are
    /// promoted as PyTorch does; 1-D empty tensors are skipped (legacy PyTorch rule).
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let a = Tensor::zeros([2, 1], ())?;
    /// let b = Tensor::ones([2, 2], ())?;
    /// assert_eq!(Tensor::cat(&[&a, &b], 1)?.to_string(), "tensor([[0., 1., 1.],\n        [0., 1., 1.]])");
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn cat(tensors: &[&RawTensor], dim: impl Dim) -> Result<RawTensor> {
        let Some(&first) = tensors.first() else {
            return Err(TensorError::invalid(
                "cat",
                "expected a non-empty list of tensors",
            ));
        };
        let device = same_device(tensors)?;
        let parts: Vec<&RawTensor> = tensors
            .iter()
            .copied()
            .filter(|t| !(t.rank() == 1 && t.numel() == 0))
            .collect();
        let dtype = result_type(
            &tensors
                .iter()
                .map(|t| Operand::Tensor(t.dtype(), t.rank().max(1)))
                .collect::<Vec<_>>(),
        );
        let Some(&reference) = parts.first() else {
            return RawTensor::zeros([0usize], (device, dtype));
        };
        if reference.rank() == 0 {
            return Err(TensorError::invalid(
                "cat",
                "zero-dimensional tensor cannot be concatenated",
            ));
        }
        let d = norm_dim(dim.as_isize(), reference.rank(), "cat")?;
        let mut out_dims = reference.dims().to_vec();
        out_dims[d] = 0;
        for (i, t) in parts.iter().enumerate() {
            let ok = t.rank() == reference.rank()
                && t.dims()
                    .iter()
                    .zip(reference.dims())
                    .enumerate()
                    .all(|(k, (a, b))| k == d || a == b);
            if !ok {
                return Err(TensorError::ShapeMismatch {
                    op: "cat",
                    msg: format!(
                        "sizes of tensors must match except in dimension {d}: expected {} but got {} for tensor number {i} in the list",
                        reference.shape(),
                        t.shape()
                    ),
                });
            }
            out_dims[d] += t.dims()[d];
        }
        let _ = first;
        let out = RawTensor::zeros(out_dims, (device, dtype))?;
        let mut start = 0;
        for t in parts {
            let n = t.dims()[d];
            out.narrow(d, start, n)?.copy_(t)?;
            start += n;
        }
        Ok(out)
    }
}
