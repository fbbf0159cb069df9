//! Elementwise binary ops with NumPy broadcasting and PyTorch's type promotion, their
//! scalar forms, comparisons, logical ops, `where_`, `threshold_backward`, and the `std::ops`
//! operators.
//!
//! Every op takes `impl Into<Operand>`: a `&Tensor` or a Rust number, so `a.add(&b)`,
//! `a.add(1)`, `a.mul(0.5)` all work; the operators return `Result` so that
//! `(&a + &b)?` reads as PyTorch's `a + b`.

use crate::dtype::{DType, Operand as Promo, result_type};
use crate::error::{Result, TensorError};
use crate::op::{self, BinaryOpT, CmpOp};
use crate::raw::{RawTensor, same_device};
use crate::scalar::{RawOperand, Scalar};
use crate::shape::broadcast_shape;
use crate::storage::read_many;

fn promo(o: &RawOperand<'_>) -> Promo {
    match o {
        RawOperand::Tensor(t) => Promo::Tensor(t.dtype(), t.rank()),
        RawOperand::Scalar(s) => Promo::Scalar(*s),
    }
}

/// The operand as a tensor on `device` (a scalar becomes a 0-dim tensor of `dtype`).
fn operand_tensor(
    o: RawOperand<'_>,
    dtype: DType,
    device: ember_device::Device,
) -> Result<RawTensor> {
    match o {
        RawOperand::Tensor(t) => Ok(t.clone()),
        RawOperand::Scalar(s) => RawTensor::scalar_of(s, dtype, device),
    }
}

/// Two operands of a binary op, cast to the compute dtype, with their layouts broadcast to
/// the output `shape`.
struct Prepared2 {
    a: RawTensor,
    la: crate::layout::Layout,
    b: RawTensor,
    lb: crate::layout::Layout,
    shape: crate::shape::Shape,
}

impl RawTensor {
    /// The common front of binary ops: device check, promotion to `dtype`, broadcasting.
    /// Returns both operands cast, their layouts broadcast to the output shape, and that
    /// shape.
    fn prepare2(&self, op: &'static str, rhs: RawOperand<'_>, dtype: DType) -> Result<Prepared2> {
        let b = operand_tensor(rhs, dtype, self.device())?;
        same_device(&[self, &b])?;
        let shape = broadcast_shape(op, self.shape(), b.shape())?;
        shape.checked_numel(op)?;
        let a = self.to_dtype(dtype)?;
        let b = b.to_dtype(dtype)?;
        let la = a.layout().broadcast_as(op, &shape)?;
        let lb = b.layout().broadcast_as(op, &shape)?;
        Ok(Prepared2 {
            a,
            la,
            b,
            lb,
            shape,
        })
    }

    /// The dispatch of a binary op of the op table (`ops/table.rs`), named `name`:
    /// promotion, the refusals of its kernel `O`, broadcasting, then the CPU or CUDA
    /// kernel.
    pub(crate) fn binary_op<O: BinaryOpT>(
        &self,
        name: &'static str,
        rhs: RawOperand<'_>,
    ) -> Result<RawTensor> {
        let _op = crate::profile::op(name, &[self.as_input(), (&rhs).into()]);
        let mut dtype = result_type(&[Promo::Tensor(self.dtype(), self.rank()), promo(&rhs)]);
        if O::FLOAT_ONLY && !dtype.is_float() {
            dtype = DType::F32;
        }
        let scalar = match rhs {
            RawOperand::Scalar(s) => Some(s),
            RawOperand::Tensor(_) => None,
        };
        if let Some(e) = O::refuse(name, self.dtype(), dtype, scalar) {
            return Err(e);
        }
        if dtype == DType::Bool && !O::BOOL_OK {
            return Err(TensorError::UnsupportedDType {
                op: name,
                dtype,
                hint: "use logical_xor() for bool subtraction, or cast to an integer dtype",
            });
        }
        // Two tensors of the result's dtype and one shape (most ops in training code):
        // no casts, no broadcast layouts, no shape to build. `tiny_op_overhead` is this.
        if let RawOperand::Tensor(b) = &rhs
            && self.dtype() == dtype
            && b.dtype() == dtype
            && b.shape() == self.shape()
        {
            same_device(&[self, b])?;
            let (la, lb) = (self.layout(), b.layout());
            let s = read_many(&[self.cell(), b.cell()], |s| {
                s[0].binary::<O>(name, la, s[1], lb)
            })?;
            return Ok(RawTensor::from_storage(s, self.shape()));
        }
        let Prepared2 {
            a,
            la,
            b,
            lb,
            shape,
        } = self.prepare2(name, rhs, dtype)?;
        let s = read_many(&[a.cell(), b.cell()], |s| {
            s[0].binary::<O>(name, &la, s[1], &lb)
        })?;
        Ok(RawTensor::from_storage(s, shape))
    }

