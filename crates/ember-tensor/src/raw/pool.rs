//! `max_pool2d` (with indices) and `avg_pool2d` with PyTorch's arguments, output-size
//! rule (`ceil_mode` included) and checks. Kernels in `cpu/pool.rs`.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::params::{AvgDivisor, Pool2dParams};
use crate::raw::RawTensor;
use crate::raw::conv::Size2;
use crate::shape::Shape;

/// Options of [`Tensor::max_pool2d`]: kernel size, stride (default: the kernel size),
/// padding (at most half the kernel; padded positions never win), dilation, `ceil_mode`.
///
/// ```
/// use ember_tensor::MaxPool2dOptions;
/// let o = MaxPool2dOptions::new(3).stride(2).padding(1).ceil_mode(true);
/// # let _ = o;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2dOptions {
    /// Window size (height, width).
    pub kernel: Size2,
    /// Stride; `None` means the kernel size (PyTorch's default).
    pub stride: Option<Size2>,
    /// Implicit padding with -inf on both sides.
    pub padding: Size2,
    /// Spacing between window elements.
    pub dilation: Size2,
    /// Round the output size up instead of down (windows starting in the padding on the
    /// right are dropped, as PyTorch).
    pub ceil_mode: bool,
}

impl MaxPool2dOptions {
    /// A `kernel`-sized window, stride = kernel, no padding, dilation 1, floor mode.
    pub fn new(kernel: impl Into<Size2>) -> Self {
        MaxPool2dOptions {
            kernel: kernel.into(),
            stride: None,
            padding: Size2(0, 0),
            dilation: Size2(1, 1),
            ceil_mode: false,
        }
    }

    /// Sets the stride.
    pub fn stride(mut self, s: impl Into<Size2>) -> Self {
        self.stride = Some(s.into());
        self
    }

    /// Sets the padding.
    pub fn padding(mut self, p: impl Into<Size2>) -> Self {
        self.padding = p.into();
        self
    }

    /// Sets the dilation.
    pub fn dilation(mut self, d: impl Into<Size2>) -> Self {
        self.dilation = d.into();
        self
    }

    /// Sets `ceil_mode`.
    pub fn ceil_mode(mut self, on: bool) -> Self {
        self.ceil_mode = on;
        self
    }
}

/// Options of [`Tensor::avg_pool2d`]: kernel size, stride (default: the kernel size),
/// zero padding (at most half the kernel), `ceil_mode`, `count_include_pad` (default
/// `true`), `divisor_override`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2dOptions {
    /// Window size (height, width).
    pub kernel: Size2,
    /// Stride; `None` means the kernel size.
    pub stride: Option<Size2>,
    /// Implicit zero padding on both sides.
    pub padding: Size2,
    /// Round the output size up instead of down.
    pub ceil_mode: bool,
    /// Divide by the window size including padding (`true`) or by the number of input
    /// elements in it (`false`).
    pub count_include_pad: bool,
    /// Divide every window's sum by this instead (non-zero).
    pub divisor_override: Option<i64>,
}

