//! [`Tensor`]: an eager, strided view of shared storage.

pub(crate) mod amp;
pub(crate) mod attention;
pub(crate) mod binary;
pub(crate) mod buffers;
pub(crate) mod close;
pub(crate) mod conv;
pub(crate) mod conv_grad;
mod create;
mod display;
pub(crate) mod index;
pub(crate) mod inplace;
pub(crate) mod loss;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod unary;
mod view;

pub use create::Options;
pub use view::ShapeSpec;

use std::sync::Arc;

use ember_device::Device;

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::scalar::Scalar;
use crate::shape::{Dim, Shape};
use crate::storage::{CpuStorage, Storage, StorageCell};

/// A multi-dimensional array on a device: a dtype, a [`Layout`] (shape, strides, offset)
/// and a storage shared with its views. Cloning is cheap (a reference count); clones and
/// views see each other's in-place writes.
///
/// ```
/// use ember_tensor::{Device, Tensor};
/// let t = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], &Device::Cpu)?;
/// assert_eq!(t.dims(), &[2, 3]);
/// assert_eq!(t.t()?.to_vec2::<f32>()?, vec![vec![1., 4.], vec![2., 5.], vec![3., 6.]]);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
#[derive(Clone)]
pub(crate) struct RawTensor(Arc<Inner>);

struct Inner {
    storage: Arc<StorageCell>,
    layout: Layout,
}

impl std::fmt::Debug for RawTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor[{}; {}, {}, strides={:?}, offset={}]",
            self.shape(),
            self.dtype(),
            self.device(),
            self.strides(),
            self.storage_offset()
        )
    }
}

impl RawTensor {
    // --- construction (crate) ------------------------------------------------------------

    /// A tensor owning `storage`, laid out contiguously as `shape`.
    pub(crate) fn from_storage(storage: Storage, shape: impl Into<Shape>) -> RawTensor {
        RawTensor(Arc::new(Inner {
            storage: StorageCell::new(storage),
            layout: Layout::contiguous(shape),
        }))
    }

    /// A view of this tensor's storage with another layout (callers keep the layout inside
    /// the storage).
    pub(crate) fn view_with(&self, layout: Layout) -> RawTensor {
        RawTensor(Arc::new(Inner {
            storage: self.0.storage.clone(),
            layout,
        }))
    }

    pub(crate) fn cell(&self) -> &Arc<StorageCell> {
        &self.0.storage
    }

    /// Runs `f` on the storage (read-locked) and the layout.
    pub(crate) fn with_storage<R>(&self, f: impl FnOnce(&Storage, &Layout) -> R) -> R {
        let g = self.0.storage.read();
        f(&g, &self.0.layout)
    }

    // --- metadata ------------------------------------------------------------------------

    /// The shape.
    pub fn shape(&self) -> &Shape {
        self.0.layout.shape()
    }

    /// The sizes of the dims (`tensor.shape` in PyTorch).
    pub fn dims(&self) -> &[usize] {
        self.0.layout.dims()
    }

    /// The size of one dim (negative counts from the end), PyTorch's `size(dim)`.
    pub fn size(&self, dim: impl Dim) -> Result<usize> {
        let d = dim.index(self.rank(), "size")?;
        Ok(self.dims().get(d).copied().unwrap_or(1))
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        self.0.layout.strides()
    }

