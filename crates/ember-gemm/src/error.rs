//! The crate's error type.

use std::fmt;

/// Which operand of `C = alpha·A·B + beta·C` an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// The left factor.
    A,
    /// The right factor.
    B,
    /// The output.
    C,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operand::A => "A",
            Operand::B => "B",
            Operand::C => "C",
        })
    }
}

/// Everything a GEMM call can reject. Bad sizes or strides are errors, never panics.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum GemmError {
    /// The three shapes do not fit `(m×k)·(k×n) → (m×n)`.
    #[error(
        "gemm: shapes do not fit (m×k)·(k×n) → (m×n): A is {}×{}, B is {}×{}, C is {}×{}",
        a.0, a.1, b.0, b.1, c.0, c.1
    )]
    ShapeMismatch {
        /// Rows and columns of A.
        a: (usize, usize),
        /// Rows and columns of B.
        b: (usize, usize),
        /// Rows and columns of C.
        c: (usize, usize),
    },
    /// An input's batch is neither C's batch nor 1 (broadcast).
    #[error("gemm: operand {operand} has a batch of {found}, expected {expected} (C's batch) or 1")]
    BatchMismatch {
        /// The operand.
        operand: Operand,
        /// C's batch.
        expected: usize,
        /// The operand's batch.
        found: usize,
    },
    /// A view reaches past the end of its slice.
    #[error(
        "gemm: operand {operand} needs {needed} elements for its shape and strides, but its slice holds {len}"
    )]
    OutOfBounds {
        /// The operand.
        operand: Operand,
        /// Highest offset reached plus one.
        needed: usize,
        /// Length of the slice.
        len: usize,
    },
    /// Offsets overflow `usize`.
    #[error("gemm: operand {operand}'s shape and strides overflow the address space")]
    Overflow {
        /// The operand.
        operand: Operand,
    },
    /// Two elements of the output share an address.
    #[error(
        "gemm: output elements overlap (batch {batch}, {rows}×{cols}, strides batch/row/col {strides:?}); give C distinct elements, e.g. a contiguous buffer"
    )]
    OverlappingOutput {
        /// C's batch.
        batch: usize,
        /// C's rows.
        rows: usize,
        /// C's columns.
        cols: usize,
        /// C's (batch, row, column) strides.
        strides: (usize, usize, usize),
    },
    /// The requested backend cannot run here.
    #[error("gemm: backend {backend} is not available: {reason}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: &'static str,
        /// Why it is absent (and what to do).
        reason: String,
    },
    /// An `EMBER_CPU_BLAS` value that is not one of the known names.
    #[error("gemm: EMBER_CPU_BLAS={0:?} is not one of auto, rust, mkl")]
    BadPreference(String),
}
