//! Tensor ops through `ember-tensor`'s public API, as a user calls them: allocating
//! elementwise ops over 16M f32 (GB/s of bytes read + written), a full sum (GB/s read),
//! softmax + cross-entropy over (4096, 1000) (ms), the cost of one op on tiny tensors (µs),
//! alone and while the profiler records it (`profiler_on_tiny_op_overhead`: CPU activity,
//! and CUDA's on a GPU, with `record_shapes`; the difference is the profiler's cost per op
//! and launch), and on CUDA an f32/bf16 matrix product (GFLOP/s). The PyTorch side of the CPU cases is in
//! `bench/torch_side_by_side.py`.
//!
//! On `cuda:0` each call is followed by a device synchronisation (as `torch.cuda.synchronize`
//! in a timing loop), and every record carries the H100 bound of its kernel next to the
//! achieved rate: `h100_bound_us`, the time at 3.35 TB/s (or at the dense f32 / bf16 peak for
//! matrix products), and `fraction_of_h100_bound`, so the first run on a GPU says how close
//! each kernel family is (kernels/README.md has the per-family analysis). Under the emulator
//! the rates are the CPU's and mean nothing; the cases then run at 1/64 of the elements so
//! the whole benchmark stays short, and the records say `"emulated": true` and `elements`.

use std::time::Instant;

use ember_device::{Device, cuda};
use ember_profiler::{ProfileOptions, ProfilerActivity};
use ember_tensor::{CrossEntropyOptions, DType, Tensor};

use crate::harness::{Options, Record, ns_per_iter};
use crate::nn::{insert_counts, launches_and_waits};

const ROUNDS: usize = 5;
/// Time of one round, in seconds.
const ROUND_S: f64 = 0.2;
const N16M: usize = 16 * 1024 * 1024;

/// What one call does, for turning a time into the record's unit.
#[derive(Clone, Copy)]
enum Work {
    /// Bytes moved: the record is GB/s.
    Bytes(f64),
    /// The record is milliseconds per call.
    Millis,
    /// The record is microseconds per call.
    Micros,
    /// Floating-point operations: the record is GFLOP/s.
    Flops(f64),
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// H100 SXM: HBM3 bandwidth, dense f32 and bf16 tensor-core peaks.
const H100_BYTES_PER_S: f64 = 3.35e12;
const H100_F32_FLOPS: f64 = 67e12;
const H100_BF16_FLOPS: f64 = 989e12;

struct Env {
    device: Device,
    /// Elements of the "16m" cases (fewer under the emulator).
    n: usize,
    /// Rows of the softmax case.
    rows: usize,
    /// Side of the matrix products.
    side: usize,
}

fn randn(env: &Env, shape: &[usize]) -> Result<Tensor, String> {
    Tensor::randn(shape, env.device).map_err(err)
}

type Call = Box<dyn FnMut() -> ember_tensor::Result<Tensor>>;
type Case = fn(&Env) -> Result<(Call, Work, Bound), String>;

/// What bounds a case on an H100: bytes moved, or flops at a peak rate.
#[derive(Clone, Copy)]
enum Bound {
    Bytes(f64),
    Flops(f64, f64),
    None,
}

impl Bound {
    fn seconds(self) -> Option<f64> {
        match self {
            Bound::Bytes(b) => Some(b / H100_BYTES_PER_S),
            Bound::Flops(f, peak) => Some(f / peak),
            Bound::None => None,
        }
    }
}

const CASES: [(&str, Case); 10] = [
    ("add_f32_16m", |e| {
        let (a, b) = (randn(e, &[e.n])?, randn(e, &[e.n])?);
        let bytes = 12.0 * e.n as f64;
        Ok((
            Box::new(move || a.add(&b)),
            Work::Bytes(bytes),
            Bound::Bytes(bytes),
        ))
    }),
    ("relu_f32_16m", |e| {
        let x = randn(e, &[e.n])?;
        let bytes = 8.0 * e.n as f64;
        Ok((
            Box::new(move || x.relu()),
            Work::Bytes(bytes),
            Bound::Bytes(bytes),
        ))
    }),
    ("exp_f32_16m", |e| {
        let x = randn(e, &[e.n])?;
        let bytes = 8.0 * e.n as f64;
        Ok((
            Box::new(move || x.exp()),
            Work::Bytes(bytes),
            Bound::Bytes(bytes),
        ))
    }),
    ("sum_f32_16m", |e| {
        let x = randn(e, &[e.n])?;
        let bytes = 4.0 * e.n as f64;
        Ok((
            Box::new(move || x.sum_all()),
            Work::Bytes(bytes),
            Bound::Bytes(bytes),
        ))
    }),
    ("softmax_ce_4096x1000", |e| {
        let logits = randn(e, &[e.rows, 1000])?;
        let target = Tensor::randint(0, 1000, [e.rows], (e.device, DType::I64)).map_err(err)?;
        let opts = CrossEntropyOptions::new();
        // The least a forward must move: each f32 logit read once and each i64 target once
        // (the fused kernel's traffic; log_softmax then nll_loss also writes the logits'
        // size once and reads it again).
        let bytes = (4 * e.rows * 1000 + 8 * e.rows) as f64;
        Ok((
            Box::new(move || logits.cross_entropy(&target, &opts)),
            Work::Millis,
            Bound::Bytes(bytes),
        ))
    }),
    ("tiny_op_overhead", |e| {
        let (a, b) = (randn(e, &[4])?, randn(e, &[4])?);
        Ok((Box::new(move || a.add(&b)), Work::Micros, Bound::None))
    }),
    ("profiler_on_tiny_op_overhead", |e| {
        let (a, b) = (randn(e, &[4])?, randn(e, &[4])?);
        let mut activities = vec![ProfilerActivity::Cpu];
        if e.device.is_cuda() {
            activities.push(ProfilerActivity::Cuda);
        }
        // Recording for as long as the case runs: dropped with the closure, which stops it.
        let prof = ember_profiler::profile(
            ProfileOptions::new()
                .activities(activities)
                .record_shapes(true),
        )
        .map_err(err)?;
        Ok((
            Box::new(move || {
                let _recording = &prof;
                a.add(&b)
            }),
            Work::Micros,
            Bound::None,
        ))
    }),
    ("matmul_f32_n2048", |e| {
        let (a, b) = (randn(e, &[e.side, e.side])?, randn(e, &[e.side, e.side])?);
        let flops = 2.0 * (e.side as f64).powi(3);
        Ok((
            Box::new(move || a.matmul(&b)),
            Work::Flops(flops),
            Bound::Flops(flops, H100_F32_FLOPS),
        ))
    }),
    ("matmul_bf16_n2048", |e| {
        let a = randn(e, &[e.side, e.side])?
            .to_dtype(DType::Bf16)
            .map_err(err)?;
        let b = randn(e, &[e.side, e.side])?
            .to_dtype(DType::Bf16)
            .map_err(err)?;
        let flops = 2.0 * (e.side as f64).powi(3);
        Ok((
            Box::new(move || a.matmul(&b)),
            Work::Flops(flops),
            Bound::Flops(flops, H100_BF16_FLOPS),
        ))
    }),
    ("conv2d_f32_32x64x56x56", |e| {
        // A ResNet stage: 3x3, pad 1, 64 -> 64 channels (im2col + GEMM).
        let batch = if e.n < N16M { 2 } else { 32 };
        let x = randn(e, &[batch, 64, 56, 56])?;
        let w = randn(e, &[64, 64, 3, 3])?;
        let opts = ember_tensor::Conv2dOptions::new().padding(1);
        let flops = 2.0 * (batch * 64 * 56 * 56 * 64 * 9) as f64;
        Ok((
            Box::new(move || x.conv2d(&w, None, &opts)),
            Work::Flops(flops),
            Bound::Flops(flops, H100_F32_FLOPS),
        ))
    }),
];

/// Cases that run on the CPU too (the others only on CUDA, where the CPU has its own
/// matmul benchmarks).
fn on_cpu(name: &str) -> bool {
    !name.starts_with("matmul_") && !name.starts_with("conv2d_")
}

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    if opts.cpu() {
        let env = Env {
            device: Device::Cpu,
            n: N16M,
            rows: 4096,
            side: 2048,
        };
        run_on(opts, out, &env, false)?;
    }
    if opts.cuda() {
        let emulated = cuda::is_emulated();
        let env = Env {
            device: Device::Cuda(0),
            n: if emulated { N16M / 64 } else { N16M },
            rows: if emulated { 64 } else { 4096 },
            side: if emulated { 128 } else { 2048 },
        };
        run_on(opts, out, &env, emulated)?;
    }
    Ok(())
}

