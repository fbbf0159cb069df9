//! The devices a test runs on, and running one test body on one of them.
//!
//! Note [Test devices]: a device-generic test runs on `cpu` and on `cuda:0` (and `cuda:1`
//! where it asks for two devices). Which driver serves `cuda:N` follows the rule the
//! device-generic tests of the workspace already keep (`ember-tensor`'s `cuda_ops`, `ember-autograd`'s `gradcheck`,
//! `ember-nn`'s tests, `ember-kernels`' tests):
//!
//! - By default the test process installs the CPU emulator of CUDA with two devices
//!   (`cuda::use_emulator(EmulatorConfig::devices(2))`) before its first CUDA call, so the
//!   `cuda` variants run for real — the kernels of `kernels/*.cu` compiled for the CPU — in
//!   both passes of `cargo xtask test` (with and without `EMBER_CUDA_EMULATOR`), and their
//!   launches reach the launch trace of the traced pass. Nothing is skipped.
//! - Under `EMBER_GPU_TEST=1` (`cargo xtask gpu-test`) the real driver serves them instead,
//!   and it must be there: a missing real GPU fails the test, it does not pass unrun. TF32
//!   for convolutions (`backends::cudnn::allow_tf32`) is then switched off, so f32 results
//!   compare with f64 references at f32 tolerances.
//! - The one case that is skipped is a second device the machine does not have: `cuda:1`
//!   under `EMBER_GPU_TEST=1` on a single-GPU machine. The test then prints
//!   `ember-skip: <test> on cuda:1 ...` (or, where only its `cuda:1` part is left out,
//!   `ember-skip-part: ...`; Note [Skipped tests]) and returns; the emulated passes run the
//!   same body on the emulator's `cuda:1`.
//!
//! A test binary that uses this module therefore has the emulator as its CUDA driver (a
//! process chooses its driver once); a test that needs CUDA to be absent belongs in a binary
//! that does not use it.

use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_tensor::Device;

/// The variable under which the CUDA variants use the real driver (set by
/// `cargo xtask gpu-test`).
pub const ENV_GPU_TEST: &str = "EMBER_GPU_TEST";

/// How many emulated devices the test processes of the workspace install (every test must
/// use the same configuration: a process has one driver).
pub const EMULATED_DEVICES: usize = 2;

/// Whether this process tests the real GPUs (`EMBER_GPU_TEST` set) rather than the emulator.
pub fn real_gpu_requested() -> bool {
    std::env::var_os(ENV_GPU_TEST).is_some()
}

/// Why a test did not run on a device: the device is absent where that is allowed (a second
/// real GPU on a single-GPU machine).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The device that is missing.
    pub device: Device,
    /// What is missing, in words.
    pub reason: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not available: {}", self.device, self.reason)
    }
}

/// Makes `device` ready for a test (Note [Test devices]): `cpu` always is; for `cuda:N` the
/// emulator is installed, or under `EMBER_GPU_TEST=1` the real driver is checked.
///
/// Returns `Err(Skipped)` only for a `cuda:N` beyond the real GPUs of the machine under
/// `EMBER_GPU_TEST=1` (N ≥ 1).
///
/// # Panics
///
/// When the device cannot be had and its absence is a failure, not a skip: no real GPU under
/// `EMBER_GPU_TEST=1`, an index the emulator does not have, or a process whose CUDA driver
/// was already chosen otherwise (the message says which).
pub fn prepare(device: Device) -> Result<Device, Skipped> {
    let Device::Cuda(index) = device else {
        return Ok(device);
    };
    if real_gpu_requested() {
        // Tests compare f32 results with f64 references at f32 tolerances: convolutions must
        // not take TF32's 10-bit products, which `backends::cudnn::allow_tf32` allows by
        // default (as PyTorch's own test suite turns it off for such comparisons).
        ember_tensor::backends::cudnn::set_allow_tf32(false);
        assert!(
            cuda::is_available() && !cuda::is_emulated(),
            "{ENV_GPU_TEST} is set but no real CUDA device is available: {}",
            cuda::unavailable_reason().unwrap_or_else(|| "the emulator is the driver".into())
        );
        let count = cuda::device_count();
        if index >= count {
            return Err(Skipped {
                device,
                reason: format!(
                    "{ENV_GPU_TEST}=1 and this machine has {count} CUDA device(s); the emulated \
                     passes run this test on the emulator's {device}"
                ),
            });
        }
        return Ok(device);
    }
    if let Err(e) = cuda::use_emulator(EmulatorConfig::devices(EMULATED_DEVICES)) {
        // Another test of this process may have installed an emulator from
        // `EMBER_CUDA_EMULATOR` first; any emulator with the device is as good.
        assert!(
            cuda::is_emulated() && index < cuda::device_count(),
            "{device} is needed but the emulator cannot be installed: {e}"
        );
    }
    assert!(
        index < cuda::device_count(),
        "{device} is needed but the emulator has {} device(s)",
        cuda::device_count()
    );
    Ok(device)
}

/// The devices a one-device test runs on: `cpu` and `cuda:0` (emulated, or real under
/// `EMBER_GPU_TEST=1`; Note [Test devices]).
///
/// # Panics
///
/// As [`prepare`], when `cuda:0` cannot be had.
pub fn devices() -> Vec<Device> {
    [Device::Cpu, Device::Cuda(0)]
        .into_iter()
        .filter_map(|d| prepare(d).ok())
        .collect()
}

/// The devices of a test that needs two CUDA devices: `cpu`, `cuda:0` and `cuda:1`; `cuda:1`
/// is left out (after an `ember-skip-part:` line naming `test`, Note [Skipped tests]) on a
/// machine with a single real GPU under `EMBER_GPU_TEST=1`.
///
/// # Panics
///
/// As [`prepare`], when `cuda:0` cannot be had.
pub fn devices_with_two_gpus(test: &str) -> Vec<Device> {
    [Device::Cpu, Device::Cuda(0), Device::Cuda(1)]
        .into_iter()
        .filter_map(|d| match prepare(d) {
            Ok(d) => Some(d),
            Err(s) => {
                crate::skip_part(format_args!("{test} on {s}"));
                None
            }
        })
        .collect()
}

/// What a test body returns: `()` or a `Result` whose error is printed in the failure.
pub trait TestOutcome {
    /// `Ok` when the body passed, the error in words otherwise.
    fn into_outcome(self) -> Result<(), String>;
}

impl TestOutcome for () {
    fn into_outcome(self) -> Result<(), String> {
        Ok(())
    }
}

impl<E: std::fmt::Display> TestOutcome for Result<(), E> {
    fn into_outcome(self) -> Result<(), String> {
        self.map_err(|e| e.to_string())
    }
}

/// Runs one test body on `device`, as the functions [`test_device!`](crate::test_device)
/// stamps do: makes the device ready ([`prepare`]), calls `body(&device)`, and panics naming
/// the test and the device when the body returns an error. A device whose absence is
/// allowed ends the test as skipped: `ember-skip: <test> on <device> ...` (Note [Skipped
/// tests]).
///
/// # Panics
///
/// When the body fails or panics, or the device cannot be had (see [`prepare`]).
#[track_caller]
pub fn run_on<R: TestOutcome>(test: &str, device: Device, body: impl FnOnce(&Device) -> R) {
    let device = match prepare(device) {
        Ok(d) => d,
        Err(s) => crate::skip!("{test} on {s}"),
    };
    if let Err(e) = body(&device).into_outcome() {
        panic!("{test} failed on {device}: {e}");
    }
}