    fn cmp_op(&self, op: CmpOp, rhs: RawOperand<'_>) -> Result<RawTensor> {
        let _op = crate::profile::op(op.name(), &[self.as_input(), (&rhs).into()]);
        let dtype = result_type(&[Promo::Tensor(self.dtype(), self.rank()), promo(&rhs)]);
        let Prepared2 {
            a,
            la,
            b,
            lb,
            shape,
        } = self.prepare2(op.name(), rhs, dtype)?;
        let s = read_many(&[a.cell(), b.cell()], |s| s[0].cmp(op, &la, s[1], &lb))?;
        Ok(RawTensor::from_storage(s, shape))
    }

    /// `self == rhs`, as bool.
    pub fn eq<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.cmp_op(CmpOp::Eq, rhs.into())
    }

    /// `self != rhs`, as bool.
    pub fn ne<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.cmp_op(CmpOp::Ne, rhs.into())
    }

    /// `self < rhs`, as bool.
    pub fn lt<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.cmp_op(CmpOp::Lt, rhs.into())
    }

    /// `self <= rhs`, as bool.
    pub fn le<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.cmp_op(CmpOp::Le, rhs.into())
    }

    /// `self > rhs`, as bool.
    pub fn gt<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.cmp_op(CmpOp::Gt, rhs.into())
    }

    /// `self >= rhs`, as bool.
    pub fn ge<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.cmp_op(CmpOp::Ge, rhs.into())
    }

    fn logical_op<O: BinaryOpT>(
        &self,
        name: &'static str,
        rhs: RawOperand<'_>,
    ) -> Result<RawTensor> {
        let _op = crate::profile::op(name, &[self.as_input(), (&rhs).into()]);
        let rhs = match rhs {
            RawOperand::Scalar(s) => RawOperand::Scalar(Scalar::Bool(s.to_f64() != 0.0)),
            t => t,
        };
        let Prepared2 {
            a,
            la,
            b,
            lb,
            shape,
        } = self.prepare2(name, rhs, DType::Bool)?;
        let s = read_many(&[a.cell(), b.cell()], |s| {
            s[0].binary::<O>(name, &la, s[1], &lb)
        })?;
        Ok(RawTensor::from_storage(s, shape))
    }

    /// Elementwise `self && rhs` on truthiness (non-zero), as bool.
    pub fn logical_and<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.logical_op::<op::LogicalAnd>("logical_and", rhs.into())
    }

    /// Elementwise `self || rhs` on truthiness, as bool.
    pub fn logical_or<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.logical_op::<op::LogicalOr>("logical_or", rhs.into())
    }

    /// Elementwise `self xor rhs` on truthiness, as bool.
    pub fn logical_xor<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> Result<RawTensor> {
        self.logical_op::<op::LogicalXor>("logical_xor", rhs.into())
    }

    /// Elementwise `!self` on truthiness, as bool.
    pub fn logical_not(&self) -> Result<RawTensor> {
        let _op = crate::profile::op1("logical_not", self);
        self.logical_xor(true)
    }

    /// PyTorch's `threshold_backward(grad, input, threshold)` with `self` as the gradient:
    /// `0` where `input <= threshold`, `self` elsewhere, in one pass (ReLU's backward is
    /// `grad.threshold_backward(relu(x), 0)`). A NaN in `input` compares false, so its
    /// gradient passes, as in PyTorch. Broadcasting and promotion as a binary op; bool is
    /// refused. The threshold is converted to the result's dtype first, as PyTorch's
    /// `threshold.to<scalar_t>()`.
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let g = Tensor::new(&[1f32, 2., 3., 4.], &Device::Cpu)?;
    /// let y = Tensor::new(&[0f32, 0.5, f32::NAN, -1.], &Device::Cpu)?;
    /// assert_eq!(ember_tensor::aten::threshold_backward(&g, &y, 0.0)?.to_vec::<f32>()?, vec![0., 2., 3., 0.]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn threshold_backward(
        &self,
        input: &RawTensor,
        threshold: impl Into<Scalar>,
    ) -> Result<RawTensor> {
        const OP: &str = "threshold_backward";
        let _op = crate::profile::op(OP, &[self.as_input(), input.as_input()]);
        let dtype = result_type(&[
            Promo::Tensor(self.dtype(), self.rank()),
            Promo::Tensor(input.dtype(), input.rank()),
        ]);
        if dtype == DType::Bool {
            return Err(TensorError::UnsupportedDType {
                op: OP,
                dtype,
                hint: "threshold_backward takes numeric tensors; cast the bool gradient first",
            });
        }
        let threshold = threshold.into();
        let Prepared2 {
            a,
            la,
            b,
            lb,
            shape,
        } = self.prepare2(OP, RawOperand::Tensor(input), dtype)?;
        let s = read_many(&[a.cell(), b.cell()], |s| {
            s[0].threshold_backward(&la, s[1], &lb, threshold)
        })?;
        Ok(RawTensor::from_storage(s, shape))
    }
}

