//! bf16 products on AMX (`tdpbf16ps` on tile registers), for the Rust backend on CPUs that
//! have AMX-BF16 (Intel Sapphire Rapids and later).
//!
//! Note [AMX tiles]:
//! One `tdpbf16ps` multiplies a 16×32 bf16 tile of A by a 16×16 tile of B pairs (32 of k
//! by 16 columns, pairs along k as `vdpbf16ps` takes them) into a 16×16 f32 tile of C: 8192
//! multiply-adds per instruction, against 512 for an AVX-512 `vdpbf16ps`, which is how
//! oneDNN (PyTorch's bf16 products on such CPUs) runs far above the AVX-512 BF16 rate. The
//! micro-kernel keeps a 32×32 block of C in four tile registers (tmm0–3), and for every 32
//! of k loads two A tiles (tmm4–5) and two B tiles (tmm6–7) and issues four products.
//!
//! B is packed exactly as `dpbf16` packs it (`NR` = 32-column panels of pairs along k, one
//! 128-byte row per pair), with the pairs padded with zeros to whole tiles (16 pairs): a B
//! tile is then 16 panel rows at a stride of 128 bytes, its left or right half. A is packed
//! row-major per `MC × KC` block, k padded with zeros to whole tiles (32) and rows to whole
//! micro-blocks (32), so a tile is 16 rows at the block's row stride. Every tile is 16 rows
//! of 64 bytes, so one configuration (palette 1) serves the eight registers.
//!
//! Rust has no stable AMX intrinsics, so the instructions are `asm!`: tile registers are
//! not allocated by the compiler, and no other code of the program touches them; each call
//! loads the configuration, and releases the tiles before it returns. Linux hands AMX's
//! 8 KiB of tile state to a process only after `arch_prctl(ARCH_REQ_XCOMP_PERM)`
//! ([`available`] asks once, for the whole process); where it refuses, or the CPU lacks
//! AMX, `dispatch` uses `dpbf16`. `EMBER_GEMM_AMX=0` turns this kernel off (to compare).
//!
//! As with `vdpbf16ps`, products are exact in f32 and sums are in f32; the instruction
//! treats bf16 subnormal inputs as zero and flushes subnormal results (as oneDNN's
//! products do).

use crate::dpbf16;
use crate::split::RawGemm;

/// Rows of C per micro-block (two tiles of 16 rows).
const MR: usize = 32;
/// Columns of C per micro-block (two tiles of 16): `dpbf16`'s panel width.
const NR: usize = dpbf16::NR;
/// Rows of a tile.
const TILE_ROWS: usize = 16;
/// k per tile of A (32 bf16: 64 bytes a row), and pairs per tile of B.
const TILE_K: usize = 32;
const TILE_PAIRS: usize = TILE_K / 2;
/// k per packed block (a multiple of `TILE_K`). A B panel (`KC × NR` bf16, 64 KiB) and an A
/// block (`MC × KC` bf16, 256 KiB) stay in L2.
const KC: usize = 1024;
/// Rows per packed A block (a multiple of `MR`).
const MC: usize = 128;
/// Columns per packed B block (a multiple of `NR`): `KC × NC` bf16 is 2 MiB.
const NC: usize = 1024;

/// Whether AMX-BF16 can run here: the CPU has AMX-TILE and AMX-BF16 (and AVX-512 BF16,
/// for `dpbf16`'s packing), Linux granted the tile state, and `EMBER_GEMM_AMX` is not `0`.
pub(crate) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        std::env::var("EMBER_GEMM_AMX").as_deref() != Ok("0") && dpbf16::available() && enable()
    })
}

