//! The dispatch point: one method per op family on [`Storage`], each a single `match` on
//! the backend variant that calls that backend's kernel. See Note [Dispatch].

use ember_device::Device;

use crate::cpu;
use crate::cpu::dispatch;
use crate::cuda::{self, CudaStorage, PhiloxKernel};
use crate::dtype::DType;
use crate::error::Result;
use crate::error::TensorError;
use crate::layout::Layout;
use crate::op::{BinaryOpT, CmpOp, FusedOp, ReduceOp, UnaryOpT};
use crate::scalar::Scalar;
use crate::storage::{CpuStorage, Storage};

// Note [Dispatch]:
// ~~~~~~~~~~~~~~~~
// An op is split in two:
//   - its front, a `Tensor` method (ops/*.rs): device check (all inputs on one device, else
//     PyTorch's "Expected all tensors to be on the same device..."), dtype and shape
//     inference, broadcasting of layouts, casts of the inputs to the compute dtype, and
//     wrapping the result;
//   - its kernel, one per backend, reached through the methods below. Each takes storages
//     with their layouts (inputs already of the compute dtype and broadcast to the output
//     shape) and returns a fresh contiguous storage, or writes into a `&mut` one.
// A new backend (as CUDA was) adds a `Storage` variant and one arm per method here, and
// nothing in the fronts. Mixed-backend arms cannot be reached: the fronts reject tensors
// on different devices before calling down. Composite ops (mean, var, logsumexp, norm,
// ...) are written in the fronts from these primitives and work on every backend for free;
// softmax and log-softmax are primitives (one fused kernel per row, `backend_nn.rs`).

