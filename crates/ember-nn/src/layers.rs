//! Layers (`torch.nn`): `Linear`, activations, `Dropout`, `Sequential`, `Flatten`,
//! `Embedding`, `LayerNorm`, `BatchNorm1d`/`BatchNorm2d`, `Conv2d`, pooling.
//!
//! Constructors take PyTorch's arguments plus `opts` (`()` for f32 on the cpu, a `Device`,
//! a `DType`, or `(Device, DType)`), as `device=` and `dtype=` in PyTorch. Initialisation is
//! PyTorch's: `Linear` and `Conv2d` draw weight and bias from `U(-1/√fan_in, 1/√fan_in)`,
//! `Embedding` from `N(0, 1)`, norms start at weight 1 and bias 0.

use ember_tensor::{
    AvgPool2dOptions, Conv2dOptions, DType, MaxPool2dOptions, Options, Padding, Size2,
    Tensor as Raw,
};

use crate::init::{self, FanMode, Nonlinearity};
use crate::module::{TrainingFlag, check_device, parameter, prefix_error};
use crate::{Module, NnError, Result, Tensor};

fn float_options(
    op: &'static str,
    opts: impl Into<Options>,
) -> Result<(DType, ember_device::Device)> {
    let o = opts.into();
    let dtype = o.dtype.unwrap_or(DType::F32);
    if !dtype.is_float() {
        return Err(NnError::invalid(
            op,
            format!("parameters must be floating point, found dtype {dtype}"),
        )
        .into());
    }
    Ok((dtype, o.device))
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// `y = x Wᵀ + b` over the last dimension (`torch.nn.Linear`).
#[derive(Debug)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, if the layer has a bias.
    pub bias: Option<Tensor>,
    in_features: usize,
    out_features: usize,
}

impl Linear {
    /// A linear layer with a bias.
    pub fn new(in_features: usize, out_features: usize, opts: impl Into<Options>) -> Result<Self> {
        Self::with_bias(in_features, out_features, true, opts)
    }

    /// A linear layer, with a bias or not (`bias=False`).
    pub fn with_bias(
        in_features: usize,
        out_features: usize,
        bias: bool,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options("Linear", opts)?;
        let weight = parameter(Raw::empty([out_features, in_features], (device, dtype))?)?;
        if in_features > 0 {
            init::kaiming_uniform_(
                &weight,
                5f64.sqrt(),
                FanMode::FanIn,
                Nonlinearity::LeakyRelu(0.0),
            )?;
        }
        let bias = if bias {
            let b = parameter(Raw::zeros([out_features], (device, dtype))?)?;
            if in_features > 0 {
                let bound = 1.0 / (in_features as f64).sqrt();
                init::uniform_(&b, -bound, bound)?;
            }
            Some(b)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            in_features,
            out_features,
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_device("Linear", "weight", &self.weight, x)?;
        let last = x.dims().last().copied();
        if last != Some(self.in_features) {
            return Err(NnError::invalid(
                "Linear",
                format!(
                    "expected input with last dimension {} (in_features), found shape {}",
                    self.in_features,
                    x.shape()
                ),
            )
            .into());
        }
        let y = x.matmul(&self.weight.t()?)?;
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }
    fn name(&self) -> &'static str {
        "Linear"
    }
    fn extra_repr(&self) -> String {
        format!(
            "in_features={}, out_features={}, bias={}",
            self.in_features,
            self.out_features,
            py_bool(self.bias.is_some())
        )
    }
    fn local_parameters(&self) -> Vec<(&'static str, Tensor)> {
        let mut v = vec![("weight", self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias", b.clone()));
        }
        v
    }
}

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => |$x:ident| $body:expr;)*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Default, Clone, Copy)]
            pub struct $name;

            impl $name {
                /// The activation.
                pub fn new() -> Self {
                    $name
                }
            }

            impl Module for $name {
                fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                    Ok($body?)
                }
                fn name(&self) -> &'static str {
                    stringify!($name)
                }
            }
        )*
    };
}

