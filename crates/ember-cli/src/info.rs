//! What `ember info` reports: the setup checks the walk-throughs print
//! (`torch.cuda.is_available()`, `device_count()`, names, properties, memory), as one value.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use ember_device::{Device, cuda};

/// Everything `ember info` prints. Serialises to the JSON object of `ember info --json`
/// (keys documented in `docs/cli.md`).
#[derive(Clone, Debug, Serialize)]
pub struct Info {
    /// Ember's version.
    pub ember_version: &'static str,
    /// `torch.cuda.is_available()`.
    pub cuda_available: bool,
    /// Why CUDA is not available; `None` when it is.
    pub cuda_unavailable_reason: Option<String>,
    /// Why Ember cannot run on the available CUDA devices though the driver is there: its
    /// kernels were not built into this program (Note [No fatbin] in `ember-kernels`);
    /// `None` when it can, or without CUDA.
    pub cuda_kernels_missing: Option<String>,
    /// Malformed Ember settings that were ignored, one line each naming the variable, what
    /// it takes and why it was ignored (`EMBER_CUDA_EMULATOR=abc`, ...); empty when none.
    pub ignored_settings: Vec<String>,
    /// `"real"`, `"emulator"`, or `None` without CUDA.
    pub cuda_driver: Option<&'static str>,
    /// The driver's CUDA version (`13000` = 13.0), when CUDA is available.
    pub cuda_driver_version: Option<i32>,
    /// `torch.cuda.device_count()`.
    pub device_count: usize,
    /// `torch.cuda.current_device()` of this thread, when CUDA is available.
    pub current_device: Option<usize>,
    /// One entry per CUDA device.
    pub devices: Vec<DeviceInfo>,
    /// The host CPU.
    pub cpu: CpuInfo,
    /// Per device (`"cpu"`, `"cuda:0"`, ...), the allocator's `memory_stats` keys.
    pub memory: BTreeMap<String, BTreeMap<String, i64>>,
    /// How conv2d runs on the current CUDA device; `None` without CUDA.
    pub conv: Option<ConvInfo>,
    /// How the profiler times device work (`ProfilerActivity::Cuda`; Note [Device activity]
    /// in `ember-device`): CUPTI's activity records where the driver loads CUPTI, CUDA events
    /// around each launch, library call and copy otherwise (and why); `None` without CUDA.
    pub profiler_device_timing: Option<String>,
    /// The clock the profiler stamps host events with (Note [Trace clock] in
    /// `ember-device`): `"tsc"` (the CPU's time-stamp counter, calibrated against the OS
    /// clock) or `"monotonic"` (the OS clock).
    pub profiler_clock: &'static str,
    /// Why that clock: the rule of Note [Trace clock] that decided (an invariant counter, a
    /// constant-rate one beside a slow OS clock, `EMBER_TRACE_CLOCK`, ...).
    pub profiler_clock_reason: &'static str,
    /// Whether NCCL (collectives among CUDA devices) is usable, and why not.
    pub nccl: NcclInfo,
}

/// NCCL through the driver seam (Note [NCCL through the seam] in `ember-device`).
#[derive(Clone, Debug, Serialize)]
pub struct NcclInfo {
    /// Whether collectives among CUDA devices can run.
    pub available: bool,
    /// `ncclGetVersion` (`22304` = 2.23.4), when NCCL loads.
    pub version: Option<i32>,
    /// The version in words (`2.23.4`, `2.23.4 (emulated)`), or why NCCL is not usable.
    pub reason: String,
}

/// How conv2d runs on CUDA: cuDNN or the im2col fallback, why, and the
/// `backends::cudnn` settings (Note [Convolutions on cuDNN]).
#[derive(Clone, Debug, Serialize)]
pub struct ConvInfo {
    /// `"cudnn"` or `"im2col"`.
    pub path: &'static str,
    /// The cuDNN version in words, or why the im2col path is taken.
    pub reason: String,
    /// `cudnnGetVersion` (`90100` = 9.1.0), when cuDNN loads.
    pub cudnn_version: Option<usize>,
    /// `backends::cudnn::allow_tf32`.
    pub allow_tf32: bool,
    /// `backends::cudnn::benchmark`.
    pub benchmark: bool,
    /// `backends::cudnn::deterministic`.
    pub deterministic: bool,
    /// Convolutions of this process that cuDNN could not run (they took im2col).
    pub fallbacks: Vec<String>,
    /// `EMBER_CUDNN_API` on a real GPU: `"auto"` (cuDNN's graph API, the legacy one for a
    /// shape it cannot plan), `"graph"` or `"legacy"`; `"emulated"` on the emulator, whose
    /// cuDNN has neither.
    pub cudnn_api: &'static str,
}

/// One CUDA device, as `get_device_properties` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceInfo {
    /// Ordinal.
    pub index: usize,
    /// Name; emulated devices say so.
    pub name: String,
    /// Total global memory, bytes.
    pub total_memory: u64,
    /// `[major, minor]`.
    pub compute_capability: [u32; 2],
    /// Streaming multiprocessors.
    pub multi_processor_count: u32,
    /// L2 cache, bytes.
    pub l2_cache_size: u64,
    /// Whether this is the CPU emulator's device.
    pub emulated: bool,
}

