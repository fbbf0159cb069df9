//! Ember's CUDA kernels (`kernels/*.cu` in the workspace), in the two forms a process can use:
//!
//! - the **fatbin** `cargo xtask kernels` builds with nvcc (SASS for sm_75..sm_120 plus
//!   compute_90 PTX), embedded when it existed at build time: [`fatbin`], [`has_fatbin`];
//!   a real GPU with a build without it is Note [No fatbin] ([`kernels_missing`]);
//! - the **same sources compiled for the CPU** against `kernels/emu/cuda_emu.h`, linked into
//!   every build and handed to `ember-device`'s emulator by [`register_emulated`].
//!
//! [`load_module`] loads whichever one the driver needs; [`Module`] wraps it with a cache of
//! function handles. Kernels are looked up by their `extern "C"` names (`{op}_{dtype}` such as
//! `badd_f16`, listed in each `.cu` file's header comment) and launched with
//! [`ember_device::driver::Driver::launch_kernel`] (or [`Module::launch`]); [`KernelArgs`]
//! builds the `void**` parameter array, [`StridedLayout`] mirrors the kernels'
//! strided-operand struct and [`launch_config_elementwise`] gives the elementwise kernels'
//! geometry ([`launch_config_1d`] the other grid-stride kernels').
//!
//! ```
//! use ember_device::{cuda, driver::{LaunchConfig, StreamHandle}, driver::emulator::EmulatorConfig};
//! use ember_kernels::{KernelArgs, load_module};
//!
//! cuda::use_emulator(EmulatorConfig::devices(2))?;
//! let driver = cuda::driver()?;
//! let module = load_module(driver.as_ref(), 0)?;
//! let fill = driver.module_function(module, "ember_fill_f32")?;
//! let out = driver.malloc(0, 100 * 4)?;
//! let mut args = KernelArgs::new();
//! args.ptr(out).push(100i64).push(2.5f32);
//! let config = LaunchConfig { grid: (1, 1, 1), block: (128, 1, 1), shared_mem_bytes: 0 };
//! // SAFETY: the arguments match `ember_fill_f32(float*, i64, float)`; `out` holds 100 floats.
//! unsafe { driver.launch_kernel(fill, config, StreamHandle::DEFAULT, &mut args.params())? };
//! let mut bytes = vec![0u8; 400];
//! driver.memcpy_dtoh(&mut bytes, out, StreamHandle::DEFAULT)?;
//! assert!(bytes.chunks(4).all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 2.5));
//! driver.free(0, out)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod attention;
mod module;

pub use module::{
    BLOCK_1D, ELEMENTWISE_BLOCKS_PER_SM, ELEMENTWISE_UNROLL, MAX_GRID_1D, Module, launch_config_1d,
    launch_config_elementwise,
};

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Once;

