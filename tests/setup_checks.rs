//! The walk-throughs' setup checks, replayed in Rust at the layer that exists today:
//! d2l's `cpu()`, `gpu(i)`, `num_gpus()`, `try_gpu(i)`, `try_all_gpus()`; "Using torch with
//! CUDA"'s `is_available`, `device_count`, the device-agnostic `device = cuda if available
//! else cpu`, listing device names, and memory monitoring with `memory_allocated`,
//! `memory_reserved` and `empty_cache`. It runs as a machine without CUDA sees it and, in CI,
//! again under `EMBER_CUDA_EMULATOR=2`.
#![allow(clippy::unwrap_used)]

use ember::{Device, cuda, memory, try_all_gpus, try_gpu};

#[test]
fn d2l_device_helpers() {
    // cpu(), gpu(), gpu(1)
    let (cpu, gpu0, gpu1): (Device, Device, Device) = (
        "cpu".parse().unwrap(),
        "cuda".parse().unwrap(),
        "cuda:1".parse().unwrap(),
    );
    assert_eq!(
        (cpu, gpu0, gpu1),
        (Device::Cpu, Device::Cuda(0), Device::Cuda(1))
    );

    // num_gpus(), try_gpu(), try_gpu(10), try_all_gpus()
    let n = cuda::device_count();
    assert_eq!(
        try_gpu(0),
        if n >= 1 { Device::Cuda(0) } else { Device::Cpu }
    );
    assert_eq!(
        try_gpu(10),
        if n >= 11 {
            Device::Cuda(10)
        } else {
            Device::Cpu
        }
    );
    let all = try_all_gpus();
    if n == 0 {
        assert_eq!(all, vec![Device::Cpu]);
    } else {
        assert_eq!(all, (0..n).map(Device::Cuda).collect::<Vec<_>>());
    }
}

#[test]
fn device_agnostic_setup() {
    // device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    let device = Device::cuda_if_available();
    assert_eq!(device.is_cuda(), cuda::is_available());
    assert_eq!(cuda::is_available(), cuda::unavailable_reason().is_none());
    if !cuda::is_available() {
        assert_eq!(cuda::device_count(), 0);
        let err = cuda::set_device(0).unwrap_err().to_string();
        assert!(err.contains("CUDA is not available"), "{err}");
    }
    // for i in range(torch.cuda.device_count()): print(torch.cuda.get_device_name(i))
    for i in 0..cuda::device_count() {
        let name = cuda::get_device_name(i).unwrap();
        assert!(!name.is_empty());
    }
    let n = cuda::device_count();
    let err = cuda::get_device_name(n).unwrap_err().to_string();
    if cuda::is_available() {
        // "invalid CUDA device index 2: there are 2 CUDA devices"
        assert!(err.contains(&format!("index {n}")), "{err}");
    } else {
        assert!(err.contains("CUDA is not available"), "{err}");
    }
}

#[test]
fn memory_monitoring_on_every_device() {
    for device in ember_e2e::test_devices() {
        // torch.cuda.memory_allocated(), memory_reserved(), empty_cache()
        let alloc = memory::allocator(device).unwrap();
        let before = memory::memory_allocated(device).unwrap();
        let block = alloc.allocate(3 << 20).unwrap();
        let during = memory::memory_allocated(device).unwrap();
        assert!(
            during >= before + (3 << 20),
            "{device}: {before} -> {during}"
        );
        assert!(memory::memory_reserved(device).unwrap() >= during);
        drop(block);
        // Other tests share the process-wide allocators, so compare with care: our block is
        // gone from the allocated count, and empty_cache leaves reserved >= allocated.
        memory::empty_cache(device).unwrap();
        assert!(
            memory::memory_reserved(device).unwrap() >= memory::memory_allocated(device).unwrap()
        );
        assert!(memory::max_memory_allocated(device).unwrap() >= during);
        let summary = memory::memory_summary(device).unwrap();
        assert!(!summary.is_empty());
    }
}
