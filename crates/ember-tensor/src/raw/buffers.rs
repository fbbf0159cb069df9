//! The device memory of CUDA tensors, lent to library calls made outside this crate (NCCL
//! collectives in `ember-parallel`).
//!
//! Note [Lending device memory]: a collective reads and writes tensors of several devices in
//! one call, which no op of this crate does. [`with_cuda_buffers`] takes the storages' locks
//! as every op does (reads shared, writes exclusive with the version bumped, all in address
//! order: Note [Storage sharing]), hands `f` each tensor's device pointer, and after `f`
//! marks each storage as used by its device's current stream (`record_stream`), so the
//! caching allocator does not reuse a block the enqueued work still touches. `f` must
//! enqueue its work on the current stream of each buffer's device
//! (`ember_device::cuda::current_stream`), as every op here does; the work is then ordered
//! after earlier ops on those tensors and before later ones.

use ember_device::driver::DevicePtr;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::raw::RawTensor;
use crate::storage::{Storage, write_many_read_many};

/// One contiguous CUDA tensor's memory, as [`with_cuda_buffers`] lends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaBuffer {
    /// The tensor's first element.
    pub ptr: DevicePtr,
    /// Elements (the tensor's `numel`).
    pub len: usize,
    /// Element type.
    pub dtype: DType,
    /// The device ordinal.
    pub device: usize,
}

/// Runs `f` with the device memory of `reads` (read-only) and `writes` (written by `f`'s
/// work); see Note [Lending device memory]. Every tensor must be a contiguous CUDA tensor;
/// the storages of `writes` must be distinct from each other and from those of `reads`.
///
/// The buffers are given in the order of `reads` and `writes`.
pub fn with_cuda_buffers<R>(
    reads: &[&crate::Tensor],
    writes: &[&crate::Tensor],
    f: impl FnOnce(&[CudaBuffer], &[CudaBuffer]) -> crate::Result<R>,
) -> crate::Result<R> {
    let reads: Vec<RawTensor> = reads.iter().map(|t| t.raw()).collect();
    let writes: Vec<RawTensor> = writes.iter().map(|t| t.raw()).collect();
    let reads: Vec<&RawTensor> = reads.iter().collect();
    let writes: Vec<&RawTensor> = writes.iter().collect();
    lend(&reads, &writes, f)?
}

/// [`with_cuda_buffers`] over the crate's untracked tensors: `f`'s own result (its error of
/// any type) inside the lending's.
fn lend<R, E>(
    reads: &[&RawTensor],
    writes: &[&RawTensor],
    f: impl FnOnce(&[CudaBuffer], &[CudaBuffer]) -> std::result::Result<R, E>,
) -> Result<std::result::Result<R, E>> {
    const OP: &str = "with_cuda_buffers";
    for (i, t) in reads.iter().chain(writes).enumerate() {
        if !t.device().is_cuda() {
            return Err(TensorError::InvalidArgument {
                op: OP,
                msg: format!(
                    "tensor {i} must be a CUDA tensor, found one on {}",
                    t.device()
                ),
            });
        }
        if !t.is_contiguous() {
            return Err(TensorError::InvalidArgument {
                op: OP,
                msg: format!("tensor {i} must be contiguous (strides {:?})", t.strides()),
            });
        }
    }
    for (i, w) in writes.iter().enumerate() {
        let clash = writes[..i]
            .iter()
            .chain(reads)
            .any(|o| o.storage_id() == w.storage_id());
        if clash {
            return Err(TensorError::InvalidArgument {
                op: OP,
                msg: format!(
                    "written tensor {i} shares its storage with another tensor of the call"
                ),
            });
        }
    }
    // Reads that share a storage are locked once.
    let mut read_cells = Vec::new();
    let mut read_slot = Vec::with_capacity(reads.len());
    for r in reads {
        let id = r.storage_id();
        match read_cells.iter().position(|(cid, _)| *cid == id) {
            Some(k) => read_slot.push(k),
            None => {
                read_slot.push(read_cells.len());
                read_cells.push((id, r.cell()));
            }
        }
    }
    let rc: Vec<_> = read_cells.iter().map(|(_, c)| *c).collect();
    let wc: Vec<_> = writes.iter().map(|t| t.cell()).collect();
    let buffer = |t: &RawTensor, s: &Storage| -> Result<CudaBuffer> {
        match s.as_cuda() {
            Some(c) => Ok(CudaBuffer {
                ptr: c.ptr_at(t.storage_offset()),
                len: t.numel(),
                dtype: t.dtype(),
                device: c.ordinal(),
            }),
            None => Err(TensorError::InvalidArgument {
                op: OP,
                msg: "a CUDA tensor's storage is on the host".into(),
            }),
        }
    };
    write_many_read_many(&wc, &rc, |w, r| {
        let rb = reads
            .iter()
            .zip(&read_slot)
            .map(|(t, &k)| buffer(t, r[k]))
            .collect::<Result<Vec<_>>>()?;
        let wb = writes
            .iter()
            .zip(w.iter())
            .map(|(t, s)| buffer(t, s))
            .collect::<Result<Vec<_>>>()?;
        let out = f(&rb, &wb);
        if out.is_ok() {
            let storages = r.iter().copied().chain(w.iter().map(|s| &**s));
            for s in storages {
                if let Some(c) = s.as_cuda() {
                    c.record_stream(ember_device::cuda::current_stream(c.ordinal()));
                }
            }
        }
        Ok(out)
    })
}
