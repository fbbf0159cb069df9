//! Intel MKL, loaded at run time (never linked): `cblas_sgemm`, `cblas_gemm_bf16bf16f32`,
//! `cblas_gemm_f16f16f32`, and the packed bf16 product (`cblas_gemm_bf16bf16f32_pack_get_size`,
//! `_pack`, `_compute`) from `libmkl_rt`.
//!
//! See Note [MKL threading]: MKL runs its *sequential* layer; Ember splits a product across
//! its own parallel loop's threads, so there is one team of threads in the process, never
//! two.
//!
//! Note [MKL threading]:
//! MKL's default threading layer is Intel OpenMP (`libiomp5`), a second pool of spinning
//! threads beside Ember's own; with as many threads as cores, two pools steal each other's
//! time. Before any other MKL call we select `MKL_THREADING_SEQUENTIAL` with
//! `MKL_Set_Threading_Layer`, and `crate::split` runs one sequential MKL call per block of
//! C, on the caller and the parallel loop's helpers (`crate::parallel`). Only
//! `libmkl_rt`, `libmkl_core`, `libmkl_sequential` and the per-CPU kernels (`libmkl_avx512`,
//! ...) are loaded; `intel-openmp` is not needed.
//!
//! Search order for the library (first hit wins):
//! 1. `EMBER_MKL_PATH`: a file, or a folder holding `libmkl_rt.so.3` / `libmkl_rt.so.2`;
//! 2. `mkl/lib/` in the folder of the running program or any folder above it (so
//!    `target/mkl/lib`, where the install command puts it, serves every binary under
//!    `target/`);
//! 3. the system's loader path (`LD_LIBRARY_PATH`, `ldconfig`).

use std::ffi::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::split::RawGemm;

const LIB_NAMES: [&str; 3] = ["libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"];

const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_NO_TRANS: c_int = 111;
const CBLAS_TRANS: c_int = 112;
const MKL_THREADING_SEQUENTIAL: c_int = 1;
/// `CBLAS_IDENTIFIER::CblasBMatrix`.
const CBLAS_B_MATRIX: c_int = 162;
/// `CBLAS_STORAGE::CblasPacked`: the operand passed to `_compute` was packed by `_pack`.
const CBLAS_PACKED: c_int = 151;

/// `cblas_sgemm` (`T = f32`) and the 16-bit products `cblas_gemm_bf16bf16f32`,
/// `cblas_gemm_f16f16f32` and `_compute` (`T = u16`): one argument order, A and B of `T`,
/// C of f32.
type GemmFn<T> = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    f32,
    *const T,
    c_int,
    *const T,
    c_int,
    f32,
    *mut f32,
    c_int,
);
type SgemmFn = GemmFn<f32>;
type HgemmFn = GemmFn<u16>;

/// `cblas_gemm_*_pack_get_size(identifier, m, n, k)`: bytes of the packed operand.
type PackSizeFn = unsafe extern "C" fn(c_int, c_int, c_int, c_int) -> usize;
/// `cblas_gemm_*_pack(layout, identifier, trans, m, n, k, src, ld, dest)`.
type PackFn =
    unsafe extern "C" fn(c_int, c_int, c_int, c_int, c_int, c_int, *const u16, c_int, *mut u16);

/// MKL's packed 16-bit product: B packed once by `pack`, then `compute` (the signature of
/// [`HgemmFn`], with `CblasPacked` for B) any number of times.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackedHgemm {
    size: PackSizeFn,
    pack: PackFn,
    compute: HgemmFn,
}

/// The loaded library and its entry points.
#[derive(Debug)]
pub(crate) struct Mkl {
    /// Keeps the functions below valid.
    _lib: libloading::Library,
    pub path: PathBuf,
    pub version: String,
    sgemm: SgemmFn,
    bf16: Option<HgemmFn>,
    f16: Option<HgemmFn>,
    bf16_packed: Option<PackedHgemm>,
}

static MKL: OnceLock<Result<Mkl, String>> = OnceLock::new();

