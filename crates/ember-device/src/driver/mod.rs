//! The CUDA driver seam. See Note [The driver seam].
//!
//! Note [The driver seam]:
//!
//! Everything Ember does to a GPU goes through [`Driver`]: device count and properties, raw
//! allocation, copies, memset, streams, events, module load, kernel launch (the shape of
//! `cuLaunchKernel`: a function, grid, block, dynamic shared bytes, a stream and a `void**`
//! parameter array) and library calls (GEMM; cuDNN convolutions, see Note [cuDNN convolutions
//! through the seam] in `conv.rs`; NCCL communicators and collectives, see Note [NCCL through the seam] in
//! `nccl.rs`). Two implementations exist:
//!
//! - [`real::RealDriver`]: cudarc's driver API with dynamic loading, over raw device
//!   pointers. Most methods are one or two checked driver calls; the library calls keep
//!   state of their own: cuBLAS and cuDNN handles per device, NCCL communicators, CUPTI's
//!   buffers, and for convolutions cuDNN's graph API with a plan cache and the rules that
//!   choose which plans are made and which one runs (Note [cuDNN's graph API] in
//!   `real/cudnn_graph.rs`).
//! - [`emulator::Emulator`]: host memory behind tagged device addresses that are not
//!   dereferenceable on the host (see Note [Tagged device addresses] in that module), streams,
//!   events with wall-clock timing, several devices with configurable properties.
//!
//! Device activity records (CUPTI's activity API) cross the seam too: Note [CUPTI through the
//! seam] in `activity.rs`.
//!
//! Device pointers are plain `u64`s ([`DevicePtr`]); host code must never dereference one.
//! Streams and events are opaque handles issued by the driver. Stream handle `0`
//! ([`StreamHandle::DEFAULT`]) is each device's default (legacy) stream.

mod activity;
pub(crate) mod blas_handles;
mod conv;
pub mod emulator;
mod nccl;
pub mod real;

pub use activity::{ActivityKind, ActivityRecord};
pub use blas_handles::workspace_size;
pub use conv::{
    ConvAlgoPerf, ConvBuffers, ConvDesc, ConvDirection, ConvProblem, ConvSearch, MAX_ALIGN,
    byte_alignment,
};
pub use nccl::{Collective, NcclComm, NcclType, NcclUniqueId, ReduceOp, nccl_version_string};

use std::ffi::c_void;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// An address in a device's memory. Never dereferenceable on the host.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null device pointer.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// This address moved forward by `bytes`.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

/// A stream: an in-order queue of work on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamHandle(pub u64);

impl StreamHandle {
    /// Each device's default (legacy, "null") stream.
    pub const DEFAULT: StreamHandle = StreamHandle(0);
}

/// An event: a marker recorded on a stream, to wait on or time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventHandle(pub u64);

/// A loaded module (a fatbin, cubin or PTX image, or the emulator's kernel registry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleHandle(pub u64);

/// A kernel function looked up in a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FunctionHandle(pub u64);

/// Which implementation of the seam is behind a [`Driver`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DriverKind {
    /// NVIDIA's driver, loaded at run time.
    Real,
    /// The CPU emulator.
    Emulated,
}

impl DriverKind {
    /// `"real"` or `"emulator"`.
    pub fn name(self) -> &'static str {
        match self {
            DriverKind::Real => "real",
            DriverKind::Emulated => "emulator",
        }
    }
}

/// What the driver reports about a device cheaply (`torch.cuda.get_device_properties`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceProperties {
    /// Marketing name; emulated devices say so in it.
    pub name: String,
    /// Total global memory in bytes.
    pub total_memory: u64,
    /// Compute capability, major.
    pub major: u32,
    /// Compute capability, minor.
    pub minor: u32,
    /// Number of streaming multiprocessors.
    pub multi_processor_count: u32,
    /// L2 cache size in bytes.
    pub l2_cache_size: u64,
    /// Maximum threads per block.
    pub max_threads_per_block: u32,
    /// Maximum resident threads per multiprocessor.
    pub max_threads_per_multi_processor: u32,
    /// Threads per warp.
    pub warp_size: u32,
    /// Shared memory per block available without opting in, bytes.
    pub shared_memory_per_block: u64,
    /// Shared memory per block with opt-in, bytes.
    pub shared_memory_per_block_optin: u64,
    /// 32-bit registers per multiprocessor.
    pub regs_per_multiprocessor: u32,
    /// Global memory bus width in bits.
    pub memory_bus_width: u32,
    /// Peak memory clock in kHz.
    pub memory_clock_rate_khz: u32,
    /// Peak core clock in kHz.
    pub clock_rate_khz: u32,
    /// PCI bus id, `domain:bus:device`.
    pub pci_bus_id: String,
    /// Whether the device is an integrated GPU sharing host memory.
    pub integrated: bool,
    /// Whether this device is the CPU emulator's.
    pub emulated: bool,
}

