//! Reductions over all or chosen dims, with `keepdim`: sum, mean, prod, max/min (with
//! indices), argmax/argmin, amax/amin, var/std with correction, logsumexp, norm, and the
//! row-wise softmax/log_softmax.
//!
//! `sum`/`prod` of integers and bools give i64, as PyTorch; `mean`, `var`, `std`, `norm`,
//! `softmax` need floating tensors (PyTorch's "could not infer output dtype" is an error
//! here too); f16/bf16 compute in f32 and round once at the end. Composite reductions are
//! built from the kernel reductions and elementwise ops, so every backend has them.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::op::ReduceOp;
use crate::raw::RawTensor;
use crate::shape::{Dim, Dims, ReduceDims};

impl RawTensor {
    /// The sorted reduced dims for `dims` (`None` = all).
    fn reduce_dims(&self, dims: Option<&dyn Dims>, op: &'static str) -> Result<Vec<usize>> {
        if self.rank() == 0 {
            // A scalar accepts dim 0 / -1 and reduces nothing.
            if let Some(d) = dims {
                d.indices(0, op)?;
            }
            return Ok(Vec::new());
        }
        match dims {
            None => Ok((0..self.rank()).collect()),
            Some(d) => d.indices(self.rank(), op),
        }
    }

    fn reduce_op(&self, op: ReduceOp, dims: &[usize], keepdim: bool) -> Result<RawTensor> {
        let _op = crate::profile::op1(op.name(), self);
        let s = self.with_storage(|s, l| s.reduce(op, l, dims))?;
        let shape: Vec<usize> = self
            .dims()
            .iter()
            .enumerate()
            .filter_map(|(i, &d)| match (dims.contains(&i), keepdim) {
                (false, _) => Some(d),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        Ok(RawTensor::from_storage(s, shape))
    }

    fn reduce_n(&self, dims: &[usize]) -> usize {
        dims.iter().map(|&d| self.dims()[d]).product()
    }

    fn float_input(&self, op: &'static str) -> Result<RawTensor> {
        match self.dtype() {
            DType::F16 | DType::Bf16 => self.to_dtype(DType::F32),
            d if d.is_float() => Ok(self.clone()),
            d => Err(TensorError::UnsupportedDType {
                op,
                dtype: d,
                hint: "could not infer output dtype; input dtype must be floating point",
            }),
        }
    }

    /// Sum of all elements (a 0-dim tensor; i64 for integer and bool inputs); `sum(())`.
    pub fn sum_all(&self) -> Result<RawTensor> {
        self.sum(())
    }

    /// Sum over `dims` (`()` for all; see [`ReduceDims`] for `keepdim`).
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let t = Tensor::arange(0, 6, ())?.reshape([2, 3])?;
    /// assert_eq!(t.sum(1)?.to_vec::<i64>()?, vec![3, 12]);
    /// assert_eq!(t.sum(([0, 1], true))?.dims(), &[1, 1]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn sum(&self, dims: impl ReduceDims) -> Result<RawTensor> {
        let d = self.reduce_dims(dims.dims(), "sum")?;
        self.reduce_op(ReduceOp::Sum, &d, dims.keepdim())
    }

    /// Product over `dims`.
    pub fn prod(&self, dims: impl ReduceDims) -> Result<RawTensor> {
        let d = self.reduce_dims(dims.dims(), "prod")?;
        self.reduce_op(ReduceOp::Prod, &d, dims.keepdim())
    }

    /// Mean over `dims` (floating tensors only).
    pub fn mean(&self, dims: impl ReduceDims) -> Result<RawTensor> {
        let d = self.reduce_dims(dims.dims(), "mean")?;
        self.mean_impl(&d, dims.keepdim())
    }

    fn mean_impl(&self, dims: &[usize], keepdim: bool) -> Result<RawTensor> {
        let _op = crate::profile::op1("mean", self);
        let x = self.float_input("mean")?;
        let n = self.reduce_n(dims);
        x.reduce_op(ReduceOp::Sum, dims, keepdim)?
            .div(n as f64)?
            .to_dtype(self.dtype())
    }

    /// Largest element (NaN if any element is NaN); an error for an empty tensor.
    pub fn max_all(&self) -> Result<RawTensor> {
        let d = self.reduce_dims(None, "max")?;
        self.reduce_op(ReduceOp::Max, &d, false)
    }

    /// Smallest element (NaN if any element is NaN); an error for an empty tensor.
    pub fn min_all(&self) -> Result<RawTensor> {
        let d = self.reduce_dims(None, "min")?;
        self.reduce_op(ReduceOp::Min, &d, false)
    }

    /// The one dim a `dim=`-only reduction (`max(dim)`, `argmax(dim)`) takes: `None` for
    /// all (where `all` is allowed), an error naming the op for a list of several.
    fn single_dim(
        &self,
        dims: &impl ReduceDims,
        all_allowed: bool,
        op: &'static str,
    ) -> Result<Vec<usize>> {
        let Some(given) = dims.dims() else {
            if all_allowed {
                return self.reduce_dims(None, op);
            }
            return Err(TensorError::invalid(
                op,
                "expected a dim (use max_all()/min_all() for all elements)",
            ));
        };
        let d = self.reduce_dims(Some(given), op)?;
        let listed = given.indices(self.rank(), op)?.len();
        if listed != 1 {
            return Err(TensorError::invalid(
                op,
                format!("expected a single dim, found {listed}"),
            ));
        }
        Ok(d)
    }

    /// Maxima along one dim and their indices (first occurrence), as `torch.max(x, dim)`:
    /// `x.max_dim(1)`, `x.max_dim((1, true))`.
    pub fn max_dim(&self, dim: impl ReduceDims) -> Result<(RawTensor, RawTensor)> {
        let d = self.single_dim(&dim, false, "max")?;
        Ok((
            self.reduce_op(ReduceOp::Max, &d, dim.keepdim())?,
            self.reduce_op(ReduceOp::ArgMax, &d, dim.keepdim())?,
        ))
    }

    /// Minima along one dim and their indices.
    pub fn min_dim(&self, dim: impl ReduceDims) -> Result<(RawTensor, RawTensor)> {
        let d = self.single_dim(&dim, false, "min")?;
        Ok((
            self.reduce_op(ReduceOp::Min, &d, dim.keepdim())?,
            self.reduce_op(ReduceOp::ArgMin, &d, dim.keepdim())?,
        ))
    }

    /// Maximum over several dims (no indices), `torch.amax`.
    pub fn amax(&self, dims: impl ReduceDims) -> Result<RawTensor> {
        let d = self.reduce_dims(dims.dims(), "amax")?;
        self.reduce_op(ReduceOp::Max, &d, dims.keepdim())
    }

    /// Minimum over several dims, `torch.amin`.
    pub fn amin(&self, dims: impl ReduceDims) -> Result<RawTensor> {
        let d = self.reduce_dims(dims.dims(), "amin")?;
        self.reduce_op(ReduceOp::Min, &d, dims.keepdim())
    }

    /// Index of the largest element of the flattened tensor; `argmax(())`.
    pub fn argmax_all(&self) -> Result<RawTensor> {
        self.argmax(())
    }

    /// Indices of the maxima along one dim (`()`: of the flattened tensor).
    pub fn argmax(&self, dim: impl ReduceDims) -> Result<RawTensor> {
        let d = self.single_dim(&dim, true, "argmax")?;
        self.reduce_op(ReduceOp::ArgMax, &d, dim.keepdim())
    }

    /// Index of the smallest element of the flattened tensor; `argmin(())`.
    pub fn argmin_all(&self) -> Result<RawTensor> {
        self.argmin(())
    }

    /// Indices of the minima along one dim (`()`: of the flattened tensor).
    pub fn argmin(&self, dim: impl ReduceDims) -> Result<RawTensor> {
        let d = self.single_dim(&dim, true, "argmin")?;
        self.reduce_op(ReduceOp::ArgMin, &d, dim.keepdim())
    }

    fn var_impl(
        &self,
        dims: &[usize],
        correction: f64,
        keepdim: bool,
        op: &'static str,
    ) -> Result<RawTensor> {
        let _op = crate::profile::op1("var", self);
        let x = self.float_input(op)?;
        let n = self.reduce_n(dims) as f64;
        let mean = x.reduce_op(ReduceOp::Sum, dims, true)?.div(n)?;
        let d = x.sub(&mean)?;
        d.mul(&d)?
            .reduce_op(ReduceOp::Sum, dims, keepdim)?
            .div((n - correction).max(0.0))
    }

    /// Variance over `dims` with `correction` (1 = Bessel's; 0 = the population variance).
    /// `n - correction <= 0` gives inf or NaN, as PyTorch.
    pub fn var_correction(&self, dims: impl ReduceDims, correction: f64) -> Result<RawTensor> {
        let d = self.reduce_dims(dims.dims(), "var")?;
        self.var_impl(&d, correction, dims.keepdim(), "var")?
            .to_dtype(self.dtype())
    }

    /// Standard deviation over `dims` with `correction`.
    pub fn std_correction(&self, dims: impl ReduceDims, correction: f64) -> Result<RawTensor> {
        let d = self.reduce_dims(dims.dims(), "std")?;
        self.var_impl(&d, correction, dims.keepdim(), "std")?
            .sqrt()?
            .to_dtype(self.dtype())
    }

    /// `log(sum(exp(x)))` over `dims`, computed stably (max subtracted first). Integer
    /// inputs compute in f32.
    pub fn logsumexp(&self, dims: impl ReduceDims) -> Result<RawTensor> {
        let _op = crate::profile::op1("logsumexp", self);
        let keepdim = dims.keepdim();
        let d = self.reduce_dims(dims.dims(), "logsumexp")?;
        let out_dtype = if self.dtype().is_float() {
            self.dtype()
        } else {
            DType::F32
        };
        let x = match self.dtype() {
            DType::F64 => self.clone(),
            _ => self.to_dtype(DType::F32)?,
        };
        if self.reduce_n(&d) == 0 {
            return x
                .reduce_op(ReduceOp::Sum, &d, keepdim)?
                .log()?
                .to_dtype(out_dtype);
        }
        let m = x.reduce_op(ReduceOp::Max, &d, true)?;
        // An infinite max would turn x - m into NaN; shift by 0 there instead.
        let m = crate::raw::binary::r#where(&m.abs()?.eq(f64::INFINITY)?, 0.0, &m)?;
        let s = x
            .sub(&m)?
            .exp()?
            .reduce_op(ReduceOp::Sum, &d, keepdim)?
            .log()?;
        let m = if keepdim { m } else { m.reshape(s.shape())? };
        s.add(&m)?.to_dtype(out_dtype)
    }

    /// The `p`-norm over `dims` (`f64::INFINITY` for the max-abs norm, 0 for the count of
    /// non-zeros). Floating tensors only.
    pub fn norm(&self, p: f64, dims: impl ReduceDims) -> Result<RawTensor> {
        let d = self.reduce_dims(dims.dims(), "norm")?;
        self.norm_impl(p, &d, dims.keepdim())
    }

    fn norm_impl(&self, p: f64, dims: &[usize], keepdim: bool) -> Result<RawTensor> {
        let _op = crate::profile::op1("linalg_vector_norm", self);
        let x = self.float_input("norm")?;
        let a = x.abs()?;
        let r = if p == 2.0 {
            a.mul(&a)?.reduce_op(ReduceOp::Sum, dims, keepdim)?.sqrt()?
        } else if p == 1.0 {
            a.reduce_op(ReduceOp::Sum, dims, keepdim)?
        } else if p.is_infinite() {
            let op = if p > 0.0 {
                ReduceOp::Max
            } else {
                ReduceOp::Min
            };
            if self.reduce_n(dims) == 0 {
                return Err(TensorError::invalid(
                    "norm",
                    "expected a non-empty input for the infinity norm",
                ));
            }
            a.reduce_op(op, dims, keepdim)?
        } else if p == 0.0 {
            a.ne(0)?
                .to_dtype(x.dtype())?
                .reduce_op(ReduceOp::Sum, dims, keepdim)?
        } else {
            a.pow(p)?
                .reduce_op(ReduceOp::Sum, dims, keepdim)?
                .pow(1.0 / p)?
        };
        r.to_dtype(self.dtype())
    }

    /// Softmax along `dim`: `exp(x - max) / sum(exp(x - max))` (floating tensors only).
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let x = Tensor::new(&[1000f32, 1000.], &Device::Cpu)?;
    /// assert_eq!(x.softmax(0)?.to_vec::<f32>()?, vec![0.5, 0.5]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn softmax(&self, dim: impl Dim) -> Result<RawTensor> {
        let _op = crate::profile::op1("softmax", self);
        self.softmax_op(dim, false)
    }

    /// `log(softmax(x))` along `dim`, computed as `x - max - log(sum(exp(x - max)))`.
    pub fn log_softmax(&self, dim: impl Dim) -> Result<RawTensor> {
        let _op = crate::profile::op1("log_softmax", self);
        self.softmax_op(dim, true)
    }

    /// Both softmaxes: one fused kernel per row (f16/bf16 computed in f32).
    fn softmax_op(&self, dim: impl Dim, log: bool) -> Result<RawTensor> {
        let op = if log { "log_softmax" } else { "softmax" };
        let x = self.float_input(op)?;
        let dim = dim.index(x.rank(), op)?;
        if x.numel() == 0 {
            return Ok(self.clone());
        }
        // A 0-dim tensor is a row of one.
        let x = if x.rank() == 0 { x.reshape([1])? } else { x };
        let s = x.with_storage(|s, l| s.softmax(l, dim, log))?;
        RawTensor::from_storage(s, x.shape())
            .reshape(self.shape())?
            .to_dtype(self.dtype())
    }
}
