//! `cargo xtask kernels [--install-nvcc]`: compile `kernels/*.cu` with nvcc into one fatbin,
//! `target/kernels/ember.fatbin`, which `ember-kernels` embeds (see `kernels/README.md`).
//!
//! - nvcc comes from `PATH`, `CUDA_HOME`/`CUDA_PATH`, or `target/nvcc` (where
//!   `--install-nvcc` pip-installs the five CUDA 13.0 wheels pinned below; see
//!   `docs/cuda-without-gpu.md` for why all five are pinned).
//! - One translation unit includes every `.cu` file; the fatbin holds SASS for
//!   [`SASS_ARCHS`] and `compute_90` PTX for newer GPUs to JIT.
//! - The build fails if the PTX is not ISA [`PTX_ISA`] (what the R580 driver branch loads), or
//!   if ptxas reports register spills or local memory for a kernel not listed in
//!   [`LOCAL_MEMORY_ALLOWED`] with a reason.
//! - Beside the fatbin it writes `ember.kernels` (the entry points, one per line) and
//!   `ptxas.txt` (ptxas's report); a failed build leaves no fatbin behind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::{root, run_step};

/// The CUDA 13.0 wheels that make a working nvcc, pinned together (docs/cuda-without-gpu.md).
const NVCC_WHEELS: [&str; 5] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];

/// Architectures that get SASS: every one CUDA 13.0 supports from sm_75 to sm_90, plus the
/// datacenter and consumer Blackwell parts.
const SASS_ARCHS: [u32; 7] = [75, 80, 86, 89, 90, 100, 120];
/// The virtual architecture whose PTX is embedded for GPUs newer than the SASS list.
const PTX_ARCH: u32 = 90;
/// The PTX ISA nvcc 13.0 writes; R580 drivers reject newer (docs/cuda-without-gpu.md).
const PTX_ISA: &str = "9.0";

/// Kernels allowed to spill registers or use local memory, each with the reason.
const LOCAL_MEMORY_ALLOWED: &[(&str, &str)] = &[
    ("usin_f32", TRIG_REDUCTION),
    ("usin_f64", TRIG_REDUCTION),
    ("usin_f16", TRIG_REDUCTION),
    ("usin_bf16", TRIG_REDUCTION),
    ("ucos_f32", TRIG_REDUCTION),
    ("ucos_f64", TRIG_REDUCTION),
    ("ucos_f16", TRIG_REDUCTION),
    ("ucos_bf16", TRIG_REDUCTION),
];

/// Why sin and cos have a stack frame.
const TRIG_REDUCTION: &str = "CUDA's sin/cos reduce huge arguments (Payne-Hanek, \
    `__internal_trig_reduction_slowpathd`) through a 40-byte local array, which only that slow \
    path for very large |x| touches";

pub fn run(args: &[String]) -> Result<(), String> {
    let mut install = false;
    for a in args {
        match a.as_str() {
            "--install-nvcc" => install = true,
            other => {
                return Err(format!(
                    "`kernels` takes only --install-nvcc, found {other:?}"
                ));
            }
        }
    }
    let start = Instant::now();
    let nvcc = if install {
        install_nvcc()?
    } else {
        find_nvcc()?
    };
    let installed = start.elapsed();
    eprintln!("==> nvcc: {} ({})", nvcc.display(), nvcc_release(&nvcc));

    let compile_start = Instant::now();
    let out = root().join("target").join("kernels");
    let report = build(&nvcc, &out, &SASS_ARCHS, PTX_ARCH)?;
    let compiled = compile_start.elapsed();
    print_summary(&report);
    eprintln!(
        "==> wrote target/kernels/ember.fatbin: {} kernels, SASS for sm_{} + compute_{PTX_ARCH} PTX (ISA {PTX_ISA}); \
         nvcc {:.1} s, install/find {:.1} s, total {:.1} s",
        report.names.len(),
        SASS_ARCHS.map(|a| a.to_string()).join("/sm_"),
        compiled.as_secs_f64(),
        installed.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---- finding or installing nvcc -------------------------------------------------------------

fn installed_nvcc() -> PathBuf {
    nvcc_prefix()
        .join("nvidia")
        .join("cu13")
        .join("bin")
        .join("nvcc")
}

fn nvcc_prefix() -> PathBuf {
    root().join("target").join("nvcc")
}

/// nvcc from PATH, CUDA_HOME, CUDA_PATH, or a previous `--install-nvcc`, in that order.
pub fn find_nvcc() -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            candidates.push(PathBuf::from(home).join("bin").join("nvcc"));
        }
    }
    candidates.push(installed_nvcc());
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        "no nvcc on PATH, in $CUDA_HOME/bin or $CUDA_PATH/bin, or in target/nvcc; \
         run `cargo xtask kernels --install-nvcc` to install CUDA 13.0's from PyPI"
            .to_string()
    })
}

