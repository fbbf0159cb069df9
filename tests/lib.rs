//! End-to-end scenarios across Ember's crates live in this directory's test files; this
//! library holds what they share.

/// The devices a device-generic scenario runs on: `cpu`, plus `cuda:0` (and `cuda:1`) when
/// CUDA is available — the emulated devices under `EMBER_CUDA_EMULATOR=2` in CI.
pub fn test_devices() -> Vec<ember::Device> {
    let mut v = vec![ember::Device::Cpu];
    v.extend((0..ember::cuda::device_count().min(2)).map(ember::Device::Cuda));
    v
}
