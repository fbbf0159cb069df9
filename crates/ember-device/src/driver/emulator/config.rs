//! The emulator's configuration: how many devices, and what each one claims to be.
//!
//! Read from the environment by [`EmulatorConfig::from_env`] (see the variables below), or
//! built in code with [`EmulatorConfig::devices`] and the `with_*` builders.
//!
//! - `EMBER_CUDA_EMULATOR=N`: present `N` emulated CUDA devices. Unset, empty or `0`: the
//!   emulator is off. Anything else is an error naming the variable and the value.
//! - `EMBER_CUDA_EMULATOR_MEMORY=SIZE`: each device's total memory, in bytes or with a unit
//!   suffix (`512MiB`, `2GiB`, `1GB`, `64KiB`, `4096`). Default 16 GiB.
//! - `EMBER_CUDA_EMULATOR_TRACE=FILE`: append the name of every launched kernel to `FILE`, once
//!   per name per process (read by `launch_trace.rs`, Note [Launch trace]; `cargo xtask test`'s
//!   launch-coverage check uses it).
//! - `EMBER_CUDA_EMULATOR_CUDNN=0`: the emulated cuDNN is absent (read by `cudnn.rs`, Note
//!   [Emulated cuDNN algorithms]); convolutions then take the im2col path.
//! - `EMBER_CUDA_EMULATOR_CUPTI=0`: the emulated activity API is absent (read by
//!   `activity.rs`, Note [CUPTI through the seam]); the profiler then times launches with
//!   events.

use crate::error::{DeviceError, Result};

/// The variable that switches the emulator on, with the number of devices.
pub const ENV_EMULATOR: &str = "EMBER_CUDA_EMULATOR";
/// The variable that sets each emulated device's total memory.
pub const ENV_EMULATOR_MEMORY: &str = "EMBER_CUDA_EMULATOR_MEMORY";

/// Most devices one emulator presents (the device field of a tagged address has 8 bits).
pub const MAX_EMULATED_DEVICES: usize = 256;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Default total memory of an emulated device: 16 GiB.
pub const DEFAULT_TOTAL_MEMORY: u64 = 16 * GIB;
/// Largest total memory of an emulated device: the 16 TiB offset field of a tagged address.
pub const MAX_TOTAL_MEMORY: u64 = 16 * TIB;

/// What one emulated device claims to be. The defaults are an H100's (sm_90, 132 SMs, 50 MiB
/// L2) except for the total memory (16 GiB).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmulatedDeviceConfig {
    /// Name reported by `get_device_name`; should say that the device is emulated.
    pub name: String,
    /// Total global memory in bytes; allocations beyond it fail with out-of-memory.
    pub total_memory: u64,
    /// Compute capability, major.
    pub major: u32,
    /// Compute capability, minor.
    pub minor: u32,
    /// Streaming multiprocessors.
    pub multi_processor_count: u32,
    /// L2 cache in bytes.
    pub l2_cache_size: u64,
    /// Shared memory per block with opt-in, bytes (the limit on a launch's dynamic shared
    /// memory).
    pub shared_memory_per_block_optin: u64,
}

impl Default for EmulatedDeviceConfig {
    fn default() -> Self {
        EmulatedDeviceConfig {
            name: "Ember Emulated CUDA Device (sm_90)".to_string(),
            total_memory: DEFAULT_TOTAL_MEMORY,
            major: 9,
            minor: 0,
            multi_processor_count: 132,
            l2_cache_size: 50 * MIB,
            shared_memory_per_block_optin: 227 * KIB,
        }
    }
}

/// The emulator's devices. Two configs are equal when every device is configured alike.
///
/// ```
/// use ember_device::driver::emulator::EmulatorConfig;
/// let config = EmulatorConfig::devices(2).with_total_memory(1 << 30);
/// assert_eq!(config.devices.len(), 2);
/// assert_eq!(config.devices[1].total_memory, 1 << 30);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmulatorConfig {
    /// One entry per device, in ordinal order.
    pub devices: Vec<EmulatedDeviceConfig>,
}

impl EmulatorConfig {
    /// `n` devices with the default (H100-like, 16 GiB) configuration.
    pub fn devices(n: usize) -> Self {
        EmulatorConfig {
            devices: vec![EmulatedDeviceConfig::default(); n],
        }
    }

    /// Set every device's total memory.
    pub fn with_total_memory(mut self, bytes: u64) -> Self {
        for d in &mut self.devices {
            d.total_memory = bytes;
        }
        self
    }

