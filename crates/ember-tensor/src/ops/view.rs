//! Views and assembly: reshape, permute, narrow, slice, select, squeeze, expand, cat,
//! stack, split. Gradients of views are views of the gradient or a zero tensor with the
//! gradient written into the viewed part.

use std::ops::RangeBounds;

use crate::{Dim, RawTensor as Raw, Shape, ShapeSpec};

use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, Saved, maybe_record, needs_grad, record};
use crate::autograd::mode::autocast_inputs;
use crate::autograd::rebase::{Replay, ViewInfo};
use crate::ops::bw1;
use crate::tensor::Tensor;

/// A gradient for the whole of `shape`, zero except `g` written where `view` selects.
fn scatter_into(
    shape: &Shape,
    g: &Raw,
    view: impl Fn(&Raw) -> std::result::Result<Raw, crate::TensorError>,
) -> Result<Raw> {
    let z = Raw::zeros(shape.clone(), (g.device(), g.dtype()))?;
    view(&z)?.copy_(g)?;
    Ok(z)
}

/// A [`Replay`] from a view op on raw tensors.
fn replay(
    f: impl Fn(&Raw) -> std::result::Result<Raw, crate::TensorError> + Send + Sync + 'static,
) -> Replay {
    std::sync::Arc::new(f)
}

impl Tensor {
    /// Records a view op. When `y` shares this tensor's storage the output is a view: it
    /// learns its base and `replay`, which redoes the op on any tensor of this one's shape
    /// (Note [View rebase]), so in-place writes through it rebase the base's history. A
    /// view without a replay (`expand`) first checks in backward that the storage was not
    /// written in place since.
    fn record_view(
        &self,
        name: &'static str,
        y: Raw,
        replay: Option<Replay>,
        backward: impl FnMut(&Raw) -> Result<Raw> + Send + 'static,
    ) -> Result<Tensor> {
        let shares = y.shares_storage(&self.raw());
        let info = shares.then(|| ViewInfo::of(self, &y, replay.clone()));
        let t = if !needs_grad(&[self]) {
            Tensor::wrap(y)
        } else if shares && replay.is_none() {
            let mut backward = backward;
            let witness = Saved::new(name, &y);
            record(
                name,
                y,
                &[self],
                bw1(move |g| {
                    witness.get()?;
                    backward(g)
                }),
            )
        } else {
            record(name, y, &[self], bw1(backward))
        };
        if let Some(info) = info {
            t.set_view(info);
        }
        Ok(t)
    }

    /// Records a view-like op whose gradient is `g` reshaped back to this tensor's shape.
    fn reshaped(&self, name: &'static str, y: Raw) -> Result<Tensor> {
        let shape = self.raw().shape().clone();
        let to = y.shape().clone();
        let replay = replay(move |t| t.view(&to));
        self.record_view(name, y, Some(replay), move |g| Ok(g.reshape(&shape)?))
    }

    /// A view with another shape (one `-1` inferred); errors where strides don't allow.
    pub fn view(&self, shape: impl ShapeSpec) -> Result<Tensor> {
        let y = self.raw().view(shape)?;
        self.reshaped("ViewBackward0", y)
    }

    /// `view` when possible, else a copy.
    pub fn reshape(&self, shape: impl ShapeSpec) -> Result<Tensor> {
        let y = self.raw().reshape(shape)?;
        self.reshaped("ReshapeAliasBackward0", y)
    }

    /// Flattens dims `start..=end`.
    pub fn flatten(&self, start: impl Dim, end: impl Dim) -> Result<Tensor> {
        let y = self.raw().flatten(start, end)?;
        self.reshaped("ViewBackward0", y)
    }

    /// Flattens to one dim.
    pub fn flatten_all(&self) -> Result<Tensor> {
        let y = self.raw().flatten_all()?;
        self.reshaped("ViewBackward0", y)
    }

    /// Removes all size-1 dims.
    pub fn squeeze(&self) -> Result<Tensor> {
        let y = self.raw().squeeze()?;
        self.reshaped("SqueezeBackward0", y)
    }

    /// Removes `dim` if it has size 1.
    pub fn squeeze_dim(&self, dim: impl Dim) -> Result<Tensor> {
        let y = self.raw().squeeze_dim(dim)?;
        self.reshaped("SqueezeBackward1", y)
    }

