//! The CPU's parallel loop, shared by the GEMM and `ember-tensor`'s kernels: the calling
//! thread takes part, as thread 0 of PyTorch's OpenMP team does.
//!
//! Note [The caller joins the loop]:
//! A training step is a long chain of small ops (a few µs to a few hundred µs each) issued
//! from the user's thread, which is not one of rayon's workers. Rayon's own entry points
//! (`par_iter`, `scope`, `join`) called from outside the pool inject the whole job, wake a
//! worker and block the caller on a lock until the job is done: per op, a futex wake of a
//! worker, the worker's wake of a second one, the caller's sleep and its wake-up, and the
//! caller's core idle meanwhile. `perf` put a large share of an MLP training step in the
//! kernel's scheduler, and the same step run on a pool thread (where nested `par_iter`s
//! stay local) was clearly faster.
//!
//! [`for_each_index`] does what an OpenMP `parallel for` does instead: the loop's indices
//! are claimed one at a time from atomic counters (Note [Pieces stay on their CPU] says
//! which counter a thread tries first), by the caller and by the team's helpers (Note [A
//! team that spins]), `threads - 1` of them. The caller never sleeps on the team: when it
//! runs out of indices it waits, spinning and then yielding, only for indices a helper has
//! already claimed and is running. A helper that joins late finds the counters exhausted
//! and returns without touching the loop's data, so an op that the caller finished alone
//! does not wait for a helper to wake.
//!
//! That last point is why a helper cannot borrow the loop body: it may hold the loop after
//! the call has returned. The job (`Arc<Job>`) holds a type-erased pointer to the body,
//! which a helper dereferences only after claiming an index below `n`; the caller returns
//! only after every claimed index has finished (`done == n`), so the body outlives every
//! call through the pointer. Panics in the body are caught where they happen (the caller
//! too must not unwind while helpers still run the body) and re-raised on the caller once
//! the loop is done.
//!
//! On a pool thread (user code inside `rayon::scope`) rayon's work stealing already keeps
//! the work local, so the loop is a plain `par_iter`; on a helper (a loop inside a loop's
//! body) it runs sequentially, every thread of the team being busy already.
//!
//! Note [A team that spins]:
//! The helpers were first jobs handed to rayon's pool (`rayon::spawn`, one per loop).
//! That made three threads for two CPUs — the caller and rayon's two workers — and a
//! worker with nothing to do looks for work by `sched_yield`-ing a few dozen times before
//! it sleeps, taking turns on a CPU with the threads doing the work: `perf stat` counted
//! about a hundred times PyTorch's context switches per 16M-element `sum`, and CPU
//! migrations where PyTorch had almost none. So the loop has its own team, as OpenMP has:
//! `threads - 1` helper threads, started on first use, that join whatever loop a caller
//! published last; between loops a helper spins on the published number for
//! [`IDLE_SPIN`] before it sleeps on a condition variable, so back-to-back ops find it
//! awake and on its CPU, and an idle process costs nothing after that. Rayon's workers
//! now sleep unless user code (or the `gemm` crate) uses rayon. With the team, the same
//! calls switch context about as rarely as PyTorch's; against the rayon helpers,
//! `sum_f32_16m`, `matmul_f32_n512` and the 128-row training shapes gained and the other
//! cases stayed level (docs/performance.md has the current side-by-side numbers).
//!
//! Note [Pieces stay on their CPU]:
//! The indices are not claimed from one counter in order but from `homes` ranges, one per
//! participant: index range `h·n/H .. (h+1)·n/H` is home `h`, and a thread claims first
//! from the home of the CPU it runs on (its position in the process's CPU set, modulo
//! `H`), then from the others. So when the same loop over the same data runs again — a
//! benchmark's repeated `sum`, the same weights read every step, one op's output read by
//! the next op of the same length — each CPU gets back the part it had last time, which
//! may still be in its caches. This is what OpenMP's static schedule gives PyTorch: thread
//! `t` always takes the `t`-th contiguous part, and its threads spin between parallel
//! regions, so they stay on their CPUs. Ember's threads are not bound to CPUs (binding a
//! library's threads would fight the user's own placement), and which helper joins which
//! loop varies, so the part follows the CPU, not the thread. In a bare two-thread sum over
//! 64 MiB (16M f32), threads that spin between calls and read the same half every call
//! ran as fast as PyTorch, clearly ahead of the same threads with the halves swapped
//! between calls, and threads that sleep between calls were slowest whichever half they
//! read. So the homes pay only with a team that stays awake (Note [A team that spins]); on
//! rayon's sleeping workers they made no difference. Where the CPU cannot be asked (not Linux), every
//! thread starts at home 0 and the order is the plain one.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