activation! {
    /// `max(x, 0)`.
    ReLU => |x| x.relu();
    /// `x · σ(x)` (`torch.nn.SiLU`).
    SiLU => |x| x.silu();
    /// The logistic function.
    Sigmoid => |x| x.sigmoid();
    /// The hyperbolic tangent.
    Tanh => |x| x.tanh();
}

/// GELU, exact (`erf`, the default) or with the tanh approximation.
#[derive(Debug, Default, Clone, Copy)]
pub struct GELU {
    tanh: bool,
}

impl GELU {
    /// The exact form (`approximate='none'`).
    pub fn new() -> Self {
        GELU { tanh: false }
    }

    /// The tanh approximation (`approximate='tanh'`).
    pub fn tanh_approximation() -> Self {
        GELU { tanh: true }
    }
}

impl Module for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(if self.tanh {
            x.gelu(ember_tensor::Approximate::Tanh)?
        } else {
            x.gelu(())?
        })
    }
    fn name(&self) -> &'static str {
        "GELU"
    }
    fn extra_repr(&self) -> String {
        format!("approximate='{}'", if self.tanh { "tanh" } else { "none" })
    }
}

/// Zeroes elements with probability `p` in training, scaling the rest by `1/(1-p)`; the
/// identity in eval mode. Masks come from the device's default generator.
#[derive(Debug)]
pub struct Dropout {
    p: f64,
    training: TrainingFlag,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`.
    pub fn new(p: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            return Err(NnError::invalid(
                "Dropout",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            )
            .into());
        }
        Ok(Dropout {
            p,
            training: TrainingFlag::default(),
        })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.dropout(self.p, self.training.get())
    }
    fn name(&self) -> &'static str {
        "Dropout"
    }
    fn extra_repr(&self) -> String {
        format!("p={}, inplace=False", self.p)
    }
    fn set_training(&self, on: bool) {
        self.training.set(on);
    }
    fn is_training(&self) -> bool {
        self.training.get()
    }
}

/// Flattens dimensions `start..=end` (by default all but the batch dimension).
#[derive(Debug, Clone, Copy)]
pub struct Flatten {
    start: isize,
    end: isize,
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten { start: 1, end: -1 }
    }
}

impl Flatten {
    /// `Flatten(start_dim=1, end_dim=-1)`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Flattens `start..=end` (negative dims count from the end).
    pub fn dims(start: isize, end: isize) -> Self {
        Flatten { start, end }
    }
}

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(self.start, self.end)
    }
    fn name(&self) -> &'static str {
        "Flatten"
    }
    fn extra_repr(&self) -> String {
        format!("start_dim={}, end_dim={}", self.start, self.end)
    }
}

/// Children run in order (`torch.nn.Sequential`); named `"0"`, `"1"`, ...
#[derive(Debug, Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
    training: TrainingFlag,
}

impl Sequential {
    /// An empty sequence (the identity).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a layer.
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Module + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    /// Appends a boxed layer.
    pub fn push(&mut self, layer: Box<dyn Module>) {
        self.layers.push(layer);
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The layer at `index`.
    pub fn get(&self, index: usize) -> Option<&dyn Module> {
        self.layers.get(index).map(|b| b.as_ref())
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            y = layer
                .forward(&y)
                .map_err(|e| prefix_error(&i.to_string(), e))?;
        }
        Ok(y)
    }
    fn name(&self) -> &'static str {
        "Sequential"
    }
    fn named_children(&self) -> Vec<(String, &dyn Module)> {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), l.as_ref()))
            .collect()
    }
    fn set_training(&self, on: bool) {
        self.training.set(on);
    }
    fn is_training(&self) -> bool {
        self.training.get()
    }
}

/// A lookup table of `num_embeddings` vectors of size `embedding_dim`; the input is
/// integer indices of any shape.
#[derive(Debug)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`, initialised from `N(0, 1)`.
    pub weight: Tensor,
}

impl Embedding {
    /// A table with standard-normal rows.
    pub fn new(
        num_embeddings: usize,
        embedding_dim: usize,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options("Embedding", opts)?;
        let weight = parameter(Raw::randn(
            [num_embeddings, embedding_dim],
            (device, dtype),
        )?)?;
        Ok(Embedding { weight })
    }
}