    /// Offset of the first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.0.layout.offset()
    }

    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.storage.dtype()
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.0.storage.device()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    /// Number of dims (PyTorch's `dim()`).
    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }

    /// PyTorch's `is_contiguous()`.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// How many times the storage was written in place (PyTorch's `_version`). Shared by
    /// all views of one storage.
    pub fn version(&self) -> u64 {
        self.0.storage.version()
    }

    /// `true` if both tensors view the same storage.
    pub fn shares_storage(&self, other: &RawTensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// An identifier of the storage: equal for tensors that share one (as
    /// [`Tensor::shares_storage`] says), distinct between live storages; so a set of them
    /// finds shared storage in a list in one pass.
    pub fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.0.storage) as usize
    }

    /// Elements in the underlying storage (may exceed `numel` for views).
    pub fn storage_len(&self) -> usize {
        self.0.storage.len()
    }

    // --- reading back --------------------------------------------------------------------

    /// The elements in row-major order, as `T`: the tensor's own dtype is read as is,
    /// another is converted first by [`to_dtype`](Tensor::to_dtype)'s rules (so an f32
    /// tensor reads back as `f64` exactly, as PyTorch's `tolist()` gives Python floats).
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let x = Tensor::new(&[0.1f32, 2.5], &Device::Cpu)?;
    /// assert_eq!(x.to_vec::<f64>()?, vec![0.1f32 as f64, 2.5]);
    /// assert_eq!(x.to_vec::<i64>()?, vec![0, 2]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        self.host_elements::<T>()
    }

    /// The elements as `T`, converted on the tensor's device when the dtype differs.
    fn host_elements<T: WithDType>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return self.to_dtype(T::DTYPE)?.host_elements::<T>();
        }
        // A device storage comes over whole; then the layout picks the elements.
        self.with_storage(|s, l| s.with_host(|c| host_view::<T>(c, l)))
    }

    /// Runs `f` on the elements of this contiguous CPU tensor, in place, as `&[T]` (the
    /// storage read-locked meanwhile): zero-copy access for code that hands host memory to a
    /// C library (the MPI collectives of `ember-parallel`). An error, naming `op`, for a
    /// tensor on another device, a non-contiguous one, or `T` other than its dtype.
    pub fn with_cpu_slice<T: WithDType, R>(
        &self,
        op: &'static str,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R> {
        let (start, end) = self.cpu_range::<T>(op)?;
        self.with_storage(|s, _| match s.as_cpu() {
            Some(c) => Ok(f(&c.as_slice::<T>()?[start..end])),
            None => Err(self.not_cpu(op)),
        })
    }

    /// As [`with_cpu_slice`](Tensor::with_cpu_slice), with `&mut [T]`: the storage is
    /// write-locked (its version bumped, as every in-place write does) while `f` runs.
    pub fn with_cpu_slice_mut<T: WithDType, R>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R> {
        let (start, end) = self.cpu_range::<T>(op)?;
        let mut g = self.0.storage.write();
        match g.as_cpu_mut() {
            Some(c) => Ok(f(&mut c.as_mut_slice::<T>()?[start..end])),
            None => Err(self.not_cpu(op)),
        }
    }

    fn not_cpu(&self, op: &'static str) -> TensorError {
        TensorError::InvalidArgument {
            op,
            msg: format!("expected a CPU tensor, but found one on {}", self.device()),
        }
    }

    /// The element range of a contiguous CPU tensor of dtype `T` in its storage.
    fn cpu_range<T: WithDType>(&self, op: &'static str) -> Result<(usize, usize)> {
        if self.dtype() != T::DTYPE {
            return Err(TensorError::DTypeMismatch {
                op,
                expected: T::DTYPE,
                found: self.dtype(),
            });
        }
        if self.device() != Device::Cpu {
            return Err(self.not_cpu(op));
        }
        match self.layout().contiguous_range() {
            Some(r) if self.is_contiguous() => Ok(r),
            _ => Err(TensorError::InvalidArgument {
                op,
                msg: format!(
                    "expected a contiguous tensor, but found shape {} with strides {:?}",
                    self.shape(),
                    self.strides()
                ),
            }),
        }
    }

    /// The rows of a 2-D tensor.
    pub fn to_vec2<T: WithDType>(&self) -> Result<Vec<Vec<T>>> {
        self.check_rank("to_vec2", 2)?;
        let v = self.to_vec::<T>()?;
        let cols = self.dims()[1];
        if cols == 0 {
            return Ok(vec![Vec::new(); self.dims()[0]]);
        }
        let mut rows = try_host_vec(self.dims()[0])?;
        for r in v.chunks(cols) {
            let mut row = try_host_vec(cols)?;
            row.extend_from_slice(r);
            rows.push(row);
        }
        Ok(rows)
    }

    /// The matrices of a 3-D tensor.
    pub fn to_vec3<T: WithDType>(&self) -> Result<Vec<Vec<Vec<T>>>> {
        self.check_rank("to_vec3", 3)?;
        let d = self.dims().to_vec();
        (0..d[0])
            .map(|i| self.select(0, i as isize)?.to_vec2::<T>())
            .collect()
    }

    pub(crate) fn check_rank(&self, op: &'static str, rank: usize) -> Result<()> {
        if self.rank() == rank {
            Ok(())
        } else {
            Err(TensorError::ShapeMismatch {
                op,
                msg: format!("expected a {rank}-D tensor, but got shape {}", self.shape()),
            })
        }
    }

    /// The value of a one-element tensor, as `T` (converted as [`to_vec`](Tensor::to_vec)
    /// converts).
    pub fn item<T: WithDType>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(TensorError::NotOneElement {
                numel: self.numel(),
            });
        }
        self.host_elements::<T>()?
            .first()
            .copied()
            .ok_or(TensorError::NotOneElement { numel: 0 })
    }

    /// The value of a one-element tensor of any dtype, as a [`Scalar`].
    pub fn to_scalar(&self) -> Result<Scalar> {
        if self.numel() != 1 {
            return Err(TensorError::NotOneElement {
                numel: self.numel(),
            });
        }
        Ok(match self.dtype() {
            DType::Bool => Scalar::Bool(self.item::<bool>()?),
            d if d.is_int() => Scalar::Int(self.to_dtype(DType::I64)?.item::<i64>()?),
            _ => Scalar::Float(self.to_dtype(DType::F64)?.item::<f64>()?),
        })
    }

    // --- dtype and device ----------------------------------------------------------------

    /// A copy converted to `dtype` (this tensor itself if it already has it), with
    /// PyTorch's casts: float -> int truncates toward zero, into f16/bf16 rounds to
    /// nearest even, into bool is `!= 0`. See Note [Float to int casts].
    pub fn to_dtype(&self, dtype: DType) -> Result<RawTensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let _op = crate::profile::op1("_to_copy", self);
        let s = self.with_storage(|s, l| s.cast(l, dtype))?;
        Ok(RawTensor::from_storage(s, self.shape()))
    }

    /// A contiguous tensor with the same values: this tensor if already contiguous.
    pub fn contiguous(&self) -> Result<RawTensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy()
    }

    /// A contiguous copy with its own storage (PyTorch's `clone()`; Rust's `Clone` shares).
    pub fn copy(&self) -> Result<RawTensor> {
        let _op = crate::profile::op1("clone", self);
        let s = self.with_storage(|s, l| s.cast(l, self.dtype()))?;
        Ok(RawTensor::from_storage(s, self.shape()))
    }

    /// This tensor on `device`: the same tensor (sharing storage) if it is already there.
    /// Otherwise a contiguous copy on `device` (through the driver's copies for CUDA); a
    /// CUDA device that is unavailable or out of range is an error naming why.
    pub fn to_device(&self, device: impl Into<Device>) -> Result<RawTensor> {
        self.to_device_with(&device.into(), false)
    }

    fn to_device_with(&self, device: &Device, non_blocking: bool) -> Result<RawTensor> {
        if *device == self.device() {
            return Ok(self.clone());
        }
        let _op = crate::profile::op1("_to_copy", self);
        // Only the view's elements travel: a contiguous copy on the source device first
        // when the view is not the whole storage in order.
        let whole = self.is_contiguous()
            && self.storage_offset() == 0
            && self.numel() == self.storage_len();
        let src = if whole { self.clone() } else { self.copy()? };
        let n = src.numel();
        let s = src.with_storage(|s, _| s.to_device(n, *device, non_blocking))?;
        Ok(RawTensor::from_storage(s, self.shape()))
    }

    /// `tensor.to(target, non_blocking=True)`: as [`Tensor::to`], but a copy from pinned
    /// host memory ([`Tensor::pin_memory`]) to a CUDA device is only enqueued on the current
    /// stream, so the host goes on while it runs; later work on that stream sees the data.
    /// Other copies are synchronous, as in PyTorch.
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// # ember_device::cuda::use_emulator(ember_device::driver::emulator::EmulatorConfig::devices(2))?;
    /// let batch = Tensor::ones([4, 3], ())?.pin_memory()?;
    /// assert!(batch.is_pinned());
    /// let on_gpu = batch.to_non_blocking("cuda:0")?;
    /// assert_eq!(on_gpu.device(), Device::Cuda(0));
    /// assert_eq!(on_gpu.sum_all()?.item::<f32>()?, 12.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_non_blocking(&self, target: impl ToTarget) -> Result<RawTensor> {
        let (device, dtype) = target.target()?;
        let t = match device {
            Some(d) => self.to_device_with(&d, true)?,
            None => self.clone(),
        };
        match dtype {
            Some(d) => t.to_dtype(d),
            None => Ok(t),
        }
    }

    /// `tensor.pin_memory()`: a contiguous copy of this CPU tensor in page-locked host
    /// memory, from which copies to a CUDA device can be asynchronous (plain host memory
    /// where CUDA is not real). A CUDA tensor is an error, as in PyTorch.
    pub fn pin_memory(&self) -> Result<RawTensor> {
        let s = self.with_storage(|s, l| s.pinned_copy(l))?;
        Ok(RawTensor::from_storage(Storage::from(s), self.shape()))
    }

    /// Whether this tensor's memory is pinned (from [`Tensor::pin_memory`]).
    pub fn is_pinned(&self) -> bool {
        self.with_storage(|s, _| s.is_pinned())
    }

    /// `tensor.record_stream(stream)`: this tensor's memory is also used by work on
    /// `stream`, so when it is freed the caching allocator does not reuse it until the work
    /// enqueued on `stream` by now has completed. For CUDA tensors and pinned CPU tensors;
    /// a stream of another device, or a plain CPU tensor, is an error.
    pub fn record_stream(&self, stream: &ember_device::cuda::Stream) -> Result<()> {
        self.with_storage(|s, _| s.record_stream(stream))
    }
}