    /// Inserts a size-1 dim at `dim`.
    pub fn unsqueeze(&self, dim: impl Dim) -> Result<Tensor> {
        let y = self.raw().unsqueeze(dim)?;
        self.reshaped("UnsqueezeBackward0", y)
    }

    /// A contiguous tensor with the same values (itself if already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        let x = self.raw();
        if x.is_contiguous() {
            return Ok(self.clone());
        }
        let y = x.contiguous()?;
        maybe_record("CloneBackward0", y, &[self], || Ok(bw1(|g| Ok(g.clone()))))
    }

    /// Reorders the dims.
    pub fn permute<D: Dim>(&self, dims: impl AsRef<[D]>) -> Result<Tensor> {
        let x = self.raw();
        let y = x.permute(dims.as_ref())?;
        let rank = x.rank();
        let perm: Vec<usize> = dims
            .as_ref()
            .iter()
            .map(|d| d.index(rank, "permute"))
            .collect::<crate::error::Result<_>>()?;
        let mut inv = vec![0usize; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        let r = replay(move |t| t.permute(&perm));
        self.record_view(
            "PermuteBackward0",
            y,
            Some(r),
            move |g| Ok(g.permute(&inv)?),
        )
    }

    /// Swaps two dims.
    pub fn transpose(&self, dim0: impl Dim, dim1: impl Dim) -> Result<Tensor> {
        let x = self.raw();
        let (a, b) = (
            dim0.index(x.rank(), "transpose")?,
            dim1.index(x.rank(), "transpose")?,
        );
        let y = x.transpose(a, b)?;
        let r = replay(move |t| t.transpose(a, b));
        self.record_view("TransposeBackward0", y, Some(r), move |g| {
            Ok(g.transpose(a, b)?)
        })
    }

    /// Transpose of a matrix (≤ 2 dims).
    pub fn t(&self) -> Result<Tensor> {
        let y = self.raw().t()?;
        self.record_view("TBackward0", y, Some(replay(|t| t.t())), |g| Ok(g.t()?))
    }

    /// `len` elements of `dim` from `start`.
    pub fn narrow(&self, dim: impl Dim, start: usize, len: usize) -> Result<Tensor> {
        let x = self.raw();
        let d = dim.index(x.rank(), "narrow")?;
        let y = x.narrow(d, start, len)?;
        let shape = x.shape().clone();
        let r = replay(move |t| t.narrow(d, start, len));
        self.record_view("NarrowBackward0", y, Some(r), move |g| {
            scatter_into(&shape, g, |z| z.narrow(d, start, len))
        })
    }

    /// `dim` sliced by a range with a step (`x[a:b:step]`).
    pub fn slice(
        &self,
        dim: impl Dim,
        range: impl RangeBounds<isize> + Clone + Send + Sync + 'static,
        step: usize,
    ) -> Result<Tensor> {
        let x = self.raw();
        let d = dim.index(x.rank(), "slice")?;
        let y = x.slice(d, range.clone(), step)?;
        let shape = x.shape().clone();
        let r2 = range.clone();
        let r = replay(move |t| t.slice(d, r2.clone(), step));
        self.record_view("SliceBackward0", y, Some(r), move |g| {
            scatter_into(&shape, g, |z| z.slice(d, range.clone(), step))
        })
    }

    /// `dim` sliced from `start` to `end` (either may be `None`; negative counts from the
    /// end) with a step, as Python's `x[start:end:step]` clamps them.
    pub fn slice_with(
        &self,
        dim: impl Dim,
        start: Option<isize>,
        end: Option<isize>,
        step: usize,
    ) -> Result<Tensor> {
        let x = self.raw();
        let d = dim.index(x.rank(), "slice")?;
        let y = x.slice_with(d, start, end, step)?;
        let shape = x.shape().clone();
        let r = replay(move |t| t.slice_with(d, start, end, step));
        self.record_view("SliceBackward0", y, Some(r), move |g| {
            scatter_into(&shape, g, |z| z.slice_with(d, start, end, step))
        })
    }

    /// The sub-tensor at `index` of `dim` (that dim removed).
    pub fn select(&self, dim: impl Dim, index: isize) -> Result<Tensor> {
        let x = self.raw();
        let d = dim.index(x.rank(), "select")?;
        let y = x.select(d, index)?;
        let shape = x.shape().clone();
        let r = replay(move |t| t.select(d, index));
        self.record_view("SelectBackward0", y, Some(r), move |g| {
            scatter_into(&shape, g, |z| z.select(d, index))
        })
    }

    /// Broadcasts size-1 dims to `sizes` (`-1` keeps a dim); the gradient is summed back.
    pub fn expand(&self, sizes: impl ShapeSpec) -> Result<Tensor> {
        let x = self.raw();
        let y = x.expand(sizes)?;
        let shape = x.dims().to_vec();
        self.record_view("ExpandBackward0", y, None, move |g| {
            crate::autograd::engine::sum_to(g, &shape)
        })
    }

    /// Broadcasts to `shape`.
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let s: Shape = shape.into();
        self.expand(s)
    }

    /// Concatenates along `dim` (all same device and rank; promoted dtype).
    pub fn cat(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::cat, tensors.iter().copied())? {
            return Tensor::cat(&c.iter().collect::<Vec<_>>(), dim);
        }
        let raws: Vec<Raw> = tensors.iter().map(|t| t.raw()).collect();
        let refs: Vec<&Raw> = raws.iter().collect();
        let y = Raw::cat(&refs, dim)?;
        let d = dim.index(y.rank(), "cat")?;
        let sizes: Vec<usize> = raws
            .iter()
            .map(|r| {
                if r.rank() == 0 {
                    0
                } else {
                    r.dims().get(d).copied().unwrap_or(0)
                }
            })
            .collect();
        // PyTorch skips legacy empty [0] tensors in cat; they get no gradient.
        let skip: Vec<bool> = raws
            .iter()
            .map(|r| r.rank() == 1 && r.numel() == 0 && y.rank() > 1)
            .collect();
        maybe_record("CatBackward0", y, tensors, || {
            Ok(Box::new(move |g: &Raw| {
                let mut off = 0;
                let mut out = Vec::with_capacity(sizes.len());
                for (&n, &sk) in sizes.iter().zip(&skip) {
                    if sk {
                        out.push(None);
                        continue;
                    }
                    out.push(Some(g.narrow(d, off, n)?));
                    off += n;
                }
                Ok(out)
            }) as BackwardFn)
        })
    }

    /// Stacks along a new dim.
    pub fn stack(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::stack, tensors.iter().copied())? {
            return Tensor::stack(&c.iter().collect::<Vec<_>>(), dim);
        }
        let rank = tensors.first().map(|t| t.rank()).unwrap_or(0);
        let d = crate::Dim::as_isize(dim);
        let d = if d < 0 { d + rank as isize + 1 } else { d };
        let parts = tensors
            .iter()
            .map(|t| t.unsqueeze(d))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, d)
    }

    /// Splits into pieces of `size` along `dim` (the last may be smaller).
    pub fn split(&self, size: usize, dim: impl Dim) -> Result<Vec<Tensor>> {
        let x = self.raw();
        let d = dim.index(x.rank(), "split")?;
        let pieces = x.split(size, d)?;
        self.pieces(d, pieces)
    }

    /// Splits into pieces of the given sizes along `dim`.
    pub fn split_sizes(&self, sizes: &[usize], dim: impl Dim) -> Result<Vec<Tensor>> {
        let x = self.raw();
        let d = dim.index(x.rank(), "split")?;
        let pieces = x.split_sizes(sizes, d)?;
        self.pieces(d, pieces)
    }

    /// Splits into `chunks` near-equal pieces along `dim`.
    pub fn chunk(&self, chunks: usize, dim: impl Dim) -> Result<Vec<Tensor>> {
        let x = self.raw();
        let d = dim.index(x.rank(), "chunk")?;
        let pieces = x.chunk(chunks, d)?;
        self.pieces(d, pieces)
    }

    /// Each piece as a narrow of this tensor along `d`.
    fn pieces(&self, d: usize, pieces: Vec<Raw>) -> Result<Vec<Tensor>> {
        let mut off = 0;
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            let n = p.dims().get(d).copied().unwrap_or(0);
            let shape = self.raw().shape().clone();
            let start = off;
            let r = replay(move |t| t.narrow(d, start, n));
            out.push(self.record_view("SplitBackward0", p, Some(r), move |g| {
                scatter_into(&shape, g, |z| z.narrow(d, start, n))
            })?);
            off += n;
        }
        Ok(out)
    }
}
