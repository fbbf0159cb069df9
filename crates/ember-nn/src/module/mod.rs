//! `torch.nn.Module` as two traits: [`ModuleParts`] (what a module is made of; derived with
//! `#[derive(Module)]`) and [`Module`] (`forward`, written by the user, and every walk over
//! the tree: parameters, buffers, children, device moves, train/eval, `state_dict`, `apply`,
//! forward hooks).
//!
//! Note [Modules move in place]: a parameter is an autograd [`Tensor`], an `Arc` shared by
//! the module, the optimizer that was built from `model.parameters()`, and any hook. `to`
//! swaps each parameter's data (`param.data = param.data.to(device)` in PyTorch) instead of
//! making new tensors, so everything holding the parameter sees it move: building the
//! optimizer before or after `model.to(device)` are the same. Gradients move with their
//! parameters. So a module's `Clone` (where it has one) shares its tensors; a copy with
//! tensors of its own is a replica ([`Replicate`], Note [Replicas of a module] in
//! `replicate.rs`).

mod fields;
mod hooks;
mod replicate;
mod state_dict;
mod value;
mod walk;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ember_device::Device;
use ember_tensor::DType;

use crate::{Error, NnError, Result, Tensor};

pub use fields::{ChildModules, TensorField};
pub use hooks::{ForwardHook, ForwardPreHook, HookHandle, ModuleHooks};
pub(crate) use replicate::replicate_arc;
pub use replicate::{ClonePlainField, DynReplicate, ReplicaMemo, Replicate};
pub use state_dict::{StateDict, StateItem};
pub use value::{FromValue, Value};

/// A module behind a reference or a box prints as PyTorch's `print(model)`
/// ([`Module::describe`]); `#[derive(Module)]` writes the same `Display` for each module
/// type.
impl std::fmt::Display for dyn Module + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// What [`Module::load_state_dict_opts`] did not match, when not strict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IncompatibleKeys {
    /// Keys the module has that the dict lacks.
    pub missing_keys: Vec<String>,
    /// Keys the dict has that the module lacks.
    pub unexpected_keys: Vec<String>,
}

/// What a module is made of: what `nn.Module.__setattr__` records in PyTorch. Written by
/// `#[derive(Module)]` from the struct's fields (see the `ember-derive` crate docs), or by
/// hand for a container that names its children itself (`Sequential`).
///
/// Everything here is about this module alone; the walks over the whole tree are
/// [`Module`]'s provided methods.
pub trait ModuleParts {
    /// The module's type name, as PyTorch prints it (`Linear`).
    fn name(&self) -> &'static str;

    /// This module as a `&dyn Module` (`self`; the derive writes it). The provided methods
    /// that hand the module to a hook or list it in `named_modules()` use it, so they work on
    /// trait objects too. A wrapper (`Box<M>`, `Arc<M>`) returns the module it holds.
    fn as_module(&self) -> &dyn Module;

    /// This module's own parameters (not its children's), by local name, in registration
    /// order. Clones of the parameters themselves (same tensors).
    fn local_parameters(&self) -> Vec<(&'static str, Tensor)> {
        Vec::new()
    }

    /// This module's own buffers (running statistics and such), by local name.
    fn local_buffers(&self) -> Vec<(&'static str, Tensor)> {
        Vec::new()
    }

    /// The direct children, by name (`"0"`, `"1"` in a `Sequential`, the field's name in a
    /// derived module), in registration order.
    fn named_children(&self) -> Vec<(String, &dyn Module)> {
        Vec::new()
    }

    /// This module's own training flag (`self.training`), if it keeps one. A module without
    /// one reports its children's mode (see [`Module::is_training`]).
    fn training_flag(&self) -> Option<&TrainingFlag> {
        None
    }

    /// Where this module keeps its forward hooks, if it can have any. Without storage,
    /// [`Module::register_forward_hook`] returns an error.
    fn hooks(&self) -> Option<&ModuleHooks> {
        None
    }

