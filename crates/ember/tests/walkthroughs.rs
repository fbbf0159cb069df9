#![allow(clippy::unwrap_used)]
//! The PyTorch walk-throughs (docs/walkthroughs.md), replayed: each example program in `examples/`
//! runs here on `cpu` and on the emulated `cuda:0` (with `cuda:1` as the second GPU).
//! They read the allocator's global statistics, so they run one at a time.

use std::sync::Mutex;

use ember::Device;

#[path = "../examples/d2l_working_on_gpus.rs"]
mod d2l_working_on_gpus;
#[path = "../examples/gpu_computing_chapter.rs"]
mod gpu_computing_chapter;
#[path = "../examples/gpu_training_guide.rs"]
mod gpu_training_guide;
#[path = "../examples/lesson_gpu_acceleration.rs"]
mod lesson_gpu_acceleration;
#[path = "../examples/using_torch_with_cuda.rs"]
mod using_torch_with_cuda;

static SERIAL: Mutex<()> = Mutex::new(());

/// `(device, second device)` pairs: the CPU alone, then two emulated GPUs (the real ones
/// when `EMBER_GPU_TEST` is set; with a single GPU, `cuda:0` plays both parts, as the texts'
/// code does when `torch.cuda.device_count()` is 1).
fn device_pairs() -> [(Device, Device); 2] {
    if std::env::var_os("EMBER_GPU_TEST").is_none() {
        ember::cuda::use_emulator(ember::driver::emulator::EmulatorConfig::devices(2)).unwrap();
    }
    let second = if ember::cuda::device_count() >= 2 {
        Device::Cuda(1)
    } else {
        Device::Cuda(0)
    };
    [(Device::Cpu, Device::Cpu), (Device::Cuda(0), second)]
}

fn each(f: impl Fn(Device, Device) -> Result<(), ember::Error>) {
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (a, b) in device_pairs() {
        ember::tensor::random::manual_seed(0);
        if let Err(e) = f(a, b) {
            panic!("on {a} (second device {b}): {e}");
        }
    }
}

#[test]
fn d2l_working_on_gpus() {
    each(d2l_working_on_gpus::run);
}

#[test]
fn gpu_computing_chapter() {
    each(gpu_computing_chapter::run);
}

#[test]
fn gpu_training_guide() {
    each(|d, _| gpu_training_guide::run(d));
}

#[test]
fn lesson_gpu_acceleration() {
    each(lesson_gpu_acceleration::run);
}

#[test]
fn using_torch_with_cuda() {
    each(using_torch_with_cuda::run);
}
