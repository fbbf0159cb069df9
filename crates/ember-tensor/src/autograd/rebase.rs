//! Views on the tape: what a view knows of its base, the rebase of the base's history when a
//! view is written in place (PyTorch's `CopySlices`), and the regeneration of a view's
//! history after its storage was written.
//!
//! Note [View rebase]: every view op whose output shares its input's storage attaches a
//! [`ViewInfo`] to the output: the root base (a tensor that is not itself a view) and a
//! `replay` that redoes the chain of view ops on any tensor of the base's shape. An in-place
//! op on a view that must be recorded does not give the view a node of its own; it gives the
//! *base* a `CopySlices` node over (the base's old history, the op's other inputs): its
//! backward takes the gradient of the whole base, replays the view on (a copy of) it,
//! passes that slice through the in-place op's backward, writes the op's gradient for the
//! view's old value back into the slice and returns the whole as the old base's gradient;
//! the op's gradients for its other inputs pass through. The view then gets an
//! `AsStridedBackward0` node over the base's new history (zeros of the base's shape with
//! the gradient written where the view looks). Any later write to the storage (through the
//! base, this view or another) changes the storage's version; a view whose version no
//! longer matches the one its node was made at regenerates that node from the base's
//! current history when it is next used, as PyTorch does. Views whose replay would write
//! one element twice (`expand`) are not rebased: in-place writes to them are refused.

use std::sync::Arc;

use crate::RawTensor as Raw;

use crate::autograd::error::{AutogradError, Result};
use crate::autograd::graph::{BackwardFn, InputMeta, Node, lock, record};
use crate::tensor::Tensor;

/// Redoes a chain of view ops on a tensor of the base's shape.
pub(crate) type Replay =
    Arc<dyn Fn(&Raw) -> std::result::Result<Raw, crate::TensorError> + Send + Sync>;

/// What a view knows of its base (Note [View rebase]).
pub(crate) struct ViewInfo {
    /// The root base: a tensor that is not itself a view.
    pub(crate) base: Tensor,
    /// The chain of view ops from the base, or `None` when it cannot be rebased.
    pub(crate) replay: Option<Replay>,
    /// Made with grad mode off: an in-place write to it under grad mode is refused.
    pub(crate) no_grad: bool,
    /// The storage version when the view's node was last made.
    pub(crate) version: u64,
}

impl ViewInfo {
    /// The view info of `y`, made from `parent` by a view op redone by `replay`.
    pub(crate) fn of(parent: &Tensor, y: &Raw, replay: Option<Replay>) -> ViewInfo {
        let no_grad = !crate::autograd::mode::is_grad_enabled();
        let outer = lock(&parent.0.view)
            .as_ref()
            .map(|v| (v.base.clone(), v.replay.clone(), v.no_grad));
        match outer {
            None => ViewInfo {
                base: parent.clone(),
                replay,
                no_grad,
                version: y.version(),
            },
            Some((base, first, parent_no_grad)) => ViewInfo {
                base,
                replay: match (first, replay) {
                    (Some(a), Some(b)) => Some(Arc::new(move |t: &Raw| b(&a(t)?)) as Replay),
                    _ => None,
                },
                no_grad: no_grad || parent_no_grad,
                version: y.version(),
            },
        }
    }
}

/// What an in-place op needs to know of a view it writes to.
pub(crate) struct ViewTarget {
    pub(crate) base: Tensor,
    pub(crate) rebaseable: bool,
    pub(crate) no_grad: bool,
}

impl Tensor {
    pub(crate) fn set_view(&self, info: ViewInfo) {
        *lock(&self.0.view) = Some(info);
    }

    pub(crate) fn view_target(&self) -> Option<ViewTarget> {
        lock(&self.0.view).as_ref().map(|v| ViewTarget {
            base: v.base.clone(),
            rebaseable: v.replay.is_some(),
            no_grad: v.no_grad,
        })
    }

    /// Regenerates a view's node from its base's history when the storage was written since
    /// the node was made (Note [View rebase]).
    pub(crate) fn refresh_view(&self) {
        let (base, replay) = {
            let g = lock(&self.0.view);
            let Some(v) = g.as_ref() else { return };
            let Some(r) = v.replay.clone() else { return };
            if v.no_grad || v.version == self.raw().version() {
                return;
            }
            (v.base.clone(), r)
        };
        let data = self.raw();
        let node = base
            .edge()
            .map(|edge| as_strided_node(edge, &base.raw(), replay));
        if let Some(node) = node {
            self.set_grad_fn(Some(node));
        }
        if let Some(v) = lock(&self.0.view).as_mut() {
            v.version = data.version();
        }
    }

    /// Gives `self` (just written in place) its new history: a node over `inputs`
    /// (`self` first) with backward `f`, or, for a view, the base's `CopySlices` rebase
    /// (Note [View rebase]).
    pub(crate) fn commit_inplace(
        &self,
        name: &'static str,
        inputs: &[&Tensor],
        f: BackwardFn,
    ) -> Result<()> {
        let view = lock(&self.0.view)
            .as_ref()
            .map(|v| (v.base.clone(), v.replay.clone()));
        let Some((base, replay)) = view else {
            let new = record(name, self.raw(), inputs, f);
            self.set_grad_fn(new.grad_fn_node());
            return Ok(());
        };
        let replay = replay.ok_or_else(|| overlapping(name))?;
        let b = base.raw();
        let mut next = vec![base.edge()];
        let mut metas = vec![InputMeta::of(&b)];
        for t in inputs.iter().skip(1) {
            next.push(t.edge());
            metas.push(InputMeta::of(&t.raw()));
        }
        let node = Arc::new(Node::new(
            "CopySlices",
            next,
            metas,
            copy_slices(f, replay.clone()),
        ));
        base.set_grad_fn(Some(node));
        if let Some(edge) = base.edge() {
            self.set_grad_fn(Some(as_strided_node(edge, &b, replay)));
        }
        let version = self.raw().version();
        if let Some(v) = lock(&self.0.view).as_mut() {
            v.version = version;
        }
        Ok(())
    }
}

/// The error for an in-place write to a view whose elements overlap.
pub(crate) fn overlapping(op: &str) -> crate::autograd::error::Error {
    AutogradError::Inplace(format!(
        "{op}: unsupported operation: more than one element of the written-to tensor refers to a single memory location (an expanded view). Please clone() the tensor before performing the operation."
    ))
    .into()
}

/// The node of a view over its base's history: the gradient written into zeros of the
/// base's shape where the view looks.
fn as_strided_node(edge: crate::autograd::graph::Next, base: &Raw, replay: Replay) -> Arc<Node> {
    let shape = base.shape().clone();
    let f: BackwardFn = Box::new(move |g: &Raw| {
        let z = Raw::zeros(shape.clone(), (g.device(), g.dtype()))?;
        replay(&z)?.copy_(g)?;
        Ok(vec![Some(z)])
    });
    Arc::new(Node::new(
        "AsStridedBackward0",
        vec![Some(edge)],
        vec![InputMeta::of(base)],
        f,
    ))
}

/// `CopySlices`' backward around the in-place op's backward `f` (Note [View rebase]).
fn copy_slices(mut f: BackwardFn, replay: Replay) -> BackwardFn {
    Box::new(move |g: &Raw| {
        let result = g.copy()?;
        let slice = replay(&result)?;
        let mut res = f(&slice.copy()?)?.into_iter();
        match res.next().flatten() {
            Some(r0) => slice.copy_(&r0)?,
            None => slice.fill_(0)?,
        };
        let mut out = vec![Some(result)];
        out.extend(res);
        Ok(out)
    })
}
