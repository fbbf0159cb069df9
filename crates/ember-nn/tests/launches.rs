#![allow(clippy::unwrap_used)]
//! Kernel launches of one small CNN training step on the emulated `cuda:0` (the emulator's
//! per-thread launch counts, `ember_device::driver::emulator::thread_launch_counts`): a
//! conv–BatchNorm–ReLU–pool network with cross-entropy and Adam. The test prints the count
//! per kernel family (`cargo test -p ember-nn --test launches -- --nocapture`) and checks
//! that BatchNorm, ReLU's backward, cross-entropy and Adam run as their fused kernels, and
//! that the step never makes the host wait for the device (`thread_host_waits`).

use std::collections::BTreeMap;

use ember_device::cuda;
use ember_device::driver::emulator::{EmulatorConfig, thread_host_waits, thread_launch_counts};
use ember_nn::layers::{
    BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, ReLU, Sequential,
};
use ember_nn::loss::{CrossEntropyLoss, Loss};
use ember_nn::optim::{Adam, AdamOptions, Optimizer};
use ember_nn::{Module, Tensor};
use ember_tensor::Device;

fn block(cin: usize, cout: usize, d: Device) -> Sequential {
    Sequential::new()
        .add(
            Conv2d::with_config(
                cin,
                cout,
                3,
                Conv2dConfig {
                    padding: (1, 1).into(),
                    ..Default::default()
                },
                d,
            )
            .unwrap(),
        )
        .add(BatchNorm2d::new(cout, d).unwrap())
        .add(ReLU::new())
        .add(MaxPool2d::new(2))
}

/// Launches per kernel between two snapshots.
fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

#[test]
fn launches_of_one_cnn_training_step() {
    if std::env::var_os("EMBER_GPU_TEST").is_some() {
        ember_testing::skip!("counts the emulator's launches (the real driver keeps no count)");
    }
    cuda::use_emulator(EmulatorConfig::devices(1)).unwrap();
    let d = Device::Cuda(0);
    ember_tensor::random::manual_seed(0);
    let m = Sequential::new()
        .add(block(3, 8, d))
        .add(block(8, 16, d))
        .add(Flatten::new())
        .add(Linear::new(16 * 2 * 2, 10, d).unwrap());
    let mut opt = Adam::new(m.parameters(), AdamOptions::default()).unwrap();
    let x = Tensor::randn([4, 3, 8, 8], d).unwrap();
    let t = Tensor::from_vec(vec![1i64, 2, 3, 4], [4], d).unwrap();
    let loss_fn = CrossEntropyLoss::new();
    let mut step = || {
        opt.zero_grad(true).unwrap();
        let loss = loss_fn.forward(&m.forward(&x).unwrap(), &t).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
    };
    // The first step creates Adam's state; count the second.
    step();
    let before = thread_launch_counts();
    let waits_before = thread_host_waits();
    step();
    let launched = delta(&before, &thread_launch_counts());
    let waits: BTreeMap<&str, u64> = thread_host_waits()
        .into_iter()
        .map(|(k, v)| (k, v - waits_before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let total: u64 = launched.values().sum();
    println!("launches of one CNN training step: {total}");
    for (k, v) in &launched {
        println!("  {k}: {v}");
    }
    println!("host waits: {waits:?}");
    // Nothing in the step makes the host wait for the device, so on a GPU the host keeps
    // queueing kernels ahead of it: the targets were uploaded (their range is known, Note
    // [Known index ranges]), max-pool indices are in range by construction, scalar operands
    // (`num_batches_tracked += 1`) are filled by a kernel, and Adam's address table is
    // copied from pinned memory without waiting.
    assert!(waits.is_empty(), "host waits in one step: {waits:?}");
    let count = |name: &str| launched.get(name).copied().unwrap_or(0);
    // Two BatchNorm2d layers: one statistics and one normalising kernel each forward, one
    // reduction and one elementwise kernel each backward.
    for k in [
        "batch_norm_stats_f32",
        "batch_norm_apply_f32",
        "batch_norm_bwd_reduce_f32",
        "batch_norm_bwd_elem_f32",
    ] {
        assert_eq!(count(k), 2, "{k}");
    }
    // Two ReLUs: each backward is one threshold_backward kernel, no comparison and `where`.
    assert_eq!(count("threshold_backward_f32"), 2);
    // Each layer's `num_batches_tracked += 1` is one in-place `badd_i64` (after the fill of
    // the scalar 1), with no copy back of an out-of-place sum.
    assert_eq!(count("badd_i64"), 2);
    for k in ["copy_i64", "cast_i64_i64"] {
        assert_eq!(count(k), 0, "{k}");
    }
    for k in ["cmp_gt_f32", "where_f32"] {
        assert_eq!(count(k), 0, "{k}");
    }
    // Cross-entropy: one forward and one backward kernel, no log-softmax or NLL kernels.
    assert_eq!(count("cross_entropy_fwd_f32_i64"), 1);
    assert_eq!(count("cross_entropy_bwd_f32_i64"), 1);
    for k in ["log_softmax_f32", "softmax_f32", "nll_loss_f32_i64"] {
        assert_eq!(count(k), 0, "{k}");
    }
    // Adam: one multi-tensor launch for all ten parameters (Note [Multi-tensor optimizer
    // steps]), none of its per-op kernels (with ReLU's fused backward too, the step
    // launches 39 kernels; the per-op Adam path took 170 before either change).
    assert_eq!(count("optim_adam_f32"), 1);
    for k in ["bmul_f32", "usqrt_f32", "bmaximum_f32"] {
        assert_eq!(count(k), 0, "{k}");
    }
}
