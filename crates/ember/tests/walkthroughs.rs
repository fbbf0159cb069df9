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
#[path = "../examples/lesson_memory_and_data.rs"]
mod lesson_memory_and_data;
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

/// The chapter's `memory_profiling.py`: the allocator's history records the loop's
/// allocations and frees, the dump holds the snapshot (whose blocks and segments add up to
/// `memory_allocated` and `memory_reserved`) and the events, and recording stops when it is
/// switched off.
#[test]
fn gpu_computing_chapter_memory_history() {
    each(|d, _| {
        let dir = scratch("chapter-memory", d);
        let r = gpu_computing_chapter::run_memory_history(d, &dir)?;
        assert!(r.allocs > 0 && r.frees > 0, "{d}: {r:?}");
        assert_eq!(r.snapshot_allocated, r.allocated, "{d}: {r:?}");
        assert_eq!(r.snapshot_reserved, r.reserved, "{d}: {r:?}");
        let dump: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&r.dump).unwrap()).unwrap();
        let traces = dump["device_traces"].as_array().unwrap();
        assert_eq!(
            traces.len(),
            r.events,
            "{d}: every recorded event is dumped"
        );
        assert!(traces.iter().any(|e| e["action"] == "alloc"), "{d}");
        assert!(!dump["segments"].as_array().unwrap().is_empty(), "{d}");
        assert_eq!(r.after_disable, 0, "{d}: recording stopped");
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    });
}

/// "Using torch with CUDA", 17.9: `cudnn.benchmark = True` keeps the convolution's results
/// (to rounding), and `deterministic = True` makes two runs bit-identical.
#[test]
fn using_torch_with_cuda_cudnn() {
    each(|d, _| {
        let r = using_torch_with_cuda::run_cudnn(d)?;
        assert!(
            r.benchmark && !r.deterministic,
            "{d}: the settings read back"
        );
        assert!(!ember::backends::cudnn::benchmark(), "{d}: restored");
        assert!(!ember::backends::cudnn::deterministic(), "{d}: restored");
        assert!(r.benchmark_rel_diff < 1e-5, "{d}: {r:?}");
        assert!(
            r.deterministic_repeats,
            "{d}: deterministic runs repeat exactly"
        );
        match (&r.conv_path, d) {
            // The emulator serves cuDNN; a real GPU may lack the library (im2col then).
            (Some((path, why)), Device::Cuda(_)) if ember::cuda::is_emulated() => {
                assert_eq!(path, "cudnn", "{d}: {why}")
            }
            (Some(_), Device::Cuda(_)) => {}
            (None, Device::Cpu) => {}
            (p, _) => panic!("{d}: conv path {p:?}"),
        }
        Ok(())
    });
}

/// The guide's "Profiling and optimization strategies": 100 timed iterations between two
/// synchronisations, after which the device has nothing left to run (a check that bites on
/// a real GPU: the emulator finishes each operation as it is issued); the throughput and
/// memory are printed (not asserted beyond being measured).
#[test]
fn gpu_training_guide_timing() {
    each(|d, _| {
        let r = gpu_training_guide::run_timing(d, 100)?;
        assert_eq!((r.iterations, r.batch), (100, 128), "{d}");
        assert!(r.elapsed > 0.0 && r.throughput.is_finite() && r.throughput > 0.0);
        assert_eq!(r.idle_after_synchronize, d.is_cuda().then_some(true), "{d}");
        assert!(
            r.allocated >= r.parameter_bytes,
            "{d}: the model is allocated"
        );
        assert!(r.reserved >= r.allocated, "{d}");
        Ok(())
    });
}

/// The chapter's "Minimize CPU-GPU transfers" and "Common Pitfalls and Debugging": the good
/// loop stays on the device, kept losses keep their graphs (and memory), gradients add up
/// without `zero_grad`, and `verify_model_device` catches a model left on the CPU.
#[test]
fn gpu_computing_chapter_pitfalls() {
    each(|d, _| {
        let r = gpu_computing_chapter::run_pitfalls(d)?;
        assert_eq!(
            r.loop_devices,
            vec![d; 8],
            "{d}: 4 batches, output and loss"
        );
        assert!(r.kept_losses_have_graph, "{d}");
        // Each of the 4 kept losses holds at least its own (smallest, 512-byte) block; the
        // `.item()` loop leaves nothing behind.
        assert!(r.kept_bytes >= 4 * 512, "{d}: {r:?}");
        assert_eq!(r.item_bytes, 0, "{d}: {r:?}");
        // Two backward passes of one batch: the gradient doubles (exactly, in binary).
        assert_eq!(r.accumulated_ratio, 2.0, "{d}");
        assert_eq!(r.zeroed_ratio, 1.0, "{d}");
        assert!(r.verified, "{d}");
        match r.unmoved_error {
            Some(e) => assert!(e.contains("Parameter weight on cpu, expected cuda"), "{e}"),
            None => assert!(!d.is_cuda(), "{d}: a model left on the CPU passed"),
        }
        assert!(
            r.memory_line.starts_with("GPU Memory: "),
            "{}",
            r.memory_line
        );
        Ok(())
    });
}

