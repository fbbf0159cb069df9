//! Matrix products: `matmul` (PyTorch's rules: 1-D, 2-D, batched with broadcast batch
//! dims), `mm`, `bmm`, `addmm`. Autocast is consulted here (Note [Autocast hook]).

use crate::{RawTensor as Raw, Scalar};

use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, Saved, needs_grad, record};
use crate::autograd::mode::autocast_inputs;
use crate::tensor::Tensor;

/// The matrix form of an operand's dims: 1-D gets a unit dim (`[k]` → `[1, k]` on the
/// left, `[k, 1]` on the right).
fn matrix_dims(d: &[usize], left: bool) -> Vec<usize> {
    match (d.len(), left) {
        (1, true) => vec![1, d[0]],
        (1, false) => vec![d[0], 1],
        _ => d.to_vec(),
    }
}

/// Whether a 2-D operand is a transposed (column-major) view, like `weight.t()` in
/// `Linear`: its gradient is then computed transposed so that it comes out in the same
/// layout (PyTorch's `mm_mat1_backward`/`mm_mat2_backward`), and the gradient reaching
/// the parameter through `t()`'s backward is contiguous rather than a strided view every
/// later op (the optimizer's included) would have to walk or copy.
fn column_major(t: &Raw) -> bool {
    t.rank() == 2 && t.strides()[0] == 1 && t.strides()[1] != 1 && t.dims()[0] > 1
}

/// Gradients of `matmul(a, b)` for the output gradient `g`: `g @ bᵀ` for `a` (needs only
/// `b`) and `aᵀ @ g` for `b` (needs only `a`), summed over broadcast batch dims. For a 2-D
/// column-major operand (see [`column_major`]) its gradient is `(b @ gᵀ)ᵀ` or `(gᵀ @ a)ᵀ`:
/// the same values, in that operand's layout.
fn matmul_grads(
    g: &Raw,
    a: Option<&Raw>,
    a_dims: &[usize],
    a_column_major: bool,
    b: Option<&Raw>,
    b_dims: &[usize],
    b_column_major: bool,
) -> Result<(Option<Raw>, Option<Raw>)> {
    // `g` in the shape of the product of the matrix forms.
    let g2 = match (a_dims.len(), b_dims.len()) {
        (1, 1) => g.reshape([1usize, 1])?,
        (1, _) => g.unsqueeze(-2)?,
        (_, 1) => g.unsqueeze(-1)?,
        _ => g.clone(),
    };
    let (a2, b2) = (matrix_dims(a_dims, true), matrix_dims(b_dims, false));
    let ga = match b {
        Some(b) => {
            let b = b.reshape(&b2[..])?;
            let ga = if a_column_major && a_dims.len() == 2 && b_dims.len() == 2 {
                b.matmul(&g2.t()?)?.t()?
            } else {
                g2.matmul(&b.transpose(-2, -1)?)?
            };
            Some(crate::autograd::engine::sum_to(&ga, &a2)?.reshape(a_dims)?)
        }
        None => None,
    };
    let gb = match a {
        // A batched `a` against a 2-D `b` (a linear layer on `[B, T, C]`): the batch dims
        // fold into rows, so `b`'s gradient is one `[K, rows] @ [rows, N]` product, as
        // PyTorch computes it, not a batch of products summed afterwards by a strided
        // reduction.
        Some(a) if b_dims.len() == 2 && a_dims.len() > 2 => {
            let (k, n) = (b_dims[0], b_dims[1]);
            let rows = a.numel() / k.max(1);
            let (af, gf) = (a.reshape([rows, k])?, g2.reshape([rows, n])?);
            let gb = if b_column_major {
                gf.t()?.matmul(&af)?.t()?
            } else {
                af.t()?.matmul(&gf)?
            };
            Some(gb)
        }
        Some(a) => {
            let a = a.reshape(&a2[..])?;
            let gb = if b_column_major && a_dims.len() == 2 && b_dims.len() == 2 {
                g2.t()?.matmul(&a)?.t()?
            } else {
                a.transpose(-2, -1)?.matmul(&g2)?
            };
            Some(crate::autograd::engine::sum_to(&gb, &b2)?.reshape(b_dims)?)
        }
        None => None,
    };
    Ok((ga, gb))
}