impl Module for Embedding {
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        check_device("Embedding", "weight", &self.weight, indices)?;
        self.weight.embedding(indices)
    }
    fn name(&self) -> &'static str {
        "Embedding"
    }
    fn extra_repr(&self) -> String {
        let d = self.weight.dims();
        format!("{}, {}", d[0], d[1])
    }
    fn local_parameters(&self) -> Vec<(&'static str, Tensor)> {
        vec![("weight", self.weight.clone())]
    }
}

/// Normalises over the last dimensions (`normalized_shape`) of each sample, then scales
/// and shifts elementwise (`torch.nn.LayerNorm`, biased variance).
#[derive(Debug)]
pub struct LayerNorm {
    /// Scale, `normalized_shape`, starts at 1 (absent without elementwise affine).
    pub weight: Option<Tensor>,
    /// Shift, starts at 0.
    pub bias: Option<Tensor>,
    normalized_shape: Vec<usize>,
    eps: f64,
}

impl LayerNorm {
    /// `LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True)`.
    pub fn new(normalized_shape: &[usize], opts: impl Into<Options>) -> Result<Self> {
        Self::with_options(normalized_shape, 1e-5, true, opts)
    }

    /// With a chosen `eps` and with or without the affine parameters.
    pub fn with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options("LayerNorm", opts)?;
        if normalized_shape.is_empty() {
            return Err(NnError::invalid("LayerNorm", "normalized_shape must not be empty").into());
        }
        let (weight, bias) = if elementwise_affine {
            (
                Some(parameter(Raw::ones(normalized_shape, (device, dtype))?)?),
                Some(parameter(Raw::zeros(normalized_shape, (device, dtype))?)?),
            )
        } else {
            (None, None)
        };
        Ok(LayerNorm {
            weight,
            bias,
            normalized_shape: normalized_shape.to_vec(),
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let k = self.normalized_shape.len();
        if dims.len() < k || dims[dims.len() - k..] != self.normalized_shape[..] {
            return Err(NnError::invalid(
                "LayerNorm",
                format!(
                    "expected input with shape [*, {}], found {}",
                    self.normalized_shape
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    x.shape()
                ),
            )
            .into());
        }
        if let Some(w) = &self.weight {
            check_device("LayerNorm", "weight", w, x)?;
        }
        let axes: Vec<usize> = (dims.len() - k..dims.len()).collect();
        let mean = x.mean((axes.as_slice(), true))?;
        let var = x.var_correction((axes.as_slice(), true), 0.0)?;
        let mut y = x.sub(&mean)?.mul(&var.add(self.eps)?.rsqrt()?)?;
        if let (Some(w), Some(b)) = (&self.weight, &self.bias) {
            y = y.mul(w)?.add(b)?;
        }
        Ok(y)
    }
    fn name(&self) -> &'static str {
        "LayerNorm"
    }
    fn extra_repr(&self) -> String {
        format!(
            "({},), eps={}, elementwise_affine={}",
            self.normalized_shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            self.eps,
            py_bool(self.weight.is_some())
        )
    }
    fn local_parameters(&self) -> Vec<(&'static str, Tensor)> {
        let mut v = Vec::new();
        if let Some(w) = &self.weight {
            v.push(("weight", w.clone()));
        }
        if let Some(b) = &self.bias {
            v.push(("bias", b.clone()));
        }
        v
    }
}

/// Batch normalisation over the channel dimension 1: in training, with the batch's
/// statistics (biased variance), updating the running mean and (unbiased) running variance
/// with `momentum`; in eval, with the running statistics. `BatchNorm1d` takes `[N, C]` or
/// `[N, C, L]`, `BatchNorm2d` takes `[N, C, H, W]`.
#[derive(Debug)]
pub struct BatchNorm {
    /// Scale per channel, starts at 1.
    pub weight: Option<Tensor>,
    /// Shift per channel, starts at 0.
    pub bias: Option<Tensor>,
    /// Running mean per channel (a buffer), starts at 0.
    pub running_mean: Tensor,
    /// Running variance per channel (a buffer), starts at 1.
    pub running_var: Tensor,
    /// How many training batches updated the running statistics (an i64 buffer).
    pub num_batches_tracked: Tensor,
    num_features: usize,
    eps: f64,
    momentum: f64,
    ranks: &'static [usize],
    name: &'static str,
    training: TrainingFlag,
}