    /// A replica of this module, boxed: [`Replicate::replicate_with`] for a module reached
    /// as `&dyn Module` or held in a `Box<dyn Module>` (`Sequential`'s layers). The derive
    /// writes it from the struct's `Replicate` impl; a wrapper (`Box<M>`, `Arc<M>`)
    /// replicates the module it holds. The default, for a hand-written module that has no
    /// replica, is an error naming it. See Note [Replicas of a module].
    fn replicate_boxed_with(&self, memo: &mut ReplicaMemo) -> Result<Box<dyn Module>> {
        let _ = memo;
        Err(NnError::invalid(
            "replicate",
            format!(
                "`{}` has no replica: implement `Replicate` for it and \
                 `ModuleParts::replicate_boxed_with` (#[derive(Module)] writes both)",
                self.name()
            ),
        )
        .into())
    }
}

/// A layer or a model: `torch.nn.Module`.
///
/// A module implements [`forward`](Module::forward) (and optionally
/// [`extra_repr`](Module::extra_repr)); what it owns comes from [`ModuleParts`], usually
/// derived. Everything else is provided and walks the tree in PyTorch's order:
/// `named_parameters` with dotted names, `named_modules`, `to(device)`, `train`/`eval`,
/// `zero_grad`, `requires_grad_`, `apply`, `state_dict`, forward hooks, and
/// [`call`](Module::call), which is PyTorch's `module(x)`: pre-hooks, `forward`, hooks.
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
///
/// Every method works on trait objects (`&dyn Module`, `Box<dyn Module>`) except `to`,
/// generic over its target so that `model.to(device)` and `model.to(&device)` both work;
/// `to_target(&device)` is the same move for a `&dyn Module`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `Module`",
    note = "a `#[derive(Module)]` struct also needs `impl Module for {Self} {{ fn forward(..) }}`"
)]
pub trait Module: ModuleParts + Send + Sync + std::fmt::Debug + std::any::Any {
    /// The forward pass. Call a module through [`call`](Module::call) so that its hooks run
    /// (as `module(x)` in PyTorch); `forward` alone skips them, as in PyTorch.
    fn forward(&self, input: &Tensor) -> Result<Tensor>;

    /// Constructor arguments worth printing (`in_features=4, out_features=8, bias=True`).
    fn extra_repr(&self) -> String {
        String::new()
    }

    // ---- provided: calling ----

    /// PyTorch's `module(input)`: the forward pre-hooks (each may replace the input), then
    /// [`forward`](Module::forward), then the forward hooks (each may replace the output).
    fn call(&self, input: &Tensor) -> Result<Tensor> {
        hooks::call(self.as_module(), input)
    }

    /// `register_forward_pre_hook(hook)`: `hook(module, input)` runs before every
    /// [`call`](Module::call); returning `Some(x)` replaces the input. Hooks run in the
    /// order registered; the handle removes this one. An error when the module has no
    /// [`ModuleHooks`] storage.
    ///
    /// The hook comes boxed (`Box::new(|m, x| ..)`) so that modules reached as
    /// `&dyn Module` (from `named_modules()`) take hooks too.
    fn register_forward_pre_hook(&self, hook: Box<ForwardPreHook>) -> Result<HookHandle> {
        Ok(hooks::storage(self.as_module())?.add_pre(Arc::from(hook)))
    }

    /// `register_forward_hook(hook)`: `hook(module, input, output)` runs after every
    /// [`call`](Module::call)'s `forward` (with the input the pre-hooks left); returning
    /// `Some(y)` replaces the output. Hooks run in the order registered; the handle removes
    /// this one. An error when the module has no [`ModuleHooks`] storage.
    ///
    /// ```
    /// use ember_nn::{Module, Tensor, layers::Linear};
    /// # fn main() -> ember_nn::Result<()> {
    /// let fc = Linear::new(3, 2, ())?;
    /// let handle = fc.register_forward_hook(Box::new(|_m, _x, y| Ok(Some(y.relu()?))))?;
    /// let x = Tensor::randn([4, 3], ())?;
    /// assert!(fc.call(&x)?.to_vec::<f32>()?.iter().all(|v| *v >= 0.0));
    /// handle.remove();
    /// # Ok(()) }
    /// ```
    fn register_forward_hook(&self, hook: Box<ForwardHook>) -> Result<HookHandle> {
        Ok(hooks::storage(self.as_module())?.add_post(Arc::from(hook)))
    }

