//! [`DataParallel`]: `torch.nn.DataParallel`, one process driving several CUDA devices.
//!
//! Each forward: the input is scattered along dim 0 (`torch.chunk`'s split, so a batch of 5
//! on 3 devices is 2, 2, 1 and a batch of 4 uses 2 devices), the module's parameters and
//! buffers are broadcast from `device_ids[0]` to the other devices (NCCL among CUDA devices,
//! Note [Collectives or copies] in `comm.rs`), the replicas run at once in threads of their
//! own, each with its device current and the caller's grad mode and autocast policy, and the
//! outputs are gathered on `output_device`. Gradients flow back through the gather and the scatter,
//! and every replica's parameter gradients are summed into the original module's `.grad`
//! (Note [Replicas]).
//!
//! Note [Replicas]:
//!
//! PyTorch's `replicate` makes each replica a shallow copy of the module whose parameters
//! are the outputs of `Broadcast` (non-leaf tensors in the graph), so gradients reach the
//! original parameters through autograd. Ember's modules are Rust structs whose fields hold
//! their tensors: a module can be walked (`named_parameters`, `named_buffers`), moved in
//! place (`to`), loaded (`load_state_dict`) and replicated (`Replicate`: the same structure
//! around new tensors, Note [Replicas of a module] in `ember-nn`), but its tensor fields
//! cannot be swapped for graph outputs. So:
//!
//! - A replica is the module's `replicate()` (which `#[derive(Module)]` writes and every
//!   layer has), made once per extra device on the first forward, moved to its device,
//!   checked to have the module's parameter and buffer names and shapes (a hand-written
//!   `Replicate` could differ). It copies the forward hooks the module has then, so they
//!   run on every replica, as PyTorch's replicas share the module's hooks (a hook
//!   registered after the first forward runs on device `device_ids[0]` only). Device `device_ids[0]`'s
//!   replica is the module itself (PyTorch's is a copy that shares its storage; the
//!   difference is invisible), so its buffer updates (BatchNorm's running statistics) are
//!   the ones kept, as in PyTorch.
//! - Every forward broadcasts the module's current parameters and buffers into *fresh*
//!   tensors on each device and swaps them into the replicas (`set_data`), so the replicas
//!   see the current weights, and a graph recorded by an earlier forward keeps the tensors
//!   it saved (nothing is overwritten in place).
//! - A replica's parameters are leaves. A post-accumulate-grad hook on each sends its
//!   gradient to the original parameter's device and clears the replica's; once every
//!   replica that the last forward reached has sent its part, their sum is added to the
//!   original's `.grad` (Note [Replica gradients in device order]), so after
//!   `loss.backward()` the original module holds the sum of every replica's gradient, as
//!   PyTorch's `ReduceAddCoalesced` backward gives it. The
//!   difference from PyTorch: the replicas' contributions reach `.grad` through those hooks,
//!   not through graph edges, so `autograd::grad(loss, params)` (which does not fill
//!   `.grad`) sees only device `device_ids[0]`'s part. A hook that fails (out of memory
//!   while adding) ends that backward with its error, which the next forward returns too.
//!
//! Note [Replica gradients in device order]:
//! The replicas run at once, so the autograd nodes they record interleave in creation order
//! from one run to the next, and with them the order in which backward reaches the
//! replicas' parameters. Adding each replica's gradient into `.grad` as it arrives made the
//! sum's rounding depend on thread timing: harmless for most gradients, but a conv bias
//! followed by BatchNorm has a gradient that is zero up to rounding, and Adam scales that
//! rounding noise to a full step (the 3-device Adam test drifted in about half its runs
//! while every gradient agreed within 1e-6). So each hook parks its gradient in a slot per
//! (parameter, replica), and when every replica that the last forward's graph reaches has
//! delivered ([`ember_autograd::reachable_leaves`], walked after each forward), the slots
//! are summed in device order and added once. Device `device_ids[0]`'s part is the
//! module's own and reaches `.grad` through autograd's accumulation; with `.grad` unset
//! (or zero) at the start of backward, `g0 + S` and `S + g0` are the same number, so the
//! result no longer depends on timing. A backward that delivers the gradients of only some
//! replicas (an output not used by the loss on some device) leaves a set unfinished, and the
//! next forward fails naming the parameter, as DDP's "Expected to have finished reduction".
//!
//! Alternatives considered: a graph-native replica (parameters that are `Broadcast`
//! outputs) needs a way to swap a module's tensor fields for non-leaf tensors, which
//! `ModuleParts` does not offer; running the one module on every device needs per-thread
//! parameter substitution inside autograd.