/// `torch.nn.BatchNorm1d`: input `[N, C]` or `[N, C, L]`.
pub type BatchNorm1d = BatchNorm;
/// `torch.nn.BatchNorm2d`: input `[N, C, H, W]`.
pub type BatchNorm2d = BatchNorm;

impl BatchNorm {
    /// `BatchNorm1d(num_features, eps=1e-5, momentum=0.1, affine=True)`.
    pub fn new_1d(num_features: usize, opts: impl Into<Options>) -> Result<Self> {
        Self::build("BatchNorm1d", &[2, 3], num_features, 1e-5, 0.1, opts)
    }

    /// `BatchNorm2d(num_features, eps=1e-5, momentum=0.1, affine=True)`.
    pub fn new_2d(num_features: usize, opts: impl Into<Options>) -> Result<Self> {
        Self::build("BatchNorm2d", &[4], num_features, 1e-5, 0.1, opts)
    }

    /// With a chosen `eps` and `momentum` (the weight of the new batch in the running
    /// statistics).
    pub fn with_eps_momentum(mut self, eps: f64, momentum: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&momentum) || eps.is_nan() || eps < 0.0 {
            return Err(NnError::invalid(
                self.name,
                format!(
                    "expected eps >= 0 and momentum in [0, 1], found eps={eps}, momentum={momentum}"
                ),
            )
            .into());
        }
        self.eps = eps;
        self.momentum = momentum;
        Ok(self)
    }

    fn build(
        name: &'static str,
        ranks: &'static [usize],
        c: usize,
        eps: f64,
        momentum: f64,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options(name, opts)?;
        let buffer = |r: Raw| Tensor::wrap(r);
        Ok(BatchNorm {
            weight: Some(parameter(Raw::ones([c], (device, dtype))?)?),
            bias: Some(parameter(Raw::zeros([c], (device, dtype))?)?),
            running_mean: buffer(Raw::zeros([c], (device, dtype))?),
            running_var: buffer(Raw::ones([c], (device, dtype))?),
            num_batches_tracked: buffer(Raw::zeros([], (device, DType::I64))?),
            num_features: c,
            eps,
            momentum,
            ranks,
            name,
            training: TrainingFlag::default(),
        })
    }
}

