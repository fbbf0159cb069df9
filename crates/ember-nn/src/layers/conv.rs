//! `Conv2d`, with PyTorch's keyword arguments as builder methods.

use ember_tensor::{Conv2dOptions, Options, Padding, Size2, Tensor as Raw};

use super::float_options;
use crate::init::{self, FanMode, Nonlinearity};
use crate::module::{check_device, parameter};
use crate::{Module, ModuleHooks, NnError, Result, Tensor, TrainingFlag};

/// What [`Conv2d::with_config`] takes beyond the channel counts and kernel size (the
/// builder methods [`Conv2d::stride`], [`Conv2d::padding`], ... set the same).
#[derive(Clone, Copy, Debug)]
pub struct Conv2dConfig {
    /// Step of the kernel.
    pub stride: Size2,
    /// Zero padding on each side, or [`Padding::Same`], [`Padding::Valid`].
    pub padding: Padding,
    /// Spacing of the kernel's taps.
    pub dilation: Size2,
    /// Channel groups: `in_channels` and `out_channels` must both divide by it.
    pub groups: usize,
    /// Whether the layer has a bias.
    pub bias: bool,
}

impl Default for Conv2dConfig {
    fn default() -> Self {
        Conv2dConfig {
            stride: Size2(1, 1),
            padding: Padding::Explicit(Size2(0, 0)),
            dilation: Size2(1, 1),
            groups: 1,
            bias: true,
        }
    }
}

/// What [`Conv2d::padding`] takes: a size (`1`, `(1, 2)`), `"same"`, `"valid"`, or a
/// [`Padding`], as PyTorch's `padding=`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddingArg(std::result::Result<Padding, String>);

macro_rules! padding_from_size {
    ($($t:ty),*) => {$(
        impl From<$t> for PaddingArg {
            fn from(v: $t) -> Self {
                PaddingArg(Ok(Padding::Explicit(v.into())))
            }
        }
    )*};
}
padding_from_size!(usize, (usize, usize), [usize; 2], Size2);

impl From<Padding> for PaddingArg {
    fn from(p: Padding) -> Self {
        PaddingArg(Ok(p))
    }
}

impl From<&str> for PaddingArg {
    /// `"same"` or `"valid"`; another string makes the layer's forward an error, in
    /// PyTorch's words.
    fn from(s: &str) -> Self {
        PaddingArg(match s {
            "same" => Ok(Padding::Same),
            "valid" => Ok(Padding::Valid),
            other => Err(format!(
                "Invalid padding string '{other}', should be one of {{'valid', 'same'}}"
            )),
        })
    }
}

