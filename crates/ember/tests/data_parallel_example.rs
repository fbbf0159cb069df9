#![allow(clippy::unwrap_used)]
//! The walk-throughs' DataParallel loop (`examples/data_parallel.rs`) on two emulated GPUs:
//! it runs, and its losses equal the same epoch on one device.

// Formatted as an example (examples/rustfmt.toml), not as a test.
#[rustfmt::skip]
#[path = "../examples/data_parallel.rs"]
mod data_parallel;

#[test]
fn data_parallel_walkthrough() {
    ember::cuda::use_emulator(ember::driver::emulator::EmulatorConfig::devices(2)).unwrap();
    ember::tensor::random::manual_seed(0);
    let (parallel, one) = data_parallel::run(300).unwrap();
    assert_eq!(parallel.len(), 2, "300 samples in batches of 256");
    assert_eq!(parallel.len(), one.len());
}
