//! `torch.where`: the elementwise select, differentiable in both tensor operands.

use crate::RawTensor as Raw;

use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, maybe_record};
use crate::autograd::mode::autocast_inputs;
use crate::ops::elementwise::raw_operand;
use crate::scalar::Operand;
use crate::tensor::Tensor;

/// `torch.where(cond, on_true, on_false)`: `cond ? on_true : on_false` elementwise with
/// broadcasting; gradients flow to the tensor operands where each was picked.
///
/// ```
/// use ember_tensor::Tensor;
/// let x = Tensor::from_vec(vec![-1f32, 2., -3.], [3], ())?;
/// let r = ember_tensor::r#where(&x.gt(0)?, &x, 0.0)?;
/// assert_eq!(r.to_vec::<f32>()?, vec![0., 2., 0.]);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
pub fn r#where<'a, 'b>(
    cond: &Tensor,
    on_true: impl Into<Operand<'a>>,
    on_false: impl Into<Operand<'b>>,
) -> Result<Tensor> {
    let (t, f) = (on_true.into(), on_false.into());
    if let (Operand::Tensor(a), Operand::Tensor(b)) = (t, f)
        && let Some(c) = autocast_inputs(&crate::op_table::r#where, [a, b])?
    {
        return r#where(cond, &c[0], &c[1]);
    }
    let (ht, hf) = (
        match t {
            Operand::Tensor(x) => Some(x.raw()),
            _ => None,
        },
        match f {
            Operand::Tensor(x) => Some(x.raw()),
            _ => None,
        },
    );
    let c = cond.raw();
    let y = crate::raw::binary::r#where(&c, raw_operand(&t, &ht), raw_operand(&f, &hf))?;
    let mut inputs: Vec<&Tensor> = Vec::new();
    let mut which = Vec::new();
    if let Operand::Tensor(x) = t {
        inputs.push(x);
        which.push(true);
    }
    if let Operand::Tensor(x) = f {
        inputs.push(x);
        which.push(false);
    }
    maybe_record("WhereBackward0", y.clone(), &inputs, || {
        Ok(Box::new(move |g: &Raw| {
            which
                .iter()
                .map(|&on_true| {
                    let r = if on_true {
                        crate::raw::binary::r#where(&c, g, 0.0)?
                    } else {
                        crate::raw::binary::r#where(&c, 0.0, g)?
                    };
                    Ok(Some(r))
                })
                .collect()
        }) as BackwardFn)
    })
}
