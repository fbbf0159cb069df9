//! `torch.backends.mkldnn`: whether CPU convolutions run on oneDNN (PyTorch's "MKL-DNN"),
//! loaded at run time. See Note [oneDNN at run time] in
//! `crates/ember-tensor/src/cpu/conv/onednn.rs` and docs/convolutions.md.
//!
//! ```
//! use ember_tensor::backends::mkldnn;
//! assert!(mkldnn::enabled());
//! let (path, why) = mkldnn::conv_path(ember_tensor::DType::F32);
//! assert!(path == "onednn" || path == "rust", "{path}: {why}");
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use crate::dtype::DType;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// `torch.backends.mkldnn.enabled` (default `true`): `false` sends every CPU convolution to
/// Ember's own kernels (im2col + GEMM, direct depthwise).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Sets [`enabled`].
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// `torch.backends.mkldnn.is_available()`: oneDNN loads in this process.
pub fn is_available() -> bool {
    crate::cpu::conv::onednn_info().loaded.is_some()
}

/// oneDNN's version (major, minor, patch) where it loads.
pub fn version() -> Option<(i32, i32, i32)> {
    crate::cpu::conv::onednn_info().loaded.map(|(_, v)| v)
}

/// Which kernels CPU convolutions of `dtype` take now, and why: `("onednn", "oneDNN 3.2.0
/// at PATH")` or `("rust", reason)`. Only f32 and bf16 go to oneDNN.
pub fn conv_path(dtype: DType) -> (&'static str, String) {
    let info = crate::cpu::conv::onednn_info();
    if !matches!(dtype, DType::F32 | DType::Bf16) {
        return (
            "rust",
            format!("oneDNN is used for f32 and bf16, not {dtype}"),
        );
    }
    match (info.reason, info.loaded) {
        (None, Some((path, (a, b, c)))) => ("onednn", format!("oneDNN {a}.{b}.{c} at {path}")),
        (Some(why), _) => ("rust", why),
        (None, None) => ("rust", "oneDNN not loaded".into()),
    }
}