use std::sync::{Arc, Mutex, PoisonError};

use ember_autograd::mode::{current_policy, set_autocast_policy};
use ember_autograd::{HookHandle, reachable_leaves};
use ember_device::{Device, cuda};
use ember_nn::{Module, ModuleParts, NnError, Replicate, Result, Tensor};
use ember_tensor::Tensor as Raw;

use crate::comm::{Gather, Scatter, broadcast_raw, chunk_sizes};

struct Replica<M> {
    module: M,
    device: usize,
    _hooks: Vec<HookHandle>,
}

/// `torch.nn.DataParallel`: see the module docs and Note [Replicas].
///
/// ```
/// use ember_nn::{Module, Tensor, layers::Linear};
/// use ember_parallel::DataParallel;
/// # fn main() -> ember_nn::Result<()> {
/// # ember_device::cuda::use_emulator(ember_device::driver::emulator::EmulatorConfig::devices(2))?;
/// let net = Linear::new(4, 3, ())?;
/// net.to(ember_device::Device::Cuda(0))?;
/// let model = DataParallel::new(net, None, None)?;  // every CUDA device, output on cuda:0
/// let x = Tensor::randn([6, 4], ember_device::Device::Cuda(0))?;
/// let y = model.call(&x)?;                      // rows 0..3 on cuda:0, 3..6 on cuda:1
/// assert_eq!(y.dims(), [6, 3]);
/// y.sum_all()?.backward()?;                     // gradients summed into model.module()
/// # Ok(()) }
/// ```
pub struct DataParallel<M: Module> {
    module: M,
    device_ids: Vec<usize>,
    output_device: Device,
    replicas: Mutex<Vec<Replica<M>>>,
    /// An error of a gradient hook, returned by the next forward.
    hook_error: Arc<Mutex<Option<String>>>,
    /// The replicas' parked gradients (Note [Replica gradients in device order]).
    pending: Arc<Mutex<Pending>>,
}

/// The replica gradients of one backward, per parameter that requires grad (in the module's
/// order) and replica (`device_ids[1..]` order): Note [Replica gradients in device order].
#[derive(Default)]
struct Pending {
    /// The parameter's name, for errors.
    names: Vec<String>,
    /// `expected[p][r]`: the last forward's graph reaches replica `r`'s parameter `p`.
    expected: Vec<Vec<bool>>,
    /// `slots[p][r]`: the gradient replica `r` delivered for `p` (on the module's device).
    slots: Vec<Vec<Option<Raw>>>,
}

impl Pending {
    /// Parks replica `r`'s gradient of parameter `p`; once every expected replica has
    /// delivered, returns their sum in device order and empties the slots.
    fn deliver(&mut self, p: usize, r: usize, g: Raw) -> Result<Option<Raw>> {
        let (Some(slots), Some(expected)) = (self.slots.get_mut(p), self.expected.get(p)) else {
            return Err(invalid(format!(
                "a replica gradient for parameter {p} of {} (internal error)",
                self.names.len()
            )));
        };
        let Some(slot) = slots.get_mut(r) else {
            return Err(invalid(format!(
                "a gradient from replica {r} of {} (internal error)",
                slots.len()
            )));
        };
        *slot = Some(match slot.take() {
            // A second backward through the same graph before the set completed.
            Some(old) => old.add(&g)?,
            None => g,
        });
        let complete = slots.iter().zip(expected).all(|(s, &e)| s.is_some() || !e);
        if !complete {
            return Ok(None);
        }
        let mut sum: Option<Raw> = None;
        for g in slots.iter_mut().filter_map(Option::take) {
            sum = Some(match sum {
                Some(acc) => acc.add(&g)?,
                None => g,
            });
        }
        Ok(sum)
    }

