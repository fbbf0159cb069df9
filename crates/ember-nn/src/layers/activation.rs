//! Activations: `ReLU`, `SiLU`, `Sigmoid`, `Tanh`, `GELU`.

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

/// GELU, exact (`erf`, the default) or with the tanh approximation.
#[derive(Debug, Default, Clone, Module)]
pub struct GELU {
    tanh: bool,
    training: TrainingFlag,
    hooks: ModuleHooks,
}

impl GELU {
    /// The exact form (`approximate='none'`).
    pub fn new() -> Self {
        Self::default()
    }

    /// The tanh approximation (`approximate='tanh'`).
    pub fn tanh_approximation() -> Self {
        GELU {
            tanh: true,
            ..Self::default()
        }
    }
}

impl Module for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(if self.tanh { x.gelu_tanh()? } else { x.gelu()? })
    }
    fn extra_repr(&self) -> String {
        format!("approximate='{}'", if self.tanh { "tanh" } else { "none" })
    }
}
