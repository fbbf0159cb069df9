//! `LayerNorm`, `RMSNorm`, `BatchNorm1d`/`BatchNorm2d`/`BatchNorm3d`.

use std::marker::PhantomData;

use ember_tensor::{DType, Options, Tensor as Raw};

use super::{float_options, py_bool, py_float};
use crate::functional as F;
use crate::module::{check_device, parameter};
use crate::{Module, ModuleHooks, NnError, Result, Tensor, TrainingFlag};

/// Normalises over the last dimensions (`normalized_shape`) of each sample, then scales
/// and shifts elementwise (`torch.nn.LayerNorm`, biased variance).
#[derive(Debug, Module)]
pub struct LayerNorm {
    /// Scale, `normalized_shape`, starts at 1 (absent without elementwise affine).
    #[param]
    pub weight: Option<Tensor>,
    /// Shift, starts at 0.
    #[param]
    pub bias: Option<Tensor>,
    normalized_shape: Vec<usize>,
    eps: f64,
    training: TrainingFlag,
    hooks: ModuleHooks,
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
        Self::with_bias(normalized_shape, eps, elementwise_affine, true, opts)
    }

    /// `LayerNorm(normalized_shape, eps, elementwise_affine, bias)`: `bias=False` keeps the
    /// weight and drops the shift.
    pub fn with_bias(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options("LayerNorm", opts)?;
        if normalized_shape.is_empty() {
            return Err(NnError::invalid("LayerNorm", "normalized_shape must not be empty").into());
        }
        let o = (device, dtype);
        let weight = if elementwise_affine {
            Some(parameter(Raw::ones(normalized_shape, o)?)?)
        } else {
            None
        };
        let bias = if elementwise_affine && bias {
            Some(parameter(Raw::zeros(normalized_shape, o)?)?)
        } else {
            None
        };
        Ok(LayerNorm {
            weight,
            bias,
            normalized_shape: normalized_shape.to_vec(),
            eps,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(w) = &self.weight {
            check_device("LayerNorm", "weight", w, x)?;
        }
        F::layer_norm(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "({},), eps={}, elementwise_affine={}, bias={}",
            join(&self.normalized_shape),
            py_float(self.eps),
            py_bool(self.weight.is_some()),
            py_bool(self.bias.is_some())
        )
    }
}

/// Root-mean-square normalisation over the last dimensions (`normalized_shape`) of each
/// sample, then an elementwise scale (`torch.nn.RMSNorm(normalized_shape, eps=None,
/// elementwise_affine=True)`): `x / sqrt(mean(x²) + eps) · weight`. `eps` `None` is
/// `torch.finfo(x.dtype).eps`, read at each forward from the input's dtype.
///
/// ```
/// use ember_nn::layers::RMSNorm;
/// use ember_nn::{Module, Tensor};
/// let norm = RMSNorm::new(&[4], ())?;
/// let y = norm.call(&Tensor::from_vec(vec![1f32, -1., 1., -1.], [1, 4], ())?)?;
/// assert!(y.to_vec::<f32>()?.iter().all(|v| (v.abs() - 1.0).abs() < 1e-6));
/// assert_eq!(format!("{norm}"), "RMSNorm((4,), eps=None, elementwise_affine=True)");
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug, Module)]
pub struct RMSNorm {
    /// Scale, `normalized_shape`, starts at 1 (absent without elementwise affine).
    #[param]
    pub weight: Option<Tensor>,
    normalized_shape: Vec<usize>,
    eps: Option<f64>,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl RMSNorm {
    /// `RMSNorm(normalized_shape)`: eps from the input's dtype, with a weight.
    pub fn new(normalized_shape: &[usize], opts: impl Into<Options>) -> Result<Self> {
        Self::with_options(normalized_shape, None, true, opts)
    }

    /// `RMSNorm(normalized_shape, eps, elementwise_affine)`.
    pub fn with_options(
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        let (dtype, device) = float_options("RMSNorm", opts)?;
        if normalized_shape.is_empty() {
            return Err(NnError::invalid("RMSNorm", "normalized_shape must not be empty").into());
        }
        if let Some(e) = eps.filter(|e| e.is_nan() || *e < 0.0) {
            return Err(
                NnError::invalid("RMSNorm", format!("expected eps >= 0, found {e}")).into(),
            );
        }
        let weight = if elementwise_affine {
            Some(parameter(Raw::ones(normalized_shape, (device, dtype))?)?)
        } else {
            None
        };
        Ok(RMSNorm {
            weight,
            normalized_shape: normalized_shape.to_vec(),
            eps,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }
}

impl Module for RMSNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(w) = &self.weight {
            check_device("RMSNorm", "weight", w, x)?;
        }
        F::rms_norm(x, &self.normalized_shape, self.weight.as_ref(), self.eps)
    }
    fn extra_repr(&self) -> String {
        format!(
            "({},), eps={}, elementwise_affine={}",
            join(&self.normalized_shape),
            self.eps.map_or("None".to_string(), py_float),
            py_bool(self.weight.is_some())
        )
    }
}

fn join(dims: &[usize]) -> String {
    dims.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `BatchNorm1d`/`2d`/`3d`'s options beyond `num_features`, with PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormConfig {
    /// Added to the variance before the square root (`1e-5`).
    pub eps: f64,
    /// The weight of each new batch in the running statistics (`Some(0.1)`); `None` keeps
    /// a cumulative average instead (the batch `k` weighs `1/k`).
    pub momentum: Option<f64>,
    /// Whether the layer has a learnable per-channel scale and shift (`true`).
    pub affine: bool,
    /// Whether the layer keeps running statistics (`true`). Without them it has no buffers
    /// and normalises with the batch's statistics in eval mode too.
    pub track_running_stats: bool,
}

impl Default for BatchNormConfig {
    fn default() -> Self {
        BatchNormConfig {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: true,
            track_running_stats: true,
        }
    }
}

/// Which inputs a batch norm takes: [`BatchNorm1d`] (`[N, C]` or `[N, C, L]`),
/// [`BatchNorm2d`] (`[N, C, H, W]`), [`BatchNorm3d`] (`[N, C, D, H, W]`).
pub trait BatchNormDims: std::fmt::Debug + Send + Sync + 'static {
    /// The layer's name, as PyTorch prints it (`BatchNorm2d`).
    const NAME: &'static str;
    /// The input ranks it takes.
    const RANKS: &'static [usize];
    /// Those inputs' shapes, for messages.
    const SHAPES: &'static str;
}