use rayon::prelude::*;

/// How long a caller that has run out of indices spins before it starts yielding.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// One home range of a loop's indices (Note [Pieces stay on their CPU]), on its own cache
/// line so that claims in different homes do not contend.
#[repr(align(64))]
struct Home {
    /// The next index to claim; grows past `end` as threads look for work.
    next: AtomicUsize,
    end: usize,
}

/// Splits `0..n` into `h` home ranges of near-equal length (`h ≥ 1`).
fn homes(n: usize, h: usize) -> Box<[Home]> {
    (0..h)
        .map(|k| Home {
            next: AtomicUsize::new(k * n / h),
            end: (k + 1) * n / h,
        })
        .collect()
}

/// The calling thread's CPU as a position in the process's CPU set (so CPUs 4 and 5 of a
/// process limited to them are 0 and 1), or `None` where that cannot be asked.
fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        let cpu = raw_cpu()?;
        // The set is sorted (read in CPU order).
        Some(cpu_set().binary_search(&cpu).unwrap_or(cpu))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The number of the CPU the calling thread runs on.
#[cfg(target_os = "linux")]
fn raw_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` takes no arguments and only reads the calling thread's CPU
    // number (a vDSO or rseq read); it returns -1 on failure, which `try_from` rejects.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// The CPUs this process may run on, as read at first use (empty if that read failed).
#[cfg(target_os = "linux")]
fn cpu_set() -> &'static [usize] {
    static SET: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    SET.get_or_init(|| {
        // SAFETY: `cpu_set_t` is plain bits, for which all-zero is the empty set;
        // `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into it, and
        // `CPU_ISSET` reads bit `c` for `c` below `CPU_SETSIZE`.
        unsafe {
            let mut mask: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut mask) != 0 {
                return Vec::new();
            }
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &mask))
                .collect()
        }
    })
}

/// One parallel loop: the claim counters, the count of finished indices, and the body.
struct Job {
    /// The indices in home ranges, one per participant (Note [Pieces stay on their CPU]).
    homes: Box<[Home]>,
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
    /// The loop `0..n` over `f` in `h` homes (`1 ≤ h`). `f` must outlive every call of
    /// [`Job::work`] that claims an index (Note [The caller joins the loop]).
    fn new<F: Fn(usize) + Sync>(n: usize, h: usize, f: &F) -> Job {
        Job {
            homes: homes(n, h),
            done: AtomicUsize::new(0),
            n,
            body: (&raw const *f).cast::<()>(),
            call: call_body::<F>,
            panic: Mutex::new(None),
        }
    }

    /// Claims and runs indices until none is left: from the home of the CPU this thread
    /// runs on first, then from the others in turn.
    fn work(&self) {
        self.work_from(current_cpu().unwrap_or(0));
    }

    /// [`Job::work`] for a thread on CPU `cpu` (a position in the process's CPU set).
    fn work_from(&self, cpu: usize) {
        let h = self.homes.len();
        let first = cpu % h;
        for home in (first..h).chain(0..first).map(|k| &self.homes[k]) {
            self.work_in(home);
        }
    }

