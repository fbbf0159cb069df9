//! [`CpuStorage`]: host memory from the caching allocator, viewed as a typed slice.
//!
//! The only `unsafe` of the storage layer lives here: turning the allocation's bytes into
//! `&[T]` / `&mut [T]`, and initialising fresh memory. See Note [CPU storage validity].

use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use ember_device::Device;
use ember_gemm::parallel::for_each_chunk_mut;
use ember_memory::{Allocation, CachingAllocator};

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};

// Note [CPU storage validity]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A `CpuStorage` owns an `Allocation` of at least `len * dtype.size_in_bytes()` bytes,
// 64-byte aligned (more than any dtype needs). Invariant: all `len` elements are
// initialised and valid for `dtype` (for bool: every byte is 0 or 1). It holds because
//   - the only constructor, `CpuStorage::from_chunks`, writes every element with a value
//     of type `T` (`T::DTYPE == dtype`), padding with `T::ZERO` if a producer comes short;
//   - the only mutable access, `as_mut_slice::<T>`, checks `T::DTYPE == dtype`, so writes
//     through it are values of the right type.
// The typed views check the dtype, so a `&[f32]` is never made over i64 data. Aliasing is
// Rust's usual: `&self` gives shared slices, `&mut self` an exclusive one; the storage
// cell's `RwLock` (see Note [Storage sharing]) is what hands those out across views.

/// Size above which CPU kernels split work across threads (`ember_gemm::parallel`), in elements.
pub(crate) const PAR_THRESHOLD: usize = 32 * 1024;
/// Elements per parallel chunk (at least).
const PAR_CHUNK: usize = 16 * 1024;

/// The chunk length for splitting `len` elements (at least [`PAR_THRESHOLD`]) across the
/// pool: about four chunks per thread, none under [`PAR_CHUNK`], so even a
/// `PAR_THRESHOLD`-long loop is two tasks rather than one task handed to another thread.
pub(crate) fn par_chunk_len(len: usize) -> usize {
    (len / (4 * rayon::current_num_threads().max(1))).max(PAR_CHUNK)
}

/// Runs `body(start, piece)` over `x` cut into pieces, where `start` is the piece's index of
/// its first element in `x`: in parallel pieces of [`par_chunk_len`] elements from
/// [`PAR_THRESHOLD`] up, else once over all of `x`. The one place the CPU kernels' threshold
/// rule is written.
pub(crate) fn for_each_piece<T, F>(x: &mut [T], body: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    if x.len() >= PAR_THRESHOLD {
        let chunk = par_chunk_len(x.len());
        for_each_chunk_mut(x, chunk, |i, piece| body(i * chunk, piece));
    } else {
        body(0, x);
    }
}

/// Host memory holding `len` elements of one dtype.
#[derive(Debug)]
pub struct CpuStorage {
    // `None` for zero elements: nothing is allocated, as PyTorch does for empty tensors.
    alloc: Option<Allocation>,
    dtype: DType,
    len: usize,
}

fn cpu_allocator() -> Result<&'static Arc<CachingAllocator>> {
    static CPU: OnceLock<Arc<CachingAllocator>> = OnceLock::new();
    if let Some(a) = CPU.get() {
        return Ok(a);
    }
    let a = ember_memory::allocator(Device::Cpu)?;
    Ok(CPU.get_or_init(|| a))
}

/// `len * size` of `dtype`, or [`TensorError::TooLarge`] past `isize::MAX` bytes.
pub(crate) fn checked_bytes(dtype: DType, len: usize) -> Result<usize> {
    len.checked_mul(dtype.size_in_bytes())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| TensorError::TooLarge {
            op: "alloc",
            shape: format!("[{len}]"),
        })
}

/// `len` elements of `dtype` from `allocator`, checked for size; `None` for no elements
/// (nothing is allocated for empty tensors, as PyTorch does).
fn allocate(
    allocator: &Arc<CachingAllocator>,
    dtype: DType,
    len: usize,
) -> Result<Option<Allocation>> {
    if len == 0 {
        return Ok(None);
    }
    let bytes = checked_bytes(dtype, len)?;
    let alloc = allocator.allocate(bytes)?;
    if alloc.len() < bytes {
        return Err(short_allocation(alloc.len(), bytes));
    }
    Ok(Some(alloc))
}

pub(crate) fn short_allocation(got: usize, want: usize) -> TensorError {
    TensorError::invalid(
        "alloc",
        format!("the allocator returned {got} bytes; {want} were asked for"),
    )
}

impl CpuStorage {
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

