//! Strided matrix views over slices, and the checks that make every later raw access safe.
//!
//! A view is `data` plus a (batch, rows, cols) extent and a stride per dimension, in
//! elements. Element `(b, i, j)` lives at `data[b*batch_stride + i*row_stride +
//! j*col_stride]`. Transposition swaps the two strides; a stride of 0 broadcasts.
//!
//! Architecture Invariant: every function in this crate that touches memory through a raw
//! pointer does so only after [`check_input`] / [`check_output`] accepted the view, so the
//! highest offset reached is inside the slice and (for outputs) no two elements share an
//! address.

use crate::error::{GemmError, Operand};

/// A read-only strided matrix (or batch of matrices) over a slice.
///
/// ```
/// use ember_gemm::MatRef;
/// let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
/// let a = MatRef::row_major(&data, 2, 3); // [[1,2,3],[4,5,6]]
/// let at = a.t(); // 3×2, the same memory
/// assert_eq!((at.rows(), at.cols()), (3, 2));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    pub(crate) data: &'a [T],
    pub(crate) batch: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) batch_stride: usize,
    pub(crate) row_stride: usize,
    pub(crate) col_stride: usize,
}

/// A writable strided matrix (or batch of matrices) over a slice. Its elements must not
/// overlap (checked by every GEMM call).
#[derive(Debug)]
pub struct MatMut<'a, T> {
    pub(crate) data: &'a mut [T],
    pub(crate) batch: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) batch_stride: usize,
    pub(crate) row_stride: usize,
    pub(crate) col_stride: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// A `rows × cols` matrix with explicit strides (in elements). Nothing is checked here;
    /// the GEMM call checks bounds and returns an error for a view that leaves `data`.
    pub fn new(
        data: &'a [T],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        MatRef {
            data,
            batch: 1,
            rows,
            cols,
            batch_stride: 0,
            row_stride,
            col_stride,
        }
    }

    /// A dense row-major `rows × cols` matrix (row stride `cols`, column stride 1).
    pub fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols, 1)
    }

    /// A dense column-major `rows × cols` matrix (row stride 1, column stride `rows`).
    pub fn col_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, 1, rows)
    }

    /// The transpose: the same memory with rows and columns (and their strides) swapped.
    pub fn t(self) -> Self {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// A batch of `batch` matrices, `batch_stride` elements apart (0 repeats one matrix).
    pub fn batched(self, batch: usize, batch_stride: usize) -> Self {
        MatRef {
            batch,
            batch_stride,
            ..self
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Number of matrices in the batch (1 for a plain matrix).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Row, column and batch strides, in elements.
    pub fn strides(&self) -> (usize, usize, usize) {
        (self.row_stride, self.col_stride, self.batch_stride)
    }
}

impl<'a, T> MatMut<'a, T> {
    /// A `rows × cols` output matrix with explicit strides (in elements). Checked by the
    /// GEMM call: inside `data`, and no two elements at the same address.
    pub fn new(
        data: &'a mut [T],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        MatMut {
            data,
            batch: 1,
            rows,
            cols,
            batch_stride: 0,
            row_stride,
            col_stride,
        }
    }

    /// A dense row-major `rows × cols` output.
    pub fn row_major(data: &'a mut [T], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols, 1)
    }

    /// A dense column-major `rows × cols` output.
    pub fn col_major(data: &'a mut [T], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, 1, rows)
    }

    /// The transpose (same memory, strides swapped).
    pub fn t(self) -> Self {
        MatMut {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// A batch of `batch` output matrices, `batch_stride` elements apart.
    pub fn batched(self, batch: usize, batch_stride: usize) -> Self {
        MatMut {
            batch,
            batch_stride,
            ..self
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Number of matrices in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }
}

/// The validated problem: `batch` products of `m × k` by `k × n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Length a slice needs to hold a view of these extents and strides (its highest offset
/// plus one), or `None` when the view holds no element. `Err` on arithmetic overflow, the
/// highest offset `usize::MAX` included.
fn needed_len(extents: [(usize, usize); 3], op: Operand) -> Result<Option<usize>, GemmError> {
    if extents.iter().any(|&(e, _)| e == 0) {
        return Ok(None);
    }
    let mut hi = 0usize;
    for (e, s) in extents {
        hi = (e - 1)
            .checked_mul(s)
            .and_then(|x| x.checked_add(hi))
            .ok_or(GemmError::Overflow { operand: op })?;
    }
    hi.checked_add(1)
        .map(Some)
        .ok_or(GemmError::Overflow { operand: op })
}

/// Checks that an input view stays inside its slice.
pub(crate) fn check_input<T>(
    v: &MatRef<'_, T>,
    batch: usize,
    op: Operand,
) -> Result<(), GemmError> {
    if v.batch != batch && v.batch != 1 {
        return Err(GemmError::BatchMismatch {
            operand: op,
            expected: batch,
            found: v.batch,
        });
    }
    // A batch of 1 broadcasts: its batch stride is never used.
    let b = if v.batch == 1 { 1 } else { batch };
    let ext = [
        (b, v.batch_stride),
        (v.rows, v.row_stride),
        (v.cols, v.col_stride),
    ];
    if let Some(needed) = needed_len(ext, op)?
        && needed > v.data.len()
    {
        return Err(GemmError::OutOfBounds {
            operand: op,
            needed,
            len: v.data.len(),
        });
    }
    Ok(())
}

/// Checks that an output view stays inside its slice and that its elements are distinct.
pub(crate) fn check_output<T>(v: &MatMut<'_, T>) -> Result<(), GemmError> {
    let op = Operand::C;
    let ext = [
        (v.batch, v.batch_stride),
        (v.rows, v.row_stride),
        (v.cols, v.col_stride),
    ];
    let Some(needed) = needed_len(ext, op)? else {
        return Ok(());
    };
    if needed > v.data.len() {
        return Err(GemmError::OutOfBounds {
            operand: op,
            needed,
            len: v.data.len(),
        });
    }
    // Non-overlap: sorted by stride, each stride must pass everything reachable with the
    // smaller ones (a sufficient condition; it accepts every dense and sliced layout).
    let mut dims: Vec<(usize, usize)> = ext.into_iter().filter(|&(e, _)| e > 1).collect();
    dims.sort_by_key(|&(_, s)| s);
    let mut reach = 0usize; // highest offset reachable with the dimensions seen so far
    for (e, s) in dims {
        if s <= reach || s == 0 {
            return Err(GemmError::OverlappingOutput {
                batch: v.batch,
                rows: v.rows,
                cols: v.cols,
                strides: (v.batch_stride, v.row_stride, v.col_stride),
            });
        }
        reach += (e - 1) * s; // cannot overflow: below `needed`
    }
    Ok(())
}

/// Checks a whole problem: shapes agree, views are in bounds, the output does not overlap.
pub(crate) fn check_problem<A, C>(
    a: &MatRef<'_, A>,
    b: &MatRef<'_, A>,
    c: &MatMut<'_, C>,
) -> Result<Problem, GemmError> {
    let p = Problem {
        batch: c.batch,
        m: c.rows,
        n: c.cols,
        k: a.cols,
    };
    if a.rows != p.m || b.cols != p.n || b.rows != p.k {
        return Err(GemmError::ShapeMismatch {
            a: (a.rows, a.cols),
            b: (b.rows, b.cols),
            c: (c.rows, c.cols),
        });
    }
    check_input(a, p.batch, Operand::A)?;
    check_input(b, p.batch, Operand::B)?;
    check_output(c)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_overlap() {
        let d = [0f32; 12];
        assert!(check_input(&MatRef::row_major(&d, 3, 4), 1, Operand::A).is_ok());
        assert!(check_input(&MatRef::row_major(&d, 4, 4), 1, Operand::A).is_err());
        assert!(check_input(&MatRef::row_major(&d, 0, 100), 1, Operand::A).is_ok());
        assert!(check_input(&MatRef::new(&d, 2, 2, usize::MAX, 1), 1, Operand::A).is_err());
        let mut o = [0f32; 12];
        assert!(check_output(&MatMut::row_major(&mut o, 3, 4)).is_ok());
        assert!(check_output(&MatMut::col_major(&mut o, 3, 4)).is_ok());
        assert!(check_output(&MatMut::new(&mut o, 3, 4, 0, 1)).is_err());
        assert!(check_output(&MatMut::new(&mut o, 3, 4, 2, 1)).is_err());
        assert!(check_output(&MatMut::new(&mut o, 1, 4, 0, 1)).is_ok());
        assert!(check_output(&MatMut::row_major(&mut o, 2, 3).batched(2, 6)).is_ok());
        assert!(check_output(&MatMut::row_major(&mut o, 2, 3).batched(2, 0)).is_err());
    }
}