/// pip-installs the pinned wheels into `target/nvcc` (unless that exact set is already
/// there) and returns its nvcc.
fn install_nvcc() -> Result<PathBuf, String> {
    let prefix = nvcc_prefix();
    let stamp = prefix.join("ember-wheels.txt");
    let wanted = NVCC_WHEELS.join("\n");
    let nvcc = installed_nvcc();
    if nvcc.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        eprintln!("==> nvcc wheels already installed in {}", prefix.display());
        return Ok(nvcc);
    }
    if prefix.exists() {
        std::fs::remove_dir_all(&prefix).map_err(|e| format!("{}: {e}", prefix.display()))?;
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run_step(
        &format!(
            "pip install {} into {}",
            NVCC_WHEELS.join(" "),
            prefix.display()
        ),
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-warn-script-location",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&prefix)
            .args(NVCC_WHEELS),
    )?;
    if !nvcc.is_file() {
        return Err(format!(
            "the wheels installed no nvcc at {}",
            nvcc.display()
        ));
    }
    std::fs::write(&stamp, wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(nvcc)
}

/// The "release X.Y" part of `nvcc --version`, for the log.
fn nvcc_release(nvcc: &Path) -> String {
    Command::new(nvcc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.contains("release"))
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "version unknown".into())
}

// ---- the build ----------------------------------------------------------------------------

/// What ptxas said about one kernel on one architecture.
#[derive(Debug, Default, Clone)]
struct Usage {
    registers: u32,
    stack_bytes: u32,
    spill_stores: u32,
    spill_loads: u32,
    lmem_bytes: u32,
}

#[derive(Debug, Default)]
pub struct Report {
    /// kernel → architecture → usage.
    usage: BTreeMap<String, BTreeMap<String, Usage>>,
    names: BTreeSet<String>,
}

impl Report {
    /// How many entry points the fatbin has.
    pub fn kernel_count(&self) -> usize {
        self.names.len()
    }
}

