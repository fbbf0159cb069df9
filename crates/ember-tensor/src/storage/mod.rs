//! Storage: the memory behind tensors, shared between views.
//!
//! [`Storage`] is the one enum with a variant per backend; each op family has one method
//! here that matches on it — the single dispatch point a new backend extends
//! (See Note [Dispatch]). [`StorageCell`] is what tensors share.

mod cpu;
mod stream;

pub use cpu::CpuStorage;
pub(crate) use cpu::{PAR_THRESHOLD, for_each_piece, par_chunk_len};
pub(crate) use cpu::{checked_bytes, short_allocation};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ember_device::Device;

use crate::cuda::CudaStorage;
use crate::dtype::DType;

// Note [Storage sharing]:
// ~~~~~~~~~~~~~~~~~~~~~~~
// Views share one `Arc<StorageCell>`; the cell holds the `Storage` in an `RwLock`.
//   - Ops that read take the read lock of each distinct input storage for the kernel's
//     duration; ops that make a new tensor write into a fresh storage that nobody else can
//     see yet, so they need no lock on it.
//   - In-place ops (`add_`, `fill_`, `copy_`, ...) take the write lock of their target and
//     bump the cell's version counter (autograd compares versions to detect that a saved
//     tensor was modified).
//   - Deadlock freedom: a thread never holds two guards of one cell (inputs that share a
//     storage are locked once, `read_many`), and locks of several cells are always taken
//     in address order. An in-place op whose source shares the target's storage first
//     copies the source, so it holds the target's write lock alone.
//   - A poisoned lock (a panic inside a kernel) is recovered: the data is plain numbers,
//     there is no invariant a partial write can break.
// So writing through one view is visible in every other, and Rust's aliasing rules hold:
// nobody reads a storage while a kernel writes it.

/// The memory of one tensor storage on one device.
#[derive(Debug)]
pub(crate) enum Storage {
    /// Host memory.
    Cpu(CpuStorage),
    /// Memory on one CUDA device.
    Cuda(CudaStorage),
}

impl Storage {
    pub(crate) fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len(),
            Storage::Cuda(s) => s.len(),
        }
    }

    pub(crate) fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(s) => Device::Cuda(s.ordinal()),
        }
    }

    /// The host storage, or `None` on another backend.
    pub(crate) fn as_cpu(&self) -> Option<&CpuStorage> {
        match self {
            Storage::Cpu(s) => Some(s),
            Storage::Cuda(_) => None,
        }
    }

    /// The host storage to write, or `None` on another backend.
    pub(crate) fn as_cpu_mut(&mut self) -> Option<&mut CpuStorage> {
        match self {
            Storage::Cpu(s) => Some(s),
            Storage::Cuda(_) => None,
        }
    }

    /// The CUDA storage, or `None` on another backend.
    pub(crate) fn as_cuda(&self) -> Option<&CudaStorage> {
        match self {
            Storage::Cuda(s) => Some(s),
            Storage::Cpu(_) => None,
        }
    }

    /// Whether this is page-locked host memory (`Tensor::pin_memory`).
    pub(crate) fn is_pinned(&self) -> bool {
        self.as_cpu().is_some_and(CpuStorage::is_pinned)
    }
}

impl From<CpuStorage> for Storage {
    fn from(s: CpuStorage) -> Storage {
        Storage::Cpu(s)
    }
}

/// A storage shared by views, with its version counter. See Note [Storage sharing].
#[derive(Debug)]
pub(crate) struct StorageCell {
    data: RwLock<Storage>,
    version: AtomicU64,
    dtype: DType,
    device: Device,
    len: usize,
}

