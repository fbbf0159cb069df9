//! How the profiler times device work on (emulated) cuda:0, both ways (Note [Device
//! activity] in `ember-device`): CUPTI's activity records, which make no event, and CUDA
//! events, reused from one launch to the next (Note [Event pool]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;

use common::{Model, activity_api_usable, both, serial, train_step};
use ember_nn::optim::{Adam, AdamOptions};
use ember_profiler::{DeviceTiming, EventType, ProfileOptions, profile};
use ember_tensor::Device;

/// Under the activity API a profiled launch makes no event at all, every launch has its
/// record, and the recording stops with the profile (Note [CUPTI through the seam]).
#[test]
fn profiled_cuda_steps_under_cupti_make_no_events() {
    let _serial = serial();
    let dev = ember_testing::prepare(Device::Cuda(0)).unwrap();
    let model = Model::new(&dev).unwrap();
    let mut opt = Adam::new(model.params(), AdamOptions::default()).unwrap();
    train_step(&model, &mut opt, &dev).unwrap();
    let driver = ember_device::cuda::initialized_driver().unwrap();
    if !activity_api_usable() {
        // Only on a GPU without a usable CUPTI; the emulator always has its own.
        assert!(!ember_device::cuda::is_emulated());
        ember_testing::skip!("CUPTI cannot record here; events time the launches");
    }
    let before = event_calls();
    let mut prof = profile(ProfileOptions::new().activities(both())).unwrap();
    for _ in 0..3 {
        train_step(&model, &mut opt, &dev).unwrap();
    }
    prof.stop().unwrap();
    let after = event_calls();
    let p = prof.profile().unwrap();
    assert_eq!(p.device_timing, Some(DeviceTiming::Cupti));
    assert_eq!(p.untimed, 0);
    let launches: HashSet<u64> = p
        .events
        .iter()
        .filter(|e| e.kind == EventType::Runtime)
        .map(|e| e.correlation)
        .collect();
    let linked: HashSet<u64> = p
        .events
        .iter()
        .filter(|e| e.kind.is_device())
        .map(|e| e.correlation)
        .collect();
    assert!(launches.len() >= 30, "{} launches", launches.len());
    assert_eq!(
        linked, launches,
        "every launch has a record, every record a launch"
    );
    if ember_device::cuda::is_emulated() {
        // The emulator's own count; on a GPU the synchronisation at the end may make one.
        assert_eq!(
            after, before,
            "events created and destroyed while profiling"
        );
    }
    // Recording stopped with the profile: later work leaves no record.
    train_step(&model, &mut opt, &dev).unwrap();
    driver.synchronize(0).unwrap();
    assert_eq!(driver.activity_flush().unwrap(), Vec::new());
}

/// `cuEventCreate`/`cuEventDestroy` calls this thread made on the emulator.
fn event_calls() -> (u64, u64) {
    let c = ember_device::driver::emulator::thread_event_calls();
    let n = |k: &str| c.get(k).copied().unwrap_or(0);
    (n("cuEventCreate"), n("cuEventDestroy"))
}

/// Once a cycle runs, profiled launches time themselves with the events of finished ones,
/// and the cycle's end destroys every event it made (Note [Event pool]).
#[test]
fn profiled_cuda_steps_reuse_their_timing_events() {
    let _serial = serial();
    let dev = ember_testing::prepare(Device::Cuda(0)).unwrap();
    if !ember_device::cuda::is_emulated() {
        ember_testing::skip!("the event counts are the emulator's (a real GPU is the driver)");
    }
    let model = Model::new(&dev).unwrap();
    let mut opt = Adam::new(model.params(), AdamOptions::default()).unwrap();
    train_step(&model, &mut opt, &dev).unwrap();
    let before = event_calls();
    let mut prof = profile(
        ProfileOptions::new()
            .activities(both())
            .device_timing(DeviceTiming::Events),
    )
    .unwrap();
    let mut per_step = Vec::new();
    for _ in 0..12 {
        let c0 = event_calls().0;
        train_step(&model, &mut opt, &dev).unwrap();
        per_step.push(event_calls().0 - c0);
    }
    prof.stop().unwrap();
    let after = event_calls();
    let p = prof.profile().unwrap();
    assert_eq!(p.device_timing, Some(DeviceTiming::Events));
    let kernels = p.events.iter().filter(|e| e.kind.is_device()).count();
    let launches = p
        .events
        .iter()
        .filter(|e| e.kind == EventType::Runtime)
        .count();
    assert_eq!(p.untimed, 0);
    assert_eq!(kernels, launches, "a device event per launch");
    // Two events per launch would be made without the pool; with it, the last steps make
    // none (a step here launches fewer kernels than the pool's drain threshold, so the
    // first steps fill it).
    let steps = per_step.len();
    assert!(kernels / steps >= 10, "{kernels} kernels in {steps} steps");
    assert_eq!(
        per_step[steps - 4..],
        [0, 0, 0, 0],
        "events created per step: {per_step:?}"
    );
    assert!(
        after.0 - before.0 < kernels as u64,
        "{} events for {kernels} kernels",
        after.0 - before.0
    );
    assert_eq!(
        after.0 - before.0,
        after.1 - before.1,
        "every event the profiler made is destroyed"
    );
}
