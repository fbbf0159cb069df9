//! Which implementation `scaled_dot_product_attention` runs (PyTorch's
//! `torch.nn.attention.sdpa_kernel` / `torch.backends.cuda.enable_flash_sdp` and
//! `enable_math_sdp`, for every device): the fused kernels (docs/attention.md; on CUDA the
//! flash kernels, on the CPU the tiled kernel) or the math path composed from matmul,
//! softmax and dropout (PyTorch's `_scaled_dot_product_attention_math`).
//!
//! The choice is, first found: this thread's [`scoped`] kernel, the process-wide
//! [`set_kernel`], the `EMBER_SDPA` variable (`auto`, `flash`, `math`; read once), `auto`.
//! `auto` takes the fused kernel where it supports the case and the math path otherwise;
//! `flash` makes a case the kernel cannot run the op's error (never a silent fallback), as
//! PyTorch's `sdpa_kernel(SDPBackend.FLASH_ATTENTION)` does.
//!
//! ```
//! use ember_tensor::backends::sdpa::{self, SdpaKernel};
//! {
//!     let _math = sdpa::scoped(SdpaKernel::Math); // this thread, until dropped
//!     assert_eq!(sdpa::kernel()?, SdpaKernel::Math);
//! }
//! # Ok::<(), ember_tensor::Error>(())
//! ```

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::TensorError;

/// An implementation of scaled-dot-product attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdpaKernel {
    /// The fused kernel where it supports the case, the math path otherwise.
    Auto,
    /// The fused kernel, or the op's error where it cannot run.
    Flash,
    /// The math path (matmul, softmax, dropout, matmul), differentiable through every input.
    Math,
}

impl SdpaKernel {
    fn code(k: Option<SdpaKernel>) -> u8 {
        match k {
            None => 0,
            Some(SdpaKernel::Auto) => 1,
            Some(SdpaKernel::Flash) => 2,
            Some(SdpaKernel::Math) => 3,
        }
    }

    fn of(code: u8) -> Option<SdpaKernel> {
        match code {
            1 => Some(SdpaKernel::Auto),
            2 => Some(SdpaKernel::Flash),
            3 => Some(SdpaKernel::Math),
            _ => None,
        }
    }
}

static PROCESS: AtomicU8 = AtomicU8::new(0);

thread_local! {
    static SCOPED: Cell<Option<SdpaKernel>> = const { Cell::new(None) };
}

fn from_env() -> Result<SdpaKernel, String> {
    static ENV: OnceLock<Result<SdpaKernel, String>> = OnceLock::new();
    ENV.get_or_init(|| match std::env::var("EMBER_SDPA").as_deref() {
        Err(_) | Ok("") | Ok("auto") => Ok(SdpaKernel::Auto),
        Ok("flash") => Ok(SdpaKernel::Flash),
        Ok("math") => Ok(SdpaKernel::Math),
        Ok(other) => Err(format!(
            "EMBER_SDPA: expected auto, flash or math, found {other:?}"
        )),
    })
    .clone()
}

/// The kernel `scaled_dot_product_attention` chooses with now (see the module's text); a
/// malformed `EMBER_SDPA` is an error naming the variable.
pub fn kernel() -> crate::Result<SdpaKernel> {
    if let Some(k) = SCOPED.with(Cell::get) {
        return Ok(k);
    }
    if let Some(k) = SdpaKernel::of(PROCESS.load(Ordering::Relaxed)) {
        return Ok(k);
    }
    from_env().map_err(|e| TensorError::invalid("scaled_dot_product_attention", e).into())
}

/// Sets the kernel for the whole process (`None`: back to `EMBER_SDPA`). A thread's
/// [`scoped`] choice still wins on that thread.
pub fn set_kernel(kernel: Option<SdpaKernel>) {
    PROCESS.store(SdpaKernel::code(kernel), Ordering::Relaxed);
}

/// Uses `kernel` on this thread until the guard drops (nesting restores the previous one).
pub fn scoped(kernel: SdpaKernel) -> SdpaKernelGuard {
    let prev = SCOPED.with(|c| c.replace(Some(kernel)));
    SdpaKernelGuard {
        prev,
        _not_send: std::marker::PhantomData,
    }
}

/// Restores the thread's previous choice when dropped.
#[must_use = "the choice lasts only while the guard lives"]
#[derive(Debug)]
pub struct SdpaKernelGuard {
    prev: Option<SdpaKernel>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for SdpaKernelGuard {
    fn drop(&mut self) {
        SCOPED.with(|c| c.set(self.prev));
    }
}
