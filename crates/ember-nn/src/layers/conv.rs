//! `Conv2d`.

use ember_tensor::{Conv2dOptions, Options, Padding, Size2, Tensor as Raw};

use super::float_options;
use crate::init::{self, FanMode, Nonlinearity};
use crate::module::{check_device, parameter};
use crate::{Module, ModuleHooks, NnError, Result, Tensor, TrainingFlag};

/// What [`Conv2d::new`] takes beyond the channel counts and kernel size.
#[derive(Clone, Copy, Debug)]
pub struct Conv2dConfig {
    /// Step of the kernel.
    pub stride: Size2,
    /// Zero padding on each side.
    pub padding: Size2,
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
            padding: Size2(0, 0),
            dilation: Size2(1, 1),
            groups: 1,
            bias: true,
        }
    }
}

/// 2-D convolution over `[N, C, H, W]` (`torch.nn.Conv2d`).
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
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl Conv2d {
    /// A convolution with stride 1, no padding, one group and a bias.
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
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_device("Conv2d", "weight", &self.weight, x)?;
        let opts = Conv2dOptions {
            stride: self.config.stride,
            padding: Padding::from(self.config.padding),
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
        if c.padding != Size2(0, 0) {
            s += &format!(", padding=({}, {})", c.padding.0, c.padding.1);
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
