//! The [`Module`] trait: `torch.nn.Module`'s parameters, buffers, children, device moves,
//! train/eval and `state_dict`.
//!
//! Note [Modules move in place]: a parameter is an autograd [`Tensor`], an `Arc` shared by
//! the module, the optimizer that was built from `model.parameters()`, and any hook. `to`
//! swaps each parameter's data (`param.data = param.data.to(device)` in PyTorch) instead of
//! making new tensors, so everything holding the parameter sees it move: building the
//! optimizer before or after `model.to(device)` are the same. Gradients move with their
//! parameters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ember_device::Device;
use ember_tensor::DType;

use crate::{Error, NnError, Result, Tensor};

/// Named tensors, as `state_dict()` returns them: parameters and buffers of a module by their
/// dotted names (`0.weight`), or an optimizer's state. Saveable with safetensors as is.
pub type StateDict = BTreeMap<String, Tensor>;

/// What [`Module::load_state_dict_opts`] did not match, when not strict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IncompatibleKeys {
    /// Keys the module has that the dict lacks.
    pub missing_keys: Vec<String>,
    /// Keys the dict has that the module lacks.
    pub unexpected_keys: Vec<String>,
}

/// A layer or a model: `torch.nn.Module`.
///
/// A module implements [`forward`](Module::forward) and says what it owns: its own parameters
/// ([`local_parameters`](Module::local_parameters)), buffers and children. Everything else —
/// `named_parameters` with dotted names, `to(device)`, `train`/`eval`, `zero_grad`,
/// `state_dict` — is provided and walks the tree.
///
/// ```
/// use ember_nn::{Module, layers::{Linear, ReLU, Sequential}};
/// # fn main() -> ember_nn::Result<()> {
/// let model = Sequential::new()
///     .add(Linear::new(4, 8, ())?)
///     .add(ReLU::new())
///     .add(Linear::new(8, 2, ())?);
/// let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
/// # Ok(()) }
/// ```
pub trait Module: Send + Sync + std::fmt::Debug {
    /// The forward pass.
    fn forward(&self, input: &Tensor) -> Result<Tensor>;

    /// The module's type name, as PyTorch prints it (`Linear`).
    fn name(&self) -> &'static str;

    /// Constructor arguments worth printing (`in_features=4, out_features=8, bias=True`).
    fn extra_repr(&self) -> String {
        String::new()
    }

    /// This module's own parameters (not its children's), by local name, in registration
    /// order. Clones of the parameters themselves (same tensors).
    fn local_parameters(&self) -> Vec<(&'static str, Tensor)> {
        Vec::new()
    }

    /// This module's own buffers (running statistics and such), by local name.
    fn local_buffers(&self) -> Vec<(&'static str, Tensor)> {
        Vec::new()
    }

    /// The direct children, by name (`"0"`, `"1"` in a `Sequential`).
    fn named_children(&self) -> Vec<(String, &dyn Module)> {
        Vec::new()
    }

    /// Sets this module's own training flag (not its children's; see [`train`](Module::train)).
    fn set_training(&self, _training: bool) {}

    /// Whether the module is in training mode (the default for a new module).
    fn is_training(&self) -> bool {
        true
    }

    // ---- provided: walks over the tree ----

