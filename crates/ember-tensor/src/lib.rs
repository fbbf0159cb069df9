//! Ember's tensor core: dtypes, shapes and strides, storage in the caching allocator, and
//! the eager [`Tensor`] with its ops.
//!
//! ```
//! use ember_tensor::{DType, Device, Tensor};
//!
//! let a = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], &Device::Cpu)?;
//! let b = a.t()?.contiguous()?;            // a [3, 2] copy
//! assert_eq!(b.dims(), &[3, 2]);
//! let c = a.to_dtype(DType::F64)?;
//! println!("{c}"); // tensor([[1., 2., 3.], [4., 5., 6.]], dtype=torch.float64)
//! # Ok::<(), ember_tensor::Error>(())
//! ```
//!
//! Modules:
//! - [`dtype`]: [`DType`], [`WithDType`], type promotion ([`promote_types`]).
//! - [`shape`]: [`Shape`], [`Dim`]/[`Dims`] (negative dims), [`broadcast_shape`].
//! - [`layout`]: [`Layout`] (shape, strides, offset) and the view transforms;
//!   [`strided`]: [`StridedIndex`].
//! - `storage`: [`CpuStorage`] over `ember-memory`, shared between views
//!   (Note [Storage sharing]); `backend`: the per-op-family dispatch (Note [Dispatch]).
//! - `tensor`: [`Tensor`] — creation, reading back, `Display`, views; `ops/*`: op fronts;
//!   `cpu/*`: CPU kernels; `op`: op declarations.
//! - [`backends`]: `torch.backends.cudnn`'s switches (`allow_tf32`, `benchmark`,
//!   `deterministic`, `enabled`) for convolutions on CUDA.
//! - [`random`]: the Philox [`random::Generator`], per-device defaults, [`random::manual_seed`]
//!   (Note [Random streams]); [`io`]: safetensors [`io::save`]/[`io::load`] (Note [Atomic save]).

pub mod aten;
pub mod autograd;
mod backend;
mod backend_fused;
mod backend_nn;
pub mod backends;
mod cpu;
mod cuda;
pub mod dtype;
mod error;
pub mod io;
pub mod layout;
mod math;
mod op;
mod ops;
mod params;
mod precision;
mod profile;
pub mod random;
mod raw;
mod scalar;
pub mod shape;
mod storage;
pub mod strided;
mod tensor;

pub use autograd::{
    AutogradError, GradModeGuard, GradOptions, backward, checkpoint, custom_op, enable_grad, grad,
    inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad, reachable_leaves,
    set_grad_enabled, with_no_grad,
};
pub use cuda::CudaStorage;
pub use dtype::{ALL_DTYPES, DType, WithDType, promote_types};
pub use ember_device::{Device, ErrorKind};
pub use ember_error::{Error, Result};
pub use error::TensorError;
pub use layout::Layout;
pub use op::{CastPolicy, OpInfo};
pub use ops::attention::SdpaOptions;
pub use ops::table as op_table;
pub use ops::r#where;
pub use params::{FusedAdamOptions, FusedSgdOptions};
pub use precision::{MatmulPrecision, matmul_precision, set_float32_matmul_precision};
pub use profile::torch_type_name;
pub use raw::buffers::{CudaBuffer, with_cuda_buffers};
pub use raw::close::IscloseOptions;
pub use raw::conv::{Conv2dOptions, Padding, Size2};
pub use raw::loss::{CrossEntropyOptions, NllLossOptions, Reduction};
pub use raw::pool::{AvgPool2dOptions, MaxPool2dOptions};
pub use raw::unary::Approximate;
pub use raw::{Options, ShapeSpec, ToTarget};
pub use scalar::{ClampBound, Operand, Scalar};
pub use shape::{Dim, Dims, ReduceDims, Shape, broadcast_shape};
pub use storage::CpuStorage;
pub use strided::StridedIndex;
pub use tensor::{HookHandle, Tensor};

pub(crate) use raw::RawTensor;
