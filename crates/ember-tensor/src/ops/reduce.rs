//! Reductions, softmax and log-softmax. A reduced gradient is brought back over the
//! reduced dims by unsqueezing them (when `keepdim` dropped them) and expanding. `sum`,
//! `prod`, `logsumexp`, `norm`, `softmax` and `log_softmax` consult autocast (Note
//! [Autocast hook]).

use crate::{DType, Dim, RawTensor as Raw, ReduceDims};

use crate::autograd::error::Result;
use crate::autograd::graph::{Saved, maybe_record};
use crate::autograd::mode::autocast_inputs;
use crate::ops::bw1;
use crate::tensor::Tensor;

/// `g` (reduced over `dims`, kept or not) as a view broadcast to `shape`.
fn unreduce(g: &Raw, dims: &[usize], keepdim: bool, shape: &[usize]) -> Result<Raw> {
    let mut g = g.clone();
    if !keepdim {
        for &d in dims {
            g = g.unsqueeze(d)?;
        }
    }
    Ok(g.expand(shape)?)
}

/// Elements per output of a reduction over `dims` of `shape`.
fn count(shape: &[usize], dims: &[usize]) -> usize {
    dims.iter().map(|&d| shape[d]).product()
}

impl Tensor {
    /// The reduced dims, normalised (all for `()`; none for a scalar, whose one "dim" is
    /// not a dim).
    fn reduce_dims(&self, dims: &impl ReduceDims, op: &'static str) -> Result<Vec<usize>> {
        match dims.dims() {
            _ if self.rank() == 0 => {
                if let Some(d) = dims.dims() {
                    d.indices(0, op)?;
                }
                Ok(Vec::new())
            }
            None => Ok((0..self.rank()).collect()),
            Some(d) => Ok(d.indices(self.rank(), op)?),
        }
    }

