//! The CUDA backend: [`CudaStorage`] (device memory from the `cuda:N` caching allocator) and
//! the kernels of `kernels/*.cu` launched on it through the driver seam — the real driver
//! on a GPU, the CPU emulator in CI. See Note [CUDA backend].
//!
//! Work goes to the thread's current stream of the device (`ember_device::cuda::
//! current_stream`: the default stream unless a `StreamGuard` says otherwise); the plain
//! copies to and from the host are ordered on that stream and synchronous, so a result read
//! back is always complete. Memory is allocated for that stream (the caching allocator
//! reuses a block on the stream that freed it; `record_stream` marks other users).

mod amp;
pub(crate) mod attention;
mod cudnn;
mod fused;
mod nn;
mod ops;
mod optim;
mod reduce;

pub(crate) use amp::*;
pub(crate) use cudnn::{conv_path, conv2d_backward_data, conv2d_backward_filter, cudnn_fallbacks};
pub(crate) use fused::*;
pub(crate) use nn::*;
pub(crate) use ops::*;
pub(crate) use optim::*;
pub(crate) use reduce::*;

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

use ember_device::Device;
use ember_device::driver::{
    ConvDesc, ConvDirection, DevicePtr, Driver, GemmDesc, LaunchConfig, StreamHandle,
};
use ember_device::trace::device::{ActivityKind, Launch, timed};
use ember_kernels::{KernelArgs, Module, StridedLayout};
use ember_memory::{Allocation, CachingAllocator};

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::{CpuStorage, checked_bytes, short_allocation};

// Note [CUDA backend]:
// ~~~~~~~~~~~~~~~~~~~~
// One `Ctx` per device ordinal, made on first use and kept for the process: the driver
// (`ember_device::cuda::driver()`, real or emulated), Ember's kernels loaded on the device
// (`ember_kernels::Module`, function handles cached by name) and the device's caching
// allocator. Each `CudaStorage` holds its `Ctx`, so an op on existing tensors takes the
// context from its first input without a lookup.
//
// Kernels take element pointers and `StridedLayout`s: the host adds each view's storage
// offset to its base pointer (`CudaStorage::ptr_at`) and passes strides for the iteration
// shape (`strided`). Outputs are fresh contiguous storages the kernel writes completely, so
// device memory is never read before it was written; in-place ops compute into a fresh
// buffer and copy it into the view (`copy_{dtype}`, strided on both sides).
//
// The host never dereferences a device address: data crosses only through the driver's
// copies (`upload`, `download`). Under the emulator, device addresses are tagged, so a
// stray host dereference would fault rather than silently read memory.

/// What the backend needs on one device.
pub(crate) struct Ctx {
    ordinal: usize,
    driver: Arc<dyn Driver>,
    module: Module,
    alloc: Arc<CachingAllocator>,
    /// Streaming multiprocessors of the device (at least 1), for grids sized to fill it.
    sm_count: usize,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ctx(cuda:{})", self.ordinal)
    }
}

/// The context of `cuda:{ordinal}`, made on first use. CUDA unavailable is
/// [`TensorError::CudaUnavailable`] naming `op`; an ordinal past the device count is a
/// device error naming both.
pub(crate) fn ctx(op: &'static str, ordinal: usize) -> Result<Arc<Ctx>> {
    static CTXS: Mutex<Vec<Option<Arc<Ctx>>>> = Mutex::new(Vec::new());
    let mut table = CTXS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(Some(c)) = table.get(ordinal) {
        return Ok(Arc::clone(c));
    }
    if !ember_device::cuda::is_available() {
        return Err(TensorError::cuda_unavailable(op, Device::Cuda(ordinal)));
    }
    let driver = ember_device::cuda::driver()?;
    let count = driver.device_count();
    if ordinal >= count {
        return Err(ember_device::DeviceError::InvalidIndex {
            index: ordinal,
            count,
        }
        .into());
    }
    let module = Module::load(Arc::clone(&driver), ordinal)?;
    let alloc = ember_memory::allocator(Device::Cuda(ordinal))?;
    let sm_count = (driver.properties(ordinal)?.multi_processor_count as usize).max(1);
    let c = Arc::new(Ctx {
        ordinal,
        driver,
        module,
        alloc,
        sm_count,
    });
    if table.len() <= ordinal {
        table.resize(ordinal + 1, None);
    }
    table[ordinal] = Some(Arc::clone(&c));
    Ok(c)
}