/// [`BatchNorm1d`]'s inputs: `[N, C]` or `[N, C, L]`.
#[derive(Clone, Copy, Debug)]
pub struct Dims1;
/// [`BatchNorm2d`]'s inputs: `[N, C, H, W]`.
#[derive(Clone, Copy, Debug)]
pub struct Dims2;
/// [`BatchNorm3d`]'s inputs: `[N, C, D, H, W]`.
#[derive(Clone, Copy, Debug)]
pub struct Dims3;

impl BatchNormDims for Dims1 {
    const NAME: &'static str = "BatchNorm1d";
    const RANKS: &'static [usize] = &[2, 3];
    const SHAPES: &'static str = "2D or 3D input [N, C] or [N, C, L]";
}
impl BatchNormDims for Dims2 {
    const NAME: &'static str = "BatchNorm2d";
    const RANKS: &'static [usize] = &[4];
    const SHAPES: &'static str = "4D input [N, C, H, W]";
}
impl BatchNormDims for Dims3 {
    const NAME: &'static str = "BatchNorm3d";
    const RANKS: &'static [usize] = &[5];
    const SHAPES: &'static str = "5D input [N, C, D, H, W]";
}

/// `torch.nn.BatchNorm1d`: input `[N, C]` or `[N, C, L]`.
pub type BatchNorm1d = BatchNorm<Dims1>;
/// `torch.nn.BatchNorm2d`: input `[N, C, H, W]`.
pub type BatchNorm2d = BatchNorm<Dims2>;
/// `torch.nn.BatchNorm3d`: input `[N, C, D, H, W]`.
pub type BatchNorm3d = BatchNorm<Dims3>;

