//! `triu` and `tril`: the upper and lower triangles of the last two dims, composed from
//! recorded ops (a row/column comparison of two `arange`s and `masked_fill`), so the
//! gradient is the incoming one with the same entries zeroed, on every device and dtype.

use crate::autograd::error::Result;
use crate::error::TensorError;
use crate::tensor::Tensor;
use crate::{DType, Options};

impl Tensor {
    /// `torch.triu(input, diagonal)`: the entries on and above diagonal `diagonal` of each
    /// matrix in the last two dims (`j - i >= diagonal`), zeros elsewhere; batched over the
    /// leading dims, any dtype. `diagonal` 0 is the main diagonal, positive above it,
    /// negative below.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let x = Tensor::ones([2, 3], ())?;
    /// assert_eq!(x.triu(0)?.to_vec::<f32>()?, vec![1., 1., 1., 0., 1., 1.]);
    /// assert_eq!(x.triu(1)?.to_vec::<f32>()?, vec![0., 1., 1., 0., 0., 1.]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        // Masked out where j - i < diagonal.
        let offsets = self.triangle_offsets("triu")?;
        self.masked_fill(&offsets.lt(diagonal)?, 0)
    }

    /// `torch.tril(input, diagonal)`: the entries on and below diagonal `diagonal` of each
    /// matrix in the last two dims (`j - i <= diagonal`), zeros elsewhere; batched, any
    /// dtype.
    ///
    /// ```
    /// use ember_tensor::Tensor;
    /// let x = Tensor::ones([3, 2], ())?;
    /// assert_eq!(x.tril(0)?.to_vec::<f32>()?, vec![1., 0., 1., 1., 1., 1.]);
    /// assert_eq!(x.tril(-1)?.to_vec::<f32>()?, vec![0., 0., 1., 0., 1., 1.]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        // Masked out where j - i > diagonal.
        let offsets = self.triangle_offsets("tril")?;
        self.masked_fill(&offsets.gt(diagonal)?, 0)
    }

    /// `j - i` (i64) for the `[rows, cols]` of the last two dims, on this tensor's device.
    fn triangle_offsets(&self, op: &'static str) -> Result<Tensor> {
        let dims = self.dims();
        let rank = dims.len();
        if rank < 2 {
            return Err(TensorError::invalid(
                op,
                format!(
                    "input tensor must have at least 2 dimensions, found shape {}",
                    self.shape()
                ),
            )
            .into());
        }
        let (rows, cols) = (dims[rank - 2], dims[rank - 1]);
        let opts = Options::from((self.device(), DType::I64));
        let i = Tensor::arange(0i64, rows as i64, opts)?.reshape([rows, 1])?;
        let j = Tensor::arange(0i64, cols as i64, opts)?.reshape([1, cols])?;
        j.sub(&i)
    }
}
