//! [`RealDriver`]: the [`Driver`] seam on NVIDIA's driver through cudarc's raw bindings,
//! loaded at run time (see `docs/cuda-without-gpu.md`); cuDNN convolutions in `real/cudnn.rs`
//! (the legacy API) and `real/cudnn_graph.rs` (the graph API, with its plan cache).
//!
//! The driver API methods make the device's primary context current and issue one or two
//! checked driver calls; the library calls keep state of their own (cuBLAS handles per
//! device here, cuDNN's handles and graph plans, NCCL communicators, CUPTI's buffers in
//! their modules). Handles are the driver's own pointers as `u64`, kept in tables so that
//! unknown or destroyed handles are [`DeviceError::InvalidHandle`] rather than undefined
//! behaviour. [`StreamHandle::DEFAULT`] is the legacy null stream of the device the
//! operation names (the pointer's device for copies and memset, via
//! `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); stream-only calls on it cover every device.
//! Primary contexts are retained at probe and never released: the driver is process-global.
//! Without a GPU only [`RealDriver::probe`] and the parts that are plain data (cuDNN's graph
//! as data and its plan rules, CUPTI's record layouts) are exercised.

use std::collections::HashMap;
use std::ffi::{c_int, c_longlong, c_void};
use std::sync::{Mutex, MutexGuard};

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys;

use crate::driver::{
    DeviceProperties, DevicePtr, Driver, DriverKind, EventHandle, FunctionHandle, GemmDesc,
    GemmType, LaunchConfig, ModuleHandle, StreamHandle,
};
use crate::error::{DeviceError, Result};

/// Oldest driver the bindings (`cuda-13000`) support: CUDA 13.0 (R580).
pub const MIN_DRIVER_VERSION: i32 = 13000;
/// Oldest cuBLAS accepted (`cublasGetVersion` = major·10000 + minor·100 + patch): 13.0.
pub const MIN_CUBLAS_VERSION: i32 = 130000;

fn check(call: &'static str, status: sys::CUresult) -> Result<()> {
    match status {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        other => Err(DeviceError::driver(call, format!("{other:?}"))),
    }
}

fn check_blas(call: &'static str, status: cublas_sys::cublasStatus_t) -> Result<()> {
    match status {
        cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        other => Err(DeviceError::driver(call, format!("{other:?}"))),
    }
}

#[derive(Debug, Default)]
struct Tables {
    /// stream → device
    streams: HashMap<u64, usize>,
    /// event → (device, timing)
    events: HashMap<u64, (usize, bool)>,
    /// module → device
    modules: HashMap<u64, usize>,
    /// function → device
    functions: HashMap<u64, usize>,
    /// device → cuDNN handle, or why cuDNN cannot be used (probed once per device)
    cudnn: HashMap<usize, std::result::Result<u64, String>>,
    /// NCCL communicator → (device, rank, ranks)
    nccl: HashMap<u64, (usize, usize, usize)>,
}

/// NVIDIA's driver behind the [`Driver`] seam. Build with [`RealDriver::probe`].
#[derive(Debug)]
pub struct RealDriver {
    version: i32,
    /// Per device: (CUdevice, retained primary context as an address).
    devices: Vec<(sys::CUdevice, usize)>,
    tables: Mutex<Tables>,
    /// Held across a cuDNN call and the `cudnnSetStream` before it: a handle serves one
    /// call at a time. It keeps the graph API's plans (Note [cuDNN's graph API]).
    cudnn_calls: Mutex<cudnn_graph::PlanCache>,
    /// cuBLAS handles per (device, thread) and workspaces per (handle, stream): (device,
    /// address, bytes). Note [cuBLAS handles].
    blas: crate::driver::blas_handles::BlasHandles<(usize, DevicePtr, usize)>,
}

