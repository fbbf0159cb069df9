//! The emulator's cuBLAS: handles with a bound stream and a workspace, and GEMMs that run on
//! the handle's stream and stage their result through its workspace.
//!
//! Note [Emulated cuBLAS]:
//!
//! The driver seam's `gemm(device, stream, desc)` is, on both drivers, the calling thread's
//! handle (Note [cuBLAS handles] in `blas_handles.rs`) bound to `stream` and given the
//! (handle, stream) workspace, then `cublasGemmStridedBatchedEx` on the handle. For the
//! emulator to check that use, its cuBLAS keeps what a real handle keeps, and a GEMM
//! depends on it as on a GPU:
//!
//! - a GEMM is two kernels, as a split-K GEMM is: the first computes the result into the
//!   handle's workspace (cuBLAS's scratch for the partial sums), the second copies it into
//!   `C`; other threads are free to run between the two. A workspace that two threads'
//!   GEMMs use at once (one handle shared without a lock) hands one thread's result, of
//!   another shape, to the other;
//! - each kernel runs on the handle's stream as it is when the kernel is enqueued, as
//!   cuBLAS launches on the handle's current stream: [`thread_gemm_streams`] counts, per
//!   calling thread, the streams its GEMMs' kernels ran on, so a test sees a kernel that ran
//!   on another thread's stream.
//!
//! Binding a stream resets the handle's workspace to its own default one, as
//! `cublasSetStream` does. Workspaces are host buffers here (they stand for device memory
//! cuBLAS scribbles on, not for data a program reads), so they do not count as allocations.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Emulator, gemm};
use crate::driver::{GemmDesc, StreamHandle};
use crate::error::{DeviceError, Result};

/// A workspace: a host buffer the GEMM stages its result through.
pub(super) type Workspace = Arc<Mutex<Vec<u8>>>;

#[derive(Debug)]
struct HandleState {
    device: usize,
    stream: StreamHandle,
    workspace: Workspace,
    default: Workspace,
}

/// The emulated cuBLAS handles of one emulator.
#[derive(Debug, Default)]
pub(super) struct EmulatedBlas {
    next: AtomicU64,
    handles: Mutex<HashMap<u64, HandleState>>,
}

thread_local! {
    static GEMM_STREAMS: RefCell<BTreeMap<u64, u64>> = const { RefCell::new(BTreeMap::new()) };
}

/// How many GEMM kernels this thread issued ran on each stream (stream handle to count;
/// two per GEMM), the stream being the handle's when the kernel was enqueued (Note
/// [Emulated cuBLAS]).
pub fn thread_gemm_streams() -> BTreeMap<u64, u64> {
    GEMM_STREAMS.with(|m| m.borrow().clone())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn bad_handle(call: &'static str, h: u64) -> DeviceError {
    DeviceError::InvalidHandle {
        what: call,
        kind: "cuBLAS handle",
        handle: h,
    }
}

impl Emulator {
    /// `cublasCreate` on `device`: a handle on the default stream with its own workspace.
    pub(super) fn blas_create(&self, device: usize) -> Result<u64> {
        self.check_device(device)?;
        let h = self.blas.next.fetch_add(1, Ordering::Relaxed) + 1;
        let default = Workspace::default();
        lock(&self.blas.handles).insert(
            h,
            HandleState {
                device,
                stream: StreamHandle::DEFAULT,
                workspace: default.clone(),
                default,
            },
        );
        Ok(h)
    }

    /// `cublasSetStream`: binds `stream` (of the handle's device) and resets the workspace
    /// to the handle's own.
    pub(super) fn blas_set_stream(&self, h: u64, stream: StreamHandle) -> Result<()> {
        const CALL: &str = "cublasSetStream";
        let on = self.stream_device(CALL, stream)?;
        let mut handles = lock(&self.blas.handles);
        let st = handles.get_mut(&h).ok_or_else(|| bad_handle(CALL, h))?;
        if let Some(d) = on
            && d != st.device
        {
            return Err(DeviceError::Driver {
                call: CALL,
                code: "CUBLAS_STATUS_INVALID_VALUE".into(),
                detail: format!(
                    "a handle of cuda:{} bound to a stream of cuda:{d}",
                    st.device
                ),
            });
        }
        st.stream = stream;
        st.workspace = st.default.clone();
        Ok(())
    }

    /// `cublasSetWorkspace`.
    pub(super) fn blas_set_workspace(&self, h: u64, workspace: Workspace) -> Result<()> {
        let mut handles = lock(&self.blas.handles);
        let st = handles
            .get_mut(&h)
            .ok_or_else(|| bad_handle("cublasSetWorkspace", h))?;
        st.workspace = workspace;
        Ok(())
    }

    /// `cublasGemmStridedBatchedEx` on handle `h`: on its stream, through its workspace
    /// (Note [Emulated cuBLAS]). The caller checked the operands' device.
    pub(super) fn blas_gemm(&self, h: u64, desc: &GemmDesc) -> Result<()> {
        const CALL: &str = "cublasGemmStridedBatchedEx";
        // The handle's stream and workspace as a kernel enqueued now sees them.
        let current = || -> Result<(StreamHandle, Workspace)> {
            let handles = lock(&self.blas.handles);
            let st = handles.get(&h).ok_or_else(|| bad_handle(CALL, h))?;
            GEMM_STREAMS.with(|m| *m.borrow_mut().entry(st.stream.0).or_insert(0) += 1);
            Ok((st.stream, st.workspace.clone()))
        };
        let c_bytes = gemm::c_bytes(desc)?;
        // Kernel 1: the result, computed and stored in the workspace; C as it was.
        let (_, workspace) = current()?;
        {
            let mut mem = self.mem();
            let before = mem.slice(CALL, desc.c, c_bytes)?.to_vec();
            gemm::gemm(&mut mem, desc)?;
            let c = mem.slice_mut(CALL, desc.c, c_bytes)?;
            let mut ws = lock(&workspace);
            ws.clear();
            ws.extend_from_slice(c);
            c.copy_from_slice(&before);
        }
        // Another thread's GEMM may run here, as on a GPU.
        std::thread::yield_now();
        // Kernel 2: the workspace into C.
        let (_, workspace) = current()?;
        let staged = lock(&workspace).clone();
        let mut mem = self.mem();
        let c = mem.slice_mut(CALL, desc.c, c_bytes)?;
        let n = staged.len().min(c.len());
        c[..n].copy_from_slice(&staged[..n]);
        Ok(())
    }
}
