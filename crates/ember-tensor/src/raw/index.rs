//! Indexing: `index_select`, `gather`, `scatter_add`, `masked_fill`, `one_hot`,
//! `embedding`.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::raw::{RawTensor, same_device};
use crate::scalar::Scalar;
use crate::shape::Dim;
use crate::storage::read_many;

fn check_index_dtype(op: &'static str, idx: &RawTensor) -> Result<()> {
    match idx.dtype() {
        DType::I64 | DType::I32 => Ok(()),
        found => Err(TensorError::IndexDType { op, found }),
    }
}

impl RawTensor {
    /// The entries of `dim` at the 1-D (or 0-D) `indices` (i64 or i32).
    ///
    /// ```
    /// use ember_tensor::{Device, Tensor};
    /// let t = Tensor::arange(0, 6, ())?.reshape([3, 2])?;
    /// let i = Tensor::new(&[2i64, 0], &Device::Cpu)?;
    /// assert_eq!(t.index_select(0, &i)?.to_vec2::<i64>()?, vec![vec![4, 5], vec![0, 1]]);
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn index_select(&self, dim: impl Dim, indices: &RawTensor) -> Result<RawTensor> {
        let _op = crate::profile::op("index_select", &[self.as_input(), indices.as_input()]);
        same_device(&[self, indices])?;
        check_index_dtype("index_select", indices)?;
        if indices.rank() > 1 {
            return Err(TensorError::invalid(
                "index_select",
                "index_select(): index should be a vector",
            ));
        }
        let base = if self.rank() == 0 {
            self.reshape([1usize])?
        } else {
            self.clone()
        };
        let d = dim.index(base.rank(), "index_select")?;
        let s = read_many(&[base.cell(), indices.cell()], |s| {
            s[0].index_select(base.layout(), d, s[1], indices.layout())
        })?;
        let mut dims = base.dims().to_vec();
        dims[d] = indices.numel();
        let out = RawTensor::from_storage(s, dims);
        if self.rank() == 0 {
            out.reshape(indices.shape())
        } else {
            Ok(out)
        }
    }

    /// `torch.gather`: `out[i][j] = self[index[i][j]][j]` for `dim = 0`; `index` has this
    /// tensor's rank and no larger size than it outside `dim`.
    pub fn gather(&self, dim: impl Dim, index: &RawTensor) -> Result<RawTensor> {
        let _op = crate::profile::op("gather", &[self.as_input(), index.as_input()]);
        same_device(&[self, index])?;
        check_index_dtype("gather", index)?;
        let d = dim.index(self.rank(), "gather")?;
        self.check_index_shape("gather", d, index, None)?;
        if self.rank() == 0 {
            return self
                .reshape([1usize])?
                .gather(0, &index.reshape([index.numel()])?)?
                .reshape(index.shape());
        }
        let s = read_many(&[self.cell(), index.cell()], |s| {
            s[0].gather(self.layout(), d, s[1], index.layout())
        })?;
        Ok(RawTensor::from_storage(s, index.shape()))
    }

    fn check_index_shape(
        &self,
        op: &'static str,
        d: usize,
        index: &RawTensor,
        src: Option<&RawTensor>,
    ) -> Result<()> {
        let rank = self.rank().max(1);
        let bad = |msg: String| Err(TensorError::ShapeMismatch { op, msg });
        if index.rank().max(1) != rank {
            return bad(format!(
                "index {} and input {} must have the same number of dims",
                index.shape(),
                self.shape()
            ));
        }
        for (i, &sz) in index.dims().iter().enumerate() {
            if i != d && sz > self.dims().get(i).copied().unwrap_or(1) {
                return bad(format!(
                    "size of index {} exceeds input {} at dim {i}",
                    index.shape(),
                    self.shape()
                ));
            }
            if let Some(s) = src
                && sz > s.dims().get(i).copied().unwrap_or(1)
            {
                return bad(format!(
                    "size of index {} exceeds src {} at dim {i}",
                    index.shape(),
                    s.shape()
                ));
            }
        }
        Ok(())
    }