    /// Every parameter with its dotted name (`0.weight`), depth first, children after the
    /// module's own, as `named_parameters()` in PyTorch. A parameter shared by two modules
    /// is listed once.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        collect_parameters(self, "", &mut out);
        out
    }

    /// Every parameter, as [`named_parameters`](Module::named_parameters) orders them.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// Every buffer with its dotted name (`1.running_mean`).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        collect_buffers(self, "", &mut out);
        out
    }

    /// Every buffer.
    fn buffers(&self) -> Vec<Tensor> {
        self.named_buffers().into_iter().map(|(_, b)| b).collect()
    }

    /// Total number of parameter elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Tensor::numel).sum()
    }

    /// Moves (or casts) every parameter and buffer in place, as `module.to(...)` does:
    /// a device moves all of them; a dtype casts the floating-point ones only. Gradients
    /// move with their parameters. See Note [Modules move in place].
    fn to(&self, target: &dyn ModuleTarget) -> Result<()> {
        let _guard = ember_autograd::no_grad();
        for t in self.parameters().into_iter().chain(self.buffers()) {
            let data = t.data();
            let (device, dtype) = target.resolve(data.device(), data.dtype());
            if device == data.device() && dtype == data.dtype() {
                continue;
            }
            let grad = t.grad();
            t.set_grad(None)?;
            t.set_data(data.to((device, dtype))?);
            if let Some(g) = grad {
                let g = g.data().to((device, dtype))?;
                t.set_grad(Some(&Tensor::wrap(g)))?;
            }
        }
        Ok(())
    }

    /// Sets training mode on this module and every descendant (`train()`; `train(false)` is
    /// `eval()`).
    fn train(&self, on: bool) {
        set_training_all(self, on);
    }

    /// Evaluation mode: dropout off, batch norm uses its running statistics.
    fn eval(&self) {
        self.train(false);
    }

    /// Clears the gradients of every parameter: to none (`set_to_none`, PyTorch's default)
    /// or to zeros in place.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        for p in self.parameters() {
            if set_to_none {
                p.set_grad(None)?;
            } else if let Some(g) = p.grad() {
                let _guard = ember_autograd::no_grad();
                g.detach().zero_()?;
            }
        }
        Ok(())
    }

    /// Parameters and buffers by dotted name, detached (they share storage with the module).
    fn state_dict(&self) -> StateDict {
        self.named_parameters()
            .into_iter()
            .chain(self.named_buffers())
            .map(|(n, t)| (n, t.detach()))
            .collect()
    }

    /// Copies `state` into the parameters and buffers (strict: every key must match and
    /// every shape agree, and an error lists all that do not, as PyTorch's does). Values are
    /// converted to each parameter's device and dtype.
    fn load_state_dict(&self, state: &StateDict) -> Result<()> {
        self.load_state_dict_opts(state, true).map(|_| ())
    }

    /// [`load_state_dict`](Module::load_state_dict); with `strict = false`, missing and
    /// unexpected keys are returned instead of refused (shape mismatches are still errors).
    fn load_state_dict_opts(&self, state: &StateDict, strict: bool) -> Result<IncompatibleKeys> {
        let own: Vec<(String, Tensor)> = self
            .named_parameters()
            .into_iter()
            .chain(self.named_buffers())
            .collect();
        let mut keys = IncompatibleKeys::default();
        let mut mismatched = Vec::new();
        for (name, t) in &own {
            match state.get(name) {
                None => keys.missing_keys.push(name.clone()),
                Some(v) if v.shape() != t.shape() => {
                    mismatched.push((name.clone(), v.shape(), t.shape()));
                }
                Some(_) => {}
            }
        }
        for name in state.keys() {
            if !own.iter().any(|(n, _)| n == name) {
                keys.unexpected_keys.push(name.clone());
            }
        }
        let refused = !mismatched.is_empty()
            || (strict && !(keys.missing_keys.is_empty() && keys.unexpected_keys.is_empty()));
        if refused {
            let (missing, unexpected) = if strict {
                (keys.missing_keys, keys.unexpected_keys)
            } else {
                (Vec::new(), Vec::new())
            };
            return Err(NnError::StateDict {
                module: self.name().to_string(),
                missing,
                unexpected,
                mismatched,
            }
            .into());
        }
        let _guard = ember_autograd::no_grad();
        for (name, t) in &own {
            if let Some(v) = state.get(name) {
                t.data().copy_(&v.data())?;
            }
        }
        Ok(keys)
    }

    /// The module tree as PyTorch prints a model:
    /// `Sequential(\n  (0): Linear(in_features=4, out_features=8, bias=True)\n  ...)`.
    fn describe(&self) -> String {
        let children = self.named_children();
        let extra = self.extra_repr();
        if children.is_empty() {
            return format!("{}({extra})", self.name());
        }
        let mut s = format!("{}(", self.name());
        if !extra.is_empty() {
            s += &format!("\n  {extra}");
        }
        for (n, c) in children {
            let inner = c.describe().replace('\n', "\n  ");
            s += &format!("\n  ({n}): {inner}");
        }
        s + "\n)"
    }
}

/// Where [`Module::to`] moves a module: a [`Device`], a [`DType`] (floating-point tensors
/// only, as PyTorch), or both as `(device, dtype)`.
pub trait ModuleTarget {
    /// The device and dtype for a tensor now on `device` with `dtype`.
    fn resolve(&self, device: Device, dtype: DType) -> (Device, DType);
}