    /// A new storage of `len` elements of `T`, element `i` produced by the iterator that
    /// `produce(range)` returns for the chunk `range` containing `i`. Chunks run in
    /// parallel above [`PAR_THRESHOLD`]. A producer that yields too few values leaves
    /// zeros; extra values are ignored.
    pub(crate) fn from_chunks<T, I, F>(len: usize, produce: F) -> Result<CpuStorage>
    where
        T: WithDType,
        I: Iterator<Item = T>,
        F: Fn(Range<usize>) -> I + Sync,
    {
        Self::from_chunks_as::<false, T, I, F>(len, produce)
    }

    /// [`CpuStorage::from_chunks`], with each chunk's loop compiled for the CPU's widest
    /// vector instructions (see `cpu::simd`) when `WIDE`: for arithmetic-bound producers
    /// such as `exp`.
    pub(crate) fn from_chunks_as<const WIDE: bool, T, I, F>(
        len: usize,
        produce: F,
    ) -> Result<CpuStorage>
    where
        T: WithDType,
        I: Iterator<Item = T>,
        F: Fn(Range<usize>) -> I + Sync,
    {
        let dtype = T::DTYPE;
        let Some(alloc) = allocate(cpu_allocator()?, dtype, len)? else {
            return Ok(CpuStorage {
                alloc: None,
                dtype,
                len,
            });
        };
        let ptr = alloc.as_ptr().cast::<MaybeUninit<T>>();
        // SAFETY: `alloc` is a live host allocation of at least `len * size_of::<T>()`
        // bytes (checked above), aligned to 64 bytes >= align_of::<T>(), and owned solely by
        // us until it is moved into the returned storage. `MaybeUninit<T>` has no validity
        // requirement, so viewing fresh bytes as it is sound.
        let out: &mut [MaybeUninit<T>] = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        let fill_plain = |start: usize, dst: &mut [MaybeUninit<T>]| {
            let mut written = 0;
            let n = dst.len();
            for (d, v) in dst.iter_mut().zip(produce(start..start + n)) {
                d.write(v);
                written += 1;
            }
            for d in &mut dst[written..] {
                d.write(T::ZERO);
            }
        };
        let fill_wide = |start: usize, dst: &mut [MaybeUninit<T>]| {
            if WIDE {
                crate::cpu::simd::widest(|| fill_plain(start, dst));
            } else {
                fill_plain(start, dst);
            }
        };
        // Note [Streaming stores for large outputs].
        let streamed =
            len.saturating_mul(dtype.size_in_bytes()) >= super::stream::threshold_bytes();
        let fill = |start: usize, dst: &mut [MaybeUninit<T>]| {
            if streamed {
                super::stream::fill(dst, |off, buf| fill_wide(start + off, buf));
            } else {
                fill_wide(start, dst);
            }
        };
        for_each_piece(out, fill);
        // Every element of `out` is now initialised with a `T` (see Note [CPU storage validity]).
        Ok(CpuStorage {
            alloc: Some(alloc),
            dtype,
            len,
        })
    }

    /// `len` elements of `dtype`, every byte zero (a valid value of every dtype: 0, 0.0,
    /// false). For filling from a device copy ([`CpuStorage::write_bytes_with`]).
    pub(crate) fn zeroed(dtype: DType, len: usize) -> Result<CpuStorage> {
        let alloc = allocate(cpu_allocator()?, dtype, len)?;
        if let Some(a) = &alloc {
            // SAFETY: `a` is a live host allocation of at least `len * size` bytes that
            // nothing else references yet; writing zero bytes into it is always sound.
            unsafe { std::ptr::write_bytes(a.as_ptr(), 0, len * dtype.size_in_bytes()) };
        }
        Ok(CpuStorage { alloc, dtype, len })
    }

    /// A copy in page-locked host memory from `ember_memory::pinned_allocator()` (plain host
    /// memory where CUDA is not real), which asynchronous copies to a device read from.
    pub(crate) fn pinned_copy(&self) -> Result<CpuStorage> {
        let Some(alloc) = allocate(&ember_memory::pinned_allocator(), self.dtype, self.len)? else {
            return CpuStorage::zeroed(self.dtype, self.len);
        };
        let src = self.as_bytes();
        let bytes = src.len();
        // SAFETY: `alloc` is a fresh host allocation of at least `bytes` bytes that nothing
        // else references; `src` is `bytes` initialised bytes of another allocation (no
        // overlap). Afterwards the new storage holds a valid copy of every element (Note
        // [CPU storage validity]).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), alloc.as_ptr(), bytes) };
        Ok(CpuStorage {
            alloc: Some(alloc),
            dtype: self.dtype,
            len: self.len,
        })
    }

    /// Whether the memory came from the pinned allocator.
    pub(crate) fn is_pinned(&self) -> bool {
        self.alloc
            .as_ref()
            .is_some_and(|a| Arc::ptr_eq(a.allocator(), &ember_memory::pinned_allocator()))
    }

