//! Attention and the text model (issue 44), as a user runs them:
//!
//! - `sdpa_b8_h8_l1024_d64_causal`: `functional::scaled_dot_product_attention(q, k, v,
//!   is_causal)` on `[8, 8, 1024, 64]` inputs under `no_grad`, in ms per call, with
//!   `peak_memory_bytes` (the allocator's peak during one call above what was allocated
//!   before it). `sdpa_fwdbwd_b8_h8_l1024_d64_causal`: the forward and `backward_with` a
//!   fixed output gradient into q, k and v, in ms. Both with the fused kernel asked for
//!   (`sdpa::scoped(Flash)`: a case it cannot run is an error, not a silent math path), as
//!   PyTorch's default picks its flash kernel for these inputs on the CPU and on CUDA.
//!   Targets: CPU at least PyTorch's CPU SDPA; CUDA in bf16 (`_bf16` appended) at least
//!   0.9× PyTorch's flash backend, and `sdpa_fwdbwd_b1_h8_l8192_d64_causal_bf16`'s peak at
//!   most 1.1× PyTorch's.
//! - `train_gpt_b32_t64`: one training step of the model `ember train --model gpt` trains by
//!   default (its `Gpt` and defaults, the vocabulary of the shipped text; Adam at the default
//!   learning rate; cross-entropy over every position; the loss read back as the program
//!   does), on 32 random windows of 64 characters, in samples per second (`steps_per_s` in
//!   the extras). `_bf16` appended: forward and loss under `autocast(bf16)`; `_f16` (CUDA):
//!   under `autocast(f16)` with a `GradScaler`. Target: at least PyTorch eager's rate.
//!
//! On the emulated `cuda:0` the cases shrink (the records say `"emulated": true` and the
//! sizes), so the paths run in CI and a GPU measures the full size.

use ember_amp::{GradScaler, autocast};
use ember_cli::train::gpt::{Gpt, GptConfig};
use ember_cli::train::text::{Vocab, load_text};
use ember_cli::train::{
    DEFAULT_BLOCK_SIZE, DEFAULT_D_MODEL, DEFAULT_LR, DEFAULT_N_HEAD, DEFAULT_N_LAYER, ModelKind,
};
use ember_device::{Device, cuda};
use ember_nn::functional::{self as F, SdpaOptions};
use ember_nn::loss::CrossEntropyLoss;
use ember_nn::optim::{Adam, AdamOptions, Optimizer};
use ember_nn::{Loss, Module, Tensor};
use ember_tensor::DType;
use ember_tensor::backends::sdpa::{self, SdpaKernel};

use crate::harness::{Options, Record, insert_times, with_times};
use crate::nn::{emulated_counts, err, insert_counts, mark_run, peak_of, record, time};

/// One SDPA case: (name, [batch, heads, length, head dim], dtype, backward, peak memory).
type SdpaCase = (String, [usize; 4], DType, bool, bool);

fn sdpa_cases(device: Device) -> Vec<SdpaCase> {
    let mut v = Vec::new();
    let (dt, suffix) = if device.is_cuda() {
        (DType::Bf16, "_bf16")
    } else {
        (DType::F32, "")
    };
    for backward in [false, true] {
        let kind = if backward { "_fwdbwd" } else { "" };
        v.push((
            format!("sdpa{kind}_b8_h8_l1024_d64_causal{suffix}"),
            [8, 8, 1024, 64],
            dt,
            backward,
            true,
        ));
    }
    if device.is_cuda() {
        v.push((
            "sdpa_fwdbwd_b1_h8_l8192_d64_causal_bf16".into(),
            [1, 8, 8192, 64],
            DType::Bf16,
            true,
            true,
        ));
    }
    v
}

/// One GPT case: (name, autocast dtype).
fn gpt_cases(device: Device) -> Vec<(String, Option<DType>)> {
    let mut v = vec![
        ("train_gpt_b32_t64".to_string(), None),
        ("train_gpt_b32_t64_bf16".to_string(), Some(DType::Bf16)),
    ];
    if device.is_cuda() {
        v.push(("train_gpt_b32_t64_f16".to_string(), Some(DType::F16)));
    }
    v
}

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    for device in opts.device_list() {
        for (name, shape, dt, backward, peak) in sdpa_cases(device) {
            if opts.wants(&name) {
                let r = sdpa_case(opts, device, &name, shape, dt, backward, peak)
                    .map_err(|e| format!("{name} on {device}: {e}"))?;
                out.push(r);
            }
        }
        for (name, amp) in gpt_cases(device) {
            if opts.wants(&name) {
                let r = gpt_case(opts, device, &name, amp)
                    .map_err(|e| format!("{name} on {device}: {e}"))?;
                out.push(r);
            }
        }
    }
    Ok(())
}

