//! [`DataLoader`]: batches of a [`Dataset`], shuffled reproducibly, made on the calling
//! thread or ahead of time by worker threads, optionally pinned. The rules (shuffling, workers, pinning) are documented on
//! [`DataLoader`].

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use ember_tensor::Device;
use ember_tensor::random::ThreadGenerator;
use ember_tensor::random::philox::{key_of, philox4x32_10};

use super::dataset::{Dataset, IntoDataset};
use super::sampler::Sampler;
use crate::Tensor;
use crate::error::{NnError, Result};

/// A custom collate function: receives the samples of a batch (`Dataset::get` of each
/// index, in batch order) and returns the batch's fields.
pub type CollateFn = Arc<dyn Fn(Vec<Vec<Tensor>>) -> Result<Vec<Tensor>> + Send + Sync>;

/// A worker's setup step (PyTorch's `worker_init_fn`): called with the worker id on each
/// worker thread, after its generator is seeded and before its first batch.
pub type WorkerInitFn = Arc<dyn Fn(usize) -> Result<()> + Send + Sync>;

/// What a worker thread knows about itself (PyTorch's `torch.utils.data.get_worker_info()`),
/// read with [`get_worker_info`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    /// This worker's number, `0..num_workers`.
    pub id: usize,
    /// The loader's `num_workers`.
    pub num_workers: usize,
    /// The seed of this worker's CPU generator: the epoch's base seed plus `id`.
    pub seed: u64,
}

thread_local! {
    static WORKER: Cell<Option<WorkerInfo>> = const { Cell::new(None) };
}

/// On a [`DataLoader`] worker thread (inside `Dataset::get`, `get_batch`, a collate or
/// worker-init function), that worker's [`WorkerInfo`]; `None` on any other thread, e.g.
/// when batches are made on the calling thread (`num_workers(0)`).
pub fn get_worker_info() -> Option<WorkerInfo> {
    WORKER.with(Cell::get)
}

/// The base seed of epoch `epoch`'s workers: worker `w`'s CPU generator is seeded with
/// `base + w`. It is the draw with counter `k = 2^63` of [`shuffled_indices`]'s stream for
/// `(seed, epoch)`, a counter no shuffle reaches.
pub fn worker_base_seed(seed: u64, epoch: u64) -> u64 {
    let w = philox4x32_10(
        [0, 1 << 31, epoch as u32, (epoch >> 32) as u32],
        key_of(seed),
    );
    u64::from(w[0]) | (u64::from(w[1]) << 32)
}

/// A permutation of `0..n` determined by `(seed, epoch)` alone.
///
/// The rule (stable; changing it changes every shuffled order): draw `k` (`k = 0, 1, ...`)
/// is the 64-bit number `w[0] | w[1] << 32` with `w = philox4x32_10([k_lo, k_hi, epoch_lo,
/// epoch_hi], [seed_lo, seed_hi])`. Starting from the identity, for `i = n-1` down to `1`,
/// element `i` is swapped with element `j`, `j` uniform in `0..=i` by Lemire's
/// multiply-and-reject method on the next draws (`j = (x * (i+1)) >> 64`, redrawing while
/// the low 64 bits of the product are below `2^64 mod (i+1)`).
///
/// ```
/// use ember_nn::data::shuffled_indices;
/// let p = shuffled_indices(10, 0, 0);
/// let mut sorted = p.clone();
/// sorted.sort();
/// assert_eq!(sorted, (0..10).collect::<Vec<_>>());
/// assert_eq!(p, shuffled_indices(10, 0, 0));
/// assert_ne!(p, shuffled_indices(10, 0, 1));
/// ```
pub fn shuffled_indices(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let key = key_of(seed);
    let mut k: u64 = 0;
    let mut draw = || {
        let w = philox4x32_10(
            [
                k as u32,
                (k >> 32) as u32,
                epoch as u32,
                (epoch >> 32) as u32,
            ],
            key,
        );
        k = k.wrapping_add(1);
        u64::from(w[0]) | (u64::from(w[1]) << 32)
    };
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let s = (i as u64) + 1;
        let mut m = u128::from(draw()) * u128::from(s);
        if (m as u64) < s {
            let threshold = s.wrapping_neg() % s;
            while (m as u64) < threshold {
                m = u128::from(draw()) * u128::from(s);
            }
        }
        let j = (m >> 64) as usize;
        perm.swap(i, j);
    }
    perm
}

