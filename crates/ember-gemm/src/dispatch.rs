//! The public GEMM entry points: check once, pick a backend, stage 16-bit data where a
//! backend lacks it, run.

use crate::amx;
use crate::backend::{Backend, Preference, auto_uses_mkl, preference};
use crate::dpbf16;
use crate::elem::{DType, Element};
use crate::error::GemmError;
use crate::layout::{MatMut, MatRef, Problem, check_problem};
use crate::mkl::{self, Mkl};
use crate::packed;
use crate::rust::{self, RustThreads};
use crate::split::{self, RawGemm};

/// How many threads one product may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Parallelism {
    /// The calling thread only.
    None,
    /// Up to this many tasks, run by the parallel loop's team (`crate::parallel`), or by
    /// rayon's pool when called on one of its threads; `Rayon(0)` means as many as rayon's
    /// current pool has threads. MKL runs sequentially inside these tasks.
    Rayon(usize),
    /// As `Rayon(0)`.
    #[default]
    All,
}

impl Parallelism {
    fn threads(self) -> usize {
        match self {
            Parallelism::None => 1,
            Parallelism::Rayon(0) | Parallelism::All => rayon::current_num_threads(),
            Parallelism::Rayon(n) => n,
        }
    }
}

/// `C ← alpha·A·B + beta·C` on the backend `EMBER_CPU_BLAS` selects (auto: MKL where it is
/// present and takes the operands, else the pure-Rust kernels). Returns the backend used.
///
/// Shapes come from the views: A is `m×k`, B `k×n`, C `m×n`; a batch of C's size, with
/// inputs of batch 1 broadcast. Products accumulate in f32 whatever `T` and `O` are; a
/// 16-bit C is rounded once at the end. With `beta == 0`, C is written without being read
/// (NaN there does not propagate).
///
/// ```
/// use ember_gemm::{MatMut, MatRef, Parallelism, gemm};
/// let a = [1.0f32, 2.0, 3.0, 4.0]; // [[1,2],[3,4]]
/// let b = [5.0f32, 6.0, 7.0, 8.0];
/// let mut c = [f32::NAN; 4];
/// gemm(MatRef::row_major(&a, 2, 2), MatRef::row_major(&b, 2, 2),
///      MatMut::row_major(&mut c, 2, 2), 1.0, 0.0, Parallelism::None)?;
/// assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
/// # Ok::<(), ember_gemm::GemmError>(())
/// ```
pub fn gemm<T: Element, O: Element>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: MatMut<'_, O>,
    alpha: f32,
    beta: f32,
    par: Parallelism,
) -> Result<Backend, GemmError> {
    let forced = match preference()? {
        Preference::Auto => None,
        Preference::Rust => Some(Backend::Rust),
        Preference::Mkl => Some(Backend::Mkl),
    };
    gemm_impl(forced, a, b, c, alpha, beta, par)
}

/// As [`gemm`], on the given backend whatever `EMBER_CPU_BLAS` says; fails with
/// [`GemmError::BackendUnavailable`] when it is absent. Operands MKL cannot take (no unit
/// stride) run on Rust, and the returned value says so.
pub fn gemm_with<T: Element, O: Element>(
    backend: Backend,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: MatMut<'_, O>,
    alpha: f32,
    beta: f32,
    par: Parallelism,
) -> Result<Backend, GemmError> {
    gemm_impl(Some(backend), a, b, c, alpha, beta, par)
}

/// [`gemm`] for f32 operands.
pub fn gemm_f32(
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    c: MatMut<'_, f32>,
    alpha: f32,
    beta: f32,
    par: Parallelism,
) -> Result<Backend, GemmError> {
    gemm(a, b, c, alpha, beta, par)
}

/// At most this many multiply-adds, `auto` runs f32 products on the Rust backend.
const AUTO_RUST_MAX_MACS: usize = 128 * 128 * 128;

