//! The CPU's parallel loop, shared by the GEMM and `ember-tensor`'s kernels: the calling
//! thread takes part, as thread 0 of PyTorch's OpenMP team does.
//!
//! Note [The caller joins the loop]
//! A training step is a long chain of small ops (a few µs to a few hundred µs each) issued
//! from the user's thread, which is not one of rayon's workers. Rayon's own entry points
//! (`par_iter`, `scope`, `join`) called from outside the pool inject the whole job, wake a
//! worker and block the caller on a lock until the job is done: per op, a futex wake of a
//! worker, the worker's wake of a second one, the caller's sleep and its wake-up, and the
//! caller's core idle meanwhile. `perf` showed a fifth of an MLP training step in the
//! kernel's scheduler (session 10's note), and running the same step on a pool thread
//! (where nested `par_iter`s stay local) was 1.3–1.7× faster.
//!
//! [`for_each_index`] does what an OpenMP `parallel for` does instead: the loop's indices
//! are claimed one at a time from an atomic counter, by the caller and by helper jobs it
//! hands to the pool (`rayon::spawn`, `threads - 1` of them). The caller never sleeps on
//! the pool: when it runs out of indices it waits, spinning and then yielding, only for
//! indices a helper has already claimed and is running. A helper that starts late finds
//! the counter exhausted and returns without touching the loop's data, so an op that the
//! caller finished alone does not wait for a worker to wake.
//!
//! That last point is why a helper cannot borrow the loop body: rayon's `spawn` wants
//! `'static`, and the helper may outlive the call. The job (`Arc<Job>`) holds a type-erased
//! pointer to the body, which a helper dereferences only after claiming an index below
//! `n`; the caller returns only after every claimed index has finished (`done == n`), so
//! the body outlives every call through the pointer. Panics in the body are caught where
//! they happen (the caller too must not unwind while helpers still run the body) and
//! re-raised on the caller once the loop is done.
//!
//! On a pool thread (a nested loop, or user code inside `rayon::scope`) rayon's work
//! stealing already keeps the work local, so the loop is a plain `par_iter`.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