/// The library, loaded on first use, or why it is absent.
pub(crate) fn get() -> Result<&'static Mkl, &'static str> {
    MKL.get_or_init(load).as_ref().map_err(String::as_str)
}

fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("EMBER_MKL_PATH") {
        let p = PathBuf::from(p);
        if p.is_dir() {
            out.extend(LIB_NAMES.iter().map(|n| p.join(n)));
        } else {
            out.push(p);
        }
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            let lib = dir.join("mkl").join("lib");
            out.extend(
                LIB_NAMES
                    .iter()
                    .map(|n| lib.join(n))
                    .filter(|p| p.is_file()),
            );
        }
    }
    out.extend(LIB_NAMES.iter().map(PathBuf::from));
    out
}

fn load() -> Result<Mkl, String> {
    let mut tried = Vec::new();
    for path in candidates() {
        if path.components().count() > 1 && !path.is_file() {
            tried.push(format!("{} (absent)", path.display()));
            continue;
        }
        match open(&path) {
            Ok(m) => return Ok(m),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "libmkl_rt not found (tried {}); install it with `pip install --no-deps --prefix target/mkl mkl==2026.2.0` or point EMBER_MKL_PATH at it",
        tried.join("; ")
    ))
}

fn open(path: &Path) -> Result<Mkl, String> {
    // SAFETY: loading MKL runs its initialisers, which only set up MKL's own state; the
    // library is never unloaded (it lives in a `static`).
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    // SAFETY: the symbol types are those of `mkl_service.h` / `mkl_cblas.h` (LP64
    // interface: `MKL_INT` is `int`).
    unsafe {
        let set_layer: libloading::Symbol<'_, unsafe extern "C" fn(c_int) -> c_int> = lib
            .get(b"MKL_Set_Threading_Layer\0")
            .map_err(|e| e.to_string())?;
        // See Note [MKL threading]: must come before any computation.
        set_layer(MKL_THREADING_SEQUENTIAL);
        let version = match lib
            .get::<unsafe extern "C" fn(*mut c_char, c_int)>(b"MKL_Get_Version_String\0")
        {
            Ok(f) => {
                let mut buf = [0u8; 256];
                f(buf.as_mut_ptr().cast(), buf.len() as c_int - 1);
                let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                String::from_utf8_lossy(&buf[..end]).trim().to_string()
            }
            Err(_) => "unknown version".to_string(),
        };
        let sgemm: SgemmFn = *lib.get(b"cblas_sgemm\0").map_err(|e| e.to_string())?;
        let bf16 = lib
            .get::<HgemmFn>(b"cblas_gemm_bf16bf16f32\0")
            .ok()
            .map(|s| *s);
        let f16 = lib
            .get::<HgemmFn>(b"cblas_gemm_f16f16f32\0")
            .ok()
            .map(|s| *s);
        // Only bf16: MKL's packed f16 product was slower than its plain one
        // (`matmul_f16_n1024`), so f16 keeps the plain call.
        let bf16_packed = (|| {
            Some(PackedHgemm {
                size: *lib
                    .get::<PackSizeFn>(b"cblas_gemm_bf16bf16f32_pack_get_size\0")
                    .ok()?,
                pack: *lib.get::<PackFn>(b"cblas_gemm_bf16bf16f32_pack\0").ok()?,
                compute: *lib
                    .get::<HgemmFn>(b"cblas_gemm_bf16bf16f32_compute\0")
                    .ok()?,
            })
        })();
        Ok(Mkl {
            _lib: lib,
            path: path.to_path_buf(),
            version,
            sgemm,
            bf16,
            f16,
            bf16_packed,
        })
    }
}