impl Module for BatchNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        if !self.ranks.contains(&dims.len()) || dims[1] != self.num_features {
            let want = if self.ranks == [4] {
                "[N, C, H, W]"
            } else {
                "[N, C] or [N, C, L]"
            };
            return Err(NnError::invalid(
                self.name,
                format!(
                    "expected input {want} with C = {}, found shape {}",
                    self.num_features,
                    x.shape()
                ),
            )
            .into());
        }
        check_device(self.name, "running_mean", &self.running_mean, x)?;
        let mut bshape = vec![1usize; dims.len()];
        bshape[1] = self.num_features;
        let axes: Vec<usize> = (0..dims.len()).filter(|&d| d != 1).collect();
        let (mean, var) = if self.training.get() {
            let n: usize = axes.iter().map(|&d| dims[d]).product();
            if n <= 1 {
                return Err(NnError::invalid(
                    self.name,
                    format!(
                        "Expected more than 1 value per channel when training, got input size {}",
                        x.shape()
                    ),
                )
                .into());
            }
            let mean = x.mean((axes.as_slice(), true))?;
            let var = x.var_correction((axes.as_slice(), true), 0.0)?;
            {
                let _guard = ember_autograd::no_grad();
                let m = self.momentum;
                let bm = mean.data().reshape([self.num_features])?;
                let bv = var
                    .data()
                    .reshape([self.num_features])?
                    .mul(n as f64 / (n - 1) as f64)?;
                let rm = self.running_mean.data();
                let rv = self.running_var.data();
                rm.copy_(&rm.mul(1.0 - m)?.add(&bm.mul(m)?)?)?;
                rv.copy_(&rv.mul(1.0 - m)?.add(&bv.mul(m)?)?)?;
                let nb = self.num_batches_tracked.data();
                nb.copy_(&nb.add(1)?)?;
            }
            (mean, var)
        } else {
            (
                self.running_mean.reshape(bshape.as_slice())?,
                self.running_var.reshape(bshape.as_slice())?,
            )
        };
        let mut y = x.sub(&mean)?.mul(&var.add(self.eps)?.rsqrt()?)?;
        if let (Some(w), Some(b)) = (&self.weight, &self.bias) {
            y = y
                .mul(&w.reshape(bshape.as_slice())?)?
                .add(&b.reshape(bshape.as_slice())?)?;
        }
        Ok(y)
    }
    fn name(&self) -> &'static str {
        self.name
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, eps={}, momentum={}, affine=True, track_running_stats=True",
            self.num_features, self.eps, self.momentum
        )
    }
    fn local_parameters(&self) -> Vec<(&'static str, Tensor)> {
        let mut v = Vec::new();
        if let Some(w) = &self.weight {
            v.push(("weight", w.clone()));
        }
        if let Some(b) = &self.bias {
            v.push(("bias", b.clone()));
        }
        v
    }
    fn local_buffers(&self) -> Vec<(&'static str, Tensor)> {
        vec![
            ("running_mean", self.running_mean.clone()),
            ("running_var", self.running_var.clone()),
            ("num_batches_tracked", self.num_batches_tracked.clone()),
        ]
    }
    fn set_training(&self, on: bool) {
        self.training.set(on);
    }
    fn is_training(&self) -> bool {
        self.training.get()
    }
}

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
#[derive(Debug)]
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kH, kW]`.
    pub weight: Tensor,
    /// `[out_channels]`.
    pub bias: Option<Tensor>,
    in_channels: usize,
    out_channels: usize,
    kernel: Size2,
    config: Conv2dConfig,
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
    fn name(&self) -> &'static str {
        "Conv2d"
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
    fn local_parameters(&self) -> Vec<(&'static str, Tensor)> {
        let mut v = vec![("weight", self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias", b.clone()));
        }
        v
    }
}

/// 2-D max pooling (`torch.nn.MaxPool2d`).
#[derive(Debug, Clone, Copy)]
pub struct MaxPool2d {
    opts: MaxPool2dOptions,
}

impl MaxPool2d {
    /// Pooling with a `kernel` (stride defaults to the kernel size).
    pub fn new(kernel: impl Into<Size2>) -> Self {
        MaxPool2d {
            opts: MaxPool2dOptions::new(kernel),
        }
    }

    /// Pooling with all of PyTorch's options.
    pub fn with_options(opts: MaxPool2dOptions) -> Self {
        MaxPool2d { opts }
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(&self.opts)
    }
    fn name(&self) -> &'static str {
        "MaxPool2d"
    }
    fn extra_repr(&self) -> String {
        let k = self.opts.kernel;
        let s = self.opts.stride.unwrap_or(k);
        format!(
            "kernel_size=({}, {}), stride=({}, {}), padding=({}, {})",
            k.0, k.1, s.0, s.1, self.opts.padding.0, self.opts.padding.1
        )
    }
}

/// 2-D average pooling (`torch.nn.AvgPool2d`).
#[derive(Debug, Clone, Copy)]
pub struct AvgPool2d {
    opts: AvgPool2dOptions,
}

impl AvgPool2d {
    /// Pooling with a `kernel` (stride defaults to the kernel size).
    pub fn new(kernel: impl Into<Size2>) -> Self {
        AvgPool2d {
            opts: AvgPool2dOptions::new(kernel),
        }
    }

    /// Pooling with all of PyTorch's options.
    pub fn with_options(opts: AvgPool2dOptions) -> Self {
        AvgPool2d { opts }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(&self.opts)
    }
    fn name(&self) -> &'static str {
        "AvgPool2d"
    }
    fn extra_repr(&self) -> String {
        let k = self.opts.kernel;
        let s = self.opts.stride.unwrap_or(k);
        format!("kernel_size=({}, {}), stride=({}, {})", k.0, k.1, s.0, s.1)
    }
}