/// The lesson's memory sections: the peak after a reset, memory per batch that stops
/// growing after the first step, checkpointing's gradients, `del` leaving only the
/// gradients (which `set_to_none` frees and zeroing does not), `validate` without a graph,
/// one synchronisation giving the per-step total, and the memory fraction refusing what
/// exceeds it.
#[test]
fn lesson_memory() {
    each(|d, _| {
        let r = lesson_memory_and_data::run_memory(d)?;
        assert_eq!(r.peak_after_reset, r.allocated_after_reset, "{d}");
        let t = &r.tracked;
        assert_eq!(t.len(), 8, "{d}: 256 samples in batches of 32");
        assert!(
            t.iter().all(|b| b.peak >= b.after && b.peak >= b.before),
            "{d}"
        );
        // The first step creates the gradients and Adam's state; then nothing accumulates.
        assert!(t[0].after > t[0].before, "{d}: {t:?}");
        assert!(
            t[1..].iter().all(|b| b.after == t[1].after),
            "{d}: a leak? {t:?}"
        );
        assert!(r.checkpoint_same_grads, "{d}");
        // The text says checkpointing each layer lowers memory; for its model, bare linear
        // layers, it cannot: a checkpoint keeps its layer's input, which is all a linear
        // layer keeps for backward anyway (so in PyTorch too). The chapter's checkpointed
        // blocks of several layers are where the saving shows (gpu_computing_chapter.rs).
        assert!(
            r.peak_checkpointed * 10 >= r.peak_plain * 9,
            "{d}: {} bytes checkpointed, {} plain",
            r.peak_checkpointed,
            r.peak_plain
        );
        // del output, del loss: what the step left allocated is its gradients.
        assert!(r.freed_set_to_none >= r.grad_bytes, "{d}: {r:?}");
        assert_eq!(
            r.after_step - r.before_step,
            r.freed_set_to_none,
            "{d}: {r:?}"
        );
        assert_eq!(r.freed_zeroing, 0, "{d}: zeroing keeps the gradients");
        assert!(r.val_loss.is_finite() && !r.val_graph, "{d}");
        assert!(r.good_detached, "{d}");
        assert!(
            (r.bad_total - r.good_total).abs() <= 1e-5 * r.bad_total.abs(),
            "{d}: {} vs {}",
            r.bad_total,
            r.good_total
        );
        assert!(r.buffer_reused, "{d}");
        match &r.fraction_error {
            Some(e) => assert!(e.contains("set_per_process_memory_fraction(0.8)"), "{e}"),
            None => assert!(
                !d.is_cuda(),
                "{d}: the allocation beyond the fraction passed"
            ),
        }
        assert_eq!(r.tensor_cores.is_some(), d.is_cuda(), "{d}");
        Ok(())
    });
}

/// The lesson's "Optimizing Data Loading": every configuration loads the same batches in
/// the same order, pinned when asked; the rates are printed, not asserted.
#[test]
fn lesson_data_loading() {
    each(|d, _| {
        let runs = lesson_memory_and_data::run_data_loading(d, 10)?;
        let configs: Vec<(usize, bool)> =
            runs.iter().map(|r| (r.num_workers, r.pin_memory)).collect();
        assert_eq!(
            configs,
            [(0, false), (0, true), (4, true), (8, true)],
            "{d}"
        );
        for r in &runs {
            assert_eq!(r.batches, 10, "{d}: {r:?}");
            assert_eq!(r.pinned, r.pin_memory, "{d}: {r:?}");
            assert!(r.batches_per_sec > 0.0, "{d}");
            assert_eq!(r.firsts, runs[0].firsts, "{d}: workers keep the order");
        }
        Ok(())
    });
}
