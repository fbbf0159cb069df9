//! The CPU emulator of the CUDA driver. See Note [The driver seam] and Note [Tagged device
//! addresses].
//!
//! Note [Emulated streams]:
//!
//! Every operation enqueued on a stream (copies, memset, kernel launches, GEMM, convolutions,
//! NCCL collectives (Note [Emulated NCCL]), event records) runs to completion at enqueue time, on the calling thread. That is one valid
//! in-order schedule: each stream's work completes in order, and every cross-stream ordering
//! a program establishes with events holds trivially. So `stream_synchronize`,
//! `event_synchronize` and `stream_wait_event` only validate their handles, `stream_query`
//! and `event_query` are always `true`, and an event's timestamp is the [`Instant`] at which
//! it was recorded. Programs that forget to synchronise are not caught by timing (the
//! caching allocator's `record_stream` rules are tested by their own bookkeeping instead),
//! except a host buffer an asynchronous copy reads that is rewritten too early, Note [Async
//! host reads].
//!
//! Handles are validated: unknown or destroyed streams and events are
//! [`DeviceError::InvalidHandle`]. A created stream belongs to one device; work on it must
//! target that device's memory (device-to-device copies may read or write any device, as
//! peer copies do). [`StreamHandle::DEFAULT`] is valid on every device and resolves to the
//! device the operation names: the destination of `memcpy_htod`, `memset_d8_async` and
//! `memcpy_dtod_async`, the source of `memcpy_dtoh`, the event's device for `event_record`,
//! the function's module device for `launch_kernel`, and the `device` argument of `gemm`
//! and the convolution calls.
//! Calls that take only a stream (`stream_synchronize`, `stream_query`,
//! `stream_wait_event`) accept it as is: there is nothing pending on any device.

mod activity;
mod blas;
mod config;
mod conv;
mod cudnn;
mod gemm;
mod host_reads;
mod kernels;
mod launch_trace;
mod memory;
mod nccl;
mod nccl_clique;
mod nccl_net;
mod nccl_run;

pub use activity::{EMULATED_CUPTI_VERSION, ENV_EMULATOR_CUPTI};
pub use blas::thread_gemm_streams;
pub use config::{
    DEFAULT_TOTAL_MEMORY, ENV_EMULATOR, ENV_EMULATOR_MEMORY, EmulatedDeviceConfig, EmulatorConfig,
    MAX_EMULATED_DEVICES, MAX_TOTAL_MEMORY, parse_size,
};
pub use cudnn::{
    ConvCall, EMULATED_CUDNN_VERSION, ENV_EMULATOR_CUDNN, EmulatedCudnn, set_thread_cudnn,
    thread_conv_calls, thread_cudnn,
};
pub use kernels::{
    EmulatedKernel, KernelLaunch, lookup_kernel, register_kernel, registered_kernels,
};
pub use launch_trace::{
    ENV_EMULATOR_TRACE, launch_trace, set_launch_trace, thread_event_calls, thread_host_waits,
    thread_launch_counts,
};
pub use memory::{ADDRESS_TAG, device_of_address, tagged_address};
pub use nccl::{COLLECTIVE_TIMEOUT, EMULATED_NCCL_VERSION};

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::driver::{DevicePtr, EventHandle, StreamHandle};
use crate::error::{DeviceError, Result};

use memory::MemoryState;

/// Alignment of [`crate::driver::Driver::malloc_host`] memory under the emulator.
pub const HOST_ALIGN: usize = 64;

#[derive(Debug, Clone, Copy)]
struct EventState {
    device: usize,
    timing: bool,
    recorded: Option<Instant>,
    /// [`host_reads::HostReads::now`] when recorded.
    reads_seq: u64,
}

#[derive(Debug, Clone)]
struct FunctionState {
    device: usize,
    name: String,
    kernel: EmulatedKernel,
}