    /// At the start of a forward with grad mode on: a set the last backward left unfinished
    /// is an error (and is dropped, so the next forward goes on).
    fn check_finished(&mut self) -> Result<()> {
        let unfinished = self
            .slots
            .iter()
            .position(|s| s.iter().any(Option::is_some));
        let Some(p) = unfinished else {
            return Ok(());
        };
        let missing: Vec<usize> = self.slots[p]
            .iter()
            .zip(&self.expected[p])
            .enumerate()
            .filter(|(_, (g, e))| **e && g.is_none())
            .map(|(r, _)| r + 1)
            .collect();
        for s in &mut self.slots {
            s.iter_mut().for_each(|g| *g = None);
        }
        Err(invalid(format!(
            "expected every replica to deliver a gradient for `{}` in the last backward, \
             but the replica(s) at device_ids positions {missing:?} did not (was an output \
             of one device left out of the loss?)",
            self.names.get(p).map_or("?", String::as_str)
        )))
    }
}

impl<M: Module> std::fmt::Debug for DataParallel<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("module", &self.module)
            .field("device_ids", &self.device_ids)
            .field("output_device", &self.output_device)
            .finish_non_exhaustive()
    }
}

fn invalid(msg: impl Into<String>) -> ember_nn::Error {
    NnError::invalid("DataParallel", msg).into()
}

impl<M: Module + Replicate> DataParallel<M> {
    /// `nn.DataParallel(module, device_ids, output_device)`. The replicas on the other
    /// devices are the module's [`replicate`](Replicate::replicate) (Note [Replicas]).
    /// `device_ids` defaults to every CUDA device, `output_device` to `device_ids[0]`; the
    /// module must be on `cuda:{device_ids[0]}` when it runs forward (it may be moved there
    /// after wrapping, as `DataParallel(model).to("cuda")` in PyTorch).
    ///
    /// Errors: no CUDA device, an empty or repeated device list, an index past the devices.
    pub fn new(
        module: M,
        device_ids: Option<Vec<usize>>,
        output_device: Option<Device>,
    ) -> Result<DataParallel<M>> {
        let count = cuda::device_count();
        let device_ids = match device_ids {
            Some(ids) => ids,
            None if count > 0 => (0..count).collect(),
            None => {
                return Err(invalid(format!(
                    "no CUDA device to run on: {}",
                    cuda::unavailable_reason().unwrap_or_else(|| "CUDA is not available".into())
                )));
            }
        };
        if device_ids.is_empty() {
            return Err(invalid(
                "device_ids is empty: expected at least one CUDA device",
            ));
        }
        for (i, &d) in device_ids.iter().enumerate() {
            if d >= count {
                return Err(invalid(format!(
                    "device_ids[{i}] is cuda:{d}, but this process has {count} CUDA device(s)"
                )));
            }
            if device_ids[..i].contains(&d) {
                return Err(invalid(format!(
                    "cuda:{d} is listed twice in device_ids {device_ids:?}"
                )));
            }
        }
        let output_device = output_device.unwrap_or(Device::Cuda(device_ids[0]));
        if let Device::Cuda(o) = output_device
            && o >= count
        {
            return Err(invalid(format!(
                "output_device is cuda:{o}, but this process has {count} CUDA device(s)"
            )));
        }
        Ok(DataParallel {
            module,
            device_ids,
            output_device,
            replicas: Mutex::new(Vec::new()),
            hook_error: Arc::new(Mutex::new(None)),
            pending: Arc::new(Mutex::new(Pending::default())),
        })
    }

    /// The wrapped module (`model.module`): its parameters hold the gradients.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, unwrapped.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The CUDA devices the batch is split over.
    pub fn device_ids(&self) -> &[usize] {
        &self.device_ids
    }