impl RealDriver {
    /// Load and initialise the CUDA driver, or say why it cannot be used. Never panics: the
    /// library's presence is checked first, and the calls run under `catch_unwind` with the
    /// panic hook silenced (a driver older than the bindings panics on a missing symbol).
    pub fn probe() -> std::result::Result<RealDriver, String> {
        // SAFETY: only tries to dlopen the library and closes it again.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) found".to_string());
        }
        match quietly(Self::init) {
            Some(result) => result,
            None => Err("the CUDA driver library could not be used (a driver entry point is missing: driver too old? needs CUDA 13.0 (R580) or newer)".to_string()),
        }
    }

    fn init() -> std::result::Result<RealDriver, String> {
        // SAFETY: cuInit has no preconditions.
        let status = unsafe { sys::cuInit(0) };
        if status == sys::CUresult::CUDA_ERROR_NO_DEVICE {
            return Err("no CUDA device found".to_string());
        }
        check("cuInit", status).map_err(|e| e.to_string())?;
        let mut version: c_int = 0;
        // SAFETY: the out-pointer is a valid local.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut version)
        })
        .map_err(|e| e.to_string())?;
        if version < MIN_DRIVER_VERSION {
            return Err(format!(
                "driver too old: it supports CUDA {}.{}, Ember needs CUDA 13.0 (R580) or newer",
                version / 1000,
                (version % 1000) / 10
            ));
        }
        let mut count: c_int = 0;
        // SAFETY: the out-pointer is a valid local; the driver is initialised.
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })
        .map_err(|e| e.to_string())?;
        if count <= 0 {
            return Err("no CUDA device found".to_string());
        }
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let mut dev: sys::CUdevice = 0;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointers are valid locals; `ordinal < count`.
            check("cuDeviceGet", unsafe {
                sys::cuDeviceGet(&mut dev, ordinal)
            })
            .and_then(|()| {
                // SAFETY: `dev` is a device handle from cuDeviceGet.
                check("cuDevicePrimaryCtxRetain", unsafe {
                    sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
                })
            })
            .map_err(|e| e.to_string())?;
            devices.push((dev, ctx as usize));
        }
        Ok(RealDriver {
            version,
            devices,
            tables: Mutex::new(Tables::default()),
            cudnn_calls: Mutex::new(cudnn_graph::PlanCache::default()),
            blas: Default::default(),
        })
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make `device`'s primary context current on this thread.
    fn bind(&self, device: usize) -> Result<sys::CUdevice> {
        let &(dev, ctx) = self.devices.get(device).ok_or(DeviceError::InvalidIndex {
            index: device,
            count: self.devices.len(),
        })?;
        // SAFETY: `ctx` is a primary context retained in `init` and never released.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(ctx as sys::CUcontext)
        })?;
        Ok(dev)
    }

    fn device_of_ptr(&self, call: &'static str, ptr: DevicePtr) -> Result<usize> {
        let mut ordinal: c_int = -1;
        // SAFETY: the out-pointer is a valid c_int for this attribute.
        check(call, unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut c_int).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr.0,
            )
        })?;
        usize::try_from(ordinal).map_err(|_| DeviceError::driver(call, "CUDA_ERROR_INVALID_VALUE"))
    }

    /// The stream's device and raw stream, binding that device's context. For the default
    /// stream, the device is `device` if given, else the device of `ptr`.
    fn stream(
        &self,
        call: &'static str,
        stream: StreamHandle,
        device: Option<usize>,
        ptr: Option<DevicePtr>,
    ) -> Result<(usize, sys::CUstream)> {
        let device = if stream == StreamHandle::DEFAULT {
            match (device, ptr) {
                (Some(d), _) => d,
                (None, Some(p)) => self.device_of_ptr(call, p)?,
                (None, None) => 0,
            }
        } else {
            *self
                .tables()
                .streams
                .get(&stream.0)
                .ok_or(DeviceError::InvalidHandle {
                    what: call,
                    kind: "stream",
                    handle: stream.0,
                })?
        };
        self.bind(device)?;
        Ok((device, stream.0 as sys::CUstream))
    }

    fn event(&self, call: &'static str, event: EventHandle) -> Result<(usize, bool)> {
        let e = self.tables().events.get(&event.0).copied();
        let (device, timing) = e.ok_or(DeviceError::InvalidHandle {
            what: call,
            kind: "event",
            handle: event.0,
        })?;
        self.bind(device)?;
        Ok((device, timing))
    }

    fn attribute(&self, dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
        let mut value: c_int = 0;
        // SAFETY: `dev` is a valid device handle; the out-pointer is a valid local.
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(&mut value, attr, dev)
        })?;
        Ok(value)
    }

    /// The calling thread's cuBLAS handle on `device` (Note [cuBLAS handles]).
    fn cublas(&self, device: usize) -> Result<cublas_sys::cublasHandle_t> {
        self.blas
            .handle(device, || self.create_cublas(device))
            .map(|h| h as cublas_sys::cublasHandle_t)
    }

    fn create_cublas(&self, device: usize) -> Result<u64> {
        self.bind(device)?;
        // SAFETY: only checks whether the library can be loaded.
        if !unsafe { cublas_sys::is_culib_present() } {
            return Err(DeviceError::Unsupported {
                what: "GEMM (libcublas.so not found)".into(),
                driver: "real",
            });
        }
        let mut handle: cublas_sys::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the device's context is current.
        check_blas("cublasCreate", unsafe {
            cublas_sys::cublasCreate_v2(&mut handle)
        })?;
        let mut version: c_int = 0;
        // SAFETY: `handle` was just created.
        check_blas("cublasGetVersion", unsafe {
            cublas_sys::cublasGetVersion_v2(handle, &mut version)
        })?;
        if version < MIN_CUBLAS_VERSION {
            // SAFETY: `handle` was created above and is not used again.
            let _ = unsafe { cublas_sys::cublasDestroy_v2(handle) };
            return Err(DeviceError::Driver {
                call: "cublasGetVersion",
                code: "CUBLAS_STATUS_NOT_SUPPORTED".into(),
                detail: format!(
                    "loaded cuBLAS version {version}, Ember needs cuBLAS 13.0 or newer"
                ),
            });
        }
        Ok(handle as u64)
    }

    /// The workspace of `handle` on `stream` of `device`: (device, address, bytes),
    /// allocated on first use with PyTorch's size (Note [cuBLAS handles]).
    fn cublas_workspace(
        &self,
        device: usize,
        handle: cublas_sys::cublasHandle_t,
        stream: StreamHandle,
    ) -> Result<(usize, DevicePtr, usize)> {
        self.blas.workspace(handle as u64, stream, || {
            let dev = self.bind(device)?;
            let major = self.attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )?;
            let config = std::env::var("CUBLAS_WORKSPACE_CONFIG").ok();
            let bytes = crate::driver::workspace_size(config.as_deref(), major);
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: the out-pointer is a valid local; the device's context is current.
            check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
            Ok((device, DevicePtr(ptr), bytes))
        })
    }

    /// Frees the cuBLAS workspaces of a stream being destroyed.
    fn free_cublas_workspaces(&self, stream: StreamHandle) {
        for (device, ptr, _) in self.blas.release_stream(stream) {
            if self.bind(device).is_ok() {
                // SAFETY: `ptr` came from cuMemAlloc in `cublas_workspace` and left the
                // table above, so nothing uses it again; the stream's work is done (the
                // stream is being destroyed after its caller synchronised it, or cuMemFree
                // waits for the device).
                let _ = unsafe { sys::cuMemFree_v2(ptr.0) };
            }
        }
    }
}

/// `f`'s result, or `None` if it panicked, with the panic hook silenced meanwhile: cudarc's
/// dynamically loaded bindings panic on a missing symbol, which the probes of the driver and
/// the libraries turn into a reason instead.
fn quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Option<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(f);
    std::panic::set_hook(hook);
    outcome.ok()
}

mod cudnn;
mod cudnn_graph;
mod cupti;
mod driver_impl;
mod nccl;

pub use cudnn::MIN_CUDNN_VERSION;
pub use cudnn_graph::{CudnnApi, ENV_CUDNN_API, GRAPH_ALGO_BASE};
pub use nccl::{MIN_NCCL_VERSION, probe as probe_nccl};
