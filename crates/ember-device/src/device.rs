//! [`Device`]: where a tensor lives, spelled as PyTorch spells it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::DeviceError;

/// A compute device: the host CPU, or the CUDA device with the given ordinal.
///
/// Parses from and displays as PyTorch's strings: `"cpu"`, `"cuda"` (the thread's current
/// CUDA device, [`crate::cuda::current_device`], resolved when parsed: after
/// `set_device(1)` it is `cuda:1`, as `x.to("cuda")` and `x.cuda()` are), `"cuda:1"`.
///
/// ```
/// use ember_device::Device;
/// let d: Device = "cuda:1".parse().unwrap();
/// assert_eq!(d, Device::Cuda(1));
/// assert_eq!(d.to_string(), "cuda:1");
/// assert!("tpu".parse::<Device>().is_err());
/// ```
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Device {
    /// The host CPU (the default).
    #[default]
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

/// A device by reference where one is taken by value: every call that takes a device
/// takes `device` or `&device`.
impl From<&Device> for Device {
    fn from(d: &Device) -> Device {
        *d
    }
}

impl Device {
    /// `true` for `cuda:N`.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// `true` for `cpu`.
    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// The CUDA ordinal, if this is a CUDA device.
    pub fn cuda_index(&self) -> Option<usize> {
        match self {
            Device::Cuda(i) => Some(*i),
            Device::Cpu => None,
        }
    }

    /// `"cpu"` or `"cuda"`: the device type without its index (PyTorch's `device.type`).
    pub fn type_name(&self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
        }
    }

    /// The walk-throughs' `torch.device("cuda" if torch.cuda.is_available() else "cpu")`:
    /// the thread's current CUDA device when CUDA is available, else the CPU.
    pub fn cuda_if_available() -> Device {
        if crate::cuda::is_available() {
            Device::Cuda(crate::cuda::current_device().unwrap_or(0))
        } else {
            Device::Cpu
        }
    }
}

/// d2l's `try_gpu(i)`: `cuda:i` if that device exists, else `cpu`.
pub fn try_gpu(i: usize) -> Device {
    if i < crate::cuda::device_count() {
        Device::Cuda(i)
    } else {
        Device::Cpu
    }
}

/// d2l's `try_all_gpus()`: every CUDA device, or `[cpu]` when there is none.
pub fn try_all_gpus() -> Vec<Device> {
    let n = crate::cuda::device_count();
    if n == 0 {
        vec![Device::Cpu]
    } else {
        (0..n).map(Device::Cuda).collect()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DeviceError::Parse {
            found: s.to_string(),
        };
        let t = s.trim();
        match t {
            "cpu" => return Ok(Device::Cpu),
            "cuda" => return Ok(Device::Cuda(crate::cuda::current_index())),
            _ => {}
        }
        let Some(idx) = t.strip_prefix("cuda:") else {
            return Err(bad());
        };
        if idx.is_empty() || !idx.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        idx.parse::<usize>().map(Device::Cuda).map_err(|_| bad())
    }
}

impl TryFrom<&str> for Device {
    type Error = DeviceError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pytorch_spellings() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:0".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:13".parse::<Device>().unwrap(), Device::Cuda(13));
    }

    #[test]
    fn rejects_bad_strings_naming_accepted_forms() {
        for bad in [
            "cuda:x", "tpu", "cuda:-1", "cuda:", "CUDA", "cuda:1:2", "", "cpu:0", "cuda: 1",
        ] {
            let err = bad.parse::<Device>().unwrap_err().to_string();
            assert!(
                err.contains("cpu") && err.contains("cuda:N"),
                "{bad}: {err}"
            );
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn displays_as_pytorch() {
        assert_eq!(Device::Cpu.to_string(), "cpu");
        assert_eq!(Device::Cuda(0).to_string(), "cuda:0");
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
    }

    proptest::proptest! {
        #[test]
        fn display_parse_round_trip(i in 0usize..100_000) {
            let d = Device::Cuda(i);
            proptest::prop_assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in ".{0,12}") {
            let _ = s.parse::<Device>();
        }
    }
}
