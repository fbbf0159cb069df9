//! `torch.backends`: process-wide switches of the libraries behind the CUDA backend, beside
//! `precision.rs`'s `set_float32_matmul_precision` (cuBLAS), of oneDNN behind the CPU's
//! convolutions ([`mkldnn`]), and of the implementation of scaled-dot-product attention
//! ([`sdpa`]).

pub mod mkldnn;
pub mod sdpa;

/// `torch.backends.cudnn`: whether convolutions on CUDA go through cuDNN, and how. See Note
/// [Convolutions on cuDNN] (`crates/ember-tensor/src/cuda/cudnn.rs`).
///
/// Defaults as PyTorch's: `enabled` on, `allow_tf32` on (TF32 tensor cores for f32
/// convolutions), `benchmark` off (cuDNN's heuristics choose the algorithm), `deterministic`
/// off. The settings are read at each convolution; algorithm choices are cached per shape
/// and setting.
///
/// ```
/// use ember_tensor::backends::cudnn;
/// assert!(cudnn::enabled() && cudnn::allow_tf32());
/// assert!(!cudnn::benchmark() && !cudnn::deterministic());
/// cudnn::set_benchmark(true); // pick the fastest algorithm per shape, once
/// cudnn::set_benchmark(false);
/// ```
pub mod cudnn {
    use std::sync::atomic::{AtomicBool, Ordering};

    static ENABLED: AtomicBool = AtomicBool::new(true);
    static ALLOW_TF32: AtomicBool = AtomicBool::new(true);
    static BENCHMARK: AtomicBool = AtomicBool::new(false);
    static DETERMINISTIC: AtomicBool = AtomicBool::new(false);

    /// `torch.backends.cudnn.enabled` (default `true`): `false` sends every convolution to
    /// the im2col + GEMM path.
    pub fn enabled() -> bool {
        ENABLED.load(Ordering::Relaxed)
    }

    /// Sets [`enabled`].
    pub fn set_enabled(on: bool) {
        ENABLED.store(on, Ordering::Relaxed);
    }

    /// `torch.backends.cudnn.allow_tf32` (default `true`): f32 convolutions may use TF32
    /// tensor cores (10-bit mantissa products, f32 accumulation).
    pub fn allow_tf32() -> bool {
        ALLOW_TF32.load(Ordering::Relaxed)
    }

    /// Sets [`allow_tf32`].
    pub fn set_allow_tf32(on: bool) {
        ALLOW_TF32.store(on, Ordering::Relaxed);
    }

    /// `torch.backends.cudnn.benchmark` (default `false`): time every algorithm for each new
    /// shape once (`cudnnFind*`) and keep the fastest, instead of cuDNN's heuristics.
    pub fn benchmark() -> bool {
        BENCHMARK.load(Ordering::Relaxed)
    }

    /// Sets [`benchmark`].
    pub fn set_benchmark(on: bool) {
        BENCHMARK.store(on, Ordering::Relaxed);
    }

    /// `torch.backends.cudnn.deterministic` (default `false`): only algorithms that give
    /// bit-identical results run to run.
    pub fn deterministic() -> bool {
        DETERMINISTIC.load(Ordering::Relaxed)
    }

    /// Sets [`deterministic`].
    pub fn set_deterministic(on: bool) {
        DETERMINISTIC.store(on, Ordering::Relaxed);
    }

    /// `torch.backends.cudnn.is_available()`: cuDNN loads on the current CUDA device.
    pub fn is_available() -> bool {
        version().is_some()
    }

    /// `torch.backends.cudnn.version()`: cuDNN's version (`90100` = 9.1.0) on the current
    /// CUDA device, or `None` without CUDA or cuDNN.
    pub fn version() -> Option<usize> {
        let device = ember_device::cuda::current_device().ok()?;
        ember_device::cuda::driver()
            .ok()?
            .cudnn_version(device)
            .ok()
    }

    /// Which path convolutions on `cuda:{device}` take now, and why: `("cudnn", "cuDNN
    /// 9.1.0")` or `("im2col", reason)`.
    pub fn conv_path(device: usize) -> (&'static str, String) {
        crate::cuda::conv_path(device)
    }

    /// The convolutions cuDNN could not run in this process and that took the im2col path
    /// instead (each distinct reason once; the first was also printed on stderr).
    pub fn fallbacks() -> Vec<String> {
        crate::cuda::cudnn_fallbacks()
    }
}
