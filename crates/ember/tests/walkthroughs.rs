#![allow(clippy::unwrap_used)]
//! The PyTorch walk-throughs (docs/walkthroughs.md), replayed: each example program in `examples/`
//! runs here on `cpu` and on the emulated `cuda:0` (with `cuda:1` as the second GPU).
//! They read the allocator's global statistics, so they run one at a time.
//!
//! The `*_amp` tests replay the texts' mixed-precision loops: `torch.cuda.amp.autocast()` is
//! an autocast region in the device's default dtype (bf16 on the CPU, f16 on CUDA), and the
//! `GradScaler` is enabled on CUDA only (bf16 needs no loss scaling). They check the dtypes
//! autocast gives (products in f16/bf16, losses in f32, gradients of the f32 master weights
//! in f32), that the loss falls, the scale after the steps, and gradient clipping after
//! `unscale_`; `benchmark_precision`'s times and peak memory are printed, not asserted.

use std::sync::Mutex;

use ember::{DType, Device};

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

/// The dtype `torch.cuda.amp.autocast()` computes products in on `device`.
fn low(device: Device) -> DType {
    if device.is_cuda() {
        DType::F16
    } else {
        DType::Bf16
    }
}

/// The scale a default `GradScaler` on `device` has after `skipped` skipped steps (none of
/// these loops reaches the growth interval of 2000): 65536 halved per skip on CUDA, 1 on the
/// CPU, where it is disabled.
fn expected_scale(device: Device, skipped: usize) -> f64 {
    if device.is_cuda() {
        65536.0 * 0.5f64.powi(skipped as i32)
    } else {
        1.0
    }
}

#[test]
fn gpu_computing_chapter_amp() {
    each(|d, _| {
        let (plain, ckpt) = gpu_computing_chapter::run_amp(d, 3)?;
        for r in [&plain, &ckpt] {
            assert_eq!(r.output_dtype, low(d), "{d}: the model's output");
            assert_eq!(r.loss_dtype, DType::F32, "{d}: cross-entropy in f32");
            assert!(!r.grad_dtypes.is_empty(), "{d}: gradients");
            assert!(r.grad_dtypes.iter().all(|&g| g == DType::F32), "{d}");
            assert_eq!(r.scaler_enabled, d.is_cuda(), "{d}");
            assert_eq!(
                r.steps,
                3 * 8,
                "{d}: 256 samples in batches of 32, 3 epochs"
            );
            assert_eq!(r.skipped, 0, "{d}: no overflow in this small model");
            assert_eq!(r.scale, expected_scale(d, r.skipped), "{d}");
        }
        let l = &plain.epoch_losses;
        assert!(
            l[2] < 0.9 * l[0],
            "{d}: AMP training lowers the loss: {l:?}"
        );
        assert_eq!(plain.epoch_losses, ckpt.epoch_losses, "{d}: checkpointed");
        assert_eq!(plain.weights, ckpt.weights, "{d}: checkpointed");
        Ok(())
    });
}

