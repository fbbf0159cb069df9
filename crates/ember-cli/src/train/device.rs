//! `--device`: which device a run trains on, and why.

use ember_device::{Device, cuda};
use ember_nn::{Error, NnError};

use super::DeviceChoice;

/// Picks the device for a choice, with the reason in words.
pub fn resolve_device(choice: DeviceChoice) -> Result<(Device, String), Error> {
    match choice {
        DeviceChoice::Auto => {
            if cuda::is_available() {
                let name = cuda::get_device_name(0).unwrap_or_else(|_| "unknown".into());
                Ok((
                    Device::Cuda(0),
                    format!("--device auto: CUDA is available ({name})"),
                ))
            } else {
                let why = cuda::unavailable_reason().unwrap_or_else(|| "unknown".into());
                Ok((
                    Device::Cpu,
                    format!("--device auto: CUDA is not available ({why}), using the CPU"),
                ))
            }
        }
        DeviceChoice::Exact(Device::Cpu) => Ok((Device::Cpu, "--device cpu".into())),
        DeviceChoice::Exact(Device::Cuda(i)) => {
            if !cuda::is_available() {
                let why = cuda::unavailable_reason().unwrap_or_else(|| "unknown".into());
                return Err(NnError::invalid(
                    "ember train",
                    format!("--device cuda:{i} was asked for, but CUDA is not available: {why}"),
                )
                .into());
            }
            let n = cuda::device_count();
            if i >= n {
                return Err(NnError::invalid(
                    "ember train",
                    format!("--device cuda:{i} was asked for, but there are {n} CUDA device(s)"),
                )
                .into());
            }
            let name = cuda::get_device_name(i).unwrap_or_else(|_| "unknown".into());
            Ok((Device::Cuda(i), format!("--device cuda:{i} ({name})")))
        }
    }
}