/// What [`Tensor::to`] accepts: a device, a device string, a dtype, or a (device, dtype)
/// pair.
pub trait ToTarget {
    /// The device and the dtype asked for (`None`: unchanged).
    fn target(self) -> Result<(Option<Device>, Option<DType>)>;
}

impl ToTarget for Device {
    fn target(self) -> Result<(Option<Device>, Option<DType>)> {
        Ok((Some(self), None))
    }
}
impl ToTarget for &Device {
    fn target(self) -> Result<(Option<Device>, Option<DType>)> {
        Ok((Some(*self), None))
    }
}
/// The current CUDA device, as PyTorch's index-less `"cuda"` means (`cuda:0` when CUDA is
/// unavailable, so that the move reports why).
pub(crate) fn current_cuda() -> Device {
    Device::Cuda(ember_device::cuda::current_device().unwrap_or(0))
}

impl ToTarget for &str {
    /// `"cpu"`, `"cuda:N"`, or `"cuda"`: the current CUDA device, as in PyTorch.
    fn target(self) -> Result<(Option<Device>, Option<DType>)> {
        if self.trim() == "cuda" {
            return Ok((Some(current_cuda()), None));
        }
        Ok((Some(self.parse::<Device>()?), None))
    }
}
impl ToTarget for DType {
    fn target(self) -> Result<(Option<Device>, Option<DType>)> {
        Ok((None, Some(self)))
    }
}
impl<D: ToTarget> ToTarget for (D, DType) {
    fn target(self) -> Result<(Option<Device>, Option<DType>)> {
        Ok((self.0.target()?.0, Some(self.1)))
    }
}