/// The host CPU.
#[derive(Clone, Debug, Serialize)]
pub struct CpuInfo {
    /// Logical cores available to this process.
    pub cores: usize,
    /// Model name, where the OS tells it.
    pub model: Option<String>,
    /// Vector and matrix features detected at run time (`avx2`, `avx512f`, `amx-bf16`, ...).
    pub features: Vec<&'static str>,
    /// The CPU matrix-multiply backend dense f32 products run on (`"rust"` or `"mkl"`), or
    /// `None` when `EMBER_CPU_BLAS` asks for one that is absent.
    pub gemm_backend: Option<String>,
    /// One line on the GEMM backends: the `EMBER_CPU_BLAS` preference, MKL found or why not.
    pub gemm: String,
}

/// Gather the information. Never fails: what cannot be read is reported as absent.
pub fn collect() -> Info {
    let available = cuda::is_available();
    let driver = cuda::driver().ok();
    let device_count = cuda::device_count();
    let mut devices = Vec::with_capacity(device_count);
    for index in 0..device_count {
        if let Ok(p) = cuda::get_device_properties(index) {
            devices.push(DeviceInfo {
                index,
                name: p.name,
                total_memory: p.total_memory,
                compute_capability: [p.major, p.minor],
                multi_processor_count: p.multi_processor_count,
                l2_cache_size: p.l2_cache_size,
                emulated: p.emulated,
            });
        }
    }
    let mut memory = BTreeMap::new();
    let all = std::iter::once(Device::Cpu).chain((0..device_count).map(Device::Cuda));
    for d in all {
        if let Ok(stats) = ember_memory::memory_stats(d) {
            memory.insert(d.to_string(), stats.0);
        }
    }
    Info {
        ember_version: env!("CARGO_PKG_VERSION"),
        cuda_available: available,
        cuda_unavailable_reason: cuda::unavailable_reason(),
        cuda_kernels_missing: crate::train::CudaState::probe().kernels_missing,
        ignored_settings: ember_device::driver::emulator::EmulatorConfig::env_problems(),
        cuda_driver: driver.as_ref().map(|d| d.kind().name()),
        cuda_driver_version: driver.as_ref().map(|d| d.driver_version()),
        device_count,
        current_device: if available {
            cuda::current_device().ok()
        } else {
            None
        },
        devices,
        cpu: cpu_info(),
        memory,
        conv: available.then(conv_info),
        profiler_device_timing: driver.as_deref().filter(|_| available).map(profiler_timing),
        profiler_clock: ember_device::trace::clock::source(),
        profiler_clock_reason: ember_device::trace::clock::reason(),
        nccl: nccl_info(driver.as_deref()),
    }
}

fn nccl_info(driver: Option<&dyn ember_device::driver::Driver>) -> NcclInfo {
    use ember_device::driver::{DriverKind, nccl_version_string};
    let outcome = match driver {
        Some(d) => d
            .nccl_version()
            .map(|v| {
                let emulated = if d.kind() == DriverKind::Emulated {
                    " (emulated)"
                } else {
                    ""
                };
                (v, format!("{}{emulated}", nccl_version_string(v)))
            })
            .map_err(|e| e.to_string()),
        None => Err(match ember_device::driver::real::probe_nccl() {
            Ok(v) => format!(
                "NCCL {} was found, but CUDA is not available",
                nccl_version_string(v)
            ),
            Err(why) => format!("CUDA is not available, and {why}"),
        }),
    };
    match outcome {
        Ok((v, words)) => NcclInfo {
            available: true,
            version: Some(v),
            reason: words,
        },
        Err(reason) => NcclInfo {
            available: false,
            version: None,
            reason,
        },
    }
}

/// The profiler's device timing on `d`, in words (Note [CUPTI through the seam]).
fn profiler_timing(d: &dyn ember_device::driver::Driver) -> String {
    let emulated = if cuda::is_emulated() {
        " (the emulator's, with its durations)"
    } else {
        ""
    };
    match d.activity_version() {
        Ok(v) => format!("CUPTI activity records, API version {v}{emulated}"),
        Err(e) => format!(
            "CUDA events recorded around each kernel launch, library call and copy on its \
             stream{emulated}; CUPTI is not used: {e}"
        ),
    }
}

fn conv_info() -> ConvInfo {
    use ember_tensor::backends::cudnn;
    let (path, reason) = cudnn::conv_path(cuda::current_device().unwrap_or(0));
    ConvInfo {
        path,
        reason,
        cudnn_version: cudnn::version(),
        allow_tf32: cudnn::allow_tf32(),
        benchmark: cudnn::benchmark(),
        deterministic: cudnn::deterministic(),
        fallbacks: cudnn::fallbacks(),
        cudnn_api: if cuda::is_emulated() {
            "emulated"
        } else {
            ember_device::driver::real::CudnnApi::from_env().name()
        },
    }
}