/// Batch normalisation over the channel dimension 1: [`BatchNorm1d`], [`BatchNorm2d`],
/// [`BatchNorm3d`], three types (`BatchNorm2d::new(16, ())`), one per input rank, as
/// PyTorch's three classes. An input of another rank is an error naming the layer
/// (`BatchNorm2d: expected 4D input [N, C, H, W] ...`), as PyTorch's.
///
/// In training, with the batch's statistics (biased variance), and, when it tracks running
/// statistics, updating the running mean and the (unbiased) running variance with
/// `momentum` (or a cumulative average when `momentum` is `None`); in eval, with the running
/// statistics, or with the batch's when it tracks none.
///
/// ```
/// use ember_nn::layers::{BatchNorm1d, BatchNorm2d};
/// use ember_nn::{Module, Tensor};
/// let bn = BatchNorm2d::new(16, ())?;
/// assert_eq!(bn.call(&Tensor::randn([2, 16, 4, 4], ())?)?.dims(), [2, 16, 4, 4]);
/// let e = bn.call(&Tensor::randn([2, 16], ())?).unwrap_err().to_string();
/// assert!(e.contains("BatchNorm2d: expected 4D input [N, C, H, W]"), "{e}");
/// assert_eq!(format!("{bn}"), "BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)");
/// # let _ = BatchNorm1d::new(16, ())?;
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Debug, Module)]
#[module(name = D::NAME)]
pub struct BatchNorm<D: BatchNormDims> {
    /// Scale per channel, starts at 1 (absent when not `affine`).
    #[param]
    pub weight: Option<Tensor>,
    /// Shift per channel, starts at 0 (absent when not `affine`).
    #[param]
    pub bias: Option<Tensor>,
    /// Running mean per channel (a buffer), starts at 0; absent without
    /// `track_running_stats`.
    #[buffer]
    pub running_mean: Option<Tensor>,
    /// Running variance per channel (a buffer), starts at 1.
    #[buffer]
    pub running_var: Option<Tensor>,
    /// How many training batches updated the running statistics (an i64 buffer).
    #[buffer]
    pub num_batches_tracked: Option<Tensor>,
    num_features: usize,
    #[module(skip)]
    config: BatchNormConfig,
    dims: PhantomData<D>,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl<D: BatchNormDims> BatchNorm<D> {
    /// `BatchNorm2d(num_features)` (and `1d`, `3d`): eps 1e-5, momentum 0.1, affine,
    /// tracking running statistics.
    pub fn new(num_features: usize, opts: impl Into<Options>) -> Result<Self> {
        Self::with_config(num_features, BatchNormConfig::default(), opts)
    }

    /// `BatchNorm2d(num_features, eps, momentum, affine, track_running_stats)`.
    pub fn with_config(
        num_features: usize,
        config: BatchNormConfig,
        opts: impl Into<Options>,
    ) -> Result<Self> {
        Self::build(num_features, config, opts)
    }

    /// With a chosen `eps` and `momentum` (the weight of the new batch in the running
    /// statistics).
    pub fn with_eps_momentum(mut self, eps: f64, momentum: f64) -> Result<Self> {
        let config = BatchNormConfig {
            eps,
            momentum: Some(momentum),
            ..self.config
        };
        check_config(D::NAME, &config)?;
        self.config = config;
        Ok(self)
    }

    /// The options the layer was built with.
    pub fn config(&self) -> BatchNormConfig {
        self.config
    }

    fn build(c: usize, config: BatchNormConfig, opts: impl Into<Options>) -> Result<Self> {
        let name = D::NAME;
        check_config(name, &config)?;
        let (dtype, device) = float_options(name, opts)?;
        let (weight, bias) = if config.affine {
            (
                Some(parameter(Raw::ones([c], (device, dtype))?)?),
                Some(parameter(Raw::zeros([c], (device, dtype))?)?),
            )
        } else {
            (None, None)
        };
        let (running_mean, running_var, num_batches_tracked) = if config.track_running_stats {
            (
                Some(Raw::zeros([c], (device, dtype))?),
                Some(Raw::ones([c], (device, dtype))?),
                Some(Raw::zeros([], (device, DType::I64))?),
            )
        } else {
            (None, None, None)
        };
        Ok(BatchNorm {
            weight,
            bias,
            running_mean,
            running_var,
            num_batches_tracked,
            num_features: c,
            config,
            dims: PhantomData,
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
        })
    }

    /// PyTorch's `exponential_average_factor` for a training step: counts the batch in
    /// `num_batches_tracked` and returns the momentum, or `1 / num_batches_tracked` without
    /// one (a cumulative average). 0 when there are no running statistics.
    fn average_factor(&self) -> Result<f64> {
        let Some(nb) = &self.num_batches_tracked else {
            return Ok(0.0);
        };
        let _guard = ember_autograd::no_grad();
        // One in-place add (a fill of the scalar and one `badd` on CUDA), not an add and a
        // copy back.
        let nb = nb.data();
        nb.add_(1)?;
        Ok(match self.config.momentum {
            Some(m) => m,
            None => 1.0 / nb.item::<f64>()?,
        })
    }
}

fn check_config(name: &'static str, c: &BatchNormConfig) -> Result<()> {
    let momentum_ok = c.momentum.is_none_or(|m| (0.0..=1.0).contains(&m));
    if !momentum_ok || c.eps.is_nan() || c.eps < 0.0 {
        let m = c.momentum.map_or("None".to_string(), |m| m.to_string());
        return Err(NnError::invalid(
            name,
            format!(
                "expected eps >= 0 and momentum in [0, 1] or None, found eps={}, momentum={m}",
                c.eps
            ),
        )
        .into());
    }
    Ok(())
}

impl<D: BatchNormDims> Module for BatchNorm<D> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        if !D::RANKS.contains(&dims.len()) {
            return Err(NnError::invalid(
                D::NAME,
                format!(
                    "expected {} (got {}D input of shape {})",
                    D::SHAPES,
                    dims.len(),
                    x.shape()
                ),
            )
            .into());
        }
        if dims[1] != self.num_features {
            return Err(NnError::invalid(
                D::NAME,
                format!(
                    "expected input with {} channels (dim 1), found shape {}",
                    self.num_features,
                    x.shape()
                ),
            )
            .into());
        }
        if let Some((pname, p)) = [
            ("running_mean", &self.running_mean),
            ("weight", &self.weight),
        ]
        .into_iter()
        .find_map(|(n, t)| t.as_ref().map(|t| (n, t)))
        {
            check_device(D::NAME, pname, p, x)?;
        }
        let training = self.training.get();
        // PyTorch's `bn_training`: batch statistics in training, and in eval too when there
        // are no running statistics to use.
        let batch_stats = training || self.running_mean.is_none();
        let factor = if training {
            self.average_factor()?
        } else {
            0.0
        };
        F::batch_norm(
            x,
            self.running_mean.as_ref(),
            self.running_var.as_ref(),
            self.weight.as_ref(),
            self.bias.as_ref(),
            batch_stats,
            factor,
            self.config.eps,
        )
    }
    fn extra_repr(&self) -> String {
        let c = &self.config;
        format!(
            "{}, eps={}, momentum={}, affine={}, bias={}, track_running_stats={}",
            self.num_features,
            py_float(c.eps),
            c.momentum.map_or("None".to_string(), py_float),
            py_bool(c.affine),
            py_bool(self.bias.is_some()),
            py_bool(c.track_running_stats)
        )
    }
}
