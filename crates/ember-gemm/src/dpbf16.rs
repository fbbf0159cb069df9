//! bf16 products on AVX-512 BF16's `vdpbf16ps`, for the Rust backend on CPUs that have it
//! (AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids).
//!
//! Note [bf16 dot products]:
//! Without this, the Rust backend widens bf16 operands to f32 and runs the f32 kernels, at
//! f32's rate. `vdpbf16ps` multiplies 32 bf16 pairs and adds each pair's two products into 16
//! f32 lanes: twice the multiply-adds of an f32 FMA per instruction, which is how PyTorch's
//! oneDNN runs bf16 products at about twice the widened-f32 rate on such CPUs
//! (`matmul_bf16_*` in docs/performance.md).
//!
//! The layout is BLIS's: B is packed per `KC × NC` block into `NR`-column panels, A per
//! `MC × KC` block into `MR`-row panels, both as pairs along k (one `u32` holds elements
//! `k` and `k + 1`, `k` in the low half, as the instruction pairs them; an odd k pads with a
//! zero). The micro-kernel keeps an `MR × NR` tile of C in 16 registers, loads two B
//! vectors and broadcasts one A pair per row for every pair of k. Tiles are written into C
//! through its strides with `alpha` and `beta` (C is read only when `beta != 0`), so any
//! layout works and packing is the only place operands are read.
//!
//! Packing unit-stride operands is vectorised (`interleave` for B's row pairs, an 8×8 u32
//! `transpose` for A's rows, whose element pairs already are u32s): scalar, packing was a
//! visible share of a 1024³ product on two threads, where each thread packs all of A, and
//! vectorising it made `matmul_bf16_n1024` faster.
//!
//! The instruction rounds to nearest even but treats bf16 subnormals (below 1.2e-38) as
//! zero and flushes subnormal results, as oneDNN's products do; sums are in f32 as on every
//! other path.

use crate::split::RawGemm;

/// Rows of C per micro-tile.
const MR: usize = 8;
/// Columns of C per micro-tile (two 16-lane vectors); also the panel width of `amx`, which
/// packs B with [`pack_b`].
pub(crate) const NR: usize = 32;
/// k per packed block (even: whole pairs). Large, so that C, updated once per block, is
/// read and written once for k up to 2048: a 2048² C updated every 256 of k spent a fifth
/// of the kernel's time in its stores. A B panel (`KC × NR` bf16, 128 KiB) stays in L2 while
/// the A panels stream past it.
const KC: usize = 2048;
/// Rows per packed A block: `MC × KC` bf16 is 384 KiB (L2, beside the B panel).
const MC: usize = 96;
/// Columns per packed B block: `KC × NC` bf16 is 4 MiB (L3).
const NC: usize = 1024;

/// Whether this CPU has AVX-512 BF16 (and AVX-512 F and AVX2, for packing), which [`gemm`]
/// needs.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