fn gemm_impl<T: Element, O: Element>(
    forced: Option<Backend>,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    mut c: MatMut<'_, O>,
    alpha: f32,
    beta: f32,
    par: Parallelism,
) -> Result<Backend, GemmError> {
    let p = check_problem(&a, &b, &c)?;
    let mkl = match forced {
        Some(Backend::Rust) => None,
        Some(Backend::Mkl) => Some(mkl::get().map_err(|reason| GemmError::BackendUnavailable {
            backend: "mkl",
            reason: reason.to_string(),
        })?),
        // Auto: MKL on Intel CPUs (Note [MKL on Intel only]), except small f32 products
        // where the Rust kernels were ahead (`matmul_f32_n128`, docs/performance.md).
        None if !auto_uses_mkl() => None,
        None if T::DTYPE == DType::F32 && p.m * p.n * p.k <= AUTO_RUST_MAX_MACS => None,
        None => mkl::get().ok(),
    };
    let threads = par.threads().max(1);
    let label = if mkl.is_some() {
        Backend::Mkl
    } else {
        Backend::Rust
    };
    if p.batch == 0 || p.m == 0 || p.n == 0 {
        return Ok(label);
    }
    // Large bf16 products with a 16-bit C on MKL: Note [Packed 16-bit panels].
    if let Some(m) = mkl
        && packed::try_run(m, p, &a, &b, &mut c, alpha, beta, threads)
    {
        return Ok(Backend::Mkl);
    }
    let MatMut {
        data,
        batch,
        rows,
        cols,
        batch_stride,
        row_stride,
        col_stride,
    } = c;
    if let Some(data) = O::as_f32_mut(data) {
        let c32 = MatMut {
            data,
            batch,
            rows,
            cols,
            batch_stride,
            row_stride,
            col_stride,
        };
        return Ok(into_f32(mkl, p, a, b, c32, alpha, beta, threads));
    }
    // A 16-bit C otherwise: accumulate into a dense f32 copy (scratch reused per thread),
    // round once.
    let (m, n) = (p.m, p.n);
    let len = p.batch * m * n;
    let dense = col_stride == 1 && row_stride == n && (batch == 1 || batch_stride == m * n);
    let at = |bi: usize, i: usize, j: usize| bi * batch_stride + i * row_stride + j * col_stride;
    // The scratch is not cleared: with `beta == 0` every backend writes C without reading
    // it, so stale values of an earlier call are never seen (and 16 MB of zeros cost 1-2 ms
    // of a 2048³ bf16 product).
    let used = with_f32_scratch(len, |tmp| {
        if beta != 0.0 {
            if dense {
                convert_chunks(&mut tmp[..len], CONVERT_TASK, threads, |i, t| {
                    let start = i * CONVERT_TASK;
                    O::widen_slice(&data[start..start + t.len()], t);
                });
            } else {
                for bi in 0..p.batch {
                    for i in 0..m {
                        for j in 0..n {
                            tmp[(bi * m + i) * n + j] = data[at(bi, i, j)].to_f32();
                        }
                    }
                }
            }
        }
        let staged = MatMut::row_major(&mut *tmp, m, n).batched(p.batch, m * n);
        let used = into_f32(mkl, p, a, b, staged, alpha, beta, threads);
        if dense {
            convert_chunks(&mut data[..len], CONVERT_TASK, threads, |i, d| {
                let start = i * CONVERT_TASK;
                O::narrow_slice(&tmp[start..start + d.len()], d);
            });
        } else {
            for bi in 0..p.batch {
                for i in 0..m {
                    for j in 0..n {
                        data[at(bi, i, j)] = O::from_f32(tmp[(bi * m + i) * n + j]);
                    }
                }
            }
        }
        used
    });
    Ok(used)
}

/// Elements per task when 16-bit data is widened or rounded in parallel.
const CONVERT_TASK: usize = 1 << 16;

/// `f(i, piece)` over `chunk`-long pieces of `out`: in parallel when `threads > 1`.
fn convert_chunks<T: Send>(
    out: &mut [T],
    chunk: usize,
    threads: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if threads > 1 {
        crate::parallel::for_each_chunk_mut(out, chunk, f);
    } else {
        out.chunks_mut(chunk.max(1))
            .enumerate()
            .for_each(|(i, p)| f(i, p));
    }
}

thread_local! {
    /// This thread's f32 scratch (see [`with_f32_scratch`]), kept between calls (no fresh
    /// pages).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's f32 scratch of `len` elements: grown, never shrunk or cleared
/// (callers write before they read). It is taken out while `f` runs, so a nested use on the
/// same thread (rayon may run another product's task while this one waits) gets a buffer of
/// its own; the larger of the two is kept. Serves the staging of a 16-bit C here and the
/// panels of `packed`.
pub(crate) fn with_f32_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let out = f(&mut buf[..len]);
    SCRATCH.with(|s| {
        let mut kept = s.borrow_mut();
        if kept.len() < buf.len() {
            *kept = buf;
        }
    });
    out
}