    /// Where the outputs are gathered.
    pub fn output_device(&self) -> Device {
        self.output_device
    }

    fn source(&self) -> Device {
        Device::Cuda(self.device_ids[0])
    }

    /// PyTorch's check: every parameter and buffer on `device_ids[0]`.
    fn check_module_device(&self) -> Result<()> {
        let source = self.source();
        let tensors = self
            .module
            .named_parameters()
            .into_iter()
            .chain(self.module.named_buffers());
        for (name, t) in tensors {
            if t.device() != source {
                return Err(invalid(format!(
                    "module must have its parameters and buffers on device {source} \
                     (device_ids[0]) but found one of them on device: {} (`{name}`); move it \
                     with `to(\"{source}\")`",
                    t.device()
                )));
            }
        }
        Ok(())
    }

    /// The module's parameters and buffers, as (name, tensor, is a parameter).
    fn members(module: &M) -> Vec<(String, Tensor, bool)> {
        module
            .named_parameters()
            .into_iter()
            .map(|(n, t)| (n, t, true))
            .chain(
                module
                    .named_buffers()
                    .into_iter()
                    .map(|(n, t)| (n, t, false)),
            )
            .collect()
    }

    /// Makes the replicas of the devices after the first (once).
    fn ensure_replicas(&self, replicas: &mut Vec<Replica<M>>) -> Result<()> {
        if !replicas.is_empty() || self.device_ids.len() < 2 {
            return Ok(());
        }
        let originals = Self::members(&self.module);
        let trained: Vec<&(String, Tensor, bool)> = originals
            .iter()
            .filter(|(_, t, is_param)| *is_param && t.requires_grad())
            .collect();
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let others = self.device_ids.len() - 1;
            pending.names = trained.iter().map(|(n, _, _)| n.clone()).collect();
            pending.slots = vec![vec![None; others]; trained.len()];
            pending.expected = vec![vec![false; others]; trained.len()];
        }
        for (r, &device) in self.device_ids[1..].iter().enumerate() {
            let module = self.module.replicate()?;
            module.to(Device::Cuda(device))?;
            let copies = Self::members(&module);
            let shape_of = |v: &[(String, Tensor, bool)]| -> Vec<(String, Vec<usize>, bool)> {
                v.iter()
                    .map(|(n, t, p)| (n.clone(), t.dims(), *p))
                    .collect()
            };
            if shape_of(&copies) != shape_of(&originals) {
                let first = originals
                    .iter()
                    .zip(&copies)
                    .find(|(a, b)| a.0 != b.0 || a.1.dims() != b.1.dims())
                    .map(|(a, b)| {
                        format!(
                            "the module has `{}` {:?} where the replica has `{}` {:?}",
                            a.0,
                            a.1.dims(),
                            b.0,
                            b.1.dims()
                        )
                    })
                    .unwrap_or_else(|| {
                        format!(
                            "the module has {} parameters and buffers, the replica {}",
                            originals.len(),
                            copies.len()
                        )
                    });
                return Err(invalid(format!(
                    "the module's replica (its `Replicate`) has another structure: {first}"
                )));
            }
            let mut hooks = Vec::new();
            let mut p = 0;
            for ((_, orig, is_param), (_, copy, _)) in originals.iter().zip(&copies) {
                if !is_param {
                    continue;
                }
                copy.requires_grad_(orig.requires_grad())?;
                if !orig.requires_grad() {
                    continue;
                }
                let (orig, errors) = (orig.clone(), Arc::clone(&self.hook_error));
                let pending = Arc::clone(&self.pending);
                hooks.push(copy.register_post_accumulate_grad_hook(move |leaf| {
                    // The error ends this backward; it is also kept for the next forward.
                    deliver_grad(leaf, &orig, &pending, p, r).inspect_err(|e| {
                        let mut slot = errors.lock().unwrap_or_else(PoisonError::into_inner);
                        slot.get_or_insert_with(|| e.to_string());
                    })
                })?);
                p += 1;
            }
            replicas.push(Replica {
                module,
                device,
                _hooks: hooks,
            });
        }
        Ok(())
    }

    /// Records which replica parameters this forward's graph reaches (Note [Replica
    /// gradients in device order]); with grad mode off nothing is recorded.
    fn expect_gradients(&self, replicas: &[Replica<M>], outputs: &[Tensor]) -> Result<()> {
        if !ember_autograd::is_grad_enabled() {
            return Ok(());
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let mut expected = vec![vec![false; replicas.len()]; pending.names.len()];
        for (r, (replica, out)) in replicas.iter().zip(outputs.iter().skip(1)).enumerate() {
            let reached = reachable_leaves(&[out]);
            let trained = replica
                .module
                .parameters()
                .into_iter()
                .filter(Tensor::requires_grad);
            for (row, param) in expected.iter_mut().zip(trained) {
                row[r] = reached.iter().any(|l| l.same(&param));
            }
        }
        pending.expected = expected;
        Ok(())
    }

    /// Broadcasts the module's parameters and buffers into fresh tensors on the first
    /// `count` replicas' devices and swaps them in (Note [Replicas]).
    fn refresh(&self, replicas: &[Replica<M>]) -> Result<()> {
        if replicas.is_empty() {
            return Ok(());
        }
        let originals = Self::members(&self.module);
        let data: Vec<Raw> = originals.iter().map(|(_, t, _)| t.data()).collect();
        let devices: Vec<Device> = std::iter::once(self.source())
            .chain(replicas.iter().map(|r| Device::Cuda(r.device)))
            .collect();
        let copies = broadcast_raw(&data, &devices)?;
        let training = self.module.is_training();
        for (replica, fresh) in replicas.iter().zip(copies.into_iter().skip(1)) {
            for ((_, t, _), new) in Self::members(&replica.module).into_iter().zip(fresh) {
                t.set_data(&new);
            }
            replica.module.train(training);
        }
        Ok(())
    }
}