#[test]
fn gpu_training_guide_amp() {
    each(|d, _| {
        let batches = 4;
        let r = gpu_training_guide::run_amp(d, batches)?;
        assert_eq!(r.output_dtype, low(d), "{d}: the model's output");
        assert_eq!(r.loss_dtype, DType::F32, "{d}: the loss");
        assert_eq!(r.scaler_enabled, d.is_cuda(), "{d}");
        // unscale_ divides the gradients by the scale: the norm drops by exactly it.
        let scale = expected_scale(d, 0);
        assert_eq!(r.first_scale, scale, "{d}");
        let ratio = r.scaled_norm / r.true_norm;
        assert!(
            (ratio / scale - 1.0).abs() < 1e-4,
            "{d}: {ratio} vs {scale}"
        );
        // Clipping the true gradients: the norm before, then at most max_norm.
        assert!(
            (r.clip_returned - r.true_norm).abs() <= 1e-5 * r.true_norm,
            "{d}"
        );
        assert!(
            r.true_norm > r.max_norm,
            "{d}: the clip bites ({})",
            r.true_norm
        );
        assert!(r.clipped_norm <= r.max_norm * (1.0 + 1e-4), "{d}: {r:?}");
        assert!(r.clipped_norm >= r.max_norm * (1.0 - 1e-3), "{d}: {r:?}");
        assert!(r.grad_dtypes.iter().all(|&g| g == DType::F32), "{d}");
        assert_eq!(r.grad_dtypes.len(), 4, "{d}: two weights, two biases");
        assert_eq!(r.steps, 1 + 3 * batches, "{d}");
        assert_eq!(r.skipped, 0, "{d}");
        assert_eq!(r.scale, expected_scale(d, r.skipped), "{d}");
        let tracker = if d.is_cuda() { r.steps as i64 } else { 0 };
        assert_eq!(
            r.growth_tracker, tracker,
            "{d}: clean steps since the start"
        );
        assert!(r.epoch_losses.iter().all(|l| l.is_finite()), "{d}");
        Ok(())
    });
}

#[test]
fn lesson_gpu_acceleration_amp() {
    each(|d, _| {
        let r = lesson_gpu_acceleration::run_amp(d, 3, 3)?;
        // The AMP loop.
        assert_eq!(r.autocast_dtype, low(d), "{d}");
        assert_eq!(r.output_dtype, low(d), "{d}: the model's output");
        assert_eq!(r.loss_dtype, DType::F32, "{d}: the loss");
        assert_eq!(r.grad_dtypes, vec![DType::F32; 4], "{d}: master gradients");
        assert_eq!(r.scaler_enabled, d.is_cuda(), "{d}");
        assert_eq!(r.steps, 3 * 16, "{d}");
        assert_eq!(r.skipped, 0, "{d}");
        assert_eq!(r.scale, expected_scale(d, r.skipped), "{d}");
        let l = &r.amp_losses;
        assert!(
            l[2] < 0.8 * l[0],
            "{d}: AMP training lowers the loss: {l:?}"
        );
        // How AMP works.
        assert_eq!(r.mm_dtype, low(d), "{d}: mm");
        assert_eq!(r.cross_entropy_dtype, DType::F32, "{d}: cross_entropy");
        assert_eq!(r.loss_scale, 65536.0, "{d}: scaled_loss = loss * 65536");
        assert!(r.unscaled_exactly, "{d}: unscaled = scaled / 65536");
        let tol = if d.is_cuda() { 1e-2 } else { 5e-2 };
        assert!(r.grad_rel_error < tol, "{d}: {}", r.grad_rel_error);
        assert_eq!(r.scale_after_clean, 65536.0, "{d}");
        assert!(
            !r.stepped_on_overflow,
            "{d}: the overflowing step is skipped"
        );
        assert_eq!(r.scale_after_overflow, 32768.0, "{d}: and the scale halved");
        // BF16 without a scaler.
        assert_eq!(r.bf16_output_dtype, DType::Bf16, "{d}");
        let l = &r.bf16_losses;
        assert!(
            l[2] < 0.8 * l[0],
            "{d}: BF16 training lowers the loss: {l:?}"
        );
        // benchmark_precision: ran, and printed its rows (times and memory not asserted).
        let names: Vec<&str> = r.benchmark.iter().map(|b| b.name).collect();
        assert_eq!(names, ["FP32", "FP16", "BF16"], "{d}");
        assert!(r.benchmark.iter().all(|b| b.seconds > 0.0), "{d}");
        Ok(())
    });
}