/// A kernel launch's geometry, as `cuLaunchKernel` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads in a block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

/// Element types a GEMM (and a convolution) can read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GemmType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
}

/// A strided-batched GEMM in cuBLAS's column-major convention:
/// `C[i] = alpha * op(A[i]) * op(B[i]) + beta * C[i]` for `i < batch`, where `op(A)` is
/// `m × k`, `op(B)` is `k × n`, `C` is `m × n`, and element `(r, c)` of a column-major
/// matrix `X` with leading dimension `ld` is at `X + (r + c * ld) * size_of(elem)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmDesc {
    /// Use `A` transposed.
    pub trans_a: bool,
    /// Use `B` transposed.
    pub trans_b: bool,
    /// Rows of `op(A)` and `C`.
    pub m: usize,
    /// Columns of `op(B)` and `C`.
    pub n: usize,
    /// Columns of `op(A)`, rows of `op(B)`.
    pub k: usize,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of the existing `C`.
    pub beta: f64,
    /// First `A`.
    pub a: DevicePtr,
    /// Leading dimension of `A`.
    pub lda: usize,
    /// Elements between consecutive `A` matrices.
    pub stride_a: usize,
    /// First `B`.
    pub b: DevicePtr,
    /// Leading dimension of `B`.
    pub ldb: usize,
    /// Elements between consecutive `B` matrices.
    pub stride_b: usize,
    /// First `C`.
    pub c: DevicePtr,
    /// Leading dimension of `C`.
    pub ldc: usize,
    /// Elements between consecutive `C` matrices.
    pub stride_c: usize,
    /// Number of matrices.
    pub batch: usize,
    /// Element type of `A`, `B` and `C`.
    pub dtype: GemmType,
    /// Allow TF32 tensor cores for f32 inputs (`torch.set_float32_matmul_precision("high")`).
    pub allow_tf32: bool,
}

/// The seam between Ember and a CUDA driver. See Note [The driver seam].
///
/// Device ordinals are `0..device_count()`; every method that takes one returns
/// [`crate::DeviceError::InvalidIndex`] for one out of range. Every failure of the
/// underlying driver becomes [`crate::DeviceError::Driver`] naming the call.
///
/// Ordering: work enqueued on a stream runs in order; work on different streams may
/// overlap unless ordered by events. The synchronous copies ([`Driver::memcpy_htod`],
/// [`Driver::memcpy_dtoh`]) are ordered after all work already enqueued on the given stream
/// and return when the copy is complete.
pub trait Driver: Send + Sync + fmt::Debug {
    /// Which implementation this is.
    fn kind(&self) -> DriverKind;
    /// The driver's CUDA version as `1000 * major + 10 * minor` (e.g. 13000).
    fn driver_version(&self) -> i32;
    /// Number of devices.
    fn device_count(&self) -> usize;
    /// Properties of one device.
    fn properties(&self, device: usize) -> Result<DeviceProperties>;
    /// `(free, total)` bytes of global memory (`cuMemGetInfo`).
    fn mem_get_info(&self, device: usize) -> Result<(u64, u64)>;
    /// Wait for all work on all streams of a device (`cuCtxSynchronize`).
    fn synchronize(&self, device: usize) -> Result<()>;

    // --- memory ------------------------------------------------------------------------
    /// Allocate `bytes` of device memory (`cuMemAlloc`). Out of memory is
    /// [`crate::DeviceError::OutOfMemory`].
    fn malloc(&self, device: usize, bytes: usize) -> Result<DevicePtr>;
    /// Release memory from [`Driver::malloc`] (`cuMemFree`).
    fn free(&self, device: usize, ptr: DevicePtr) -> Result<()>;
    /// Allocate page-locked host memory (`cuMemAllocHost`); the emulator returns plain,
    /// 64-byte-aligned host memory. The pointer is valid for `bytes` bytes.
    fn malloc_host(&self, bytes: usize) -> Result<*mut u8>;
    /// Release memory from [`Driver::malloc_host`].
    ///
    /// # Safety
    /// `ptr` must come from `malloc_host` on this driver with the same `bytes`, not be freed
    /// already, and no copy may still be reading or writing it.
    unsafe fn free_host(&self, ptr: *mut u8, bytes: usize) -> Result<()>;

