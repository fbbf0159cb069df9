//! [`Shape`], negative-indexed dims ([`Dim`], [`Dims`]) and NumPy broadcasting.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TensorError};

/// The sizes of a tensor's dimensions, outermost first. Displays as PyTorch lists
/// sizes in errors: `[2, 3]`.
///
/// ```
/// use ember_tensor::Shape;
/// let s = Shape::from([2, 3]);
/// assert_eq!(s.numel(), 6);
/// assert_eq!(s.to_string(), "[2, 3]");
/// assert_eq!(s.contiguous_strides(), vec![3, 1]);
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Shape(SmallDims);

/// Sizes or strides, inline up to rank 4 (no heap allocation for the shapes of
/// almost every tensor: the per-op overhead on small tensors is mostly allocation).
pub(crate) type SmallDims = smallvec::SmallVec<[usize; 4]>;

impl Shape {
    /// The shape of a scalar (rank 0, one element).
    pub fn scalar() -> Self {
        Shape(SmallDims::new())
    }

    /// The sizes.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar). Shapes inside a tensor never overflow; see
    /// [`Shape::checked_numel`] for user-given ones.
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Number of elements, or an error if the product overflows.
    pub fn checked_numel(&self, op: &'static str) -> Result<usize> {
        self.0
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| TensorError::TooLarge {
                op,
                shape: self.to_string(),
            })
    }

    /// Row-major (C-contiguous) strides in elements.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        self.contiguous_strides_inline().into_vec()
    }

    /// [`Shape::contiguous_strides`] without a heap allocation.
    pub(crate) fn contiguous_strides_inline(&self) -> SmallDims {
        let mut strides: SmallDims = smallvec::smallvec![0; self.rank()];
        let mut acc = 1usize;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc = acc.saturating_mul(d.max(1));
        }
        strides
    }

    /// The size of dim `d` (negative counts from the end).
    pub fn dim(&self, d: impl Dim, op: &'static str) -> Result<usize> {
        let i = d.index(self.rank(), op)?;
        Ok(self.0.get(i).copied().unwrap_or(1))
    }

    pub(crate) fn into_vec(self) -> Vec<usize> {
        self.0.into_vec()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(SmallDims::from_vec(v))
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(SmallDims::from_slice(v))
    }
}

impl From<&Vec<usize>> for Shape {
    fn from(v: &Vec<usize>) -> Self {
        Shape(SmallDims::from_slice(v))
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(SmallDims::from_slice(&v))
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(v: &[usize; N]) -> Self {
        Shape(SmallDims::from_slice(v))
    }
}

impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}

impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape::scalar()
    }
}

/// A dimension index as PyTorch takes it: `0..rank`, or negative counting from the end
/// (`-1` is the last dim). Implemented for `usize`, `isize`, `i32` and `i64`, so literals
/// like `-1` work directly.
pub trait Dim: Copy + fmt::Debug {
    /// The dim as a signed number, as given.
    fn as_isize(self) -> isize;

    /// The dim normalised into `0..rank`. A scalar (rank 0) accepts `0` and `-1` as
    /// PyTorch does, both giving 0.
    fn index(self, rank: usize, op: &'static str) -> Result<usize> {
        normalize(self.as_isize(), rank, op)
    }
}

impl Dim for usize {
    fn as_isize(self) -> isize {
        isize::try_from(self).unwrap_or(isize::MAX)
    }
}
impl Dim for isize {
    fn as_isize(self) -> isize {
        self
    }
}
impl Dim for i32 {
    fn as_isize(self) -> isize {
        self as isize
    }
}
impl Dim for i64 {
    fn as_isize(self) -> isize {
        isize::try_from(self).unwrap_or(if self < 0 { isize::MIN } else { isize::MAX })
    }
}

/// Normalises `dim` for a tensor of `rank` dims (scalars behave as rank 1), erroring with
/// PyTorch's "dimension out of range (expected to be in range of [-2, 1], but got 2)".
pub(crate) fn normalize(dim: isize, rank: usize, op: &'static str) -> Result<usize> {
    normalize_in(dim, rank.max(1), op)
}

/// Normalises `dim` into `0..n` where `n` valid positions exist (`rank + 1` for
/// `unsqueeze`).
pub(crate) fn normalize_in(dim: isize, n: usize, op: &'static str) -> Result<usize> {
    let n_i = isize::try_from(n).unwrap_or(isize::MAX);
    let d = if dim < 0 {
        dim.saturating_add(n_i)
    } else {
        dim
    };
    if (0..n_i).contains(&d) {
        Ok(d as usize)
    } else {
        Err(TensorError::DimOutOfRange {
            op,
            dim,
            min: -n_i,
            max: n_i - 1,
        })
    }
}

/// A list of dims: one [`Dim`], an array, a slice or a `Vec` of them.
pub trait Dims {
    /// The dims normalised into `0..rank`, sorted, with duplicates an error.
    fn indices(&self, rank: usize, op: &'static str) -> Result<Vec<usize>>;
}

fn indices_of<D: Dim>(dims: &[D], rank: usize, op: &'static str) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let i = d.index(rank, op)?;
        if out.contains(&i) {
            return Err(TensorError::DuplicateDim { op, dim: i });
        }
        out.push(i);
    }
    out.sort_unstable();
    Ok(out)
}

