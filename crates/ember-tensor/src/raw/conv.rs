//! `conv2d` with PyTorch's arguments and checks: stride, padding (numbers, `"same"`,
//! `"valid"`), dilation, groups, optional bias, batched `[N, C, H, W]` or unbatched
//! `[C, H, W]` input. The CPU kernels are in `cpu/conv/` (oneDNN where it loads, else
//! im2col + GEMM).

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::params::Conv2dParams;
use crate::raw::{RawTensor, same_device};
use crate::shape::Shape;
use crate::storage::read_many;

/// A pair of sizes for the two spatial dims (height, width); a single number means both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size2(pub usize, pub usize);

impl From<usize> for Size2 {
    fn from(v: usize) -> Self {
        Size2(v, v)
    }
}

impl From<(usize, usize)> for Size2 {
    fn from((h, w): (usize, usize)) -> Self {
        Size2(h, w)
    }
}

impl From<[usize; 2]> for Size2 {
    fn from([h, w]: [usize; 2]) -> Self {
        Size2(h, w)
    }
}

/// Padding of a convolution, as PyTorch's `padding` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Zeros on both sides of each spatial dim (height, width).
    Explicit(Size2),
    /// `"same"`: the output has the input's size (stride must be 1). Odd total padding
    /// puts the extra row/column at the end, as PyTorch.
    Same,
    /// `"valid"`: no padding.
    Valid,
}

impl Default for Padding {
    fn default() -> Self {
        Padding::Explicit(Size2(0, 0))
    }
}

impl<T: Into<Size2>> From<T> for Padding {
    fn from(v: T) -> Self {
        Padding::Explicit(v.into())
    }
}

/// Options of [`Tensor::conv2d`]; defaults as PyTorch (stride 1, padding 0, dilation 1,
/// groups 1).
///
/// ```
/// use ember_tensor::{Conv2dOptions, Padding};
/// let o = Conv2dOptions::new().stride(2).padding(1).dilation((1, 2)).groups(1);
/// assert_eq!(o.padding, Padding::Explicit((1, 1).into()));
/// let same = Conv2dOptions::new().padding(Padding::Same);
/// # let _ = same;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Stride (height, width).
    pub stride: Size2,
    /// Padding.
    pub padding: Padding,
    /// Dilation (height, width).
    pub dilation: Size2,
    /// Number of groups: input and output channels split into this many independent sets.
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: Size2(1, 1),
            padding: Padding::default(),
            dilation: Size2(1, 1),
            groups: 1,
        }
    }
}

impl Conv2dOptions {
    /// PyTorch's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the stride.
    pub fn stride(mut self, s: impl Into<Size2>) -> Self {
        self.stride = s.into();
        self
    }

    /// Sets the padding (a number, a pair, [`Padding::Same`] or [`Padding::Valid`]).
    pub fn padding(mut self, p: impl Into<Padding>) -> Self {
        self.padding = p.into();
        self
    }

    /// Sets the dilation.
    pub fn dilation(mut self, d: impl Into<Size2>) -> Self {
        self.dilation = d.into();
        self
    }