impl Ctx {
    /// Launches kernel `name` on the thread's current stream of the device.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list (its `.cu` header) in order and type,
    /// and every pointer among them must be valid for every access the kernel makes with
    /// these arguments and this geometry.
    unsafe fn launch(&self, name: &str, config: LaunchConfig, args: &mut KernelArgs) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.module.launch(name, config, self.stream(), args)? };
        Ok(())
    }

    /// The device's streaming multiprocessors (at least 1).
    pub(crate) fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// The thread's current stream on this device.
    pub(crate) fn stream(&self) -> StreamHandle {
        ember_device::cuda::current_stream(self.ordinal)
    }

    /// One cuBLAS GEMM on the current stream (timed while the profiler listens).
    pub(crate) fn gemm(&self, desc: &GemmDesc) -> Result<()> {
        let stream = self.stream();
        let describe = || Launch {
            api: "cublasGemmStridedBatchedEx",
            kind: ActivityKind::Kernel,
            name: Cow::Owned(format!(
                "cublas gemm {}x{}x{} batch {} {}",
                desc.m,
                desc.n,
                desc.k,
                desc.batch,
                format!("{:?}", desc.dtype).to_lowercase()
            )),
            bytes: 0,
            grid: [0; 3],
            block: [0; 3],
        };
        timed(&*self.driver, self.ordinal, stream, describe, || {
            self.driver.gemm(self.ordinal, stream, desc)
        })?;
        Ok(())
    }

    /// One cuDNN convolution on the current stream (timed while the profiler listens).
    pub(crate) fn conv(&self, desc: &ConvDesc) -> Result<()> {
        let stream = self.stream();
        let describe = || {
            let p = &desc.problem;
            let dtype = format!("{:?}", p.dtype).to_lowercase();
            Launch {
                api: match p.direction {
                    ConvDirection::Forward => "cudnnConvolutionForward",
                    ConvDirection::BackwardData => "cudnnConvolutionBackwardData",
                    ConvDirection::BackwardFilter => "cudnnConvolutionBackwardFilter",
                },
                kind: ActivityKind::Kernel,
                name: Cow::Owned(format!(
                    "cudnn {:?} x{:?} w{:?} algo {} {dtype}",
                    p.direction, p.x_dims, p.w_dims, desc.algo
                )),
                bytes: 0,
                grid: [0; 3],
                block: [0; 3],
            }
        };
        timed(&*self.driver, self.ordinal, stream, describe, || {
            self.driver.conv(self.ordinal, stream, desc)
        })?;
        Ok(())
    }

    /// Times `call`, a copy of `bytes` on `stream`, while the profiler listens.
    fn copy<T>(
        &self,
        stream: StreamHandle,
        kind: ActivityKind,
        bytes: usize,
        call: impl FnOnce() -> ember_device::Result<T>,
    ) -> Result<T> {
        let describe = || Launch {
            api: if stream == StreamHandle::DEFAULT && kind != ActivityKind::MemcpyDtoD {
                "cudaMemcpy"
            } else {
                "cudaMemcpyAsync"
            },
            kind,
            name: Cow::Borrowed(match kind {
                ActivityKind::MemcpyHtoD => "Memcpy HtoD (Host -> Device)",
                ActivityKind::MemcpyDtoH => "Memcpy DtoH (Device -> Host)",
                _ => "Memcpy DtoD (Device -> Device)",
            }),
            bytes: bytes as u64,
            grid: [0; 3],
            block: [0; 3],
        };
        Ok(timed(&*self.driver, self.ordinal, stream, describe, call)?)
    }
}