/// A view of the same shape and strides over other data.
fn rebind<'b, T, U>(v: &MatRef<'_, T>, data: &'b [U]) -> MatRef<'b, U> {
    MatRef {
        data,
        batch: v.batch,
        rows: v.rows,
        cols: v.cols,
        batch_stride: v.batch_stride,
        row_stride: v.row_stride,
        col_stride: v.col_stride,
    }
}

/// A dense row-major f32 copy of a (checked) view, keeping a batch of 1 as 1; rows in
/// parallel when there are `threads` and enough of them.
fn dense_f32<T: Element>(v: &MatRef<'_, T>, batch: usize, threads: usize) -> Vec<f32> {
    let nb = if v.batch == 1 { 1 } else { batch };
    let cols = v.cols;
    let mut out = vec![0.0f32; nb * v.rows * cols];
    if cols == 0 {
        return out;
    }
    let widen_row = |r: usize, dst: &mut [f32]| {
        let (bi, i) = (r / v.rows, r % v.rows);
        let start = bi * v.batch_stride + i * v.row_stride;
        if v.col_stride == 1 {
            T::widen_slice(&v.data[start..start + cols], dst);
        } else {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = v.data[start + j * v.col_stride].to_f32();
            }
        }
    };
    let rows_per_task = (CONVERT_TASK / cols).max(1);
    convert_chunks(&mut out, rows_per_task * cols, threads, |t, rows| {
        for (r, dst) in rows.chunks_mut(cols).enumerate() {
            widen_row(t * rows_per_task + r, dst);
        }
    });
    out
}

/// Runs a checked, non-empty problem with an f32 C; returns the backend used.
#[allow(clippy::too_many_arguments)]
fn into_f32<T: Element>(
    mkl: Option<&Mkl>,
    p: Problem,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    mut c: MatMut<'_, f32>,
    alpha: f32,
    beta: f32,
    threads: usize,
) -> Backend {
    if p.k == 0 {
        scale(&mut c, beta);
        return if mkl.is_some() {
            Backend::Mkl
        } else {
            Backend::Rust
        };
    }
    if let (Some(a32), Some(b32)) = (T::as_f32(a.data), T::as_f32(b.data)) {
        return f32_path(
            mkl,
            p,
            rebind(&a, a32),
            rebind(&b, b32),
            c,
            alpha,
            beta,
            threads,
        );
    }
    // 16-bit inputs: MKL's own 16-bit product where it has one and takes the layout.
    if let (Some(m), Some(abits), Some(bbits)) = (mkl, T::as_bits(a.data), T::as_bits(b.data)) {
        let bf16 = T::DTYPE == DType::Bf16;
        if (bf16 && m.has_bf16()) || (!bf16 && m.has_f16()) {
            let (a16, b16) = (rebind(&a, abits), rebind(&b, bbits));
            if let Some(gs) = mkl_batch(p, &a16, &b16, &mut c, alpha, beta) {
                let kernel = |g: RawGemm<u16>| {
                    // SAFETY: `g` is a block of a product built from checked views and
                    // accepted by `mkl::accepts` (`mkl_batch`); blocks write disjoint C.
                    unsafe { m.hgemm(g, bf16) };
                };
                // SAFETY: `gs` come from checked views with disjoint C per member.
                unsafe { split::run_batch(&gs, threads, &kernel) };
                return Backend::Mkl;
            }
        }
    }
    // bf16 on AMX (Note [AMX tiles]) or AVX-512 BF16 (Note [bf16 dot products]), any
    // layout.
    if T::DTYPE == DType::Bf16
        && dpbf16::available()
        && let (Some(abits), Some(bbits)) = (T::as_bits(a.data), T::as_bits(b.data))
    {
        let (a16, b16) = (rebind(&a, abits), rebind(&b, bbits));
        let gs: Vec<RawGemm<u16>> = (0..p.batch)
            .map(|i| RawGemm::from_views(&a16, &b16, &mut c, i, alpha, beta))
            .collect();
        let use_amx = amx::available();
        let kernel = |g: RawGemm<u16>| {
            // SAFETY: `g` is a block of a product built from checked views, blocks write
            // disjoint C, and `dpbf16::available()` held above (`amx::available()` where
            // it is used).
            unsafe {
                if use_amx {
                    amx::gemm(g);
                } else {
                    dpbf16::gemm(g);
                }
            };
        };
        // SAFETY: `gs` come from checked views with disjoint C per member.
        unsafe { split::run_batch(&gs, threads, &kernel) };
        return Backend::Rust;
    }
    // Otherwise widen to dense f32 and run the f32 path.
    let (ad, bd) = (
        dense_f32(&a, p.batch, threads),
        dense_f32(&b, p.batch, threads),
    );
    let a32 = MatRef::row_major(&ad, p.m, p.k).batched(a.batch, p.m * p.k);
    let b32 = MatRef::row_major(&bd, p.k, p.n).batched(b.batch, p.k * p.n);
    f32_path(mkl, p, a32, b32, c, alpha, beta, threads)
}

