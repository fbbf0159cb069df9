//! Autocast's policy: which ops run in the region's lower precision, which in f32, which
//! in the widest input dtype. The categories are the `autocast` column of the op table
//! (`ember_tensor::op_table`, Note [The op table]); this module reads them and turns a
//! category into a dtype. Everything without a category runs as it is given.
//!
//! Note [Autocast policy]: the categories follow PyTorch's
//! `aten/src/ATen/autocast_mode.cpp` (the CUDA lists: `lower_precision_fp`, `fp32`,
//! `fp32_set_opt_dtype`, `fp32_append_dtype`, `promote`), restricted to the ops Ember has.
//! One table serves every device type: PyTorch's CPU lists keep fewer ops in f32 (softmax,
//! exp and log run in bf16 there), but Ember keeps one, so a model computes the same way
//! under a CPU region and a CUDA region. A test in `tests/autocast.rs` runs every op of
//! every category and checks the dtype that comes out.
//!
//! - [`CastPolicy::LowerPrecision`]: eligible inputs (floating, not f64, on the region's
//!   device type) are cast to the region's dtype (f16 or bf16).
//! - [`CastPolicy::Fp32`]: eligible inputs are cast to f32 (f16/bf16 inputs come out f32).
//! - [`CastPolicy::Promote`]: eligible inputs are cast to the widest of their dtypes (f16 and
//!   bf16 together promote to f32, as `torch.promote_types`).

use ember_tensor::{DType, op_table, promote_types};

pub use ember_tensor::CastPolicy;

/// The category of the op PyTorch calls `op`, from the op table; `None` for an op
/// autocast leaves alone (or one Ember does not have).
pub fn cast_policy(op: &str) -> Option<CastPolicy> {
    op_table::lookup(op)?.autocast
}

/// The names of the ops in `policy`'s category, in the table's order.
pub fn ops_in(policy: CastPolicy) -> impl Iterator<Item = &'static str> {
    op_table::all()
        .filter(move |o| o.autocast == Some(policy))
        .map(|o| o.name)
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
    fn the_table_answers_by_name() {
        assert_eq!(cast_policy("relu"), None);
        assert_eq!(cast_policy("mm"), Some(CastPolicy::LowerPrecision));
        assert_eq!(cast_policy("where"), Some(CastPolicy::Promote));
        assert_eq!(cast_policy("no_such_op"), None);
        assert!(ops_in(CastPolicy::Fp32).any(|o| o == "softmax"));
        assert!(!ops_in(CastPolicy::Fp32).any(|o| o == "matmul"));
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
