//! Options, timing and reporting shared by every benchmark case.

use std::time::Instant;

use serde::Serialize;

/// Which devices to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSel {
    Cpu,
    Cuda,
    All,
}

/// Command-line options.
#[derive(Debug)]
pub struct Options {
    pub json: bool,
    pub filter: Option<String>,
    pub devices: DeviceSel,
    /// `--quick`: the cases that honour it (`nn.rs`) time one call instead of rounds, and
    /// their records say `"quick": true`: a smoke test that the paths run, not a
    /// measurement.
    pub quick: bool,
    /// `--exact`: `--filter` names one case (and its `_rust` twin) instead of a substring, so
    /// that asking for `train_mlp_2000_1000_100_b128` does not also start the ranks of
    /// `ddp_train_mlp_2000_1000_100_b128_2ranks` (the side-by-side script asks this way).
    pub exact: bool,
}

impl Options {
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut opts = Options {
            json: false,
            filter: None,
            devices: DeviceSel::All,
            quick: false,
            exact: false,
        };
        while let Some(a) = args.next() {
            match a.as_str() {
                "--json" => opts.json = true,
                "--quick" => opts.quick = true,
                "--exact" => opts.exact = true,
                "--filter" => {
                    opts.filter = Some(args.next().ok_or("--filter needs a value")?);
                }
                "--device" => {
                    let v = args.next().ok_or("--device needs a value")?;
                    opts.devices = match v.as_str() {
                        "cpu" => DeviceSel::Cpu,
                        "cuda" => DeviceSel::Cuda,
                        "all" => DeviceSel::All,
                        other => {
                            return Err(format!(
                                "--device: expected cpu, cuda or all, found {other:?}"
                            ));
                        }
                    };
                }
                other => {
                    return Err(format!(
                        "unknown argument {other:?}; expected --json, --quick, --filter S, --exact, --device cpu|cuda|all"
                    ));
                }
            }
        }
        Ok(opts)
    }

    /// Whether a case of this name is selected by `--filter` (and `--exact`).
    pub fn wants(&self, name: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| {
            if self.exact {
                name == f || name.strip_suffix("_rust") == Some(f)
            } else {
                name.contains(f)
            }
        })
    }

    pub fn cpu(&self) -> bool {
        matches!(self.devices, DeviceSel::Cpu | DeviceSel::All)
    }

    pub fn cuda(&self) -> bool {
        matches!(self.devices, DeviceSel::Cuda | DeviceSel::All)
    }

    /// The devices selected, in the order the suites run them: the CPU, then `cuda:0`.
    pub fn device_list(&self) -> Vec<ember_device::Device> {
        let cpu = self.cpu().then_some(ember_device::Device::Cpu);
        let cuda = self.cuda().then_some(ember_device::Device::Cuda(0));
        cpu.into_iter().chain(cuda).collect()
    }
}

/// Decide, before any other CUDA call, what `cuda:N` means for this run: a real GPU when the
/// driver finds one, the emulator when `EMBER_CUDA_EMULATOR` asks for it, and otherwise the
/// emulator asked for explicitly here (records then carry `"emulated": true`).
pub fn choose_cuda_driver() -> Result<(), String> {
    use ember_device::driver::emulator::{ENV_EMULATOR, EmulatorConfig};
    use ember_device::driver::real::RealDriver;
    let asked = std::env::var(ENV_EMULATOR).is_ok_and(|v| !v.is_empty() && v != "0");
    if asked || RealDriver::probe().is_ok() {
        return Ok(());
    }
    ember_device::cuda::use_emulator(EmulatorConfig::devices(2)).map_err(|e| e.to_string())
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub name: String,
    pub device: String,
    pub threads: usize,
    pub value: f64,
    pub unit: &'static str,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Median of several rounds of `iters` calls of `f`, in nanoseconds per call.
pub fn ns_per_iter(rounds: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    // Warm up: steady state is what we measure (caches filled, pages touched).
    for _ in 0..iters.min(64) {
        f();
    }
    let mut samples: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The process's CPU time so far, in seconds: (user, system), from `getrusage`.
pub fn cpu_times() -> (f64, f64) {
    // SAFETY: `getrusage` fills the `rusage` it is given; a zeroed one is a valid start.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage`; RUSAGE_SELF is always accepted.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

/// Wall, user and system time of `f` (seconds), for a record's `wall_s`, `user_s`, `sys_s`
/// and `sys_fraction` (system time over wall time: page faults and other kernel work a
/// case makes the OS do).
pub fn with_times<R>(f: impl FnOnce() -> R) -> (R, [f64; 3]) {
    let (u0, s0) = cpu_times();
    let t = Instant::now();
    let r = f();
    let wall = t.elapsed().as_secs_f64();
    let (u1, s1) = cpu_times();
    (r, [wall, u1 - u0, s1 - s0])
}

/// Adds `wall_s`, `user_s`, `sys_s` and `sys_fraction` to a record's extras.
pub fn insert_times(extra: &mut serde_json::Map<String, serde_json::Value>, t: [f64; 3]) {
    let [wall, user, sys] = t;
    extra.insert("wall_s".into(), wall.into());
    extra.insert("user_s".into(), user.into());
    extra.insert("sys_s".into(), sys.into());
    if wall > 0.0 {
        extra.insert("sys_fraction".into(), (sys / wall).into());
    }
}

/// Print the records: one JSON array with `--json`, else an aligned table.
pub fn report(opts: &Options, records: &[Record]) {
    if opts.json {
        match serde_json::to_string_pretty(records) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("ember-bench: cannot serialise records: {e}"),
        }
        return;
    }
    println!(
        "{:<36} {:<10} {:>7} {:>14}  unit",
        "name", "device", "threads", "value"
    );
    for r in records {
        let extra = if r.extra.is_empty() {
            String::new()
        } else {
            format!("  {}", serde_json::Value::Object(r.extra.clone()))
        };
        println!(
            "{:<36} {:<10} {:>7} {:>14.2}  {}{}",
            r.name, r.device, r.threads, r.value, r.unit, extra
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_filters_name_one_case_and_its_rust_twin() {
        let args = |a: &[&str]| Options::parse(a.iter().map(|s| s.to_string())).unwrap();
        let sub = args(&["--filter", "train_mlp_2000_1000_100_b128"]);
        assert!(sub.wants("ddp_train_mlp_2000_1000_100_b128_2ranks"));
        let exact = args(&["--filter", "train_mlp_2000_1000_100_b128", "--exact"]);
        assert!(exact.wants("train_mlp_2000_1000_100_b128"));
        assert!(!exact.wants("ddp_train_mlp_2000_1000_100_b128_2ranks"));
        assert!(!exact.wants("train_mlp_2000_1000_100_b128_bf16"));
        let twin = args(&["--filter", "matmul_f32_n512", "--exact"]);
        assert!(twin.wants("matmul_f32_n512_rust"));
        assert!(!twin.wants("matmul_f32_n5120"));
    }
}