    /// Claims and runs the indices left in `home`.
    fn work_in(&self, home: &Home) {
        loop {
            let i = home.next.fetch_add(1, Ordering::Relaxed);
            if i >= home.end {
                return;
            }
            // SAFETY: `i < home.end` (so `i < n`) was claimed, so the loop is not finished (`done < n` until
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
        let unfinished = || self.done.load(Ordering::Acquire) < self.n;
        if spin_while(SPIN, unfinished) {
            while unfinished() {
                std::thread::yield_now();
            }
        }
    }
}

/// Spins while `cond` holds, for at most `limit`; returns whether it still holds.
fn spin_while(limit: std::time::Duration, cond: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    while cond() {
        if start.elapsed() >= limit {
            return true;
        }
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    }
    false
}

/// How long an idle helper watches for the next loop before it sleeps.
const IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// The helper threads that join the callers' loops (Note [A team that spins]).
struct Team {
    slot: Mutex<Slot>,
    /// `slot`'s number, read by spinning helpers without the lock.
    published: AtomicU64,
    wake: Condvar,
}

/// The latest published loop; helpers that see a new number join it.
struct Slot {
    number: u64,
    job: Option<Arc<Job>>,
    /// Helpers asleep on [`Team::wake`].
    sleepers: usize,
}

thread_local! {
    /// Whether this thread is one of the team's helpers (a loop inside a loop runs
    /// sequentially there: every thread of the team is already busy).
    static IN_TEAM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Locks `m`, taking the data of a poisoned lock as it is (the team's data stays valid
/// whatever a panicking holder did: a number and an `Arc`).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Team {
    /// The process's team of `rayon::current_num_threads() - 1` helpers (as read at first
    /// use, from outside any pool), started on first use. Helpers that fail to start are
    /// left out: the caller finishes any loop alone if it must.
    fn get() -> &'static Team {
        static TEAM: OnceLock<&'static Team> = OnceLock::new();
        TEAM.get_or_init(|| {
            let team: &'static Team = Box::leak(Box::new(Team {
                slot: Mutex::new(Slot {
                    number: 0,
                    job: None,
                    sleepers: 0,
                }),
                published: AtomicU64::new(0),
                wake: Condvar::new(),
            }));
            for i in 1..rayon::current_num_threads() {
                let _ = std::thread::Builder::new()
                    .name(format!("ember-cpu-{i}"))
                    .spawn(move || team.serve());
            }
            team
        })
    }

    /// Makes `job` the loop that helpers join, waking those asleep.
    fn publish(&self, job: &Arc<Job>) -> u64 {
        let mut slot = lock(&self.slot);
        slot.number += 1;
        slot.job = Some(Arc::clone(job));
        self.published.store(slot.number, Ordering::Release);
        if slot.sleepers > 0 {
            self.wake.notify_all();
        }
        slot.number
    }

    /// Drops the published loop if it is still `number` (so its `Job` is freed now).
    fn retract(&self, number: u64) {
        let mut slot = lock(&self.slot);
        if slot.number == number {
            slot.job = None;
        }
    }

    /// A helper's life: wait for a loop numbered after the last one seen, join it, repeat.
    fn serve(&self) {
        IN_TEAM.with(|t| t.set(true));
        let mut seen = 0;
        loop {
            spin_while(IDLE_SPIN, || self.published.load(Ordering::Acquire) == seen);
            let job = {
                let mut slot = lock(&self.slot);
                while slot.number == seen {
                    slot.sleepers += 1;
                    slot = self.wake.wait(slot).unwrap_or_else(PoisonError::into_inner);
                    slot.sleepers -= 1;
                }
                seen = slot.number;
                slot.job.clone()
            };
            if let Some(job) = job {
                job.work();
            }
        }
    }
}

