//! cuBLAS handles, one per (device, thread), and workspaces, one per (handle, stream): what
//! both drivers use, so that the emulator's cuBLAS model checks the real driver's use.
//!
//! Note [cuBLAS handles]:
//!
//! A cuBLAS handle carries state that a GEMM call reads: the stream it was last bound to
//! (`cublasSetStream`) and the workspace it computes in (its own default one, or the one
//! `cublasSetWorkspace` gave it). Two host threads sharing a handle race on both: thread A
//! binds stream 1, thread B binds stream 2, and A's GEMM runs on stream 2, concurrently
//! with B's in the same workspace. DataParallel's replica threads and the DataLoader's
//! workers make such threads. The choices were a lock held across the bind and the call, or
//! a handle per thread; PyTorch takes the second (`getCurrentCUDABlasHandle`: a
//! `DeviceThreadHandlePool`, each thread reserving its own handle per device, returned to
//! the pool when the thread ends so a later thread reuses it), so threads on different
//! streams never wait for each other on the host, and so does Ember: [`BlasHandles`]. A
//! thread's handle is bound to the call's stream before every call, as PyTorch does.
//!
//! A per-thread handle still runs work of one thread on several streams, and a workspace
//! must not be used by two streams' work at once (the GPU runs them concurrently): so, as
//! PyTorch's `cublas_handle_stream_to_workspace`, each (handle, stream) pair gets its own
//! workspace, of [`workspace_size`] bytes, set with `cublasSetWorkspace` after the stream
//! (binding a stream resets the workspace to the handle's default). A workspace is freed
//! when its stream is destroyed. The emulator's cuBLAS models the handle's stream binding
//! and stages each GEMM's result through the handle's workspace (Note [Emulated cuBLAS] in
//! `emulator/blas.rs`), so sharing either between threads gives a wrong result there as it
//! would on a GPU.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::driver::StreamHandle;
use crate::error::Result;

/// Handles that ended threads gave back, by device.
#[derive(Debug, Default)]
struct FreeList {
    by_device: Mutex<HashMap<usize, Vec<u64>>>,
}

/// The handles a thread holds: (pool, device, handle).
#[derive(Default)]
struct Held {
    entries: Vec<(Weak<FreeList>, usize, u64)>,
}

impl Drop for Held {
    /// A thread that ends gives its handles back to their pools.
    fn drop(&mut self) {
        for (pool, device, h) in self.entries.drain(..) {
            if let Some(p) = pool.upgrade() {
                lock(&p.by_device).entry(device).or_default().push(h);
            }
        }
    }
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A driver's cuBLAS handles and workspaces (Note [cuBLAS handles]). Handles are `u64`s
/// (the library's pointer, or the emulator's id); a workspace is whatever the driver
/// allocates (`W`).
#[derive(Debug)]
pub(crate) struct BlasHandles<W> {
    free: Arc<FreeList>,
    /// (handle, stream) → workspace.
    workspaces: Mutex<HashMap<(u64, u64), W>>,
}

impl<W> Default for BlasHandles<W> {
    fn default() -> Self {
        BlasHandles {
            free: Arc::default(),
            workspaces: Mutex::default(),
        }
    }
}

impl<W: Clone> BlasHandles<W> {
    /// The calling thread's handle on `device`: the one it holds, else one an ended thread
    /// gave back, else a new one from `create`.
    pub(crate) fn handle(
        &self,
        device: usize,
        create: impl FnOnce() -> Result<u64>,
    ) -> Result<u64> {
        let pool = Arc::downgrade(&self.free);
        let held = HELD.with(|h| {
            h.borrow()
                .entries
                .iter()
                .find(|(p, d, _)| *d == device && Weak::ptr_eq(p, &pool))
                .map(|&(_, _, h)| h)
        });
        if let Some(h) = held {
            return Ok(h);
        }
        let reused = lock(&self.free.by_device)
            .get_mut(&device)
            .and_then(Vec::pop);
        let h = match reused {
            Some(h) => h,
            None => create()?,
        };
        HELD.with(|held| held.borrow_mut().entries.push((pool, device, h)));
        Ok(h)
    }

    /// The workspace of `handle` on `stream`, from `alloc` on first use.
    pub(crate) fn workspace(
        &self,
        handle: u64,
        stream: StreamHandle,
        alloc: impl FnOnce() -> Result<W>,
    ) -> Result<W> {
        let mut map = lock(&self.workspaces);
        if let Some(w) = map.get(&(handle, stream.0)) {
            return Ok(w.clone());
        }
        let w = alloc()?;
        map.insert((handle, stream.0), w.clone());
        Ok(w)
    }

