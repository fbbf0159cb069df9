//! [`Tensor`]: the eager tensor of `ember-tensor` with a place on the tape.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::{DType, Device, RawTensor as Raw, Shape, WithDType};

use crate::autograd::error::{AutogradError, Result};
use crate::autograd::graph::{Hook, Next, Node, lock};

/// A tensor that can carry autograd: PyTorch's `torch.Tensor`.
///
/// Cloning is cheap and gives the *same* tensor (as a second Python reference would):
/// `requires_grad_`, `.grad` and hooks are shared by the clones. Ops record a node on the
/// tape when grad mode is on and an input requires grad; [`backward`](Tensor::backward)
/// runs the tape.
///
/// ```
/// use ember_tensor::Tensor;
/// let x = Tensor::from_vec(vec![1f32, 2., 3.], [3], &ember_tensor::Device::Cpu)?.requires_grad_(true)?;
/// let y = x.mul(&x)?.sum_all()?;            // y = Σ x²
/// y.backward()?;
/// assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![2., 4., 6.]);
/// assert_eq!(y.grad_fn_name(), Some("SumBackward0"));
/// # Ok::<(), ember_tensor::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Impl>);

pub(crate) struct Impl {
    core: RwLock<Core>,
    requires_grad: AtomicBool,
    /// For the output of a view op (sharing its input's storage): its base and how to
    /// redo the view (Note [View rebase]).
    pub(crate) view: Mutex<Option<crate::autograd::rebase::ViewInfo>>,
    inference: bool,
    pub(crate) leaf: Mutex<LeafState>,
}

struct Core {
    data: Raw,
    grad_fn: Option<Arc<Node>>,
}

#[derive(Default)]
pub(crate) struct LeafState {
    pub(crate) grad: Option<Raw>,
    pub(crate) retains_grad: bool,
    /// Hooks on a leaf's gradient, run before it is accumulated.
    pub(crate) hooks: Vec<(u64, Hook)>,
    /// Hooks run after the gradient was accumulated into `.grad`.
    pub(crate) post_hooks: Vec<(u64, PostHook)>,
}

pub(crate) type PostHook = Arc<dyn Fn(&Tensor) -> Result<()> + Send + Sync>;

static HOOK_ID: AtomicU64 = AtomicU64::new(0);

/// Returned by [`Tensor::register_hook`] and
/// [`Tensor::register_post_accumulate_grad_hook`]; [`remove`](HookHandle::remove) takes
/// the hook off again (dropping the handle leaves it on, as in PyTorch).
#[derive(Debug)]
pub struct HookHandle {
    id: u64,
    target: HookTarget,
}

#[derive(Debug)]
enum HookTarget {
    Leaf(std::sync::Weak<Impl>),
    Node(std::sync::Weak<Node>),
}

impl std::fmt::Debug for Impl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorImpl")
    }
}

impl HookHandle {
    /// Removes the hook.
    pub fn remove(self) {
        match &self.target {
            HookTarget::Leaf(w) => {
                if let Some(i) = w.upgrade() {
                    let mut s = lock(&i.leaf);
                    s.hooks.retain(|(id, _)| *id != self.id);
                    s.post_hooks.retain(|(id, _)| *id != self.id);
                }
            }
            HookTarget::Node(w) => {
                if let Some(n) = w.upgrade() {
                    lock(&n.hooks).retain(|(id, _)| *id != self.id);
                }
            }
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.raw())?;
        if let Some(n) = self.grad_fn_name() {
            write!(f, " grad_fn=<{n}>")
        } else if self.requires_grad() {
            write!(f, " requires_grad")
        } else {
            Ok(())
        }
    }
}

/// Prints like PyTorch: `tensor([1., 2.], requires_grad=True)`,
/// `tensor([2., 4.], grad_fn=<MulBackward0>)`.
impl std::fmt::Display for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.raw().to_string();
        let extra = match self.grad_fn_name() {
            Some(n) => format!(", grad_fn=<{n}>"),
            None if self.requires_grad() => ", requires_grad=True".to_string(),
            None => String::new(),
        };
        match s.strip_suffix(')') {
            Some(body) if !extra.is_empty() => write!(f, "{body}{extra})"),
            _ => f.write_str(&s),
        }
    }
}

