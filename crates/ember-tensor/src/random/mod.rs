//! Random numbers: the counter-based [`Generator`] (Philox4x32-10, See Note [Random streams]
//! in [`philox`]), one default generator per device, [`manual_seed`], and the random tensor
//! constructors ([`Tensor::rand`], [`Tensor::randn`], [`Tensor::randint`],
//! [`Tensor::bernoulli_mask`], [`Tensor::dropout_mask`]).
//!
//! ```
//! use ember_tensor::{random, Device, Tensor};
//!
//! random::manual_seed(42);
//! let a = Tensor::randn([2, 3], ())?;
//! random::manual_seed(42);
//! let b = Tensor::randn([2, 3], ())?;
//! assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
//!
//! // An explicit generator, independent of the default one.
//! let g = random::Generator::with_seed(7, Device::Cpu);
//! let state = g.get_state();
//! let x = Tensor::rand_with([4], (), &g)?;
//! g.set_state(&state);
//! assert_eq!(x.to_vec::<f32>()?, Tensor::rand_with([4], (), &g)?.to_vec::<f32>()?);
//! # Ok::<(), ember_tensor::Error>(())
//! ```

pub mod philox;

mod create;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use ember_device::Device;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TensorError};

/// PyTorch's default seed (`default_rng_seed_val`), used until a generator is seeded.
pub const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// A generator's state: the seed (the Philox key) and the next unused counter. Sixteen
/// bytes; serde-serialisable, and [`GeneratorState::to_bytes`]/[`GeneratorState::from_bytes`]
/// for checkpoints that store raw bytes (PyTorch's `get_state()` tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GeneratorState {
    /// The seed; its low and high 32 bits are the Philox key.
    pub seed: u64,
    /// The next counter a random op will use (in 128-bit Philox blocks).
    pub offset: u64,
}

impl GeneratorState {
    /// Little-endian `seed` then `offset`.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.seed.to_le_bytes());
        b[8..].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    /// The inverse of [`GeneratorState::to_bytes`]; an error unless `bytes` has 16 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<GeneratorState> {
        let (Some(s), Some(o)) = (bytes.first_chunk::<8>(), bytes.get(8..16)) else {
            return Err(bad_state(bytes.len()));
        };
        let mut off = [0u8; 8];
        off.copy_from_slice(o);
        if bytes.len() != 16 {
            return Err(bad_state(bytes.len()));
        }
        Ok(GeneratorState {
            seed: u64::from_le_bytes(*s),
            offset: u64::from_le_bytes(off),
        })
    }
}

fn bad_state(len: usize) -> TensorError {
    TensorError::invalid(
        "set_state",
        format!("expected a generator state of 16 bytes, but got {len}"),
    )
}

#[derive(Debug)]
struct Inner {
    initial_seed: u64,
    state: GeneratorState,
}

/// A counter-based Philox4x32-10 generator for one device; state = seed + offset. Thread
/// safe: random ops reserve their counters under a mutex, then generate without it, so
/// concurrent ops get disjoint counters. Cloning gives an independent copy of the state.
///
/// ```
/// use ember_tensor::{random::Generator, Device};
/// let g = Generator::with_seed(1, Device::Cpu);
/// assert_eq!((g.initial_seed(), g.get_state().offset), (1, 0));
/// let s = g.seed(); // a fresh non-deterministic seed
/// assert_eq!(g.initial_seed(), s);
/// ```
#[derive(Debug)]
pub struct Generator {
    device: Device,
    inner: Mutex<Inner>,
}

impl Clone for Generator {
    fn clone(&self) -> Self {
        let g = self.lock();
        Generator {
            device: self.device,
            inner: Mutex::new(Inner {
                initial_seed: g.initial_seed,
                state: g.state,
            }),
        }
    }
}

impl Generator {
    /// A generator for `device` seeded with [`DEFAULT_SEED`].
    pub fn new(device: impl Into<Device>) -> Generator {
        Generator::with_seed(DEFAULT_SEED, device)
    }

