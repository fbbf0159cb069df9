//! In-place ops: `copy_`, `fill_`, `zero_`, `add_`, `sub_`, `mul_`, `div_`, `clamp_`, and
//! the optimizers' fused `addcmul_`, `addcdiv_`, `lerp_`.
//!
//! They write through the tensor's storage (visible in every view), bump its version
//! counter, and refuse targets where several elements share memory (expanded views). The
//! result dtype must be storable in the target (`int_tensor.add_(0.5)` is an error, as in
//! PyTorch). See Note [Storage sharing].

use crate::dtype::{DType, Operand as Promo, result_type};
use crate::error::{Result, TensorError};
use crate::op::{self, BinaryOpT, FusedOp};
use crate::raw::{RawTensor, same_device};
use crate::scalar::{ClampBound, RawOperand, Scalar};
use crate::storage::{same, write_read, write_read_many};

/// `true` if a value of dtype `from` may be written into `to` by an in-place op
/// (PyTorch's `canCast`: no float into int/bool, no int into bool).
fn can_cast(from: DType, to: DType) -> bool {
    from.category() <= to.category()
}

impl RawTensor {
    fn writable(&self, op: &'static str) -> Result<()> {
        if self.layout().has_internal_overlap() {
            Err(TensorError::InPlaceOverlap { op })
        } else {
            Ok(())
        }
    }

    /// `src` broadcast to this tensor's shape and cast to its dtype, never sharing this
    /// tensor's storage.
    fn inplace_source(&self, op: &'static str, src: &RawTensor, dtype: DType) -> Result<RawTensor> {
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
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn copy_(&self, src: &RawTensor) -> Result<&RawTensor> {
        let _op = crate::profile::op("copy_", &[self.as_input(), src.as_input()]);
        self.writable("copy_")?;
        // The one op that crosses devices, as PyTorch's: the source comes over first.
        let src = &src.to_device(self.device())?;
        let s = self.inplace_source("copy_", src, self.dtype())?;
        write_read(self.cell(), s.cell(), |d, sv| {
            d.copy_from(self.layout(), sv, s.layout())
        })?;
        Ok(self)
    }

    /// Sets every element to `value` (cast to this dtype).
    pub fn fill_(&self, value: impl Into<Scalar>) -> Result<&RawTensor> {
        let _op = crate::profile::op("fill_", &[self.as_input(), crate::profile::Input::Scalar]);
        self.writable("fill_")?;
        let value = value.into();
        value.check_fits("fill_", self.dtype())?;
        self.cell().write().fill(self.layout(), value)?;
        Ok(self)
    }

    /// The in-place form `{name}_` of binary op `name` with kernel `O`.
    fn binary_<O: BinaryOpT>(
        &self,
        (name, inplace_name): (&'static str, &'static str),
        rhs: RawOperand<'_>,
    ) -> Result<&RawTensor> {
        let _op = crate::profile::op(inplace_name, &[self.as_input(), (&rhs).into()]);
        self.writable(name)?;
        let dt = self.dtype();
        let promo = match rhs {
            RawOperand::Tensor(t) => Promo::Tensor(t.dtype(), t.rank()),
            RawOperand::Scalar(s) => Promo::Scalar(s),
        };
        let mut result = result_type(&[Promo::Tensor(dt, self.rank()), promo]);
        if O::FLOAT_ONLY && !result.is_float() {
            result = DType::F32;
        }
        if !can_cast(result, dt) || (dt == DType::Bool && !O::BOOL_OK) {
            return Err(TensorError::InPlaceDType {
                op: name,
                result,
                output: dt,
            });
        }
        let src = match rhs {
            RawOperand::Tensor(t) => t.clone(),
            RawOperand::Scalar(s) => RawTensor::scalar_of(s, dt, self.device())?,
        };
        let s = self.inplace_source(name, &src, dt)?;
        write_read(self.cell(), s.cell(), |d, sv| {
            d.binary_inplace::<O>(name, self.layout(), sv, s.layout())
        })?;
        Ok(self)
    }

    /// `self += rhs` in place.
    pub fn add_<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<&RawTensor> {
        self.binary_::<op::Add>(("add", "add_"), rhs.into())
    }

    /// `self -= rhs` in place.
    pub fn sub_<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<&RawTensor> {
        self.binary_::<op::Sub>(("sub", "sub_"), rhs.into())
    }

    /// `self *= rhs` in place.
    pub fn mul_<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<&RawTensor> {
        self.binary_::<op::Mul>(("mul", "mul_"), rhs.into())
    }

    /// `self /= rhs` in place (floating tensors only, as true division).
    pub fn div_<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<&RawTensor> {
        self.binary_::<op::Div>(("div", "div_"), rhs.into())
    }

    /// `self += value * t1 * t2` in place (`torch.Tensor.addcmul_`), `t1` and `t2`
    /// broadcast to this shape. Computed as `self + (value * t1) * t2`, PyTorch's order; on
    /// the CPU, for f32/f64 operands of this shape, in one pass without temporaries.
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let v = Tensor::from_slice(&[1f32, 2.], [2], &Device::Cpu)?;
    /// let g = Tensor::from_slice(&[3f32, 4.], [2], &Device::Cpu)?;
    /// v.addcmul_(&g, &g, 0.5)?;
    /// assert_eq!(v.to_vec::<f32>()?, vec![5.5, 10.]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn addcmul_(&self, t1: &RawTensor, t2: &RawTensor, value: f64) -> Result<&RawTensor> {
        let _op = crate::profile::op("addcmul_", &[self.as_input(), t1.as_input(), t2.as_input()]);
        if self.fused3_("addcmul_", t1, t2, FusedOp::Addcmul(value))? {
            return Ok(self);
        }
        self.add_(&t1.mul(value)?.mul(t2)?)
    }

