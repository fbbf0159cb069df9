//! [`Layout`]: shape, strides (in elements) and start offset of a strided view, and the
//! pure layout transforms behind every view op.
//!
//! Architecture invariant: for a layout over a storage of `len` elements, every element the
//! layout can address is `< len` (checked where views are made: transforms only shrink or
//! re-order the reachable set, except `broadcast_as`, which only adds stride-0 dims).

use crate::error::{Result, TensorError};
use crate::shape::{Shape, SmallDims, normalize, normalize_in};
use crate::strided::StridedIndex;

/// How a tensor's elements sit in its storage.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Shape,
    strides: SmallDims,
    offset: usize,
}

impl Layout {
    /// A row-major layout of `shape` starting at element 0.
    pub fn contiguous(shape: impl Into<Shape>) -> Self {
        let shape = shape.into();
        let strides = shape.contiguous_strides_inline();
        Layout {
            shape,
            strides,
            offset: 0,
        }
    }

    /// A layout from its parts (crate-internal: callers keep the storage-bounds invariant).
    pub(crate) fn new(shape: Shape, strides: Vec<usize>, offset: usize) -> Self {
        Self::new_inline(shape, SmallDims::from_vec(strides), offset)
    }

    /// [`Layout::new`] with inline strides (no heap allocation up to rank 4, `SmallDims`).
    pub(crate) fn new_inline(shape: Shape, strides: SmallDims, offset: usize) -> Self {
        Layout {
            shape,
            strides,
            offset,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The sizes.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// The strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The offset of the first element in the storage, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// PyTorch's `is_contiguous`: row-major, where dims of size 1 may have any stride and
    /// an empty tensor is always contiguous.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1usize;
        for (&d, &s) in self.dims().iter().zip(&self.strides).rev() {
            if d != 1 {
                if s != expected {
                    return false;
                }
                expected *= d;
            }
        }
        true
    }

    /// `Some((start, end))` of the storage range when the layout is contiguous.
    pub fn contiguous_range(&self) -> Option<(usize, usize)> {
        self.is_contiguous()
            .then(|| (self.offset, self.offset + self.numel()))
    }

    /// One past the largest storage index this layout reaches (`offset` when empty).
    pub fn max_extent(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        self.offset
            + self
                .dims()
                .iter()
                .zip(&self.strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// `true` if two distinct indices can address the same element: a dim of size > 1 with
    /// stride 0 (an expanded view). In-place writes refuse such layouts.
    pub fn has_internal_overlap(&self) -> bool {
        self.dims()
            .iter()
            .zip(&self.strides)
            .any(|(&d, &s)| d > 1 && s == 0)
    }

    /// Iterator over the storage indices of the elements in row-major order.
    pub fn strided_index(&self) -> StridedIndex<'_> {
        StridedIndex::new(self)
    }

    // --- transforms ----------------------------------------------------------------------

    /// Broadcast to `target` (expanded dims get stride 0).
    pub fn broadcast_as(&self, op: &'static str, target: &Shape) -> Result<Layout> {
        // Same shape: nothing to expand (the common case of elementwise ops).
        if self.shape == *target {
            return Ok(self.clone());
        }
        let err = || TensorError::ShapeMismatch {
            op,
            msg: format!(
                "the expanded size of the tensor must match the existing size at non-singleton dims: cannot expand {} to {}",
                self.shape, target
            ),
        };
        let (src, dst) = (self.dims(), target.dims());
        if dst.len() < src.len() {
            return Err(err());
        }
        let extra = dst.len() - src.len();
        let mut strides: SmallDims = smallvec::smallvec![0; dst.len()];
        for (i, &d) in dst.iter().enumerate().skip(extra) {
            let (sd, ss) = (src[i - extra], self.strides[i - extra]);
            strides[i] = if sd == d {
                ss
            } else if sd == 1 {
                0
            } else {
                return Err(err());
            };
        }
        Ok(Layout::new_inline(target.clone(), strides, self.offset))
    }

    /// Reorder dims: `perm[i]` is the source dim of output dim `i`.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let rank = self.rank();
        if perm.len() != rank {
            return Err(TensorError::invalid(
                "permute",
                format!(
                    "number of dims don't match: the tensor has {rank} dims but {} were given",
                    perm.len()
                ),
            ));
        }
        let mut seen = vec![false; rank];
        for &p in perm {
            if p >= rank {
                return Err(TensorError::DimOutOfRange {
                    op: "permute",
                    dim: p as isize,
                    min: -(rank as isize),
                    max: rank as isize - 1,
                });
            }
            if std::mem::replace(&mut seen[p], true) {
                return Err(TensorError::DuplicateDim {
                    op: "permute",
                    dim: p,
                });
            }
        }
        let dims = perm.iter().map(|&p| self.dims()[p]).collect::<Vec<_>>();
        let strides: SmallDims = perm.iter().map(|&p| self.strides[p]).collect();
        Ok(Layout::new_inline(dims.into(), strides, self.offset))
    }

    /// Swap two (normalised) dims.
    pub(crate) fn transpose(&self, d0: usize, d1: usize) -> Layout {
        let mut l = self.clone();
        if self.rank() > 0 {
            let mut dims = l.shape.into_vec();
            dims.swap(d0, d1);
            l.strides.swap(d0, d1);
            l.shape = dims.into();
        }
        l
    }

    /// Keep `len` elements of (normalised) `dim` starting at `start`.
    pub(crate) fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        let size = self.dims()[dim];
        if start.checked_add(len).is_none_or(|e| e > size) {
            return Err(TensorError::invalid(
                "narrow",
                format!("start ({start}) + length ({len}) exceeds dimension size ({size})"),
            ));
        }
        let mut dims = self.dims().to_vec();
        dims[dim] = len;
        let offset = if len == 0 {
            self.offset
        } else {
            self.offset + start * self.strides[dim]
        };
        Ok(Layout::new_inline(
            dims.into(),
            self.strides.clone(),
            offset,
        ))
    }