    // ---- provided: walks over the tree ----

    /// Every parameter with its dotted name (`0.weight`), as `named_parameters()` in
    /// PyTorch: modules in [`named_modules`](Module::named_modules) order, each module's
    /// own parameters in registration order. A parameter shared by two modules is listed
    /// once, under its first name.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        walk::named_members(self.local_parameters(), self.named_children(), |m| {
            m.local_parameters()
        })
    }

    /// Every parameter, as [`named_parameters`](Module::named_parameters) orders them.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// Every buffer with its dotted name (`1.running_mean`), in the same order; a shared
    /// buffer is listed once.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        walk::named_members(self.local_buffers(), self.named_children(), |m| {
            m.local_buffers()
        })
    }

    /// Every buffer.
    fn buffers(&self) -> Vec<Tensor> {
        self.named_buffers().into_iter().map(|(_, b)| b).collect()
    }

    /// Total number of parameter elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Tensor::numel).sum()
    }

    /// The direct children (`children()`), a child held twice listed once.
    fn children(&self) -> Vec<&dyn Module> {
        let mut out: Vec<&dyn Module> = Vec::new();
        for (_, c) in self.named_children() {
            if !out.iter().any(|o| walk::same_module(*o, c)) {
                out.push(c);
            }
        }
        out
    }

    /// `named_modules()`: this module first (named `""`), then every descendant depth first
    /// with its dotted name (`encoder.layers.0`); a module reachable twice is listed once.
    fn named_modules(&self) -> Vec<(String, &dyn Module)> {
        walk::named_modules(self.as_module())
    }

    /// `modules()`: the modules of [`named_modules`](Module::named_modules), without names.
    fn modules(&self) -> Vec<&dyn Module> {
        self.named_modules().into_iter().map(|(_, m)| m).collect()
    }

    /// `apply(fn)`: calls `f` on every child's subtree (each child's `apply`), then on this
    /// module, as PyTorch orders it (children before parents).
    ///
    /// ```
    /// use ember_nn::{Module, layers::{Linear, ReLU, Sequential}};
    /// # fn main() -> ember_nn::Result<()> {
    /// let model = Sequential::new().add(Linear::new(2, 2, ())?).add(ReLU::new());
    /// let mut names = Vec::new();
    /// model.apply(&mut |m| names.push(m.name()));
    /// assert_eq!(names, ["Linear", "ReLU", "Sequential"]);
    /// # Ok(()) }
    /// ```
    fn apply(&self, f: &mut dyn FnMut(&dyn Module)) {
        walk::apply(self.as_module(), f);
    }

    /// `requires_grad_(on)`: sets `requires_grad` on every parameter (freezing a part of a
    /// model with `false`).
    fn requires_grad_(&self, requires_grad: bool) -> Result<()> {
        for p in self.parameters() {
            p.requires_grad_(requires_grad)?;
        }
        Ok(())
    }

    /// Moves (or casts) every parameter and buffer in place, as `module.to(...)` does:
    /// a [`Device`] (by value or by reference) moves all of them; a [`DType`] casts the
    /// floating-point ones only; `(Device, DType)` does both. Gradients move with their
    /// parameters. See Note [Modules move in place].
    ///
    /// Generic over the target, so it is provided for sized modules, which include
    /// `Box<dyn Module>` and `Arc<dyn Module>`; a bare `&dyn Module` moves through
    /// [`to_target`](Module::to_target).
    fn to<T: ModuleTarget>(&self, target: T) -> Result<()>
    where
        Self: Sized,
    {
        self.to_target(&target)
    }

    /// [`to`](Module::to) for any module, trait objects included: `m.to_target(&device)`.
    fn to_target(&self, target: &dyn ModuleTarget) -> Result<()> {
        walk::move_to(self.as_module(), target)
    }

    /// Sets training mode on this module and every descendant (`train()`; `train(false)` is
    /// `eval()`).
    fn train(&self, on: bool) {
        walk::set_training(self, on);
    }

    /// Evaluation mode: dropout off, batch norm uses its running statistics.
    fn eval(&self) {
        self.train(false);
    }

    /// Whether the module is in training mode (`self.training`; the default for a new
    /// module). A module without its own [`TrainingFlag`] reports its children's: training
    /// if any child is, or if it has no children.
    fn is_training(&self) -> bool {
        match self.training_flag() {
            Some(flag) => flag.get(),
            None => {
                let children = self.named_children();
                children.is_empty() || children.iter().any(|(_, c)| c.is_training())
            }
        }
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

    /// Parameters and buffers by dotted name, detached (they share storage with the module),
    /// in PyTorch's order: each module's parameters, then its buffers, then its children's,
    /// depth first. As in PyTorch, a tensor shared by two modules appears under both names.
    /// A `Result`, as every `state_dict()` in Ember (optimizers', schedulers', the
    /// `GradScaler`'s), though a module's cannot fail: one type to nest into a checkpoint
    /// ([`StateDict::with`]).
    fn state_dict(&self) -> Result<StateDict> {
        Ok(walk::state_entries(
            self.local_parameters(),
            self.local_buffers(),
            self.named_children(),
        )
        .into_iter()
        .map(|(n, t)| (n, t.detach()))
        .collect())
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
        let own = walk::state_entries(
            self.local_parameters(),
            self.local_buffers(),
            self.named_children(),
        );
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
        for name in state.keys().chain(state.plain().map(|(k, _)| k)) {
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

    /// A replica of this module (`copy.deepcopy(model)`): the same structure, names and
    /// plain data around new tensors holding copies of the values, as a `Box<dyn Module>`
    /// so that it works on trait objects; the typed form is [`Replicate::replicate`]. See
    /// Note [Replicas of a module].
    fn replicate_boxed(&self) -> Result<Box<dyn Module>> {
        self.replicate_boxed_with(&mut ReplicaMemo::new())
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

/// Where [`Module::to`] moves a module: a [`Device`] (or `&Device`), a [`DType`]
/// (floating-point tensors only, as PyTorch), or both as `(Device, DType)`.
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

impl ModuleTarget for (&Device, DType) {
    fn resolve(&self, device: Device, dtype: DType) -> (Device, DType) {
        (*self.0, self.1).resolve(device, dtype)
    }
}

impl<T: ModuleTarget + ?Sized> ModuleTarget for &T {
    fn resolve(&self, device: Device, dtype: DType) -> (Device, DType) {
        (**self).resolve(device, dtype)
    }
}

/// A module's own training flag (`self.training` in PyTorch). A field of this type in a
/// `#[derive(Module)]` struct becomes the module's [`training_flag`](ModuleParts::training_flag).
#[derive(Debug)]
pub struct TrainingFlag(AtomicBool);

impl Default for TrainingFlag {
    fn default() -> Self {
        TrainingFlag(AtomicBool::new(true))
    }
}

impl Clone for TrainingFlag {
    fn clone(&self) -> Self {
        TrainingFlag(AtomicBool::new(self.get()))
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
    data.requires_grad_(true)
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
            param: walk::join(child, &param),
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
/// memory on and the module runs normally (gradients still reach its parameters). The
/// module is called through [`Module::call`], so its hooks run (on both passes).
pub fn checkpoint(module: Arc<dyn Module>, input: &Tensor) -> Result<Tensor> {
    let f = move |xs: &[Tensor]| module.call(&xs[0]);
    ember_autograd::checkpoint(f, std::slice::from_ref(input))
}