/// `torch.where(cond, on_true, on_false)`: picks from the two operands (broadcast
/// together with `cond`, promoted to one dtype). `cond` must be bool.
///
/// ```
/// use ember_tensor::{Device, Tensor};
/// let x = Tensor::new(&[-1f32, 2., -3.], &Device::Cpu)?;
/// let r = ember_tensor::r#where(&x.gt(0)?, &x, 0.0)?;
/// assert_eq!(r.to_vec::<f32>()?, vec![0., 2., 0.]);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
pub fn r#where<'a, 'b>(
    cond: &RawTensor,
    on_true: impl Into<RawOperand<'a>>,
    on_false: impl Into<RawOperand<'b>>,
) -> Result<RawTensor> {
    if cond.dtype() != DType::Bool {
        return Err(TensorError::DTypeMismatch {
            op: "where",
            expected: DType::Bool,
            found: cond.dtype(),
        });
    }
    let (t, f) = (on_true.into(), on_false.into());
    let _op = crate::profile::op("where", &[cond.as_input(), (&t).into(), (&f).into()]);
    let dtype = result_type(&[promo(&t), promo(&f)]);
    let t = operand_tensor(t, dtype, cond.device())?;
    let f = operand_tensor(f, dtype, cond.device())?;
    same_device(&[cond, &t, &f])?;
    let shape = broadcast_shape("where", cond.shape(), t.shape())?;
    let shape = broadcast_shape("where", &shape, f.shape())?;
    shape.checked_numel("where")?;
    let (t, f) = (t.to_dtype(dtype)?, f.to_dtype(dtype)?);
    let lc = cond.layout().broadcast_as("where", &shape)?;
    let lt = t.layout().broadcast_as("where", &shape)?;
    let lf = f.layout().broadcast_as("where", &shape)?;
    let s = read_many(&[cond.cell(), t.cell(), f.cell()], |s| {
        s[0].where_cond(&lc, s[1], &lt, s[2], &lf)
    })?;
    Ok(RawTensor::from_storage(s, shape))
}
