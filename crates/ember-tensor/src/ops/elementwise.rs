//! Elementwise ops: binary with broadcasting and promotion, unary, clamp, casts,
//! device moves, and the in-place forms.

use crate::scalar::{Operand, RawOperand};
use crate::{ClampBound, DType, Device, RawTensor as Raw, Scalar};

use crate::autograd::error::{AutogradError, Result};
use crate::autograd::graph::{BackwardFn, Saved, maybe_record, needs_grad};
use crate::ops::{bw1, zeros_like};
use crate::tensor::Tensor;

/// The binary ops that have in-place forms on autograd tensors.
#[derive(Clone, Copy)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
}

impl Tensor {
    /// `self * self`.
    pub fn square(&self) -> Result<Tensor> {
        self.mul(self)
    }
}

pub(crate) fn raw_operand<'a>(o: &'a Operand<'a>, hold: &'a Option<Raw>) -> RawOperand<'a> {
    match (o, hold) {
        (_, Some(t)) => t.into(),
        (Operand::Scalar(s), None) => (*s).into(),
        // `hold` is always filled for tensor operands.
        (Operand::Tensor(_), None) => RawOperand::Scalar(Scalar::Int(0)),
    }
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                pub fn $name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
                    let rhs = rhs.into();
                    let hold = match rhs {
                        Operand::Tensor(t) => Some(t.raw()),
                        Operand::Scalar(_) => None,
                    };
                    Ok(Tensor::wrap(self.raw().$name(raw_operand(&rhs, &hold))?))
                }
            )*
        }
    };
}

compare_methods! {
    /// `self == rhs` (bool, not differentiable).
    eq;
    /// `self != rhs`.
    ne;
    /// `self < rhs`.
    lt;
    /// `self <= rhs`.
    le;
    /// `self > rhs`.
    gt;
    /// `self >= rhs`.
    ge;
    /// Logical and (bool).
    logical_and;
    /// Logical or.
    logical_or;
    /// Logical xor.
    logical_xor;
}

