//! Large bf16 products with a 16-bit C on MKL: B packed once and shared, C computed in
//! panels of rows whose f32 accumulators stay in L2 and are rounded straight into C.
//!
//! Note [Packed 16-bit panels]:
//! The general path for a 16-bit C (`dispatch`) stages all of C in f32, runs one
//! sequential MKL call per thread on a block of it (Note [Independent blocks]), and then
//! rounds the staging into C. For bf16 at n = 2048 that staging is 16 MB that MKL's
//! k-blocked kernel reads and writes once per k block, from memory, on both threads at
//! once, and each thread packs its own copy of B: it gained little from a second thread,
//! where PyTorch (oneDNN, which keeps accumulators in AMX tiles and writes bf16 once)
//! nearly doubled. Here B is packed once with MKL's `_pack` (shared, read-only), and each
//! task takes panels of `panel_rows` rows of C: `_compute` writes the panel's f32
//! accumulators into the thread's f32 scratch (`dispatch::with_f32_scratch`), at most
//! ~1 MB of it (so that it stays in a 2 MB L2), which is then rounded into C while it is
//! still in cache. `matmul_bf16_n2048` in docs/performance.md measures it.

use std::cell::RefCell;

use crate::dispatch::with_f32_scratch;
use crate::elem::{DType, Element};
use crate::layout::{MatMut, MatRef, Problem};
use crate::mkl::{self, Mkl, PackedHgemm};
use crate::split::RawGemm;

/// Below this many multiply-adds the general path is used (packing B once gains nothing).
pub(crate) const PACKED_MIN_MACS: usize = 1 << 24;

/// f32 accumulators per panel: 256 Ki (1 MB).
const PANEL_ELEMS: usize = 1 << 18;

thread_local! {
    /// The calling thread's packed B (grown, never shrunk).
    static PACKED_B: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// Rows per panel for rows of `n` columns: a multiple of 16 (AMX tile rows), 16 to 256.
fn panel_rows(n: usize) -> usize {
    ((PANEL_ELEMS / n.max(1)) / 16 * 16).clamp(16, 256)
}

/// Runs `C ← alpha·A·B + beta·C` for bf16 A and B and a 16-bit C by Note [Packed 16-bit
/// panels] when this product suits it (MKL has the packed bf16 product, C's rows are dense,
/// the product is large); returns false, having done nothing, otherwise. The views must have
/// passed `check_problem` (giving `p`), with `p.k > 0`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn try_run<T: Element, O: Element>(
    mkl: &Mkl,
    p: Problem,
    a: &MatRef<'_, T>,
    b: &MatRef<'_, T>,
    c: &mut MatMut<'_, O>,
    alpha: f32,
    beta: f32,
    threads: usize,
) -> bool {
    let (Some(abits), Some(bbits)) = (T::as_bits(a.data), T::as_bits(b.data)) else {
        return false;
    };
    // bf16 only: see `mkl::open` for f16.
    let Some(fns) = mkl.packed_bf16().filter(|_| T::DTYPE == DType::Bf16) else {
        return false;
    };
    let rows = panel_rows(p.n);
    // Every check MKL's entry points make, done here for the whole product, so that no
    // panel or packing below can refuse after C has been partly written (a fallback would
    // then apply beta twice). Panels take fewer rows of the same A, which these accept too.
    let suits = O::DTYPE != DType::F32
        && p.k > 0
        && c.col_stride == 1
        && c.row_stride >= p.n
        && p.m >= 2 * rows
        && p.m.saturating_mul(p.n).saturating_mul(p.k) >= PACKED_MIN_MACS
        && mkl::blas_op(p.m, p.k, a.row_stride, a.col_stride).is_some()
        && mkl::blas_op(p.k, p.n, b.row_stride, b.col_stride).is_some();
    if !suits {
        return false;
    }
    let Some(len) = fns.packed_b_len(p.m, p.n, p.k) else {
        return false;
    };
    let mut packed = PACKED_B.with(|s| std::mem::take(&mut *s.borrow_mut()));
    if packed.len() < len {
        packed.resize(len, 0);
    }
    let mut done = true;
    let mut packed_member = None;
    for i in 0..p.batch {
        let bi = if b.batch == 1 { 0 } else { i * b.batch_stride };
        // B (k × n) of member `i` as MKL's packing sees it; A and C come per panel.
        let g = RawGemm::<u16> {
            m: p.m,
            n: p.n,
            k: p.k,
            a: abits.as_ptr(),
            a_rs: a.row_stride,
            a_cs: a.col_stride,
            b: bbits.as_ptr().wrapping_add(bi),
            b_rs: b.row_stride,
            b_cs: b.col_stride,
            c: std::ptr::null_mut(),
            c_rs: p.n,
            c_cs: 1,
            alpha,
            beta,
        };
        if packed_member != Some(bi) {
            // SAFETY: `g`'s B is member `i` of a view checked by `check_problem`.
            // Cannot refuse: B's layout and the sizes were checked above.
            if !unsafe { fns.pack_b(&g, &mut packed[..len]) } {
                done = false;
                break;
            }
            packed_member = Some(bi);
        }
        let ai = if a.batch == 1 { 0 } else { i * a.batch_stride };
        let ci = i * c.batch_stride;
        let member = Member {
            fns,
            g,
            a: &abits[ai..],
            packed: &packed[..len],
            rows,
        };
        if !member.run(&mut c.data[ci..], c.row_stride, threads) {
            // Unreachable: A's layout and the sizes were checked above.
            done = false;
            break;
        }
    }
    PACKED_B.with(|s| *s.borrow_mut() = packed);
    done
}

