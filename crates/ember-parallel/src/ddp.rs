//! [`DistributedDataParallel`]: one model replica per process, gradients averaged across
//! the process group during backward, as `torch.nn.parallel.DistributedDataParallel`.
//!
//! Note [DDP buckets]:
//! The parameters (those that require grad) are taken in reverse registration order (the
//! order backward usually produces their gradients) and packed into buckets of one dtype
//! and device: the first bucket holds up to `first_bucket_cap_mb` (1 MiB, PyTorch's
//! `_DEFAULT_FIRST_BUCKET_BYTES`), so that communication starts early, the others up to
//! `bucket_cap_mb` (25 MiB). A bucket is closed once it reaches its cap, so a parameter
//! larger than the cap is a bucket of its own.
//!
//! Each parameter has a post-accumulate-grad hook. When a forward ran with gradient sync
//! (grad mode on, not inside [`no_sync`](DistributedDataParallel::no_sync)), the hook
//! marks its parameter ready; when every parameter of the next bucket in order is ready,
//! the bucket's gradients are copied into one flat tensor, divided by the world size and
//! all-reduced (sum) asynchronously on the group's communication thread, while backward
//! goes on computing the remaining gradients. Buckets are launched strictly in bucket
//! order, so every rank issues the same collectives in the same order (MPI and NCCL need
//! that) even when gradients arrive in a different order. The hook that makes the last
//! bucket ready also finalises: it waits for every bucket's all-reduce and copies the
//! averaged values back into each parameter's `.grad`, so `backward()` returns with
//! synchronised gradients, and an error of a collective (a timeout, a rank that left) ends
//! that `backward()` with the error.
//!
//! With `find_unused_parameters`, forward walks the graph from its output
//! ([`ember_autograd::reachable_leaves`]) and marks the parameters it does not reach ready
//! at once (their bucket slots are zeros). A further all-reduce of a used-parameter map then
//! tells which parameters no rank used: their `.grad` stays unset, as in PyTorch. Without
//! it, a parameter that gets no gradient leaves its bucket unfinished, and the next forward
//! fails with PyTorch's "Expected to have finished reduction in the prior iteration" error
//! naming the parameters.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use ember_autograd::{HookHandle, Tensor, no_grad, reachable_leaves};
use ember_device::ErrorKind;
use ember_nn::ModuleHooks;
use ember_nn::{Error, Module, ModuleParts, Result};
use ember_tensor::{DType, Device};

use crate::group::{ProcessGroup, ReduceOp, Work};

/// The options of a [`DistributedDataParallel`] (PyTorch's constructor arguments that
/// apply here, with its defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DdpOptions {
    /// The cap of every bucket but the first, in MiB (25).
    pub bucket_cap_mb: f64,
    /// The cap of the first bucket, in MiB (1), small so that the first all-reduce starts
    /// early in backward.
    pub first_bucket_cap_mb: f64,
    /// Walk the graph after each forward and treat parameters it does not reach as ready
    /// (off by default: the walk costs time every iteration).
    pub find_unused_parameters: bool,
    /// Broadcast the module's buffers (BatchNorm's running statistics) from rank 0 at each
    /// forward (on by default).
    pub broadcast_buffers: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_mb: 25.0,
            first_bucket_cap_mb: 1.0,
            find_unused_parameters: false,
            broadcast_buffers: true,
        }
    }
}

/// One bucket: parameter indices (into `Reducer::params`), all of one dtype and device.
#[derive(Debug)]
struct Bucket {
    params: Vec<usize>,
    numel: usize,
    dtype: DType,
    device: Device,
}

/// The state of one backward's reduction.
#[derive(Default)]
struct Pass {
    /// This backward reduces (set by a forward with sync on).
    expected: bool,
    ready: Vec<bool>,
    /// Per bucket: parameters not ready yet.
    pending: Vec<usize>,
    /// The next bucket to launch.
    next_bucket: usize,
    /// Launched buckets: the flat tensor being reduced and its work.
    launched: Vec<(Tensor, Work)>,
    /// Parameters this rank's graph reached (with `find_unused_parameters`).
    used: Option<Vec<bool>>,
}

/// What the hooks and forward share.
struct Reducer {
    /// Parameters that require grad, in registration order, with their names.
    params: Vec<(String, Tensor)>,
    buckets: Vec<Bucket>,
    /// Parameter index → bucket index.
    bucket_of: Vec<usize>,
    group: ProcessGroup,
    pass: Mutex<Pass>,
}

impl fmt::Debug for Reducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reducer")
            .field("params", &self.params.len())
            .field("buckets", &self.buckets)
            .finish()
    }
}