    /// Takes out the workspaces of `stream` (being destroyed), for the driver to free.
    pub(crate) fn release_stream(&self, stream: StreamHandle) -> Vec<W> {
        let mut map = lock(&self.workspaces);
        let keys: Vec<(u64, u64)> = map.keys().filter(|k| k.1 == stream.0).copied().collect();
        keys.into_iter().filter_map(|k| map.remove(&k)).collect()
    }
}

/// PyTorch's default workspace of a cuBLAS handle on one stream (`getChosenWorkspaceSize`):
/// `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KIB:COUNT` pairs, summed as SIZE KiB × COUNT) when set
/// and well-formed, else 32 MiB on compute capability 9.0 and newer, else `:4096:2:16:8`
/// (8 MiB + 128 KiB).
pub fn workspace_size(config: Option<&str>, major: i32) -> usize {
    let default = if major >= 9 {
        32 << 20
    } else {
        4096 * 1024 * 2 + 16 * 1024 * 8
    };
    let Some(config) = config else {
        return default;
    };
    let mut total = 0usize;
    let mut any = false;
    let mut parts = config.split(':').skip(1);
    while let (Some(size), Some(count)) = (parts.next(), parts.next()) {
        match (size.trim().parse::<usize>(), count.trim().parse::<usize>()) {
            (Ok(s), Ok(c)) => {
                total = total.saturating_add(s.saturating_mul(1024).saturating_mul(c));
                any = true;
            }
            _ => return default,
        }
    }
    if any && config.starts_with(':') {
        total
    } else {
        default
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_handle_and_an_ended_threads_is_reused() {
        let pool: BlasHandles<u32> = BlasHandles::default();
        let next = std::sync::atomic::AtomicU64::new(1);
        let make = || Ok(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let mine = pool.handle(0, make).unwrap();
        assert_eq!(pool.handle(0, make).unwrap(), mine);
        let other_device = pool.handle(1, make).unwrap();
        assert_ne!(other_device, mine);
        // Two live threads get two handles; once they end, a new thread reuses one.
        let barrier = std::sync::Barrier::new(2);
        let t = || {
            let h = pool.handle(0, make).unwrap();
            barrier.wait();
            h
        };
        let (a, b) = std::thread::scope(|s| {
            let (x, y) = (s.spawn(t), s.spawn(t));
            (x.join().unwrap(), y.join().unwrap())
        });
        assert!(a != b && a != mine && b != mine);
        let later =
            std::thread::scope(|s| s.spawn(|| pool.handle(0, make).unwrap()).join().unwrap());
        assert!(later == a || later == b, "{later} reuses {a} or {b}");
        assert_eq!(next.load(std::sync::atomic::Ordering::Relaxed), 5);
    }

    #[test]
    fn a_workspace_per_handle_and_stream() {
        let pool: BlasHandles<u32> = BlasHandles::default();
        let n = std::cell::Cell::new(0);
        let alloc = || {
            n.set(n.get() + 1);
            Ok(n.get())
        };
        let (s1, s2) = (StreamHandle(7), StreamHandle(8));
        assert_eq!(pool.workspace(1, s1, alloc).unwrap(), 1);
        assert_eq!(pool.workspace(1, s1, alloc).unwrap(), 1);
        assert_eq!(pool.workspace(1, s2, alloc).unwrap(), 2);
        assert_eq!(pool.workspace(2, s1, alloc).unwrap(), 3);
        let mut freed = pool.release_stream(s1);
        freed.sort();
        assert_eq!(freed, [1, 3]);
        assert_eq!(pool.workspace(1, s1, alloc).unwrap(), 4);
    }

    #[test]
    fn workspace_sizes_follow_pytorch() {
        assert_eq!(workspace_size(None, 8), 8_519_680);
        assert_eq!(workspace_size(None, 9), 33_554_432);
        assert_eq!(workspace_size(Some(":4096:8"), 8), 33_554_432);
        assert_eq!(workspace_size(Some(":4096:2:16:8"), 9), 8_519_680);
        assert_eq!(workspace_size(Some(":16:8"), 9), 131_072);
        assert_eq!(workspace_size(Some("junk"), 8), 8_519_680);
        assert_eq!(workspace_size(Some(":x:8"), 9), 33_554_432);
    }
}
