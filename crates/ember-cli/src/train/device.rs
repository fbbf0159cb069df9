//! `--device`: which device a run trains on, and why.

use ember_device::{Device, cuda};
use ember_nn::{Error, NnError};

use super::DeviceChoice;

/// What this process knows of CUDA, as [`choose_device`] needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaState {
    /// `cuda::is_available()`: the driver's answer.
    pub available: bool,
    /// Why CUDA is not available (when it is not).
    pub unavailable_reason: Option<String>,
    /// Why Ember cannot launch its kernels on the driver's devices (a build without the
    /// fatbin: Note [No fatbin] in `ember-kernels`), when CUDA is available.
    pub kernels_missing: Option<String>,
    /// The devices' names, in order (`cuda::device_count()` of them).
    pub names: Vec<String>,
}

impl CudaState {
    /// This process's CUDA, as the driver and `ember-kernels` report it.
    pub fn probe() -> CudaState {
        let available = cuda::is_available();
        let kernels_missing = cuda::driver_kind()
            .filter(|_| available)
            .and_then(ember_kernels::kernels_missing)
            .map(|e| e.to_string());
        CudaState {
            available,
            unavailable_reason: cuda::unavailable_reason(),
            kernels_missing,
            names: (0..cuda::device_count())
                .map(|i| cuda::get_device_name(i).unwrap_or_else(|_| "unknown".into()))
                .collect(),
        }
    }
}

/// Picks the device for a choice, with the reason in words, or why the choice cannot be
/// had: `auto` is `cuda:0` where CUDA is available and Ember's kernels are there for it,
/// otherwise the CPU (saying why); `cuda:N` must exist and have the kernels.
pub fn choose_device(choice: DeviceChoice, cuda: &CudaState) -> Result<(Device, String), String> {
    let name = |i: usize| cuda.names.get(i).map_or("unknown", String::as_str);
    match choice {
        DeviceChoice::Auto if !cuda.available => {
            let why = cuda.unavailable_reason.as_deref().unwrap_or("unknown");
            Ok((
                Device::Cpu,
                format!("--device auto: CUDA is not available ({why}), using the CPU"),
            ))
        }
        DeviceChoice::Auto => match &cuda.kernels_missing {
            Some(why) => Ok((
                Device::Cpu,
                format!(
                    "--device auto: CUDA is available ({}), but {why}; using the CPU",
                    name(0)
                ),
            )),
            None => Ok((
                Device::Cuda(0),
                format!("--device auto: CUDA is available ({})", name(0)),
            )),
        },
        DeviceChoice::Exact(Device::Cpu) => Ok((Device::Cpu, "--device cpu".into())),
        DeviceChoice::Exact(Device::Cuda(i)) => {
            if !cuda.available {
                let why = cuda.unavailable_reason.as_deref().unwrap_or("unknown");
                return Err(format!(
                    "--device cuda:{i} was asked for, but CUDA is not available: {why}"
                ));
            }
            let n = cuda.names.len();
            if i >= n {
                return Err(format!(
                    "--device cuda:{i} was asked for, but there are {n} CUDA device(s)"
                ));
            }
            if let Some(why) = &cuda.kernels_missing {
                return Err(format!("--device cuda:{i} was asked for, but {why}"));
            }
            Ok((Device::Cuda(i), format!("--device cuda:{i} ({})", name(i))))
        }
    }
}

/// Picks the device for a choice in this process ([`choose_device`] on [`CudaState::probe`]).
pub fn resolve_device(choice: DeviceChoice) -> Result<(Device, String), Error> {
    choose_device(choice, &CudaState::probe())
        .map_err(|why| NnError::invalid("ember train", why).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_KERNELS: &str =
        "CUDA kernels were not built: run `cargo xtask kernels --install-nvcc`";

    fn state(available: bool, kernels: bool, devices: usize) -> CudaState {
        CudaState {
            available,
            unavailable_reason: (!available).then(|| "no CUDA driver library".into()),
            kernels_missing: (available && !kernels).then(|| NO_KERNELS.into()),
            names: (0..devices).map(|i| format!("GPU {i}")).collect(),
        }
    }

    #[test]
    fn auto_takes_the_gpu_only_with_its_kernels() {
        let (d, why) = choose_device(DeviceChoice::Auto, &state(true, true, 1)).unwrap();
        assert_eq!(
            (d, why.as_str()),
            (Device::Cuda(0), "--device auto: CUDA is available (GPU 0)")
        );
        let (d, why) = choose_device(DeviceChoice::Auto, &state(true, false, 1)).unwrap();
        assert_eq!(d, Device::Cpu);
        assert_eq!(
            why,
            format!("--device auto: CUDA is available (GPU 0), but {NO_KERNELS}; using the CPU")
        );
        let (d, why) = choose_device(DeviceChoice::Auto, &state(false, false, 0)).unwrap();
        assert_eq!(d, Device::Cpu);
        assert!(
            why.contains("CUDA is not available (no CUDA driver library)"),
            "{why}"
        );
    }

    #[test]
    fn an_explicit_gpu_needs_the_driver_the_device_and_the_kernels() {
        let cuda1 = DeviceChoice::Exact(Device::Cuda(1));
        assert_eq!(
            choose_device(cuda1, &state(true, true, 2)).unwrap(),
            (Device::Cuda(1), "--device cuda:1 (GPU 1)".to_string())
        );
        let e = choose_device(cuda1, &state(true, false, 2)).unwrap_err();
        assert_eq!(
            e,
            format!("--device cuda:1 was asked for, but {NO_KERNELS}")
        );
        let e = choose_device(cuda1, &state(true, true, 1)).unwrap_err();
        assert!(e.contains("there are 1 CUDA device(s)"), "{e}");
        let e = choose_device(cuda1, &state(false, false, 0)).unwrap_err();
        assert!(
            e.contains("CUDA is not available: no CUDA driver library"),
            "{e}"
        );
        let cpu = DeviceChoice::Exact(Device::Cpu);
        assert_eq!(
            choose_device(cpu, &state(true, false, 1)).unwrap().0,
            Device::Cpu
        );
    }
}