thread_local! {
    /// This thread's packing buffers (A block, B block), kept between calls.
    static PACKS: std::cell::RefCell<(Vec<u32>, Vec<u32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `C = alpha·A·B + beta·C` for bf16 A and B (as bits) and f32 C, on one thread.
///
/// `k > 0`: `dispatch::into_f32` scales C itself when k is 0, before choosing a kernel.
///
/// # Safety
/// `g` must come from checked views (see [`RawGemm`]), no other thread may touch C's elements
/// during the call, and [`available`] must be true.
pub(crate) unsafe fn gemm(g: RawGemm<u16>) {
    debug_assert!(g.k > 0, "dpbf16::gemm needs k > 0");
    if g.m == 0 || g.n == 0 {
        return;
    }
    let mut packs = PACKS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let (apack, bpack) = (&mut packs.0, &mut packs.1);
    // As large as this product's blocks need (a small product does not fault in 4 MiB).
    let block_pairs = KC.min(g.k).div_ceil(2);
    let need_a = MC.min(g.m).div_ceil(MR) * MR * block_pairs;
    let need_b = NC.min(g.n).div_ceil(NR) * NR * block_pairs;
    if apack.len() < need_a {
        apack.resize(need_a, 0);
    }
    if bpack.len() < need_b {
        bpack.resize(need_b, 0);
    }
    let mut tile = [0f32; MR * NR];
    for jc in (0..g.n).step_by(NC) {
        let nc = NC.min(g.n - jc);
        for pc in (0..g.k).step_by(KC) {
            let kc = KC.min(g.k - pc);
            let pairs = kc.div_ceil(2);
            // SAFETY: rows `pc..pc + kc` and columns `jc..jc + nc` lie inside B's view.
            unsafe { pack_b(&g, pc, kc, jc, nc, pairs, bpack) };
            for ic in (0..g.m).step_by(MC) {
                let mc = MC.min(g.m - ic);
                // SAFETY: rows `ic..ic + mc` and columns `pc..pc + kc` lie inside A's view.
                unsafe { pack_a(&g, ic, mc, pc, kc, apack) };
                for jr in 0..nc.div_ceil(NR) {
                    let bp = &bpack[jr * pairs * NR..(jr + 1) * pairs * NR];
                    for ir in 0..mc.div_ceil(MR) {
                        let ap = &apack[ir * pairs * MR..(ir + 1) * pairs * MR];
                        let (i0, j0) = (ic + ir * MR, jc + jr * NR);
                        let (rows, cols) = (MR.min(g.m - i0), NR.min(g.n - j0));
                        // After the first k block, C already holds the partial sum.
                        let beta = if pc == 0 { g.beta } else { 1.0 };
                        // A whole tile of a C with unit column stride is updated in
                        // registers; anything else goes through `tile`.
                        let direct = (rows == MR && cols == NR && g.c_cs == 1).then(|| Direct {
                            c: g.c.wrapping_add(i0 * g.c_rs + j0),
                            rs: g.c_rs,
                            alpha: g.alpha,
                            beta,
                        });
                        // SAFETY: `available()` is the caller's contract; the panels hold
                        // `pairs` pairs of `MR` and `NR` entries; a `direct` tile lies inside
                        // C's view (rows `i0..i0 + MR`, columns `j0..j0 + NR`, unit stride).
                        let done = unsafe { micro(ap, bp, pairs, direct, &mut tile) };
                        if !done {
                            // SAFETY: the tile's rows and columns lie inside C's view.
                            unsafe { store(&g, &tile, (i0, j0), (rows, cols), beta) };
                        }
                    }
                }
            }
        }
    }
    PACKS.with(|p| *p.borrow_mut() = packs);
}

/// A pair of bf16 bits as the instruction takes them: `lo` in the low half.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}

/// Packs `B[pc..pc+kc, jc..jc+nc]` as `NR`-column panels of `pairs` pairs each (at least
/// `kc.div_ceil(2)`; `amx` pads to whole tiles), zero-padded.
///
/// # Safety
/// The block must lie inside B's checked view.
pub(crate) unsafe fn pack_b(
    g: &RawGemm<u16>,
    pc: usize,
    kc: usize,
    jc: usize,
    nc: usize,
    pairs: usize,
    out: &mut [u32],
) {
    debug_assert!(pairs >= kc.div_ceil(2));
    // SAFETY: the caller's contract: `(pc + r, jc + j)` with `r < kc`, `j < nc` is inside B.
    let at = |r: usize, j: usize| unsafe { *g.b.add((pc + r) * g.b_rs + (jc + j) * g.b_cs) };
    for (panel, dst) in out.chunks_mut(pairs * NR).take(nc.div_ceil(NR)).enumerate() {
        let j0 = panel * NR;
        if g.b_rs == 1 && j0 + NR <= nc {
            // A column-major B (`x @ w.t()`): a column's pairs are consecutive u32s, so the
            // panel is its NR columns transposed, 8 columns × 8 pairs at a time (the rest of
            // the pairs, an odd k's last and the padding, one by one below).
            let whole = kc / 2;
            for c0 in (0..NR).step_by(8) {
                let cols: [*const u16; 8] =
                    std::array::from_fn(|c| g.b.wrapping_add(pc + (jc + j0 + c0 + c) * g.b_cs));
                let mut p = 0;
                while p + 8 <= whole {
                    let at_p = cols.map(|r| r.wrapping_add(2 * p));
                    // SAFETY: each column's elements `pc + 2p .. pc + 2p + 16` are inside B
                    // (2p + 16 <= 2·whole <= kc); `dst` holds `pairs · NR` entries, and
                    // `(p + 7)·NR + c0 + 8 <= (p + 8)·NR <= pairs · NR`.
                    unsafe { transpose(&at_p, &mut dst[p * NR + c0..], NR) };
                    p += 8;
                }
                for q in p..pairs {
                    for c in 0..8 {
                        let j = j0 + c0 + c;
                        dst[q * NR + c0 + c] = if 2 * q >= kc {
                            0
                        } else {
                            let hi = if 2 * q + 1 < kc { at(2 * q + 1, j) } else { 0 };
                            pair(at(2 * q, j), hi)
                        };
                    }
                }
            }
            continue;
        }
        for (p, row) in dst.chunks_mut(NR).enumerate() {
            if g.b_cs == 1 && j0 + NR <= nc && 2 * p + 1 < kc {
                // Rows 2p and 2p + 1 of a whole panel, each NR consecutive elements.
                let r0 = g.b.wrapping_add((pc + 2 * p) * g.b_rs + jc + j0);
                // SAFETY: both rows' `NR` elements from column `jc + j0` are inside B, and
                // `row` holds NR entries.
                unsafe { interleave(r0, r0.wrapping_add(g.b_rs), row) };
                continue;
            }
            for (jj, d) in row.iter_mut().enumerate() {
                let j = j0 + jj;
                *d = if j >= nc || 2 * p >= kc {
                    0
                } else {
                    let hi = if 2 * p + 1 < kc { at(2 * p + 1, j) } else { 0 };
                    pair(at(2 * p, j), hi)
                };
            }
        }
    }
}

/// Packs `A[ic..ic+mc, pc..pc+kc]` as `MR`-row panels of pairs, zero-padded.
///
/// # Safety
/// The block must lie inside A's checked view.
unsafe fn pack_a(g: &RawGemm<u16>, ic: usize, mc: usize, pc: usize, kc: usize, out: &mut [u32]) {
    let pairs = kc.div_ceil(2);
    // SAFETY: the caller's contract: `(ic + i, pc + c)` with `i < mc`, `c < kc` is inside A.
    let at = |i: usize, c: usize| unsafe { *g.a.add((ic + i) * g.a_rs + (pc + c) * g.a_cs) };
    for (panel, dst) in out.chunks_mut(pairs * MR).take(mc.div_ceil(MR)).enumerate() {
        let i0 = panel * MR;
        if g.a_cs == 1 && i0 + MR <= mc {
            // Whole rows of unit stride: a row's pairs are consecutive u16 pairs, that is its
            // elements read as u32s, so the panel is these MR rows transposed, 8 pairs at a
            // time (the rest of the pairs, and the last of an odd k, one by one below).
            let whole = kc / 2;
            let rows: [*const u16; MR] =
                std::array::from_fn(|ii| g.a.wrapping_add((ic + i0 + ii) * g.a_rs + pc));
            let mut p = 0;
            while p + 8 <= whole {
                let at_p = rows.map(|r| r.wrapping_add(2 * p));
                // SAFETY: each row's elements `pc + 2p .. pc + 2p + 16` are inside A (2p + 16
                // <= 2·whole <= kc), and `dst` holds `pairs · MR >= (p + 8) · MR` entries.
                unsafe { transpose(&at_p, &mut dst[p * MR..(p + 8) * MR], MR) };
                p += 8;
            }
            for (ii, &r) in rows.iter().enumerate() {
                for q in p..pairs {
                    // SAFETY: `2q < kc`, and `2q + 1 < kc` where it is read: inside A's row.
                    let (lo, hi) = unsafe {
                        let hi = if 2 * q + 1 < kc { *r.add(2 * q + 1) } else { 0 };
                        (*r.add(2 * q), hi)
                    };
                    dst[q * MR + ii] = pair(lo, hi);
                }
            }
            continue;
        }
        for (p, col) in dst.chunks_mut(MR).enumerate() {
            for (ii, d) in col.iter_mut().enumerate() {
                let i = i0 + ii;
                *d = if i >= mc {
                    0
                } else {
                    let hi = if 2 * p + 1 < kc { at(i, 2 * p + 1) } else { 0 };
                    pair(at(i, 2 * p), hi)
                };
            }
        }
    }
}

/// `out[j] = pair(r0[j], r1[j])` for `j < NR`: two rows of a B panel as pairs.
///
/// # Safety
/// `r0` and `r1` must address `NR` readable elements each; `out` holds `NR` entries; the
/// CPU must have AVX-512 F (as [`available`] checks).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn interleave(r0: *const u16, r1: *const u16, out: &mut [u32]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtepu16_epi32};
    use std::arch::x86_64::{_mm512_or_si512, _mm512_slli_epi32, _mm512_storeu_si512};
    assert!(out.len() >= NR);
    for h in 0..NR / 16 {
        // SAFETY: the caller's contract: 16 elements from `16h` are inside each row (NR =
        // 32), and `out`'s 16 entries from `16h` exist (checked above).
        unsafe {
            let lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(r0.add(16 * h).cast::<__m256i>()));
            let hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(r1.add(16 * h).cast::<__m256i>()));
            let both = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
            _mm512_storeu_si512(out.as_mut_ptr().add(16 * h).cast(), both);
        }
    }
}