impl Storage {
    /// A contiguous copy of the layout's elements, converted to `dtype`.
    pub(crate) fn cast(&self, l: &Layout, dtype: DType) -> Result<Storage> {
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(cpu::cast(s, l, dtype)?)),
            Storage::Cuda(s) => Ok(Storage::Cuda(cuda::cast(s, l, dtype)?)),
        }
    }

    /// Unary kernel `O` of the op named `name` (errors name the op).
    pub(crate) fn unary<O: UnaryOpT>(&self, name: &'static str, l: &Layout) -> Result<Storage> {
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(cpu::elementwise::unary::<O>(s, l)?)),
            Storage::Cuda(s) => Ok(Storage::Cuda(cuda::unary::<O>(name, s, l)?)),
        }
    }

    /// Binary kernel `O` of the op named `name`.
    pub(crate) fn binary<O: BinaryOpT>(
        &self,
        name: &'static str,
        la: &Layout,
        rhs: &Storage,
        lb: &Layout,
    ) -> Result<Storage> {
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                Ok(Storage::Cpu(cpu::elementwise::binary::<O>(a, la, b, lb)?))
            }
            (Storage::Cuda(a), Storage::Cuda(b)) => {
                Ok(Storage::Cuda(cuda::binary::<O>(name, a, la, b, lb)?))
            }
            (a, b) => Err(mixed(a, b)),
        }
    }

    /// A [`FusedOp`] in one pass where a kernel exists for these operands (the CPU, f32 and
    /// f64, see `cpu::elementwise::fused_inplace`); `Ok(false)`, nothing written, where not:
    /// the front then composes the op from single ops.
    pub(crate) fn fused_inplace(
        &mut self,
        ld: &Layout,
        srcs: &[(&Storage, &Layout)],
        op: FusedOp,
    ) -> Result<bool> {
        fn on_cpu<'a>(&(s, l): &(&'a Storage, &'a Layout)) -> Option<(&'a CpuStorage, &'a Layout)> {
            match s {
                Storage::Cpu(c) => Some((c, l)),
                Storage::Cuda(_) => None,
            }
        }
        let Storage::Cpu(d) = self else {
            return Ok(false);
        };
        // The two arities `FusedOp` has, without collecting the sources into a `Vec`.
        match srcs {
            [a] => match on_cpu(a) {
                Some(a) => cpu::elementwise::fused_inplace(d, ld, &[a], op),
                None => Ok(false),
            },
            [a, b] => match (on_cpu(a), on_cpu(b)) {
                (Some(a), Some(b)) => cpu::elementwise::fused_inplace(d, ld, &[a, b], op),
                _ => Ok(false),
            },
            _ => Ok(false),
        }
    }

    /// Binary kernel `O` of the op named `name`, written into `self`.
    pub(crate) fn binary_inplace<O: BinaryOpT>(
        &mut self,
        name: &'static str,
        ld: &Layout,
        src: &Storage,
        ls: &Layout,
    ) -> Result<()> {
        match (self, src) {
            (Storage::Cpu(d), Storage::Cpu(s)) => {
                cpu::elementwise::binary_inplace::<O>(d, ld, s, ls)
            }
            (Storage::Cuda(d), Storage::Cuda(s)) => cuda::binary_inplace::<O>(name, d, ld, s, ls),
            (d, s) => Err(mixed(d, s)),
        }
    }

    pub(crate) fn cmp(
        &self,
        op: CmpOp,
        la: &Layout,
        rhs: &Storage,
        lb: &Layout,
    ) -> Result<Storage> {
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                Ok(Storage::Cpu(cpu::elementwise::cmp(op, a, la, b, lb)?))
            }
            (Storage::Cuda(a), Storage::Cuda(b)) => Ok(Storage::Cuda(cuda::cmp(op, a, la, b, lb)?)),
            (a, b) => Err(mixed(a, b)),
        }
    }

    pub(crate) fn where_cond(
        &self,
        lc: &Layout,
        t: &Storage,
        lt: &Layout,
        f: &Storage,
        lf: &Layout,
    ) -> Result<Storage> {
        match (self, t, f) {
            (Storage::Cpu(c), Storage::Cpu(t), Storage::Cpu(f)) => Ok(Storage::Cpu(
                cpu::elementwise::where_cond(c, lc, t, lt, f, lf)?,
            )),
            (Storage::Cuda(c), Storage::Cuda(t), Storage::Cuda(f)) => {
                Ok(Storage::Cuda(cuda::where_cond((c, lc), (t, lt), (f, lf))?))
            }
            (c, t, f) => Err(mixed(c, if c.device() == t.device() { f } else { t })),
        }
    }

    /// `x <= threshold ? 0 : self` (`self` the gradient), one dtype and shape, as
    /// [`Tensor::threshold_backward`](crate::Tensor::threshold_backward).
    pub(crate) fn threshold_backward(
        &self,
        lg: &Layout,
        x: &Storage,
        lx: &Layout,
        threshold: Scalar,
    ) -> Result<Storage> {
        match (self, x) {
            (Storage::Cpu(g), Storage::Cpu(x)) => Ok(Storage::Cpu(
                cpu::elementwise::threshold_backward(g, lg, x, lx, threshold)?,
            )),
            (Storage::Cuda(g), Storage::Cuda(x)) => Ok(Storage::Cuda(cuda::threshold_backward(
                (g, lg),
                (x, lx),
                threshold,
            )?)),
            (g, x) => Err(mixed(g, x)),
        }
    }

    pub(crate) fn clamp(
        &self,
        l: &Layout,
        min: Option<Scalar>,
        max: Option<Scalar>,
    ) -> Result<Storage> {
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(cpu::elementwise::clamp(s, l, min, max)?)),
            Storage::Cuda(s) => Ok(Storage::Cuda(cuda::clamp(s, l, min, max)?)),
        }
    }

    pub(crate) fn clamp_inplace(
        &mut self,
        l: &Layout,
        min: Option<Scalar>,
        max: Option<Scalar>,
    ) -> Result<()> {
        match self {
            Storage::Cpu(s) => cpu::elementwise::clamp_inplace(s, l, min, max),
            Storage::Cuda(s) => cuda::clamp_inplace(s, l, min, max),
        }
    }

    pub(crate) fn fill(&mut self, l: &Layout, value: Scalar) -> Result<()> {
        match self {
            Storage::Cpu(s) => cpu::elementwise::fill(s, l, value),
            Storage::Cuda(s) => cuda::fill(s, l, value),
        }
    }

    /// `self[ld] = src[ls]`: same dtype and shape.
    pub(crate) fn copy_from(&mut self, ld: &Layout, src: &Storage, ls: &Layout) -> Result<()> {
        match (self, src) {
            (Storage::Cpu(d), Storage::Cpu(s)) => cpu::elementwise::copy(d, ld, s, ls),
            (Storage::Cuda(d), Storage::Cuda(s)) => cuda::copy(d, ld, s, ls),
            (d, s) => Err(mixed(d, s)),
        }
    }

    /// Reduce `dims` (sorted, unique) of `l`; output shape = the kept dims.
    pub(crate) fn reduce(&self, op: ReduceOp, l: &Layout, dims: &[usize]) -> Result<Storage> {
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(cpu::reduce::reduce(op, s, l, dims)?)),
            Storage::Cuda(s) => Ok(Storage::Cuda(cuda::reduce(op, s, l, dims)?)),
        }
    }

    /// Batched matrix product of `[batch.., m, k]` and `[batch.., k, n]` layouts.
    pub(crate) fn matmul(&self, la: &Layout, rhs: &Storage, lb: &Layout) -> Result<Storage> {
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                Ok(Storage::Cpu(cpu::matmul::matmul(a, la, b, lb)?))
            }
            (Storage::Cuda(a), Storage::Cuda(b)) => Ok(Storage::Cuda(cuda::matmul(a, la, b, lb)?)),
            (a, b) => Err(mixed(a, b)),
        }
    }

    pub(crate) fn index_select(
        &self,
        l: &Layout,
        dim: usize,
        idx: &Storage,
        il: &Layout,
    ) -> Result<Storage> {
        match (self, idx) {
            (Storage::Cpu(s), Storage::Cpu(i)) => {
                Ok(Storage::Cpu(cpu::index::index_select(s, l, dim, i, il)?))
            }
            (Storage::Cuda(s), Storage::Cuda(i)) => {
                Ok(Storage::Cuda(cuda::index_select(s, l, dim, i, il)?))
            }
            (s, i) => Err(mixed(s, i)),
        }
    }

    pub(crate) fn gather(
        &self,
        l: &Layout,
        dim: usize,
        idx: &Storage,
        il: &Layout,
    ) -> Result<Storage> {
        match (self, idx) {
            (Storage::Cpu(s), Storage::Cpu(i)) => {
                Ok(Storage::Cpu(cpu::index::gather(s, l, dim, i, il)?))
            }
            (Storage::Cuda(s), Storage::Cuda(i)) => {
                Ok(Storage::Cuda(cuda::gather(s, l, dim, i, il)?))
            }
            (s, i) => Err(mixed(s, i)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scatter_add(
        &self,
        l: &Layout,
        dim: usize,
        idx: &Storage,
        il: &Layout,
        src: &Storage,
        sl: &Layout,
    ) -> Result<Storage> {
        match (self, idx, src) {
            (Storage::Cpu(d), Storage::Cpu(i), Storage::Cpu(s)) => Ok(Storage::Cpu(
                cpu::index::scatter_add(d, l, dim, i, il, s, sl)?,
            )),
            (Storage::Cuda(d), Storage::Cuda(i), Storage::Cuda(s)) => {
                Ok(Storage::Cuda(cuda::scatter_add(d, l, dim, i, il, s, sl)?))
            }
            (d, i, s) => Err(mixed(d, if d.device() == i.device() { s } else { i })),
        }
    }
}

impl Storage {
    /// `torch._amp_foreach_non_finite_check_and_unscale_` over `grads` (contiguous layouts
    /// of float dtypes, all on `found_inf`'s backend): one pass per dtype. See
    /// `ops/amp.rs`.
    pub(crate) fn amp_unscale(
        grads: &mut [(&mut Storage, &Layout)],
        (found_inf, lf): (&mut Storage, &Layout),
        (inv_scale, li): (&Storage, &Layout),
    ) -> Result<()> {
        match (found_inf, inv_scale) {
            (Storage::Cpu(f), Storage::Cpu(i)) => {
                let mut cpus = Vec::with_capacity(grads.len());
                for (s, l) in grads.iter_mut() {
                    match &mut **s {
                        Storage::Cpu(c) => cpus.push((c, *l)),
                        other => return Err(mismatch(ember_device::Device::Cpu, other)),
                    }
                }
                cpu::amp::unscale(&mut cpus, (f, lf), (i, li))
            }
            (Storage::Cuda(f), Storage::Cuda(i)) => {
                let mut cudas = Vec::with_capacity(grads.len());
                for (s, l) in grads.iter_mut() {
                    match &mut **s {
                        Storage::Cuda(c) => cudas.push((&*c, *l)),
                        other => {
                            return Err(mismatch(ember_device::Device::Cuda(f.ordinal()), other));
                        }
                    }
                }
                cuda::amp_unscale(&cudas, (f, lf), (i, li))
            }
            (f, i) => Err(mixed(f, i)),
        }
    }

    /// `torch._amp_update_scale_` on one-element storages (f32 scale, i32 tracker, f32
    /// found_inf).
    pub(crate) fn amp_update_scale(
        (scale, ls): (&mut Storage, &Layout),
        (tracker, lt): (&mut Storage, &Layout),
        (found_inf, lf): (&Storage, &Layout),
        update: cpu::amp::ScaleUpdate,
    ) -> Result<()> {
        match (scale, tracker, found_inf) {
            (Storage::Cpu(s), Storage::Cpu(t), Storage::Cpu(f)) => {
                cpu::amp::update_scale((s, ls), (t, lt), (f, lf), update)
            }
            (Storage::Cuda(s), Storage::Cuda(t), Storage::Cuda(f)) => {
                cuda::amp_update_scale((s, ls), (t, lt), (f, lf), update)
            }
            (s, _, f) => Err(mixed(s, f)),
        }
    }
}

/// Making storages on a device, moving them between devices, and reading them on the host:
/// the fronts (`raw/create.rs`, `raw/mod.rs`, `random/create.rs`) name a device, the match
/// on the backend is here.
impl Storage {
    /// `n` copies of `value` as `dtype` on `device` (a fill kernel on CUDA, so nothing
    /// crosses from the host). `op` names the caller in a device error.
    pub(crate) fn full(
        op: &'static str,
        device: Device,
        n: usize,
        value: Scalar,
        dtype: DType,
    ) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(dispatch!(dtype, T => CpuStorage::from_chunks(
                n,
                |r| r.map(|_| value.to_dtype::<T>())
            )?))),
            Device::Cuda(i) => Ok(Storage::Cuda(cuda::full(
                &cuda::ctx(op, i)?,
                n,
                value,
                dtype,
            )?)),
        }
    }

    /// `n` Philox samples as `dtype` on `device` from key `key` at counter `base`: the
    /// `kernel` on CUDA; on the CPU `on_cpu` draws them (the samplers live with the
    /// generators in `random/`).
    pub(crate) fn philox(
        device: Device,
        (kernel, dtype): (PhiloxKernel, DType),
        n: usize,
        (key, base): ([u32; 2], u64),
        on_cpu: impl FnOnce() -> Result<CpuStorage>,
    ) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(on_cpu()?)),
            Device::Cuda(i) => Ok(Storage::Cuda(cuda::philox(
                &cuda::ctx("random", i)?,
                kernel,
                dtype,
                n,
                key,
                base,
            )?)),
        }
    }

    /// A host storage as a storage on `device` (uploaded for CUDA). `op` names the caller
    /// in a device error.
    pub(crate) fn from_host(op: &'static str, s: CpuStorage, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(s)),
            Device::Cuda(i) => Ok(Storage::Cuda(CudaStorage::upload(&cuda::ctx(op, i)?, &s)?)),
        }
    }

    /// This whole contiguous storage of `len` elements on `device`: uploaded (enqueued on
    /// the current stream when `non_blocking` and the host memory is pinned), downloaded,
    /// copied between CUDA devices, or copied on the host.
    pub(crate) fn to_device(
        &self,
        len: usize,
        device: Device,
        non_blocking: bool,
    ) -> Result<Storage> {
        Ok(match (self, device) {
            (Storage::Cpu(c), Device::Cuda(i)) => {
                let ctx = cuda::ctx("to", i)?;
                Storage::Cuda(if non_blocking && c.is_pinned() {
                    CudaStorage::upload_async(&ctx, c)?
                } else {
                    CudaStorage::upload(&ctx, c)?
                })
            }
            (Storage::Cuda(c), Device::Cpu) => Storage::Cpu(c.download()?),
            (Storage::Cuda(c), Device::Cuda(i)) => Storage::Cuda(c.copy_to(&cuda::ctx("to", i)?)?),
            (Storage::Cpu(c), Device::Cpu) => {
                Storage::Cpu(cpu::cast(c, &Layout::contiguous([len]), c.dtype())?)
            }
        })
    }

    /// Runs `f` on this storage's elements on the host: a CPU storage as it is, a CUDA one
    /// downloaded whole (views rarely cover a small part of a large one).
    pub(crate) fn with_host<R>(&self, f: impl FnOnce(&CpuStorage) -> Result<R>) -> Result<R> {
        match self {
            Storage::Cpu(c) => f(c),
            Storage::Cuda(c) => f(&c.download()?),
        }
    }

    /// A contiguous copy of the layout's elements in page-locked host memory; an error for
    /// a storage that is not on the host, as in PyTorch.
    pub(crate) fn pinned_copy(&self, l: &Layout) -> Result<CpuStorage> {
        match self {
            Storage::Cpu(cs) if l.is_contiguous() && l.offset() == 0 && cs.len() == l.numel() => {
                cs.pinned_copy()
            }
            Storage::Cpu(cs) => cpu::cast(cs, l, cs.dtype())?.pinned_copy(),
            Storage::Cuda(_) => Err(TensorError::invalid(
                "pin_memory",
                format!(
                    "cannot pin a tensor on {}: only CPU tensors can be pinned",
                    self.device()
                ),
            )),
        }
    }

    /// Marks this storage as used by `stream`'s work (the caching allocator keeps it until
    /// that work completes): a CUDA storage of the stream's device, or pinned host memory.
    pub(crate) fn record_stream(&self, stream: &ember_device::cuda::Stream) -> Result<()> {
        match self {
            Storage::Cuda(c) if c.ordinal() == stream.device() => {
                c.record_stream(stream.handle());
                Ok(())
            }
            Storage::Cpu(c) if c.is_pinned() => {
                c.record_stream(stream.handle());
                Ok(())
            }
            _ => Err(TensorError::invalid(
                "record_stream",
                format!(
                    "expected a CUDA tensor on cuda:{} or a pinned CPU tensor, but got a {}tensor on {}",
                    stream.device(),
                    if self.is_pinned() { "pinned " } else { "" },
                    self.device()
                ),
            )),
        }
    }
}

/// Unreachable through the fronts, which check devices first.
fn mismatch(first: ember_device::Device, other: &Storage) -> TensorError {
    TensorError::DeviceMismatch {
        first,
        second: other.device(),
    }
}

/// Two storages on different devices reached a kernel; the fronts prevent this, so it is an
/// internal error, reported as the fronts would.
pub(crate) fn mixed(a: &Storage, b: &Storage) -> TensorError {
    TensorError::DeviceMismatch {
        first: a.device(),
        second: b.device(),
    }
}