    /// PyTorch's `record_stream` on pinned memory: the block is not reused until the work
    /// enqueued on `stream` so far (an asynchronous copy reading it) has completed.
    pub(crate) fn record_stream(&self, stream: ember_device::driver::StreamHandle) {
        if let Some(a) = &self.alloc {
            a.record_stream(stream);
        }
    }

    /// The elements' bytes (little-endian, as the machine stores them).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match &self.alloc {
            None => &[],
            // SAFETY: the allocation holds `len` initialised elements of `dtype`, i.e.
            // `len * size` initialised bytes (every byte of them is a valid `u8`), and lives
            // as long as `self`; `&self` excludes mutable access meanwhile.
            Some(a) => unsafe {
                std::slice::from_raw_parts(a.as_ptr(), self.len * self.dtype.size_in_bytes())
            },
        }
    }

    /// Lets `write` overwrite the raw bytes (a copy from a device), then restores Note [CPU
    /// storage validity] for bool (any nonzero byte becomes `true`); every bit pattern is a
    /// valid value of the other dtypes.
    pub(crate) fn write_bytes_with(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let n = self.len * self.dtype.size_in_bytes();
        let Some(a) = &mut self.alloc else {
            return Ok(());
        };
        // SAFETY: `n` initialised bytes owned by `self`, exclusively borrowed through
        // `&mut self` for this call; a `u8` view has no validity requirement beyond
        // initialisation, and bool's is restored below before anyone reads them as bool.
        let bytes = unsafe { std::slice::from_raw_parts_mut(a.as_ptr(), n) };
        let result = write(bytes);
        if self.dtype == DType::Bool {
            for b in bytes.iter_mut() {
                *b = u8::from(*b != 0);
            }
        }
        result
    }

    /// A storage holding a copy of `data`.
    pub(crate) fn from_slice<T: WithDType>(data: &[T]) -> Result<CpuStorage> {
        Self::from_chunks(data.len(), |r| data[r].iter().copied())
    }

    fn check<T: WithDType>(&self) -> Result<()> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(TensorError::DTypeMismatch {
                op: "storage access",
                expected: T::DTYPE,
                found: self.dtype,
            })
        }
    }

    /// The elements as `&[T]`; an error if `T` is not the storage's dtype.
    pub(crate) fn as_slice<T: WithDType>(&self) -> Result<&[T]> {
        self.check::<T>()?;
        match &self.alloc {
            None => Ok(&[]),
            // SAFETY: the allocation holds `len` initialised, valid `T`s (Note [CPU storage
            // validity]; dtype checked above), is aligned for `T`, and lives as long as
            // `self`; `&self` excludes mutable access for the returned lifetime.
            Some(a) => Ok(unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<T>(), self.len) }),
        }
    }

    /// The elements as `&mut [T]`; an error if `T` is not the storage's dtype.
    pub(crate) fn as_mut_slice<T: WithDType>(&mut self) -> Result<&mut [T]> {
        self.check::<T>()?;
        let len = self.len;
        let Some(a) = &mut self.alloc else {
            return Ok(&mut []);
        };
        let ptr = a.as_ptr().cast::<T>();
        // SAFETY: as in `as_slice`; `&mut self` makes this the only access to the
        // allocation for the returned lifetime, and callers can only write `T`s.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_views_check_dtype_and_round_trip() {
        let s = CpuStorage::from_slice(&[1.5f32, -2.0, 3.25]).unwrap();
        assert_eq!(s.as_slice::<f32>().unwrap(), &[1.5, -2.0, 3.25]);
        assert!(s.as_slice::<i32>().is_err());
        let mut b = CpuStorage::from_slice(&[true, false]).unwrap();
        b.as_mut_slice::<bool>().unwrap()[1] = true;
        assert_eq!(b.as_slice::<bool>().unwrap(), &[true, true]);
        assert!(b.as_mut_slice::<u8>().is_err());
    }

    #[test]
    fn short_producers_pad_with_zero_and_parallel_chunks_cover_everything() {
        let s = CpuStorage::from_chunks(5, |_| std::iter::once(7i64)).unwrap();
        assert_eq!(s.as_slice::<i64>().unwrap(), &[7, 0, 0, 0, 0]);
        let n = PAR_THRESHOLD * 3 + 17;
        let s = CpuStorage::from_chunks(n, |r| r.map(|i| i as i64)).unwrap();
        assert!(
            s.as_slice::<i64>()
                .unwrap()
                .iter()
                .enumerate()
                .all(|(i, &v)| v == i as i64)
        );
        let e = CpuStorage::from_slice::<u8>(&[]).unwrap();
        assert!(e.is_empty() && e.as_slice::<u8>().unwrap().is_empty());
    }
}