impl From<Raw> for Tensor {
    fn from(t: Raw) -> Tensor {
        Tensor::wrap(t)
    }
}

impl Tensor {
    // --- construction --------------------------------------------------------------------

    fn make(data: Raw, grad_fn: Option<Arc<Node>>) -> Tensor {
        Tensor(Arc::new(Impl {
            core: RwLock::new(Core { data, grad_fn }),
            requires_grad: AtomicBool::new(false),
            view: Mutex::new(None),
            inference: crate::autograd::mode::is_inference_mode_enabled(),
            leaf: Mutex::new(LeafState::default()),
        }))
    }

    /// A leaf that does not require grad, over `data` (sharing its storage).
    pub(crate) fn wrap(data: Raw) -> Tensor {
        Tensor::make(data, None)
    }

    pub(crate) fn from_node(data: Raw, node: Arc<Node>) -> Tensor {
        Tensor::make(data, Some(node))
    }

    // --- the data ------------------------------------------------------------------------

    /// The untracked tensor under this one (sharing storage, outside the tape).
    pub(crate) fn raw(&self) -> Raw {
        self.0
            .core
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .data
            .clone()
    }

    /// Replaces the data in place; see [`set_data`](Tensor::set_data).
    pub(crate) fn set_raw(&self, data: Raw) {
        self.0
            .core
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .data = data;
    }

    /// The tensor's data (PyTorch's `.data`): a tensor sharing this one's storage, outside
    /// the tape (the same as [`detach`](Tensor::detach)).
    pub fn data(&self) -> Tensor {
        self.detach()
    }

    /// Replaces the data in place (PyTorch's `param.data = ...`): every clone of this
    /// tensor sees `data`'s storage and layout, and the tape and `.grad` are kept. This is
    /// how a module moves its parameters to another device while an optimizer holds them.
    pub fn set_data(&self, data: &Tensor) {
        self.set_raw(data.raw());
    }

    pub(crate) fn grad_fn_node(&self) -> Option<Arc<Node>> {
        self.refresh_view();
        self.0
            .core
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .grad_fn
            .clone()
    }

    pub(crate) fn set_grad_fn(&self, node: Option<Arc<Node>>) {
        self.0
            .core
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .grad_fn = node;
    }

    /// A new tensor sharing this one's storage, outside the tape (PyTorch's `detach()`).
    pub fn detach(&self) -> Tensor {
        Tensor::wrap(self.raw())
    }

    /// `true` for the output of a view op (`narrow`, `t`, `reshape` without a copy, ...),
    /// which shares its input's storage.
    pub fn is_view(&self) -> bool {
        lock(&self.0.view).is_some()
    }

    /// `true` if both handles are the same tensor (clones of one another).
    pub fn same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    // --- autograd state ------------------------------------------------------------------