/// PyTorch's `torch.utils.data.DataLoader` over a map-style [`Dataset`], configured
/// builder-style.
///
/// # Shuffling
///
/// With `shuffle(true)`, epoch `e` visits the samples in the order
/// [`shuffled_indices`]`(len, seed, e)`: a Fisher–Yates shuffle driven by Philox4x32-10
/// keyed by the seed, with the epoch in the high half of the counter. The order depends on
/// nothing but `(len, seed, epoch)`: the same on every machine, for any number of workers.
/// [`DataLoader::iter`] uses epoch 0 on its first call, 1 on the next, and so on (like a
/// PyTorch `DataLoader` drawing a new permutation per `iter()`); [`DataLoader::set_epoch`]
/// moves that counter and [`DataLoader::epoch`] asks for one epoch directly. Without
/// [`DataLoader::seed`], the seed is the default generator's
/// ([`ember_tensor::random::initial_seed`] when iteration starts), so
/// `ember_tensor::random::manual_seed(s)` makes an unseeded loader reproducible too.
///
/// # Workers
///
/// With `num_workers(0)` (the default) each batch is made on the calling thread when the
/// iterator is advanced. With `num_workers(n)`, `n` threads make batches ahead: batch `i`
/// goes to worker `i % n` (PyTorch's round robin), and at most `n * prefetch_factor`
/// batches are queued or made but not yet yielded. Batches are yielded in order whatever
/// order they finish in (PyTorch's `in_order=True`).
///
/// As each PyTorch worker process has its own random generator, each worker thread has its
/// own CPU default generator ([`ThreadGenerator`]) seeded with
/// [`worker_base_seed`]`(seed, epoch) + id`, the seed being the shuffling seed. So random
/// augmentation in `Dataset::get` (`Tensor::rand`, dropout masks, ...) gives the same
/// batches on every run with the same seed, epoch and `num_workers`, whatever the threads'
/// timing, and draws nothing from the calling thread's generator. A worker reads its
/// [`WorkerInfo`] with [`get_worker_info`] and can be set up with
/// [`DataLoader::worker_init_fn`].
///
/// An error (or a panic) while making a batch becomes that batch's `Err`
/// item; later batches still come. Dropping the iterator stops the workers: they take no
/// new batch, and the drop waits for the batches being made to finish (at most one per
/// worker), so no thread outlives the iterator.
///
/// # Pinned memory
///
/// With `pin_memory(true)` every CPU tensor of a batch is copied into pinned host memory
/// (`Tensor::pin_memory`; by the worker that made it, when there are workers), so that
/// `to_non_blocking(device)` can overlap the copy with compute. Where CUDA is not real,
/// pinned memory is plain host memory and everything still works. Tensors already pinned or
/// not on the CPU are passed through.
///
/// # Options
///
/// Defaults: `batch_size(1)`, no shuffling, `drop_last(false)`, `num_workers(0)`,
/// `prefetch_factor(2)`, `pin_memory(false)`, the dataset's [`Dataset::get_batch`] as the
/// collate step. Options are checked when iteration starts: `batch_size(0)`, or
/// `prefetch_factor(0)` with workers, make [`DataLoader::iter`] an error.
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    batch_size: usize,
    shuffle: bool,
    seed: Option<u64>,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    pin_memory: bool,
    collate: Option<CollateFn>,
    worker_init: Option<WorkerInitFn>,
    sampler: Option<Arc<dyn Sampler>>,
    next_epoch: AtomicU64,
}