    /// Set every device's compute capability (and the `sm_XY` in the default name).
    pub fn with_compute_capability(mut self, major: u32, minor: u32) -> Self {
        for d in &mut self.devices {
            d.major = major;
            d.minor = minor;
            d.name = format!("Ember Emulated CUDA Device (sm_{major}{minor})");
        }
        self
    }

    /// Check the configuration: device count and memory within the tagged address layout.
    pub fn validate(&self) -> Result<()> {
        if self.devices.len() > MAX_EMULATED_DEVICES {
            return Err(DeviceError::Emulator(format!(
                "at most {MAX_EMULATED_DEVICES} emulated devices are supported, found {}",
                self.devices.len()
            )));
        }
        for (i, d) in self.devices.iter().enumerate() {
            if d.total_memory > MAX_TOTAL_MEMORY {
                return Err(DeviceError::Emulator(format!(
                    "emulated device {i}: total memory must be at most {MAX_TOTAL_MEMORY} bytes (16 TiB), found {}",
                    d.total_memory
                )));
            }
        }
        Ok(())
    }

    /// The configuration asked for by `EMBER_CUDA_EMULATOR` and `EMBER_CUDA_EMULATOR_MEMORY`;
    /// `None` when the emulator is not asked for. See the module docs.
    pub fn from_env() -> Result<Option<Self>> {
        let count = std::env::var_os(ENV_EMULATOR).map(|v| v.to_string_lossy().into_owned());
        let memory =
            std::env::var_os(ENV_EMULATOR_MEMORY).map(|v| v.to_string_lossy().into_owned());
        Self::from_env_values(count.as_deref(), memory.as_deref())
    }

    /// [`EmulatorConfig::from_env`] on given values (`None` for an unset variable), so that
    /// parsing is testable without touching the process environment.
    pub fn from_env_values(count: Option<&str>, memory: Option<&str>) -> Result<Option<Self>> {
        let Some(count) = count.map(str::trim).filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let n: usize = count.parse().map_err(|_| {
            DeviceError::Emulator(format!(
                "{ENV_EMULATOR}={count:?} is not a device count: expected a non-negative integer (0 or unset turns the emulator off)"
            ))
        })?;
        if n == 0 {
            return Ok(None);
        }
        if n > MAX_EMULATED_DEVICES {
            return Err(DeviceError::Emulator(format!(
                "{ENV_EMULATOR}={count:?}: expected a device count of at most {MAX_EMULATED_DEVICES} (at most {MAX_EMULATED_DEVICES} emulated devices are supported)"
            )));
        }
        let mut config = EmulatorConfig::devices(n);
        if let Some(mem) = memory.map(str::trim).filter(|s| !s.is_empty()) {
            let bytes = parse_size(mem).map_err(|why| {
                DeviceError::Emulator(format!("{ENV_EMULATOR_MEMORY}={mem:?}: {why}"))
            })?;
            config = config.with_total_memory(bytes);
        }
        config.validate()?;
        Ok(Some(config))
    }
}

impl EmulatorConfig {
    /// What is wrong with `EMBER_CUDA_EMULATOR` and `EMBER_CUDA_EMULATOR_MEMORY` as the
    /// process sees them: one line per problem, naming the variable, what it takes and that
    /// it was ignored; empty when both are well-formed or unset. `ember info` prints these
    /// lines; CUDA discovery ([`crate::cuda::driver`]) returns the error itself.
    pub fn env_problems() -> Vec<String> {
        let get = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
        Self::env_problems_of(
            get(ENV_EMULATOR).as_deref(),
            get(ENV_EMULATOR_MEMORY).as_deref(),
        )
    }

    /// [`EmulatorConfig::env_problems`] on given values (`None` for an unset variable).
    pub fn env_problems_of(count: Option<&str>, memory: Option<&str>) -> Vec<String> {
        match Self::from_env_values(count, memory) {
            Err(e) => vec![format!(
                "{e}; the setting was ignored (the emulator is off, and CUDA discovery reports this error)"
            )],
            Ok(Some(_)) => Vec::new(),
            Ok(None) => {
                let mem = memory.map(str::trim).filter(|s| !s.is_empty());
                match mem.map(|m| (m, parse_size(m))) {
                    Some((m, Err(why))) => vec![format!(
                        "{ENV_EMULATOR_MEMORY}={m:?}: {why}; the setting was ignored ({ENV_EMULATOR} does not turn the emulator on)"
                    )],
                    _ => Vec::new(),
                }
            }
        }
    }
}

/// Whether `var` is set to `0`, which switches an emulated library off for the process
/// (`EMBER_CUDA_EMULATOR_CUDNN`, `EMBER_CUDA_EMULATOR_CUPTI`); unset or anything else
/// leaves it on.
pub(super) fn switched_off(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| v.to_string_lossy().trim() == "0")
}