fn cpu_info() -> CpuInfo {
    let gemm = ember_gemm::backend_info();
    CpuInfo {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        model: cpu_model(),
        features: cpu_features(),
        gemm_backend: gemm.active.map(|b| b.to_string()),
        gemm: gemm.to_string(),
    }
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

#[cfg(target_arch = "x86_64")]
fn cpu_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    macro_rules! probe {
        ($($name:tt),*) => {$(
            if std::arch::is_x86_feature_detected!($name) {
                f.push($name);
            }
        )*};
    }
    probe!(
        "sse4.2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512dq",
        "avx512vnni",
        "avx512bf16",
        "avx512fp16"
    );
    // AMX is not detectable through the stable macro: read CPUID leaf 7 (EDX bits 22, 24).
    // SAFETY-free: `__cpuid_count` is safe to call on x86_64, which always has CPUID.
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf7.edx & (1 << 24) != 0 {
        f.push("amx-tile");
    }
    if leaf7.edx & (1 << 22) != 0 {
        f.push("amx-bf16");
    }
    f
}

#[cfg(target_arch = "aarch64")]
fn cpu_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    if std::arch::is_aarch64_feature_detected!("neon") {
        f.push("neon");
    }
    if std::arch::is_aarch64_feature_detected!("sve") {
        f.push("sve");
    }
    f
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn cpu_features() -> Vec<&'static str> {
    Vec::new()
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl Info {
    /// The human-readable report of `ember info`.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "Ember {}", self.ember_version);
        let _ = writeln!(s);
        let _ = writeln!(s, "CUDA available:   {}", self.cuda_available);
        if let Some(r) = &self.cuda_unavailable_reason {
            let _ = writeln!(s, "  why not:        {r}");
        }
        if let Some(r) = &self.cuda_kernels_missing {
            let _ = writeln!(s, "  but:            {r}");
        }
        for line in &self.ignored_settings {
            let _ = writeln!(s, "ignored setting:  {line}");
        }
        if let (Some(d), Some(v)) = (self.cuda_driver, self.cuda_driver_version) {
            let _ = writeln!(
                s,
                "CUDA driver:      {d} (CUDA {}.{})",
                v / 1000,
                (v % 1000) / 10
            );
        }
        let _ = writeln!(s, "device count:     {}", self.device_count);
        if let Some(c) = self.current_device {
            let _ = writeln!(s, "current device:   cuda:{c}");
        }
        for d in &self.devices {
            let _ = writeln!(s, "cuda:{}  {}", d.index, d.name);
            let _ = writeln!(
                s,
                "        total memory {}, compute capability {}.{}, {} multiprocessors, L2 {} MiB{}",
                gib(d.total_memory),
                d.compute_capability[0],
                d.compute_capability[1],
                d.multi_processor_count,
                d.l2_cache_size >> 20,
                if d.emulated { " (emulated)" } else { "" }
            );
        }
        if let Some(c) = &self.conv {
            let path = if c.path == "cudnn" {
                "cuDNN"
            } else {
                "im2col + cuBLAS"
            };
            let _ = writeln!(s, "conv2d on CUDA:   {path} ({})", c.reason);
            let _ = writeln!(
                s,
                "  cudnn settings: allow_tf32 {}, benchmark {}, deterministic {}, api {}",
                c.allow_tf32, c.benchmark, c.deterministic, c.cudnn_api
            );
            for f in &c.fallbacks {
                let _ = writeln!(s, "  fell back:      {f}");
            }
        }
        if let Some(t) = &self.profiler_device_timing {
            let _ = writeln!(s, "profiler (CUDA):  {t}");
        }
        let clock = match self.profiler_clock {
            "tsc" => "the CPU's time-stamp counter",
            _ => "the OS's monotonic clock",
        };
        let _ = writeln!(
            s,
            "profiler clock:   {clock} ({})",
            self.profiler_clock_reason
        );
        if self.nccl.available {
            let _ = writeln!(s, "NCCL:             {}", self.nccl.reason);
        } else {
            let _ = writeln!(s, "NCCL:             not available ({})", self.nccl.reason);
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "CPU:              {} ({} cores)",
            self.cpu.model.as_deref().unwrap_or("unknown model"),
            self.cpu.cores
        );
        let _ = writeln!(s, "  features:       {}", self.cpu.features.join(" "));
        let _ = writeln!(s, "  {}", self.cpu.gemm);
        let _ = writeln!(s);
        let _ = writeln!(s, "Memory (caching allocator):");
        for (dev, stats) in &self.memory {
            let get = |k: &str| stats.get(k).copied().unwrap_or(0);
            let _ = writeln!(
                s,
                "  {dev:<8} allocated {} B (peak {} B), reserved {} B (peak {} B), {} allocations, {} segments",
                get("allocated_bytes.all.current"),
                get("allocated_bytes.all.peak"),
                get("reserved_bytes.all.current"),
                get("reserved_bytes.all.peak"),
                get("allocation.all.current"),
                get("segment.all.current"),
            );
        }
        s
    }
}