#[test]
fn using_torch_with_cuda_amp() {
    each(|d, _| {
        let r = using_torch_with_cuda::run_amp(d, 4)?;
        assert_eq!(r.output_dtype, low(d), "{d}: the model's output");
        assert_eq!(r.loss_dtype, DType::F32, "{d}: the loss");
        assert_eq!(r.grad_dtypes, vec![DType::F32; 2], "{d}: weight and bias");
        assert_eq!(r.scaler_enabled, d.is_cuda(), "{d}");
        assert_eq!(r.steps, 4 * 8, "{d}");
        assert_eq!(r.skipped, 0, "{d}");
        assert_eq!(r.scale, expected_scale(d, r.skipped), "{d}");
        let l = &r.epoch_losses;
        assert!(
            l[3] < 0.8 * l[0],
            "{d}: AMP training lowers the loss: {l:?}"
        );
        Ok(())
    });
}

/// A fresh directory for one device's files.
fn scratch(test: &str, d: Device) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ember-walk-{test}-{}-{}",
        std::process::id(),
        d.to_string().replace(':', "")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The lesson's "Performance Profiling": tables sorted by device time and by device memory,
/// a Chrome trace, the schedule's two cycles as TensorBoard files, memory bottlenecks.
#[test]
fn lesson_gpu_acceleration_profiler() {
    each(|d, _| {
        let dir = scratch("lesson-profiler", d);
        let r = lesson_gpu_acceleration::run_profiler(d, &dir)?;
        // Basic profiling: host ops always, device time on CUDA.
        assert!(
            r.basic_table.contains("aten::addmm") || r.basic_table.contains("aten::"),
            "{}",
            r.basic_table
        );
        assert_eq!(
            r.basic_table.contains("Self CUDA"),
            d.is_cuda(),
            "{}",
            r.basic_table
        );
        assert_eq!(r.basic_device_rows > 0, d.is_cuda(), "{d}");
        let trace: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("trace.json")).unwrap()).unwrap();
        assert!(!trace["traceEvents"].as_array().unwrap().is_empty());
        // activities=[CUDA]: device work only.
        assert_eq!(
            r.cuda_only_rows.is_empty(),
            !d.is_cuda(),
            "{d}: {:?}",
            r.cuda_only_rows
        );
        assert!(
            r.cuda_only_rows
                .iter()
                .all(|(_, cpu, dev)| *cpu == 0 && *dev > 0)
        );
        // The schedule: skip 5, wait 1, warm up 2, record 3, twice.
        assert_eq!(
            r.recorded_steps,
            [
                ["ProfilerStep#8", "ProfilerStep#9", "ProfilerStep#10"],
                ["ProfilerStep#14", "ProfilerStep#15", "ProfilerStep#16"]
            ],
            "{d}"
        );
        assert_eq!(
            r.tensorboard_files.len(),
            2,
            "{d}: {:?}",
            r.tensorboard_files
        );
        // Memory profiling: bottlenecks on the device's allocator, largest first.
        assert!(r.memory_table.lines().count() >= 5, "{}", r.memory_table);
        assert_eq!(
            r.memory_events.is_empty(),
            !d.is_cuda(),
            "{d}: {:?}",
            r.memory_events
        );
        assert!(r.memory_events.windows(2).all(|w| w[0].1 >= w[1].1));
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    });
}

/// The chapter's `torch_profiler.py`: the table sorted by GPU time, a Chrome trace with the
/// device's kernels on CUDA, and two TensorBoard cycles.
#[test]
fn gpu_computing_chapter_profiler() {
    each(|d, _| {
        let dir = scratch("chapter-profiler", d);
        let r = gpu_computing_chapter::run_profiler(d, &dir)?;
        assert!(r.table.contains("aten::"), "{}", r.table);
        assert_eq!(r.table.contains("Self CUDA"), d.is_cuda(), "{}", r.table);
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&r.trace).unwrap()).unwrap();
        assert_eq!(doc["record_shapes"], 1);
        assert_eq!(r.device_events > 0, d.is_cuda(), "{d}: {}", r.device_events);
        assert_eq!(
            r.tensorboard_files.len(),
            2,
            "{d}: {:?}",
            r.tensorboard_files
        );
        assert!(
            r.tensorboard_files
                .iter()
                .all(|f| f.to_string_lossy().ends_with(".pt.trace.json"))
        );
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    });
}