    /// Python-style `start:end:step` on (normalised) `dim`; `start`/`end` may be negative
    /// and are clamped, `step` must be positive.
    pub(crate) fn slice(
        &self,
        dim: usize,
        start: Option<isize>,
        end: Option<isize>,
        step: usize,
    ) -> Result<Layout> {
        if step == 0 {
            return Err(TensorError::invalid("slice", "slice step must be positive"));
        }
        let size = self.dims()[dim] as isize;
        let clamp = |v: isize| {
            let v = if v < 0 { v.saturating_add(size) } else { v };
            v.clamp(0, size) as usize
        };
        let s = start.map_or(0, clamp);
        let e = end.map_or(size as usize, clamp).max(s);
        let len = (e - s).div_ceil(step);
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims[dim] = len;
        let offset = if len == 0 {
            self.offset
        } else {
            self.offset + s * strides[dim]
        };
        strides[dim] = strides[dim].saturating_mul(step);
        if len <= 1 {
            // The stride of a dim of size <= 1 is never used; keep it small.
            strides[dim] = self.strides[dim];
        }
        Ok(Layout::new_inline(dims.into(), strides, offset))
    }

    /// Remove (normalised) `dim` by taking index `index` (negative counts from the end).
    pub(crate) fn select(&self, dim: usize, index: isize) -> Result<Layout> {
        let size = self.dims()[dim];
        let i = if index < 0 {
            index.checked_add(size as isize)
        } else {
            Some(index)
        };
        let i = match i {
            Some(i) if (0..size as isize).contains(&i) => i as usize,
            _ => {
                return Err(TensorError::IndexOutOfRange {
                    op: "select",
                    index: index as i64,
                    dim,
                    size,
                });
            }
        };
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        let offset = self.offset + i * strides[dim];
        dims.remove(dim);
        strides.remove(dim);
        Ok(Layout::new_inline(dims.into(), strides, offset))
    }

    /// Drop the given (normalised) dims where their size is 1 (others stay, as PyTorch).
    pub(crate) fn squeeze(&self, dims: &[usize]) -> Layout {
        let (mut d, mut s) = (Vec::new(), Vec::new());
        for (i, (&size, &stride)) in self.dims().iter().zip(&self.strides).enumerate() {
            if !(size == 1 && dims.contains(&i)) {
                d.push(size);
                s.push(stride);
            }
        }
        Layout::new(d.into(), s, self.offset)
    }

    /// Insert a size-1 dim at `dim` (`dim` in `[-rank-1, rank]`).
    pub(crate) fn unsqueeze(&self, dim: isize) -> Result<Layout> {
        let rank = self.rank();
        let d = normalize_in(dim, rank + 1, "unsqueeze")?;
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        let stride = if d < rank { dims[d] * strides[d] } else { 1 };
        dims.insert(d, 1);
        strides.insert(d, stride);
        Ok(Layout::new_inline(dims.into(), strides, self.offset))
    }