fn lock(m: &Mutex<Pass>) -> MutexGuard<'_, Pass> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn ddp_error(kind: ErrorKind, msg: impl Into<String>) -> Error {
    Error::new(kind, DdpError(msg.into()))
}

/// A [`DistributedDataParallel`] failure: what went wrong, naming the parameter and ranks.
#[derive(Debug)]
pub struct DdpError(pub String);

impl fmt::Display for DdpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DistributedDataParallel: {}", self.0)
    }
}

impl std::error::Error for DdpError {}

/// The bucket assignment of Note [DDP buckets]: `sizes` (bytes), keys (dtype, device) of
/// the parameters in registration order → buckets of parameter indices, in reduction order.
fn assign_buckets(params: &[(String, Tensor)], first_cap: usize, cap: usize) -> Vec<Bucket> {
    let mut done: Vec<Bucket> = Vec::new();
    // Open buckets, one per (dtype, device), in the order they were opened.
    let mut open: Vec<(Bucket, usize)> = Vec::new();
    let mut limit_of_next = first_cap;
    for (i, (_, p)) in params.iter().enumerate().rev() {
        let (dtype, device) = (p.dtype(), p.device());
        let slot = match open
            .iter()
            .position(|(b, _)| b.dtype == dtype && b.device == device)
        {
            Some(s) => s,
            None => {
                open.push((
                    Bucket {
                        params: Vec::new(),
                        numel: 0,
                        dtype,
                        device,
                    },
                    0,
                ));
                open.len() - 1
            }
        };
        let (bucket, bytes) = &mut open[slot];
        bucket.params.push(i);
        bucket.numel += p.numel();
        *bytes += p.numel() * dtype.size_in_bytes();
        if *bytes >= limit_of_next {
            let (b, _) = open.remove(slot);
            done.push(b);
            limit_of_next = cap;
        }
    }
    done.extend(open.into_iter().map(|(b, _)| b));
    done
}

impl Reducer {
    /// Marks parameter `i` ready and launches every bucket now complete, in order; the call
    /// that completes the last bucket finalises. Called by the hooks and by forward (for
    /// unused parameters).
    fn mark_ready(&self, i: usize) -> Result<()> {
        let mut pass = lock(&self.pass);
        if !pass.expected {
            return Ok(());
        }
        if pass.ready[i] {
            return Err(ddp_error(
                ErrorKind::Autograd,
                format!(
                    "expected to mark a variable ready only once, but parameter '{}' was marked ready twice in one backward (a parameter used by a reentrant backward or shared in a way DDP does not support)",
                    self.params[i].0
                ),
            ));
        }
        pass.ready[i] = true;
        let b = self.bucket_of[i];
        pass.pending[b] -= 1;
        while pass.next_bucket < self.buckets.len() && pass.pending[pass.next_bucket] == 0 {
            let b = pass.next_bucket;
            let flat = self.flatten(b)?;
            let work = self.group.all_reduce_async(&flat, ReduceOp::Sum)?;
            pass.launched.push((flat, work));
            pass.next_bucket += 1;
        }
        if pass.next_bucket == self.buckets.len() {
            let pass = std::mem::take(&mut *pass);
            return self.finalize(pass);
        }
        Ok(())
    }