#[derive(Debug, Default)]
struct Handles {
    next: u64,
    streams: HashMap<u64, usize>,
    events: HashMap<u64, EventState>,
    modules: HashMap<u64, usize>,
    functions: HashMap<u64, FunctionState>,
    /// Live `malloc_host` blocks: address → bytes.
    host: HashMap<usize, usize>,
    /// Asynchronous copies' host sources not yet known complete (Note [Async host reads]).
    host_reads: host_reads::HostReads,
}

impl Handles {
    fn issue(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// Checked view of emulated memory handed to [`Emulator::with_translator`].
pub struct Translator<'a> {
    state: &'a MemoryState,
}

impl fmt::Debug for Translator<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Translator").finish_non_exhaustive()
    }
}

impl Translator<'_> {
    /// The host address of `[ptr, ptr + len)`, checked to lie inside one live allocation.
    /// The pointer is valid until the [`Emulator::with_translator`] closure returns.
    pub fn translate(&self, ptr: DevicePtr, len: usize) -> Result<*mut u8> {
        self.state.translate("translate", ptr, len)
    }
}

/// The CPU emulator of a CUDA driver: several devices over host memory. See the module docs.
///
/// ```
/// use ember_device::driver::{Driver, StreamHandle, emulator::{Emulator, EmulatorConfig}};
/// let emu = Emulator::new(EmulatorConfig::devices(1)).unwrap();
/// let p = emu.malloc(0, 4).unwrap();
/// emu.memcpy_htod(p, &[1, 2, 3, 4], StreamHandle::DEFAULT).unwrap();
/// let mut back = [0u8; 4];
/// emu.memcpy_dtoh(&mut back, p, StreamHandle::DEFAULT).unwrap();
/// assert_eq!(back, [1, 2, 3, 4]);
/// emu.free(0, p).unwrap();
/// ```
pub struct Emulator {
    config: EmulatorConfig,
    /// Shared with the NCCL threads serving ranks of other processes.
    memory: Arc<Mutex<MemoryState>>,
    handles: Mutex<Handles>,
    nccl: Arc<nccl_clique::NcclShared>,
    activity: activity::ActivityState,
    /// The emulated cuBLAS library (Note [Emulated cuBLAS]).
    blas: blas::EmulatedBlas,
    /// Its handles per (device, thread) and workspaces per (handle, stream), as the real
    /// driver keeps them (Note [cuBLAS handles]).
    blas_handles: crate::driver::blas_handles::BlasHandles<blas::Workspace>,
}

impl fmt::Debug for Emulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Emulator")
            .field("devices", &self.config.devices.len())
            .finish_non_exhaustive()
    }
}

fn invalid_handle(what: &'static str, kind: &'static str, handle: u64) -> DeviceError {
    DeviceError::InvalidHandle { what, kind, handle }
}

impl Emulator {
    /// An emulator presenting the configured devices.
    pub fn new(config: EmulatorConfig) -> Result<Emulator> {
        config.validate()?;
        let memory = MemoryState::new(config.devices.iter().map(|d| d.total_memory));
        let memory = Arc::new(Mutex::new(memory));
        Ok(Emulator {
            config,
            nccl: Arc::new(nccl_clique::NcclShared::new(memory.clone())),
            memory,
            handles: Mutex::new(Handles::default()),
            activity: activity::ActivityState::default(),
            blas: blas::EmulatedBlas::default(),
            blas_handles: Default::default(),
        })
    }

    /// The configuration this emulator was built with.
    pub fn config(&self) -> &EmulatorConfig {
        &self.config
    }

    fn mem(&self) -> MutexGuard<'_, MemoryState> {
        // A panic while holding the lock cannot leave MemoryState inconsistent in a way that
        // matters more than the panic itself; keep serving.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn handles(&self) -> MutexGuard<'_, Handles> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f` on `[ptr, ptr + len)` of emulated memory as a host slice, under the memory
    /// lock (bounds-checked; an access outside one live allocation is an error). `f` must not
    /// call back into this emulator (the lock is not reentrant).
    pub fn with_host_slice<R>(
        &self,
        ptr: DevicePtr,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let mem = self.mem();
        Ok(f(mem.slice("with_host_slice", ptr, len)?))
    }

