//! The tape: [`Node`]s (one per recorded op), the edges between them, and saved tensors.
//!
//! Note [Graph ownership]: a non-leaf tensor owns its `grad_fn` node; a node owns the nodes
//! of its inputs (and, for leaves that require grad, the leaf itself, as PyTorch's
//! `AccumulateGrad` does). Saved tensors are raw `ember_tensor::Tensor`s, never autograd
//! tensors, so no cycle can form and dropping the last output frees the whole graph. A
//! 10 000-node chain is dropped by a loop (see `Drop for Node`), not by recursion.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::{DType, Device, RawTensor as Raw, Shape};

use crate::autograd::error::{AutogradError, Result};
use crate::tensor::{Impl, Tensor};

/// A backward function: the gradient of the node's output in, one gradient per input out
/// (`None` where an input needs none).
pub(crate) type BackwardFn = Box<dyn FnMut(&Raw) -> Result<Vec<Option<Raw>>> + Send>;

/// A tensor hook: sees the gradient, may return a replacement.
pub(crate) type Hook = Arc<dyn Fn(&Tensor) -> Option<Tensor> + Send + Sync>;

/// Where an input's gradient goes.
#[derive(Clone)]
pub(crate) enum Next {
    /// Into another node's input buffer.
    Node(Arc<Node>),
    /// Into a leaf's `.grad`.
    Leaf(Arc<Impl>),
}

impl Next {
    /// A key identifying the target within one backward run.
    pub(crate) fn key(&self) -> usize {
        match self {
            Next::Node(n) => Arc::as_ptr(n) as *const () as usize,
            Next::Leaf(l) => Arc::as_ptr(l) as *const () as usize,
        }
    }
}

/// What a gradient for an input must look like.
pub(crate) struct InputMeta {
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

impl InputMeta {
    pub(crate) fn of(t: &Raw) -> InputMeta {
        InputMeta {
            shape: t.shape().clone(),
            dtype: t.dtype(),
            device: t.device(),
        }
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// One recorded op.
pub(crate) struct Node {
    pub(crate) name: &'static str,
    /// Creation order: the engine runs later nodes first among those ready.
    pub(crate) seq: u64,
    pub(crate) next: Vec<Option<Next>>,
    pub(crate) inputs: Vec<InputMeta>,
    pub(crate) backward: Mutex<Option<BackwardFn>>,
    /// Hooks registered on the output tensor (`register_hook` on a non-leaf).
    pub(crate) hooks: Mutex<Vec<(u64, Hook)>>,
    /// The output tensor, when `retain_grad()` asked for its `.grad`.
    pub(crate) retained: Mutex<Option<Weak<Impl>>>,
    /// The backward saved tensors ([`Saved`]): a backward without `retain_graph` frees them,
    /// and a second one is an error. A node that saved none runs again (Note [Backward
    /// engine]).
    pub(crate) frees: bool,
}

thread_local! {
    /// Tensors saved since the last node was made (see `Node::frees`).
    static SAVED_SINCE_NODE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{}>", self.name)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Node {
    pub(crate) fn new(
        name: &'static str,
        next: Vec<Option<Next>>,
        inputs: Vec<InputMeta>,
        backward: BackwardFn,
    ) -> Node {
        Node {
            name,
            seq: SEQ.fetch_add(1, Ordering::Relaxed),
            next,
            inputs,
            backward: Mutex::new(Some(backward)),
            hooks: Mutex::new(Vec::new()),
            retained: Mutex::new(None),
            frees: SAVED_SINCE_NODE.with(|c| c.replace(0)) > 0,
        }
    }

    /// The node's name as PyTorch prints `grad_fn` (`MulBackward0`).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Release the chain below by a loop: each node we hold the last reference to is
        // unwrapped and its edges moved onto the stack before it drops, so no drop recurses.
        let mut stack: Vec<Arc<Node>> = take_nodes(&mut self.next);
        while let Some(n) = stack.pop() {
            if let Ok(mut inner) = Arc::try_unwrap(n) {
                stack.extend(take_nodes(&mut inner.next));
            }
        }
    }
}

fn take_nodes(next: &mut Vec<Option<Next>>) -> Vec<Arc<Node>> {
    std::mem::take(next)
        .into_iter()
        .filter_map(|n| match n {
            Some(Next::Node(n)) => Some(n),
            _ => None,
        })
        .collect()
}

/// A tensor saved for backward, with the version it had: reading it back after an in-place
/// write is the error PyTorch reports.
pub(crate) struct Saved {
    t: Raw,
    version: u64,
    node: &'static str,
}

impl Saved {
    pub(crate) fn new(node: &'static str, t: &Raw) -> Saved {
        SAVED_SINCE_NODE.with(|c| c.set(c.get() + 1));
        Saved {
            t: t.clone(),
            version: t.version(),
            node,
        }
    }

    /// Saves an autograd tensor's data, refusing inference tensors.
    pub(crate) fn of(node: &'static str, t: &Tensor) -> Result<Saved> {
        if t.is_inference() {
            return Err(AutogradError::InferenceTensor { node }.into());
        }
        Ok(Saved::new(node, &t.raw()))
    }

    pub(crate) fn get(&self) -> Result<Raw> {
        let found = self.t.version();
        if found != self.version {
            return Err(AutogradError::ModifiedInplace {
                node: self.node,
                dtype: self.t.dtype(),
                shape: self.t.shape().clone(),
                expected: self.version,
                found,
            }
            .into());
        }
        Ok(self.t.clone())
    }
}

/// `true` if an op over `inputs` must be recorded: grad mode is on and one input requires
/// grad.
pub(crate) fn needs_grad(inputs: &[&Tensor]) -> bool {
    crate::autograd::mode::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// Wraps `out` as the output of a new node over `inputs` (whose gradients `backward`
/// returns, in order).
pub(crate) fn record(
    name: &'static str,
    out: Raw,
    inputs: &[&Tensor],
    backward: BackwardFn,
) -> Tensor {
    let next = inputs.iter().map(|t| t.edge()).collect();
    let metas = inputs.iter().map(|t| InputMeta::of(&t.raw())).collect();
    let node = Arc::new(Node::new(name, next, metas, backward));
    Tensor::from_node(out, node)
}

/// Records `out` with `make()`'s backward if `inputs` need grad, else wraps it plainly.
/// `make` runs only when recording, so saving tensors costs nothing otherwise.
pub(crate) fn maybe_record(
    name: &'static str,
    out: Raw,
    inputs: &[&Tensor],
    make: impl FnOnce() -> Result<BackwardFn>,
) -> Result<Tensor> {
    if needs_grad(inputs) {
        Ok(record(name, out, inputs, make()?))
    } else {
        Ok(Tensor::wrap(out))
    }
}
