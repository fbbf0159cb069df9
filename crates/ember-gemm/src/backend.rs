//! Which backend runs a product: the preference (`EMBER_CPU_BLAS`), what is present, and a
//! report for `ember info`.

use std::fmt;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::GemmError;
use crate::mkl;

/// A backend that ran (or will run) a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The pure-Rust `gemm` crate (AVX-512 kernels with `x86-v4` where the CPU has them, else
    /// AVX2/FMA, picked at run time); always available.
    Rust,
    /// Intel MKL, loaded at run time (`libmkl_rt`), its sequential layer on the parallel
    /// loop's threads (`crate::parallel`).
    Mkl,
}

impl Backend {
    /// Short lowercase name (`rust`, `mkl`), as in `EMBER_CPU_BLAS`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Rust => "rust",
            Backend::Mkl => "mkl",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `EMBER_CPU_BLAS` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preference {
    /// `auto` (or unset): on an Intel CPU, MKL where it is present and accepts the product;
    /// elsewhere, and for small f32 products, Rust (Note [MKL on Intel only]).
    Auto,
    /// `rust`: the pure-Rust backend only.
    Rust,
    /// `mkl`: MKL only; every call fails with [`GemmError::BackendUnavailable`] without it.
    Mkl,
}

impl Preference {
    /// Parses an `EMBER_CPU_BLAS` value (case-insensitive; empty means `auto`).
    pub fn parse(s: &str) -> Result<Preference, GemmError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Preference::Auto),
            "rust" => Ok(Preference::Rust),
            "mkl" => Ok(Preference::Mkl),
            _ => Err(GemmError::BadPreference(s.to_string())),
        }
    }
}

static PREFERENCE: OnceLock<Result<Preference, GemmError>> = OnceLock::new();

/// The preference from `EMBER_CPU_BLAS`, read once per process.
pub fn preference() -> Result<Preference, GemmError> {
    PREFERENCE
        .get_or_init(|| Preference::parse(&std::env::var("EMBER_CPU_BLAS").unwrap_or_default()))
        .clone()
}

// Note [MKL on Intel only]:
// MKL is Intel's library and picks its kernels by CPU vendor: on AMD it runs its generic
// AVX2 paths (`perf` showed `sgemm_kernel_0_zen` on Zen 3) whatever the CPU has. Side by
// side with PyTorch, 2 threads:
// - on an Intel Xeon with AVX-512, MKL was ahead of the Rust backend or level with it on
//   f32 squares;
// - on an AVX2-only AMD Zen 3, slightly ahead on squares but far behind on the
//   transposed-A product of a training step's weight gradient (`matmul_f32_2000x128x1000`),
//   with the whole training step level on either;
// - on an AMD Zen 4 with AVX-512, behind the Rust backend's AVX-512 kernels on every f32
//   shape and on bf16.
// So `auto` uses MKL on Intel CPUs only; `EMBER_CPU_BLAS=mkl` still forces it anywhere.
// The saved runs are in docs/performance.md and bench/results/.

/// Whether `auto` uses MKL on a CPU whose CPUID vendor string is `vendor`.
fn auto_uses_mkl_on(vendor: &str) -> bool {
    vendor == "GenuineIntel"
}

/// The CPU's vendor string from CPUID leaf 0 (`GenuineIntel`, `AuthenticAMD`, ...), or
/// `None` off x86-64.
pub(crate) fn cpu_vendor() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        // `__cpuid` is safe to call on x86-64, which always has CPUID.
        let r = std::arch::x86_64::__cpuid(0);
        let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Whether `auto` uses MKL (when present) on this CPU: Note [MKL on Intel only].
pub(crate) fn auto_uses_mkl() -> bool {
    static USES: OnceLock<bool> = OnceLock::new();
    *USES.get_or_init(|| cpu_vendor().is_some_and(|v| auto_uses_mkl_on(&v)))
}

/// The MKL library found, for [`BackendInfo`].
#[derive(Clone, Debug)]
pub struct MklInfo {
    /// Where it was loaded from.
    pub path: PathBuf,
    /// Its version string.
    pub version: String,
    /// Whether it has `cblas_gemm_bf16bf16f32`.
    pub bf16: bool,
    /// Whether it has `cblas_gemm_f16f16f32`.
    pub f16: bool,
}

