//! Reference implementations of Ember's ops: direct f64 loops (or exact integer ones) that
//! the tests of `ember-kernels` (the CUDA kernels on the emulator) and `ember-tensor` (the
//! CPU and CUDA backends) compare against. Each follows PyTorch's definition and the CPU
//! backend's rules where PyTorch leaves a choice open (which index a tie or a NaN gives, how
//! a padded window is counted), and names that rule in its doc.
//!
//! They are written for clarity, not speed: the loops of the definitions, nothing fused.

pub mod attention;
pub mod conv;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod pool;
pub mod reduce;
pub mod softmax;
pub mod unary;

pub use attention::{
    Attention, AttnCase, AttnData, AttnGrads, AttnMask, AttnOut, MaskKind, TorchCase,
    assert_attn_close, attention, attention_grad, torch_cases,
};
pub use conv::{Conv2d, conv2d};
pub use layout::{contiguous_strides, offset_of, span};
pub use loss::{
    CrossEntropy, cross_entropy, cross_entropy_grad, cross_entropy_probs, cross_entropy_probs_grad,
};
pub use matmul::matmul;
pub use pool::{Pool2d, avg_pool2d, max_pool2d, pool_output_size};
pub use reduce::extreme;
pub use softmax::{softmax, softmax_row};
pub use unary::{erf, gelu_erf, gelu_tanh, int_pow, sigmoid, silu, softplus};