impl ModuleTarget for Device {
    fn resolve(&self, _: Device, dtype: DType) -> (Device, DType) {
        (*self, dtype)
    }
}

impl ModuleTarget for DType {
    fn resolve(&self, device: Device, dtype: DType) -> (Device, DType) {
        (device, if dtype.is_float() { *self } else { dtype })
    }
}

impl ModuleTarget for (Device, DType) {
    fn resolve(&self, device: Device, dtype: DType) -> (Device, DType) {
        let (_, dt) = self.1.resolve(device, dtype);
        (self.0, dt)
    }
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Appends the parameters of `m` and its descendants, depth first, parents first; a
/// parameter already listed (shared between modules) is skipped.
fn collect_parameters<M: Module + ?Sized>(m: &M, prefix: &str, out: &mut Vec<(String, Tensor)>) {
    for (n, p) in m.local_parameters() {
        if !out.iter().any(|(_, q)| q.same(&p)) {
            out.push((join(prefix, n), p));
        }
    }
    for (name, c) in m.named_children() {
        collect_parameters(c, &join(prefix, &name), out);
    }
}

/// Appends the buffers of `m` and its descendants, in the same order.
fn collect_buffers<M: Module + ?Sized>(m: &M, prefix: &str, out: &mut Vec<(String, Tensor)>) {
    for (n, b) in m.local_buffers() {
        out.push((join(prefix, n), b));
    }
    for (name, c) in m.named_children() {
        collect_buffers(c, &join(prefix, &name), out);
    }
}

/// Sets the training flag of `m` and its descendants.
fn set_training_all<M: Module + ?Sized>(m: &M, on: bool) {
    m.set_training(on);
    for (_, c) in m.named_children() {
        set_training_all(c, on);
    }
}

/// A training flag for a module's own state (`self.training` in PyTorch).
#[derive(Debug)]
pub struct TrainingFlag(AtomicBool);

impl Default for TrainingFlag {
    fn default() -> Self {
        TrainingFlag(AtomicBool::new(true))
    }
}

impl TrainingFlag {
    /// Sets the flag.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    /// Reads the flag.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Makes a parameter: a leaf that requires grad, holding `data`.
pub fn parameter(data: ember_tensor::Tensor) -> Result<Tensor> {
    Tensor::wrap(data).requires_grad_(true)
}

/// The same-device check a layer makes before using its parameter `param` (named `name`)
/// on `input`: PyTorch's message, naming the parameter.
pub fn check_device(
    module: &'static str,
    name: &str,
    param: &Tensor,
    input: &Tensor,
) -> Result<()> {
    let (pd, id) = (param.device(), input.device());
    if pd == id {
        return Ok(());
    }
    Err(NnError::DeviceMismatch {
        module,
        param: name.to_string(),
        param_device: pd,
        input_device: id,
    }
    .into())
}

/// Adds a child's name in front of the parameter named by a device-mismatch error, so
/// the error coming out of a model names `0.weight`.
pub fn prefix_error(child: &str, e: Error) -> Error {
    if !matches!(
        e.downcast_ref::<NnError>(),
        Some(NnError::DeviceMismatch { .. })
    ) {
        return e;
    }
    match e.downcast::<NnError>() {
        Ok(NnError::DeviceMismatch {
            module,
            param,
            param_device,
            input_device,
        }) => NnError::DeviceMismatch {
            module,
            param: join(child, &param),
            param_device,
            input_device,
        }
        .into(),
        Ok(other) => other.into(),
        Err(e) => e,
    }
}

/// `torch.utils.checkpoint.checkpoint(module, input)`: runs `module` on `input` without
/// keeping its activations, and runs it again during backward to rebuild them (same random
/// state, so dropout masks match). The module's parameters get the same gradients as
/// without checkpointing. When `input` does not require grad there is nothing to save
/// memory on and the module runs normally (gradients still reach its parameters).
pub fn checkpoint(module: Arc<dyn Module>, input: &Tensor) -> Result<Tensor> {
    let f = move |xs: &[Tensor]| module.forward(&xs[0]);
    ember_autograd::checkpoint(f, std::slice::from_ref(input))
}