/// The elements of `l` over a host storage, in row-major order.
fn host_view<T: WithDType>(c: &CpuStorage, l: &Layout) -> Result<Vec<T>> {
    let data = c.as_slice::<T>()?;
    if let Some(d) = crate::cpu::contiguous_slice(data, l) {
        let mut v = try_host_vec::<T>(d.len())?;
        v.extend_from_slice(d);
        return Ok(v);
    }
    let mut v = try_host_vec::<T>(l.shape().checked_numel("to_vec")?)?;
    for i in l.strided_index() {
        v.push(data.get(i).copied().ok_or_else(|| {
            TensorError::invalid("to_vec", "layout outside storage (internal error)")
        })?);
    }
    Ok(v)
}

/// An empty `Vec` with room for `len` elements, or an out-of-memory error value when the
/// host cannot give it (never an abort): every host materialisation of tensor data that
/// leaves the caching allocator goes through this.
pub(crate) fn try_host_vec<T>(len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_err() {
        let requested = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        return Err(TensorError::Memory(
            ember_memory::MemoryError::OutOfMemory {
                device: Device::Cpu,
                requested,
                total: None,
                free: None,
                allocated: ember_memory::memory_allocated(Device::Cpu).unwrap_or(0),
                reserved_unallocated: 0,
                fraction_limit: None,
            },
        ));
    }
    Ok(v)
}

/// The one device of `tensors`, or PyTorch's device-mismatch error.
pub(crate) fn same_device(tensors: &[&RawTensor]) -> Result<Device> {
    let mut it = tensors.iter();
    let first = it.next().map_or(Device::Cpu, |t| t.device());
    for t in it {
        if t.device() != first {
            return Err(TensorError::DeviceMismatch {
                first,
                second: t.device(),
            });
        }
    }
    Ok(first)
}

/// A new tensor on `device` from host data (copied to the device for CUDA).
pub(crate) fn host_tensor<T: WithDType>(
    data: &[T],
    shape: impl Into<Shape>,
    device: &Device,
) -> Result<RawTensor> {
    let s = Storage::from_host("tensor", CpuStorage::from_slice(data)?, *device)?;
    Ok(RawTensor::from_storage(s, shape))
}
