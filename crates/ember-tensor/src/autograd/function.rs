//! [`custom_op`]: a differentiable op defined outside this crate, as a
//! `torch.autograd.Function` with one output.
//!
//! Note [Custom ops]: crates above this one (the `Broadcast`, `Gather` and
//! `ReduceAddCoalesced` functions of `ember-parallel`, whose forward and backward are NCCL
//! collectives) compute their forward on plain tensors and hand this crate the output and a
//! backward closure; it records one node exactly as the ops of `ops/*` do (inputs' edges,
//! the gradients' expected shapes, dtypes and devices checked by the engine). An op with
//! several outputs is recorded as one custom op per output; the engine sums what their
//! backwards return for a shared input, as PyTorch's accumulation does.

use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, maybe_record};
use crate::tensor::Tensor;

/// Wraps `output` (computed from `inputs` without recording) as the result of a node named
/// `name` whose backward maps the output's gradient to one gradient per input (`None` for an
/// input that gets none; each `Some` must have that input's shape, dtype and device). When
/// grad mode is off or no input requires grad, `output` is returned as a plain tensor and
/// `backward` is dropped. The backward runs without recording (its tensors are outside the
/// tape, as the engine's own backward functions are).
///
/// ```
/// use ember_tensor::{Device, Tensor, custom_op, no_grad};
/// let x = Tensor::from_vec(vec![1f32, 2.0], [2], &Device::Cpu)?.requires_grad_(true)?;
/// // y = 3x, written outside the crate.
/// let out = { let _g = no_grad(); x.mul(3.0)? };
/// let y = custom_op("TripleBackward", &out, &[&x], |g| Ok(vec![Some(g.mul(3.0)?)]))?;
/// y.sum_all()?.backward()?;
/// assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![3.0, 3.0]);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
pub fn custom_op(
    name: &'static str,
    output: &Tensor,
    inputs: &[&Tensor],
    mut backward: impl FnMut(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Result<Tensor> {
    maybe_record(name, output.raw(), inputs, || {
        let f: BackwardFn = Box::new(move |g| {
            let _g = crate::autograd::mode::no_grad();
            let grads = backward(&Tensor::wrap(g.clone()))?;
            Ok(grads.into_iter().map(|g| g.map(|t| t.raw())).collect())
        });
        Ok(f)
    })
}