fn sdpa_case(
    opts: &Options,
    device: Device,
    name: &str,
    shape: [usize; 4],
    dt: DType,
    backward: bool,
    want_peak: bool,
) -> Result<Record, String> {
    let emulated = device.is_cuda() && cuda::is_emulated();
    // The emulator runs the same kernels at a size it finishes in a moment.
    let shape = if emulated {
        [1, 2, 96, shape[3]]
    } else {
        shape
    };
    let _flash = sdpa::scoped(SdpaKernel::Flash);
    let make = || -> Result<Tensor, String> {
        let t = Tensor::randn(shape, (device, DType::F32))
            .and_then(|t| t.to_dtype(dt))
            .map_err(err)?;
        if backward {
            t.requires_grad_(true).map_err(err)
        } else {
            Ok(t)
        }
    };
    let (q, k, v) = (make()?, make()?, make()?);
    let g = Tensor::randn(shape, (device, DType::F32))
        .and_then(|t| t.to_dtype(dt))
        .map_err(err)?;
    let causal = SdpaOptions {
        is_causal: true,
        ..Default::default()
    };
    let mut call = || -> Result<(), String> {
        if backward {
            for t in [&q, &k, &v] {
                t.set_grad(None).map_err(err)?;
            }
            let o = F::scaled_dot_product_attention(&q, &k, &v, &causal).map_err(err)?;
            o.backward_with(&g).map_err(err)
        } else {
            let _no_grad = ember_autograd::no_grad();
            F::scaled_dot_product_attention(&q, &k, &v, &causal)
                .map(drop)
                .map_err(err)
        }
    };
    call()?;
    let peak = if want_peak {
        Some(peak_of(device, &mut call)?)
    } else {
        None
    };
    let (ns, times) = with_times(|| time(device, opts.quick, &mut call));
    let counts = emulated_counts(device, &mut call)?;
    let mut r = record(name, device, ns? * 1e-6, "ms");
    if let Some(p) = peak {
        r.extra.insert("peak_memory_bytes".into(), p.into());
    }
    mark_run(&mut r, opts.quick, emulated, shape[0]);
    if emulated {
        r.extra.insert("shape".into(), format!("{shape:?}").into());
    }
    r.extra.insert("sdpa".into(), "flash".into());
    if !device.is_cuda() {
        insert_times(&mut r.extra, times);
    }
    insert_counts(&mut r.extra, counts);
    Ok(r)
}

/// The default `ember train --model gpt` model on `device`, from the shipped text's
/// vocabulary.
fn default_gpt(device: Device) -> Result<Gpt, String> {
    let vocab = Vocab::from_text(&load_text().map_err(err)?);
    let cfg = GptConfig {
        vocab_size: vocab.len(),
        block_size: DEFAULT_BLOCK_SIZE,
        n_layer: DEFAULT_N_LAYER,
        n_head: DEFAULT_N_HEAD,
        d_model: DEFAULT_D_MODEL,
    };
    Gpt::new(cfg, device).map_err(err)
}

fn gpt_case(
    opts: &Options,
    device: Device,
    name: &str,
    amp: Option<DType>,
) -> Result<Record, String> {
    let emulated = device.is_cuda() && cuda::is_emulated();
    let batch = if emulated {
        2
    } else {
        ModelKind::Gpt.default_batch_size()
    };
    let t = DEFAULT_BLOCK_SIZE;
    let model = default_gpt(device)?;
    model.train(true);
    let vocab = model.config().vocab_size as i64;
    let x = Tensor::randint(0, vocab, [batch, t], (device, DType::I64)).map_err(err)?;
    let y = Tensor::randint(0, vocab, [batch * t], (device, DType::I64)).map_err(err)?;
    let loss_fn = CrossEntropyLoss::new();
    let mut opt = Adam::new(
        model.parameters(),
        AdamOptions {
            lr: DEFAULT_LR,
            ..Default::default()
        },
    )
    .map_err(err)?;
    let mut scaler = GradScaler::new(device)
        .map_err(err)?
        .enabled(amp == Some(DType::F16));
    let mut step = || -> Result<(), String> {
        opt.zero_grad(true).map_err(err)?;
        let loss = {
            let _region = amp
                .map(|dt| autocast(device, dt))
                .transpose()
                .map_err(err)?;
            let logits = model.forward(&x).map_err(err)?;
            let v = logits.dims()[2];
            let logits = logits.reshape([batch * t, v]).map_err(err)?;
            loss_fn.forward(&logits, &y).map_err(err)?
        };
        scaler.scale(&loss).map_err(err)?.backward().map_err(err)?;
        scaler.step(&mut opt).map_err(err)?;
        scaler.update().map_err(err)?;
        // The program reads each step's loss back (its progress line and divergence check).
        loss.item::<f32>().map(drop).map_err(err)
    };
    // The first step makes Adam's moments; the peak is a step's after that.
    step()?;
    let peak = peak_of(device, &mut step)?;
    let (ns, times) = with_times(|| time(device, opts.quick, &mut step));
    let steps = 1e9 / ns?;
    let counts = emulated_counts(device, &mut step)?;
    let mut r = record(name, device, steps * batch as f64, "samples/s");
    r.extra.insert("steps_per_s".into(), steps.into());
    r.extra.insert("peak_memory_bytes".into(), peak.into());
    r.extra.insert("vocab_size".into(), vocab.into());
    mark_run(&mut r, opts.quick, emulated, batch);
    if let Some(dt) = amp {
        r.extra.insert("autocast".into(), dt.name().into());
    }
    if !device.is_cuda() {
        insert_times(&mut r.extra, times);
    }
    insert_counts(&mut r.extra, counts);
    Ok(r)
}
