//! `gradcheck`: analytical gradients against central finite differences in f64.
//!
//! The check projects the output onto a fixed pseudo-random vector `v` (PyTorch's fast
//! mode): `L(x) = Σ v·f(x)`. Backward with `v` as the output gradient gives `∂L/∂x`
//! analytically; perturbing each element of each input by ±eps gives it numerically. One
//! backward and two forwards per input element, so it stays cheap on small shapes.

use ember_error::{Error, Result};
use ember_tensor::{AutogradError, DType, Device, GradOptions, Tensor, grad, no_grad};

/// Tolerances of [`gradcheck`] (PyTorch's defaults).
#[derive(Clone, Copy, Debug)]
pub struct GradcheckOptions {
    /// Finite-difference step.
    pub eps: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-6,
            atol: 1e-5,
            rtol: 1e-3,
        }
    }
}

/// A deterministic vector in `[0.5, 1.5)`, so no output is weighted by zero.
fn projection(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            0.5 + (s >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

fn projected(out: &Tensor, v: &[f64]) -> Result<f64> {
    let o = out.to_dtype(DType::F64)?.to_vec::<f64>()?;
    Ok(o.iter().zip(v).map(|(a, b)| a * b).sum())
}

/// Checks the gradients of `f` at `inputs` (f64 tensors; those that require grad are
/// checked) against finite differences. `Ok(())` when every element agrees within
/// `atol + rtol·|numerical|`; otherwise an error naming the input, the element and both
/// values.
///
/// ```
/// use ember_autograd::{Tensor, gradcheck, GradcheckOptions};
/// use ember_tensor::Device;
/// let x = Tensor::from_vec(vec![0.3f64, -1.2, 2.0], [3], &Device::Cpu)?.requires_grad_(true)?;
/// gradcheck(|xs| xs[0].tanh()?.mul(&xs[0]), &[x], GradcheckOptions::default())?;
/// # Ok::<(), ember_autograd::Error>(())
/// ```
pub fn gradcheck<F>(f: F, inputs: &[Tensor], opts: GradcheckOptions) -> Result<()>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    for (i, t) in inputs.iter().enumerate() {
        if t.requires_grad() && t.dtype() != DType::F64 {
            return Err(Error::invalid(
                "gradcheck",
                format!(
                    "input {i} is {} but gradcheck needs f64 inputs for its finite differences",
                    t.dtype()
                ),
            ));
        }
    }
    let out = f(inputs)?;
    let od = out.data();
    let v = projection(od.numel(), 0x5eed);
    let vt = Tensor::from_vec(v.clone(), od.shape(), Device::Cpu)?
        .to_dtype(od.dtype())?
        .to_device(od.device())?;
    let checked: Vec<usize> = (0..inputs.len())
        .filter(|&i| inputs[i].requires_grad())
        .collect();
    if checked.is_empty() {
        return Err(Error::invalid("gradcheck", "no input requires grad"));
    }
    if !out.requires_grad() {
        return Err(AutogradError::Gradcheck(
            "the output does not require grad, but an input does: the op recorded nothing".into(),
        )
        .into());
    }
    let wrt: Vec<Tensor> = checked.iter().map(|&i| inputs[i].clone()).collect();
    let analytical = grad(
        &[out],
        &wrt,
        &[Some(vt)],
        GradOptions {
            retain_graph: false,
            allow_unused: true,
        },
    )?;
    let _g = no_grad();
    for (k, &i) in checked.iter().enumerate() {
        let x = inputs[i].data();
        let dev = x.device();
        let base = x.to_vec::<f64>()?;
        let a = match &analytical[k] {
            Some(g) => g.data().to_dtype(DType::F64)?.to_vec::<f64>()?,
            None => vec![0.0; base.len()],
        };
        for j in 0..base.len() {
            let at = |delta: f64| -> Result<f64> {
                let mut p = base.clone();
                p[j] += delta;
                let xp = Tensor::from_vec(p, x.shape(), Device::Cpu)?.to_device(dev)?;
                let mut args: Vec<Tensor> = inputs.to_vec();
                args[i] = xp;
                projected(&f(&args)?.data(), &v)
            };
            let num = (at(opts.eps)? - at(-opts.eps)?) / (2.0 * opts.eps);
            let ana = a.get(j).copied().unwrap_or(0.0);
            let close = (ana - num).abs() <= opts.atol + opts.rtol * num.abs();
            if !close {
                return Err(AutogradError::Gradcheck(format!(
                    "Jacobian mismatch for input {i}, element {j}: numerical {num:.10e}, analytical {ana:.10e} (atol {}, rtol {})",
                    opts.atol, opts.rtol
                )).into());
            }
        }
    }
    Ok(())
}
