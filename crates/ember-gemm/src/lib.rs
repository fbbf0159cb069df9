//! CPU GEMM kernels, picked by measurement: `C ← alpha·A·B + beta·C` over strided,
//! batched views of slices, in f32 and in bf16/f16 with f32 accumulation.
//!
//! ```
//! use ember_gemm::{MatMut, MatRef, Parallelism, gemm};
//! // C (2×2) = Aᵀ·B with A stored 3×2 row-major: transposition is a view.
//! let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let b = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let mut c = [0.0f32; 4];
//! let used = gemm(MatRef::row_major(&a, 3, 2).t(), MatRef::row_major(&b, 3, 2),
//!                 MatMut::row_major(&mut c, 2, 2), 1.0, 0.0, Parallelism::All)?;
//! assert_eq!(c, [6.0, 8.0, 8.0, 10.0]);
//! println!("ran on {used}; {}", ember_gemm::backend_info());
//! # Ok::<(), ember_gemm::GemmError>(())
//! ```
//!
//! - [`MatRef`] / [`MatMut`]: a slice with (batch, rows, cols) and a stride per dimension;
//!   every call checks bounds and that C's elements are distinct, and returns a
//!   [`GemmError`] (never panics) on bad sizes or strides.
//! - [`gemm`] (any [`Element`]: `f32`, `half::bf16`, `half::f16` in; the same out),
//!   [`gemm_f32`], and [`gemm_with`] to force a [`Backend`].
//! - Backends ([`backend_info`], [`active_backend`] for `ember info`):
//!   - [`Backend::Rust`]: the `gemm` crate (AVX-512 or AVX2/FMA kernels, picked at run
//!     time); always present.
//!   - [`Backend::Mkl`]: Intel MKL's `libmkl_rt`, loaded at run time when found (never
//!     linked), chosen by `EMBER_CPU_BLAS=auto` (the default) wherever it takes the operands
//!     (one unit stride each). `EMBER_CPU_BLAS=rust|mkl` forces one. See Note [MKL on
//!     Intel only] in `backend.rs` and `docs/cpu-gemm.md` for why, and `mkl.rs` for the
//!     search path.
//! - Threads ([`Parallelism`]): the parallel loop's team — the calling thread and
//!   `threads - 1` helpers of its own, `threads` being rayon's pool size (Note [A team that
//!   spins] in `parallel.rs`) — or rayon's pool itself when called on one of its threads.
//!   MKL runs its sequential layer inside those tasks, so no OpenMP pool ever runs beside
//!   them; see Note [Independent blocks] in `split.rs`.
//! - [`parallel`]: the parallel loop in which the calling thread takes part (Note [The
//!   caller joins the loop]); the GEMM's blocks and `ember-tensor`'s CPU kernels use it.

mod amx;
mod backend;
mod dispatch;
mod dpbf16;
mod elem;
mod error;
mod layout;
mod mkl;
mod packed;
pub mod parallel;
mod rust;
mod split;

pub use backend::{
    Backend, BackendInfo, MklInfo, Preference, active_backend, backend_info, preference,
};
pub use dispatch::{Parallelism, gemm, gemm_f32, gemm_with};
pub use elem::{DType, Element};
pub use error::{GemmError, Operand};
pub use half::{bf16, f16};
pub use layout::{MatMut, MatRef};