/// Parse a byte size: a non-negative integer with an optional unit, `B`, `KB`/`MB`/`GB`/`TB`
/// (powers of 1000), `KiB`/`MiB`/`GiB`/`TiB` or `K`/`M`/`G`/`T` (powers of 1024); units are
/// case-insensitive and may follow a space.
///
/// ```
/// use ember_device::driver::emulator::parse_size;
/// assert_eq!(parse_size("512MiB"), Ok(512 << 20));
/// assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
/// assert!(parse_size("lots").is_err());
/// ```
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let expected = "expected a byte count such as 1073741824, 512MiB, 2GiB or 1GB";
    if digits.is_empty() {
        return Err(format!("{expected}, found {s:?}"));
    }
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{expected}, found {s:?} (number too large)"))?;
    let multiplier = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => TIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("{expected}, found {s:?} (unknown unit {unit:?})")),
    };
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{expected}, found {s:?} (overflows 64 bits)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512MiB"), Ok(512 * MIB));
        assert_eq!(parse_size("2GiB"), Ok(2 * GIB));
        assert_eq!(parse_size("2 gib"), Ok(2 * GIB));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("64K"), Ok(64 * KIB));
        assert_eq!(parse_size(" 3b "), Ok(3));
        for bad in [
            "",
            "GiB",
            "1.5GiB",
            "-1",
            "12 parsecs",
            "99999999999999999999",
            "16777216TiB",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.contains("expected a byte count"), "{bad}: {err}");
        }
    }

    #[test]
    fn env_values_turn_the_emulator_on_and_off() {
        assert_eq!(EmulatorConfig::from_env_values(None, None), Ok(None));
        assert_eq!(EmulatorConfig::from_env_values(Some(""), None), Ok(None));
        assert_eq!(EmulatorConfig::from_env_values(Some("0"), None), Ok(None));
        let two = EmulatorConfig::from_env_values(Some("2"), None)
            .unwrap()
            .unwrap();
        assert_eq!(two, EmulatorConfig::devices(2));
        let small = EmulatorConfig::from_env_values(Some("3"), Some("512MiB"))
            .unwrap()
            .unwrap();
        assert_eq!(small.devices.len(), 3);
        assert!(small.devices.iter().all(|d| d.total_memory == 512 * MIB));
    }

    #[test]
    fn bad_env_values_name_the_variable_and_value() {
        let err = EmulatorConfig::from_env_values(Some("two"), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(ENV_EMULATOR) && err.contains("\"two\""),
            "{err}"
        );
        let err = EmulatorConfig::from_env_values(Some("1"), Some("lots"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(ENV_EMULATOR_MEMORY) && err.contains("\"lots\""),
            "{err}"
        );
        let err = EmulatorConfig::from_env_values(Some("1000"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 256"), "{err}");
        let err = EmulatorConfig::from_env_values(Some("1"), Some("17TiB"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("16 TiB"), "{err}");
    }

    #[test]
    fn env_problems_name_the_variable_and_say_it_was_ignored() {
        for (count, memory, var) in [
            (Some("abc"), None, ENV_EMULATOR),
            (Some("-1"), None, ENV_EMULATOR),
            (Some("100000"), None, ENV_EMULATOR),
            (Some("2"), Some("garbage"), ENV_EMULATOR_MEMORY),
            (None, Some("garbage"), ENV_EMULATOR_MEMORY),
        ] {
            let p = EmulatorConfig::env_problems_of(count, memory);
            assert_eq!(p.len(), 1, "{count:?} {memory:?}: {p:?}");
            assert!(p[0].contains(var) && p[0].contains("ignored"), "{p:?}");
            assert!(p[0].contains("expected"), "{p:?}");
        }
        assert!(
            EmulatorConfig::env_problems_of(Some("-1"), None)[0].contains("non-negative integer")
        );
        assert!(EmulatorConfig::env_problems_of(Some("100000"), None)[0].contains("at most 256"));
        assert!(EmulatorConfig::env_problems_of(Some("2"), Some("1GiB")).is_empty());
        assert!(EmulatorConfig::env_problems_of(None, None).is_empty());
        assert!(EmulatorConfig::env_problems_of(Some("0"), None).is_empty());
    }

    #[test]
    fn default_devices_say_they_are_emulated() {
        let d = EmulatedDeviceConfig::default();
        assert!(d.name.contains("Emulated"));
        assert_eq!((d.major, d.minor, d.multi_processor_count), (9, 0, 132));
        assert_eq!(d.total_memory, 16 * GIB);
    }
}