impl fmt::Debug for DataLoader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataLoader")
            .field("dataset_len", &self.dataset.len())
            .field("batch_size", &self.batch_size)
            .field("shuffle", &self.shuffle)
            .field("seed", &self.seed)
            .field("drop_last", &self.drop_last)
            .field("num_workers", &self.num_workers)
            .field("prefetch_factor", &self.prefetch_factor)
            .field("pin_memory", &self.pin_memory)
            .field("collate", &self.collate.as_ref().map(|_| "custom"))
            .field(
                "worker_init_fn",
                &self.worker_init.as_ref().map(|_| "custom"),
            )
            .field("sampler", &self.sampler)
            .field("next_epoch", &self.next_epoch.load(Ordering::Relaxed))
            .finish()
    }
}

impl DataLoader {
    /// A loader over `dataset` (by value, as PyTorch's `DataLoader(ds)`, or already in an
    /// `Arc`) with the default options.
    pub fn new(dataset: impl IntoDataset) -> DataLoader {
        DataLoader {
            dataset: dataset.into_dataset(),
            batch_size: 1,
            shuffle: false,
            seed: None,
            drop_last: false,
            num_workers: 0,
            prefetch_factor: 2,
            pin_memory: false,
            collate: None,
            worker_init: None,
            sampler: None,
            next_epoch: AtomicU64::new(0),
        }
    }

    /// Samples per batch (the last batch may be smaller unless `drop_last`). Must be
    /// positive.
    pub fn batch_size(mut self, batch_size: usize) -> DataLoader {
        self.batch_size = batch_size;
        self
    }

    /// Whether each epoch visits the samples in a seeded random order.
    pub fn shuffle(mut self, shuffle: bool) -> DataLoader {
        self.shuffle = shuffle;
        self
    }

    /// The shuffling seed (see [`shuffled_indices`]).
    pub fn seed(mut self, seed: u64) -> DataLoader {
        self.seed = Some(seed);
        self
    }

    /// Whether to drop the last batch when it is smaller than `batch_size`.
    pub fn drop_last(mut self, drop_last: bool) -> DataLoader {
        self.drop_last = drop_last;
        self
    }

    /// Worker threads making batches ahead; `0` makes them on the calling thread.
    pub fn num_workers(mut self, num_workers: usize) -> DataLoader {
        self.num_workers = num_workers;
        self
    }

    /// Batches each worker may have queued or made ahead (must be positive when there are
    /// workers): at most `num_workers * prefetch_factor` batches are in flight.
    pub fn prefetch_factor(mut self, prefetch_factor: usize) -> DataLoader {
        self.prefetch_factor = prefetch_factor;
        self
    }

    /// Whether each batch's CPU tensors are copied into pinned host memory.
    pub fn pin_memory(mut self, pin_memory: bool) -> DataLoader {
        self.pin_memory = pin_memory;
        self
    }

