//! Indexing ops: `index_select`, `gather`, `scatter_add`, `masked_fill`, `embedding`,
//! `one_hot`. Gradients flow back through `scatter_add` (and `gather` for its source).

use crate::{Dim, RawTensor as Raw, Scalar};

use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, maybe_record};
use crate::autograd::mode::autocast_inputs;
use crate::ops::bw1;
use crate::tensor::Tensor;

impl Tensor {
    /// The entries of `indices` (1-D, integer) along `dim`.
    pub fn index_select(&self, dim: impl Dim, indices: &Tensor) -> Result<Tensor> {
        let x = self.raw();
        let d = dim.index(x.rank(), "index_select")?;
        let idx = indices.raw();
        let y = x.index_select(d, &idx)?;
        let shape = x.shape().clone();
        maybe_record("IndexSelectBackward0", y, &[self], || {
            Ok(bw1(move |g| {
                if shape.rank() == 0 {
                    return Ok(g.sum_all()?.reshape(&shape)?);
                }
                // The index along `d`, broadcast over the other dims of `g`.
                let mut view = vec![1usize; g.rank()];
                view[d] = idx.numel();
                let full = idx.reshape(&view[..])?.expand(g.dims())?;
                let z = Raw::zeros(shape.clone(), (g.device(), g.dtype()))?;
                Ok(z.scatter_add(d, &full, g)?)
            }))
        })
    }

    /// Values at `index` along `dim` (`out[i][j] = self[index[i][j]][j]` for dim 0).
    pub fn gather(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor> {
        let x = self.raw();
        let d = dim.index(x.rank(), "gather")?;
        let idx = index.raw();
        let y = x.gather(d, &idx)?;
        let shape = x.shape().clone();
        maybe_record("GatherBackward0", y, &[self], || {
            Ok(bw1(move |g| {
                let z = Raw::zeros(shape.clone(), (g.device(), g.dtype()))?;
                Ok(z.scatter_add(d, &idx, g)?)
            }))
        })
    }

    /// A copy of `self` with `src` added at `index` along `dim`.
    pub fn scatter_add(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::scatter_add, [self, src])? {
            return c[0].scatter_add(dim, index, &c[1]);
        }
        let x = self.raw();
        let d = dim.index(x.rank(), "scatter_add")?;
        let idx = index.raw();
        let y = x.scatter_add(d, &idx, &src.raw())?;
        let (need_self, need_src) = (self.requires_grad(), src.requires_grad());
        let src_shape = src.raw().shape().clone();
        maybe_record("ScatterAddBackward0", y, &[self, src], || {
            Ok(Box::new(move |g: &Raw| {
                let gs = if need_src {
                    // Only the part of `g` the index covers comes back to `src`.
                    let covered = g.gather(d, &idx)?;
                    Some(if covered.dims() == src_shape.dims() {
                        covered
                    } else {
                        covered.reshape(&src_shape)?
                    })
                } else {
                    None
                };
                Ok(vec![need_self.then(|| g.clone()), gs])
            }) as BackwardFn)
        })
    }

    /// `value` where `mask` (bool, broadcast) is true; no gradient flows there.
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let m = mask.raw();
        let y = self.raw().masked_fill(&m, value)?;
        maybe_record("MaskedFillBackward0", y, &[self], || {
            Ok(bw1(move |g| Ok(g.masked_fill(&m, 0)?)))
        })
    }

    /// Rows of this `[num, dim]` weight at `indices` (any shape): `indices.shape + [dim]`.
    /// The gradient sums into the rows looked up (`scatter_add`).
    pub fn embedding(&self, indices: &Tensor) -> Result<Tensor> {
        let w = self.raw();
        let idx = indices.raw();
        let y = w.embedding(&idx)?;
        let shape = w.shape().clone();
        maybe_record("EmbeddingBackward0", y, &[self], || {
            Ok(bw1(move |g| {
                let dim = shape.dims().get(1).copied().unwrap_or(0);
                let n = idx.numel();
                let rows = g.reshape([n, dim])?;
                let full = idx.reshape([n, 1])?.expand([n, dim])?;
                let z = Raw::zeros(shape.clone(), (g.device(), g.dtype()))?;
                Ok(z.scatter_add(0, &full, &rows)?)
            }))
        })
    }

    /// `torch.nn.functional.one_hot` (i64, not differentiable).
    pub fn one_hot(&self, num_classes: Option<usize>) -> Result<Tensor> {
        Ok(Tensor::wrap(self.raw().one_hot(num_classes)?))
    }
}