/// Compiles every `kernels/*.cu` into `out/ember.fatbin` with SASS for `archs` and PTX for
/// `ptx_arch` (which must be one of them), and writes `out/ember.kernels` and
/// `out/ptxas.txt`; fails on a wrong PTX ISA or on spills and local memory.
pub fn build(nvcc: &Path, out: &Path, archs: &[u32], ptx_arch: u32) -> Result<Report, String> {
    let kernels = root().join("kernels");
    let work = out.join("build");
    let fatbin = out.join("ember.fatbin");
    let names_file = out.join("ember.kernels");
    // A failed build must not leave an old fatbin that no longer matches the sources.
    for stale in [&fatbin, &names_file] {
        let _ = std::fs::remove_file(stale);
    }
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    }
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;

    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .map_err(|e| format!("{}: {e}", kernels.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    let umbrella = work.join("ember_all.cu");
    let text: String = sources
        .iter()
        .map(|s| format!("#include \"{}\"\n", s.display()))
        .collect();
    std::fs::write(&umbrella, text).map_err(|e| format!("{}: {e}", umbrella.display()))?;

    let mut cmd = Command::new(nvcc);
    cmd.current_dir(&work)
        .args(["-fatbin", "-O3", "-Xptxas", "-v", "--keep", "--keep-dir"])
        .arg(&work)
        // Compressed device code: every test binary (and `ember`) embeds the fatbin.
        // Uncompressed, as `-fatbin` leaves it by default, it weighs 50 MB for seven
        // architectures against about 5 MB compressed, paid once per test binary on disk.
        // The driver decompresses it in `cuModuleLoadData`; CUDA 13's compressed fatbins
        // need driver 580 or later, which its PTX ISA needs already.
        .arg("--compress-mode=size")
        .arg("-I")
        .arg(&kernels)
        .arg("-o")
        .arg(work.join("ember.fatbin"));
    for &arch in archs {
        let code = if arch == ptx_arch {
            format!("[sm_{arch},compute_{arch}]")
        } else {
            format!("sm_{arch}")
        };
        cmd.arg("-gencode")
            .arg(format!("arch=compute_{arch},code={code}"));
    }
    cmd.arg(&umbrella);
    eprintln!(
        "==> nvcc -fatbin ({} sources, {} architectures)",
        sources.len(),
        archs.len()
    );
    let output = cmd
        .output()
        .map_err(|e| format!("could not run {}: {e}", nvcc.display()))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(out.join("ptxas.txt"), &log).map_err(|e| format!("ptxas.txt: {e}"))?;
    if !output.status.success() {
        return Err(format!("nvcc failed ({}):\n{log}", output.status));
    }

    check_ptx_versions(&work)?;
    let report = parse_ptxas(&log);
    if report.names.is_empty() {
        return Err(format!("ptxas reported no kernels; its output:\n{log}"));
    }
    check_local_memory(&report)?;

    let names: String = report.names.iter().map(|n| format!("{n}\n")).collect();
    std::fs::write(&names_file, names).map_err(|e| format!("{}: {e}", names_file.display()))?;
    std::fs::rename(work.join("ember.fatbin"), &fatbin)
        .map_err(|e| format!("{}: {e}", fatbin.display()))?;
    Ok(report)
}

/// Every PTX file nvcc kept must declare ISA [`PTX_ISA`].
fn check_ptx_versions(work: &Path) -> Result<(), String> {
    let mut seen = 0;
    for entry in std::fs::read_dir(work)
        .map_err(|e| format!("{}: {e}", work.display()))?
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "ptx") {
            continue;
        }
        seen += 1;
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let version = text
            .lines()
            .find_map(|l| l.trim().strip_prefix(".version "))
            .map(str::trim)
            .unwrap_or("(none)");
        if version != PTX_ISA {
            return Err(format!(
                "{} declares PTX ISA {version}, not {PTX_ISA}: R580 drivers cannot load it. \
                 Use CUDA 13.0's nvcc with all five wheels pinned (`cargo xtask kernels --install-nvcc`)",
                path.display()
            ));
        }
    }
    if seen == 0 {
        return Err(format!("nvcc kept no PTX in {}", work.display()));
    }
    Ok(())
}

/// The number before `word` in `text` ("12 bytes spill stores" → 12 for "bytes spill stores").
fn number_before(text: &str, word: &str) -> Option<u32> {
    let at = text.find(word)?;
    text[..at].split_whitespace().last()?.parse().ok()
}