/// The gradient of clamp: passes where `min <= x <= max` (not at NaN).
fn clamp_grad(g: &Raw, x: &Raw, min: Option<Scalar>, max: Option<Scalar>) -> Result<Raw> {
    let mut keep = x.eq(x)?;
    if let Some(lo) = min {
        keep = keep.logical_and(&x.ge(lo)?)?;
    }
    if let Some(hi) = max {
        keep = keep.logical_and(&x.le(hi)?)?;
    }
    Ok(crate::raw::binary::r#where(&keep, g, 0.0)?)
}

impl Tensor {
    /// Dropout: in training, zeroes each element with probability `p` (a mask from the
    /// device's default generator) and scales the rest by `1 / (1 - p)`; otherwise the
    /// tensor itself.
    pub fn dropout(&self, p: f64, training: bool) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(AutogradError::invalid(
                "dropout",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            )
            .into());
        }
        if !training || p == 0.0 {
            return Ok(self.clone());
        }
        let x = self.raw();
        let m = if p == 1.0 {
            x.zeros_like()?
        } else {
            Raw::dropout_mask(x.shape().clone(), p, (x.device(), x.dtype()))?
                .mul(1.0 / (1.0 - p))?
        };
        let y = x.mul(&m)?;
        maybe_record("NativeDropoutBackward0", y, &[self], || {
            Ok(bw1(move |g| Ok(g.mul(&m)?)))
        })
    }

    /// Logical not (bool, not differentiable).
    pub fn logical_not(&self) -> Result<Tensor> {
        Ok(Tensor::wrap(self.raw().logical_not()?))
    }

    /// Clamps into `[min, max]`; the gradient passes where `min <= x <= max`.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![-2f32, 0.5, 9.0], [3], ())?;
    /// assert_eq!(x.clamp(0.0, 6.0)?.to_vec::<f32>()?, vec![0.0, 0.5, 6.0]);
    /// assert_eq!(x.clamp((), 1)?.to_vec::<f32>()?, vec![-2.0, 0.5, 1.0]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn clamp(&self, min: impl ClampBound, max: impl ClampBound) -> Result<Tensor> {
        let (min, max) = (min.bound(), max.bound());
        let x = self.raw();
        let y = x.clamp(min, max)?;
        maybe_record("ClampBackward1", y.clone(), &[self], || {
            let sx = Saved::of("ClampBackward1", self)?;
            Ok(bw1(move |g| clamp_grad(g, &sx.get()?, min, max)))
        })
    }

    /// `clamp(min, None)`.
    pub fn clamp_min(&self, min: impl Into<Scalar>) -> Result<Tensor> {
        self.clamp(min.into(), ())
    }

    /// `clamp(None, max)`.
    pub fn clamp_max(&self, max: impl Into<Scalar>) -> Result<Tensor> {
        self.clamp((), max.into())
    }

    /// GELU: exact with `Approximate::None` (or `()`), the tanh approximation with
    /// `Approximate::Tanh` (PyTorch's `approximate='tanh'`).
    pub fn gelu(&self, approximate: impl Into<crate::Approximate>) -> Result<Tensor> {
        match approximate.into() {
            crate::Approximate::None => self.gelu_erf(),
            crate::Approximate::Tanh => self.gelu_tanh(),
        }
    }

    /// `torch.Tensor.where(condition, other)`: `self` where `cond` is true, `other`
    /// elsewhere ([`r#where(cond, self, other)`](crate::r#where)).
    pub fn r#where<'b>(&self, cond: &Tensor, other: impl Into<Operand<'b>>) -> Result<Tensor> {
        crate::ops::r#where(cond, self, other)
    }

    /// A copy in another dtype; the gradient comes back in this tensor's dtype.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let x = self.raw();
        if x.dtype() == dtype {
            return Ok(self.clone());
        }
        let y = x.to_dtype(dtype)?;
        if !dtype.is_float() {
            return Ok(Tensor::wrap(y));
        }
        let from = x.dtype();
        maybe_record("ToCopyBackward0", y, &[self], || {
            Ok(bw1(move |g| Ok(g.to_dtype(from)?)))
        })
    }

    /// This tensor on `device` (itself if already there); the gradient flows back to the
    /// source device.
    pub fn to_device(&self, device: impl Into<Device>) -> Result<Tensor> {
        self.to_with(device.into(), false)
    }

    /// `to(device)`, `to(dtype)` or `to((device, dtype))`, as `ember_tensor::Tensor::to`.
    pub fn to(&self, target: impl crate::ToTarget) -> Result<Tensor> {
        let (device, dtype) = target.target()?;
        self.to_target(device, dtype, false)
    }

    /// `to(target)` with a non-blocking copy from pinned memory on the current stream, as
    /// `ember_tensor::Tensor::to_non_blocking`; the gradient flows back to the source.
    pub fn to_non_blocking(&self, target: impl crate::ToTarget) -> Result<Tensor> {
        let (device, dtype) = target.target()?;
        self.to_target(device, dtype, true)
    }

    /// The device move (if any), then the cast (if any).
    fn to_target(
        &self,
        device: Option<Device>,
        dtype: Option<DType>,
        non_blocking: bool,
    ) -> Result<Tensor> {
        let t = match device {
            Some(d) => self.to_with(d, non_blocking)?,
            None => self.clone(),
        };
        match dtype {
            Some(dt) => t.to_dtype(dt),
            None => Ok(t),
        }
    }

    /// This tensor on `device`, recorded so that the gradient returns to the source device.
    fn to_with(&self, device: Device, non_blocking: bool) -> Result<Tensor> {
        let x = self.raw();
        if x.device() == device {
            return Ok(self.clone());
        }
        let y = if non_blocking {
            x.to_non_blocking(device)?
        } else {
            x.to_device(device)?
        };
        let from = x.device();
        maybe_record("ToCopyBackward0", y, &[self], || {
            Ok(bw1(move |g| Ok(g.to_device(from)?)))
        })
    }

    /// `to(Device::Cpu)`.
    pub fn cpu(&self) -> Result<Tensor> {
        self.to_device(Device::Cpu)
    }

    /// To the current CUDA device (`cuda:0` unless `set_device` or a `DeviceGuard` chose
    /// another), as `tensor.cuda()`.
    pub fn cuda(&self) -> Result<Tensor> {
        self.to("cuda")
    }

    /// A contiguous copy with its own storage (PyTorch's `clone()`); differentiable.
    pub fn copy(&self) -> Result<Tensor> {
        let y = self.raw().copy()?;
        maybe_record("CloneBackward0", y, &[self], || Ok(bw1(|g| Ok(g.clone()))))
    }

    /// Pinned host memory (CPU tensors only; the tape passes through).
    pub fn pin_memory(&self) -> Result<Tensor> {
        let y = self.raw().pin_memory()?;
        maybe_record("PinMemoryBackward0", y, &[self], || {
            Ok(bw1(|g| Ok(g.clone())))
        })
    }

    // --- in place --------------------------------------------------------------------

    /// Checks an in-place write into `self` may happen, and says whether it must be
    /// recorded. A view whose base requires grad is recorded (Note [View rebase]).
    fn inplace_check(&self, others: &[&Tensor], op: &'static str) -> Result<bool> {
        let mut all = vec![self];
        all.extend_from_slice(others);
        let view = self.view_target();
        let base_grad = view
            .as_ref()
            .is_some_and(|v| crate::autograd::mode::is_grad_enabled() && v.base.requires_grad());
        if !needs_grad(&all) && !base_grad {
            return Ok(false);
        }
        if self.is_leaf() && self.requires_grad() {
            return Err(AutogradError::Inplace(format!(
                "{op}: a leaf Variable that requires grad is being used in an in-place operation (wrap the update in no_grad())"
            )).into());
        }
        if let Some(v) = view {
            if v.base.is_leaf() && v.base.requires_grad() {
                return Err(AutogradError::Inplace(format!(
                    "{op}: a view of a leaf Variable that requires grad is being used in an in-place operation (wrap the update in no_grad())"
                )).into());
            }
            if v.no_grad {
                return Err(AutogradError::Inplace(format!(
                    "{op}: a view was created in no_grad mode and is being modified inplace with grad mode enabled. This view is the output of a function that returns a view and its base's history cannot be rewritten; make a copy of the view with clone() before writing to it"
                )).into());
            }
            if !v.rebaseable {
                return Err(crate::autograd::rebase::overlapping(op));
            }
        }
        Ok(true)
    }

    fn inplace_binary(&self, op: Bin, rhs: Operand<'_>, name: &'static str) -> Result<&Tensor> {
        let rt = match rhs {
            Operand::Tensor(t) => Some(t),
            Operand::Scalar(_) => None,
        };
        let others: Vec<&Tensor> = rt.into_iter().collect();
        let rec = self.inplace_check(&others, name)?;
        let d = self.raw();
        let hold = rt.map(Tensor::raw);
        // What backward needs, saved before the write.
        let saved_other = match (rec, op, &hold) {
            (true, Bin::Mul, Some(b)) => Some(Saved::new(name, b)),
            (true, Bin::Div, Some(b)) => Some(Saved::new(name, b)),
            _ => None,
        };
        let saved_self = match (rec, op, rt) {
            (true, Bin::Mul, Some(t)) if t.requires_grad() => Some(Saved::new(name, &d.copy()?)),
            _ => None,
        };
        match op {
            Bin::Add => d.add_(raw_operand(&rhs, &hold))?,
            Bin::Sub => d.sub_(raw_operand(&rhs, &hold))?,
            Bin::Mul => d.mul_(raw_operand(&rhs, &hold))?,
            Bin::Div => d.div_(raw_operand(&rhs, &hold))?,
        };
        if !rec {
            return Ok(self);
        }
        let self_grad = self.requires_grad();
        let other_grad = rt.is_some_and(Tensor::requires_grad);
        let scalar = match rhs {
            Operand::Scalar(s) => Some(s),
            Operand::Tensor(_) => None,
        };
        let f: BackwardFn = Box::new(move |g: &Raw| {
            let b = match (&saved_other, scalar) {
                (Some(s), _) => Some(s.get()?),
                (None, Some(s)) => Some(Raw::full([], s, (g.device(), g.dtype()))?),
                _ => None,
            };
            let ga = match op {
                Bin::Add | Bin::Sub => g.clone(),
                Bin::Mul | Bin::Div => {
                    let b = b
                        .clone()
                        .ok_or_else(|| AutogradError::invalid(name, "lost operand"))?;
                    if matches!(op, Bin::Mul) {
                        g.mul(&b)?
                    } else {
                        g.div(&b)?
                    }
                }
            };
            let mut out = vec![self_grad.then_some(ga)];
            if other_grad {
                let gb = match op {
                    Bin::Add => g.clone(),
                    Bin::Sub => g.neg()?,
                    Bin::Mul => match &saved_self {
                        Some(a) => g.mul(&a.get()?)?,
                        None => return Err(AutogradError::invalid(name, "lost operand").into()),
                    },
                    Bin::Div => {
                        return Err(AutogradError::Inplace(format!(
                            "{name}: the gradient of an in-place division with respect to the divisor needs the old value; use div() instead"
                        )).into());
                    }
                };
                out.push(Some(gb));
            }
            Ok(out)
        });
        let mut inputs = vec![self];
        if other_grad {
            inputs.extend(rt);
        }
        // The write bumped the version; the node is the new history of `self`.
        self.commit_inplace(name, &inputs, f)?;
        Ok(self)
    }

    /// In-place `self += rhs`.
    pub fn add_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        self.inplace_binary(Bin::Add, rhs.into(), "AddBackward0")
    }
    /// In-place `self -= rhs`.
    pub fn sub_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        self.inplace_binary(Bin::Sub, rhs.into(), "SubBackward0")
    }
    /// In-place `self *= rhs`.
    pub fn mul_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        self.inplace_binary(Bin::Mul, rhs.into(), "MulBackward0")
    }
    /// In-place `self /= rhs`.
    pub fn div_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        self.inplace_binary(Bin::Div, rhs.into(), "DivBackward0")
    }

    /// In-place fill; afterwards no gradient flows to the old value.
    pub fn fill_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
        let rec = self.inplace_check(&[], "fill_")?;
        self.raw().fill_(value)?;
        if rec {
            self.commit_inplace("FillBackward0", &[self], bw1(zeros_like))?;
        }
        Ok(self)
    }

    /// In-place zero.
    pub fn zero_(&self) -> Result<&Tensor> {
        self.fill_(0)
    }

    /// In-place copy from `src` (any device, broadcast to this shape); the gradient flows
    /// to `src`.
    pub fn copy_(&self, src: &Tensor) -> Result<&Tensor> {
        let rec = self.inplace_check(&[src], "copy_")?;
        let s = src.raw();
        self.raw().copy_(&s)?;
        if rec {
            let (sdt, sdev) = (s.dtype(), s.device());
            let self_grad = self.requires_grad();
            let src_grad = src.requires_grad();
            let f: BackwardFn = Box::new(move |g: &Raw| {
                let mut out = vec![self_grad.then(|| zeros_like(g)).transpose()?];
                if src_grad {
                    out.push(Some(g.to_dtype(sdt)?.to_device(sdev)?));
                }
                Ok(out)
            });
            let mut inputs = vec![self];
            if src_grad {
                inputs.push(src);
            }
            self.commit_inplace("CopyBackwards", &inputs, f)?;
        }
        Ok(self)
    }

    /// In-place clamp.
    pub fn clamp_(&self, min: impl ClampBound, max: impl ClampBound) -> Result<&Tensor> {
        let (min, max) = (min.bound(), max.bound());
        let rec = self.inplace_check(&[], "clamp_")?;
        let d = self.raw();
        let before = if rec { Some(d.copy()?) } else { None };
        d.clamp_(min, max)?;
        if let Some(x) = before {
            let f = bw1(move |g| clamp_grad(g, &x, min, max));
            self.commit_inplace("ClampBackward1", &[self], f)?;
        }
        Ok(self)
    }
}

// `&a + &b`, `a * 2.0`, `-&a`: the operators call the recorded ops and give their `Result`.
macro_rules! std_op {
    ($trait:ident, $method:ident) => {
        impl<'a, R: Into<Operand<'a>>> std::ops::$trait<R> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: R) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        impl<'a, R: Into<Operand<'a>>> std::ops::$trait<R> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: R) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
    };
}

std_op!(Add, add);
std_op!(Sub, sub);
std_op!(Mul, mul);
std_op!(Div, div);

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl std::ops::Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}
