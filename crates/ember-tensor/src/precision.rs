//! `torch.set_float32_matmul_precision`: how f32 matrix products may trade precision for
//! speed on CUDA (TF32 tensor cores). The CPU backend always computes in full f32.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Result, TensorError};

/// The internal precision of f32 matrix products, PyTorch's three levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// Full f32 (PyTorch's default): no TF32.
    Highest,
    /// TF32 (or split-bf16) tensor cores allowed.
    High,
    /// bf16-level precision allowed; on CUDA, Ember uses TF32 here as for `High`.
    Medium,
}

static PRECISION: AtomicU8 = AtomicU8::new(0);

/// Sets the f32 matmul precision: `"highest"`, `"high"` or `"medium"`, as
/// `torch.set_float32_matmul_precision`; anything else is an error naming the three.
///
/// ```
/// use ember_tensor::{MatmulPrecision, matmul_precision, set_float32_matmul_precision};
/// set_float32_matmul_precision("high")?;
/// assert_eq!(matmul_precision(), MatmulPrecision::High);
/// assert!(set_float32_matmul_precision("fast").is_err());
/// set_float32_matmul_precision("highest")?;
/// # Ok::<(), ember_tensor::Error>(())
/// ```
pub fn set_float32_matmul_precision(precision: &str) -> Result<()> {
    let level = match precision {
        "highest" => 0,
        "high" => 1,
        "medium" => 2,
        other => {
            return Err(TensorError::invalid(
                "set_float32_matmul_precision",
                format!("expected one of \"highest\", \"high\", \"medium\", but got {other:?}"),
            ));
        }
    };
    PRECISION.store(level, Ordering::Relaxed);
    Ok(())
}

/// The current f32 matmul precision (`torch.get_float32_matmul_precision`).
pub fn matmul_precision() -> MatmulPrecision {
    match PRECISION.load(Ordering::Relaxed) {
        0 => MatmulPrecision::Highest,
        1 => MatmulPrecision::High,
        _ => MatmulPrecision::Medium,
    }
}
