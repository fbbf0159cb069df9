//! Parameter initialisers (`torch.nn.init`): each fills a tensor in place, without recording
//! autograd history, from the default generator of the tensor's device (so
//! `ember_tensor::random::manual_seed` makes them reproducible).

use ember_tensor::Tensor as Raw;

use crate::{NnError, Result, Tensor};

/// Which fan [`kaiming_uniform_`] and [`kaiming_normal_`] preserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FanMode {
    /// The inputs (PyTorch's default): preserves the forward pass's variance.
    #[default]
    FanIn,
    /// The outputs: preserves the backward pass's variance.
    FanOut,
}

/// The nonlinearity whose gain [`calculate_gain`] returns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nonlinearity {
    /// Linear, convolutions, sigmoid: gain 1.
    Linear,
    /// tanh: 5/3.
    Tanh,
    /// ReLU: √2.
    Relu,
    /// Leaky ReLU with this negative slope: √(2 / (1 + slope²)).
    LeakyRelu(f64),
}

/// The recommended gain for a nonlinearity (`torch.nn.init.calculate_gain`).
pub fn calculate_gain(nonlinearity: Nonlinearity) -> f64 {
    match nonlinearity {
        Nonlinearity::Linear => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f64.sqrt(),
        Nonlinearity::LeakyRelu(slope) => (2.0 / (1.0 + slope * slope)).sqrt(),
    }
}

/// `(fan_in, fan_out)` of a weight of at least two dimensions: `[out, in, k...]` gives
/// `in·k` and `out·k`.
pub fn calculate_fan_in_and_fan_out(t: &Tensor) -> Result<(usize, usize)> {
    let dims = t.dims();
    if dims.len() < 2 {
        return Err(NnError::invalid(
            "calculate_fan_in_and_fan_out",
            format!(
                "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions (got shape {})",
                t.shape()
            ),
        ).into());
    }
    let receptive: usize = dims[2..].iter().product();
    Ok((dims[1] * receptive, dims[0] * receptive))
}

fn fill(t: &Tensor, op: &'static str, values: impl FnOnce(&Raw) -> Result<Raw>) -> Result<()> {
    let data = t.data();
    if !data.dtype().is_float() {
        return Err(NnError::invalid(
            op,
            format!("expected a floating-point tensor, found {}", data.dtype()),
        )
        .into());
    }
    let _guard = ember_autograd::no_grad();
    let v = values(&data)?;
    data.copy_(&v)?;
    Ok(())
}

/// Fills with values drawn uniformly from `[low, high)`.
pub fn uniform_(t: &Tensor, low: f64, high: f64) -> Result<()> {
    if low.partial_cmp(&high) == Some(std::cmp::Ordering::Greater) || !low.is_finite() {
        return Err(NnError::invalid(
            "uniform_",
            format!("expected low <= high and both finite, found low={low}, high={high}"),
        )
        .into());
    }
    fill(t, "uniform_", |d| {
        let r = Raw::rand(d.shape().clone(), (d.device(), d.dtype()))?;
        r.mul(high - low)?.add(low)
    })
}

/// Fills with values drawn from `N(mean, std²)`.
pub fn normal_(t: &Tensor, mean: f64, std: f64) -> Result<()> {
    if std.is_nan() || std < 0.0 {
        return Err(NnError::invalid("normal_", format!("expected std >= 0, found {std}")).into());
    }
    fill(t, "normal_", |d| {
        let r = Raw::randn(d.shape().clone(), (d.device(), d.dtype()))?;
        r.mul(std)?.add(mean)
    })
}

/// Fills with `value`.
pub fn constant_(t: &Tensor, value: f64) -> Result<()> {
    fill(t, "constant_", |d| d.full_like(value))
}

/// Fills with zeros.
pub fn zeros_(t: &Tensor) -> Result<()> {
    constant_(t, 0.0)
}

/// Fills with ones.
pub fn ones_(t: &Tensor) -> Result<()> {
    constant_(t, 1.0)
}

fn kaiming_std(t: &Tensor, a: f64, mode: FanMode, nonlinearity: Nonlinearity) -> Result<f64> {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(t)?;
    let fan = match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    };
    if fan == 0 {
        return Err(NnError::invalid(
            "kaiming init",
            format!(
                "cannot initialise a tensor with zero fan (shape {})",
                t.shape()
            ),
        )
        .into());
    }
    let gain = match nonlinearity {
        Nonlinearity::LeakyRelu(_) => calculate_gain(Nonlinearity::LeakyRelu(a)),
        other => calculate_gain(other),
    };
    Ok(gain / (fan as f64).sqrt())
}

/// He initialisation, uniform: `U(-b, b)` with `b = gain · √(3 / fan)`.
/// `Linear` and `Conv2d` use `a = √5`, `FanIn`, `LeakyRelu`, i.e. `b = 1/√fan_in`.
pub fn kaiming_uniform_(
    t: &Tensor,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
) -> Result<()> {
    let bound = 3f64.sqrt() * kaiming_std(t, a, mode, nonlinearity)?;
    uniform_(t, -bound, bound)
}

/// He initialisation, normal: `N(0, (gain / √fan)²)`.
pub fn kaiming_normal_(
    t: &Tensor,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
) -> Result<()> {
    let std = kaiming_std(t, a, mode, nonlinearity)?;
    normal_(t, 0.0, std)
}

/// Glorot initialisation, uniform: `U(-b, b)` with `b = gain · √(6 / (fan_in + fan_out))`.
pub fn xavier_uniform_(t: &Tensor, gain: f64) -> Result<()> {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(t)?;
    let bound = gain * (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    uniform_(t, -bound, bound)
}

/// Glorot initialisation, normal: `N(0, gain² · 2 / (fan_in + fan_out))`.
pub fn xavier_normal_(t: &Tensor, gain: f64) -> Result<()> {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(t)?;
    normal_(
        t,
        0.0,
        gain * (2.0 / (fan_in + fan_out).max(1) as f64).sqrt(),
    )
}
