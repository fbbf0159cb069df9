//! `isclose`, `allclose` and `equal` (Note [Closeness] in `raw/close.rs`): comparisons, so
//! nothing is recorded.

use crate::IscloseOptions;
use crate::autograd::error::Result;
use crate::tensor::Tensor;

impl Tensor {
    /// `torch.isclose(self, other, rtol, atol, equal_nan)`: bool, broadcast, where
    /// `|self - other| <= atol + rtol·|other|` (finite), `self == other` (so infinities
    /// only to themselves), or both are NaN with `equal_nan`. `opts`: `()` for PyTorch's
    /// defaults (`1e-5`, `1e-8`, `false`), `(rtol, atol)`, `(rtol, atol, equal_nan)` or an
    /// [`IscloseOptions`]. Both tensors must have one dtype, as in
    /// PyTorch. Not differentiable.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let a = Tensor::new(&[1f32, 2., f32::INFINITY, f32::NAN], ())?;
    /// let b = Tensor::new(&[1.000001f32, 2.1, f32::INFINITY, f32::NAN], ())?;
    /// assert_eq!(a.isclose(&b, ())?.to_vec::<bool>()?, vec![true, false, true, false]);
    /// assert_eq!(a.isclose(&b, (0.1, 0.0, true))?.to_vec::<bool>()?, vec![true; 4]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn isclose(&self, other: &Tensor, opts: impl Into<IscloseOptions>) -> Result<Tensor> {
        Ok(Tensor::wrap(
            self.raw().isclose(&other.raw(), &opts.into())?,
        ))
    }

    /// `torch.allclose(self, other, rtol, atol, equal_nan)`: whether
    /// [`isclose`](Tensor::isclose) holds everywhere (`true` for no elements); `opts` as
    /// there.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let a = Tensor::new(&[1f64, 2.], ())?;
    /// assert!(a.allclose(&a.add(1e-9)?, ())?);
    /// assert!(!a.allclose(&a.add(1e-3)?, ())?);
    /// assert!(a.allclose(&a.add(1e-3)?, (0.0, 1e-2))?);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn allclose(&self, other: &Tensor, opts: impl Into<IscloseOptions>) -> Result<bool> {
        Ok(self.raw().allclose(&other.raw(), &opts.into())?)
    }

    /// `torch.equal(self, other)`: the same shape and the same values (compared after
    /// promotion, as PyTorch; NaN is never equal). Another shape is `false`; no
    /// broadcasting.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let a = Tensor::new(&[1i64, 2], ())?;
    /// assert!(a.equal(&Tensor::new(&[1f32, 2.], ())?)?);
    /// assert!(!a.equal(&Tensor::new(&[1i64, 2], ())?.reshape([1, 2])?)?); // [1, 2] is not [2]
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn equal(&self, other: &Tensor) -> Result<bool> {
        Ok(self.raw().equal(&other.raw())?)
    }
}