    /// `true` if gradients flow to this tensor: a leaf marked with `requires_grad_`, or the
    /// output of a recorded op.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed) || self.grad_fn_node().is_some()
    }

    /// Marks a leaf as requiring grad (or not); returns the same tensor for chaining. Only
    /// floating-point tensors can require grad; only leaves can be switched off.
    pub fn requires_grad_(&self, requires_grad: bool) -> Result<Tensor> {
        if self.grad_fn_node().is_some() {
            if requires_grad {
                return Ok(self.clone());
            }
            return Err(AutogradError::invalid(
                "requires_grad_",
                "you can only change requires_grad flags of leaf variables. If you want to use a computed variable in a subgraph that doesn't require differentiation use detach()",
            ).into());
        }
        if requires_grad && !self.dtype().is_float() {
            return Err(AutogradError::invalid(
                "requires_grad_",
                format!(
                    "only Tensors of floating point dtype can require gradients (got {})",
                    self.dtype()
                ),
            )
            .into());
        }
        if requires_grad && self.0.inference {
            return Err(AutogradError::invalid(
                "requires_grad_",
                "an inference tensor cannot require grad outside inference_mode; clone it first",
            )
            .into());
        }
        self.0.requires_grad.store(requires_grad, Ordering::Relaxed);
        Ok(self.clone())
    }

    /// `true` for tensors not made by a recorded op (PyTorch's `is_leaf`).
    pub fn is_leaf(&self) -> bool {
        self.grad_fn_node().is_none()
    }

    /// `true` for tensors made inside [`inference_mode`](crate::inference_mode).
    pub fn is_inference(&self) -> bool {
        self.0.inference
    }

    /// The name of the op that made this tensor, as PyTorch prints `grad_fn`
    /// (`"MulBackward0"`), or `None` for leaves.
    pub fn grad_fn_name(&self) -> Option<&'static str> {
        self.grad_fn_node().map(|n| n.name())
    }

    /// The accumulated gradient (`.grad`): set on leaves that require grad by backward, and
    /// on non-leaves that called [`retain_grad`](Tensor::retain_grad).
    pub fn grad(&self) -> Option<Tensor> {
        lock(&self.0.leaf).grad.clone().map(Tensor::wrap)
    }

    /// Sets or clears `.grad` (`x.grad = None` is `x.set_grad(None)`). The gradient must
    /// have this tensor's dtype, shape and device (PyTorch's "assigned grad has data of a
    /// different type/size", "... located on a different device").
    pub fn set_grad(&self, grad: Option<&Tensor>) -> Result<()> {
        let g = match grad {
            None => None,
            Some(g) => {
                let (d, gd) = (self.raw(), g.raw());
                let what = if gd.dtype() != d.dtype() {
                    Some(format!(
                        "assigned grad has data of a different type (expected {} but got {})",
                        d.dtype(),
                        gd.dtype()
                    ))
                } else if gd.dims() != d.dims() {
                    Some(format!(
                        "assigned grad has data of a different size (expected {} but got {})",
                        d.shape(),
                        gd.shape()
                    ))
                } else if gd.device() != d.device() {
                    Some(format!(
                        "assigned grad has data located on a different device (expected {} but got {})",
                        d.device(),
                        gd.device()
                    ))
                } else {
                    None
                };
                if let Some(msg) = what {
                    return Err(AutogradError::invalid("set_grad", msg).into());
                }
                Some(gd)
            }
        };
        lock(&self.0.leaf).grad = g;
        Ok(())
    }

    /// Asks backward to fill `.grad` on this non-leaf tensor too (a no-op on leaves).
    pub fn retain_grad(&self) -> Result<()> {
        match self.grad_fn_node() {
            None => Ok(()),
            Some(n) => {
                *lock(&n.retained) = Some(Arc::downgrade(&self.0));
                lock(&self.0.leaf).retains_grad = true;
                Ok(())
            }
        }
    }

    /// `true` after [`retain_grad`](Tensor::retain_grad) on a non-leaf.
    pub fn retains_grad(&self) -> bool {
        lock(&self.0.leaf).retains_grad
    }

    /// Registers `hook` on this tensor's gradient: it runs each time a gradient for this
    /// tensor is computed and may return a replacement (`Some`). On a leaf it runs before
    /// the gradient is accumulated into `.grad`.
    pub fn register_hook(
        &self,
        hook: impl Fn(&Tensor) -> Option<Tensor> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        let id = HOOK_ID.fetch_add(1, Ordering::Relaxed);
        let hook: Hook = Arc::new(hook);
        if let Some(n) = self.grad_fn_node() {
            lock(&n.hooks).push((id, hook));
            return Ok(HookHandle {
                id,
                target: HookTarget::Node(Arc::downgrade(&n)),
            });
        }
        if !self.requires_grad() {
            return Err(AutogradError::invalid(
                "register_hook",
                "cannot register a hook on a tensor that doesn't require gradient",
            )
            .into());
        }
        lock(&self.0.leaf).hooks.push((id, hook));
        Ok(HookHandle {
            id,
            target: HookTarget::Leaf(Arc::downgrade(&self.0)),
        })
    }

    /// Registers `hook` to run on a leaf right after its gradient was accumulated into
    /// `.grad` (it receives the leaf). Data parallelism starts its all-reduce here. An error
    /// the hook returns ends the backward with that error (as an exception raised in a
    /// PyTorch hook propagates out of `backward()`).
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        if !self.is_leaf() || !self.requires_grad() {
            return Err(AutogradError::invalid(
                "register_post_accumulate_grad_hook",
                "post accumulate grad hooks can only be registered on leaf tensors that require grad",
            ).into());
        }
        let id = HOOK_ID.fetch_add(1, Ordering::Relaxed);
        lock(&self.0.leaf).post_hooks.push((id, Arc::new(hook)));
        Ok(HookHandle {
            id,
            target: HookTarget::Leaf(Arc::downgrade(&self.0)),
        })
    }

    /// Where this tensor's gradient goes in a graph, or `None` if it needs none.
    pub(crate) fn edge(&self) -> Option<Next> {
        if let Some(n) = self.grad_fn_node() {
            Some(Next::Node(n))
        } else if self.0.requires_grad.load(Ordering::Relaxed) {
            Some(Next::Leaf(self.0.clone()))
        } else {
            None
        }
    }

    // --- backward ------------------------------------------------------------------------

    /// Backpropagates from this scalar: fills `.grad` of the leaves it depends on, and
    /// frees the graph's saved tensors.
    pub fn backward(&self) -> Result<()> {
        self.backward_opts(None, false)
    }

    /// Backpropagates `grad_output` (this tensor's shape) from a non-scalar tensor.
    pub fn backward_with(&self, grad_output: &Tensor) -> Result<()> {
        self.backward_opts(Some(grad_output), false)
    }

    /// Backward with all options: the gradient of this tensor (`None` for a scalar: 1),
    /// and `retain_graph` to keep the saved tensors for another backward.
    pub fn backward_opts(&self, grad_output: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        crate::autograd::engine::backward(
            std::slice::from_ref(self),
            &[grad_output.cloned()],
            retain_graph,
        )
    }

    // --- metadata (delegated) ------------------------------------------------------------

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.raw().shape().clone()
    }

    /// The sizes of the dims.
    pub fn dims(&self) -> Vec<usize> {
        self.raw().dims().to_vec()
    }

    /// The size of one dim (negative counts from the end).
    pub fn size(&self, dim: impl crate::Dim) -> Result<usize> {
        Ok(self.raw().size(dim)?)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.raw().dtype()
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.raw().device()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.raw().numel()
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.raw().rank()
    }

    /// Strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        self.raw().strides().to_vec()
    }

    /// Offset of the first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.raw().storage_offset()
    }

    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> crate::Layout {
        self.raw().layout().clone()
    }

    /// PyTorch's `is_contiguous()`.
    pub fn is_contiguous(&self) -> bool {
        self.raw().is_contiguous()
    }

    /// The storage's in-place write counter (PyTorch's `_version`).
    pub fn version(&self) -> u64 {
        self.raw().version()
    }

    /// The elements in row-major order, as `T` (another dtype than the tensor's is
    /// converted first, as `x.to(dtype).tolist()`).
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        Ok(self.raw().to_vec::<T>()?)
    }

    /// The matrices of a 3-D tensor.
    pub fn to_vec3<T: WithDType>(&self) -> Result<Vec<Vec<Vec<T>>>> {
        Ok(self.raw().to_vec3::<T>()?)
    }

    /// Marks this tensor's memory as used by work queued on `stream` (PyTorch's
    /// `record_stream`): the caching allocator does not reuse it until that work is done.
    pub fn record_stream(&self, stream: &ember_device::cuda::Stream) -> Result<()> {
        Ok(self.raw().record_stream(stream)?)
    }

    /// The rows of a 2-D tensor.
    pub fn to_vec2<T: WithDType>(&self) -> Result<Vec<Vec<T>>> {
        Ok(self.raw().to_vec2::<T>()?)
    }

    /// The one element of a one-element tensor, as `T` (PyTorch's `item()`; converted as
    /// [`to_vec`](Tensor::to_vec) converts).
    pub fn item<T: WithDType>(&self) -> Result<T> {
        Ok(self.raw().item::<T>()?)
    }

    /// The one element as a [`Scalar`](ember_tensor::Scalar), whatever the dtype.
    pub fn to_scalar(&self) -> Result<crate::Scalar> {
        Ok(self.raw().to_scalar()?)
    }
}