    /// A generator for `device` seeded with `seed`.
    pub fn with_seed(seed: u64, device: impl Into<Device>) -> Generator {
        Generator {
            device: device.into(),
            inner: Mutex::new(Inner {
                initial_seed: seed,
                state: GeneratorState { seed, offset: 0 },
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state is two integers, always consistent: recover from a poisoned lock.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device whose tensors this generator fills.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Seeds the generator: `seed` becomes the key, the offset restarts at 0.
    pub fn manual_seed(&self, seed: u64) -> &Generator {
        let mut g = self.lock();
        g.initial_seed = seed;
        g.state = GeneratorState { seed, offset: 0 };
        self
    }

    /// Seeds the generator with a fresh non-deterministic seed and returns it (PyTorch's
    /// `Generator.seed()`).
    pub fn seed(&self) -> u64 {
        let s = fresh_seed();
        self.manual_seed(s);
        s
    }

    /// The seed last set (PyTorch's `initial_seed()`).
    pub fn initial_seed(&self) -> u64 {
        self.lock().initial_seed
    }

    /// The current state, to restore with [`Generator::set_state`].
    pub fn get_state(&self) -> GeneratorState {
        self.lock().state
    }

    /// Restores a state from [`Generator::get_state`]: the following random ops replay the
    /// numbers generated after it was taken.
    pub fn set_state(&self, state: &GeneratorState) {
        let mut g = self.lock();
        g.initial_seed = state.seed;
        g.state = *state;
    }

    /// Reserves `counters` consecutive Philox counters for one op: returns the key and the
    /// first counter, and advances the offset past them (Note [Random streams]).
    pub fn reserve(&self, counters: u64) -> ([u32; 2], u64) {
        let mut g = self.lock();
        let base = g.state.offset;
        g.state.offset = base.wrapping_add(counters);
        (philox::key_of(g.state.seed), base)
    }
}

/// A seed from the OS-seeded hasher keys, the clock and a process-wide counter.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish()
}

struct Defaults {
    /// The seed a default generator created from now on starts with.
    seed: u64,
    generators: BTreeMap<Device, Arc<Generator>>,
}

fn defaults() -> MutexGuard<'static, Defaults> {
    static D: OnceLock<Mutex<Defaults>> = OnceLock::new();
    D.get_or_init(|| {
        Mutex::new(Defaults {
            seed: DEFAULT_SEED,
            generators: BTreeMap::new(),
        })
    })
    .lock()
    .unwrap_or_else(PoisonError::into_inner)
}

/// The default generator of `device` (created on first use), which the random constructors
/// use when not given one. CUDA devices have theirs too, so seeding covers them before the
/// CUDA backend exists.
///
/// On a thread inside [`ThreadGenerator`]'s scope, the CPU's default generator is that
/// thread's own.
pub fn default_generator(device: impl Into<Device>) -> Arc<Generator> {
    let device = device.into();
    if device == Device::Cpu
        && let Some(g) = thread_cpu_generator()
    {
        return g;
    }
    let mut d = defaults();
    let seed = d.seed;
    d.generators
        .entry(device)
        .or_insert_with(|| Arc::new(Generator::with_seed(seed, device)))
        .clone()
}

/// Seeds the default generator of every device, including ones not used yet, like
/// `torch.manual_seed`.
///
/// ```
/// use ember_tensor::{random, Device};
/// random::manual_seed(3);
/// assert_eq!(random::default_generator(Device::Cuda(5)).initial_seed(), 3);
/// ```
///
/// On a thread inside [`ThreadGenerator`]'s scope it seeds only that thread's CPU
/// generator, as `torch.manual_seed` in a `DataLoader` worker process seeds only that
/// process.
pub fn manual_seed(seed: u64) {
    if let Some(g) = thread_cpu_generator() {
        g.manual_seed(seed);
        return;
    }
    let mut d = defaults();
    d.seed = seed;
    for g in d.generators.values() {
        g.manual_seed(seed);
    }
}

/// Seeds every device's default generator with one fresh non-deterministic seed and
/// returns it, like `torch.seed()`.
pub fn seed() -> u64 {
    let s = fresh_seed();
    manual_seed(s);
    s
}

/// The initial seed of the CPU's default generator (this thread's, inside a
/// [`ThreadGenerator`] scope), like `torch.initial_seed()`.
pub fn initial_seed() -> u64 {
    default_generator(Device::Cpu).initial_seed()
}

/// The state of the CPU's default generator, like `torch.get_rng_state()`.
pub fn get_rng_state() -> GeneratorState {
    default_generator(Device::Cpu).get_state()
}

/// Restores the CPU's default generator, like `torch.set_rng_state()`.
pub fn set_rng_state(state: &GeneratorState) {
    default_generator(Device::Cpu).set_state(state);
}

thread_local! {
    /// This thread's CPU default generator, while a [`ThreadGenerator`] is alive.
    static THREAD_CPU: RefCell<Option<Arc<Generator>>> = const { RefCell::new(None) };
}

fn thread_cpu_generator() -> Option<Arc<Generator>> {
    THREAD_CPU.with(|t| t.borrow().clone())
}

/// While alive, the calling thread has its own CPU default generator: the random
/// constructors (with no generator given), [`manual_seed`], [`seed`], [`initial_seed`],
/// [`get_rng_state`] and [`set_rng_state`] on this thread use it, and other threads and the
/// process-wide generators are untouched. Dropping it restores what the thread used before
/// (scopes nest). This is how `DataLoader` workers, threads here rather than PyTorch's
/// processes, each get a generator of their own. Not `Send`: it belongs to its thread.
///
/// ```
/// use ember_tensor::{random, Tensor};
/// random::manual_seed(1);
/// let before = random::get_rng_state();
/// std::thread::spawn(|| {
///     let _own = random::ThreadGenerator::with_seed(9);
///     assert_eq!(random::initial_seed(), 9);
///     Tensor::rand([4], ()).map(|_| ())
/// })
/// .join()
/// .expect("no panic")?;
/// assert_eq!(random::get_rng_state(), before); // the process-wide generator did not move
/// # Ok::<(), ember_tensor::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "the thread uses the generator only while the guard lives"]
pub struct ThreadGenerator {
    generator: Arc<Generator>,
    previous: Option<Arc<Generator>>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ThreadGenerator {
    /// Gives this thread a CPU generator seeded with `seed`, its default until the guard
    /// drops.
    pub fn with_seed(seed: u64) -> ThreadGenerator {
        let generator = Arc::new(Generator::with_seed(seed, Device::Cpu));
        let previous = THREAD_CPU.with(|t| t.borrow_mut().replace(Arc::clone(&generator)));
        ThreadGenerator {
            generator,
            previous,
            _not_send: std::marker::PhantomData,
        }
    }

    /// The generator this guard installed.
    pub fn generator(&self) -> &Arc<Generator> {
        &self.generator
    }
}

impl Drop for ThreadGenerator {
    fn drop(&mut self) {
        let previous = self.previous.take();
        THREAD_CPU.with(|t| *t.borrow_mut() = previous);
    }
}
