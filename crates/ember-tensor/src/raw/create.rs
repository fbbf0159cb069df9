//! Creation: from data, constants, ranges, `eye`, and the `*_like` family.

use ember_device::Device;

use crate::cpu::dispatch;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::raw::{RawTensor, host_tensor};
use crate::scalar::Scalar;
use crate::shape::Shape;
use crate::storage::{CpuStorage, Storage};

/// Where and as what to create a tensor: PyTorch's `dtype=` and `device=` keywords.
///
/// Anything that converts into it works: `()` (defaults: f32 or the value's dtype, cpu), a
/// [`DType`], a [`Device`] (by value or reference), or a `(Device, DType)` pair (the order
/// of `to(device, dtype)`, everywhere in Ember).
///
/// ```
/// use ember_tensor::{DType, Device, Tensor};
/// let a = Tensor::zeros([2, 3], ())?;                      // f32 on cpu
/// let b = Tensor::ones([2], DType::I64)?;                  // i64
/// let c = Tensor::full([2], 0.5, (&Device::Cpu, DType::F64))?;
/// assert_eq!((a.dtype(), b.dtype(), c.dtype()), (DType::F32, DType::I64, DType::F64));
/// # Ok::<(), ember_tensor::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// The dtype; `None` for the default (f32, or inferred from a fill value as PyTorch).
    pub dtype: Option<DType>,
    /// The device.
    pub device: Device,
    /// PyTorch's `requires_grad=`: honoured by the autograd tensor's constructors
    /// (`ember::Tensor`); the tensor core has no tape and ignores it.
    pub requires_grad: bool,
}

impl Options {
    /// Defaults: inferred dtype, cpu.
    pub fn new() -> Self {
        Options::default()
    }

    /// With this dtype.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// With this device.
    pub fn device(mut self, device: impl Into<Device>) -> Self {
        self.device = device.into();
        self
    }

    /// Marks the new tensor as a leaf that requires grad (autograd constructors only).
    pub fn requires_grad(mut self, on: bool) -> Self {
        self.requires_grad = on;
        self
    }
}

impl From<()> for Options {
    fn from(_: ()) -> Self {
        Options::default()
    }
}
impl From<DType> for Options {
    fn from(d: DType) -> Self {
        Options::new().dtype(d)
    }
}
impl From<Device> for Options {
    fn from(d: Device) -> Self {
        Options::new().device(d)
    }
}
impl From<&Device> for Options {
    fn from(d: &Device) -> Self {
        Options::new().device(*d)
    }
}
impl From<(Device, DType)> for Options {
    fn from((d, t): (Device, DType)) -> Self {
        Options::new().dtype(t).device(d)
    }
}
impl From<(&Device, DType)> for Options {
    fn from((d, t): (&Device, DType)) -> Self {
        Options::new().dtype(t).device(*d)
    }
}

/// `t` converted to `dtype` when one was asked for.
fn with_dtype(t: RawTensor, dtype: Option<DType>) -> Result<RawTensor> {
    match dtype {
        Some(d) if d != t.dtype() => t.to_dtype(d),
        _ => Ok(t),
    }
}

/// A new contiguous tensor of `numel` elements of `dtype`, element `i` = `f(i)` (as f64 or
/// i64 by the dtype's category).
fn generate(
    op: &'static str,
    shape: Shape,
    dtype: DType,
    device: Device,
    f: impl Fn(usize) -> Scalar + Sync,
) -> Result<RawTensor> {
    let n = shape.checked_numel(op)?;
    if let Device::Cuda(i) = device {
        // Validate the device before building anything on the host.
        crate::cuda::ctx(op, i)?;
    }
    let s = dispatch!(dtype, T => CpuStorage::from_chunks(n, |r| r.map(|i| f(i).to_dtype::<T>()))?);
    Ok(RawTensor::from_storage(
        Storage::from_host(op, s, device)?,
        shape,
    ))
}