impl AvgPool2dOptions {
    /// A `kernel`-sized window, stride = kernel, no padding, floor mode, padding counted.
    pub fn new(kernel: impl Into<Size2>) -> Self {
        AvgPool2dOptions {
            kernel: kernel.into(),
            stride: None,
            padding: Size2(0, 0),
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }

    /// Sets the stride.
    pub fn stride(mut self, s: impl Into<Size2>) -> Self {
        self.stride = Some(s.into());
        self
    }

    /// Sets the padding.
    pub fn padding(mut self, p: impl Into<Size2>) -> Self {
        self.padding = p.into();
        self
    }

    /// Sets `ceil_mode`.
    pub fn ceil_mode(mut self, on: bool) -> Self {
        self.ceil_mode = on;
        self
    }

    /// Sets `count_include_pad`.
    pub fn count_include_pad(mut self, on: bool) -> Self {
        self.count_include_pad = on;
        self
    }

    /// Sets `divisor_override`.
    pub fn divisor_override(mut self, d: i64) -> Self {
        self.divisor_override = Some(d);
        self
    }
}

/// PyTorch's `pooling_output_shape`: floor (or ceil) of
/// `(size + 2·pad - dilation·(k - 1) - 1) / stride + 1`, where in ceil mode a last window
/// starting at or beyond `size + pad` is dropped. `None` if it is below 1.
fn out_size(
    size: usize,
    k: usize,
    pad: usize,
    stride: usize,
    dil: usize,
    ceil: bool,
) -> Option<usize> {
    let (size, k, pad, s, d) = (
        size as i128,
        k as i128,
        pad as i128,
        stride as i128,
        dil as i128,
    );
    let num = size + 2 * pad - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 };
    let mut out = num.div_euclid(s) + 1;
    if ceil && (out - 1) * s >= size + pad {
        out -= 1;
    }
    usize::try_from(out).ok().filter(|&o| o >= 1)
}

/// Checks shared by both poolings; returns the 4-D input, the params and whether the input
/// was batched.
fn pool_setup(
    x: &RawTensor,
    op: &'static str,
    kernel: Size2,
    stride: Option<Size2>,
    pad: Size2,
    dil: Size2,
    ceil: bool,
) -> Result<(RawTensor, Pool2dParams, bool)> {
    let invalid = |m: String| TensorError::invalid(op, m);
    let xs = x.shape();
    let batched = match x.rank() {
        4 => true,
        3 => false,
        _ => {
            return Err(TensorError::ShapeMismatch {
                op,
                msg: format!(
                    "expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got {xs}"
                ),
            });
        }
    };
    if x.dims()[usize::from(batched)..].contains(&0) {
        return Err(TensorError::ShapeMismatch {
            op,
            msg: format!(
                "expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got {xs}"
            ),
        });
    }
    if !matches!(
        x.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::Bf16
    ) {
        return Err(TensorError::unsupported(op, x.dtype()));
    }
    let stride = stride.unwrap_or(kernel);
    if kernel.0 == 0 || kernel.1 == 0 {
        return Err(invalid(format!(
            "kernel size should be greater than zero, but got kH = {}, kW = {}",
            kernel.0, kernel.1
        )));
    }
    if stride.0 == 0 || stride.1 == 0 {
        return Err(invalid(format!(
            "stride should be greater than zero, but got dH = {}, dW = {}",
            stride.0, stride.1
        )));
    }
    if dil.0 == 0 || dil.1 == 0 {
        return Err(invalid(format!(
            "dilation should be greater than zero, but got dilationH = {}, dilationW = {}",
            dil.0, dil.1
        )));
    }
    if pad.0 > kernel.0 / 2 || pad.1 > kernel.1 / 2 {
        return Err(invalid(format!(
            "pad should be smaller than or equal to half of kernel size, but got padW = {}, padH = {}, kW = {}, kH = {}",
            pad.1, pad.0, kernel.1, kernel.0
        )));
    }
    let x4 = if batched { x.clone() } else { x.unsqueeze(0)? };
    let &[_, c, h, w] = x4.dims() else {
        return Err(invalid(format!("unexpected input {xs}")));
    };
    let oh = out_size(h, kernel.0, pad.0, stride.0, dil.0, ceil);
    let ow = out_size(w, kernel.1, pad.1, stride.1, dil.1, ceil);
    let (Some(oh), Some(ow)) = (oh, ow) else {
        return Err(TensorError::ShapeMismatch {
            op,
            msg: format!(
                "given input size: ({c}x{h}x{w}) (input {xs}), kernel ({}, {}), stride ({}, {}), padding ({}, {}), dilation ({}, {}): calculated output size is too small",
                kernel.0, kernel.1, stride.0, stride.1, pad.0, pad.1, dil.0, dil.1
            ),
        });
    };
    let p = Pool2dParams {
        kernel: (kernel.0, kernel.1),
        stride: (stride.0, stride.1),
        pad: (pad.0, pad.1),
        dilation: (dil.0, dil.1),
        out: (oh, ow),
    };
    Ok((x4, p, batched))
}

