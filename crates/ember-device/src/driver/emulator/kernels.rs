//! The emulator's process-wide kernel registry.
//!
//! Under the emulator, [`crate::driver::Driver::module_load`] ignores the image and returns a
//! module over this registry; [`crate::driver::Driver::module_function`] looks a name up in it
//! and [`crate::driver::Driver::launch_kernel`] calls the registered function. The registry is
//! empty until someone registers kernels: the CUDA backend registers the `kernels/*.cu`
//! sources compiled for the CPU; tests may register small Rust functions.
//!
//! A kernel is an `unsafe extern "C" fn(*const KernelLaunch) -> c_int` returning 0 on success.
//! It receives the launch geometry and the `void**` parameter array exactly as the launcher
//! built it for `cuLaunchKernel`: each `params[i]` points at the i-th argument's value.
//! Device-pointer arguments hold tagged emulator addresses (see Note [Tagged device
//! addresses]); the kernel turns each into a host pointer with
//! `(launch.translate)(launch.translate_ctx, address)`, which returns null for an address not
//! inside a live allocation. The emulator's memory lock is held for the whole launch, so no
//! allocation is freed under a running kernel, and launches are serialised.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::RwLock;

/// What an emulated kernel receives. See the module docs.
#[repr(C)]
#[derive(Debug)]
pub struct KernelLaunch {
    /// Blocks in the grid (x, y, z).
    pub grid: [u32; 3],
    /// Threads in a block (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
    /// The parameter array: `params[i]` points at the i-th argument.
    pub params: *mut *mut c_void,
    /// Entries in `params`.
    pub num_params: usize,
    /// Opaque context for `translate`.
    pub translate_ctx: *const c_void,
    /// Host address of a tagged device address, or null if it is not inside a live
    /// allocation. Valid only during the launch.
    pub translate: unsafe extern "C" fn(ctx: *const c_void, address: u64) -> *mut c_void,
}

/// An emulated kernel: returns 0 on success, anything else is reported as a launch failure.
pub type EmulatedKernel = unsafe extern "C" fn(launch: *const KernelLaunch) -> c_int;

static REGISTRY: RwLock<BTreeMap<String, EmulatedKernel>> = RwLock::new(BTreeMap::new());

/// Register (or replace) the emulated kernel `name`; returns the one it replaced. Modules
/// see kernels registered before `module_function` looks them up.
pub fn register_kernel(name: &str, kernel: EmulatedKernel) -> Option<EmulatedKernel> {
    let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    registry.insert(name.to_string(), kernel)
}

/// The kernel registered as `name`, if any.
pub fn lookup_kernel(name: &str) -> Option<EmulatedKernel> {
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    registry.get(name).copied()
}

/// Names of all registered kernels, sorted.
pub fn registered_kernels() -> Vec<String> {
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    registry.keys().cloned().collect()
}
