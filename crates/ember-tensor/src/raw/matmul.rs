//! Matrix products with PyTorch's `matmul` rules: 1-D · 1-D is a dot product, a 1-D
//! operand gains (then loses) a dim, and batch dims broadcast.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::raw::{RawTensor, same_device};
use crate::shape::{Shape, broadcast_shape};
use crate::storage::read_many;

impl RawTensor {
    /// `torch.matmul`.
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let a = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], &Device::Cpu)?;
    /// let b = Tensor::ones([3], ())?;
    /// assert_eq!(a.matmul(&b)?.to_vec::<f32>()?, vec![6., 15.]);
    /// let e = a.matmul(&Tensor::ones([4, 5], ())?).unwrap_err();
    /// assert_eq!(e.to_string(), "matmul: cannot multiply [2, 3] by [4, 5]");
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn matmul(&self, rhs: &RawTensor) -> Result<RawTensor> {
        let _op = crate::profile::op("matmul", &[self.as_input(), rhs.as_input()]);
        same_device(&[self, rhs])?;
        let err = || TensorError::MatmulShape {
            op: "matmul",
            lhs: self.shape().clone(),
            rhs: rhs.shape().clone(),
        };
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(TensorError::invalid(
                "matmul",
                format!(
                    "both arguments need at least 1 dimension, but got {} and {}",
                    self.shape(),
                    rhs.shape()
                ),
            ));
        }
        if self.dtype() != rhs.dtype() {
            return Err(TensorError::invalid(
                "matmul",
                format!(
                    "expected both operands to have the same dtype, but got {} and {}",
                    self.dtype(),
                    rhs.dtype()
                ),
            ));
        }
        if self.dtype() == DType::Bool {
            return Err(TensorError::unsupported("matmul", DType::Bool));
        }
        let a = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if rhs.rank() == 1 {
            rhs.unsqueeze(1)?
        } else {
            rhs.clone()
        };
        let (ra, rb) = (a.rank(), b.rank());
        let (m, k) = (a.dims()[ra - 2], a.dims()[ra - 1]);
        let (k2, n) = (b.dims()[rb - 2], b.dims()[rb - 1]);
        if k != k2 {
            return Err(err());
        }
        let batch = broadcast_shape(
            "matmul",
            &Shape::from(&a.dims()[..ra - 2]),
            &Shape::from(&b.dims()[..rb - 2]),
        )
        .map_err(|_| err())?;
        let mut da = batch.dims().to_vec();
        da.extend([m, k]);
        let mut db = batch.dims().to_vec();
        db.extend([k, n]);
        let la = a.layout().broadcast_as("matmul", &da.into())?;
        let lb = b.layout().broadcast_as("matmul", &db.into())?;
        let mut out = batch.dims().to_vec();
        out.extend([m, n]);
        let numel = Shape::from(&out).checked_numel("matmul")?;
        let mut r = if self.device().is_cuda() && !self.dtype().is_float() {
            if k == 0 {
                RawTensor::zeros(out, (self.device(), self.dtype()))?
            } else {
                integer_matmul(&a, &b, k, numel)?
            }
        } else {
            let s = read_many(&[a.cell(), b.cell()], |s| s[0].matmul(&la, s[1], &lb))?;
            RawTensor::from_storage(s, out)
        };
        if self.rank() == 1 {
            r = r.squeeze_dim(-2)?;
        }
        if rhs.rank() == 1 {
            r = r.squeeze_dim(-1)?;
        }
        Ok(r)
    }

    /// Batched matrix product of two 3-D tensors with equal batch size.
    pub fn bmm(&self, rhs: &RawTensor) -> Result<RawTensor> {
        let _op = crate::profile::op("bmm", &[self.as_input(), rhs.as_input()]);
        if self.rank() != 3 || rhs.rank() != 3 || self.dims()[0] != rhs.dims()[0] {
            return Err(TensorError::MatmulShape {
                op: "bmm",
                lhs: self.shape().clone(),
                rhs: rhs.shape().clone(),
            });
        }
        self.matmul(rhs)
    }

    /// Product of two matrices.
    pub fn mm(&self, rhs: &RawTensor) -> Result<RawTensor> {
        let _op = crate::profile::op("mm", &[self.as_input(), rhs.as_input()]);
        if self.rank() != 2 || rhs.rank() != 2 {
            return Err(TensorError::MatmulShape {
                op: "mm",
                lhs: self.shape().clone(),
                rhs: rhs.shape().clone(),
            });
        }
        self.matmul(rhs)
    }
}

/// Note [Integer matmul on CUDA]: cuBLAS has no integer GEMM, but PyTorch computes integer
/// matrix products on CUDA. Ember computes them with its elementwise and reduction kernels:
/// `a[.., m, k]` and `b[.., k, n]` are multiplied as `[.., m, kc, 1] * [.., 1, kc, n]` and
/// summed over `kc`, for chunks of `kc` columns small enough that a chunk's product stays
/// within [`INT_MATMUL_CHUNK`] elements, accumulated in i64 and cast back (so u8 and i32
/// wrap as their GEMMs would). Exact, and far slower than a float GEMM.
const INT_MATMUL_CHUNK: usize = 1 << 22;

/// `a @ b` for integer tensors on a CUDA device (Note [Integer matmul on CUDA]); `a` is
/// `[.., m, k]`, `b` is `[.., k, n]`, their batch dims broadcastable, the result has
/// `numel` elements.
fn integer_matmul(a: &RawTensor, b: &RawTensor, k: usize, numel: usize) -> Result<RawTensor> {
    let dtype = a.dtype();
    let step = (INT_MATMUL_CHUNK / numel.max(1)).clamp(1, k.max(1));
    let (ra, rb) = (a.rank(), b.rank());
    let mut acc: Option<RawTensor> = None;
    let mut start = 0;
    while start < k {
        let len = step.min(k - start);
        let pa = a.narrow(ra - 1, start, len)?.unsqueeze(-1)?;
        let pb = b.narrow(rb - 2, start, len)?.unsqueeze(-3)?;
        let part = pa.mul(&pb)?.sum(-2)?.to_dtype(DType::I64)?;
        acc = Some(match acc {
            None => part,
            Some(t) => t.add(&part)?,
        });
        start += len;
    }
    acc.ok_or_else(|| TensorError::invalid("matmul", "empty inner dimension"))?
        .to_dtype(dtype)
}