use ember_device::DeviceError;
use ember_device::driver::emulator::{EmulatedKernel, register_kernel};
use ember_device::driver::{DevicePtr, Driver, DriverKind, ModuleHandle};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum KernelsError {
    /// The build did not find `target/kernels/ember.fatbin` (Note [No fatbin]).
    #[error("CUDA kernels were not built: run `cargo xtask kernels --install-nvcc`")]
    NoFatbin,
    /// A shape with more dimensions than the kernels index.
    #[error("{op}: {rank} dimensions, the CUDA kernels support at most {MAX_DIMS}")]
    TooManyDims {
        /// The operation that built the layout.
        op: &'static str,
        /// The rank it was given.
        rank: usize,
    },
    /// A launch whose geometry the kernels cannot run (named with the op and why).
    #[error("{op}: {detail}")]
    InvalidLaunch {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A driver call failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Into Ember's one error (Note [One error] in `ember-error`): a device error is carried as
/// itself, the innermost error.
impl From<KernelsError> for ember_error::Error {
    fn from(e: KernelsError) -> Self {
        match e {
            KernelsError::Device(d) => d.into(),
            e => ember_error::Error::new(e.kind(), e),
        }
    }
}

impl KernelsError {
    /// What kind of failure this is (see [`ErrorKind`](ember_device::ErrorKind)).
    pub fn kind(&self) -> ember_device::ErrorKind {
        match self {
            KernelsError::NoFatbin => ember_device::ErrorKind::Unsupported,
            KernelsError::TooManyDims { .. } => ember_device::ErrorKind::Shape,
            KernelsError::InvalidLaunch { .. } => ember_device::ErrorKind::InvalidArgument,
            KernelsError::Device(e) => e.kind(),
        }
    }
}

/// The most dimensions a [`StridedLayout`] holds (`ember::MAX_DIMS` in `kernels/ember.cuh`).
pub const MAX_DIMS: usize = 8;

/// One operand of a strided kernel, passed by value (`ember::StridedLayout` in
/// `kernels/ember.cuh`; the two must stay identical). `sizes` is the iteration shape (the
/// output's, after broadcasting), `strides` this operand's strides in elements for it (0
/// where it is broadcast). `contiguous` is nonzero when element `i` of the iteration is
/// element `i` of the operand, which selects the kernels' fast path.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StridedLayout {
    /// Dimensions in use (the rest of the arrays is ignored).
    pub rank: i32,
    /// Nonzero for the contiguous fast path.
    pub contiguous: i32,
    /// Iteration shape.
    pub sizes: [i64; MAX_DIMS],
    /// Strides in elements.
    pub strides: [i64; MAX_DIMS],
}

impl StridedLayout {
    /// The layout of an operand with `strides` over the iteration shape `sizes`;
    /// `contiguous` is derived (row-major strides of `sizes`, ignoring size-1 dimensions).
    pub fn new(sizes: &[usize], strides: &[isize]) -> Result<StridedLayout, KernelsError> {
        let rank = sizes.len();
        if rank > MAX_DIMS || strides.len() != rank {
            return Err(KernelsError::TooManyDims {
                op: "StridedLayout::new",
                rank: rank.max(strides.len()),
            });
        }
        let mut layout = StridedLayout {
            rank: rank as i32,
            contiguous: 0,
            sizes: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        let mut expected = 1isize;
        let mut contiguous = true;
        for d in (0..rank).rev() {
            layout.sizes[d] = sizes[d] as i64;
            layout.strides[d] = strides[d] as i64;
            if sizes[d] != 1 && strides[d] != expected {
                contiguous = false;
            }
            expected *= sizes[d] as isize;
        }
        layout.contiguous = i32::from(contiguous);
        Ok(layout)
    }

    /// A contiguous row-major operand of shape `sizes`.
    pub fn contiguous(sizes: &[usize]) -> Result<StridedLayout, KernelsError> {
        let mut strides = vec![0isize; sizes.len()];
        let mut s = 1isize;
        for d in (0..sizes.len()).rev() {
            strides[d] = s;
            s *= sizes[d] as isize;
        }
        StridedLayout::new(sizes, &strides)
    }
}

/// Owned kernel arguments and the `void**` array the driver takes, in parameter order.
/// Each value is stored 8-byte aligned; device pointers are pushed as their `u64` address.
#[derive(Debug, Default)]
pub struct KernelArgs {
    values: Vec<Box<[u64]>>,
}

impl KernelArgs {
    /// No arguments yet.
    pub fn new() -> KernelArgs {
        KernelArgs::default()
    }

    /// Append a by-value argument (a scalar, a `#[repr(C)]` struct such as
    /// [`StridedLayout`], an f16/bf16 as its bits).
    pub fn push<T: Copy + 'static>(&mut self, value: T) -> &mut KernelArgs {
        let size = std::mem::size_of::<T>();
        let mut words = vec![0u64; size.div_ceil(8).max(1)].into_boxed_slice();
        // SAFETY: `words` has at least `size` bytes, `value` is `size` bytes of a Copy type,
        // and the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&value as *const T).cast::<u8>(),
                words.as_mut_ptr().cast::<u8>(),
                size,
            );
        }
        self.values.push(words);
        self
    }

    /// Append a device-pointer argument.
    pub fn ptr(&mut self, ptr: DevicePtr) -> &mut KernelArgs {
        self.push(ptr.0)
    }

    /// The parameter array: `params[i]` points at the i-th argument, valid while `self` is
    /// neither moved out of nor changed.
    pub fn params(&mut self) -> Vec<*mut c_void> {
        self.values
            .iter_mut()
            .map(|w| w.as_mut_ptr().cast::<c_void>())
            .collect()
    }
}