    /// PyTorch's `computeStride`: strides that view this layout as `new_shape` without
    /// copying, if they exist. `new_shape` has the same number of elements.
    pub(crate) fn view_strides(&self, new_shape: &Shape) -> Option<Vec<usize>> {
        let (old, old_st, new) = (self.dims(), &self.strides, new_shape.dims());
        if old.is_empty() {
            return Some(vec![1; new.len()]);
        }
        if self.numel() == 0 {
            return Some(if old == new {
                old_st.to_vec()
            } else {
                new_shape.contiguous_strides()
            });
        }
        let mut new_st = vec![0usize; new.len()];
        let mut view_d = new.len() as isize - 1;
        let mut chunk_base = *old_st.last()?;
        let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
        for td in (0..old.len()).rev() {
            tensor_numel *= old[td];
            if td == 0 || (old[td - 1] != 1 && old_st[td - 1] != tensor_numel * chunk_base) {
                while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                    new_st[view_d as usize] = view_numel * chunk_base;
                    view_numel *= new[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if td > 0 {
                    chunk_base = old_st[td - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        (view_d == -1).then_some(new_st)
    }
}

/// Resolves a user shape with at most one `-1` against `numel` (PyTorch's `infer_size`).
pub(crate) fn infer_size(op: &'static str, spec: &[isize], numel: usize) -> Result<Shape> {
    let bad = || TensorError::ElementCount {
        op,
        shape: format!("{spec:?}"),
        numel,
    };
    let mut infer = None;
    let mut known = 1usize;
    let mut dims = Vec::with_capacity(spec.len());
    for (i, &d) in spec.iter().enumerate() {
        if d == -1 {
            if infer.replace(i).is_some() {
                return Err(TensorError::invalid(
                    op,
                    "only one dimension can be inferred",
                ));
            }
            dims.push(0);
        } else if d < 0 {
            return Err(TensorError::invalid(
                op,
                format!("invalid shape dimension {d}"),
            ));
        } else {
            known = known.checked_mul(d as usize).ok_or_else(bad)?;
            dims.push(d as usize);
        }
    }
    match infer {
        Some(i) => {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(bad());
            }
            dims[i] = numel / known;
        }
        None if known != numel => return Err(bad()),
        None => {}
    }
    Ok(dims.into())
}

/// Normalised dim or the crate's PyTorch-worded error (re-exported helper for views).
pub(crate) fn norm_dim(dim: isize, rank: usize, op: &'static str) -> Result<usize> {
    normalize(dim, rank, op)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(d: &[usize]) -> Layout {
        Layout::contiguous(d)
    }

    #[test]
    fn contiguity_ignores_size_one_dims() {
        assert!(l(&[2, 3]).is_contiguous());
        assert!(!l(&[2, 3]).transpose(0, 1).is_contiguous());
        assert!(l(&[1, 3]).transpose(0, 1).is_contiguous());
        assert!(l(&[0, 3]).transpose(0, 1).is_contiguous());
    }

    #[test]
    fn view_strides_follow_compute_stride() {
        let t = l(&[2, 3, 4]).transpose(1, 2); // [2, 4, 3] strides [12, 1, 4]
        assert_eq!(t.view_strides(&[2, 12].into()), None);
        assert_eq!(
            t.view_strides(&[2, 4, 3, 1].into()),
            Some(vec![12, 1, 4, 4])
        );
        assert_eq!(
            l(&[4, 6]).view_strides(&[2, 2, 6].into()),
            Some(vec![12, 6, 1])
        );
        let n = l(&[4, 6]).narrow(1, 0, 3).unwrap(); // [4, 3] strides [6, 1]
        assert_eq!(n.view_strides(&[2, 2, 3].into()), Some(vec![12, 6, 1]));
        assert_eq!(n.view_strides(&[12].into()), None);
        assert_eq!(l(&[]).view_strides(&[1, 1].into()), Some(vec![1, 1]));
    }

    #[test]
    fn slice_is_pythonic() {
        let s = l(&[10]).slice(0, Some(1), Some(-1), 3).unwrap();
        assert_eq!(
            (s.dims(), s.strides(), s.offset()),
            (&[3usize][..], &[3usize][..], 1)
        );
        let e = l(&[10]).slice(0, Some(8), Some(2), 1).unwrap();
        assert_eq!(e.dims(), &[0]);
        assert!(l(&[3]).slice(0, None, None, 0).is_err());
    }

    #[test]
    fn infer_size_rules() {
        assert_eq!(infer_size("r", &[-1, 3], 6).unwrap().dims(), &[2, 3]);
        assert!(infer_size("r", &[-1, -1], 6).is_err());
        assert!(infer_size("r", &[-1, 0], 0).is_err());
        assert_eq!(
            infer_size("reshape", &[4, 2], 6).unwrap_err().to_string(),
            "reshape: shape [4, 2] is invalid for input of size 6"
        );
    }
}