impl<D: Dim> Dims for D {
    fn indices(&self, rank: usize, op: &'static str) -> Result<Vec<usize>> {
        indices_of(&[*self], rank, op)
    }
}
impl<D: Dim, const N: usize> Dims for [D; N] {
    fn indices(&self, rank: usize, op: &'static str) -> Result<Vec<usize>> {
        indices_of(self, rank, op)
    }
}
impl<D: Dim> Dims for &[D] {
    fn indices(&self, rank: usize, op: &'static str) -> Result<Vec<usize>> {
        indices_of(self, rank, op)
    }
}
impl<D: Dim> Dims for Vec<D> {
    fn indices(&self, rank: usize, op: &'static str) -> Result<Vec<usize>> {
        indices_of(self, rank, op)
    }
}

/// What a reduction reduces over, as PyTorch's `dim=` and `keepdim=` arguments: `()` for
/// every element (`dim=None`), one dim (`1`, `-1`), several (`[0, 1]`, a slice, a `Vec`),
/// and any of these paired with `keepdim` (`(1, true)`, `([0, 1], true)`, `((), true)`),
/// as PyTorch's positional `x.sum((1, True))`. `keepdim` is false unless given.
///
/// ```
/// use ember_tensor::Tensor;
/// let t = Tensor::arange(0, 6, ())?.reshape([2, 3])?;
/// assert_eq!(t.sum(())?.item::<i64>()?, 15);
/// assert_eq!(t.sum(1)?.to_vec::<i64>()?, vec![3, 12]);
/// assert_eq!(t.sum((-1, true))?.dims(), &[2, 1]);
/// assert_eq!(t.sum(([0, 1], true))?.dims(), &[1, 1]);
/// # Ok::<(), ember_tensor::Error>(())
/// ```
pub trait ReduceDims {
    /// The dims to reduce over; `None` for all of them.
    fn dims(&self) -> Option<&dyn Dims>;

    /// Whether reduced dims stay as size 1.
    fn keepdim(&self) -> bool {
        false
    }
}

impl ReduceDims for () {
    fn dims(&self) -> Option<&dyn Dims> {
        None
    }
}
impl<D: Dims> ReduceDims for D {
    fn dims(&self) -> Option<&dyn Dims> {
        Some(self)
    }
}
impl<R: ReduceDims> ReduceDims for (R, bool) {
    fn dims(&self) -> Option<&dyn Dims> {
        self.0.dims()
    }
    fn keepdim(&self) -> bool {
        self.1
    }
}

/// NumPy/PyTorch broadcasting: align trailing dims; each pair must be equal or contain a 1.
///
/// ```
/// use ember_tensor::{broadcast_shape, Shape};
/// let s = broadcast_shape("add", &Shape::from([2, 1, 3]), &Shape::from([4, 1])).unwrap();
/// assert_eq!(s.dims(), &[2, 4, 3]);
/// let e = broadcast_shape("add", &Shape::from([2, 3]), &Shape::from([4])).unwrap_err();
/// assert_eq!(e.to_string(), "add: shapes [2, 3] and [4] cannot be broadcast");
/// ```
pub fn broadcast_shape(op: &'static str, lhs: &Shape, rhs: &Shape) -> Result<Shape> {
    if lhs == rhs {
        return Ok(lhs.clone());
    }
    let (a, b) = (lhs.dims(), rhs.dims());
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, o) in out.iter_mut().enumerate() {
        let da = (i + a.len()).checked_sub(rank).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(TensorError::Broadcast {
                op,
                lhs: lhs.clone(),
                rhs: rhs.clone(),
            });
        };
    }
    Ok(Shape(SmallDims::from_vec(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dim_errors_read_like_pytorch() {
        let e = 2isize.index(2, "sum").unwrap_err();
        assert_eq!(
            e.to_string(),
            "sum: dimension out of range (expected to be in range of [-2, 1], but got 2)"
        );
        assert_eq!((-1).index(3, "x").unwrap(), 2);
        assert_eq!((-1).index(0, "x").unwrap(), 0);
        assert!(1.index(0, "x").is_err());
        assert!(isize::MIN.index(3, "x").is_err());
        assert!(usize::MAX.index(3, "x").is_err());
    }

    #[test]
    fn dims_reject_duplicates() {
        assert_eq!([-1, 0].indices(3, "x").unwrap(), vec![0, 2]);
        assert!([2, -1].indices(3, "x").is_err());
    }

    #[test]
    fn broadcasting_with_zero_and_one() {
        let b = |x: &[usize], y: &[usize]| {
            broadcast_shape("t", &Shape::from(x), &Shape::from(y)).map(|s| s.dims().to_vec())
        };
        assert_eq!(b(&[0, 1], &[3]).unwrap(), vec![0, 3]);
        assert_eq!(b(&[1], &[0]).unwrap(), vec![0]);
        assert_eq!(b(&[], &[2, 2]).unwrap(), vec![2, 2]);
        assert!(b(&[0], &[2]).is_err());
    }
}
