//! One product as raw pointers, and how a product (or a batch of them) is cut into
//! independent blocks run by sequential kernels on the calling thread and the parallel
//! loop's helpers (`crate::parallel`, Notes [The caller joins the loop], [A team that
//! spins]).
//!
//! Note [Independent blocks]:
//! With few cores, coordinating threads inside one product (shared packing, per-block
//! barriers, wake-ups) costs more than it saves: two independent single-thread products
//! side by side ran clearly faster than one two-thread product (docs/cpu-gemm.md). So a
//! product is cut into `threads` blocks of whole rows of C (or
//! whole columns, whichever is longer), each a complete sequential GEMM on one thread;
//! each block packs its own copy of the shared operand, which costs little next to the
//! arithmetic once a block is large. Batches with at least `threads` members go one whole
//! product per task instead.

use crate::layout::{MatMut, MatRef};

/// One product `C = alpha·A·B + beta·C` (A `m×k`, B `k×n`, C `m×n`, f32 C) as raw pointers
/// and strides in elements.
///
/// Built only by [`RawGemm::from_views`] from views that `layout::check_problem` accepted,
/// then narrowed to blocks of itself, so every pointer it holds addresses memory that is
/// valid for its extent.
#[derive(Debug)]
pub(crate) struct RawGemm<T> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const T,
    pub a_rs: usize,
    pub a_cs: usize,
    pub b: *const T,
    pub b_rs: usize,
    pub b_cs: usize,
    pub c: *mut f32,
    pub c_rs: usize,
    pub c_cs: usize,
    pub alpha: f32,
    pub beta: f32,
}

impl<T> Clone for RawGemm<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for RawGemm<T> {}

// SAFETY: a `RawGemm` is handed to other threads only by `run`, which gives each thread a
// block of C disjoint from every other (C's elements are distinct: `check_output`), while A
// and B are only read.
unsafe impl<T: Sync> Send for RawGemm<T> {}
// SAFETY: as above; shared references never write through the pointers.
unsafe impl<T: Sync> Sync for RawGemm<T> {}

impl<T> RawGemm<T> {
    /// The product for batch member `i` of checked views (inputs with a batch of 1
    /// broadcast). Pointer arithmetic wraps, so this is safe; the views' checks make the
    /// results addresses inside the slices.
    pub fn from_views(
        a: &MatRef<'_, T>,
        b: &MatRef<'_, T>,
        c: &mut MatMut<'_, f32>,
        i: usize,
        alpha: f32,
        beta: f32,
    ) -> Self {
        let ai = if a.batch == 1 { 0 } else { i * a.batch_stride };
        let bi = if b.batch == 1 { 0 } else { i * b.batch_stride };
        RawGemm {
            m: c.rows,
            n: c.cols,
            k: a.cols,
            a: a.data.as_ptr().wrapping_add(ai),
            a_rs: a.row_stride,
            a_cs: a.col_stride,
            b: b.data.as_ptr().wrapping_add(bi),
            b_rs: b.row_stride,
            b_cs: b.col_stride,
            c: c.data.as_mut_ptr().wrapping_add(i * c.batch_stride),
            c_rs: c.row_stride,
            c_cs: c.col_stride,
            alpha,
            beta,
        }
    }

    /// The same product on the transposed problem: `Cᵀ = Bᵀ·Aᵀ`.
    pub fn transposed(self) -> Self {
        RawGemm {
            m: self.n,
            n: self.m,
            a: self.b,
            a_rs: self.b_cs,
            a_cs: self.b_rs,
            b: self.a,
            b_rs: self.a_cs,
            b_cs: self.a_rs,
            c_rs: self.c_cs,
            c_cs: self.c_rs,
            ..self
        }
    }

    /// Rows `r0..r1` of C.
    fn rows(self, r0: usize, r1: usize) -> Self {
        RawGemm {
            m: r1 - r0,
            a: self.a.wrapping_add(r0 * self.a_rs),
            c: self.c.wrapping_add(r0 * self.c_rs),
            ..self
        }
    }

    /// Columns `c0..c1` of C.
    fn cols(self, c0: usize, c1: usize) -> Self {
        RawGemm {
            n: c1 - c0,
            b: self.b.wrapping_add(c0 * self.b_cs),
            c: self.c.wrapping_add(c0 * self.c_cs),
            ..self
        }
    }

    /// Multiply-adds in this product.
    pub fn flops(&self) -> usize {
        self.m.saturating_mul(self.n).saturating_mul(self.k)
    }
}

/// Below this many multiply-adds a product runs on one thread (a wake-up costs more).
pub(crate) const PARALLEL_MIN_MACS: usize = 1 << 17;

/// Block boundaries: `len` cut into `parts` pieces, multiples of `align` except the last.
fn cuts(len: usize, parts: usize, align: usize) -> Vec<usize> {
    let mut out = vec![0];
    for p in 1..parts {
        let x = (len * p / parts).div_ceil(align) * align;
        out.push(x.min(len));
    }
    out.push(len);
    out.dedup();
    out
}

/// Runs `g` as `threads` tasks (`crate::parallel::for_each_index`), each a sequential `kernel` on a block of C. See
/// Note [Independent blocks].
///
/// # Safety
/// `g` must come from checked views (see [`RawGemm`]), and `kernel` must be safe to call
/// on any block of `g`.
pub(crate) unsafe fn run<T: Sync>(
    g: RawGemm<T>,
    threads: usize,
    kernel: &(dyn Fn(RawGemm<T>) + Sync),
) {
    if threads <= 1 || g.flops() < PARALLEL_MIN_MACS {
        kernel(g);
        return;
    }
    let blocks: Vec<RawGemm<T>> = if g.n >= g.m {
        cuts(g.n, threads, 16)
            .windows(2)
            .map(|w| g.cols(w[0], w[1]))
            .collect()
    } else {
        cuts(g.m, threads, 8)
            .windows(2)
            .map(|w| g.rows(w[0], w[1]))
            .collect()
    };
    crate::parallel::for_each_index(blocks.len(), |i| {
        if let Some(&blk) = blocks.get(i) {
            kernel(blk);
        }
    });
}

/// Runs a batch: whole products per task when there are at least `threads` of them (or they
/// are small), else one product after another, each cut into blocks.
///
/// # Safety
/// As for [`run`], for every member of `gs`; the members' C blocks must be disjoint.
pub(crate) unsafe fn run_batch<T: Sync>(
    gs: &[RawGemm<T>],
    threads: usize,
    kernel: &(dyn Fn(RawGemm<T>) + Sync),
) {
    let Some(first) = gs.first() else { return };
    if threads > 1 && gs.len() > 1 && (gs.len() >= threads || first.flops() < PARALLEL_MIN_MACS) {
        crate::parallel::for_each_index(gs.len(), |i| {
            if let Some(&g) = gs.get(i) {
                kernel(g);
            }
        });
    } else {
        for &g in gs {
            // SAFETY: the caller's contract, per member.
            unsafe { run(g, threads, kernel) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_cover() {
        assert_eq!(cuts(100, 2, 16), vec![0, 64, 100]);
        assert_eq!(cuts(10, 2, 16), vec![0, 10]);
        assert_eq!(cuts(512, 2, 16), vec![0, 256, 512]);
        assert_eq!(cuts(0, 3, 8), vec![0]);
    }
}
