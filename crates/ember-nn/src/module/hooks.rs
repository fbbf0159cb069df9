//! Forward hooks and pre-hooks (`register_forward_hook`, `register_forward_pre_hook`):
//! where a module keeps them ([`ModuleHooks`]), the handle that removes one
//! ([`HookHandle`]), and [`call`], PyTorch's `Module.__call__`.
//!
//! Note [Hooks run when a module is called]: as in PyTorch, hooks belong to calling a module
//! (`module(x)`, here [`Module::call`](super::Module::call)), not to `forward`: a container
//! calls its children through `call` (`Sequential` does), and a model's `forward` should
//! too (`self.fc1.call(&x)`) for hooks on its children to run. Each module keeps its own
//! hooks in a [`ModuleHooks`] field (every layer in `ember-nn` has one; `#[derive(Module)]`
//! finds it); a module without one refuses to register. The table sits behind an `Arc` so
//! that a [`HookHandle`] can remove its hook while holding only a weak reference, and the
//! lock is released before any hook runs, so a hook may register or remove hooks.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use super::Module;
use crate::{NnError, Result, Tensor};

/// A forward pre-hook: `hook(module, input)`, returning `Some(x)` to replace the input.
pub type ForwardPreHook = dyn Fn(&dyn Module, &Tensor) -> Result<Option<Tensor>> + Send + Sync;

/// A forward hook: `hook(module, input, output)`, returning `Some(y)` to replace the output.
pub type ForwardHook =
    dyn Fn(&dyn Module, &Tensor, &Tensor) -> Result<Option<Tensor>> + Send + Sync;

#[derive(Default)]
struct HookTable {
    next_id: u64,
    pre: Vec<(u64, Arc<ForwardPreHook>)>,
    post: Vec<(u64, Arc<ForwardHook>)>,
}

/// A module's forward hooks and pre-hooks (PyTorch's `_forward_hooks` and
/// `_forward_pre_hooks`). A field of this type in a `#[derive(Module)]` struct becomes the
/// module's [`hooks`](super::ModuleParts::hooks). Cloning copies the hooks registered so
/// far into a new table (as `copy.deepcopy` of a module keeps its hooks); handles keep
/// removing from the table they came from. See Note [Hooks run when a module is called].
#[derive(Default)]
pub struct ModuleHooks(Arc<Mutex<HookTable>>);

impl ModuleHooks {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HookTable> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of forward pre-hooks registered.
    pub fn forward_pre_hooks(&self) -> usize {
        self.lock().pre.len()
    }

    /// The number of forward hooks registered.
    pub fn forward_hooks(&self) -> usize {
        self.lock().post.len()
    }

    pub(crate) fn add_pre(&self, hook: Arc<ForwardPreHook>) -> HookHandle {
        let mut t = self.lock();
        let id = t.next_id;
        t.next_id += 1;
        t.pre.push((id, hook));
        HookHandle {
            table: Arc::downgrade(&self.0),
            id,
        }
    }

    pub(crate) fn add_post(&self, hook: Arc<ForwardHook>) -> HookHandle {
        let mut t = self.lock();
        let id = t.next_id;
        t.next_id += 1;
        t.post.push((id, hook));
        HookHandle {
            table: Arc::downgrade(&self.0),
            id,
        }
    }

    /// The hooks to run now, copied out so that none runs under the lock.
    #[allow(clippy::type_complexity)]
    fn snapshot(&self) -> Option<(Vec<Arc<ForwardPreHook>>, Vec<Arc<ForwardHook>>)> {
        let t = self.lock();
        if t.pre.is_empty() && t.post.is_empty() {
            return None;
        }
        Some((
            t.pre.iter().map(|(_, h)| h.clone()).collect(),
            t.post.iter().map(|(_, h)| h.clone()).collect(),
        ))
    }
}

impl Clone for ModuleHooks {
    fn clone(&self) -> Self {
        let t = self.lock();
        ModuleHooks(Arc::new(Mutex::new(HookTable {
            next_id: t.next_id,
            pre: t.pre.clone(),
            post: t.post.clone(),
        })))
    }
}

impl std::fmt::Debug for ModuleHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.lock();
        f.debug_struct("ModuleHooks")
            .field("forward_pre_hooks", &t.pre.len())
            .field("forward_hooks", &t.post.len())
            .finish()
    }
}

/// What `register_forward_hook` and `register_forward_pre_hook` return (PyTorch's
/// `RemovableHandle`): [`remove`](HookHandle::remove) takes the hook off its module.
/// Dropping the handle leaves the hook in place, as in PyTorch.
#[derive(Debug, Clone)]
pub struct HookHandle {
    table: Weak<Mutex<HookTable>>,
    id: u64,
}

impl HookHandle {
    /// Removes the hook; removing it again, or after its module is gone, does nothing.
    pub fn remove(&self) {
        if let Some(table) = self.table.upgrade() {
            let mut t = table.lock().unwrap_or_else(PoisonError::into_inner);
            t.pre.retain(|(id, _)| *id != self.id);
            t.post.retain(|(id, _)| *id != self.id);
        }
    }

    /// This hook's number within its module, unique among the hooks registered there.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// The module's hook storage, or the error that says it has none.
pub(crate) fn storage(m: &dyn Module) -> Result<&ModuleHooks> {
    m.hooks().ok_or_else(|| {
        NnError::invalid(
            "register_forward_hook",
            format!(
                "{} keeps no hooks: give it a `ModuleHooks` field (which #[derive(Module)] \
                 finds) or return one from `ModuleParts::hooks`",
                m.name()
            ),
        )
        .into()
    })
}

/// `Module.__call__`: pre-hooks (each may replace the input), `forward`, hooks (each may
/// replace the output), in registration order.
pub(crate) fn call(m: &dyn Module, input: &Tensor) -> Result<Tensor> {
    let Some((pre, post)) = m.hooks().and_then(ModuleHooks::snapshot) else {
        return m.forward(input);
    };
    let mut x = input.clone();
    for hook in &pre {
        if let Some(replaced) = hook(m, &x)? {
            x = replaced;
        }
    }
    let mut y = m.forward(&x)?;
    for hook in &post {
        if let Some(replaced) = hook(m, &x, &y)? {
            y = replaced;
        }
    }
    Ok(y)
}