// ---- the fatbin ---------------------------------------------------------------------------

#[cfg(ember_fatbin)]
static FATBIN_BYTES: &[u8] = include_bytes!(env!("EMBER_KERNELS_FATBIN_PATH"));
#[cfg(ember_fatbin)]
static FATBIN_NAMES: &str = include_str!(env!("EMBER_KERNELS_NAMES_PATH"));

/// Whether this build embeds the fatbin of `cargo xtask kernels`.
pub fn has_fatbin() -> bool {
    cfg!(ember_fatbin)
}

/// `EMBER_PRETEND_NO_KERNELS=1`: this process behaves as a build without its CUDA kernels on
/// every driver, the emulator included (Note [No fatbin]), so that what a GPU machine
/// without the fatbin sees can be tested where there is no GPU.
pub const ENV_PRETEND_NO_KERNELS: &str = "EMBER_PRETEND_NO_KERNELS";

// Note [No fatbin]: the kernels of a real GPU are the fatbin `cargo xtask kernels` builds
// with nvcc, embedded when `build.rs` finds it; a checkout where it never ran builds and runs
// everywhere, but has nothing to launch on a real GPU. `cuda::is_available()` stays the
// driver's answer (as PyTorch's, which looks at the driver and the devices only); what can
// run is asked apart, through `kernels_missing(driver kind)`: the emulator always has its
// kernels (compiled for the CPU into every build), a real driver has them when this build
// embeds the fatbin. `ember info` reports it (`cuda_kernels_missing`), `ember train
// --device auto` then trains on the CPU and says why, an explicit `--device cuda` is an
// error saying the same, and `load_module` refuses with the same words. The decision is
// `kernels_present`, a pure function; `EMBER_PRETEND_NO_KERNELS=1` makes it say "absent"
// on any driver, for the tests of these paths on machines without a GPU.

/// Whether a process whose CUDA driver is of `kind` has Ember's kernels for it (Note [No
/// fatbin]): never when `pretend_absent`; always on the emulator; on a real driver when the
/// build has the fatbin.
pub fn kernels_present(kind: DriverKind, has_fatbin: bool, pretend_absent: bool) -> bool {
    !pretend_absent && (kind == DriverKind::Emulated || has_fatbin)
}

/// Whether `EMBER_PRETEND_NO_KERNELS=1` is set.
fn pretend_absent() -> bool {
    std::env::var_os(ENV_PRETEND_NO_KERNELS).is_some_and(|v| v == "1")
}

/// Why this process cannot launch Ember's kernels on the devices of a driver of `kind`
/// ([`KernelsError::NoFatbin`], Note [No fatbin]), or `None` when it can.
pub fn kernels_missing(kind: DriverKind) -> Option<KernelsError> {
    (!kernels_present(kind, has_fatbin(), pretend_absent())).then_some(KernelsError::NoFatbin)
}

/// The embedded fatbin, copied once into 16-byte-aligned memory (`include_bytes!` promises no
/// alignment and `cuModuleLoadData` wants it), or [`KernelsError::NoFatbin`].
pub fn fatbin() -> Result<&'static [u8], KernelsError> {
    #[cfg(ember_fatbin)]
    {
        use std::sync::OnceLock;
        static ALIGNED: OnceLock<Box<[u128]>> = OnceLock::new();
        let words = ALIGNED.get_or_init(|| {
            let mut words = vec![0u128; FATBIN_BYTES.len().div_ceil(16)].into_boxed_slice();
            // SAFETY: `words` holds at least FATBIN_BYTES.len() bytes; they do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    FATBIN_BYTES.as_ptr(),
                    words.as_mut_ptr().cast::<u8>(),
                    FATBIN_BYTES.len(),
                );
            }
            words
        });
        // SAFETY: `words` is a 'static allocation of at least FATBIN_BYTES.len() initialised
        // bytes, never written again.
        Ok(unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), FATBIN_BYTES.len()) })
    }
    #[cfg(not(ember_fatbin))]
    Err(KernelsError::NoFatbin)
}