    // --- copies and memset -------------------------------------------------------------
    /// Copy host bytes to the device, ordered on `stream`; returns when done.
    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8], stream: StreamHandle) -> Result<()>;
    /// Copy device bytes to the host, ordered on `stream`; returns when done.
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: StreamHandle) -> Result<()>;
    /// Enqueue a host-to-device copy from (pinned) host memory on `stream`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `bytes` bytes until the copy has completed on the
    /// stream (synchronise the stream or an event recorded after it).
    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Enqueue a device-to-host copy into (pinned) host memory on `stream`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `bytes` bytes, and not otherwise accessed, until the
    /// copy has completed on the stream.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Enqueue a device-to-device copy (possibly between two devices) on `stream`.
    fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Enqueue setting `bytes` bytes at `dst` to `value` on `stream` (`cuMemsetD8Async`).
    fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;

    // --- streams and events ------------------------------------------------------------
    /// Create a stream on a device.
    fn stream_create(&self, device: usize) -> Result<StreamHandle>;
    /// Destroy a stream (work already enqueued still completes).
    fn stream_destroy(&self, stream: StreamHandle) -> Result<()>;
    /// Wait until all work on the stream is done.
    fn stream_synchronize(&self, stream: StreamHandle) -> Result<()>;
    /// `true` when all work on the stream is done.
    fn stream_query(&self, stream: StreamHandle) -> Result<bool>;
    /// Make future work on `stream` wait for `event`.
    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()>;
    /// Create an event on a device; `timing` enables [`Driver::event_elapsed_ms`].
    fn event_create(&self, device: usize, timing: bool) -> Result<EventHandle>;
    /// Destroy an event.
    fn event_destroy(&self, event: EventHandle) -> Result<()>;
    /// Record the event on a stream: it completes when the work enqueued before it has.
    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()>;
    /// Wait for the event to complete.
    fn event_synchronize(&self, event: EventHandle) -> Result<()>;
    /// `true` when the event has completed (or was never recorded).
    fn event_query(&self, event: EventHandle) -> Result<bool>;
    /// Milliseconds between two completed, timing-enabled events.
    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32>;

    // --- modules, kernels and libraries ------------------------------------------------
    /// Load a module image (fatbin/cubin/PTX for the real driver; the emulator ignores the
    /// bytes and serves the kernels registered in this process).
    fn module_load(&self, device: usize, image: &[u8]) -> Result<ModuleHandle>;
    /// Look a kernel up by its (unmangled, `extern "C"`) name.
    fn module_function(&self, module: ModuleHandle, name: &str) -> Result<FunctionHandle>;
    /// Enqueue a kernel launch on `stream`.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each pointing at a value of that
    /// parameter's exact type, valid for the duration of the call; device pointers among them
    /// must be valid for every access the kernel makes.
    unsafe fn launch_kernel(
        &self,
        function: FunctionHandle,
        config: LaunchConfig,
        stream: StreamHandle,
        params: &mut [*mut c_void],
    ) -> Result<()>;
    /// Enqueue a strided-batched GEMM on `stream` (cuBLAS `cublasGemmStridedBatchedEx` on
    /// a real GPU, the CPU GEMM under the emulator).
    fn gemm(&self, device: usize, stream: StreamHandle, desc: &GemmDesc) -> Result<()>;

    /// The version of the convolution library (cuDNN's `cudnnGetVersion`, e.g. 90100 for
    /// 9.1.0) usable on `device`, loading it and making the device's handle on first use. An
    /// absent or unusable library is [`crate::DeviceError::Unsupported`] saying why; callers
    /// then take another path.
    fn cudnn_version(&self, device: usize) -> Result<usize>;
    /// The algorithms for `problem` on `device`, best (heuristic) or fastest (benchmark)
    /// first (`cudnnGetConvolution*Algorithm_v7` / `cudnnFindConvolution*AlgorithmEx`). A
    /// problem the library does not support is an error (or an empty list).
    fn conv_algorithms(
        &self,
        device: usize,
        stream: StreamHandle,
        problem: &ConvProblem,
        search: ConvSearch,
    ) -> Result<Vec<ConvAlgoPerf>>;
    /// Enqueue one convolution on `stream` (`cudnnConvolutionForward`,
    /// `...BackwardData`, `...BackwardFilter`; the CPU convolution under the emulator).
    fn conv(&self, device: usize, stream: StreamHandle, desc: &ConvDesc) -> Result<()>;

    // --- NCCL (Note [NCCL through the seam]) -------------------------------------------
    /// NCCL's version code (`ncclGetVersion`, e.g. 22304 for 2.23.4), loading the library on
    /// first use. An absent or unusable library is [`crate::DeviceError::Unsupported`]
    /// saying why.
    fn nccl_version(&self) -> Result<i32>;
    /// A fresh clique identity (`ncclGetUniqueId`), for [`Driver::nccl_comm_init_rank`].
    fn nccl_unique_id(&self) -> Result<NcclUniqueId>;
    /// One communicator per listed device, rank `i` on `devices[i]` (`ncclCommInitAll`).
    fn nccl_comm_init_all(&self, devices: &[usize]) -> Result<Vec<NcclComm>>;
    /// This process's rank `rank` of `nranks` in the clique `id`, on `device`
    /// (`ncclCommInitRank`).
    fn nccl_comm_init_rank(
        &self,
        device: usize,
        nranks: usize,
        id: &NcclUniqueId,
        rank: usize,
    ) -> Result<NcclComm>;
    /// `(device, rank, nranks)` of a communicator (`ncclCommCuDevice`, `ncclCommUserRank`,
    /// `ncclCommCount`).
    fn nccl_comm_info(&self, comm: NcclComm) -> Result<(usize, usize, usize)>;
    /// Release a communicator (`ncclCommDestroy`).
    fn nccl_comm_destroy(&self, comm: NcclComm) -> Result<()>;
    /// Abort a communicator (`ncclCommAbort`): its collectives in flight are abandoned and
    /// the handle is released, so it must not be destroyed or used afterwards. Safe to call
    /// from another thread while a collective waits on it, which is what it is for: a
    /// rank blocked in a collective on it is woken with an error (Note [NCCL through the
    /// seam]).
    fn nccl_comm_abort(&self, comm: NcclComm) -> Result<()>;
    /// Open a group on this thread (`ncclGroupStart`): collectives issued until the matching
    /// [`Driver::nccl_group_end`] are launched together. Groups nest.
    fn nccl_group_start(&self) -> Result<()>;
    /// Close the group opened by [`Driver::nccl_group_start`] and launch its collectives.
    fn nccl_group_end(&self) -> Result<()>;
    /// Enqueue this rank's part of a collective on `stream`, a stream of the communicator's
    /// device (or the default stream). Buffers must be memory of that device.
    fn nccl_collective(&self, comm: NcclComm, stream: StreamHandle, op: &Collective) -> Result<()>;

    // --- device activity (Note [CUPTI through the seam]) --------------------------------
    /// CUPTI's activity API version (`cuptiGetVersion`), loading the library on first use.
    /// An absent or unusable library is [`crate::DeviceError::Unsupported`] saying why.
    fn activity_version(&self) -> Result<u32>;
    /// Start recording the kernels, copies and memsets of every device, with their external
    /// correlation ids. Records wait for [`Driver::activity_flush`].
    fn activity_enable(&self) -> Result<()>;
    /// Stop recording; what was recorded stays for [`Driver::activity_flush`].
    fn activity_disable(&self) -> Result<()>;
    /// Tag the work this thread enqueues from now on with `id`
    /// (`cuptiActivityPushExternalCorrelationId`), until the matching pop.
    fn activity_push_correlation(&self, id: u64) -> Result<()>;
    /// Undo this thread's last [`Driver::activity_push_correlation`].
    fn activity_pop_correlation(&self) -> Result<()>;
    /// Flush the library's buffers and take every record completed since the last flush
    /// (work still running on a device may come in a later flush: synchronise first).
    fn activity_flush(&self) -> Result<Vec<ActivityRecord>>;
    /// The clock the records are stamped with, now, in nanoseconds (`cuptiGetTimestamp`).
    fn activity_timestamp_ns(&self) -> Result<u64>;
}