impl Tensor {
    /// Matrix product with PyTorch's rules (1-D, 2-D, batched with broadcast batch dims).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.product(&crate::op_table::matmul, "MmBackward0", rhs, |a, b| {
            a.matmul(b)
        })
    }

    /// 2-D matrix product.
    pub fn mm(&self, rhs: &Tensor) -> Result<Tensor> {
        self.product(&crate::op_table::mm, "MmBackward0", rhs, |a, b| a.mm(b))
    }

    /// Batched matrix product of two 3-D tensors.
    pub fn bmm(&self, rhs: &Tensor) -> Result<Tensor> {
        self.product(&crate::op_table::bmm, "BmmBackward0", rhs, |a, b| a.bmm(b))
    }

    fn product(
        &self,
        op: &'static crate::OpInfo,
        name: &'static str,
        rhs: &Tensor,
        f: impl Fn(&Raw, &Raw) -> std::result::Result<Raw, crate::TensorError>,
    ) -> Result<Tensor> {
        if let Some(c) = autocast_inputs(op, [self, rhs])? {
            return c[0].product(op, name, &c[1], f);
        }
        let (a, b) = (self.raw(), rhs.raw());
        let y = f(&a, &b)?;
        if !needs_grad(&[self, rhs]) {
            return Ok(Tensor::wrap(y));
        }
        let need = (self.requires_grad(), rhs.requires_grad());
        // Each side's gradient needs the other side only.
        let sa = if need.1 {
            Some(Saved::of(name, self)?)
        } else {
            None
        };
        let sb = if need.0 {
            Some(Saved::of(name, rhs)?)
        } else {
            None
        };
        let (a_dims, b_dims) = (a.dims().to_vec(), b.dims().to_vec());
        let (a_cm, b_cm) = (column_major(&a), column_major(&b));
        let f: BackwardFn = Box::new(move |g| {
            let a = sa.as_ref().map(Saved::get).transpose()?;
            let b = sb.as_ref().map(Saved::get).transpose()?;
            let (ga, gb) = matmul_grads(g, a.as_ref(), &a_dims, a_cm, b.as_ref(), &b_dims, b_cm)?;
            Ok(vec![ga, gb])
        });
        Ok(record(name, y, &[self, rhs], f))
    }

    /// `self + m1 @ m2`, as `torch.addmm` with its default `beta = alpha = 1` (`self`
    /// broadcasts to the product's shape).
    pub fn addmm(&self, m1: &Tensor, m2: &Tensor) -> Result<Tensor> {
        self.addmm_scaled(m1, m2, 1, 1)
    }

    /// `beta * self + alpha * (m1 @ m2)`, as `torch.addmm(self, m1, m2, beta=, alpha=)`.
    pub fn addmm_scaled(
        &self,
        m1: &Tensor,
        m2: &Tensor,
        beta: impl Into<Scalar>,
        alpha: impl Into<Scalar>,
    ) -> Result<Tensor> {
        let (beta, alpha) = (beta.into(), alpha.into());
        if let Some(c) = autocast_inputs(&crate::op_table::addmm, [self, m1, m2])? {
            return c[0].addmm_scaled(&c[1], &c[2], beta, alpha);
        }
        let one = |s: Scalar| s.to_f64() == 1.0;
        let p = m1.mm(m2)?;
        let p = if one(alpha) { p } else { p.mul(alpha)? };
        let r = if one(beta) {
            p.add(self)?
        } else {
            p.add(&self.mul(beta)?)?
        };
        if r.dims() != p.dims() {
            return Err(crate::TensorError::Broadcast {
                op: "addmm",
                lhs: self.shape(),
                rhs: p.shape(),
            }
            .into());
        }
        Ok(r)
    }
}
