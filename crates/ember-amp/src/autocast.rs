//! `autocast`: per-thread mixed-precision regions (`torch.autocast`), as a scoped guard
//! ([`autocast`], [`autocast_with`]) and as a closure form ([`with_autocast`],
//! [`with_autocast_opts`]).
//!
//! ```
//! use ember_amp::autocast::{autocast, get_autocast_dtype, is_autocast_enabled};
//! use ember_autograd::Tensor;
//! use ember_tensor::{DType, Device};
//! let w = Tensor::ones([3, 3], ())?.requires_grad_(true)?; // f32 master weight
//! let x = Tensor::ones([2, 3], ())?;
//! let y = {
//!     let _g = autocast(Device::Cpu, DType::Bf16)?;
//!     assert!(is_autocast_enabled(Device::Cpu));
//!     assert!(!is_autocast_enabled(Device::Cuda(0)), "a CPU region leaves CUDA ops alone");
//!     x.matmul(&w)?                                     // runs in bf16
//! };
//! assert_eq!(y.dtype(), DType::Bf16);
//! assert_eq!(get_autocast_dtype(Device::Cpu), DType::Bf16);
//! y.to_dtype(DType::F32)?.sum_all()?.backward()?;
//! assert_eq!(w.grad().map(|g| g.dtype()), Some(DType::F32)); // the leaf's own dtype
//! # Ok::<(), ember_autograd::Error>(())
//! ```
//!
//! Note [Autocast regions]: the state is per thread and per device *type* (cpu, cuda; the
//! index of a `Device::Cuda(i)` is ignored, as `torch.autocast("cuda")`): whether autocast is
//! enabled and its dtype for each type, whether casts are cached, and how deeply regions
//! nest. Entering a region saves the state of its device type, sets the new one, and
//! installs in `ember-autograd` a snapshot of the whole state as the thread's
//! [`AutocastPolicy`] (or no policy when no type is enabled, so ops pay one thread-local
//! read); leaving restores both. An op asks the snapshot for the dtype of its inputs' device
//! type and the op's row of the table (`policy.rs`, Note [Autocast policy]).
//!
//! Note [Autocast cache]: as PyTorch's `cached_cast`, the lower-precision copy of an f32 leaf
//! that requires grad (a weight, not a view) is made once per region and reused by every op
//! in it, while the region has `cache_enabled` and grad mode is on (a copy made under
//! `no_grad` carries no tape, and reusing it later would cut the weight off). The copy is a
//! recorded `to_dtype`, so every use sends its gradient back through the one cast to the
//! leaf in f32. A cached copy is remade when the leaf was written in place since (its
//! version moved). The cache is dropped when the outermost region of the thread ends, and
//! [`autocast_cache_len`] makes it observable. Casts are cached only inside a region of the
//! thread: a policy reinstalled outside every region (a checkpointed block recomputed during
//! a backward that runs after the region ended, Note [Checkpoint] in `ember-autograd`)
//! casts afresh, since no region end would drop what it cached.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use ember_autograd::mode::{self, AutocastPolicy};
use ember_autograd::{Error, Result, Tensor, is_grad_enabled};
use ember_tensor::{DType, Device, OpInfo};

use crate::policy::compute_dtype;

/// The dtypes an autocast region may take on `device`'s type (both types take f16 and bf16,
/// as PyTorch).
pub fn supported_dtypes(device_type: Device) -> &'static [DType] {
    match device_type {
        Device::Cpu | Device::Cuda(_) => &[DType::F16, DType::Bf16],
    }
}

/// The dtype a region takes when none is given and none was set before: f16 on CUDA, bf16
/// on the CPU (PyTorch's defaults).
pub fn default_autocast_dtype(device_type: Device) -> DType {
    if device_type.is_cuda() {
        DType::F16
    } else {
        DType::Bf16
    }
}