/// 2-D convolution over `[N, C, H, W]` (`torch.nn.Conv2d`). PyTorch's keyword arguments
/// are builder methods: `nn.Conv2d(1, 16, 3, stride=2, padding=1, bias=False)` is
///
/// ```
/// use ember_nn::layers::Conv2d;
/// use ember_nn::{Module, Tensor};
/// let conv = Conv2d::new(1, 16, 3, ())?.stride(2).padding(1).bias(false);
/// assert_eq!(conv.call(&Tensor::randn([2, 1, 8, 8], ())?)?.dims(), [2, 16, 4, 4]);
/// assert_eq!(
///     conv.to_string(),
///     "Conv2d(1, 16, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)"
/// );
/// let same = Conv2d::new(4, 8, (3, 5), ())?.padding("same").dilation(2).groups(2)?;
/// assert_eq!(same.call(&Tensor::randn([1, 4, 9, 9], ())?)?.dims(), [1, 8, 9, 9]);
/// assert_eq!(same.weight.dims(), [8, 2, 3, 5]);
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug, Module)]
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kH, kW]`.
    #[param]
    pub weight: Tensor,
    /// `[out_channels]`.
    #[param]
    pub bias: Option<Tensor>,
    in_channels: usize,
    out_channels: usize,
    #[module(skip)]
    kernel: Size2,
    #[module(skip)]
    config: Conv2dConfig,
    /// Why a builder call was refused (a bad padding string), reported by `forward`.
    invalid: Option<String>,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Conv2d {
    /// `nn.Conv2d(in_channels, out_channels, kernel_size)`: stride 1, no padding, one group
    /// and a bias; `opts` as every layer's (`()`, a `Device`, a `DType`). The other options
    /// are builder methods ([`stride`](Conv2d::stride), [`padding`](Conv2d::padding),
    /// [`dilation`](Conv2d::dilation), [`groups`](Conv2d::groups), [`bias`](Conv2d::bias)).
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: impl Into<Size2>,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        Self::with_config(
            in_channels,
            out_channels,
            kernel,
            Conv2dConfig::default(),
            opts,
        )
    }

    /// A convolution with stride, padding, dilation, groups and bias chosen.
    pub fn with_config(
        in_channels: usize,
        out_channels: usize,
        kernel: impl Into<Size2>,
        config: Conv2dConfig,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options("Conv2d", opts)?;
        let kernel = kernel.into();
        let g = config.groups;
        if g == 0 || !in_channels.is_multiple_of(g) || !out_channels.is_multiple_of(g) {
            return Err(NnError::invalid(
                "Conv2d",
                format!(
                    "in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({g})"
                ),
            ).into());
        }
        let shape = [out_channels, in_channels / g, kernel.0, kernel.1];
        let weight = parameter(Raw::empty(shape, (device, dtype))?)?;
        let fan_in = in_channels / g * kernel.0 * kernel.1;
        if fan_in > 0 {
            init::kaiming_uniform_(
                &weight,
                5f64.sqrt(),
                FanMode::FanIn,
                Nonlinearity::LeakyRelu(0.0),
            )?;
        }
        let bias = if config.bias {
            let b = parameter(Raw::zeros([out_channels], (device, dtype))?)?;
            if fan_in > 0 {
                let bound = 1.0 / (fan_in as f64).sqrt();
                init::uniform_(&b, -bound, bound)?;
            }
            Some(b)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            in_channels,
            out_channels,
            kernel,
            config,
            invalid: None,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }

    /// `stride=`: a number or a pair.
    pub fn stride(mut self, stride: impl Into<Size2>) -> Self {
        self.config.stride = stride.into();
        self
    }

    /// `padding=`: a number, a pair, `"same"` (the output keeps the input's size; stride
    /// 1 only) or `"valid"` (none). Another string makes `forward` an error.
    pub fn padding(mut self, padding: impl Into<PaddingArg>) -> Self {
        match padding.into().0 {
            Ok(p) => self.config.padding = p,
            Err(e) => self.invalid = Some(e),
        }
        self
    }

    /// `dilation=`: a number or a pair.
    pub fn dilation(mut self, dilation: impl Into<Size2>) -> Self {
        self.config.dilation = dilation.into();
        self
    }

    /// `bias=False` drops the bias (a layer starts with one; `bias(true)` keeps it).
    pub fn bias(mut self, bias: bool) -> Self {
        if !bias {
            self.bias = None;
        }
        self.config.bias = self.bias.is_some();
        self
    }

    /// `groups=`: the weight is made anew for the grouped shape
    /// `[out, in / groups, kH, kW]` (with PyTorch's initialisation for its fan-in), on the
    /// same device and dtype; an error unless both channel counts divide by `groups`.
    pub fn groups(self, groups: usize) -> Result<Self> {
        if groups == self.config.groups {
            return Ok(self);
        }
        let w = self.weight.data();
        let config = Conv2dConfig {
            groups,
            ..self.config
        };
        let fresh = Conv2d::with_config(
            self.in_channels,
            self.out_channels,
            self.kernel,
            config,
            (w.device(), w.dtype()),
        )?;
        Ok(Conv2d {
            invalid: self.invalid,
            training: self.training,
            hooks: self.hooks,
            ..fresh
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(e) = &self.invalid {
            return Err(NnError::invalid("Conv2d", e.clone()).into());
        }
        check_device("Conv2d", "weight", &self.weight, x)?;
        let opts = Conv2dOptions {
            stride: self.config.stride,
            padding: self.config.padding,
            dilation: self.config.dilation,
            groups: self.config.groups,
        };
        x.conv2d(&self.weight, self.bias.as_ref(), &opts)
    }
    fn extra_repr(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "{}, {}, kernel_size=({}, {}), stride=({}, {})",
            self.in_channels,
            self.out_channels,
            self.kernel.0,
            self.kernel.1,
            c.stride.0,
            c.stride.1
        );
        match c.padding {
            Padding::Explicit(Size2(0, 0)) => {}
            Padding::Explicit(p) => s += &format!(", padding=({}, {})", p.0, p.1),
            Padding::Same => s += ", padding=same",
            Padding::Valid => s += ", padding=valid",
        }
        if c.dilation != Size2(1, 1) {
            s += &format!(", dilation=({}, {})", c.dilation.0, c.dilation.1);
        }
        if c.groups != 1 {
            s += &format!(", groups={}", c.groups);
        }
        if !c.bias {
            s += ", bias=False";
        }
        s
    }
}