fn run_on(opts: &Options, out: &mut Vec<Record>, env: &Env, emulated: bool) -> Result<(), String> {
    let threads = rayon::current_num_threads();
    let sync = || -> Result<(), String> {
        match env.device {
            Device::Cuda(i) => cuda::synchronize(Some(i)).map_err(err),
            Device::Cpu => Ok(()),
        }
    };
    for (name, setup) in CASES {
        if !opts.wants(name) || (env.device == Device::Cpu && !on_cpu(name)) {
            continue;
        }
        let (mut f, work, bound) = setup(env).map_err(|e| format!("{name}: {e}"))?;
        let t = Instant::now();
        f().map_err(|e| format!("{name}: {e}"))?;
        sync()?;
        let once = t.elapsed().as_secs_f64().max(1e-7);
        // A recording profiler keeps every call's events until the case ends: as many calls
        // as the PyTorch side makes at most.
        let most = if name.starts_with("profiler_on") {
            10_000
        } else {
            100_000
        };
        let iters = ((ROUND_S / once) as usize).clamp(1, most);
        let ns = ns_per_iter(ROUNDS, iters, || {
            let _ = f();
            let _ = sync();
        });
        let (value, unit) = match work {
            Work::Bytes(b) => (b / ns, "GB/s"),
            Work::Flops(fl) => (fl / ns, "GFLOP/s"),
            Work::Millis => (ns * 1e-6, "ms"),
            Work::Micros => (ns * 1e-3, "us"),
        };
        let mut extra = serde_json::Map::new();
        if env.device.is_cuda() {
            if let Some(b) = bound.seconds() {
                extra.insert("h100_bound_us".into(), (b * 1e6).into());
                extra.insert("fraction_of_h100_bound".into(), (b / (ns * 1e-9)).into());
            }
            if emulated {
                extra.insert("emulated".into(), true.into());
                extra.insert("elements".into(), env.n.into());
                let counts = launches_and_waits(&mut || f().map(drop).map_err(err))?;
                insert_counts(&mut extra, Some(counts));
            }
        }
        out.push(Record {
            name: name.to_string(),
            device: env.device.to_string(),
            threads,
            value,
            unit,
            extra,
        });
    }
    Ok(())
}