/// The portable `interleave`.
///
/// # Safety
/// As the x86-64 version: `r0` and `r1` must address `NR` readable elements each.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn interleave(r0: *const u16, r1: *const u16, out: &mut [u32]) {
    for (j, d) in out.iter_mut().take(NR).enumerate() {
        // SAFETY: the caller's contract: `NR` elements are readable in each row.
        *d = unsafe { pair(*r0.add(j), *r1.add(j)) };
    }
}

/// `out[q·stride + i] = rows[i]`'s pair `q` for `q < 8`, `i < 8`: eight pairs of each of
/// eight rows (each row's 16 elements read as 8 u32s), transposed (8×8 u32, the usual
/// unpack / shuffle / lane-permute network). An A panel takes it with `stride` MR; a B
/// panel of a column-major B (its columns' pairs are consecutive) with `stride` NR.
///
/// # Safety
/// Each row pointer must address 16 readable elements; `out` holds `7 · stride + 8` entries;
/// the CPU must have AVX2 (as [`available`] checks).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose(rows: &[*const u16; MR], out: &mut [u32], stride: usize) {
    use std::arch::x86_64::{__m256, _mm256_loadu_ps, _mm256_permute2f128_ps};
    use std::arch::x86_64::{_mm256_shuffle_ps, _mm256_storeu_ps};
    use std::arch::x86_64::{_mm256_unpackhi_ps, _mm256_unpacklo_ps};
    const { assert!(MR == 8) };
    assert!(stride >= 8 && out.len() >= 7 * stride + 8);
    // Loads and shuffles of float vectors move bits unchanged (no NaN is touched).
    // SAFETY: the caller's contract: 16 u16 = 8 u32 readable from each row pointer.
    let r: [__m256; MR] = rows.map(|p| unsafe { _mm256_loadu_ps(p.cast::<f32>()) });
    // Rows (2i, 2i + 1) interleaved: pairs 0, 1, 4, 5 (lo) and 2, 3, 6, 7 (hi).
    let lo: [__m256; 4] = std::array::from_fn(|i| _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]));
    let hi: [__m256; 4] = std::array::from_fn(|i| _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]));
    // Four rows of one pair per 128-bit lane: s[h][c] holds pair c (lane 0) and c + 4 (lane
    // 1) of rows 4h..4h + 4.
    let s: [[__m256; 4]; 2] = std::array::from_fn(|h| {
        [
            _mm256_shuffle_ps::<0x44>(lo[2 * h], lo[2 * h + 1]),
            _mm256_shuffle_ps::<0xEE>(lo[2 * h], lo[2 * h + 1]),
            _mm256_shuffle_ps::<0x44>(hi[2 * h], hi[2 * h + 1]),
            _mm256_shuffle_ps::<0xEE>(hi[2 * h], hi[2 * h + 1]),
        ]
    });
    for (c, (&top, &bottom)) in s[0].iter().zip(&s[1]).enumerate() {
        let first = _mm256_permute2f128_ps::<0x20>(top, bottom);
        let second = _mm256_permute2f128_ps::<0x31>(top, bottom);
        // SAFETY: `out` holds `7 · stride + 8` entries (checked above); pairs c and c + 4
        // start at `stride · c` and `stride · (c + 4)`, eight entries each.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr().add(stride * c).cast::<f32>(), first);
            _mm256_storeu_ps(out.as_mut_ptr().add(stride * (c + 4)).cast::<f32>(), second);
        }
    }
}

