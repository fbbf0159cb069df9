//! Convolutions on the CPU, as a ResNet stage runs them (3×3, padding 1, 64 → 64 channels,
//! batch 32 × 56 × 56), in GFLOP/s:
//!
//! - `conv2d_f32_32x64x56x56`: the forward (`2·N·O·L·C·9` flops);
//! - `conv2d_fwdbwd_f32_32x64x56x56`: forward and backward through autograd (the input and
//!   weight gradients of a fixed output gradient: three times the forward's flops);
//! - the same with `_bf16` appended, under `autocast(cpu, bf16)` (f32 tensors, bf16
//!   compute; the records say `"autocast": "bf16"`).
//!
//! Every record carries the wall, user and system time of its timed calls (`wall_s`,
//! `user_s`, `sys_s`, `sys_fraction`): a convolution that faults its scratch in afresh on
//! each call shows there. The CUDA record of `conv2d_f32_32x64x56x56` is `tensor_ops.rs`'s;
//! `bench/torch_side_by_side.py` runs the PyTorch side (oneDNN).

use ember_amp::autocast;
use ember_device::Device;
use ember_nn::Tensor;
use ember_tensor::{Conv2dOptions, DType};

use crate::harness::{Options, Record, insert_times, with_times};
use crate::nn::{err, mark_run, record, time};

const FWD: &str = "conv2d_f32_32x64x56x56";
const FWD_BWD: &str = "conv2d_fwdbwd_f32_32x64x56x56";

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    if !opts.cpu() {
        return Ok(());
    }
    let device = Device::Cpu;
    for amp in [None, Some(DType::Bf16)] {
        for (base, backward) in [(FWD, false), (FWD_BWD, true)] {
            let name = match amp {
                None => base.to_string(),
                Some(_) => format!("{base}_bf16"),
            };
            if !opts.wants(&name) {
                continue;
            }
            let (n, c, hw, o) = if opts.quick {
                (2, 64, 56, 64)
            } else {
                (32, 64, 56, 64)
            };
            let x = Tensor::randn([n, c, hw, hw], device)
                .and_then(|t| t.requires_grad_(backward))
                .map_err(err)?;
            let w = Tensor::randn([o, c, 3, 3], device)
                .and_then(|t| t.requires_grad_(backward))
                .map_err(err)?;
            let gy = Tensor::randn([n, o, hw, hw], device).map_err(err)?;
            let conv_opts = Conv2dOptions::new().padding(1);
            let mut call = || -> Result<(), String> {
                let y = {
                    let _region = amp
                        .map(|dt| autocast(device, dt))
                        .transpose()
                        .map_err(err)?;
                    x.conv2d(&w, None, &conv_opts).map_err(err)?
                };
                if backward {
                    let g = gy.to_dtype(y.dtype()).map_err(err)?;
                    y.backward_with(&g).map_err(err)?;
                    x.set_grad(None).map_err(err)?;
                    w.set_grad(None).map_err(err)?;
                }
                Ok(())
            };
            let (ns, times) = with_times(|| time(device, opts.quick, &mut call));
            let ns = ns?;
            let flops = 2.0 * (n * o * hw * hw * c * 9) as f64 * if backward { 3.0 } else { 1.0 };
            let mut r: Record = record(&name, device, flops / ns, "GFLOP/s");
            insert_times(&mut r.extra, times);
            if let Some(dt) = amp {
                r.extra.insert("autocast".into(), dt.name().into());
            }
            r.extra.insert(
                "conv_backend".into(),
                ember_tensor::backends::mkldnn::conv_path(amp.unwrap_or(DType::F32))
                    .0
                    .into(),
            );
            mark_run(&mut r, opts.quick, false, n);
            out.push(r);
        }
    }
    Ok(())
}