/// One device type's autocast state.
#[derive(Clone, Copy, Debug)]
struct TypeState {
    enabled: bool,
    dtype: DType,
}

/// The thread's autocast state (Note [Autocast regions]).
#[derive(Clone, Copy, Debug)]
struct State {
    cpu: TypeState,
    cuda: TypeState,
    cache_enabled: bool,
    depth: usize,
}

impl State {
    fn of(&mut self, device_type: Device) -> &mut TypeState {
        if device_type.is_cuda() {
            &mut self.cuda
        } else {
            &mut self.cpu
        }
    }
}

/// One cached cast: the leaf, its version when cast, and its copy in `dtype`.
struct Cached {
    leaf: Tensor,
    version: u64,
    copy: Tensor,
}

thread_local! {
    static STATE: Cell<State> = const {
        Cell::new(State {
            cpu: TypeState { enabled: false, dtype: DType::Bf16 },
            cuda: TypeState { enabled: false, dtype: DType::F16 },
            cache_enabled: true,
            depth: 0,
        })
    };
    static CACHE: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

fn state() -> State {
    STATE.with(Cell::get)
}

/// `true` inside an enabled autocast region for `device_type`'s type on this thread
/// (`torch.is_autocast_enabled(device_type)`).
pub fn is_autocast_enabled(device_type: Device) -> bool {
    state().of(device_type).enabled
}

/// The lower-precision dtype of `device_type`'s autocast on this thread: the innermost
/// region's, or the default ([`default_autocast_dtype`]) outside every region
/// (`torch.get_autocast_dtype(device_type)`).
pub fn get_autocast_dtype(device_type: Device) -> DType {
    state().of(device_type).dtype
}

/// `true` unless the innermost region on this thread switched the cast cache off
/// (`torch.is_autocast_cache_enabled()`).
pub fn is_autocast_cache_enabled() -> bool {
    state().cache_enabled
}

/// How many casts of weights this thread's autocast cache holds (Note [Autocast cache]).
pub fn autocast_cache_len() -> usize {
    CACHE.with(|c| c.borrow().len())
}

/// Drops this thread's cached casts now (`torch.clear_autocast_cache()`); leaving the
/// outermost region does it too.
pub fn clear_autocast_cache() {
    // Take the entries out first: dropping tensors must not run under the borrow.
    let old = CACHE.with(|c| std::mem::take(&mut *c.borrow_mut()));
    drop(old);
}

/// The options of an autocast region (`torch.autocast(device_type, dtype, enabled,
/// cache_enabled)`).
///
/// ```
/// use ember_amp::autocast::{AutocastOptions, autocast_with, is_autocast_enabled};
/// use ember_tensor::{DType, Device};
/// let _outer = autocast_with(AutocastOptions::new(Device::Cuda(0)))?; // f16
/// {
///     let _inner = autocast_with(AutocastOptions::new(Device::Cuda(0)).enabled(false))?;
///     assert!(!is_autocast_enabled(Device::Cuda(0))); // full precision again
/// }
/// assert!(is_autocast_enabled(Device::Cuda(0)));
/// # Ok::<(), ember_autograd::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutocastOptions {
    /// The device type the region applies to (`Device::Cuda(i)` stands for every CUDA
    /// device).
    pub device_type: Device,
    /// The lower-precision dtype; `None` keeps the current one for the type
    /// ([`get_autocast_dtype`]: f16 on CUDA, bf16 on the CPU unless an enclosing region set
    /// another).
    pub dtype: Option<DType>,
    /// `false` makes a region of full precision (inside an enabled one, it turns autocast
    /// off for the type until it ends).
    pub enabled: bool,
    /// Whether casts of weights are cached for the region (Note [Autocast cache]).
    pub cache_enabled: bool,
}

impl From<Device> for AutocastOptions {
    /// `torch.autocast(device_type)`: [`AutocastOptions::new`].
    fn from(device_type: Device) -> Self {
        AutocastOptions::new(device_type)
    }
}