/// Asks Linux for the AMX tile state (`ARCH_REQ_XCOMP_PERM`, `XFEATURE_XTILEDATA`) where the
/// CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7: EDX bits 24 and 22).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn enable() -> bool {
    // `cpuid` is present on every x86-64 CPU; leaf 7 sub-leaf 0 exists where the maximum
    // leaf (leaf 0's EAX) is at least 7, checked first.
    if std::arch::x86_64::__cpuid(0).eax < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    let (amx_bf16, amx_tile) = (edx & (1 << 22) != 0, edx & (1 << 24) != 0);
    if !(amx_bf16 && amx_tile) {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, feature)` takes two integers and only
    // changes which register state the kernel lets this process use.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    r == 0
}

/// No AMX off x86-64 Linux.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn enable() -> bool {
    false
}

thread_local! {
    /// This thread's packing buffers (A block as bf16 bits, B block as pairs), kept between
    /// calls.
    static PACKS: std::cell::RefCell<(Vec<u16>, Vec<u32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `C = alpha·A·B + beta·C` for bf16 A and B (as bits) and f32 C, on one thread.
///
/// # Safety
/// `g` must come from checked views (see [`RawGemm`]) with `k > 0`, no other thread may
/// touch C's elements during the call, and [`available`] must be true.
pub(crate) unsafe fn gemm(g: RawGemm<u16>) {
    debug_assert!(g.k > 0, "amx::gemm needs k > 0");
    if g.m == 0 || g.n == 0 {
        return;
    }
    let mut packs = PACKS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let (apack, bpack) = (&mut packs.0, &mut packs.1);
    let block_k = KC.min(g.k.next_multiple_of(TILE_K));
    let need_a = MC.min(g.m.next_multiple_of(MR)) * block_k;
    let need_b = NC.min(g.n).div_ceil(NR) * NR * (block_k / 2);
    if apack.len() < need_a {
        apack.resize(need_a, 0);
    }
    if bpack.len() < need_b {
        bpack.resize(need_b, 0);
    }
    let mut tile = [0f32; MR * NR];
    // SAFETY: `available()` is the caller's contract.
    unsafe { configure() };
    for jc in (0..g.n).step_by(NC) {
        let nc = NC.min(g.n - jc);
        for pc in (0..g.k).step_by(KC) {
            let kc = KC.min(g.k - pc);
            // k of this block padded to whole tiles; pairs per B panel.
            let kp = kc.next_multiple_of(TILE_K);
            let pairs = kp / 2;
            // SAFETY: rows `pc..pc + kc` and columns `jc..jc + nc` lie inside B's view, and
            // `bpack` holds `nc.div_ceil(NR) · NR · pairs` entries (`need_b`).
            unsafe { dpbf16::pack_b(&g, pc, kc, jc, nc, pairs, bpack) };
            for ic in (0..g.m).step_by(MC) {
                let mc = MC.min(g.m - ic);
                // SAFETY: rows `ic..ic + mc` and columns `pc..pc + kc` lie inside A's view.
                unsafe { pack_a(&g, ic, mc, pc, kc, kp, apack) };
                let beta = if pc == 0 { g.beta } else { 1.0 };
                for jr in 0..nc.div_ceil(NR) {
                    let bp = &bpack[jr * pairs * NR..(jr + 1) * pairs * NR];
                    for ir in 0..mc.div_ceil(MR) {
                        let ap = &apack[ir * MR * kp..(ir + 1) * MR * kp];
                        // SAFETY: `available()`, and the tiles are configured (above); `ap`
                        // holds MR rows of `kp` elements, `bp` `pairs` rows of NR pairs.
                        unsafe { micro(ap, kp, bp, &mut tile) };
                        let (i0, j0) = (ic + ir * MR, jc + jr * NR);
                        let (rows, cols) = (MR.min(g.m - i0), NR.min(g.n - j0));
                        // SAFETY: the tile's rows and columns lie inside C's view.
                        unsafe { store(&g, &tile, (i0, j0), (rows, cols), beta) };
                    }
                }
            }
        }
    }
    // SAFETY: as `configure`: releases the tile state this call loaded.
    unsafe { release() };
    PACKS.with(|p| *p.borrow_mut() = packs);
}

/// Packs `A[ic..ic+mc, pc..pc+kc]` row-major with a row stride of `kp` (k padded to whole
/// tiles), rows padded to whole micro-blocks, the padding zero.
///
/// # Safety
/// The block must lie inside A's checked view, and `out` must hold
/// `mc.next_multiple_of(MR) · kp` entries.
unsafe fn pack_a(
    g: &RawGemm<u16>,
    ic: usize,
    mc: usize,
    pc: usize,
    kc: usize,
    kp: usize,
    out: &mut [u16],
) {
    let rows = mc.next_multiple_of(MR);
    for (i, dst) in out.chunks_mut(kp).take(rows).enumerate() {
        if i >= mc {
            dst.fill(0);
            continue;
        }
        let row = g.a.wrapping_add((ic + i) * g.a_rs + pc * g.a_cs);
        if g.a_cs == 1 {
            // SAFETY: the caller's contract: the row's `kc` elements from column `pc` are
            // inside A.
            let src = unsafe { std::slice::from_raw_parts(row, kc) };
            dst[..kc].copy_from_slice(src);
        } else {
            for (c, d) in dst[..kc].iter_mut().enumerate() {
                // SAFETY: as above, through A's column stride.
                *d = unsafe { *row.add(c * g.a_cs) };
            }
        }
        dst[kc..].fill(0);
    }
}

/// The tile configuration: palette 1, tiles 0–7 each 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1; // palette
        for t in 0..8 {
            // Bytes per row (u16, little-endian) at 16 + 2t, rows at 48 + t.
            c[16 + 2 * t] = 64;
            c[48 + t] = TILE_ROWS as u8;
        }
        TileConfig(c)
    }
}

/// Loads the tile configuration on this thread.
///
/// # Safety
/// [`available`] must be true.
#[cfg(target_arch = "x86_64")]
unsafe fn configure() {
    let cfg = TileConfig::new();
    // SAFETY: the CPU has AMX and the process may use it (`available`); `cfg` is a valid
    // 64-byte palette-1 configuration, aligned, alive during the instruction.
    unsafe {
        std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly))
    };
}

/// Returns the tile state to its initial (unused) state.
///
/// # Safety
/// [`available`] must be true.
#[cfg(target_arch = "x86_64")]
unsafe fn release() {
    // SAFETY: the CPU has AMX (`available`).
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
}

/// A 32×32 block of `A-panel · B-panel` over `kp` of k into `tile` (row-major `MR × NR`).
///
/// # Safety
/// [`available`] must be true and [`configure`] called on this thread; `a` holds `MR` rows
/// of `kp` elements (`kp` a multiple of 32), `b` `kp / 2` rows of `NR` pairs.
#[cfg(target_arch = "x86_64")]
unsafe fn micro(a: &[u16], kp: usize, b: &[u32], tile: &mut [f32; MR * NR]) {
    use std::arch::asm;
    assert!(a.len() >= MR * kp && b.len() >= kp / 2 * NR && kp.is_multiple_of(TILE_K));
    let a_stride = kp * 2; // bytes between rows of A
    let b_stride = NR * 4; // bytes between pairs of B
    let c_stride = NR * 4; // bytes between rows of the tile
    // SAFETY: AMX is available and configured (the caller's contract). Every load reads 16
    // rows of 64 bytes: A tiles at rows 0 and 16 and columns `32s..32s + 32` of `a` (MR
    // rows of `kp`, checked above), B tiles at pairs `16s..16s + 16` and pair-columns 0 or 16
    // of `b` (`kp / 2` rows of NR, checked above); the stores write the four 16×16 f32
    // quarters of `tile`. Tile registers are not used by any other code.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        for s in 0..kp / TILE_K {
            let a0 = a.as_ptr().add(s * TILE_K);
            let a1 = a0.add(TILE_ROWS * kp);
            let b0 = b.as_ptr().add(s * TILE_PAIRS * NR);
            let b1 = b0.add(16);
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0,
                a1 = in(reg) a1,
                b0 = in(reg) b0,
                b1 = in(reg) b1,
                sa = in(reg) a_stride,
                sb = in(reg) b_stride,
                options(nostack, readonly),
            );
        }
        let c = tile.as_mut_ptr();
        asm!(
            "tilestored [{c00} + {sc}*1], tmm0",
            "tilestored [{c01} + {sc}*1], tmm1",
            "tilestored [{c10} + {sc}*1], tmm2",
            "tilestored [{c11} + {sc}*1], tmm3",
            c00 = in(reg) c,
            c01 = in(reg) c.add(16),
            c10 = in(reg) c.add(TILE_ROWS * NR),
            c11 = in(reg) c.add(TILE_ROWS * NR + 16),
            sc = in(reg) c_stride,
            options(nostack),
        );
    }
}

/// No AMX off x86-64 ([`available`] is false there).
///
/// # Safety
/// None.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn configure() {}

/// No AMX off x86-64.
///
/// # Safety
/// None.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn release() {}

/// No AMX off x86-64: never called ([`available`] is false there).
///
/// # Safety
/// None.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro(_: &[u16], _: usize, _: &[u32], _: &mut [f32; MR * NR]) {}

/// Writes the top-left `rows × cols` of `tile` into C at `(i0, j0)` as `alpha·tile + beta·C`
/// (`beta == 0`: C not read).
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
        let src = &tile[i * NR..i * NR + cols];
        if g.c_cs == 1 {
            // SAFETY: the caller's contract: row `i0 + i`'s `cols` elements from `j0` are
            // inside C, unit stride, written only here.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(g.c.add((i0 + i) * g.c_rs + j0), cols) };
            if beta == 0.0 {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = g.alpha * s;
                }
            } else {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = g.alpha * s + beta * *d;
                }
            }
            continue;
        }
        for (j, &s) in src.iter().enumerate() {
            // SAFETY: the caller's contract: `(i0 + i, j0 + j)` is inside C.
            let c = unsafe { &mut *g.c.add((i0 + i) * g.c_rs + (j0 + j) * g.c_cs) };
            *c = if beta == 0.0 {
                g.alpha * s
            } else {
                g.alpha * s + beta * *c
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// A deterministic bf16 in [-2, 2) (exactly representable sums stay small).
    fn val(seed: usize) -> u16 {
        let x = (seed.wrapping_mul(2_654_435_761) >> 7) % 64;
        bf16::from_f32(x as f32 / 16.0 - 2.0).to_bits()
    }

    /// `amx::gemm` against an f64 reference, over shapes crossing every block and tile
    /// edge, row- and column-major operands and C, alpha and beta.
    #[test]
    fn matches_reference_across_edges_and_layouts() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 here");
            return;
        }
        let shapes = [
            (1, 1, 1),
            (32, 32, 32),
            (33, 31, 33),
            (64, 64, 1000),
            (130, 70, 1030),
            (17, 1050, 45),
            (5, 3, 2100),
        ];
        for (si, &(m, n, k)) in shapes.iter().enumerate() {
            for (li, &(a_t, b_t, c_t, alpha, beta)) in [
                (false, false, false, 1.0f32, 0.0f32),
                (true, true, true, -0.5, 1.5),
                (false, true, false, 2.0, -1.0),
            ]
            .iter()
            .enumerate()
            {
                let a: Vec<u16> = (0..m * k).map(|i| val(i + 7 * si + li)).collect();
                let b: Vec<u16> = (0..k * n).map(|i| val(3 * i + 1 + si)).collect();
                let c0: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32 - 2.0).collect();
                let (a_rs, a_cs) = if a_t { (1, m) } else { (k, 1) };
                let (b_rs, b_cs) = if b_t { (1, k) } else { (n, 1) };
                let (c_rs, c_cs) = if c_t { (1, m) } else { (n, 1) };
                let mut c = c0.clone();
                let g = RawGemm {
                    m,
                    n,
                    k,
                    a: a.as_ptr(),
                    a_rs,
                    a_cs,
                    b: b.as_ptr(),
                    b_rs,
                    b_cs,
                    c: c.as_mut_ptr(),
                    c_rs,
                    c_cs,
                    alpha,
                    beta,
                };
                // SAFETY: the strides address exactly the vectors above; AMX is available.
                unsafe { gemm(g) };
                let f = |x: u16| f64::from(bf16::from_bits(x).to_f32());
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 = (0..k)
                            .map(|p| f(a[i * a_rs + p * a_cs]) * f(b[p * b_rs + j * b_cs]))
                            .sum();
                        let at = i * c_rs + j * c_cs;
                        let want = f64::from(alpha) * dot + f64::from(beta) * f64::from(c0[at]);
                        let got = f64::from(c[at]);
                        let tol = 1e-5 * (1.0 + want.abs()) + 1e-6 * k as f64;
                        assert!(
                            (got - want).abs() <= tol,
                            "{m}x{n}x{k} layout {li} [{i},{j}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
