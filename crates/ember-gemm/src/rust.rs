//! The pure-Rust backend: the `gemm` crate (0.19, feature `x86-v4` for its AVX-512
//! kernels; it picks them, or its AVX2/FMA ones, at run time), which takes any strides.
//! Always available.

use crate::split::RawGemm;

/// Which threading the pure-Rust backend uses for one product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RustThreads {
    /// The `gemm` crate's own rayon parallelism inside one call.
    Internal(usize),
    /// One sequential `gemm` call per block (`crate::split`).
    Sequential,
}

/// `C = alpha·A·B + beta·C` with the `gemm` crate. With `beta == 0`, C is never read.
///
/// # Safety
/// `g` must come from checked views (see [`RawGemm`]) and no other thread may touch C's
/// elements during the call.
pub(crate) unsafe fn sgemm(g: RawGemm<f32>, threads: RustThreads) {
    if g.m == 0 || g.n == 0 {
        return;
    }
    let par = match threads {
        RustThreads::Internal(t) if t > 1 => gemm::Parallelism::Rayon(t),
        _ => gemm::Parallelism::None,
    };
    // The `gemm` crate computes `dst = alpha·dst + beta·lhs·rhs`: its alpha is our beta and
    // the other way round; `read_dst = false` means dst is written without being read.
    let read_dst = g.beta != 0.0;
    // SAFETY: the caller's contract: every pointer addresses memory valid for the extents
    // and strides given (all of them fit `isize`, being offsets inside slices), C is not
    // aliased by A or B (it is a distinct `&mut` slice), and C's elements are distinct.
    unsafe {
        gemm::gemm(
            g.m,
            g.n,
            g.k,
            g.c,
            g.c_cs as isize,
            g.c_rs as isize,
            read_dst,
            g.a,
            g.a_cs as isize,
            g.a_rs as isize,
            g.b,
            g.b_cs as isize,
            g.b_rs as isize,
            g.beta,
            g.alpha,
            false,
            false,
            false,
            par,
        );
    }
}