impl RawTensor {
    /// A tensor holding a copy of `data`, laid out as `shape`, as `torch.tensor(data,
    /// dtype=, device=)`: `opts` is `()` (the cpu), a device (by value or reference), a
    /// dtype to convert to, or `(device, dtype)`; without a dtype the data's own is kept.
    ///
    /// ```
    /// use ember_tensor::{DType, Device, Tensor};
    /// let t = Tensor::from_slice(&[1i64, 2, 3], [3], &Device::Cpu)?;
    /// assert_eq!(t.to_string(), "tensor([1, 2, 3])");
    /// assert!(Tensor::from_slice(&[1f32, 2.], [3], ()).is_err());
    /// let h = Tensor::from_slice(&[1f32, 2.], [2], DType::F16)?;
    /// assert_eq!(h.dtype(), DType::F16);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn from_slice<T: WithDType>(
        data: &[T],
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        let opts = opts.into();
        let shape = shape.into();
        let n = shape.checked_numel("from_slice")?;
        if n != data.len() {
            return Err(TensorError::ElementCount {
                op: "from_slice",
                shape: shape.to_string(),
                numel: data.len(),
            });
        }
        with_dtype(host_tensor(data, shape, &opts.device)?, opts.dtype)
    }

    /// A tensor from a `Vec`, laid out as `shape` (`opts` as [`from_slice`](Tensor::from_slice)).
    pub fn from_vec<T: WithDType>(
        data: Vec<T>,
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        RawTensor::from_slice(&data, shape, opts)
    }

    /// A 1-D tensor of `data` (`opts` as [`from_slice`](Tensor::from_slice)).
    pub fn new<T: WithDType>(data: &[T], opts: impl Into<Options>) -> Result<RawTensor> {
        RawTensor::from_slice(data, [data.len()], opts)
    }

    /// A zero-dimensional tensor holding `value` (`opts` as [`from_slice`](Tensor::from_slice)).
    /// A value that does not fit the dtype asked for (300 as u8, 1e30 or NaN as i32) is an
    /// error, as in `torch.tensor(300, dtype=torch.uint8)`.
    pub fn scalar<T: WithDType>(value: T, opts: impl Into<Options>) -> Result<RawTensor> {
        let opts = opts.into();
        if let Some(dt) = opts.dtype {
            let v = if T::DTYPE.is_float() {
                Scalar::Float(value.to_f64())
            } else if T::DTYPE == DType::Bool {
                Scalar::Bool(value.to_f64() != 0.0)
            } else {
                Scalar::Int(value.to_i64())
            };
            v.check_fits("scalar", dt)?;
        }
        with_dtype(
            host_tensor(&[value], Shape::scalar(), &opts.device)?,
            opts.dtype,
        )
    }

    /// A zero-dimensional tensor of a [`Scalar`] in `dtype`: the operand an op with a
    /// scalar argument broadcasts. On CUDA a fill kernel writes it, so `x.mul(2.0)` never
    /// makes the host wait for the device, as an upload would.
    pub(crate) fn scalar_of(value: Scalar, dtype: DType, device: Device) -> Result<RawTensor> {
        let s = Storage::full("scalar", device, 1, value, dtype)?;
        Ok(RawTensor::from_storage(s, Shape::scalar()))
    }

    /// `shape` filled with `value`; the dtype defaults to the value's (f32 for floats, i64
    /// for ints, bool for bools) as `torch.full`.
    pub fn full(
        shape: impl Into<Shape>,
        value: impl Into<Scalar>,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        let (value, o) = (value.into(), opts.into());
        let dtype = o.dtype.unwrap_or(value.default_dtype());
        value.check_fits("full", dtype)?;
        let shape = shape.into();
        // On CUDA the fill kernel writes the value on the device; nothing crosses from the
        // host.
        let n = shape.checked_numel("full")?;
        Ok(RawTensor::from_storage(
            Storage::full("full", o.device, n, value, dtype)?,
            shape,
        ))
    }

    /// Zeros (f32 unless told).
    pub fn zeros(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<RawTensor> {
        let o = opts.into();
        RawTensor::full(shape, 0, o.dtype(o.dtype.unwrap_or(DType::F32)))
    }

    /// Ones (f32 unless told).
    pub fn ones(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<RawTensor> {
        let o = opts.into();
        RawTensor::full(shape, 1, o.dtype(o.dtype.unwrap_or(DType::F32)))
    }

    /// PyTorch's `empty`. Ember never hands out uninitialised memory, so the elements are
    /// zero; use it where the values do not matter.
    pub fn empty(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<RawTensor> {
        RawTensor::zeros(shape, opts)
    }

    /// `[start, end)` in steps of 1. See [`Tensor::arange_step`].
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        RawTensor::arange_step(start, end, 1, opts)
    }

    /// `torch.arange(start, end, step)`: `ceil((end - start) / step)` values
    /// `start + i * step`. The dtype defaults to i64 when all three are integers, else f32.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// assert_eq!(Tensor::arange(0, 5, ())?.to_vec::<i64>()?, vec![0, 1, 2, 3, 4]);
    /// assert_eq!(Tensor::arange_step(0.0, 1.0, 0.25, ())?.to_vec::<f32>()?, vec![0., 0.25, 0.5, 0.75]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn arange_step(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        let (start, end, step, o) = (start.into(), end.into(), step.into(), opts.into());
        let all_int = [start, end, step].iter().all(|s| !s.is_float());
        let dtype = o
            .dtype
            .unwrap_or(if all_int { DType::I64 } else { DType::F32 });
        let (a, b, s) = (start.to_f64(), end.to_f64(), step.to_f64());
        if !(a.is_finite() && b.is_finite()) {
            return Err(TensorError::invalid(
                "arange",
                format!("unsupported range: {a} -> {b}"),
            ));
        }
        if s == 0.0 || s.is_nan() {
            return Err(TensorError::invalid("arange", "step must be nonzero"));
        }
        if (s > 0.0 && b < a) || (s < 0.0 && b > a) {
            return Err(TensorError::invalid(
                "arange",
                "upper bound and larger bound inconsistent with step sign",
            ));
        }
        let len = ((b - a) / s).ceil();
        if len >= isize::MAX as f64 / 8.0 {
            return Err(TensorError::TooLarge {
                op: "arange",
                shape: format!("[{len}]"),
            });
        }
        let n = len as usize;
        if all_int {
            let (a, s) = (start.to_dtype::<i64>(), step.to_dtype::<i64>());
            generate("arange", [n].into(), dtype, o.device, move |i| {
                Scalar::Int(a.wrapping_add((i as i64).wrapping_mul(s)))
            })
        } else {
            generate("arange", [n].into(), dtype, o.device, move |i| {
                Scalar::Float(a + i as f64 * s)
            })
        }
    }

    /// `steps` evenly spaced values from `start` to `end` inclusive (f32 unless told), with
    /// PyTorch's symmetric formula (the second half counts back from `end`).
    pub fn linspace(
        start: f64,
        end: f64,
        steps: usize,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        let o = opts.into();
        let dtype = o.dtype.unwrap_or(DType::F32);
        let step = if steps > 1 {
            (end - start) / (steps - 1) as f64
        } else {
            0.0
        };
        let half = steps / 2;
        generate("linspace", [steps].into(), dtype, o.device, move |i| {
            Scalar::Float(if steps == 1 {
                start
            } else if i < half {
                start + step * i as f64
            } else {
                end - step * (steps - 1 - i) as f64
            })
        })
    }

    /// The `n x n` identity matrix.
    pub fn eye(n: usize, opts: impl Into<Options>) -> Result<RawTensor> {
        RawTensor::eye_rect(n, n, opts)
    }

    /// An `n x m` matrix with ones on the diagonal.
    pub fn eye_rect(n: usize, m: usize, opts: impl Into<Options>) -> Result<RawTensor> {
        let o = opts.into();
        let dtype = o.dtype.unwrap_or(DType::F32);
        generate("eye", [n, m].into(), dtype, o.device, move |i| {
            Scalar::Int((m > 0 && i / m == i % m) as i64)
        })
    }

    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<RawTensor> {
        RawTensor::zeros(self.shape(), (self.device(), self.dtype()))
    }

    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<RawTensor> {
        RawTensor::ones(self.shape(), (self.device(), self.dtype()))
    }

    /// `value` with this tensor's shape, dtype and device.
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<RawTensor> {
        RawTensor::full(self.shape(), value, (self.device(), self.dtype()))
    }

    /// [`Tensor::empty`] with this tensor's shape, dtype and device.
    pub fn empty_like(&self) -> Result<RawTensor> {
        self.zeros_like()
    }
}