impl AutocastOptions {
    /// An enabled region on `device_type`'s type with the default dtype and the cache on.
    pub fn new(device_type: impl Into<Device>) -> Self {
        AutocastOptions {
            device_type: device_type.into(),
            dtype: None,
            enabled: true,
            cache_enabled: true,
        }
    }

    /// Sets the lower-precision dtype.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Sets whether the region is enabled.
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Sets whether casts are cached.
    pub fn cache_enabled(mut self, cache_enabled: bool) -> Self {
        self.cache_enabled = cache_enabled;
        self
    }
}

/// An autocast region: the thread's state as it was is restored when the guard drops, and
/// the cast cache is dropped when the outermost region ends. Made by [`autocast`] and
/// [`autocast_with`]; regions nest and must drop in reverse order of making, on the thread
/// that made them.
#[must_use = "the region lasts only while the guard lives: `let _g = autocast(..)?;`"]
pub struct AutocastGuard {
    device_type: Device,
    prev: TypeState,
    prev_cache: bool,
    // Dropped after `drop` below has restored the state: reinstalls the previous policy.
    _policy: mode::AutocastGuard,
}

impl std::fmt::Debug for AutocastGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AutocastGuard")
            .field("device_type", &self.device_type.type_name())
            .finish_non_exhaustive()
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        let mut s = state();
        *s.of(self.device_type) = self.prev;
        s.cache_enabled = self.prev_cache;
        s.depth = s.depth.saturating_sub(1);
        STATE.with(|c| c.set(s));
        if s.depth == 0 {
            clear_autocast_cache();
        }
    }
}

/// Enters an autocast region on `device_type`'s type computing the products in `dtype`
/// (f16 or bf16) until the guard drops: `with torch.autocast(device_type, dtype):`.
///
/// # Errors
///
/// An [`ErrorKind::InvalidArgument`](ember_autograd::ErrorKind::InvalidArgument) error naming
/// the allowed dtypes when `dtype` is not one of them ([`supported_dtypes`]).
pub fn autocast(device_type: impl Into<Device>, dtype: DType) -> Result<AutocastGuard> {
    autocast_with(AutocastOptions::new(device_type).dtype(dtype))
}

/// Enters an autocast region with all of PyTorch's options ([`AutocastOptions`]), or with
/// the device type's default dtype when given a device: `autocast_with(device)` is
/// `with torch.autocast(device.type):` (f16 on CUDA, bf16 on the CPU).
///
/// # Errors
///
/// As [`autocast`]: an unsupported dtype is an error, and the thread's state is unchanged.
pub fn autocast_with(opts: impl Into<AutocastOptions>) -> Result<AutocastGuard> {
    let opts = opts.into();
    let device_type = opts.device_type;
    let mut s = state();
    let dtype = match opts.dtype {
        Some(dt) => check_dtype(device_type, dt)?,
        None => s.of(device_type).dtype,
    };
    let prev = *s.of(device_type);
    let prev_cache = s.cache_enabled;
    *s.of(device_type) = TypeState {
        enabled: opts.enabled,
        dtype,
    };
    s.cache_enabled = opts.cache_enabled;
    s.depth += 1;
    STATE.with(|c| c.set(s));
    let on = |t: TypeState| t.enabled.then_some(t.dtype);
    let policy: Option<Arc<dyn AutocastPolicy>> = if s.cpu.enabled || s.cuda.enabled {
        Some(Arc::new(Policy {
            cpu: on(s.cpu),
            cuda: on(s.cuda),
            cache_enabled: s.cache_enabled,
        }))
    } else {
        None
    };
    Ok(AutocastGuard {
        device_type,
        prev,
        prev_cache,
        _policy: mode::set_autocast_policy(policy),
    })
}