/// Uploads of integer storages up to this many elements record their range (one pass over
/// the host copy, next to the copy itself); larger ones are not index tensors in practice.
const RANGE_SCAN_LIMIT: usize = 1 << 22;

/// `[min, max]` of an i64/i32 host storage of at most [`RANGE_SCAN_LIMIT`] elements (Note
/// [Known index ranges]); `None` for other dtypes, empty or larger storages.
fn host_range(src: &CpuStorage) -> Option<(i64, i64)> {
    fn min_max<T: Copy + Into<i64>>(v: &[T]) -> Option<(i64, i64)> {
        let first = (*v.first()?).into();
        Some(v.iter().fold((first, first), |(lo, hi), &x| {
            let x = x.into();
            (lo.min(x), hi.max(x))
        }))
    }
    if src.len() > RANGE_SCAN_LIMIT {
        return None;
    }
    match src.dtype() {
        DType::I64 => min_max(src.as_slice::<i64>().ok()?),
        DType::I32 => min_max(src.as_slice::<i32>().ok()?),
        _ => None,
    }
}

/// Device memory holding `len` elements of one dtype on one CUDA device.
#[derive(Debug)]
pub struct CudaStorage {
    alloc: Allocation,
    dtype: DType,
    len: usize,
    ctx: Arc<Ctx>,
    /// Bounds every element is known to lie in, for integer storages whose values the host
    /// knows without reading them back (Note [Known index ranges]).
    range: Option<(i64, i64)>,
}