/// What [`backend_info`] reports: the preference, MKL's presence, and the backend an
/// ordinary dense f32 product uses.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    /// `EMBER_CPU_BLAS`, parsed (or why it did not parse).
    pub preference: Result<Preference, GemmError>,
    /// MKL when loaded, else why not.
    pub mkl: Result<MklInfo, String>,
    /// The backend an ordinary dense f32 product runs on (`None`: none can, see
    /// `preference`).
    pub active: Option<Backend>,
    /// The CPU's vendor string, which decides `auto`'s choice (Note [MKL on Intel only]).
    pub cpu_vendor: Option<String>,
}

/// Reports which backend is active (loading MKL if it is not yet loaded).
pub fn backend_info() -> BackendInfo {
    let preference = preference();
    let mkl = mkl::get()
        .map(|m| MklInfo {
            path: m.path.clone(),
            version: m.version.clone(),
            bf16: m.has_bf16(),
            f16: m.has_f16(),
        })
        .map_err(str::to_string);
    let active = match (&preference, &mkl) {
        (Err(_), _) | (Ok(Preference::Mkl), Err(_)) => None,
        (Ok(Preference::Rust), _) | (Ok(Preference::Auto), Err(_)) => Some(Backend::Rust),
        (Ok(Preference::Auto), Ok(_)) if !auto_uses_mkl() => Some(Backend::Rust),
        (Ok(_), Ok(_)) => Some(Backend::Mkl),
    };
    BackendInfo {
        preference,
        mkl,
        active,
        cpu_vendor: cpu_vendor(),
    }
}

/// The backend an ordinary dense f32 product runs on (`None` when `EMBER_CPU_BLAS` asks for
/// one that is absent, or is not a known name).
pub fn active_backend() -> Option<Backend> {
    backend_info().active
}

impl fmt::Display for BackendInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pref = match &self.preference {
            Ok(Preference::Auto) => "auto".to_string(),
            Ok(Preference::Rust) => "rust".to_string(),
            Ok(Preference::Mkl) => "mkl".to_string(),
            Err(e) => format!("invalid ({e})"),
        };
        match self.active {
            Some(b) => write!(f, "cpu gemm: {b} (EMBER_CPU_BLAS={pref})")?,
            None => write!(f, "cpu gemm: none usable (EMBER_CPU_BLAS={pref})")?,
        }
        if matches!(self.preference, Ok(Preference::Auto))
            && self.mkl.is_ok()
            && self.active == Some(Backend::Rust)
        {
            let vendor = self.cpu_vendor.as_deref().unwrap_or("not x86-64");
            write!(
                f,
                "; auto uses MKL on Intel CPUs only, and this one is {vendor}"
            )?;
        }
        match &self.mkl {
            Ok(m) => write!(
                f,
                "; mkl: {} at {} (bf16: {}, f16: {})",
                m.version,
                m.path.display(),
                if m.bf16 { "yes" } else { "no" },
                if m.f16 { "yes" } else { "no" }
            )?,
            Err(e) => write!(f, "; mkl: absent ({e})")?,
        }
        write!(f, "; rust: gemm 0.19 (x86-v4), always available")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_preference() {
        assert_eq!(Preference::parse("").ok(), Some(Preference::Auto));
        assert_eq!(Preference::parse("MKL").ok(), Some(Preference::Mkl));
        assert_eq!(Preference::parse(" rust ").ok(), Some(Preference::Rust));
        assert!(Preference::parse("openblas").is_err());
    }

    #[test]
    fn auto_uses_mkl_on_intel_only() {
        assert!(auto_uses_mkl_on("GenuineIntel"));
        assert!(!auto_uses_mkl_on("AuthenticAMD"));
        assert!(!auto_uses_mkl_on("HygonGenuine"));
        #[cfg(target_arch = "x86_64")]
        {
            let v = cpu_vendor().unwrap_or_default();
            assert_eq!(v.len(), 12, "{v:?}");
            assert_eq!(auto_uses_mkl(), auto_uses_mkl_on(&v));
        }
    }

    #[test]
    fn info_displays() {
        let s = backend_info().to_string();
        assert!(s.starts_with("cpu gemm: "), "{s}");
    }
}