    /// Bucket `b`'s gradients in one flat tensor, divided by the world size (zeros for a
    /// parameter without a gradient).
    fn flatten(&self, b: usize) -> Result<Tensor> {
        let _g = no_grad();
        let bucket = &self.buckets[b];
        let parts = bucket
            .params
            .iter()
            .map(|&i| {
                let p = &self.params[i].1;
                match p.grad() {
                    Some(g) => g.reshape([p.numel()]),
                    None => Tensor::zeros([p.numel()], (&bucket.device, bucket.dtype)),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        let flat = Tensor::cat(&refs, 0)?;
        let world = self.group.world_size() as f64;
        Ok(if world > 1.0 { flat.div(world)? } else { flat })
    }

    /// Waits for every bucket and writes the averaged gradients back.
    fn finalize(&self, pass: Pass) -> Result<()> {
        let _g = no_grad();
        let mut flats = Vec::with_capacity(pass.launched.len());
        for (flat, work) in pass.launched {
            work.wait()?;
            flats.push(flat);
        }
        // Which parameters some rank used (with find_unused_parameters).
        let globally_used = match &pass.used {
            None => None,
            Some(used) => {
                let map = Tensor::from_vec(
                    used.iter().map(|&u| i32::from(u)).collect::<Vec<_>>(),
                    [used.len()],
                    meta_device(&self.group),
                )?;
                self.group.all_reduce(&map, ReduceOp::Max)?;
                Some(map.to_vec::<i32>()?)
            }
        };
        for (bucket, flat) in self.buckets.iter().zip(&flats) {
            let mut offset = 0;
            for &i in &bucket.params {
                let p = &self.params[i].1;
                let n = p.numel();
                let reduced = flat.narrow(0, offset, n)?.reshape(p.dims())?;
                offset += n;
                if globally_used.as_ref().is_some_and(|u| u[i] == 0) {
                    continue;
                }
                match p.grad() {
                    Some(g) => {
                        g.copy_(&reduced)?;
                    }
                    None => p.set_grad(Some(&reduced.contiguous()?))?,
                }
            }
        }
        Ok(())
    }

    /// Starts a backward's reduction (a forward with sync on).
    fn prepare(&self, output: Option<&Tensor>) -> Result<()> {
        {
            let pass = lock(&self.pass);
            if pass.expected {
                let missing: Vec<&str> = pass
                    .ready
                    .iter()
                    .zip(&self.params)
                    .filter(|(r, _)| !**r)
                    .map(|(_, (n, _))| n.as_str())
                    .collect();
                return Err(ddp_error(
                    ErrorKind::Autograd,
                    format!(
                        "Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss (or that backward was not called). You can enable unused parameter detection with `find_unused_parameters: true`, and make sure all forward outputs participate in calculating the loss. Parameters that did not receive a gradient on rank {}: {}",
                        self.group.rank(),
                        missing.join(", ")
                    ),
                ));
            }
        }
        let n = self.params.len();
        let mut pass = Pass {
            expected: true,
            ready: vec![false; n],
            pending: self.buckets.iter().map(|b| b.params.len()).collect(),
            ..Pass::default()
        };
        let unused: Vec<usize> = match output {
            None => Vec::new(),
            Some(out) => {
                let reached = reachable_leaves(&[out]);
                let used: Vec<bool> = self
                    .params
                    .iter()
                    .map(|(_, p)| reached.iter().any(|l| l.same(p)))
                    .collect();
                let unused = (0..n).filter(|&i| !used[i]).collect();
                pass.used = Some(used);
                unused
            }
        };
        if n == 0 {
            return Ok(());
        }
        *lock(&self.pass) = pass;
        for i in unused {
            self.mark_ready(i)?;
        }
        Ok(())
    }
}

/// `torch.nn.parallel.DistributedDataParallel`: wraps a module so that, in a process group
/// of `world_size` ranks each training on its own shard, `backward()` leaves every rank
/// with the average of all ranks' gradients, communication overlapping backward
/// (Note [DDP buckets]).
///
/// At construction the parameters and buffers of rank 0 are broadcast to every rank (after
/// checking that every rank has the same parameters: an error names the first that
/// differs and the ranks). With one rank it is the module itself plus checks.
///
/// ```no_run
/// use ember_nn::{Module, layers::Linear};
/// use ember_parallel::{Backend, DdpOptions, DistributedDataParallel, InitMethod};
/// # fn main() -> ember_nn::Result<()> {
/// let group = ember_parallel::init_process_group(Backend::Mpi, InitMethod::Env)?;
/// let model = DistributedDataParallel::new(Linear::new(4, 2, ())?, &group, DdpOptions::default())?;
/// let x = ember_nn::Tensor::ones([8, 4], ())?;
/// model.call(&x)?.sum_all()?.backward()?; // gradients averaged over the ranks
/// # Ok(()) }
/// ```
pub struct DistributedDataParallel<M: Module> {
    module: M,
    group: ProcessGroup,
    options: DdpOptions,
    reducer: Arc<Reducer>,
    sync: std::sync::atomic::AtomicBool,
    hooks: ModuleHooks,
    handles: Vec<HookHandle>,
}

impl<M: Module> fmt::Debug for DistributedDataParallel<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedDataParallel")
            .field("module", &self.module)
            .field("rank", &self.group.rank())
            .field("world_size", &self.group.world_size())
            .field("options", &self.options)
            .field("buckets", &self.reducer.buckets.len())
            .finish()
    }
}

/// The guard of [`DistributedDataParallel::no_sync`]: while it lives, backward accumulates
/// gradients locally without communicating.
#[derive(Debug)]
pub struct NoSyncGuard<'a> {
    flag: &'a std::sync::atomic::AtomicBool,
    was: bool,
}