/// Reads ptxas's `-v` report: "Compiling entry function 'NAME' for 'sm_XX'", then "N bytes
/// stack frame, S bytes spill stores, L bytes spill loads" and "Used R registers, ... M bytes
/// lmem, ...".
fn parse_ptxas(log: &str) -> Report {
    let mut report = Report::default();
    let mut current: Option<(String, String)> = None;
    for line in log.lines() {
        // The "Function properties" of the entry come first, then those of the functions
        // it calls (`__internal_trig_reduction_slowpathd`): each is part of the kernel, so
        // the largest of each figure counts, not the last one read.
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let name = parts.next().unwrap_or_default().to_string();
            let arch = parts.nth(1).unwrap_or_default().to_string();
            report.names.insert(name.clone());
            current = Some((name, arch));
            continue;
        }
        let Some((name, arch)) = &current else {
            continue;
        };
        let usage = report
            .usage
            .entry(name.clone())
            .or_default()
            .entry(arch.clone())
            .or_default();
        let figure = |what: &str| number_before(line, what).unwrap_or(0);
        if line.contains("bytes stack frame") {
            usage.stack_bytes = usage.stack_bytes.max(figure("bytes stack frame"));
            usage.spill_stores = usage.spill_stores.max(figure("bytes spill stores"));
            usage.spill_loads = usage.spill_loads.max(figure("bytes spill loads"));
        } else if line.contains("Used") && line.contains("registers") {
            usage.registers = figure("registers");
            usage.lmem_bytes = usage.lmem_bytes.max(figure("bytes lmem"));
            usage.stack_bytes = usage.stack_bytes.max(figure("bytes cumulative stack size"));
        }
    }
    report
}

/// Spills, local memory or a stack frame in a kernel not on the allowlist fail the build.
fn check_local_memory(report: &Report) -> Result<(), String> {
    let mut problems = Vec::new();
    for (name, archs) in &report.usage {
        if LOCAL_MEMORY_ALLOWED.iter().any(|(n, _)| n == name) {
            continue;
        }
        for (arch, u) in archs {
            if u.spill_stores + u.spill_loads + u.lmem_bytes + u.stack_bytes > 0 {
                problems.push(format!(
                    "  {name} on {arch}: {} bytes spill stores, {} bytes spill loads, {} bytes lmem, {} bytes stack",
                    u.spill_stores, u.spill_loads, u.lmem_bytes, u.stack_bytes
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "kernels use local memory (fix them, or list them with a reason in LOCAL_MEMORY_ALLOWED in xtask/src/kernels.rs):\n{}",
            problems.join("\n")
        ))
    }
}

fn print_summary(report: &Report) {
    eprintln!(
        "==> ptxas: registers per kernel (max over architectures), no spills or local memory"
    );
    for (name, archs) in &report.usage {
        let max = archs.values().map(|u| u.registers).max().unwrap_or(0);
        let per_arch: Vec<String> = archs
            .iter()
            .map(|(a, u)| format!("{a}:{}", u.registers))
            .collect();
        eprintln!("    {name:<36} {max:>3} regs  ({})", per_arch.join(" "));
    }
    for (name, reason) in LOCAL_MEMORY_ALLOWED {
        eprintln!("    allowed to use local memory: {name}: {reason}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_ptxas_report() {
        let log = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'ember_fill_f32' for 'sm_75'
ptxas info    : Function properties for ember_fill_f32
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'ember_big' for 'sm_90'
ptxas info    : Function properties for ember_big
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16 bytes lmem, 400 bytes cmem[0]
ptxas info    : Function properties for __internal_trig_reduction_slowpathd
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'ember_trig' for 'sm_90'
ptxas info    : Function properties for ember_trig
    40 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 40 bytes cumulative stack size
ptxas info    : Function properties for __internal_trig_reduction_slowpathd
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";
        let r = parse_ptxas(log);
        assert_eq!(r.names.len(), 3);
        // The callee's line after the entry's does not hide the entry's stack frame.
        let trig = &r.usage["ember_trig"]["sm_90"];
        assert_eq!((trig.registers, trig.stack_bytes), (40, 40));
        let fill = &r.usage["ember_fill_f32"]["sm_75"];
        assert_eq!(
            (fill.registers, fill.spill_stores, fill.lmem_bytes),
            (10, 0, 0)
        );
        let big = &r.usage["ember_big"]["sm_90"];
        assert_eq!(
            (
                big.registers,
                big.stack_bytes,
                big.spill_stores,
                big.spill_loads,
                big.lmem_bytes
            ),
            (255, 16, 8, 4, 16)
        );
        let err = check_local_memory(&r).unwrap_err();
        assert!(
            err.contains("ember_big on sm_90")
                && err.contains("ember_trig on sm_90")
                && !err.contains("ember_fill_f32"),
            "{err}"
        );
    }
}
