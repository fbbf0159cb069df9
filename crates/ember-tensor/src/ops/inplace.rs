//! In-place ops: `copy_`, `fill_`, `zero_`, `add_`, `sub_`, `mul_`, `div_`, `clamp_`.
//!
//! They write through the tensor's storage (visible in every view), bump its version
//! counter, and refuse targets where several elements share memory (expanded views). The
//! result dtype must be storable in the target (`int_tensor.add_(0.5)` is an error, as in
//! PyTorch). See Note [Storage sharing].

use crate::dtype::{DType, Operand as Promo, result_type};
use crate::error::{Result, TensorError};
use crate::op::{self, BinaryOpT};
use crate::scalar::{Operand, Scalar};
use crate::storage::{same, write_read};
use crate::tensor::{Tensor, same_device};

/// `true` if a value of dtype `from` may be written into `to` by an in-place op
/// (PyTorch's `canCast`: no float into int/bool, no int into bool).
fn can_cast(from: DType, to: DType) -> bool {
    from.category() <= to.category()
}

impl Tensor {
    fn writable(&self, op: &'static str) -> Result<()> {
        if self.layout().has_internal_overlap() {
            Err(TensorError::InPlaceOverlap { op })
        } else {
            Ok(())
        }
    }

    /// `src` broadcast to this tensor's shape and cast to its dtype, never sharing this
    /// tensor's storage.
    fn inplace_source(&self, op: &'static str, src: &Tensor, dtype: DType) -> Result<Tensor> {
        same_device(&[self, src])?;
        let b = src
            .broadcast_to(self.shape())
            .map_err(|_| TensorError::Broadcast {
                op,
                lhs: self.shape().clone(),
                rhs: src.shape().clone(),
            })?;
        let b = b.to_dtype(dtype)?;
        if same(self.cell(), b.cell()) {
            b.copy()
        } else {
            Ok(b)
        }
    }

    /// Copies `src` (broadcast to this shape, cast to this dtype, moved to this device) into
    /// this tensor.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let t = Tensor::zeros([2, 3], ())?;
    /// t.select(0, 1)?.copy_(&Tensor::ones([3], ())?)?; // writes through the view
    /// assert_eq!(t.to_vec2::<f32>()?, vec![vec![0., 0., 0.], vec![1., 1., 1.]]);
    /// # Ok::<(), ember_tensor::TensorError>(())
    /// ```
    pub fn copy_(&self, src: &Tensor) -> Result<&Tensor> {
        self.writable("copy_")?;
        // The one op that crosses devices, as PyTorch's: the source comes over first.
        let src = &src.to_device(&self.device())?;
        let s = self.inplace_source("copy_", src, self.dtype())?;
        write_read(self.cell(), s.cell(), |d, sv| {
            d.copy_from(self.layout(), sv, s.layout())
        })?;
        Ok(self)
    }

    /// Sets every element to `value` (cast to this dtype).
    pub fn fill_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
        self.writable("fill_")?;
        self.cell().write().fill(self.layout(), value.into())?;
        Ok(self)
    }

    /// Sets every element to zero.
    pub fn zero_(&self) -> Result<&Tensor> {
        self.fill_(0)
    }

    fn binary_<O: BinaryOpT>(&self, rhs: Operand<'_>) -> Result<&Tensor> {
        self.writable(O::NAME)?;
        let dt = self.dtype();
        let promo = match rhs {
            Operand::Tensor(t) => Promo::Tensor(t.dtype(), t.rank()),
            Operand::Scalar(s) => Promo::Scalar(s),
        };
        let mut result = result_type(&[Promo::Tensor(dt, self.rank()), promo]);
        if O::FLOAT_ONLY && !result.is_float() {
            result = DType::F32;
        }
        if !can_cast(result, dt) || (dt == DType::Bool && !O::BOOL_OK) {
            return Err(TensorError::InPlaceDType {
                op: O::NAME,
                result,
                output: dt,
            });
        }
        let src = match rhs {
            Operand::Tensor(t) => t.clone(),
            Operand::Scalar(s) => Tensor::scalar_of(s, dt, self.device())?,
        };
        let s = self.inplace_source(O::NAME, &src, dt)?;
        write_read(self.cell(), s.cell(), |d, sv| {
            d.binary_inplace::<O>(self.layout(), sv, s.layout())
        })?;
        Ok(self)
    }

    /// `self += rhs` in place.
    pub fn add_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        self.binary_::<op::Add>(rhs.into())
    }

    /// `self -= rhs` in place.
    pub fn sub_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        self.binary_::<op::Sub>(rhs.into())
    }

    /// `self *= rhs` in place.
    pub fn mul_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        self.binary_::<op::Mul>(rhs.into())
    }

    /// `self /= rhs` in place (floating tensors only, as true division).
    pub fn div_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        self.binary_::<op::Div>(rhs.into())
    }

    /// Clamps every element into `[min, max]` in place (either bound optional).
    pub fn clamp_(&self, min: Option<Scalar>, max: Option<Scalar>) -> Result<&Tensor> {
        self.writable("clamp_")?;
        let dt = self.dtype();
        let mut ops = vec![Promo::Tensor(dt, self.rank())];
        ops.extend(min.into_iter().chain(max).map(Promo::Scalar));
        let result = result_type(&ops);
        if !can_cast(result, dt) || dt == DType::Bool {
            return Err(TensorError::InPlaceDType {
                op: "clamp_",
                result,
                output: dt,
            });
        }
        self.cell().write().clamp_inplace(self.layout(), min, max)?;
        Ok(self)
    }
}