/// Parks replica `r`'s gradient of parameter `p` (moved to the original's device) and
/// clears the replica's; when the set is complete, adds the replicas' sum into the
/// original's `.grad` (Note [Replica gradients in device order]).
fn deliver_grad(
    replica: &Tensor,
    original: &Tensor,
    pending: &Mutex<Pending>,
    p: usize,
    r: usize,
) -> Result<()> {
    let Some(g) = replica.grad() else {
        return Ok(());
    };
    replica.set_grad(None)?;
    let g = g.data().to_device(original.device())?;
    let sum = pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .deliver(p, r, g)?;
    let Some(g) = sum else {
        return Ok(());
    };
    let sum = match original.grad() {
        Some(old) => old.data().add(&g)?,
        None => g,
    };
    original.set_grad(Some(&sum))
}

impl<M: Module + Replicate> std::fmt::Display for DataParallel<M> {
    /// PyTorch's `print(model)` layout.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl<M: Module + Replicate> ModuleParts for DataParallel<M> {
    fn name(&self) -> &'static str {
        "DataParallel"
    }

    fn as_module(&self) -> &dyn Module {
        self
    }

    fn named_children(&self) -> Vec<(String, &dyn Module)> {
        vec![("module".to_string(), self.module.as_module())]
    }
}