/// How a BLAS call sees one operand: transposed or not, and its leading dimension.
/// `None` when neither stride is 1 (the caller packs it first) or a size leaves `c_int`.
pub(crate) fn blas_op(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(c_int, c_int)> {
    let fits = |x: usize| c_int::try_from(x).ok();
    if cs == 1 || cols <= 1 {
        let ld = if rows <= 1 { cols.max(1) } else { rs };
        if ld >= cols.max(1) {
            return Some((CBLAS_NO_TRANS, fits(ld)?));
        }
    }
    if rs == 1 || rows <= 1 {
        let ld = if cols <= 1 { rows.max(1) } else { cs };
        if ld >= rows.max(1) {
            return Some((CBLAS_TRANS, fits(ld)?));
        }
    }
    None
}

/// Whether MKL can take this product as it is: A and B with a unit stride, C row-major
/// (the caller transposes a column-major C), every size within `c_int`.
pub(crate) fn accepts<T>(g: &RawGemm<T>) -> bool {
    let dims_fit = [g.m, g.n, g.k].iter().all(|&x| c_int::try_from(x).is_ok());
    dims_fit
        && blas_op(g.m, g.k, g.a_rs, g.a_cs).is_some()
        && blas_op(g.k, g.n, g.b_rs, g.b_cs).is_some()
        && matches!(blas_op(g.m, g.n, g.c_rs, g.c_cs), Some((CBLAS_NO_TRANS, _)))
}

/// Which 16-bit product MKL offers, if any.
impl Mkl {
    pub(crate) fn has_bf16(&self) -> bool {
        self.bf16.is_some()
    }

    pub(crate) fn has_f16(&self) -> bool {
        self.f16.is_some()
    }

    /// `C = alpha·A·B + beta·C` for f32, one sequential MKL call.
    ///
    /// # Safety
    /// `g` must describe memory valid for its views (built from checked views, see
    /// `crate::split`), `accepts(&g)` must hold, and no other thread writes C's elements.
    pub(crate) unsafe fn sgemm(&self, g: RawGemm<f32>) {
        if let Some((tb, ldb)) = blas_op(g.k, g.n, g.b_rs, g.b_cs) {
            // SAFETY: the caller's contract; `accepts(&g)` makes the call go ahead.
            unsafe { call_gemm(self.sgemm, g, tb, ldb) };
        }
    }

    /// `C = alpha·A·B + beta·C` for 16-bit inputs (`bf16` when `bf16` is true, else `f16`)
    /// and f32 C. Returns false (doing nothing) when this MKL lacks the function.
    ///
    /// # Safety
    /// As for [`Mkl::sgemm`].
    pub(crate) unsafe fn hgemm(&self, g: RawGemm<u16>, bf16: bool) -> bool {
        let Some(f) = (if bf16 { self.bf16 } else { self.f16 }) else {
            return false;
        };
        let Some((tb, ldb)) = blas_op(g.k, g.n, g.b_rs, g.b_cs) else {
            return false;
        };
        // SAFETY: the caller's contract.
        unsafe { call_gemm(f, g, tb, ldb) }
    }
}

/// Calls `f` (`cblas_sgemm` or a 16-bit product; the `_compute` forms take `CblasPacked` as
/// B's operation) on `g` with B passed as `(tb, ldb)`. Returns false, doing nothing, when
/// A or C does not suit MKL or a size leaves `c_int`.
///
/// # Safety
/// As for [`Mkl::sgemm`], with `g.b` the B (or packed B) that `tb` describes.
unsafe fn call_gemm<T>(f: GemmFn<T>, g: RawGemm<T>, tb: c_int, ldb: c_int) -> bool {
    let (Some((ta, lda)), Some((CBLAS_NO_TRANS, ldc))) = (
        blas_op(g.m, g.k, g.a_rs, g.a_cs),
        blas_op(g.m, g.n, g.c_rs, g.c_cs),
    ) else {
        return false;
    };
    if [g.m, g.n, g.k].iter().any(|&x| c_int::try_from(x).is_err()) {
        return false;
    }
    // SAFETY: the caller's contract; sizes fit `c_int` (checked above).
    unsafe {
        f(
            CBLAS_ROW_MAJOR,
            ta,
            tb,
            g.m as c_int,
            g.n as c_int,
            g.k as c_int,
            g.alpha,
            g.a,
            lda,
            g.b,
            ldb,
            g.beta,
            g.c,
            ldc,
        );
    }
    true
}

impl Mkl {
    /// The packed bf16 product, if this MKL has it.
    pub(crate) fn packed_bf16(&self) -> Option<PackedHgemm> {
        self.bf16_packed
    }
}

impl PackedHgemm {
    /// How many `u16` the packed form of a `k × n` B takes (for products of `m` rows), or
    /// `None` when a size leaves `c_int`.
    pub(crate) fn packed_b_len(&self, m: usize, n: usize, k: usize) -> Option<usize> {
        let (m, n, k) = (
            c_int::try_from(m).ok()?,
            c_int::try_from(n).ok()?,
            c_int::try_from(k).ok()?,
        );
        // SAFETY: a pure size query on plain integers.
        let bytes = unsafe { (self.size)(CBLAS_B_MATRIX, m, n, k) };
        Some(bytes.div_ceil(2))
    }

    /// Packs B (`g.b`, `k × n` with `g.b_rs`, `g.b_cs`) into `dest`. Returns false (doing
    /// nothing) when B has no unit stride, a size leaves `c_int`, or `dest` is shorter than
    /// [`PackedHgemm::packed_b_len`].
    ///
    /// # Safety
    /// `g.b` must address a `k × n` view valid for reads with its strides (built from checked
    /// views, see `crate::split`).
    pub(crate) unsafe fn pack_b(&self, g: &RawGemm<u16>, dest: &mut [u16]) -> bool {
        let Some((tb, ldb)) = blas_op(g.k, g.n, g.b_rs, g.b_cs) else {
            return false;
        };
        if self
            .packed_b_len(g.m, g.n, g.k)
            .is_none_or(|len| dest.len() < len)
        {
            return false;
        }
        // SAFETY: B is valid per the caller; `dest` holds the size MKL asked for; the sizes
        // fit `c_int` (checked by `packed_b_len`).
        unsafe {
            (self.pack)(
                CBLAS_ROW_MAJOR,
                CBLAS_B_MATRIX,
                tb,
                g.m as c_int,
                g.n as c_int,
                g.k as c_int,
                g.b,
                ldb,
                dest.as_mut_ptr(),
            );
        }
        true
    }

    /// `C = alpha·A·B + beta·C` with B packed by [`PackedHgemm::pack_b`] (same `n` and `k`),
    /// f32 C. Returns false (doing nothing) when A or C does not suit MKL.
    ///
    /// # Safety
    /// A and C as in [`Mkl::sgemm`]; `packed_b` must hold the packing of a `k × n` B made by
    /// this same `PackedHgemm`.
    pub(crate) unsafe fn compute(&self, g: RawGemm<u16>, packed_b: &[u16]) -> bool {
        let Ok(ldb) = c_int::try_from(g.n) else {
            return false;
        };
        let g = RawGemm {
            b: packed_b.as_ptr(),
            ..g
        };
        // SAFETY: the caller's contract; `g.b` is the packed B that `CblasPacked` announces.
        unsafe { call_gemm(self.compute, g, CBLAS_PACKED, ldb) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blas_op_layouts() {
        assert_eq!(blas_op(3, 4, 4, 1), Some((CBLAS_NO_TRANS, 4)));
        assert_eq!(blas_op(3, 4, 1, 3), Some((CBLAS_TRANS, 3)));
        assert_eq!(blas_op(3, 4, 8, 1), Some((CBLAS_NO_TRANS, 8)));
        assert_eq!(blas_op(3, 4, 2, 1), None); // rows overlap
        assert_eq!(blas_op(3, 4, 8, 2), None); // no unit stride
        assert_eq!(blas_op(1, 4, 0, 1), Some((CBLAS_NO_TRANS, 4)));
        assert_eq!(blas_op(3, 1, 1, 0), Some((CBLAS_NO_TRANS, 1)));
        assert_eq!(blas_op(3, 4, 0, 1), None); // broadcast rows: packed first
    }
}