/// The entry points in the embedded fatbin (as ptxas reported them), sorted, or
/// [`KernelsError::NoFatbin`].
pub fn fatbin_kernel_names() -> Result<Vec<&'static str>, KernelsError> {
    #[cfg(ember_fatbin)]
    {
        let mut names: Vec<&'static str> = FATBIN_NAMES
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        names.sort_unstable();
        Ok(names)
    }
    #[cfg(not(ember_fatbin))]
    Err(KernelsError::NoFatbin)
}

// ---- the emulated kernels -------------------------------------------------------------------

unsafe extern "C" {
    fn ember_emu_kernel_count() -> usize;
    fn ember_emu_kernel_at(
        i: usize,
        name: *mut *const c_char,
        kernel: *mut Option<EmulatedKernel>,
    ) -> c_int;
}

/// The kernels compiled for the CPU in this build, as (name, function), in registration order.
fn emulated_kernels() -> Vec<(&'static str, EmulatedKernel)> {
    // SAFETY: a plain read of the C++ registry, complete once static constructors ran
    // (before main).
    let count = unsafe { ember_emu_kernel_count() };
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let mut name: *const c_char = std::ptr::null();
        let mut kernel: Option<EmulatedKernel> = None;
        // SAFETY: `i < count`; both out-pointers are valid for one write.
        let status = unsafe { ember_emu_kernel_at(i, &mut name, &mut kernel) };
        if status != 0 || name.is_null() {
            continue;
        }
        // SAFETY: the name is a NUL-terminated string literal in the C++ objects ('static).
        let name = unsafe { CStr::from_ptr(name) };
        if let (Ok(name), Some(kernel)) = (name.to_str(), kernel) {
            out.push((name, kernel));
        }
    }
    out
}

/// Names of the kernels compiled for the CPU emulator in this build, sorted.
pub fn emulated_kernel_names() -> Vec<&'static str> {
    let mut names: Vec<_> = emulated_kernels().into_iter().map(|(n, _)| n).collect();
    names.sort_unstable();
    names
}

/// Register every CPU-compiled kernel with `ember-device`'s emulator (once per process);
/// returns how many there are.
pub fn register_emulated() -> usize {
    static ONCE: Once = Once::new();
    let kernels = emulated_kernels();
    ONCE.call_once(|| {
        for &(name, kernel) in &kernels {
            register_kernel(name, kernel);
        }
    });
    kernels.len()
}

/// Load Ember's kernels as a module on `device`: the CPU-compiled kernels under the emulator
/// (registering them first), the embedded fatbin on a real driver
/// ([`KernelsError::NoFatbin`] when this build has none, or under
/// `EMBER_PRETEND_NO_KERNELS=1`: Note [No fatbin]).
pub fn load_module(driver: &dyn Driver, device: usize) -> Result<ModuleHandle, KernelsError> {
    if let Some(e) = kernels_missing(driver.kind()) {
        return Err(e);
    }
    match driver.kind() {
        DriverKind::Emulated => {
            register_emulated();
            Ok(driver.module_load(device, &[])?)
        }
        DriverKind::Real => Ok(driver.module_load(device, fatbin()?)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_present_on_the_emulator_and_with_the_fatbin() {
        use DriverKind::{Emulated, Real};
        assert!(kernels_present(Emulated, false, false));
        assert!(kernels_present(Emulated, true, false));
        assert!(kernels_present(Real, true, false));
        assert!(
            !kernels_present(Real, false, false),
            "a GPU without the fatbin"
        );
        for kind in [Emulated, Real] {
            for fatbin in [false, true] {
                assert!(!kernels_present(kind, fatbin, true), "pretending");
            }
        }
        assert_eq!(
            KernelsError::NoFatbin.to_string(),
            "CUDA kernels were not built: run `cargo xtask kernels --install-nvcc`"
        );
    }
}