impl StorageCell {
    pub(crate) fn new(storage: Storage) -> Arc<StorageCell> {
        Arc::new(StorageCell {
            dtype: storage.dtype(),
            device: storage.device(),
            len: storage.len(),
            data: RwLock::new(storage),
            version: AtomicU64::new(0),
        })
    }

    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    pub(crate) fn device(&self) -> Device {
        self.device
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Times this storage was written in place.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Storage> {
        self.data.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The write lock; bumps the version counter and forgets a CUDA storage's known index
    /// range (Note [Known index ranges] in `cuda/nn.rs`).
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Storage> {
        let mut g = self.data.write().unwrap_or_else(PoisonError::into_inner);
        self.version.fetch_add(1, Ordering::AcqRel);
        if let Storage::Cuda(s) = &mut *g {
            s.forget_range();
        }
        g
    }

    /// Records the range of a CUDA integer storage its creator has just filled (`randint`),
    /// before anyone else can see it; not a write, so the version stays.
    pub(crate) fn set_known_range(&self, lo: i64, hi: i64) {
        let mut g = self.data.write().unwrap_or_else(PoisonError::into_inner);
        if let Storage::Cuda(s) = &mut *g {
            s.set_known_range(lo, hi);
        }
    }

    fn addr(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }
}

/// Runs `f` with read access to every cell in `cells` (duplicates locked once, locks taken
/// in address order). See Note [Storage sharing].
pub(crate) fn read_many<R>(cells: &[&Arc<StorageCell>], f: impl FnOnce(&[&Storage]) -> R) -> R {
    // The one- and two-input cases of every elementwise op, without heap allocation.
    match cells {
        [a] => return f(&[&*a.read()]),
        [a, b] if a.addr() == b.addr() => {
            let g = a.read();
            return f(&[&*g, &*g]);
        }
        [a, b] => {
            let (lo, hi) = if a.addr() < b.addr() { (a, b) } else { (b, a) };
            let (g_lo, g_hi) = (lo.read(), hi.read());
            let (sa, sb) = if a.addr() < b.addr() {
                (&*g_lo, &*g_hi)
            } else {
                (&*g_hi, &*g_lo)
            };
            return f(&[sa, sb]);
        }
        _ => {}
    }
    let mut order: Vec<usize> = (0..cells.len()).collect();
    order.sort_by_key(|&i| cells[i].addr());
    order.dedup_by_key(|i| cells[*i].addr());
    let guards: Vec<(usize, RwLockReadGuard<'_, Storage>)> = order
        .iter()
        .map(|&i| (cells[i].addr(), cells[i].read()))
        .collect();
    let refs: Vec<&Storage> = cells
        .iter()
        .filter_map(|c| {
            guards
                .iter()
                .find(|(a, _)| *a == c.addr())
                .map(|(_, g)| &**g)
        })
        .collect();
    f(&refs)
}

/// Runs `f` with write access to `dst` and read access to `src`, which must be different
/// cells (callers copy an aliasing source first). Locks in address order.
pub(crate) fn write_read<R>(
    dst: &Arc<StorageCell>,
    src: &Arc<StorageCell>,
    f: impl FnOnce(&mut Storage, &Storage) -> R,
) -> R {
    if dst.addr() < src.addr() {
        let mut d = dst.write();
        let s = src.read();
        f(&mut d, &s)
    } else {
        let s = src.read();
        let mut d = dst.write();
        f(&mut d, &s)
    }
}

/// Runs `f` with write access to `dst` and read access to each of `srcs` (duplicates among
/// them locked once), all locks taken in address order. `None` (and `f` not run) when `dst`
/// is one of `srcs`.
pub(crate) fn write_read_many<R>(
    dst: &Arc<StorageCell>,
    srcs: &[&Arc<StorageCell>],
    f: impl FnOnce(&mut Storage, &[&Storage]) -> R,
) -> Option<R> {
    enum Guard<'a> {
        Read(RwLockReadGuard<'a, Storage>),
        Write(RwLockWriteGuard<'a, Storage>),
    }
    if srcs.iter().any(|s| s.addr() == dst.addr()) {
        return None;
    }
    let mut cells: Vec<&Arc<StorageCell>> = srcs.to_vec();
    cells.push(dst);
    cells.sort_by_key(|c| c.addr());
    cells.dedup_by_key(|c| c.addr());
    let mut guards: Vec<(usize, Guard<'_>)> = cells
        .iter()
        .map(|c| {
            let g = if c.addr() == dst.addr() {
                Guard::Write(c.write())
            } else {
                Guard::Read(c.read())
            };
            (c.addr(), g)
        })
        .collect();
    let mut out: Option<&mut Storage> = None;
    let mut reads: Vec<(usize, &Storage)> = Vec::with_capacity(guards.len());
    for (addr, g) in guards.iter_mut() {
        match g {
            Guard::Write(w) => out = Some(&mut **w),
            Guard::Read(r) => reads.push((*addr, &**r)),
        }
    }
    let refs: Vec<&Storage> = srcs
        .iter()
        .filter_map(|c| reads.iter().find(|(a, _)| *a == c.addr()).map(|(_, s)| *s))
        .collect();
    out.map(|d| f(d, &refs))
}

/// Runs `f` with write access to every cell of `dsts` (in their order) and read access to
/// `src`, all locks taken in address order (Note [Storage sharing]). The caller guarantees
/// that the cells of `dsts` are distinct and that `src` is none of them (the multi-tensor
/// fronts check it), so each storage is locked once.
pub(crate) fn write_many_read<R>(
    dsts: &[&Arc<StorageCell>],
    src: &Arc<StorageCell>,
    f: impl FnOnce(&mut [&mut Storage], &Storage) -> R,
) -> R {
    let mut order: Vec<usize> = (0..dsts.len()).collect();
    order.sort_by_key(|&i| dsts[i].addr());
    let mut writes: Vec<Option<RwLockWriteGuard<'_, Storage>>> =
        (0..dsts.len()).map(|_| None).collect();
    let mut read: Option<RwLockReadGuard<'_, Storage>> = None;
    for i in order {
        if read.is_none() && src.addr() < dsts[i].addr() {
            read = Some(src.read());
        }
        writes[i] = Some(dsts[i].write());
    }
    let read = read.unwrap_or_else(|| src.read());
    let mut refs: Vec<&mut Storage> = writes.iter_mut().flatten().map(|g| &mut **g).collect();
    f(&mut refs, &read)
}

/// Runs `f` with write access to every cell of `dsts` and read access to every cell of
/// `srcs` (each in its order), all locks taken in address order (Note [Storage sharing]).
/// The caller guarantees that all the cells of both lists are distinct (the optimizers'
/// multi-tensor front checks it), so each storage is locked once.
pub(crate) fn write_many_read_many<R>(
    dsts: &[&Arc<StorageCell>],
    srcs: &[&Arc<StorageCell>],
    f: impl FnOnce(&mut [&mut Storage], &[&Storage]) -> R,
) -> R {
    // (address, is a write, index in its list), locked in address order.
    let mut order: Vec<(usize, bool, usize)> = dsts
        .iter()
        .enumerate()
        .map(|(i, c)| (c.addr(), true, i))
        .chain(srcs.iter().enumerate().map(|(i, c)| (c.addr(), false, i)))
        .collect();
    order.sort_unstable();
    let mut writes: Vec<Option<RwLockWriteGuard<'_, Storage>>> =
        (0..dsts.len()).map(|_| None).collect();
    let mut reads: Vec<Option<RwLockReadGuard<'_, Storage>>> =
        (0..srcs.len()).map(|_| None).collect();
    for (_, write, i) in order {
        if write {
            if let (Some(slot), Some(c)) = (writes.get_mut(i), dsts.get(i)) {
                *slot = Some(c.write());
            }
        } else if let (Some(slot), Some(c)) = (reads.get_mut(i), srcs.get(i)) {
            *slot = Some(c.read());
        }
    }
    let mut w: Vec<&mut Storage> = writes.iter_mut().flatten().map(|g| &mut **g).collect();
    let r: Vec<&Storage> = reads.iter().flatten().map(|g| &**g).collect();
    f(&mut w, &r)
}

/// `true` if both are the same storage.
pub(crate) fn same(a: &Arc<StorageCell>, b: &Arc<StorageCell>) -> bool {
    Arc::ptr_eq(a, b)
}