impl<M: Module + Replicate> Module for DataParallel<M> {
    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        if let Some(e) = self
            .hook_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            return Err(invalid(format!(
                "adding a replica's gradient into the module's failed in the last backward: {e}"
            )));
        }
        self.check_module_device()?;
        if ember_autograd::is_grad_enabled() {
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .check_finished()?;
        }
        let source = self.source();
        match input.device() {
            Device::Cpu => {}
            Device::Cuda(d) if self.device_ids.contains(&d) => {}
            other => {
                return Err(invalid(format!(
                    "the input is on {other}, expected the CPU or one of device_ids {:?}",
                    self.device_ids
                )));
            }
        }
        if input.rank() == 0 {
            return Err(invalid(
                "the input is a scalar: expected a batch along dim 0",
            ));
        }
        if self.device_ids.len() == 1 {
            return self.module.call(&input.to(source)?);
        }
        let batch = input.size(0)?;
        let sizes = chunk_sizes(batch, self.device_ids.len());
        if sizes.is_empty() {
            return Err(invalid("the batch (dim 0 of the input) is empty"));
        }
        let used = sizes.len();
        let devices: Vec<Device> = self.device_ids[..used]
            .iter()
            .map(|&d| Device::Cuda(d))
            .collect();
        let chunks = Scatter::apply(&devices, Some(&sizes), 0, input)?;

        let mut replicas = self.replicas.lock().unwrap_or_else(PoisonError::into_inner);
        self.ensure_replicas(&mut replicas)?;
        let active = &replicas[..used - 1];
        self.refresh(active)?;

        let grad = ember_autograd::is_grad_enabled();
        let policy = current_policy();
        let outputs: Vec<Result<Tensor>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunks
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let module: &M = if i == 0 {
                        &self.module
                    } else {
                        &active[i - 1].module
                    };
                    let device = self.device_ids[i];
                    let policy = policy.clone();
                    s.spawn(move || -> Result<Tensor> {
                        cuda::set_device(device)?;
                        let _grad = ember_autograd::set_grad_enabled(grad);
                        let _autocast = set_autocast_policy(policy);
                        module.call(x)
                    })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    h.join().unwrap_or_else(|_| {
                        Err(invalid(format!(
                            "the replica on cuda:{} panicked",
                            self.device_ids[i]
                        )))
                    })
                })
                .collect()
        });
        let outputs = outputs
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.map_err(|e| {
                    invalid(format!(
                        "the replica on cuda:{} failed: {e}",
                        self.device_ids[i]
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.expect_gradients(&replicas, &outputs)?;
        drop(replicas);
        Gather::apply(self.output_device, 0, &outputs)
    }

    fn extra_repr(&self) -> String {
        format!(
            "device_ids={:?}, output_device={}",
            self.device_ids, self.output_device
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_tensor::Tensor as Raw;

    fn raw(v: f32) -> Raw {
        Raw::from_vec(vec![v], [1], ()).unwrap()
    }

    fn pending(expected: Vec<Vec<bool>>) -> Pending {
        Pending {
            names: vec!["0.weight".into(), "0.bias".into()],
            slots: vec![vec![None; expected[0].len()]; expected.len()],
            expected,
        }
    }

    #[test]
    fn a_set_sums_in_device_order_once_complete() {
        // 1 + 1e8 - 1e8 depends on the order: device order gives (1e8 + 1) - 1e8 = 0 in f32.
        let order = [(2, -1e8f32), (0, 1e8), (1, 1.0)];
        let mut p = pending(vec![vec![true; 3], vec![true; 3]]);
        let mut out = None;
        for (r, v) in order {
            assert!(out.is_none());
            out = p.deliver(0, r, raw(v)).unwrap();
        }
        let sum = out.unwrap().to_vec::<f32>().unwrap();
        assert_eq!(sum, vec![(1e8f32 + 1.0) - 1e8]);
        assert!(p.slots[0].iter().all(Option::is_none));
        assert!(p.check_finished().is_ok());
    }

    #[test]
    fn replicas_not_reached_are_not_waited_for() {
        let mut p = pending(vec![vec![true, false], vec![true, true]]);
        let sum = p.deliver(0, 0, raw(2.0)).unwrap().unwrap();
        assert_eq!(sum.to_vec::<f32>().unwrap(), vec![2.0]);
    }

    #[test]
    fn an_unfinished_set_fails_the_next_forward_once() {
        let mut p = pending(vec![vec![true, true], vec![true, true]]);
        assert!(p.deliver(1, 0, raw(2.0)).unwrap().is_none());
        let e = p.check_finished().unwrap_err().to_string();
        assert!(e.contains("`0.bias`") && e.contains("[2]"), "{e}");
        assert!(p.check_finished().is_ok());
        assert!(p.deliver(5, 0, raw(1.0)).is_err());
        assert!(p.deliver(0, 7, raw(1.0)).is_err());
    }
}