/// How long a caller that has run out of indices spins before it starts yielding.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// One parallel loop: the claim counter, the count of finished indices, and the body.
struct Job {
    /// The next index to claim; grows past `n` as late helpers look for work.
    next: AtomicUsize,
    /// Indices whose body call has returned (or panicked).
    done: AtomicUsize,
    n: usize,
    /// The loop body, type-erased: `call(body, i)` runs it for index `i`.
    body: *const (),
    call: unsafe fn(*const (), usize),
    /// The first panic's payload, re-raised on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `body` points to an `F: Fn(usize) + Sync` (see `for_each_index`), so calling it
// from several threads at once is allowed; the other fields are atomics, a mutex, and plain
// values. `Send` moves only the `Arc` that owns these between threads.
unsafe impl Send for Job {}
// SAFETY: as above: every shared access goes through `&F` with `F: Sync`, atomics, or a mutex.
unsafe impl Sync for Job {}

/// Calls the body behind `body` (an `F`) with `i`.
///
/// # Safety
/// `body` must point to a live `F`.
unsafe fn call_body<F: Fn(usize) + Sync>(body: *const (), i: usize) {
    // SAFETY: the caller's contract: `body` is a live `F`.
    let f = unsafe { &*body.cast::<F>() };
    f(i);
}

impl Job {
    /// Claims and runs indices until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            // SAFETY: `i < n` was claimed, so the loop is not finished (`done < n` until
            // this call is counted) and `for_each_index` has not returned: `body` is live
            // (Note [The caller joins the loop]).
            let r = catch_unwind(AssertUnwindSafe(|| unsafe { (self.call)(self.body, i) }));
            if let Err(p) = r
                && let Ok(mut slot) = self.panic.lock()
            {
                slot.get_or_insert(p);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    /// Waits until every index has finished: spins for up to [`SPIN`] (a helper is
    /// mid-body, and the bodies are short), then yields the core between checks (the
    /// helper may have been preempted, or another thread has work).
    fn wait(&self) {
        let start = std::time::Instant::now();
        let mut spinning = true;
        while self.done.load(Ordering::Acquire) < self.n {
            if spinning {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
                spinning = start.elapsed() < SPIN;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Runs `f(i)` for every `i` in `0..n`, each exactly once, on the calling thread and
/// rayon's pool (at most `rayon::current_num_threads()` threads in all); returns when all
/// have finished. A panic in `f` is re-raised here after the loop is done. See Note [The
/// caller joins the loop].
pub fn for_each_index<F: Fn(usize) + Sync>(n: usize, f: F) {
    let threads = rayon::current_num_threads();
    if n <= 1 || threads <= 1 {
        (0..n).for_each(f);
        return;
    }
    if rayon::current_thread_index().is_some() {
        (0..n).into_par_iter().with_max_len(1).for_each(&f);
        return;
    }
    let job = Arc::new(Job {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        n,
        body: (&raw const f).cast::<()>(),
        call: call_body::<F>,
        panic: Mutex::new(None),
    });
    for _ in 0..(threads - 1).min(n - 1) {
        let job = Arc::clone(&job);
        rayon::spawn(move || job.work());
    }
    job.work();
    job.wait();
    // Every index has finished: no helper calls through `body` again, so `f` may go.
    let panic = job.panic.lock().map(|mut p| p.take()).unwrap_or(None);
    if let Some(p) = panic {
        resume_unwind(p);
    }
}

/// Raw pointer to a slice's first element, shared by the tasks that write disjoint parts.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: only used by `for_each_chunk_mut`, whose tasks write disjoint ranges of a slice of
// `T: Send` that the caller borrows mutably for the whole loop.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the field).
    fn get(&self) -> *mut T {
        self.0
    }
}

/// Runs `f(i, chunk)` for each `chunk`-long piece of `out` (the last may be shorter), `i`
/// its index, in parallel as [`for_each_index`] does. `chunk` 0 is taken as 1.
pub fn for_each_chunk_mut<T, F>(out: &mut [T], chunk: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let len = out.len();
    let chunk = chunk.max(1);
    let base = SharedMut(out.as_mut_ptr());
    for_each_index(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        let end = (start + chunk).min(len);
        // SAFETY: `for_each_index` calls each `i` once, so the ranges `start..end` of
        // different calls are disjoint, and they lie inside `out` (`start < len` because
        // `i < ceil(len / chunk)`). `out` is borrowed mutably until the loop returns, so
        // nothing else reads or writes it meanwhile.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        f(i, piece);
    });
}

/// As [`for_each_chunk_mut`] for a fallible `f`: every chunk runs, and the error of the
/// lowest-indexed chunk that failed is returned.
pub fn try_for_each_chunk_mut<T, E, F>(out: &mut [T], chunk: usize, f: F) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(usize, &mut [T]) -> Result<(), E> + Sync,
{
    let first: Mutex<Option<(usize, E)>> = Mutex::new(None);
    for_each_chunk_mut(out, chunk, |i, piece| {
        if let Err(e) = f(i, piece)
            && let Ok(mut slot) = first.lock()
            && slot.as_ref().is_none_or(|(j, _)| i < *j)
        {
            *slot = Some((i, e));
        }
    });
    match first.into_inner() {
        Ok(Some((_, e))) => Err(e),
        Ok(None) => Ok(()),
        // A poisoned lock means a chunk panicked; `for_each_chunk_mut` re-raised that.
        Err(p) => p.into_inner().map_or(Ok(()), |(_, e)| Err(e)),
    }
}

/// `f(i)` for each `i` in `0..n` in parallel, as [`for_each_index`], collected in order.
pub fn map_indices<R, F>(n: usize, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(usize) -> R + Sync,
{
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    for_each_chunk_mut(&mut out, 1, |i, slot| {
        if let Some(s) = slot.first_mut() {
            *s = Some(f(i));
        }
    });
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn on_caller_and_pool(check: impl Fn() + Send + Sync) {
        check(); // from this test thread, outside the pool
        rayon::scope(|_| check()); // on a pool thread (the nested path)
    }

    #[test]
    fn every_index_runs_once() {
        on_caller_and_pool(|| {
            for n in [0usize, 1, 2, 3, 7, 64, 1000] {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                for_each_index(n, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "n = {n}"
                );
            }
        });
    }

    #[test]
    fn chunks_cover_the_slice_disjointly() {
        on_caller_and_pool(|| {
            for (len, chunk) in [(0usize, 4usize), (1, 4), (10, 3), (4096, 100), (5, 0)] {
                let mut v = vec![0u64; len];
                for_each_chunk_mut(&mut v, chunk, |i, piece| {
                    let c = chunk.max(1);
                    assert!(piece.len() <= c);
                    for (j, x) in piece.iter_mut().enumerate() {
                        *x += (i * c + j) as u64 + 1;
                    }
                });
                let want: Vec<u64> = (1..=len as u64).collect();
                assert_eq!(v, want, "len {len}, chunk {chunk}");
            }
        });
    }

    #[test]
    fn map_keeps_order() {
        on_caller_and_pool(|| {
            let squares = map_indices(100, |i| i * i);
            assert_eq!(squares, (0..100).map(|i| i * i).collect::<Vec<_>>());
        });
    }

    #[test]
    fn the_lowest_failing_chunk_reports() {
        on_caller_and_pool(|| {
            let mut v = vec![0u8; 100];
            let r = try_for_each_chunk_mut(&mut v, 10, |i, piece| {
                piece.fill(1);
                if i % 3 == 2 { Err(i) } else { Ok(()) }
            });
            assert_eq!(r, Err(2));
            assert!(v.iter().all(|&x| x == 1), "every chunk still ran");
            let ok: Result<(), usize> = try_for_each_chunk_mut(&mut v, 7, |_, _| Ok(()));
            assert_eq!(ok, Ok(()));
        });
    }

    #[test]
    fn slow_helpers_and_a_busy_pool_still_finish() {
        // Keep the pool's workers busy so helpers start late: the caller does the loop
        // alone and must not wait for them.
        let stop = std::sync::atomic::AtomicBool::new(false);
        rayon::in_place_scope(|s| {
            for _ in 0..rayon::current_num_threads() {
                s.spawn(|_| {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                });
            }
            let sum = AtomicUsize::new(0);
            for_each_index(1000, |i| {
                sum.fetch_add(i, Ordering::Relaxed);
            });
            assert_eq!(sum.load(Ordering::Relaxed), 999 * 1000 / 2);
            stop.store(true, Ordering::Relaxed);
        });
    }

    #[test]
    fn a_panic_in_the_body_reaches_the_caller_after_the_loop() {
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            for_each_index(64, |i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert!(i != 17, "index 17");
            })
        }));
        let p = r.err();
        let msg = p.as_ref().and_then(|p| {
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
        });
        assert_eq!(msg.as_deref(), Some("index 17"));
        // Every index still ran: the loop finished before the panic was re-raised.
        assert_eq!(ran.load(Ordering::Relaxed), 64);
    }
}
