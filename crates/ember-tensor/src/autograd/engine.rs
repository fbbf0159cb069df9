//! The backward engine.
//!
//! Note [Backward engine]: a run starts from (tensor, gradient) roots. A first walk (an
//! explicit stack, no recursion) counts, for every node and leaf reachable from the roots,
//! how many edges lead into it. Gradients arriving at a target are summed in its input
//! buffer; a target becomes ready when its count reaches zero, and among ready ones the most
//! recently created node runs first (PyTorch's order; leaves first of all). Running a node
//! takes its backward function out of the node unless `retain_graph`, which frees the
//! tensors it saved as soon as it has run; running it again is the "backward through the
//! graph a second time" error. A node that saved no tensors (`AddBackward0` of `x + 1`,
//! `SumBackward0`) keeps its function, so a second backward through a graph of such nodes
//! accumulates again, as in PyTorch. Each gradient a node returns is checked against the shape,
//! dtype and device of the input it belongs to (reduced over broadcast dims, cast to the
//! input's dtype; a device mismatch is an error), so gradients always land on the device of
//! the tensor they belong to.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use crate::RawTensor as Raw;
use ember_device::trace::{self, Category};

use crate::autograd::error::{AutogradError, Result};
use crate::autograd::graph::{InputMeta, Next, Node, lock};
use crate::tensor::{Impl, Tensor};

struct Ready {
    seq: u64,
    next: Next,
}