/// Runs `f(i)` for every `i` in `0..n`, each exactly once, on the calling thread and the
/// team's helpers (`rayon::current_num_threads()` threads in all); returns when all have
/// finished. A panic in `f` is re-raised here after the loop is done. See Note [The caller
/// joins the loop].
pub fn for_each_index<F: Fn(usize) + Sync>(n: usize, f: F) {
    let threads = rayon::current_num_threads();
    if n <= 1 || threads <= 1 || IN_TEAM.with(|t| t.get()) {
        (0..n).for_each(f);
        return;
    }
    if rayon::current_thread_index().is_some() {
        (0..n).into_par_iter().with_max_len(1).for_each(&f);
        return;
    }
    let team = Team::get();
    let job = Arc::new(Job::new(n, threads.min(n), &f));
    let number = team.publish(&job);
    job.work();
    job.wait();
    team.retract(number);
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
    fn homes_split_the_range_and_a_thread_starts_at_its_cpus_home() {
        for n in 0..40 {
            for h in 1..9 {
                let hs = homes(n, h);
                let mut at = 0;
                for home in hs.iter() {
                    assert_eq!(home.next.load(Ordering::Relaxed), at, "n {n}, h {h}");
                    assert!(home.end >= at && home.end - at <= n.div_ceil(h));
                    at = home.end;
                }
                assert_eq!(at, n, "n {n}, h {h}");
            }
        }
        // On its own, a thread on CPU `cpu` runs its home's indices first, in order, then
        // the later homes, then the earlier ones.
        for (n, h, cpu, want) in [
            (10, 2, 0, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
            (10, 2, 1, vec![5, 6, 7, 8, 9, 0, 1, 2, 3, 4]),
            (10, 2, 3, vec![5, 6, 7, 8, 9, 0, 1, 2, 3, 4]),
            (7, 3, 2, vec![4, 5, 6, 0, 1, 2, 3]),
            (7, 3, 1, vec![2, 3, 4, 5, 6, 0, 1]),
        ] {
            let seen = Mutex::new(Vec::new());
            let f = |i: usize| seen.lock().map(|mut s| s.push(i)).unwrap_or(());
            let job = Job::new(n, h, &f);
            job.work_from(cpu);
            job.wait();
            assert_eq!(*seen.lock().unwrap(), want, "n {n}, h {h}, cpu {cpu}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_current_cpu_is_a_position_in_the_cpu_set() {
        let set = cpu_set();
        assert!(
            !set.is_empty() && set.windows(2).all(|w| w[0] < w[1]),
            "{set:?}"
        );
        for _ in 0..100 {
            let raw = raw_cpu().expect("sched_getcpu works on Linux");
            assert!(set.contains(&raw), "CPU {raw} outside the set {set:?}");
            let cpu = current_cpu().expect("a position");
            assert!(cpu < set.len(), "position {cpu} of {} CPUs", set.len());
            std::thread::yield_now();
        }
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
    fn loops_from_many_threads_and_loops_in_loops_run_every_index_once() {
        // Several callers publish at once (helpers join the latest, the others' callers
        // finish alone), and bodies run loops of their own: on a helper those run
        // sequentially, on a caller they are published in turn.
        std::thread::scope(|s| {
            for t in 0..4usize {
                s.spawn(move || {
                    for round in 0..50usize {
                        let n = 2 + (t * 7 + round) % 23;
                        let hits: Vec<AtomicU32> = (0..n * n).map(|_| AtomicU32::new(0)).collect();
                        for_each_index(n, |i| {
                            for_each_index(n, |j| {
                                hits[i * n + j].fetch_add(1, Ordering::Relaxed);
                            });
                        });
                        assert!(
                            hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                            "thread {t}, round {round}, n {n}"
                        );
                    }
                });
            }
        });
    }

    #[test]
    fn slow_helpers_and_a_busy_pool_still_finish() {
        // Keep rayon's workers busy: the loop must not depend on them (its helpers are
        // the team's), and a caller whose helpers start late does the loop alone.
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