fn out_shape(x4: &RawTensor, p: &Pool2dParams, batched: bool) -> Result<Shape> {
    let d = x4.dims();
    let mut s = vec![d[0], d[1], p.out.0, p.out.1];
    if !batched {
        s.remove(0);
    }
    let s = Shape::from(s);
    s.checked_numel("pool2d")?;
    Ok(s)
}

impl RawTensor {
    /// Max pooling over `[N, C, H, W]` (or unbatched `[C, H, W]`), as
    /// `torch.nn.functional.max_pool2d`. NaN in a window wins, as PyTorch.
    ///
    /// ```
    /// use ember_tensor::{MaxPool2dOptions, Tensor};
    /// let x = Tensor::arange(0f32, 16., ())?.reshape([1, 4, 4])?;
    /// let y = x.max_pool2d(&MaxPool2dOptions::new(2))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![5., 7., 13., 15.]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn max_pool2d(&self, opts: &MaxPool2dOptions) -> Result<RawTensor> {
        Ok(self.max_pool2d_with_indices(opts)?.0)
    }

    /// Max pooling that also returns, for each output, the position of its maximum as a
    /// flat index `h·W + w` into its input plane (i64), as PyTorch's `return_indices=True`;
    /// the backward pass scatters gradients to these positions.
    pub fn max_pool2d_with_indices(
        &self,
        opts: &MaxPool2dOptions,
    ) -> Result<(RawTensor, RawTensor)> {
        let _op = crate::profile::op1("max_pool2d_with_indices", self);
        let (x4, p, batched) = pool_setup(
            self,
            "max_pool2d",
            opts.kernel,
            opts.stride,
            opts.padding,
            opts.dilation,
            opts.ceil_mode,
        )?;
        let shape = out_shape(&x4, &p, batched)?;
        let l: Layout = x4.layout().clone();
        let (v, i) = x4.with_storage(|s, _| s.max_pool2d(&l, &p))?;
        Ok((
            RawTensor::from_storage(v, shape.clone()),
            RawTensor::from_storage(i, shape),
        ))
    }

    /// Average pooling over `[N, C, H, W]` (or unbatched `[C, H, W]`), as
    /// `torch.nn.functional.avg_pool2d`.
    ///
    /// ```
    /// use ember_tensor::{AvgPool2dOptions, Tensor};
    /// let x = Tensor::ones([1, 1, 2, 2], ())?;
    /// let y = x.avg_pool2d(&AvgPool2dOptions::new(2).stride(1).padding(1))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.25, 0.5, 0.25, 0.5, 1.0, 0.5, 0.25, 0.5, 0.25]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn avg_pool2d(&self, opts: &AvgPool2dOptions) -> Result<RawTensor> {
        let _op = crate::profile::op1("avg_pool2d", self);
        let (x4, p, batched) = pool_setup(
            self,
            "avg_pool2d",
            opts.kernel,
            opts.stride,
            opts.padding,
            Size2(1, 1),
            opts.ceil_mode,
        )?;
        let divisor = match (opts.divisor_override, opts.count_include_pad) {
            (Some(0), _) => {
                return Err(TensorError::invalid(
                    "avg_pool2d",
                    "divisor must be not zero",
                ));
            }
            (Some(d), _) => AvgDivisor::Override(d),
            (None, true) => AvgDivisor::IncludePad,
            (None, false) => AvgDivisor::ExcludePad,
        };
        let shape = out_shape(&x4, &p, batched)?;
        let l: Layout = x4.layout().clone();
        let s = x4.with_storage(|s, _| s.avg_pool2d(&l, &p, divisor))?;
        Ok(RawTensor::from_storage(s, shape))
    }
}