/// The portable `transpose`.
///
/// # Safety
/// As the x86-64 version: each row pointer must address 16 readable elements.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose(rows: &[*const u16; MR], out: &mut [u32], stride: usize) {
    for q in 0..8 {
        for (i, &r) in rows.iter().enumerate() {
            // SAFETY: the caller's contract: 16 elements are readable from each row pointer.
            out[q * stride + i] = unsafe { pair(*r.add(2 * q), *r.add(2 * q + 1)) };
        }
    }
}

/// Where a micro-tile goes straight into C: `MR` rows of `NR` consecutive floats, row `r`
/// at `c + r·rs`, updated as `alpha·AB + beta·C` (`beta == 0`: C not read).
struct Direct {
    c: *mut f32,
    rs: usize,
    alpha: f32,
    beta: f32,
}

/// `A-panel · B-panel` over `pairs` pairs of k: into C through `direct` (returns true), or
/// into `tile` (row-major `MR × NR`, returns false).
///
/// # Safety
/// The CPU must have AVX-512 F and BF16; `a` holds `pairs · MR` entries, `b` `pairs · NR`;
/// a `direct` tile must lie inside C's checked view, written by no other thread.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn micro(
    a: &[u32],
    b: &[u32],
    pairs: usize,
    direct: Option<Direct>,
    tile: &mut [f32; MR * NR],
) -> bool {
    use std::arch::x86_64::{__m512, __m512bh, __m512i, _mm512_dpbf16_ps, _mm512_fmadd_ps};
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_mul_ps, _mm512_set1_epi32, _mm512_set1_ps};
    use std::arch::x86_64::{_mm512_setzero_ps, _mm512_storeu_ps};
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)).take(pairs) {
        // SAFETY: `bp` holds NR = 32 u32s: two unaligned 64-byte loads inside it. The
        // bits are reinterpreted as 32 bf16 each (same size, any bits valid).
        let (b0, b1): (__m512bh, __m512bh) = unsafe {
            (
                std::mem::transmute::<__m512, __m512bh>(_mm512_loadu_ps(bp.as_ptr().cast())),
                std::mem::transmute::<__m512, __m512bh>(_mm512_loadu_ps(
                    bp.as_ptr().add(16).cast(),
                )),
            )
        };
        for (row, &x) in acc.iter_mut().zip(ap) {
            // SAFETY: as above, a broadcast pair reinterpreted as 32 bf16.
            let av =
                unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(x as i32)) };
            row[0] = _mm512_dpbf16_ps(row[0], av, b0);
            row[1] = _mm512_dpbf16_ps(row[1], av, b1);
        }
    }
    let Some(d) = direct else {
        for (r, row) in acc.iter().enumerate() {
            // SAFETY: `tile` has MR · NR floats; row `r`'s 32 start at `r · NR`.
            unsafe {
                _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR), row[0]);
                _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR + 16), row[1]);
            }
        }
        return false;
    };
    let (alpha, beta) = (_mm512_set1_ps(d.alpha), _mm512_set1_ps(d.beta));
    for (r, row) in acc.iter().enumerate() {
        for (h, &v) in row.iter().enumerate() {
            let p = d.c.wrapping_add(r * d.rs + 16 * h);
            // SAFETY: the caller's contract: row `r`'s 32 floats of the tile are inside C
            // and written only here.
            unsafe {
                let out = if d.beta == 0.0 {
                    _mm512_mul_ps(alpha, v)
                } else {
                    _mm512_fmadd_ps(beta, _mm512_loadu_ps(p), _mm512_mul_ps(alpha, v))
                };
                _mm512_storeu_ps(p, out);
            }
        }
    }
    true
}

/// No micro-kernel off x86-64: always `false` ([`available`] is false there too).
///
/// # Safety
/// None; the signature matches the x86-64 version.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro(_: &[u32], _: &[u32], _: usize, _: Option<Direct>, _: &mut [f32; MR * NR]) -> bool {
    false
}

/// Writes the top-left `rows × cols` of `tile` into C at `(i0, j0)` as `alpha·tile + beta·C`
/// (`beta == 0`: C not read), as [`micro`] does for a [`Direct`] tile.
///
/// # Safety
/// The region must lie inside C's checked view, written by no other thread.
unsafe fn store(
    g: &RawGemm<u16>,
    tile: &[f32; MR * NR],
    (i0, j0): (usize, usize),
    (rows, cols): (usize, usize),
    beta: f32,
) {
    for i in 0..rows {
        for j in 0..cols {
            let v = g.alpha * tile[i * NR + j];
            // SAFETY: the caller's contract: `(i0 + i, j0 + j)` is inside C.
            let c = unsafe { &mut *g.c.add((i0 + i) * g.c_rs + (j0 + j) * g.c_cs) };
            *c = if beta == 0.0 { v } else { v + beta * *c };
        }
    }
}