    /// Sum over all elements; `sum(())`.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(())
    }

    /// Sum over `dims` (`()` for all; `(dims, true)` keeps them, see
    /// [`ReduceDims`]).
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let t = Tensor::from_vec(vec![1f32, 2., 3., 4.], [2, 2], ())?;
    /// assert_eq!(t.sum(())?.item::<f32>()?, 10.0);
    /// assert_eq!(t.sum(0)?.to_vec::<f32>()?, vec![4.0, 6.0]);
    /// assert_eq!(t.sum((1, true))?.dims(), vec![2, 1]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn sum(&self, dims: impl ReduceDims) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::sum, [self])? {
            return c[0].sum(dims);
        }
        let x = self.raw();
        let (keepdim, all) = (dims.keepdim(), dims.dims().is_none());
        let ds = self.reduce_dims(&dims, "sum")?;
        let y = x.sum(dims)?;
        let shape = x.dims().to_vec();
        let name = if all { "SumBackward0" } else { "SumBackward1" };
        maybe_record(name, y, &[self], || {
            Ok(bw1(move |g| unreduce(g, &ds, keepdim, &shape)))
        })
    }

    /// Mean over all elements; `mean(())`.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(())
    }

    /// Mean over `dims`.
    pub fn mean(&self, dims: impl ReduceDims) -> Result<Tensor> {
        let x = self.raw();
        let (keepdim, all) = (dims.keepdim(), dims.dims().is_none());
        let ds = self.reduce_dims(&dims, "mean")?;
        let y = x.mean(dims)?;
        let shape = x.dims().to_vec();
        let n = count(&shape, &ds) as f64;
        let name = if all {
            "MeanBackward0"
        } else {
            "MeanBackward1"
        };
        maybe_record(name, y, &[self], || {
            Ok(bw1(move |g| unreduce(&g.div(n)?, &ds, keepdim, &shape)))
        })
    }

    /// Product over all elements; `prod(())`.
    pub fn prod_all(&self) -> Result<Tensor> {
        self.prod(())
    }

    /// Product over `dims`. The gradient is exact with zeros among the factors.
    pub fn prod(&self, dims: impl ReduceDims) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::prod, [self])? {
            return c[0].prod(dims);
        }
        let keepdim = dims.keepdim();
        let ds = self.reduce_dims(&dims, "prod")?;
        let y = self.raw().prod(dims)?;
        self.prod_like(y, ds, keepdim)
    }

    fn prod_like(&self, y: Raw, ds: Vec<usize>, keepdim: bool) -> Result<Tensor> {
        let shape = self.raw().dims().to_vec();
        maybe_record("ProdBackward1", y, &[self], || {
            let sx = Saved::of("ProdBackward1", self)?;
            Ok(bw1(move |g| {
                let x = sx.get()?;
                let g = unreduce(g, &ds, keepdim, &shape)?;
                if ds.is_empty() {
                    return Ok(g);
                }
                let zero = x.eq(0.0)?;
                // Product of the non-zero factors, and how many zeros each output saw.
                let nonzero = crate::raw::binary::r#where(&zero, 1.0, &x)?.to_dtype(x.dtype())?;
                let pn = unreduce(&nonzero.prod((&ds[..], true))?, &ds, true, &shape)?;
                let zeros = zero.to_dtype(DType::I64)?.sum((&ds[..], true))?;
                let zeros = unreduce(&zeros, &ds, true, &shape)?;
                // No zero: p / x. One zero: at the zero the others' product, else 0.
                let none = pn.div(&x)?;
                let one = crate::raw::binary::r#where(&zero, &pn, 0.0)?;
                let some = crate::raw::binary::r#where(&zeros.eq(1)?, &one, 0.0)?;
                let d = crate::raw::binary::r#where(&zeros.eq(0)?, &none, &some)?;
                Ok(g.mul(&d)?)
            }))
        })
    }

    /// Largest element (the gradient is shared evenly among ties).
    pub fn max_all(&self) -> Result<Tensor> {
        self.extremum_all(true)
    }

    /// Smallest element.
    pub fn min_all(&self) -> Result<Tensor> {
        self.extremum_all(false)
    }

    fn extremum_all(&self, max: bool) -> Result<Tensor> {
        let x = self.raw();
        let y = if max { x.max_all()? } else { x.min_all()? };
        let name = if max { "MaxBackward1" } else { "MinBackward1" };
        maybe_record(name, y.clone(), &[self], || {
            let (sx, sy) = (Saved::of(name, self)?, Saved::new(name, &y));
            Ok(bw1(move |g| {
                let x = sx.get()?;
                let hit = x.eq(&sy.get()?)?.to_dtype(g.dtype())?;
                Ok(hit.mul(&g.div(&hit.sum_all()?)?)?)
            }))
        })
    }

    /// `amax` over `dims` (ties share the gradient evenly, as PyTorch).
    pub fn amax(&self, dims: impl ReduceDims) -> Result<Tensor> {
        self.amaxmin(dims, true)
    }

    /// `amin` over `dims`.
    pub fn amin(&self, dims: impl ReduceDims) -> Result<Tensor> {
        self.amaxmin(dims, false)
    }

    fn amaxmin(&self, dims: impl ReduceDims, max: bool) -> Result<Tensor> {
        let x = self.raw();
        let keepdim = dims.keepdim();
        let ds = self.reduce_dims(&dims, if max { "amax" } else { "amin" })?;
        let y = if max { x.amax(dims)? } else { x.amin(dims)? };
        let shape = x.dims().to_vec();
        let name = if max {
            "AmaxBackward0"
        } else {
            "AminBackward0"
        };
        maybe_record(name, y.clone(), &[self], || {
            let (sx, sy) = (Saved::of(name, self)?, Saved::new(name, &y));
            Ok(bw1(move |g| {
                let x = sx.get()?;
                let yk = unreduce(&sy.get()?, &ds, keepdim, &shape)?;
                let hit = x.eq(&yk)?.to_dtype(g.dtype())?;
                let n = unreduce(&hit.sum((&ds[..], true))?, &ds, true, &shape)?;
                let g = unreduce(g, &ds, keepdim, &shape)?;
                Ok(hit.mul(&g)?.div(&n)?)
            }))
        })
    }

    /// Max along one dim with the indices, as `torch.max(x, dim)`: `x.max_dim(1)`,
    /// `x.max_dim((1, true))` (the gradient goes to the index taken).
    pub fn max_dim(&self, dim: impl ReduceDims) -> Result<(Tensor, Tensor)> {
        self.extremum_dim(dim, true)
    }

    /// Min along one dim with the indices.
    pub fn min_dim(&self, dim: impl ReduceDims) -> Result<(Tensor, Tensor)> {
        self.extremum_dim(dim, false)
    }

    fn extremum_dim(&self, dim: impl ReduceDims, max: bool) -> Result<(Tensor, Tensor)> {
        let x = self.raw();
        let keepdim = dim.keepdim();
        let op = if max { "max" } else { "min" };
        let listed = dim.dims().map(|ds| ds.indices(x.rank(), op)).transpose()?;
        let (v, i) = if max {
            x.max_dim(dim)?
        } else {
            x.min_dim(dim)?
        };
        // The one dim (the core checked that exactly one was given).
        let d = listed.and_then(|ds| ds.first().copied()).unwrap_or(0);
        let name = if max { "MaxBackward0" } else { "MinBackward0" };
        let shape = x.shape().clone();
        let idx = i.clone();
        let scalar = x.rank() == 0;
        let values = maybe_record(name, v, &[self], || {
            Ok(bw1(move |g| {
                if scalar {
                    return Ok(g.clone());
                }
                let (g, idx) = if keepdim {
                    (g.clone(), idx.clone())
                } else {
                    (g.unsqueeze(d)?, idx.unsqueeze(d)?)
                };
                let z = Raw::zeros(shape.clone(), (g.device(), g.dtype()))?;
                Ok(z.scatter_add(d, &idx, &g)?)
            }))
        })?;
        Ok((values, Tensor::wrap(i)))
    }

    /// Index of the largest element along one dim (`()`: of the flattened tensor; not
    /// differentiable).
    pub fn argmax(&self, dim: impl ReduceDims) -> Result<Tensor> {
        Ok(Tensor::wrap(self.raw().argmax(dim)?))
    }

    /// Index of the smallest element along one dim (`()`: of the flattened tensor).
    pub fn argmin(&self, dim: impl ReduceDims) -> Result<Tensor> {
        Ok(Tensor::wrap(self.raw().argmin(dim)?))
    }

    /// Flat index of the largest element.
    pub fn argmax_all(&self) -> Result<Tensor> {
        Ok(Tensor::wrap(self.raw().argmax_all()?))
    }

    /// Flat index of the smallest element.
    pub fn argmin_all(&self) -> Result<Tensor> {
        Ok(Tensor::wrap(self.raw().argmin_all()?))
    }

    /// Variance over `dims` with Bessel's correction (PyTorch's default).
    pub fn var(&self, dims: impl ReduceDims) -> Result<Tensor> {
        self.var_correction(dims, 1.0)
    }

    /// Variance over `dims` with `correction` (1: unbiased, 0: the population variance).
    pub fn var_correction(&self, dims: impl ReduceDims, correction: f64) -> Result<Tensor> {
        let keepdim = dims.keepdim();
        let ds = self.reduce_dims(&dims, "var")?;
        let y = self.raw().var_correction(dims, correction)?;
        self.var_like("VarBackward0", y, ds, correction, keepdim, false)
    }

    /// Variance over all elements with `correction`.
    pub fn var_all(&self, correction: f64) -> Result<Tensor> {
        self.var_correction((), correction)
    }

    /// Standard deviation over `dims` with Bessel's correction.
    pub fn std(&self, dims: impl ReduceDims) -> Result<Tensor> {
        self.std_correction(dims, 1.0)
    }

    /// Standard deviation over `dims` with `correction`.
    pub fn std_correction(&self, dims: impl ReduceDims, correction: f64) -> Result<Tensor> {
        let keepdim = dims.keepdim();
        let ds = self.reduce_dims(&dims, "std")?;
        let y = self.raw().std_correction(dims, correction)?;
        self.var_like("StdBackward0", y, ds, correction, keepdim, true)
    }

    /// Standard deviation over all elements with `correction`.
    pub fn std_all(&self, correction: f64) -> Result<Tensor> {
        self.std_correction((), correction)
    }

    /// `dvar/dx = 2 (x - mean) / (N - correction)`; `dstd = dvar / (2 std)`.
    fn var_like(
        &self,
        name: &'static str,
        y: Raw,
        ds: Vec<usize>,
        correction: f64,
        keepdim: bool,
        std: bool,
    ) -> Result<Tensor> {
        let shape = self.raw().dims().to_vec();
        let n = count(&shape, &ds) as f64;
        maybe_record(name, y.clone(), &[self], || {
            let (sx, sy) = (Saved::of(name, self)?, Saved::new(name, &y));
            Ok(bw1(move |g| {
                let x = sx.get()?;
                let centered = if ds.is_empty() {
                    x.sub(&x)?
                } else {
                    x.sub(&x.mean((&ds[..], true))?)?
                };
                let g = unreduce(g, &ds, keepdim, &shape)?;
                let mut d = centered.mul(2.0 / (n - correction))?;
                if std {
                    let s = unreduce(&sy.get()?, &ds, keepdim, &shape)?;
                    d = d.div(&s.mul(2.0)?)?;
                }
                Ok(g.mul(&d)?)
            }))
        })
    }

    /// `log Σ exp` over `dims`.
    pub fn logsumexp(&self, dims: impl ReduceDims) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::logsumexp, [self])? {
            return c[0].logsumexp(dims);
        }
        let x = self.raw();
        let keepdim = dims.keepdim();
        let ds = self.reduce_dims(&dims, "logsumexp")?;
        let y = x.logsumexp(dims)?;
        let shape = x.dims().to_vec();
        maybe_record("LogsumexpBackward0", y.clone(), &[self], || {
            let (sx, sy) = (
                Saved::of("LogsumexpBackward0", self)?,
                Saved::new("LogsumexpBackward0", &y),
            );
            Ok(bw1(move |g| {
                let yk = unreduce(&sy.get()?, &ds, keepdim, &shape)?;
                let p = sx.get()?.sub(&yk)?.exp()?;
                Ok(unreduce(g, &ds, keepdim, &shape)?.mul(&p)?)
            }))
        })
    }

    /// p-norm over `dims` (p > 0; at a zero norm the gradient is 0, as PyTorch).
    pub fn norm(&self, p: f64, dims: impl ReduceDims) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::norm, [self])? {
            return c[0].norm(p, dims);
        }
        let x = self.raw();
        let keepdim = dims.keepdim();
        let ds = self.reduce_dims(&dims, "norm")?;
        let y = x.norm(p, dims)?;
        self.norm_like(y, p, ds, keepdim)
    }

    /// p-norm of all elements; `norm(p, ())`.
    pub fn norm_all(&self, p: f64) -> Result<Tensor> {
        self.norm(p, ())
    }

    fn norm_like(&self, y: Raw, p: f64, ds: Vec<usize>, keepdim: bool) -> Result<Tensor> {
        let shape = self.raw().dims().to_vec();
        maybe_record("NormBackward1", y.clone(), &[self], || {
            let (sx, sy) = (
                Saved::of("NormBackward1", self)?,
                Saved::new("NormBackward1", &y),
            );
            Ok(bw1(move |g| {
                let x = sx.get()?;
                let yk = unreduce(&sy.get()?, &ds, keepdim, &shape)?;
                let g = unreduce(g, &ds, keepdim, &shape)?;
                // d‖x‖p/dx = x·|x|^(p-2) / ‖x‖^(p-1)
                let d = if p == 1.0 {
                    x.sign()?
                } else if p == 2.0 {
                    x.div(&yk)?
                } else {
                    x.mul(&x.abs()?.pow(p - 2.0)?)?.div(&yk.pow(p - 1.0)?)?
                };
                let d = crate::raw::binary::r#where(&yk.eq(0.0)?, 0.0, &d)?;
                Ok(g.mul(&d)?)
            }))
        })
    }

    /// Softmax along `dim`.
    pub fn softmax(&self, dim: impl Dim) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::softmax, [self])? {
            return c[0].softmax(dim);
        }
        let x = self.raw();
        let d = dim.index(x.rank(), "softmax")?;
        let y = x.softmax(d)?;
        maybe_record("SoftmaxBackward0", y.clone(), &[self], || {
            let sy = Saved::new("SoftmaxBackward0", &y);
            Ok(bw1(move |g| {
                let y = sy.get()?;
                let gy = g.mul(&y)?;
                Ok(gy.sub(&y.mul(&gy.sum((d, true))?)?)?)
            }))
        })
    }

    /// Log-softmax along `dim`.
    pub fn log_softmax(&self, dim: impl Dim) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(&crate::op_table::log_softmax, [self])? {
            return c[0].log_softmax(dim);
        }
        let x = self.raw();
        let d = dim.index(x.rank(), "log_softmax")?;
        let y = x.log_softmax(d)?;
        maybe_record("LogSoftmaxBackward0", y.clone(), &[self], || {
            let sy = Saved::new("LogSoftmaxBackward0", &y);
            Ok(bw1(move |g| {
                let p = sy.get()?.exp()?;
                Ok(g.sub(&p.mul(&g.sum((d, true))?)?)?)
            }))
        })
    }
}