    /// A custom collate function, called with the samples of each batch (`Dataset::get` of
    /// each index) instead of `Dataset::get_batch`.
    pub fn collate(
        mut self,
        collate: impl Fn(Vec<Vec<Tensor>>) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> DataLoader {
        self.collate = Some(Arc::new(collate));
        self
    }

    /// A function each worker thread calls with its id before making its first batch
    /// (PyTorch's `worker_init_fn`); unused without workers. An error (or panic) in it
    /// becomes the `Err` item of every batch that worker was to make.
    pub fn worker_init_fn(
        mut self,
        init: impl Fn(usize) -> Result<()> + Send + Sync + 'static,
    ) -> DataLoader {
        self.worker_init = Some(Arc::new(init));
        self
    }

    /// The indices each epoch visits, in order, from `sampler` (PyTorch's `sampler=`
    /// argument, e.g. `ember-parallel`'s `DistributedSampler`) instead of `0..len` or its
    /// shuffle. Mutually exclusive with `shuffle(true)`: iteration then fails, as PyTorch's
    /// constructor does. Keep a clone of the `Arc` to call the sampler's own methods
    /// (`set_epoch`).
    pub fn sampler(mut self, sampler: Arc<dyn Sampler>) -> DataLoader {
        self.sampler = Some(sampler);
        self
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }

    /// The number of batches per epoch: `ceil(len / batch_size)`, or `floor` with
    /// `drop_last` (0 when `batch_size` is 0, which iteration refuses); `len` is the
    /// sampler's when there is one, else the dataset's.
    pub fn len(&self) -> usize {
        let n = self
            .sampler
            .as_ref()
            .map_or_else(|| self.dataset.len(), |s| s.len());
        match self.batch_size {
            0 => 0,
            b if self.drop_last => n / b,
            b => n.div_ceil(b),
        }
    }

    /// Whether an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets the epoch the next [`DataLoader::iter`] uses (PyTorch's `sampler.set_epoch`).
    pub fn set_epoch(&self, epoch: u64) {
        self.next_epoch.store(epoch, Ordering::Relaxed);
    }

    /// The next epoch: epoch 0 on the first call, then 1, 2, ... (see
    /// [`DataLoader::set_epoch`]). An error if the options are invalid or a worker thread
    /// cannot be started.
    pub fn iter(&self) -> Result<DataLoaderIter> {
        let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
        self.epoch(epoch)
    }

    /// The batches of epoch `epoch` (the same batches every time for the same epoch and
    /// seed); does not move the counter [`DataLoader::iter`] uses.
    pub fn epoch(&self, epoch: u64) -> Result<DataLoaderIter> {
        let batches = self.batch_indices(epoch)?;
        let job = Arc::new(Job {
            dataset: Arc::clone(&self.dataset),
            collate: self.collate.clone(),
            worker_init: self.worker_init.clone(),
            pin: self.pin_memory,
        });
        let mode = if self.num_workers == 0 || batches.is_empty() {
            Mode::Inline(job)
        } else {
            Mode::Workers(Workers::start(
                job,
                self.num_workers,
                batches.len(),
                worker_base_seed(self.seed_value(), epoch),
                self.num_workers.saturating_mul(self.prefetch_factor),
            )?)
        };
        let mut it = DataLoaderIter {
            batches,
            next: 0,
            mode,
        };
        it.top_up();
        Ok(it)
    }

    /// The sample indices of each batch of epoch `epoch`, in order. An error if the options
    /// are invalid.
    pub fn batch_indices(&self, epoch: u64) -> Result<Vec<Vec<usize>>> {
        self.validate()?;
        let n = self.dataset.len();
        let order = match &self.sampler {
            Some(sampler) => {
                let order = sampler.indices(epoch)?;
                if let Some(&i) = order.iter().find(|&&i| i >= n) {
                    return Err(NnError::invalid(
                        "DataLoader",
                        format!(
                            "the sampler yielded index {i}, but the dataset has {n} samples (indices 0..{n})"
                        ),
                    )
                    .into());
                }
                order
            }
            None if self.shuffle => shuffled_indices(n, self.seed_value(), epoch),
            None => (0..n).collect(),
        };
        let mut batches: Vec<Vec<usize>> = order
            .chunks(self.batch_size)
            .map(<[usize]>::to_vec)
            .collect();
        if self.drop_last && batches.last().is_some_and(|b| b.len() < self.batch_size) {
            batches.pop();
        }
        Ok(batches)
    }

    /// The seed shuffling and the workers' generators use.
    fn seed_value(&self) -> u64 {
        self.seed.unwrap_or_else(ember_tensor::random::initial_seed)
    }

    fn validate(&self) -> Result<()> {
        if self.shuffle && self.sampler.is_some() {
            return Err(NnError::invalid(
                "DataLoader",
                "sampler option is mutually exclusive with shuffle: shuffle in the sampler (DistributedSampler shuffles by default) and leave the loader's shuffle off",
            )
            .into());
        }
        if self.batch_size == 0 {
            return Err(NnError::invalid(
                "DataLoader",
                "batch_size should be a positive integer value, but got batch_size=0",
            )
            .into());
        }
        if self.num_workers > 0 && self.prefetch_factor == 0 {
            return Err(NnError::invalid(
                "DataLoader",
                format!(
                    "prefetch_factor should be a positive integer when num_workers > 0, but got prefetch_factor=0 with num_workers={}",
                    self.num_workers
                ),
            ).into());
        }
        Ok(())
    }
}

/// What making one batch needs.
struct Job {
    dataset: Arc<dyn Dataset>,
    collate: Option<CollateFn>,
    worker_init: Option<WorkerInitFn>,
    pin: bool,
}

/// `f()`, with a panic turned into an error saying `what` panicked.
fn guarded<T>(what: impl FnOnce() -> String, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let payload = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".into());
        Err(NnError::Data(format!("DataLoader: {} panicked: {payload}", what())).into())
    })
}