    /// `self += value * t1 / t2` in place (`torch.Tensor.addcdiv_`), `t1` and `t2`
    /// broadcast to this shape. Computed as `self + (value * t1) / t2`, PyTorch's order; on
    /// the CPU, for f32/f64 operands of this shape, in one pass without temporaries.
    pub fn addcdiv_(&self, t1: &RawTensor, t2: &RawTensor, value: f64) -> Result<&RawTensor> {
        let _op = crate::profile::op("addcdiv_", &[self.as_input(), t1.as_input(), t2.as_input()]);
        if self.fused3_("addcdiv_", t1, t2, FusedOp::Addcdiv(value))? {
            return Ok(self);
        }
        self.add_(&t1.mul(value)?.div(t2)?)
    }

    /// `self += weight * (end - self)` in place (`torch.Tensor.lerp_` with a scalar
    /// weight), computed as PyTorch's kernel does: from `end` backwards,
    /// `end - (end - self) * (1 - weight)`, when `|weight| >= 0.5`; the weight in this
    /// tensor's dtype (f32 for the half types). `end` (broadcast to this shape) must have
    /// this tensor's dtype, a floating one.
    pub fn lerp_(&self, end: &RawTensor, weight: f64) -> Result<&RawTensor> {
        let _op = crate::profile::op("lerp_", &[self.as_input(), end.as_input()]);
        self.writable("lerp_")?;
        let dt = self.dtype();
        if !dt.is_float() || end.dtype() != dt {
            return Err(TensorError::DTypeMismatch {
                op: "lerp_",
                expected: dt,
                found: end.dtype(),
            });
        }
        let e = self.inplace_source("lerp_", end, dt)?;
        if self.fusable(&[]) {
            let op = FusedOp::Lerp(weight);
            let fused = write_read(self.cell(), e.cell(), |d, es| {
                d.fused_inplace(self.layout(), &[(es, e.layout())], op)
            })?;
            if fused {
                return Ok(self);
            }
        }
        // The half types (and CUDA): composed from single ops.
        let (w, one_minus_w) = match dt {
            DType::F64 => (weight, 1.0 - weight),
            _ => {
                let w = weight as f32;
                (f64::from(w), f64::from(1.0 - w))
            }
        };
        let diff = e.sub(self)?;
        if w.abs() < 0.5 {
            self.add_(&diff.mul(w)?)
        } else {
            self.copy_(&e.sub(&diff.mul(one_minus_w)?)?)
        }
    }

    /// Whether the CPU's one-pass kernel (`cpu::elementwise::fused_inplace`) takes a
    /// [`FusedOp`] on this target: a CPU tensor of f32 or f64, and, for the three-operand
    /// ops (`operands` not empty), every layout contiguous. Checked before the write lock is
    /// taken, which bumps the version counter, so an op that will be composed from single
    /// ops (each bumping it as it writes) does not bump it once more for nothing.
    fn fusable(&self, operands: &[&RawTensor]) -> bool {
        self.device().is_cpu()
            && matches!(self.dtype(), DType::F32 | DType::F64)
            && (operands.is_empty()
                || std::iter::once(self)
                    .chain(operands.iter().copied())
                    .all(RawTensor::is_contiguous))
    }

    /// Runs a three-operand [`FusedOp`] in one pass if the operands allow it (this shape and
    /// dtype, none sharing this tensor's storage, a kernel for the device): `Ok(true)`
    /// when done, `Ok(false)` when the caller should compose the op instead.
    fn fused3_(
        &self,
        op: &'static str,
        t1: &RawTensor,
        t2: &RawTensor,
        fused: FusedOp,
    ) -> Result<bool> {
        self.writable(op)?;
        same_device(&[self, t1, t2])?;
        let fits = |t: &RawTensor| t.dtype() == self.dtype() && t.shape() == self.shape();
        if !(fits(t1) && fits(t2) && self.fusable(&[t1, t2])) {
            return Ok(false);
        }
        let srcs = [t1.cell(), t2.cell()];
        let done = write_read_many(self.cell(), &srcs, |d, s| match s {
            &[a, b] => d.fused_inplace(self.layout(), &[(a, t1.layout()), (b, t2.layout())], fused),
            _ => Ok(false),
        });
        done.unwrap_or(Ok(false))
    }

    /// Clamps every element into `[min, max]` in place (either bound optional).
    pub fn clamp_(&self, min: impl ClampBound, max: impl ClampBound) -> Result<&RawTensor> {
        let _op = crate::profile::op1("clamp_", self);
        let (min, max) = (min.bound(), max.bound());
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