/// Runs `f` in an autocast region on `device_type`'s type in `dtype` (the closure form of
/// [`autocast`]).
///
/// ```
/// use ember_amp::autocast::with_autocast;
/// use ember_autograd::Tensor;
/// use ember_tensor::{DType, Device};
/// let a = Tensor::ones([2, 2], ())?;
/// let y = with_autocast(Device::Cpu, DType::F16, || a.matmul(&a))??;
/// assert_eq!(y.dtype(), DType::F16);
/// # Ok::<(), ember_autograd::Error>(())
/// ```
///
/// # Errors
///
/// As [`autocast`]; `f` is not run then.
pub fn with_autocast<R>(
    device_type: impl Into<Device>,
    dtype: DType,
    f: impl FnOnce() -> R,
) -> Result<R> {
    with_autocast_opts(AutocastOptions::new(device_type).dtype(dtype), f)
}

/// Runs `f` in an autocast region with `opts` (the closure form of [`autocast_with`]).
///
/// # Errors
///
/// As [`autocast_with`]; `f` is not run then.
pub fn with_autocast_opts<R>(opts: impl Into<AutocastOptions>, f: impl FnOnce() -> R) -> Result<R> {
    let _g = autocast_with(opts)?;
    Ok(f())
}

fn check_dtype(device_type: Device, dtype: DType) -> Result<DType> {
    let allowed = supported_dtypes(device_type);
    if allowed.contains(&dtype) {
        return Ok(dtype);
    }
    let names: Vec<String> = allowed.iter().map(|d| d.to_string()).collect();
    Err(Error::invalid(
        "autocast",
        format!(
            "in autocast for the {} device type, the supported dtypes are {}; found {dtype} (pass one of them, or leave the dtype out for the default {})",
            device_type.type_name(),
            names.join(" and "),
            default_autocast_dtype(device_type),
        ),
    ))
}

/// The snapshot of the thread's state installed in `ember-autograd` while any device type
/// is enabled (Note [Autocast regions]).
#[derive(Debug)]
struct Policy {
    cpu: Option<DType>,
    cuda: Option<DType>,
    cache_enabled: bool,
}

impl Policy {
    fn lower(&self, device: Device) -> Option<DType> {
        if device.is_cuda() {
            self.cuda
        } else {
            self.cpu
        }
    }
}

impl AutocastPolicy for Policy {
    fn compute_dtype(
        &self,
        op: &'static OpInfo,
        device: Device,
        inputs: &[DType],
    ) -> Option<DType> {
        compute_dtype(op.autocast?, self.lower(device)?, inputs)
    }

    fn cast(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        let cacheable = self.cache_enabled
            && self.lower(t.device()) == Some(dtype)
            && t.dtype() == DType::F32
            && t.requires_grad()
            && t.is_leaf()
            && !t.is_view()
            && is_grad_enabled()
            && state().depth > 0;
        if !cacheable {
            return t.to_dtype(dtype);
        }
        let version = t.version();
        let found = CACHE.with(|c| {
            let c = c.borrow();
            let i = c
                .iter()
                .position(|e| e.leaf.same(t) && e.copy.dtype() == dtype)?;
            Some((i, (c[i].version == version).then(|| c[i].copy.clone())))
        });
        if let Some((_, Some(copy))) = found {
            return Ok(copy);
        }
        // A miss, or a stale copy (the leaf was written in place): cast, then store it in
        // the stale entry's place (the cast touches no cache, so the index still holds).
        let copy = t.to_dtype(dtype)?;
        let entry = Cached {
            leaf: t.clone(),
            version,
            copy: copy.clone(),
        };
        let old = CACHE.with(|c| {
            let mut c = c.borrow_mut();
            match found.and_then(|(i, _)| c.get_mut(i)) {
                Some(slot) => Some(std::mem::replace(slot, entry)),
                None => {
                    c.push(entry);
                    None
                }
            }
        });
        // Dropped outside the borrow: dropping tensors must not run under it.
        drop(old);
        Ok(copy)
    }
}