impl Job {
    /// The batch of `indices`, collated and pinned as configured; a panic becomes an error.
    fn make(&self, batch: usize, indices: &[usize]) -> Result<Vec<Tensor>> {
        // On a worker thread this is the worker's own range; inline it nests in `next`'s.
        let _fetch =
            ember_device::trace::range_named(ember_device::trace::Category::UserAnnotation, || {
                "DataLoader.fetch".into()
            });
        guarded(
            || format!("making batch {batch}"),
            || self.make_inner(indices),
        )
    }

    /// Runs the worker-init function of worker `id`, if any; the message of its failure.
    fn init(&self, id: usize) -> std::result::Result<(), String> {
        let Some(init) = &self.worker_init else {
            return Ok(());
        };
        guarded(|| format!("worker_init_fn of worker {id}"), || init(id)).map_err(|e| {
            format!("DataLoader: worker {id} could not start, its worker_init_fn failed: {e}")
        })
    }

    fn make_inner(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let batch = match &self.collate {
            Some(collate) => {
                let samples = indices
                    .iter()
                    .map(|&i| self.dataset.get(i))
                    .collect::<Result<Vec<_>>>()?;
                collate(samples)?
            }
            None => self.dataset.get_batch(indices)?,
        };
        if !self.pin {
            return Ok(batch);
        }
        batch
            .into_iter()
            .map(|t| {
                let raw = t.data();
                if raw.device() == Device::Cpu && !raw.is_pinned() {
                    t.pin_memory()
                } else {
                    Ok(t)
                }
            })
            .collect()
    }
}

type Task = (usize, Vec<usize>);
type Done = (usize, Result<Vec<Tensor>>);

/// The worker threads of one iterator and their queues.
struct Workers {
    /// One queue per worker; batch `i` goes to worker `i % tasks.len()`. Empty once stopped.
    tasks: Vec<Sender<Task>>,
    results: Receiver<Done>,
    ready: HashMap<usize, Result<Vec<Tensor>>>,
    /// Batches handed to the queue so far (batch `sent` is the next to hand out).
    sent: usize,
    max_in_flight: usize,
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `min(num_workers, batches)` workers (worker `w` seeded `base_seed + w`).
    fn start(
        job: Arc<Job>,
        num_workers: usize,
        batches: usize,
        base_seed: u64,
        max_in_flight: usize,
    ) -> Result<Workers> {
        let n = num_workers.min(batches);
        let (done_tx, done_rx) = channel::<Done>();
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Workers {
            tasks: Vec::with_capacity(n),
            results: done_rx,
            ready: HashMap::new(),
            sent: 0,
            max_in_flight,
            stop: Arc::clone(&stop),
            handles: Vec::with_capacity(n),
        };
        for id in 0..n {
            let (task_tx, task_rx) = channel::<Task>();
            let info = WorkerInfo {
                id,
                num_workers,
                seed: base_seed.wrapping_add(id as u64),
            };
            let (job, done_tx, stop) = (Arc::clone(&job), done_tx.clone(), Arc::clone(&stop));
            let handle = std::thread::Builder::new()
                .name(format!("ember-data-worker-{id}"))
                .spawn(move || worker_loop(&job, info, &task_rx, &done_tx, &stop))
                .map_err(|e| {
                    NnError::Data(format!(
                        "DataLoader: could not start worker thread {id}: {e}"
                    ))
                })?;
            // On an error above, dropping `workers` stops and joins those already started.
            workers.tasks.push(task_tx);
            workers.handles.push(handle);
        }
        Ok(workers)
    }