impl Drop for NoSyncGuard<'_> {
    fn drop(&mut self) {
        self.flag
            .store(self.was, std::sync::atomic::Ordering::Relaxed);
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` (already on this rank's device) for `group`: checks every rank has the
    /// same parameters, broadcasts rank 0's parameters and buffers, builds the buckets and
    /// registers the gradient hooks.
    pub fn new(
        module: M,
        group: &ProcessGroup,
        options: DdpOptions,
    ) -> Result<DistributedDataParallel<M>> {
        if !(options.bucket_cap_mb > 0.0 && options.first_bucket_cap_mb > 0.0) {
            return Err(Error::invalid(
                "DistributedDataParallel",
                format!(
                    "bucket_cap_mb and first_bucket_cap_mb must be positive, got {} and {}",
                    options.bucket_cap_mb, options.first_bucket_cap_mb
                ),
            ));
        }
        let params: Vec<(String, Tensor)> = module
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .collect();
        check_same_parameters(&params, group)?;
        sync_module_states(&module, group)?;
        let mib = |m: f64| (m * 1024.0 * 1024.0) as usize;
        let buckets = assign_buckets(
            &params,
            mib(options.first_bucket_cap_mb).max(1),
            mib(options.bucket_cap_mb).max(1),
        );
        let mut bucket_of = vec![0; params.len()];
        for (b, bucket) in buckets.iter().enumerate() {
            for &i in &bucket.params {
                bucket_of[i] = b;
            }
        }
        let reducer = Arc::new(Reducer {
            params,
            buckets,
            bucket_of,
            group: group.clone(),
            pass: Mutex::new(Pass::default()),
        });
        let mut handles = Vec::with_capacity(reducer.params.len());
        for (i, (_, p)) in reducer.params.iter().enumerate() {
            let weak = Arc::downgrade(&reducer);
            handles.push(
                p.register_post_accumulate_grad_hook(move |_| match weak.upgrade() {
                    Some(r) => r.mark_ready(i),
                    None => Ok(()),
                })?,
            );
        }
        Ok(DistributedDataParallel {
            module,
            group: group.clone(),
            options,
            reducer,
            sync: std::sync::atomic::AtomicBool::new(true),
            hooks: ModuleHooks::default(),
            handles,
        })
    }

    /// The wrapped module (`ddp.module` in PyTorch).
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The process group.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The buckets' parameter names, in reduction order (Note [DDP buckets]).
    pub fn bucket_parameter_names(&self) -> Vec<Vec<String>> {
        self.reducer
            .buckets
            .iter()
            .map(|b| {
                b.params
                    .iter()
                    .map(|&i| self.reducer.params[i].0.clone())
                    .collect()
            })
            .collect()
    }

    /// PyTorch's `with ddp.no_sync():`: forwards and backwards while the guard lives
    /// accumulate gradients locally; the first backward after it (of a forward outside it)
    /// all-reduces the accumulated gradients.
    pub fn no_sync(&self) -> NoSyncGuard<'_> {
        let was = self.sync.swap(false, std::sync::atomic::Ordering::Relaxed);
        NoSyncGuard {
            flag: &self.sync,
            was,
        }
    }
}

impl<M: Module> Drop for DistributedDataParallel<M> {
    fn drop(&mut self) {
        for h in self.handles.drain(..) {
            h.remove();
        }
    }
}

impl<M: Module> std::fmt::Display for DistributedDataParallel<M> {
    /// PyTorch's `print(model)` layout.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl<M: Module> ModuleParts for DistributedDataParallel<M> {
    fn name(&self) -> &'static str {
        "DistributedDataParallel"
    }

    fn as_module(&self) -> &dyn Module {
        self
    }

    fn named_children(&self) -> Vec<(String, &dyn Module)> {
        vec![("module".to_string(), self.module.as_module())]
    }

    fn hooks(&self) -> Option<&ModuleHooks> {
        Some(&self.hooks)
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    /// Broadcasts rank 0's buffers (`broadcast_buffers`), runs the module, and, when grad
    /// mode is on and not inside [`no_sync`](DistributedDataParallel::no_sync), arms the
    /// next backward's reduction.
    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        let sync = self.sync.load(std::sync::atomic::Ordering::Relaxed)
            && ember_autograd::is_grad_enabled();
        if self.options.broadcast_buffers && self.group.world_size() > 1 {
            broadcast_coalesced(
                &self
                    .module
                    .named_buffers()
                    .into_iter()
                    .map(|(_, b)| b)
                    .collect::<Vec<_>>(),
                &self.group,
            )?;
        }
        let out = self.module.call(input)?;
        if sync {
            let walk = self.options.find_unused_parameters.then_some(&out);
            self.reducer.prepare(walk)?;
        }
        Ok(out)
    }
}

/// Where DDP's own small exchanges (the parameter check, the used-parameter map) live: the
/// group's device for `nccl` (which takes CUDA tensors of its device only), else the CPU.
fn meta_device(group: &ProcessGroup) -> Device {
    group.device().unwrap_or(Device::Cpu)
}

/// Every rank has the same parameters (names, shapes, dtypes), else an error naming the
/// first parameter that differs, its shapes and the ranks.
fn check_same_parameters(params: &[(String, Tensor)], group: &ProcessGroup) -> Result<()> {
    let world = group.world_size();
    if world == 1 {
        return Ok(());
    }
    // Each parameter as (ndim, dims..., dtype) in one vector, padded to the longest.
    let mut sig: Vec<i64> = vec![params.len() as i64];
    for (_, p) in params {
        sig.push(p.dims().len() as i64);
        sig.extend(p.dims().iter().map(|&d| d as i64));
        sig.push(dtype_code(p.dtype()));
    }
    let device = meta_device(group);
    let len = Tensor::from_vec(vec![sig.len() as i64], [1], device)?;
    group.all_reduce(&len, ReduceOp::Max)?;
    let longest = len.to_vec::<i64>()?[0] as usize;
    sig.resize(longest, -1);
    let mine = Tensor::from_vec(sig.clone(), [longest], device)?;
    let all: Vec<Tensor> = (0..world)
        .map(|_| Tensor::zeros([longest], (&device, DType::I64)))
        .collect::<Result<_>>()?;
    group.all_gather(&all, &mine)?;
    let rank = group.rank();
    for (r, theirs) in all.iter().enumerate() {
        let theirs = theirs.to_vec::<i64>()?;
        if theirs == sig {
            continue;
        }
        // Walk both signatures to the first parameter that differs.
        let (mut a, mut b) = (1usize, 1usize);
        for (name, p) in params {
            let na = 2 + p.dims().len();
            let nb = theirs.get(b).map_or(0, |&n| n.max(0) as usize + 2);
            let same = sig.get(a..a + na) == theirs.get(b..b + nb);
            if !same {
                let their_dims = theirs
                    .get(b + 1..b + nb.saturating_sub(1))
                    .map(|d| format!("{d:?}"))
                    .unwrap_or_else(|| "nothing (fewer parameters)".into());
                return Err(ddp_error(
                    ErrorKind::Shape,
                    format!(
                        "parameter '{name}' differs across ranks: shape {:?} ({}) on rank {rank}, but {their_dims} (dtype code {}) on rank {r}; every rank must build the same model",
                        p.dims(),
                        p.dtype(),
                        theirs.get(b + nb.saturating_sub(1)).copied().unwrap_or(-1)
                    ),
                ));
            }
            a += na;
            b += nb;
        }
        return Err(ddp_error(
            ErrorKind::Shape,
            format!(
                "rank {rank} has {} parameters that require grad, rank {r} has {}; every rank must build the same model",
                params.len(),
                theirs.first().copied().unwrap_or(-1)
            ),
        ));
    }
    Ok(())
}

fn dtype_code(d: DType) -> i64 {
    ember_tensor::ALL_DTYPES
        .iter()
        .position(|&x| x == d)
        .map_or(-1, |p| p as i64)
}

/// Rank 0's parameters and buffers to every rank (PyTorch's `_sync_module_states`).
fn sync_module_states<M: Module>(module: &M, group: &ProcessGroup) -> Result<()> {
    if group.world_size() == 1 {
        return Ok(());
    }
    let mut tensors: Vec<Tensor> = module
        .named_parameters()
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    tensors.extend(module.named_buffers().into_iter().map(|(_, b)| b));
    broadcast_coalesced(&tensors, group)
}

/// Broadcasts `tensors` from rank 0, one collective per (dtype, device): flattened into one
/// tensor, broadcast, copied back in place.
fn broadcast_coalesced(tensors: &[Tensor], group: &ProcessGroup) -> Result<()> {
    let _g = no_grad();
    let mut keys: Vec<(DType, Device)> = Vec::new();
    for t in tensors {
        let k = (t.dtype(), t.device());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for k in keys {
        let group_of: Vec<&Tensor> = tensors
            .iter()
            .filter(|t| (t.dtype(), t.device()) == k)
            .collect();
        let flats = group_of
            .iter()
            .map(|t| t.reshape([t.numel()]))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = flats.iter().collect();
        let flat = Tensor::cat(&refs, 0)?;
        group.broadcast(&flat, 0)?;
        let mut offset = 0;
        for t in group_of {
            let n = t.numel();
            t.copy_(&flat.narrow(0, offset, n)?.reshape(t.dims())?)?;
            offset += n;
        }
    }
    Ok(())
}