    /// `torch.scatter_add` (out of place): a copy with `src[i][j]` added at
    /// `[index[i][j]][j]` for `dim = 0`. The embedding backward.
    pub fn scatter_add(
        &self,
        dim: impl Dim,
        index: &RawTensor,
        src: &RawTensor,
    ) -> Result<RawTensor> {
        let _op = crate::profile::op(
            "scatter_add",
            &[self.as_input(), index.as_input(), src.as_input()],
        );
        same_device(&[self, index, src])?;
        check_index_dtype("scatter_add", index)?;
        if self.rank() == 0 {
            return self
                .reshape([1usize])?
                .scatter_add(
                    0,
                    &index.reshape([index.numel()])?,
                    &src.reshape([src.numel()])?,
                )?
                .reshape(self.shape());
        }
        let d = dim.index(self.rank(), "scatter_add")?;
        if src.rank() != self.rank() {
            return Err(TensorError::ShapeMismatch {
                op: "scatter_add",
                msg: format!(
                    "src {} and self {} must have the same number of dims",
                    src.shape(),
                    self.shape()
                ),
            });
        }
        self.check_index_shape("scatter_add", d, index, Some(src))?;
        let src = src.to_dtype(self.dtype())?;
        let mut sl = src.layout().clone();
        for (i, &sz) in index.dims().iter().enumerate() {
            sl = sl.narrow(i, 0, sz)?;
        }
        let s = read_many(&[self.cell(), index.cell(), src.cell()], |s| {
            s[0].scatter_add(self.layout(), d, s[1], index.layout(), s[2], &sl)
        })?;
        Ok(RawTensor::from_storage(s, self.shape()))
    }

    /// `value` where `mask` (bool, broadcastable to this shape) is true; keeps this dtype.
    pub fn masked_fill(&self, mask: &RawTensor, value: impl Into<Scalar>) -> Result<RawTensor> {
        let _op = crate::profile::op(
            "masked_fill",
            &[
                self.as_input(),
                mask.as_input(),
                crate::profile::Input::Scalar,
            ],
        );
        if mask.dtype() != DType::Bool {
            return Err(TensorError::DTypeMismatch {
                op: "masked_fill",
                expected: DType::Bool,
                found: mask.dtype(),
            });
        }
        let v = RawTensor::scalar_of(value.into(), self.dtype(), self.device())?;
        let r = crate::raw::binary::r#where(mask, &v, self)?;
        if r.shape() != self.shape() {
            return Err(TensorError::Broadcast {
                op: "masked_fill",
                lhs: self.shape().clone(),
                rhs: mask.shape().clone(),
            });
        }
        Ok(r)
    }

    /// `torch.nn.functional.one_hot`: an i64 tensor with a new last dim of
    /// `num_classes` (`None`: max + 1). Values must lie in `[0, num_classes)`.
    pub fn one_hot(&self, num_classes: Option<usize>) -> Result<RawTensor> {
        let _op = crate::profile::op1("one_hot", self);
        if self.dtype() != DType::I64 {
            return Err(TensorError::DTypeMismatch {
                op: "one_hot",
                expected: DType::I64,
                found: self.dtype(),
            });
        }
        if self.numel() > 0 && self.min_all()?.item::<i64>()? < 0 {
            return Err(TensorError::invalid(
                "one_hot",
                "Class values must be non-negative.",
            ));
        }
        let max = if self.numel() > 0 {
            self.max_all()?.item::<i64>()?
        } else {
            -1
        };
        let c = match num_classes {
            Some(c) => {
                if max >= c as i64 {
                    return Err(TensorError::invalid(
                        "one_hot",
                        "Class values must be smaller than num_classes.",
                    ));
                }
                c
            }
            None if self.numel() == 0 => {
                return Err(TensorError::invalid(
                    "one_hot",
                    "can not infer total number of classes from empty tensor.",
                ));
            }
            None => (max + 1) as usize,
        };
        let classes = RawTensor::arange(0, c as i64, (self.device(), DType::I64))?;
        self.unsqueeze(-1)?.eq(&classes)?.to_dtype(DType::I64)
    }

    /// Embedding lookup: rows of this `[num, dim]` weight at `indices` (any shape), giving
    /// `indices.shape + [dim]`.
    pub fn embedding(&self, indices: &RawTensor) -> Result<RawTensor> {
        let _op = crate::profile::op("embedding", &[self.as_input(), indices.as_input()]);
        self.check_rank("embedding", 2)?;
        let flat = indices.reshape([indices.numel()])?;
        let rows = self.index_select(0, &flat)?;
        let mut dims = indices.dims().to_vec();
        dims.push(self.dims()[1]);
        rows.reshape(dims)
    }
}