    /// [`Emulator::with_host_slice`] with a mutable slice.
    pub fn with_host_slice_mut<R>(
        &self,
        ptr: DevicePtr,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let mut mem = self.mem();
        Ok(f(mem.slice_mut("with_host_slice_mut", ptr, len)?))
    }

    /// Run `f` with a [`Translator`] under the memory lock, to turn several device pointers
    /// into host pointers at once (what a kernel launcher needs). No allocation is freed
    /// while `f` runs; `f` must not call back into this emulator.
    pub fn with_translator<R>(&self, f: impl FnOnce(&Translator<'_>) -> R) -> R {
        let mem = self.mem();
        f(&Translator { state: &mem })
    }

    /// Live allocations on a device.
    pub fn live_allocations(&self, device: usize) -> Result<usize> {
        let mem = self.mem();
        mem.devices
            .get(device)
            .map(|d| d.allocation_count())
            .ok_or(self.bad_index(device))
    }

    fn bad_index(&self, device: usize) -> DeviceError {
        DeviceError::InvalidIndex {
            index: device,
            count: self.config.devices.len(),
        }
    }

    fn check_device(&self, device: usize) -> Result<()> {
        if device < self.config.devices.len() {
            Ok(())
        } else {
            Err(self.bad_index(device))
        }
    }

    /// The device of a created stream; `None` for [`StreamHandle::DEFAULT`].
    fn stream_device(&self, call: &'static str, stream: StreamHandle) -> Result<Option<usize>> {
        if stream == StreamHandle::DEFAULT {
            return Ok(None);
        }
        match self.handles().streams.get(&stream.0) {
            Some(&d) => Ok(Some(d)),
            None => Err(invalid_handle(call, "stream", stream.0)),
        }
    }

    /// Check that `ptr` is on the stream's device (any device for the default stream).
    fn check_on_stream(
        &self,
        call: &'static str,
        stream: StreamHandle,
        ptr: DevicePtr,
    ) -> Result<()> {
        let Some(device) = self.stream_device(call, stream)? else {
            return Ok(());
        };
        match device_of_address(ptr) {
            Some(d) if d == device => Ok(()),
            Some(d) => Err(DeviceError::Driver {
                call,
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("{ptr:?} is on cuda:{d}, but the stream belongs to cuda:{device}"),
            }),
            None => Err(DeviceError::Driver {
                call,
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("{ptr:?} is not an emulated device address"),
            }),
        }
    }

    fn event(&self, call: &'static str, event: EventHandle) -> Result<EventState> {
        self.handles()
            .events
            .get(&event.0)
            .copied()
            .ok_or(invalid_handle(call, "event", event.0))
    }
}

/// The address translator handed to emulated kernels: a tagged device address of the
/// launch's memory to the host address behind it.
///
/// # Safety
/// `ctx` must be the `&MemoryState` that `launch_kernel` passes, alive and locked for the
/// whole launch; kernels call this only during their launch.
unsafe extern "C" fn translate_for_kernel(ctx: *const c_void, address: u64) -> *mut c_void {
    // SAFETY: `ctx` is the `&MemoryState` that `launch_kernel` passes, alive and locked for
    // the whole launch, and the kernel calls this only during the launch.
    let state = unsafe { &*(ctx as *const MemoryState) };
    state.translate_base(DevicePtr(address)) as *mut c_void
}

mod driver_impl;

/// A kernel name `cuModuleGetFunction` could take: non-empty, no NUL byte.
fn kernel_name_ok(name: &str) -> bool {
    !name.is_empty() && !name.contains('\0')
}
