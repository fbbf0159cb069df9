//! `Linear`: `y = x Wᵀ + b`.

use ember_tensor::{Options, Tensor as Raw};

use super::{float_options, py_bool};
use crate::functional as F;
use crate::init::{self, FanMode, Nonlinearity};
use crate::module::{check_device, parameter};
use crate::{Module, ModuleHooks, NnError, Result, Tensor, TrainingFlag};

/// `y = x Wᵀ + b` over the last dimension (`torch.nn.Linear`).
#[derive(Debug, Module)]
pub struct Linear {
    /// `[out_features, in_features]`.
    #[param]
    pub weight: Tensor,
    /// `[out_features]`, if the layer has a bias.
    #[param]
    pub bias: Option<Tensor>,
    in_features: usize,
    out_features: usize,
    training: TrainingFlag,
    hooks: ModuleHooks,
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
            training: TrainingFlag::default(),
            hooks: ModuleHooks::default(),
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
        F::linear(x, &self.weight, self.bias.as_ref())
    }
    fn extra_repr(&self) -> String {
        format!(
            "in_features={}, out_features={}, bias={}",
            self.in_features,
            self.out_features,
            py_bool(self.bias.is_some())
        )
    }
}