impl PartialEq for Ready {
    fn eq(&self, o: &Self) -> bool {
        self.seq == o.seq
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ready {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.seq.cmp(&o.seq)
    }
}

fn seq_of(n: &Next) -> u64 {
    match n {
        Next::Node(n) => n.seq,
        Next::Leaf(_) => u64::MAX,
    }
}

/// Sums `g` into the buffer slot.
fn accumulate(slot: &mut Option<Raw>, g: Raw) -> Result<()> {
    *slot = Some(match slot.take() {
        None => g,
        Some(old) => old.add(&g)?,
    });
    Ok(())
}

/// Reduces `g` over the dims it was broadcast along to reach `shape`.
pub(crate) fn sum_to(g: &Raw, shape: &[usize]) -> Result<Raw> {
    if g.dims() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank().checked_sub(shape.len()).ok_or_else(|| {
        AutogradError::invalid(
            "sum_to",
            format!("gradient {} has fewer dims than {:?}", g.shape(), shape),
        )
    })?;
    let mut dims: Vec<usize> = (0..lead).collect();
    for (i, &s) in shape.iter().enumerate() {
        if s == 1 && g.dims()[lead + i] != 1 {
            dims.push(lead + i);
        }
    }
    let r = if dims.is_empty() {
        g.clone()
    } else {
        g.sum((dims, true))?
    };
    Ok(r.reshape(shape)?)
}

/// Brings a gradient to its input's shape, dtype and device, or says what is wrong.
fn validate(node: &'static str, g: Raw, m: &InputMeta) -> Result<Raw> {
    if g.device() != m.device {
        return Err(AutogradError::BadGradient {
            node,
            msg: format!(
                "invalid gradient: expected device {} but got {}",
                m.device,
                g.device()
            ),
        }
        .into());
    }
    let g = if g.dims() == m.shape.dims() {
        g
    } else if crate::broadcast_shape(node, &m.shape, g.shape())
        .map(|s| s.dims() == g.dims())
        .unwrap_or(false)
    {
        sum_to(&g, m.shape.dims())?
    } else {
        return Err(AutogradError::BadGradient {
            node,
            msg: format!(
                "invalid gradient: got shape {} but expected shape {}",
                g.shape(),
                m.shape
            ),
        }
        .into());
    };
    Ok(if g.dtype() != m.dtype {
        g.to_dtype(m.dtype)?
    } else {
        g
    })
}

/// Runs tensor hooks on `g`. A replacement must keep the gradient's shape, dtype and
/// device, as PyTorch requires ("hook 'hook' has changed the size of value").
fn run_hooks(hooks: &[(u64, crate::autograd::graph::Hook)], mut g: Raw) -> Result<Raw> {
    for (_, h) in hooks {
        if let Some(r) = h(&Tensor::wrap(g.clone())) {
            let r = r.raw();
            let what = if r.dims() != g.dims() {
                Some(format!(
                    "hook 'hook' has changed the size of value (was {} got {})",
                    g.shape(),
                    r.shape()
                ))
            } else if r.dtype() != g.dtype() {
                Some(format!(
                    "hook 'hook' has changed the type of value (was {} got {})",
                    g.dtype(),
                    r.dtype()
                ))
            } else if r.device() != g.device() {
                Some(format!(
                    "hook 'hook' has changed the device of value (was {} got {})",
                    g.device(),
                    r.device()
                ))
            } else {
                None
            };
            if let Some(msg) = what {
                return Err(AutogradError::BadGradient { node: "hook", msg }.into());
            }
            g = r;
        }
    }
    Ok(g)
}

/// Where gradients are collected in `autograd::grad`: target key → input position.
type Capture = HashMap<usize, Vec<usize>>;

/// The leaves that require grad which a backward from `outputs` would reach: the walk
/// `DistributedDataParallel`'s `find_unused_parameters` makes over the graph after forward
/// (a parameter not among them gets no gradient this iteration). Each leaf once, in no
/// particular order; leaf outputs are included themselves.
pub fn reachable_leaves(outputs: &[&Tensor]) -> Vec<Tensor> {
    let mut leaves = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<Next> = outputs.iter().filter_map(|t| t.edge()).collect();
    while let Some(n) = stack.pop() {
        if !seen.insert(n.key()) {
            continue;
        }
        match n {
            Next::Leaf(leaf) => leaves.push(Tensor(leaf)),
            Next::Node(node) => stack.extend(node.next.iter().flatten().cloned()),
        }
    }
    leaves
}

/// Runs backward from `roots` with their gradients. With `capture`, gradients reaching
/// the captured targets are returned instead of being accumulated into leaves.
pub(crate) fn execute(
    roots: Vec<(Next, Raw)>,
    retain_graph: bool,
    capture: Option<&Capture>,
    n_captured: usize,
) -> Result<Vec<Option<Raw>>> {
    // 1. Dependency counts over everything reachable.
    let mut deps: HashMap<usize, usize> = HashMap::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<Arc<Node>> = Vec::new();
    for (n, _) in &roots {
        if let Next::Node(node) = n
            && seen.insert(n.key())
        {
            stack.push(node.clone());
        }
    }
    while let Some(node) = stack.pop() {
        for e in node.next.iter().flatten() {
            *deps.entry(e.key()).or_insert(0) += 1;
            if let Next::Node(m) = e
                && seen.insert(e.key())
            {
                stack.push(m.clone());
            }
        }
    }

    // 2. Seed the buffers with the roots.
    let mut buffers: HashMap<usize, Option<Raw>> = HashMap::new();
    let mut heap = BinaryHeap::new();
    let mut queued: HashSet<usize> = HashSet::new();
    for (n, g) in roots {
        let k = n.key();
        accumulate(buffers.entry(k).or_insert(None), g)?;
        if deps.get(&k).copied().unwrap_or(0) == 0 && queued.insert(k) {
            heap.push(Ready {
                seq: seq_of(&n),
                next: n,
            });
        }
    }

    let mut captured: Vec<Option<Raw>> = vec![None; n_captured];
    let mut store = |k: usize, g: &Raw| -> Result<()> {
        if let Some(idx) = capture.and_then(|c| c.get(&k)) {
            for &i in idx {
                accumulate(&mut captured[i], g.clone())?;
            }
        }
        Ok(())
    };

    // 3. Run targets as they become ready.
    while let Some(Ready { next, .. }) = heap.pop() {
        let k = next.key();
        let g = buffers.remove(&k).flatten();
        match next {
            Next::Leaf(leaf) => {
                if let Some(g) = g {
                    let hooks = lock(&leaf.leaf).hooks.clone();
                    let g = run_hooks(&hooks, g)?;
                    store(k, &g)?;
                    if capture.is_none() {
                        accumulate_leaf(&leaf, g)?;
                    }
                }
            }
            Next::Node(node) => {
                let grads = match g {
                    Some(g) => {
                        let hooks = lock(&node.hooks).clone();
                        let g = run_hooks(&hooks, g)?;
                        store(k, &g)?;
                        if capture.is_none()
                            && let Some(t) = lock(&node.retained).as_ref().and_then(|w| w.upgrade())
                        {
                            let mut s = lock(&t.leaf);
                            accumulate(&mut s.grad, g.clone())?;
                        }
                        run_node(&node, &g, retain_graph)?
                    }
                    None => vec![None; node.next.len()],
                };
                for ((e, gi), meta) in node.next.iter().zip(grads).zip(&node.inputs) {
                    let Some(e) = e else { continue };
                    let ek = e.key();
                    let slot = buffers.entry(ek).or_insert(None);
                    if let Some(gi) = gi {
                        accumulate(slot, validate(node.name, gi, meta)?)?;
                    }
                    let d = match deps.entry(ek) {
                        Entry::Occupied(mut o) => {
                            *o.get_mut() = o.get().saturating_sub(1);
                            *o.get()
                        }
                        Entry::Vacant(_) => 0,
                    };
                    if d == 0 && queued.insert(ek) {
                        heap.push(Ready {
                            seq: seq_of(e),
                            next: e.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(captured)
}

fn run_node(node: &Node, g: &Raw, retain_graph: bool) -> Result<Vec<Option<Raw>>> {
    // The two ranges PyTorch's profiler shows for each node (Note [Zero-cost tracing]).
    let _evaluate = trace::range_named(Category::Backward, || {
        Cow::Owned(format!(
            "autograd::engine::evaluate_function: {}",
            node.name
        ))
    });
    let _node = trace::range_with_inputs(
        Category::Backward,
        || Cow::Borrowed(node.name),
        || crate::profile::describe_inputs(&[g]),
    );
    let mut slot = lock(&node.backward);
    let grads = if retain_graph || !node.frees {
        let f = slot
            .as_mut()
            .ok_or(AutogradError::GraphFreed { node: node.name })?;
        f(g)?
    } else {
        let mut f = slot
            .take()
            .ok_or(AutogradError::GraphFreed { node: node.name })?;
        drop(slot);
        f(g)?
        // `f` and the tensors it saved are dropped here.
    };
    if grads.len() != node.next.len() {
        return Err(AutogradError::BadGradient {
            node: node.name,
            msg: format!(
                "returned {} gradients for {} inputs (internal error)",
                grads.len(),
                node.next.len()
            ),
        }
        .into());
    }
    Ok(grads)
}

/// Sums `g` into a leaf's `.grad`, then runs its post-accumulate hooks.
fn accumulate_leaf(leaf: &Arc<Impl>, g: Raw) -> Result<()> {
    let post = {
        let mut s = lock(&leaf.leaf);
        s.grad = Some(match s.grad.take() {
            // The first gradient becomes `.grad` itself, so it must be a dense tensor of its
            // own: optimizers update it in place (a broadcast view could not be written).
            None if g.is_contiguous() && g.storage_len() == g.numel() => g,
            None => g.copy()?,
            Some(old) => old.add(&g)?,
        });
        s.post_hooks.clone()
    };
    if !post.is_empty() {
        let t = Tensor(leaf.clone());
        for (_, h) in post {
            h(&t)?;
        }
    }
    Ok(())
}

/// The roots of a backward: each output with its gradient (1 for scalars).
fn roots(outputs: &[Tensor], grads: &[Option<Tensor>]) -> Result<Vec<(Next, Raw)>> {
    if grads.len() != outputs.len() {
        return Err(AutogradError::invalid(
            "backward",
            format!(
                "got {} gradients for {} outputs",
                grads.len(),
                outputs.len()
            ),
        )
        .into());
    }
    let mut out = Vec::with_capacity(outputs.len());
    for (i, (t, g)) in outputs.iter().zip(grads).enumerate() {
        let edge = t.edge().ok_or_else(|| AutogradError::NoGradFn {
            what: format!("element {i} of tensors"),
        })?;
        let d = t.raw();
        let g = match g {
            Some(g) => {
                let g = g.raw();
                if g.dims() != d.dims() {
                    return Err(AutogradError::invalid(
                        "backward",
                        format!(
                            "Mismatch in shape: grad_output[{i}] has a shape of {} and output[{i}] has a shape of {}",
                            g.shape(),
                            d.shape()
                        ),
                    ).into());
                }
                if g.device() != d.device() {
                    return Err(AutogradError::invalid(
                        "backward",
                        format!(
                            "grad_output[{i}] is on {} but output[{i}] is on {}",
                            g.device(),
                            d.device()
                        ),
                    )
                    .into());
                }
                g.to_dtype(d.dtype())?
            }
            None => {
                if d.numel() != 1 {
                    return Err(AutogradError::ImplicitGradNonScalar {
                        shape: d.shape().clone(),
                    }
                    .into());
                }
                d.ones_like()?
            }
        };
        out.push((edge, g));
    }
    Ok(out)
}

/// `torch.autograd.backward(tensors, grad_tensors, retain_graph)`.
pub fn backward(outputs: &[Tensor], grads: &[Option<Tensor>], retain_graph: bool) -> Result<()> {
    let r = roots(outputs, grads)?;
    execute(r, retain_graph, None, 0)?;
    Ok(())
}

/// Options of [`grad`].
#[derive(Clone, Copy, Debug, Default)]
pub struct GradOptions {
    /// Keep the graph's saved tensors for another backward.
    pub retain_graph: bool,
    /// Return `None` for inputs the outputs do not depend on instead of an error.
    pub allow_unused: bool,
}

/// `torch.autograd.grad(outputs, inputs, grad_outputs)`: the gradients of `outputs` with
/// respect to `inputs`, returned rather than accumulated into `.grad`.
///
/// ```
/// use ember_tensor::{Tensor, grad, GradOptions};
/// let x = Tensor::from_vec(vec![3f64], [1], &ember_tensor::Device::Cpu)?.requires_grad_(true)?;
/// let y = x.mul(&x)?.mul(&x)?.sum_all()?;              // x³
/// let g = grad(&[y], &[x.clone()], &[None], GradOptions::default())?;
/// assert_eq!(g[0].as_ref().unwrap().to_vec::<f64>()?, vec![27.0]);
/// assert!(x.grad().is_none());                          // .grad untouched
/// # Ok::<(), ember_tensor::Error>(())
/// ```
pub fn grad(
    outputs: &[Tensor],
    inputs: &[Tensor],
    grad_outputs: &[Option<Tensor>],
    opts: GradOptions,
) -> Result<Vec<Option<Tensor>>> {
    let grads: Vec<Option<Tensor>> = if grad_outputs.is_empty() {
        vec![None; outputs.len()]
    } else {
        grad_outputs.to_vec()
    };
    let r = roots(outputs, &grads)?;
    let mut capture: Capture = HashMap::new();
    for (i, t) in inputs.iter().enumerate() {
        let e = t.edge().ok_or_else(|| AutogradError::NoGradFn {
            what: format!("input {i}"),
        })?;
        capture.entry(e.key()).or_default().push(i);
    }
    let got = execute(r, opts.retain_graph, Some(&capture), inputs.len())?;
    got.into_iter()
        .enumerate()
        .map(|(i, g)| match g {
            Some(g) => Ok(Some(Tensor::wrap(g))),
            None if opts.allow_unused => Ok(None),
            None => Err(AutogradError::UnusedInput { index: i }.into()),
        })
        .collect()
}
