//! Test support for Ember's crates (a dev-dependency; not published).
//!
//! - **One test body, every device.** [`test_device!`] stamps `name_cpu` and `name_cuda`
//!   (and `name_cuda1` where asked) `#[test]`s from one `fn body(device: &Device)`, so a
//!   failure names its device; [`devices`] lists the devices for a loop, [`run_on`] runs one
//!   body on one device. `cuda:N` is the CPU emulator of CUDA, or the real GPU under
//!   `EMBER_GPU_TEST=1`; which, and when a test is skipped, is Note [Test devices] in
//!   `device.rs`.
//! - **Closeness.** [`assert_close`] as `torch.testing.assert_close`: per-dtype default
//!   tolerances ([`Tolerance::for_dtype`]), tensors on any device or slices of floats, and a
//!   message naming the first mismatching index, both values and the greatest absolute and
//!   relative differences. [`Close`] sets the tolerance, NaN handling and a context line.
//! - **References.** [`reference`](mod@reference): the ops as direct f64 loops (attention, softmax,
//!   reductions' max and min, conv2d, pooling, cross-entropy, matmul, erf and friends,
//!   strided layouts), shared by the kernel tests and the tensor tests.
//! - **Data.** [`Lcg`] and [`rand_vec`]: deterministic inputs without an RNG crate.
//! - **Skips, said so.** [`skip!`] ends a test that cannot run here with an
//!   `ember-skip: <reason>` line, so that a runner counts it as skipped, not passed
//!   ([`skip_part`] for a part of a test); Note [Skipped tests] in `skip.rs`.
//!
//! ```
//! use ember_tensor::{Device, Result, Tensor};
//! use ember_testing::{assert_close, reference, test_device};
//!
//! fn softmax_of_a_row(device: &Device) -> Result<()> {
//!     let x = Tensor::from_slice(&[1f32, 2., 3.], [3], device)?;
//!     assert_close(&x.softmax(0)?, &reference::softmax_row(&[1., 2., 3.], false));
//!     Ok(())
//! }
//! test_device!(softmax_of_a_row, softmax_of_a_row);
//! ```
#![warn(missing_docs)]

mod close;
mod data;
mod device;
mod macros;
pub mod reference;
mod skip;

pub use close::{
    Close, Comparable, Compared, Mismatch, Tolerance, assert_close, assert_close_tol, is_close,
};
pub use data::{Lcg, rand_vec};
pub use device::{
    EMULATED_DEVICES, ENV_GPU_TEST, Skipped, TestOutcome, devices, devices_with_two_gpus, prepare,
    real_gpu_requested, run_on,
};
pub use ember_tensor::Device;
pub use skip::{SKIP_LINE, SKIP_PART_LINE, Skip, report_skip, skip_line, skip_part};

#[doc(hidden)]
pub use paste as __paste;

/// The values of `t` (any device, any dtype) as f64, row-major.
///
/// # Panics
///
/// If the tensor cannot be read back (a device error).
#[track_caller]
pub fn values(t: &ember_tensor::Tensor) -> Vec<f64> {
    match t.compared() {
        Ok(c) => c.values,
        Err(e) => panic!("{e}"),
    }
}