    /// Sets the number of groups.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

fn invalid(msg: String) -> TensorError {
    TensorError::invalid("conv2d", msg)
}

fn mismatch(msg: String) -> TensorError {
    TensorError::ShapeMismatch { op: "conv2d", msg }
}

impl RawTensor {
    /// 2-D cross-correlation of `self` (`[N, C, H, W]`, or unbatched `[C, H, W]`) with
    /// `weight` (`[O, C/groups, kH, kW]`) plus `bias` (`[O]`), as `torch.nn.functional.conv2d`.
    /// Output `[N, O, H_out, W_out]` (or `[O, H_out, W_out]`) with
    /// `H_out = (H + 2·pad - dilation·(kH - 1) - 1) / stride + 1`. Floating dtypes only,
    /// all three tensors of one dtype; f16/bf16 compute in f32.
    ///
    /// ```
    /// use ember_tensor::{Conv2dOptions, Device, Tensor};
    /// let x = Tensor::arange(0f32, 16., ())?.reshape([1, 1, 4, 4])?;
    /// let w = Tensor::ones([1, 1, 2, 2], ())?;
    /// let y = x.conv2d(&w, None, &Conv2dOptions::new().stride(2))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![10., 18., 42., 50.]);
    /// let e = Tensor::ones([1, 4, 8, 8], ())?
    ///     .conv2d(&Tensor::ones([16, 3, 3, 3], ())?, None, &Conv2dOptions::new())
    ///     .unwrap_err();
    /// assert!(e.to_string().starts_with(
    ///     "conv2d: expected weight with C/groups = 3 input channels, but input [1, 4, 8, 8] has 4"));
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn conv2d(
        &self,
        weight: &RawTensor,
        bias: Option<&RawTensor>,
        opts: &Conv2dOptions,
    ) -> Result<RawTensor> {
        let mut all = vec![self, weight];
        all.extend(bias);
        let _op = crate::profile::op(
            "conv2d",
            &[
                self.as_input(),
                weight.as_input(),
                bias.map_or(crate::profile::Input::Other, RawTensor::as_input),
            ],
        );
        same_device(&all)?;
        let (xs, ws) = (self.shape(), weight.shape());
        if weight.rank() != 4 {
            return Err(mismatch(format!(
                "expected a 4-D weight [O, C/groups, kH, kW], but got weight {ws}"
            )));
        }
        let batched = match self.rank() {
            4 => true,
            3 => false,
            r => {
                return Err(mismatch(format!(
                    "expected 3-D (unbatched) or 4-D (batched) input to conv2d, but got {r}-D input {xs} (weight {ws})"
                )));
            }
        };
        for t in &all {
            if t.dtype() != self.dtype() {
                return Err(invalid(format!(
                    "input dtype {} and {} dtype {} should be the same",
                    self.dtype(),
                    if std::ptr::eq(*t, weight) {
                        "weight"
                    } else {
                        "bias"
                    },
                    t.dtype()
                )));
            }
        }
        if !matches!(
            self.dtype(),
            DType::F32 | DType::F64 | DType::F16 | DType::Bf16
        ) {
            return Err(TensorError::UnsupportedDType {
                op: "conv2d",
                dtype: self.dtype(),
                hint: "convolution needs a floating dtype; convert with to_dtype(DType::F32)",
            });
        }
        let x = if batched {
            self.clone()
        } else {
            self.unsqueeze(0)?
        };
        let &[n, c, h, w] = x.dims() else {
            return Err(mismatch(format!("unexpected input {xs}")));
        };
        let &[o, cg, kh, kw] = weight.dims() else {
            return Err(mismatch(format!("unexpected weight {ws}")));
        };
        if let Some(b) = bias
            && b.dims() != [o]
        {
            return Err(mismatch(format!(
                "expected bias of shape [{o}] for weight {ws}, but got bias {}",
                b.shape()
            )));
        }
        let p = geometry(xs, ws, [n, c, h, w], [o, cg, kh, kw], opts)?;
        let out_shape = Shape::from(vec![n, o, p.out.0, p.out.1]);
        out_shape.checked_numel("conv2d")?;
        let (lx, lw) = (x.layout().clone(), weight.layout().clone());
        let s = match bias {
            None => read_many(&[x.cell(), weight.cell()], |s| {
                s[0].conv2d(&lx, s[1], &lw, None, &p)
            })?,
            Some(b) => {
                let lb = b.layout().clone();
                read_many(&[x.cell(), weight.cell(), b.cell()], |s| {
                    s[0].conv2d(&lx, s[1], &lw, Some((s[2], &lb)), &p)
                })?
            }
        };
        let y = RawTensor::from_storage(s, out_shape);
        if batched { Ok(y) } else { y.squeeze_dim(0) }
    }
}

/// The geometry of a convolution of input `x` (`[N, C, H, W]`) with weight `w`
/// (`[O, C/groups, kH, kW]`) under `opts`, with PyTorch's checks and messages (`xs`, `ws`
/// are the shapes as the user passed them, for the messages).
pub(crate) fn geometry(
    xs: &Shape,
    ws: &Shape,
    [_n, c, h, w]: [usize; 4],
    [o, cg, kh, kw]: [usize; 4],
    opts: &Conv2dOptions,
) -> Result<Conv2dParams> {
    let Conv2dOptions {
        stride,
        padding,
        dilation,
        groups,
    } = *opts;
    if groups == 0 {
        return Err(invalid("non-positive groups is not supported".into()));
    }
    if stride.0 == 0 || stride.1 == 0 {
        return Err(invalid(format!(
            "non-positive stride is not supported, got stride ({}, {})",
            stride.0, stride.1
        )));
    }
    if dilation.0 == 0 || dilation.1 == 0 {
        return Err(invalid(format!(
            "dilation should be greater than zero, got dilation ({}, {})",
            dilation.0, dilation.1
        )));
    }
    if o % groups != 0 {
        return Err(mismatch(format!(
            "given groups = {groups}, expected weight {ws} to be divisible by {groups} at dimension 0"
        )));
    }
    if cg.checked_mul(groups) != Some(c) {
        return Err(mismatch(if groups == 1 {
            format!(
                "expected weight with C/groups = {cg} input channels, but input {xs} has {c} (weight {ws})"
            )
        } else {
            format!(
                "expected weight with C/groups = {} input channels (groups = {groups}), but input {xs} has {c} channels and weight {ws} has {cg}",
                c / groups
            )
        }));
    }
    // Effective kernel extent d·(k-1)+1 per dim.
    let ext = |k: usize, d: usize| k.saturating_sub(1).checked_mul(d).map(|v| v + 1);
    let (Some(eh), Some(ew)) = (ext(kh, dilation.0), ext(kw, dilation.1)) else {
        return Err(invalid(format!("kernel extent of weight {ws} overflows")));
    };
    // (pad_before, pad_total) per dim.
    let (ph, pw) = match padding {
        Padding::Explicit(p) => ((p.0, 2 * p.0), (p.1, 2 * p.1)),
        Padding::Valid => ((0, 0), (0, 0)),
        Padding::Same => {
            if stride != Size2(1, 1) {
                return Err(invalid(
                    "padding='same' is not supported for strided convolutions".into(),
                ));
            }
            let (th, tw) = (eh - 1, ew - 1);
            ((th / 2, th), (tw / 2, tw))
        }
    };
    let (hp, wp) = (h.saturating_add(ph.1), w.saturating_add(pw.1));
    if kh == 0 || kw == 0 || hp < eh || wp < ew {
        return Err(mismatch(format!(
            "calculated padded input size per channel: ({hp} x {wp}); kernel size: ({eh} x {ew}); kernel size can't be greater than actual input size (input {xs}, weight {ws})"
        )));
    }
    let out = ((hp - eh) / stride.0 + 1, (wp - ew) / stride.1 + 1);
    Ok(Conv2dParams {
        stride: (stride.0, stride.1),
        pad: (ph.0, pw.0),
        dilation: (dilation.0, dilation.1),
        groups,
        out,
    })
}
