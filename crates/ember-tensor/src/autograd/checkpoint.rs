//! Activation checkpointing (`torch.utils.checkpoint`).
//!
//! Note [Checkpoint]: the forward of the wrapped function runs under `no_grad`, so none of
//! its intermediate tensors is kept; only the inputs are saved. Its one output becomes the
//! output of a `CheckpointFunctionBackward` node. When backward reaches that node, it
//! restores the random-number state of the inputs' devices to what it was before the
//! forward (so dropout draws the same masks), runs the function again with recording on
//! over detached copies of the inputs, backpropagates the incoming gradient through that
//! fresh graph (a nested run of the engine, which also accumulates into the parameters the
//! function captured, as PyTorch's reentrant checkpoint does), puts the random state back,
//! and returns the inputs' gradients. Gradients equal those without checkpointing, and peak memory during
//! the forward drops by the activations the function would have saved. The recomputation
//! also runs under the autocast policy the forward ran under (Note [Autocast hook]), as
//! PyTorch's checkpoint re-enters the forward's autocast state: a block checkpointed inside
//! an autocast region is recomputed in the same dtypes during a backward that runs outside
//! it, so its output and its gradients match the forward's.

use std::sync::Arc;

use crate::random::{GeneratorState, default_generator};
use ember_device::Device;

use crate::autograd::error::{AutogradError, Result};
use crate::autograd::graph::{BackwardFn, Saved, needs_grad, record};
use crate::autograd::mode::{current_policy, enable_grad, no_grad, set_autocast_policy};
use crate::tensor::Tensor;

/// The states of the default generators of `devices`.
fn rng_states(devices: &[Device]) -> Vec<(Device, GeneratorState)> {
    devices
        .iter()
        .map(|&d| (d, default_generator(d).get_state()))
        .collect()
}

fn set_rng_states(states: &[(Device, GeneratorState)]) {
    for (d, s) in states {
        default_generator(*d).set_state(s);
    }
}

/// Runs `f(inputs)` without keeping its activations; during backward `f` runs again (same
/// random state) to rebuild them. See Note [Checkpoint].
///
/// ```
/// use ember_tensor::{Tensor, checkpoint};
/// use ember_tensor::Device;
/// let x = Tensor::from_vec(vec![1f64, 2., 3.], [3], &Device::Cpu)?.requires_grad_(true)?;
/// let y = checkpoint(|xs| xs[0].tanh()?.mul(&xs[0]), &[x.clone()])?;
/// y.sum_all()?.backward()?;
/// let g = x.grad().unwrap().to_vec::<f64>()?;
/// let t = 1f64.tanh();
/// assert!((g[0] - (t + (1.0 - t * t))).abs() < 1e-12);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
pub fn checkpoint<F>(f: F, inputs: &[Tensor]) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    let refs: Vec<&Tensor> = inputs.iter().collect();
    if !needs_grad(&refs) {
        return f(inputs);
    }
    let mut devices: Vec<Device> = vec![Device::Cpu];
    for t in inputs {
        let d = t.device();
        if !devices.contains(&d) {
            devices.push(d);
        }
    }
    let states = rng_states(&devices);
    // The forward's autocast state, for the recomputation (Note [Checkpoint]).
    let autocast = current_policy();
    let out = {
        let _g = no_grad();
        f(inputs)?
    };
    let name = "CheckpointFunctionBackward";
    let saved = inputs
        .iter()
        .map(|t| Saved::of(name, t))
        .collect::<Result<Vec<_>>>()?;
    let needs: Vec<bool> = inputs.iter().map(Tensor::requires_grad).collect();
    let f = Arc::new(f);
    let backward: BackwardFn = Box::new(move |g| {
        let detached = saved
            .iter()
            .zip(&needs)
            .map(|(s, &n)| {
                let t = Tensor::wrap(s.get()?);
                if n { t.requires_grad_(true) } else { Ok(t) }
            })
            .collect::<Result<Vec<_>>>()?;
        let now = rng_states(&states.iter().map(|(d, _)| *d).collect::<Vec<_>>());
        set_rng_states(&states);
        let rerun = {
            let _g = enable_grad();
            let _ac = set_autocast_policy(autocast.clone());
            f(&detached)
        };
        set_rng_states(&now);
        let y = rerun?;
        let want: Vec<Tensor> = detached
            .iter()
            .zip(&needs)
            .filter(|&(_, &n)| n)
            .map(|(t, _)| t.clone())
            .collect();
        if !y.requires_grad() {
            return Err(AutogradError::invalid(
                "checkpoint",
                "the recomputed output does not depend on any input that requires grad",
            )
            .into());
        }
        // A nested backward (not `grad`): parameters the function captured (a module's
        // weights) accumulate their gradients as they would without checkpointing, and the
        // detached inputs, leaves here, receive theirs in `.grad`.
        crate::autograd::engine::backward(&[y], &[Some(Tensor::wrap(g.clone()))], false)?;
        let mut it = want.iter();
        Ok(needs
            .iter()
            .map(|&n| {
                if n {
                    it.next().and_then(Tensor::grad).map(|t| t.raw())
                } else {
                    None
                }
            })
            .collect())
    });
    Ok(record(name, out.raw(), &refs, backward))
}
