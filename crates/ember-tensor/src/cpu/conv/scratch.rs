//! Scratch memory of the CPU convolutions (column matrices, accumulators, packed copies),
//! taken from the CPU caching allocator like every tensor's storage. See Note [Convolution
//! scratch from the caching allocator].

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::{Arc, OnceLock};

use ember_device::Device;
use ember_memory::{Allocation, CachingAllocator};

use crate::dtype::WithDType;
use crate::error::Result;
use crate::storage::short_allocation;

// Note [Convolution scratch from the caching allocator]:
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A convolution of a ResNet stage needs tens of MB of scratch (im2col columns, f32
// accumulators, oneDNN's blocked copies). As `Vec`s these came from glibc, which serves
// requests of more than its mmap threshold with fresh `mmap`s and gives them back with
// `munmap` on drop: every call faulted its scratch in again, page by page, and the
// kernel's time (zeroing pages, faults) was a large share of a training step. Taken from
// the caching allocator, a block freed at the end of one call is the block the next call of
// the same shape gets, already mapped; the allocator's statistics (and so a benchmark's
// peak memory) count it as PyTorch's count its scratch.

/// The CPU caching allocator (the one `CpuStorage` uses).
pub(crate) fn cpu_allocator() -> Result<&'static Arc<CachingAllocator>> {
    static CPU: OnceLock<Arc<CachingAllocator>> = OnceLock::new();
    if let Some(a) = CPU.get() {
        return Ok(a);
    }
    let a = ember_memory::allocator(Device::Cpu)?;
    Ok(CPU.get_or_init(|| a))
}

/// Raw bytes from the CPU caching allocator (64-byte aligned), `None` for zero bytes.
pub(crate) fn raw_bytes(bytes: usize) -> Result<Option<Allocation>> {
    if bytes == 0 {
        return Ok(None);
    }
    let a = cpu_allocator()?.allocate(bytes)?;
    if a.len() < bytes {
        return Err(short_allocation(a.len(), bytes));
    }
    Ok(Some(a))
}

/// `len` elements of `T` from the caching allocator, given back to it on drop.
#[derive(Debug)]
pub(crate) struct Scratch<T> {
    alloc: Option<Allocation>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: WithDType> Scratch<T> {
    fn raw(len: usize) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            crate::error::TensorError::TooLarge {
                op: "conv2d",
                shape: format!("[{len}]"),
            }
        })?;
        Ok(Scratch {
            alloc: raw_bytes(bytes)?,
            len,
            _t: PhantomData,
        })
    }

    /// `len` zeros.
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        let s = Self::raw(len)?;
        if let Some(a) = &s.alloc {
            // SAFETY: `a` is a live host allocation of at least `len * size_of::<T>()` bytes
            // that nothing else references; zero bytes are the value zero of every float
            // type `T` here.
            unsafe { std::ptr::write_bytes(a.as_ptr(), 0, len * std::mem::size_of::<T>()) };
        }
        Ok(s)
    }

    /// `len` elements, each written by `fill`, which gets them uninitialised.
    ///
    /// # Safety
    /// `fill` must write every element of the slice it is given.
    pub(crate) unsafe fn init_with(
        len: usize,
        fill: impl FnOnce(&mut [MaybeUninit<T>]) -> Result<()>,
    ) -> Result<Self> {
        let s = Self::raw(len)?;
        if let Some(a) = &s.alloc {
            // SAFETY: a live allocation of at least `len` `T`s (64-byte aligned, more than
            // any `T` needs), owned by `s` alone; `MaybeUninit<T>` has no validity
            // requirement.
            let out =
                unsafe { std::slice::from_raw_parts_mut(a.as_ptr().cast::<MaybeUninit<T>>(), len) };
            fill(out)?;
        }
        Ok(s)
    }

    /// The elements.
    pub(crate) fn as_mut(&mut self) -> &mut [T] {
        match &self.alloc {
            None => &mut [],
            // SAFETY: `len` elements, all initialised by the constructor (`zeroed`, or
            // `init_with`, whose caller promised to write them all); `&mut self` makes
            // this the only access.
            Some(a) => unsafe { std::slice::from_raw_parts_mut(a.as_ptr().cast::<T>(), self.len) },
        }
    }

    /// The elements, shared.
    pub(crate) fn as_slice(&self) -> &[T] {
        match &self.alloc {
            None => &[],
            // SAFETY: as in `as_mut`, shared.
            Some(a) => unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<T>(), self.len) },
        }
    }
}