    /// Stops the workers and waits for them (each finishes at most the batch it is making).
    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.tasks.clear();
        for h in self.handles.drain(..) {
            // A worker never panics (batches are made under catch_unwind); nothing to report.
            let _ = h.join();
        }
        self.ready.clear();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One worker thread: its own generator and [`WorkerInfo`], the init function, then its
/// batches in the order they come.
fn worker_loop(
    job: &Job,
    info: WorkerInfo,
    tasks: &Receiver<Task>,
    done: &Sender<Done>,
    stop: &AtomicBool,
) {
    let _generator = ThreadGenerator::with_seed(info.seed);
    WORKER.with(|w| w.set(Some(info)));
    let init = job.init(info.id);
    // Ends when the iterator is gone (its queue closed) or stops the workers.
    while let Ok((batch, indices)) = tasks.recv() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let r = match &init {
            Ok(()) => job.make(batch, &indices),
            Err(e) => Err(NnError::Data(e.clone()).into()),
        };
        if done.send((batch, r)).is_err() {
            return;
        }
    }
}

enum Mode {
    Inline(Arc<Job>),
    Workers(Workers),
}

/// One epoch of a [`DataLoader`]: yields each batch's fields, in order, as
/// `Result<Vec<Tensor>>`. Owns everything it needs (it does not borrow the loader).
/// Dropping it early stops its worker threads.
pub struct DataLoaderIter {
    batches: Vec<Vec<usize>>,
    next: usize,
    mode: Mode,
}

impl fmt::Debug for DataLoaderIter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let workers = match &self.mode {
            Mode::Inline(_) => 0,
            Mode::Workers(w) => w.handles.len(),
        };
        f.debug_struct("DataLoaderIter")
            .field("batches", &self.batches.len())
            .field("next", &self.next)
            .field("workers", &workers)
            .finish()
    }
}

impl DataLoaderIter {
    /// The sample indices of every batch of this epoch.
    pub fn batch_indices(&self) -> &[Vec<usize>] {
        &self.batches
    }

    /// Hands batches to the workers until `max_in_flight` are queued, being made or made
    /// but not yet yielded.
    fn top_up(&mut self) {
        let Mode::Workers(w) = &mut self.mode else {
            return;
        };
        let n = w.tasks.len();
        while n > 0 && w.sent < self.batches.len() && w.sent - self.next < w.max_in_flight {
            let task = (w.sent, self.batches[w.sent].clone());
            if w.tasks[w.sent % n].send(task).is_err() {
                return;
            }
            w.sent += 1;
        }
    }
}

impl Iterator for DataLoaderIter {
    type Item = Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Self::Item> {
        let i = self.next;
        let indices = self.batches.get(i)?;
        let _next =
            ember_device::trace::range_named(ember_device::trace::Category::UserAnnotation, || {
                match self.mode {
                    Mode::Inline(_) => {
                        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
                    }
                    Mode::Workers(_) => {
                        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
                    }
                }
                .into()
            });
        let item = match &mut self.mode {
            Mode::Inline(job) => job.make(i, indices),
            Mode::Workers(w) => loop {
                if let Some(r) = w.ready.remove(&i) {
                    break r;
                }
                match w.results.recv() {
                    Ok((j, r)) => {
                        w.ready.insert(j, r);
                    }
                    Err(_) => {
                        break Err(NnError::Data(format!(
                            "DataLoader: the worker threads stopped before batch {i} was made"
                        ))
                        .into());
                    }
                }
            },
        };
        self.next += 1;
        if self.next == self.batches.len() {
            if let Mode::Workers(w) = &mut self.mode {
                w.shutdown();
            }
        } else {
            self.top_up();
        }
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.batches.len() - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for DataLoaderIter {}