impl CudaStorage {
    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` if there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal
    }

    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// `len` elements of `dtype` on `ctx`'s device, not initialised: the caller's kernel or
    /// copy writes every element before the storage is read (Note [CUDA backend]).
    pub(crate) fn alloc(ctx: &Arc<Ctx>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = checked_bytes(dtype, len)?;
        let alloc = ctx.alloc.allocate_on(bytes, ctx.stream())?;
        if alloc.len() < bytes {
            return Err(short_allocation(alloc.len(), bytes));
        }
        Ok(CudaStorage {
            alloc,
            dtype,
            len,
            ctx: Arc::clone(ctx),
            range: None,
        })
    }

    /// `[min, max]` of every element, when known without reading the device (Note [Known
    /// index ranges]).
    pub(crate) fn known_range(&self) -> Option<(i64, i64)> {
        self.range
    }

    /// Records that every element lies in `[lo, hi]` (Note [Known index ranges]): only for
    /// a storage the caller has just filled and nobody else can see yet.
    pub(crate) fn set_known_range(&mut self, lo: i64, hi: i64) {
        if matches!(self.dtype, DType::I64 | DType::I32) && lo <= hi {
            self.range = Some((lo, hi));
        }
    }

    /// Forgets the known range: the storage is about to be written in place.
    pub(crate) fn forget_range(&mut self) {
        self.range = None;
    }

    /// The device address of element `index` (the start of a view at that offset).
    pub(crate) fn ptr_at(&self, index: usize) -> DevicePtr {
        DevicePtr(self.alloc.addr()).offset((index * self.dtype.size_in_bytes()) as u64)
    }

    /// A copy of a host storage on `ctx`'s device.
    pub(crate) fn upload(ctx: &Arc<Ctx>, src: &CpuStorage) -> Result<CudaStorage> {
        let mut out = CudaStorage::alloc(ctx, src.dtype(), src.len())?;
        out.range = host_range(src);
        let bytes = src.as_bytes();
        if !bytes.is_empty() {
            let stream = ctx.stream();
            ctx.copy(stream, ActivityKind::MemcpyHtoD, bytes.len(), || {
                ctx.driver.memcpy_htod(out.ptr_at(0), bytes, stream)
            })?;
        }
        Ok(out)
    }

    /// A copy of a pinned host storage on `ctx`'s device, enqueued on the current stream
    /// without waiting (`to(device, non_blocking=True)`); the source block is recorded on
    /// the stream, so the allocator does not reuse it before the copy has read it.
    pub(crate) fn upload_async(ctx: &Arc<Ctx>, src: &CpuStorage) -> Result<CudaStorage> {
        let mut out = CudaStorage::alloc(ctx, src.dtype(), src.len())?;
        out.range = host_range(src);
        let bytes = src.as_bytes();
        if !bytes.is_empty() {
            let stream = ctx.stream();
            ctx.copy(stream, ActivityKind::MemcpyHtoD, bytes.len(), || {
                // SAFETY: `bytes` is `src`'s pinned allocation; `record_stream` below keeps the
                // caching allocator from reusing (or releasing, which waits for recorded events)
                // that block until the work enqueued on `stream` by now — this copy — has
                // completed, so the memory stays valid for the copy even if `src` is dropped.
                // `out` holds exactly `bytes.len()` bytes.
                unsafe {
                    ctx.driver
                        .memcpy_htod_async(out.ptr_at(0), bytes.as_ptr(), bytes.len(), stream)
                }
            })?;
            src.record_stream(stream);
        }
        Ok(out)
    }

    /// A small host table (a multi-tensor kernel's addresses and counts) on `ctx`'s device,
    /// without making the host wait for the device as a pageable upload does: staged in
    /// pinned memory and copied on the current stream ([`CudaStorage::upload_async`]), so
    /// the kernel that reads it is ordered after the copy.
    pub(crate) fn upload_table(ctx: &Arc<Ctx>, table: &[i64]) -> Result<CudaStorage> {
        CudaStorage::upload_async(ctx, &CpuStorage::from_slice(table)?.pinned_copy()?)
    }

    /// PyTorch's `record_stream`: the block is not reused until the work enqueued on
    /// `stream` so far has completed.
    pub(crate) fn record_stream(&self, stream: StreamHandle) {
        self.alloc.record_stream(stream);
    }

    /// A host copy of all elements (after the work enqueued on the current stream).
    pub(crate) fn download(&self) -> Result<CpuStorage> {
        let mut out = CpuStorage::zeroed(self.dtype, self.len)?;
        out.write_bytes_with(|bytes| {
            if !bytes.is_empty() {
                let stream = self.ctx.stream();
                let n = bytes.len();
                self.ctx.copy(stream, ActivityKind::MemcpyDtoH, n, || {
                    self.ctx.driver.memcpy_dtoh(bytes, self.ptr_at(0), stream)
                })?;
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// A copy on another CUDA device (or the same one), contiguous from the whole storage.
    pub(crate) fn copy_to(&self, ctx: &Arc<Ctx>) -> Result<CudaStorage> {
        let out = CudaStorage::alloc(ctx, self.dtype, self.len)?;
        let bytes = self.len * self.dtype.size_in_bytes();
        if bytes > 0 {
            let stream = self.ctx.stream();
            self.ctx.copy(stream, ActivityKind::MemcpyDtoD, bytes, || {
                self.ctx
                    .driver
                    .memcpy_dtod_async(out.ptr_at(0), self.ptr_at(0), bytes, stream)
            })?;
            // The destination device's default stream does not order against the source's:
            // finish the copy before the new storage is used there.
            self.ctx.driver.synchronize(self.ctx.ordinal)?;
        }
        Ok(out)
    }
}

/// The kernels' view of `l` as the iteration over its own shape.
pub(crate) fn strided(op: &'static str, l: &Layout) -> Result<StridedLayout> {
    let strides: smallvec::SmallVec<[isize; 8]> = l.strides().iter().map(|&s| s as isize).collect();
    StridedLayout::new(l.dims(), &strides).map_err(|_| too_many_dims(op, l.rank()))
}

fn too_many_dims(op: &'static str, rank: usize) -> TensorError {
    TensorError::invalid(
        op,
        format!(
            "the CUDA kernels index at most {} dimensions, but got {rank}",
            ember_kernels::MAX_DIMS
        ),
    )
}

/// The `{op}_{dtype}` kernel name.
pub(crate) fn kernel_name(op: &str, dtype: DType) -> String {
    format!("{op}_{}", dtype.short_name())
}