/// One batch member: its A (from its first element), packed B, and panel size.
struct Member<'a> {
    fns: PackedHgemm,
    /// Sizes, strides, alpha and beta (its pointers are replaced per panel).
    g: RawGemm<u16>,
    a: &'a [u16],
    packed: &'a [u16],
    rows: usize,
}

impl Member<'_> {
    /// Splits C (from the member's first element, rows `ldc` apart) into panels and runs
    /// them as up to `threads` tasks of the parallel loop (`crate::parallel`).
    fn run<O: Element>(&self, c: &mut [O], ldc: usize, threads: usize) -> bool {
        let (m, n) = (self.g.m, self.g.n);
        // Row r of C is c[r·ldc .. r·ldc + n]; the views' check keeps it inside `c`.
        let mut rows: Vec<&mut [O]> = c.chunks_mut(ldc).take(m).map(|r| &mut r[..n]).collect();
        let mut panels: Vec<(usize, &mut [&mut [O]])> = rows
            .chunks_mut(self.rows)
            .enumerate()
            .map(|(i, p)| (i * self.rows, p))
            .collect();
        let threads = threads.max(1);
        if threads == 1 {
            return panels.iter_mut().all(|(r0, p)| self.panel(*r0, p));
        }
        // Contiguous groups of panels, one task each (panels are equal but the last).
        let per_task = panels.len().div_ceil(threads).max(1);
        let ok = std::sync::atomic::AtomicBool::new(true);
        crate::parallel::for_each_chunk_mut(&mut panels, per_task, |_, group| {
            for (r0, p) in group.iter_mut() {
                if !self.panel(*r0, p) {
                    ok.store(false, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        ok.into_inner()
    }

    /// Rows `r0..r0 + out.len()` of C: accumulate in the thread's f32 scratch, round into
    /// `out` (reading `out` first when beta is not zero).
    fn panel<O: Element>(&self, r0: usize, out: &mut [&mut [O]]) -> bool {
        let (rows, n) = (out.len(), self.g.n);
        with_f32_scratch(rows * n, |acc| {
            if self.g.beta != 0.0 {
                for (dst, src) in acc.chunks_mut(n).zip(out.iter()) {
                    O::widen_slice(src, dst);
                }
            }
            let g = RawGemm {
                m: rows,
                a: self.a.as_ptr().wrapping_add(r0 * self.g.a_rs),
                c: acc.as_mut_ptr(),
                ..self.g
            };
            // SAFETY: A's rows `r0..r0 + rows` lie in the checked view (`self.a` starts at
            // the member's A); C is `acc`, `rows × n` row-major, owned by this thread;
            // `self.packed` was packed by `self.fns` for this member's B (same n, k).
            if !unsafe { self.fns.compute(g, self.packed) } {
                return false;
            }
            for (dst, src) in out.iter_mut().zip(acc.chunks(n)) {
                O::narrow_slice(src, dst);
            }
            true
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::layout::check_problem;
    use half::{bf16, f16};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// One configuration through `try_run` (which must take it) against an f64 reference
    /// over the rounded inputs: transposed operands, padded C rows, batches with B shared
    /// or not, alpha and beta, one thread and two.
    fn check<T: Element>(
        ta: bool,
        tb: bool,
        batch: usize,
        b_shared: bool,
        beta: f32,
        threads: usize,
    ) {
        let Ok(mkl) = crate::mkl::get() else {
            eprintln!("SKIPPED: packed MKL panels (MKL absent)");
            return;
        };
        let (m, n, k, ldc) = (470usize, 1100usize, 40usize, 1104usize);
        let alpha = 1.5f32;
        let mut rng = Rng(ta as u64 * 2 + tb as u64 + 10 * batch as u64);
        let bb = if b_shared { 1 } else { batch };
        let a: Vec<T> = (0..batch * m * k)
            .map(|_| T::from_f32(rng.next()))
            .collect();
        let b: Vec<T> = (0..bb * k * n).map(|_| T::from_f32(rng.next())).collect();
        let c0: Vec<T> = (0..batch * m * ldc)
            .map(|i| {
                if beta == 0.0 && i % 7 == 0 {
                    T::from_f32(f32::NAN)
                } else {
                    T::from_f32(rng.next())
                }
            })
            .collect();
        let av = if ta {
            MatRef::row_major(&a, k, m).t()
        } else {
            MatRef::row_major(&a, m, k)
        };
        let av = av.batched(batch, m * k);
        let bv = if tb {
            MatRef::row_major(&b, n, k).t()
        } else {
            MatRef::row_major(&b, k, n)
        };
        let bv = bv.batched(bb, k * n);
        let mut c = c0.clone();
        let mut cv = MatMut::new(&mut c, m, n, ldc, 1).batched(batch, m * ldc);
        let p = check_problem(&av, &bv, &cv).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        assert!(pool.install(|| try_run(mkl, p, &av, &bv, &mut cv, alpha, beta, threads)));
        let at = |bi: usize, i: usize, l: usize| {
            let x = if ta {
                a[bi * m * k + l * m + i]
            } else {
                a[bi * m * k + i * k + l]
            };
            x.to_f32() as f64
        };
        let bt = |bi: usize, l: usize, j: usize| {
            let bi = if b_shared { 0 } else { bi };
            let x = if tb {
                b[bi * k * n + j * k + l]
            } else {
                b[bi * k * n + l * n + j]
            };
            x.to_f32() as f64
        };
        for bi in 0..batch {
            for i in (0..m).step_by(7).chain([m - 1]) {
                for j in (0..n).step_by(5).chain([n - 1]) {
                    let (mut dot, mut mag) = (0.0f64, 0.0f64);
                    for l in 0..k {
                        dot += at(bi, i, l) * bt(bi, l, j);
                        mag += (at(bi, i, l) * bt(bi, l, j)).abs();
                    }
                    let old = if beta == 0.0 {
                        0.0
                    } else {
                        c0[bi * m * ldc + i * ldc + j].to_f32() as f64
                    };
                    let want = alpha as f64 * dot + beta as f64 * old;
                    let got = c[bi * m * ldc + i * ldc + j].to_f32() as f64;
                    let tol = want.abs() / 64.0 + 1e-3 * (mag + old.abs());
                    assert!((got - want).abs() <= tol, "[{bi},{i},{j}] {got} vs {want}");
                }
            }
            // Padding between rows is untouched.
            for i in 0..m {
                for j in n..ldc {
                    let at = bi * m * ldc + i * ldc + j;
                    assert_eq!(c[at].to_f32().to_bits(), c0[at].to_f32().to_bits());
                }
            }
        }
    }

    #[test]
    fn packed_panels_match_reference() {
        for threads in [1, 2] {
            check::<bf16>(false, false, 1, true, 0.0, threads);
            check::<bf16>(true, true, 1, true, 0.5, threads);
            check::<bf16>(false, true, 2, false, 0.0, threads);
            check::<bf16>(true, false, 2, true, 1.0, threads);
        }
    }

    #[test]
    fn small_f32_out_or_f16_products_are_left_to_the_general_path() {
        let Ok(mkl) = crate::mkl::get() else {
            eprintln!("SKIPPED: packed MKL panels (MKL absent)");
            return;
        };
        let a = vec![bf16::ONE; 64 * 64];
        let mut c = vec![bf16::ZERO; 64 * 64];
        let (av, bv) = (MatRef::row_major(&a, 64, 64), MatRef::row_major(&a, 64, 64));
        let mut cv = MatMut::row_major(&mut c, 64, 64);
        let p = check_problem(&av, &bv, &cv).unwrap();
        assert!(!try_run(mkl, p, &av, &bv, &mut cv, 1.0, 0.0, 2));
        assert!(c.iter().all(|x| x.to_f32() == 0.0));
        let mut c32 = vec![0.0f32; 64 * 64];
        let mut cv = MatMut::row_major(&mut c32, 64, 64);
        assert!(!try_run(mkl, p, &av, &bv, &mut cv, 1.0, 0.0, 2));
        // f16 inputs (MKL's packed f16 product is slower than its plain one), large.
        let (m, k) = (1024, 1024);
        let a16 = vec![f16::ONE; m * k];
        let mut c16 = vec![f16::ZERO; m * k];
        let (av, bv) = (MatRef::row_major(&a16, m, k), MatRef::row_major(&a16, k, m));
        let mut cv = MatMut::row_major(&mut c16, m, m);
        let p = check_problem(&av, &bv, &cv).unwrap();
        assert!(!try_run(mkl, p, &av, &bv, &mut cv, 1.0, 0.0, 2));
    }

    #[test]
    fn panels_are_tile_multiples_within_bounds() {
        assert_eq!(panel_rows(2048), 128);
        assert_eq!(panel_rows(1024), 256);
        assert_eq!(panel_rows(100_000), 16);
        assert_eq!(panel_rows(0), 256);
        assert_eq!(panel_rows(3000) % 16, 0);
    }
}
