//! Layers (`torch.nn`): `Linear`, activations, `Dropout`, `Sequential`, `Flatten`,
//! `Embedding`, `LayerNorm`, `RMSNorm`, `BatchNorm1d`/`2d`/`3d`, `Conv2d`, pooling,
//! `MultiheadAttention`, and the transformer layers (`TransformerEncoderLayer`,
//! `TransformerDecoderLayer`, `TransformerEncoder`, `TransformerDecoder`).
//!
//! Constructors take PyTorch's arguments plus `opts` (`()` for f32 on the cpu, a `Device`,
//! a `DType`, or `(DType, Device)`), as `device=` and `dtype=` in PyTorch. Initialisation is
//! PyTorch's: `Linear` and `Conv2d` draw weight and bias from `U(-1/√fan_in, 1/√fan_in)`,
//! `Embedding` from `N(0, 1)`, norms start at weight 1 and bias 0.
//!
//! Every layer but `Sequential` is a `#[derive(Module)]` struct, the way a user's model is
//! written: its tensors are `#[param]`/`#[buffer]` fields, and each carries a
//! [`TrainingFlag`](crate::TrainingFlag) and [`ModuleHooks`](crate::ModuleHooks), so
//! `eval()` shows on every layer and every layer takes forward hooks. `Sequential` names
//! its children by position (`0`, `1`, ...) rather than by field, so it implements
//! [`ModuleParts`](crate::ModuleParts) by hand.

mod activation;
mod attention;
mod container;
mod conv;
mod dropout;
mod embedding;
mod flatten;
mod linear;
mod norm;
mod pool;
mod transformer;

pub use activation::{GELU, ReLU, SiLU, Sigmoid, Tanh};
pub use attention::{MhaForward, MultiheadAttention, MultiheadAttentionConfig};
pub use container::Sequential;
pub use conv::{Conv2d, Conv2dConfig, PaddingArg};
pub use dropout::Dropout;
pub use embedding::Embedding;
/// Sizes and padding as the layers take them (`1`, `(1, 2)`, `Padding::Same`).
pub use ember_tensor::{Padding, Size2};
pub use flatten::Flatten;
pub use linear::Linear;
pub use norm::{
    BatchNorm, BatchNorm1d, BatchNorm2d, BatchNorm3d, BatchNormConfig, BatchNormDims, Dims1, Dims2,
    Dims3, LayerNorm, RMSNorm,
};
pub use pool::{AvgPool2d, MaxPool2d};
pub use transformer::{
    Activation, DecoderMasks, EncoderMasks, Transformer, TransformerConfig, TransformerDecoder,
    TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer, TransformerLayerConfig,
    TransformerMasks, generate_square_subsequent_mask, is_causal_mask,
};

use ember_tensor::{DType, Options};

use crate::{NnError, Result};

/// The dtype and device of a layer's parameters: PyTorch's `dtype=` (f32 by default,
/// floating point only) and `device=`.
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

/// A bool as Python prints it.
fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// A float as Python's `repr` prints it: `0.1`, `1.0`, `1e-05`.
fn py_float(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return match v {
            x if x.is_nan() => "nan".into(),
            x if x == f64::INFINITY => "inf".into(),
            x if x == f64::NEG_INFINITY => "-inf".into(),
            _ => "0.0".into(),
        };
    }
    let exp = v.abs().log10().floor();
    if !(-4.0..16.0).contains(&exp) {
        let s = format!("{v:e}");
        let (mantissa, e) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match e.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', e),
        };
        return format!("{mantissa}e{sign}{digits:0>2}");
    }
    let s = format!("{v}");
    if s.contains('.') { s } else { s + ".0" }
}

#[cfg(test)]
mod tests {
    use super::py_float;

    #[test]
    fn floats_print_as_python_repr() {
        assert_eq!(py_float(1e-5), "1e-05");
        assert_eq!(py_float(0.1), "0.1");
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(1.5e-7), "1.5e-07");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(0.0), "0.0");
    }
}
