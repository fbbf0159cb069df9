//! Activations: `ReLU`, `SiLU`, `Sigmoid`, `Tanh`, `GELU`.

use ember_tensor::Approximate;

use crate::{Module, ModuleHooks, Result, Tensor, TrainingFlag};

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => |$x:ident| $body:expr;)*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Default, Clone, Module)]
            pub struct $name {
                training: TrainingFlag,
                hooks: ModuleHooks,
            }

            impl $name {
                /// The activation.
                pub fn new() -> Self {
                    Self::default()
                }
            }

            impl Module for $name {
                fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                    Ok($body?)
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

/// GELU, exact (`erf`, the default) or with the tanh approximation
/// (`nn.GELU(approximate='tanh')`: `GELU::new(Approximate::Tanh)`).
#[derive(Debug, Default, Clone, Module)]
pub struct GELU {
    #[module(skip)]
    approximate: Approximate,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl GELU {
    /// `nn.GELU(approximate=...)`: `()` or `Approximate::None` for the exact form,
    /// `Approximate::Tanh` for the tanh approximation.
    pub fn new(approximate: impl Into<Approximate>) -> Self {
        GELU {
            approximate: approximate.into(),
            ..Self::default()
        }
    }
}

impl Module for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.gelu(self.approximate)
    }
    fn extra_repr(&self) -> String {
        let a = match self.approximate {
            Approximate::None => "none",
            Approximate::Tanh => "tanh",
        };
        format!("approximate='{a}'")
    }
}
