//! The walks over a module tree behind [`Module`]'s provided methods, over `&dyn Module`
//! so that the trait's methods and the inherent ones of `dyn Module` share them. Orders
//! and duplicate rules are PyTorch's (`torch/nn/modules/module.py`): `named_modules` is
//! pre-order and lists a module reachable twice once; `_named_members` (parameters,
//! buffers) follows `named_modules` and lists a shared tensor once; `state_dict` and
//! `load_state_dict` recurse over `_modules` without removing duplicates; `apply` and
//! `train` recurse over `children()`.

use super::{Module, ModuleTarget};
use crate::{Result, Tensor};

/// `prefix.name`; `name` at the root, `prefix` for the module itself (`name` empty).
pub(crate) fn join(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}.{name}"),
    }
}

/// Whether `a` and `b` are the same module (the same object, as Python's `is`): the same
/// address, size and name. The address alone would not do: a struct and its first field
/// (or an array and its first element) can share one. Zero-sized modules (a unit struct)
/// have no identity of their own and are never the same.
pub(crate) fn same_module(a: &dyn Module, b: &dyn Module) -> bool {
    let size = std::mem::size_of_val(a);
    size != 0
        && std::ptr::addr_eq(a as *const dyn Module, b as *const dyn Module)
        && size == std::mem::size_of_val(b)
        && a.name() == b.name()
}

/// `named_modules()`: `m` as `""`, then its descendants depth first, each once.
pub(crate) fn named_modules(m: &dyn Module) -> Vec<(String, &dyn Module)> {
    fn visit<'a>(m: &'a dyn Module, prefix: String, out: &mut Vec<(String, &'a dyn Module)>) {
        let m = m.as_module();
        if out.iter().any(|(_, seen)| same_module(*seen, m)) {
            return;
        }
        let children = m.named_children();
        out.push((prefix.clone(), m));
        for (name, c) in children {
            visit(c, join(&prefix, &name), out);
        }
    }
    let mut out = Vec::new();
    visit(m, String::new(), &mut out);
    out
}

/// PyTorch's `_named_members` for a module whose own tensors are `root` and children
/// `children`: `local(module)` for every module of `named_modules`, with dotted names, each
/// tensor once.
pub(crate) fn named_members(
    root: Vec<(&'static str, Tensor)>,
    children: Vec<(String, &dyn Module)>,
    local: impl Fn(&dyn Module) -> Vec<(&'static str, Tensor)>,
) -> Vec<(String, Tensor)> {
    let mut out: Vec<(String, Tensor)> = Vec::new();
    let mut add = |prefix: &str, tensors: Vec<(&'static str, Tensor)>| {
        for (n, t) in tensors {
            if !out.iter().any(|(_, seen)| seen.same(&t)) {
                out.push((join(prefix, n), t));
            }
        }
    };
    add("", root);
    let mut seen: Vec<&dyn Module> = Vec::new();
    for (name, c) in children {
        for (sub, m) in named_modules(c) {
            if seen.iter().any(|s| same_module(*s, m)) {
                continue;
            }
            seen.push(m);
            add(&join(&name, &sub), local(m));
        }
    }
    out
}

/// The keys and tensors of `state_dict()` for a module whose own parameters, buffers and
/// children are given: each module's parameters, then its buffers, then its children's
/// entries, with no duplicate removed.
pub(crate) fn state_entries(
    params: Vec<(&'static str, Tensor)>,
    buffers: Vec<(&'static str, Tensor)>,
    children: Vec<(String, &dyn Module)>,
) -> Vec<(String, Tensor)> {
    fn visit(m: &dyn Module, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        for (n, t) in m.local_parameters().into_iter().chain(m.local_buffers()) {
            out.push((join(prefix, n), t));
        }
        for (name, c) in m.named_children() {
            visit(c, &join(prefix, &name), out);
        }
    }
    let mut out: Vec<(String, Tensor)> = params
        .into_iter()
        .chain(buffers)
        .map(|(n, t)| (n.to_string(), t))
        .collect();
    for (name, c) in children {
        visit(c, &name, &mut out);
    }
    out
}

/// `apply(fn)`: each child's subtree, then `m`.
pub(crate) fn apply(m: &dyn Module, f: &mut dyn FnMut(&dyn Module)) {
    for c in m.children() {
        apply(c, f);
    }
    f(m);
}

/// `train(on)`: `m`'s flag, then each child's subtree.
pub(crate) fn set_training<M: Module + ?Sized>(m: &M, on: bool) {
    if let Some(flag) = m.training_flag() {
        flag.set(on);
    }
    for c in m.children() {
        set_training(c, on);
    }
}

/// `to(target)`: every parameter and buffer (each once), its data swapped in place.
pub(crate) fn move_to(m: &dyn Module, target: &dyn ModuleTarget) -> Result<()> {
    let _guard = ember_autograd::no_grad();
    // All or nothing, as PyTorch users expect of `model.to(...)`: every tensor (and its
    // gradient) is copied to the target first; only when all copies exist are they swapped
    // in, so a failure (a device that does not exist, out of memory) leaves the module as
    // it was, gradients included.
    let mut moved = Vec::new();
    for t in m.parameters().into_iter().chain(m.buffers()) {
        let data = t.data();
        let (device, dtype) = target.resolve(data.device(), data.dtype());
        if device == data.device() && dtype == data.dtype() {
            continue;
        }
        let new = data.to((device, dtype))?;
        let grad = t.grad().map(|g| g.data().to((device, dtype))).transpose()?;
        moved.push((t, new, grad));
    }
    for (t, new, grad) in moved {
        t.set_grad(None)?;
        t.set_data(&new);
        if let Some(g) = grad {
            t.set_grad(Some(&g))?;
        }
    }
    Ok(())
}