/// `C ← beta·C`, with `beta == 0` writing zeros without reading.
fn scale(c: &mut MatMut<'_, f32>, beta: f32) {
    for bi in 0..c.batch {
        for i in 0..c.rows {
            for j in 0..c.cols {
                let x = &mut c.data[bi * c.batch_stride + i * c.row_stride + j * c.col_stride];
                *x = if beta == 0.0 { 0.0 } else { beta * *x };
            }
        }
    }
}

/// The batch as MKL-ready products (C transposed where it is column-major), or `None` when
/// some operand has no unit stride or a size leaves MKL's `int`.
fn mkl_batch<T>(
    p: Problem,
    a: &MatRef<'_, T>,
    b: &MatRef<'_, T>,
    c: &mut MatMut<'_, f32>,
    alpha: f32,
    beta: f32,
) -> Option<Vec<RawGemm<T>>> {
    (0..p.batch)
        .map(|i| {
            let g = RawGemm::from_views(a, b, c, i, alpha, beta);
            if mkl::accepts(&g) {
                Some(g)
            } else if mkl::accepts(&g.transposed()) {
                Some(g.transposed())
            } else {
                None
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn f32_path(
    mkl: Option<&Mkl>,
    p: Problem,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    mut c: MatMut<'_, f32>,
    alpha: f32,
    beta: f32,
    threads: usize,
) -> Backend {
    if let Some(m) = mkl
        && let Some(gs) = mkl_batch(p, &a, &b, &mut c, alpha, beta)
    {
        let kernel = |g: RawGemm<f32>| {
            // SAFETY: `g` is a block of a product built from checked views and accepted by
            // `mkl::accepts` (`mkl_batch`); blocks write disjoint parts of C.
            unsafe { m.sgemm(g) };
        };
        // SAFETY: `gs` come from checked views with disjoint C per member.
        unsafe { split::run_batch(&gs, threads, &kernel) };
        return Backend::Mkl;
    }
    let gs: Vec<RawGemm<f32>> = (0..p.batch)
        .map(|i| RawGemm::from_views(&a, &b, &mut c, i, alpha, beta))
        .collect();
    let seq = |g: RawGemm<f32>| {
        // SAFETY: `g` is a block of a product built from checked views; blocks write
        // disjoint parts of C.
        unsafe { rust::sgemm(g, RustThreads::Sequential) };
    };
    if rust_split() || gs.len() > 1 {
        // SAFETY: `gs` come from checked views with disjoint C per member.
        unsafe { split::run_batch(&gs, threads, &seq) };
    } else {
        for g in gs {
            // SAFETY: built from checked views; this thread is the only writer of C.
            unsafe { rust::sgemm(g, RustThreads::Internal(threads)) };
        }
    }
    Backend::Rust
}

/// Whether the Rust backend cuts a product into independent blocks (true) or lets the
/// `gemm` crate share one product between threads (false). `EMBER_GEMM_RUST_SPLIT=0|1`
/// overrides the default, for benchmarking.
fn rust_split() -> bool {
    static SPLIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SPLIT.get_or_init(|| match std::env::var("EMBER_GEMM_RUST_SPLIT").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        // Independent blocks were ahead of the crate's own threading on most shapes and
        // level elsewhere (Note [Independent blocks], docs/cpu-gemm.md).
        _ => true,
    })
}
