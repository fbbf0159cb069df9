//! The one autocast policy table: which ops run in the region's lower precision, which in
//! f32, which in the widest input dtype. Everything not listed runs as it is given.
//!
//! Note [Autocast policy]: the lists follow PyTorch's `aten/src/ATen/autocast_mode.cpp`
//! (the CUDA lists: `lower_precision_fp`, `fp32`, `fp32_set_opt_dtype`, `fp32_append_dtype`,
//! `promote`), restricted to the ops Ember has. One table serves every device type: PyTorch's
//! CPU lists keep fewer ops in f32 (softmax, exp and log run in bf16 there), but Ember keeps
//! one table, so a model computes the same way under a CPU region and a CUDA region. The op
//! names are the names the ops pass to `ember_autograd::mode::autocast_inputs` (Note
//! [Autocast hook]); a test in `tests/autocast.rs` runs every row and checks the dtype that
//! comes out, so a name here without a call site fails it.
//!
//! - [`CastPolicy::LowerPrecision`]: eligible inputs (floating, not f64, on the region's
//!   device type) are cast to the region's dtype (f16 or bf16).
//! - [`CastPolicy::Fp32`]: eligible inputs are cast to f32 (f16/bf16 inputs come out f32).
//! - [`CastPolicy::Promote`]: eligible inputs are cast to the widest of their dtypes (f16 and
//!   bf16 together promote to f32, as `torch.promote_types`).

use ember_tensor::{DType, promote_types};

/// What autocast does to an op's eligible inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CastPolicy {
    /// Cast to the region's dtype (f16 or bf16): the products.
    LowerPrecision,
    /// Cast to f32: ops whose range or accuracy f16/bf16 would hurt.
    Fp32,
    /// Cast to the widest input dtype: ops that take several tensors.
    Promote,
}

/// The ops that run in the region's lower precision: every product Ember has, and
/// scaled-dot-product attention (whose inside, the math path's softmax included, then runs
/// in that dtype, as PyTorch's).
pub const LOWER_PRECISION_OPS: &[&str] = &[
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "linear",
    "conv2d",
    "scaled_dot_product_attention",
];

/// The ops that run in f32 (PyTorch's `fp32`, `fp32_set_opt_dtype` and `fp32_append_dtype`
/// lists, those Ember has).
pub const FP32_OPS: &[&str] = &[
    // pointwise
    "exp",
    "log",
    "log1p",
    "pow",
    "rsqrt",
    "reciprocal",
    "softplus",
    // reductions and normalisations
    "sum",
    "prod",
    "logsumexp",
    "norm",
    "softmax",
    "log_softmax",
    "layer_norm",
    // losses
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "binary_cross_entropy_with_logits",
];

/// The ops that run in the widest dtype of their floating inputs.
pub const PROMOTE_OPS: &[&str] = &[
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "where",
    "cat",
    "stack",
    "scatter_add",
];

/// The table's answer for `op`, or `None` for an op autocast leaves alone.
pub fn cast_policy(op: &str) -> Option<CastPolicy> {
    if LOWER_PRECISION_OPS.contains(&op) {
        Some(CastPolicy::LowerPrecision)
    } else if FP32_OPS.contains(&op) {
        Some(CastPolicy::Fp32)
    } else if PROMOTE_OPS.contains(&op) {
        Some(CastPolicy::Promote)
    } else {
        None
    }
}

/// The widest of `dtypes` (`torch.promote_types` folded over them: f16 with bf16 gives
/// f32); `None` for no dtypes.
pub fn widest(dtypes: &[DType]) -> Option<DType> {
    let mut it = dtypes.iter().copied();
    let first = it.next()?;
    Some(it.fold(first, promote_types))
}

/// The dtype an op under `policy` computes in, in a region of `lower` precision, for
/// eligible inputs of `inputs` dtypes.
pub fn compute_dtype(policy: CastPolicy, lower: DType, inputs: &[DType]) -> Option<DType> {
    match policy {
        CastPolicy::LowerPrecision => Some(lower),
        CastPolicy::Fp32 => Some(DType::F32),
        CastPolicy::Promote => widest(inputs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_op_is_listed_once() {
        let all: Vec<&str> = LOWER_PRECISION_OPS
            .iter()
            .chain(FP32_OPS)
            .chain(PROMOTE_OPS)
            .copied()
            .collect();
        for op in &all {
            assert_eq!(
                all.iter().filter(|o| o == &op).count(),
                1,
                "{op} listed twice"
            );
        }
        assert_eq!(cast_policy("relu"), None);
        assert_eq!(cast_policy("mm"), Some(CastPolicy::LowerPrecision));
    }

    #[test]
    fn widest_follows_promote_types() {
        use DType::*;
        assert_eq!(widest(&[F16, F16]), Some(F16));
        assert_eq!(widest(&[F16, F32]), Some(F32));
        assert_eq!(widest(&[Bf16, F16]), Some(F32));
        assert_eq!(widest(&[Bf16]), Some(Bf16));
        assert_eq!(widest(&[]), None);
    }
}
