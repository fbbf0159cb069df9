//! ResNet-18 exactly as torchvision defines it (`torchvision.models.resnet18()`): a 7×7
//! stride-2 stem with BatchNorm, ReLU and a 3×3 stride-2 max pool, four stages of two
//! BasicBlocks (64, 128, 256, 512 channels; the first block of stages 2–4 halves the
//! resolution and adds the downsampling 1×1 convolution with its BatchNorm to the residual
//! path), a global average pool and a 1000-class `Linear`. The parameter names are
//! torchvision's (`conv1.weight`, `layer2.0.downsample.0.weight`, `fc.bias`, ...).
//!
//! - `train_resnet18_b32`: one training step (`zero_grad`, forward, cross-entropy, backward,
//!   SGD with momentum 0.9) at batch 32 × 3 × 224 × 224, in samples per second; the record
//!   also carries `steps_per_s` and `peak_memory_bytes` (the allocator's peak during one
//!   step above what was allocated before it: weights, momentum, input). Target on an H100:
//!   at least 0.9× PyTorch's rate, at most 1.1× its peak.
//! - `fwd_resnet18_b32`: a forward in eval mode under `no_grad`, in ms, with its peak.
//! - `train_resnet18_b32_f16`, `train_resnet18_b32_bf16` (CUDA): the training step under
//!   autocast (mixed precision, `ember-amp`): the forward and the loss in an autocast region,
//!   f16 with a `GradScaler` (`scale(loss).backward()`, `step`, `update`), bf16 without one,
//!   as PyTorch's AMP recipe (the side-by-side script runs it so). Target: at least
//!   PyTorch's AMP rate.
//!
//! On CUDA the cases run at batch 32; on the emulated `cuda:0` at batch 2 × 3 × 32 × 32 (the
//! records say `"emulated": true`, `batch` and `image`), so the path runs in CI and a real
//! GPU measures the full size.
//!
//! On the CPU: `train_resnet18_b8`, `train_resnet18_b32` and `fwd_resnet18_b32`, and the same
//! under `autocast(cpu, bf16)` with `_bf16` appended (f32 weights, bf16 compute; the records
//! say `"autocast": "bf16"`). Every CPU record carries the wall, user and system time of its
//! timed calls (`wall_s`, `user_s`, `sys_s`, `sys_fraction`; a step whose buffers are
//! faulted in afresh shows a large system share) and the convolution backend
//! (`conv_backend`). With `--quick` they run at 64 × 64 images (`"image": 64`).

use ember_device::{Device, cuda};
use ember_nn::layers::{BatchNorm2d, Conv2d, Conv2dConfig, Linear, MaxPool2d, ReLU, Sequential};
use ember_nn::loss::CrossEntropyLoss;
use ember_nn::optim::{Optimizer, SGD, SgdOptions};
use ember_nn::{Loss, Module, Tensor};
use ember_tensor::{DType, MaxPool2dOptions, Size2};

use ember_amp::{GradScaler, GradScalerOptions, autocast};

use crate::harness::{Options, Record, insert_times, with_times};
use crate::nn::{emulated_counts, err, insert_counts, mark_run, peak_of, record, time};

/// A convolution without bias, as torchvision's `conv3x3`/`conv1x1`.
fn conv(
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    padding: usize,
) -> Result<Conv2d, String> {
    let config = Conv2dConfig {
        stride: Size2(stride, stride),
        padding: Size2(padding, padding).into(),
        bias: false,
        ..Conv2dConfig::default()
    };
    Conv2d::with_config(cin, cout, (k, k), config, ()).map_err(err)
}

fn bn(c: usize) -> Result<BatchNorm2d, String> {
    BatchNorm2d::new(c, ()).map_err(err)
}

/// torchvision's `BasicBlock` (expansion 1).
#[derive(Debug, Module)]
struct BasicBlock {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    relu: ReLU,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    downsample: Option<Sequential>,
}

impl BasicBlock {
    fn new(cin: usize, cout: usize, stride: usize) -> Result<Self, String> {
        let downsample = if stride != 1 || cin != cout {
            Some(
                Sequential::new()
                    .add(conv(cin, cout, 1, stride, 0)?)
                    .add(bn(cout)?),
            )
        } else {
            None
        };
        Ok(BasicBlock {
            conv1: conv(cin, cout, 3, stride, 1)?,
            bn1: bn(cout)?,
            relu: ReLU::new(),
            conv2: conv(cout, cout, 3, 1, 1)?,
            bn2: bn(cout)?,
            downsample,
        })
    }
}

impl Module for BasicBlock {
    // Note [Intermediates in a forward]: each layer's input is released as soon as its
    // output exists (`out = layer(&out)` drops the old `out` on assignment), as the Python
    // forward's rebinding does; nesting the calls in one expression, or shadowing with
    // `let`, would keep every intermediate of the block alive until its end (three
    // activations at once instead of two).
    fn forward(&self, x: &Tensor) -> ember_nn::Result<Tensor> {
        let mut out = self.conv1.call(x)?;
        out = self.bn1.call(&out)?;
        out = self.relu.call(&out)?;
        out = self.conv2.call(&out)?;
        out = self.bn2.call(&out)?;
        out = match &self.downsample {
            Some(d) => out.add(&d.call(x)?)?,
            None => out.add(x)?,
        };
        self.relu.call(&out)
    }
}

/// torchvision's `ResNet` with `BasicBlock` and layers `[2, 2, 2, 2]`.
#[derive(Debug, Module)]
pub struct ResNet18 {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    relu: ReLU,
    maxpool: MaxPool2d,
    layer1: Vec<BasicBlock>,
    layer2: Vec<BasicBlock>,
    layer3: Vec<BasicBlock>,
    layer4: Vec<BasicBlock>,
    fc: Linear,
}

impl ResNet18 {
    pub fn new(num_classes: usize) -> Result<Self, String> {
        let stage = |cin: usize, cout: usize, stride: usize| -> Result<Vec<BasicBlock>, String> {
            Ok(vec![
                BasicBlock::new(cin, cout, stride)?,
                BasicBlock::new(cout, cout, 1)?,
            ])
        };
        Ok(ResNet18 {
            conv1: conv(3, 64, 7, 2, 3)?,
            bn1: bn(64)?,
            relu: ReLU::new(),
            maxpool: MaxPool2d::with_options(MaxPool2dOptions::new(3).stride(2).padding(1)),
            layer1: stage(64, 64, 1)?,
            layer2: stage(64, 128, 2)?,
            layer3: stage(128, 256, 2)?,
            layer4: stage(256, 512, 2)?,
            fc: Linear::new(512, num_classes, ()).map_err(err)?,
        })
    }
}

impl Module for ResNet18 {
    fn forward(&self, x: &Tensor) -> ember_nn::Result<Tensor> {
        // Note [Intermediates in a forward].
        let mut x = self.conv1.call(x)?;
        x = self.bn1.call(&x)?;
        x = self.relu.call(&x)?;
        x = self.maxpool.call(&x)?;
        for block in self
            .layer1
            .iter()
            .chain(&self.layer2)
            .chain(&self.layer3)
            .chain(&self.layer4)
        {
            x = block.call(&x)?;
        }
        // `AdaptiveAvgPool2d((1, 1))` then `flatten(x, 1)`: the mean over height and width.
        let x = x.mean([2usize, 3])?;
        self.fc.call(&x)
    }
}

/// The cases of one device: (name, batch, train, autocast).
fn cases(device: Device) -> Vec<(String, usize, bool, Option<DType>)> {
    if device.is_cuda() {
        return vec![
            ("train_resnet18_b32".into(), 32, true, None),
            ("fwd_resnet18_b32".into(), 32, false, None),
            ("train_resnet18_b32_f16".into(), 32, true, Some(DType::F16)),
            (
                "train_resnet18_b32_bf16".into(),
                32,
                true,
                Some(DType::Bf16),
            ),
        ];
    }
    let mut v = Vec::new();
    for amp in [None, Some(DType::Bf16)] {
        for (base, batch, train) in [
            ("train_resnet18_b8", 8, true),
            ("train_resnet18_b32", 32, true),
            ("fwd_resnet18_b32", 32, false),
        ] {
            let name = match amp {
                None => base.to_string(),
                Some(dt) => format!("{base}_{}", dt.name()),
            };
            v.push((name, batch, train, amp));
        }
    }
    v
}

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    for device in opts.device_list() {
        for (name, batch, train, amp) in cases(device) {
            if !opts.wants(&name) {
                continue;
            }
            let r = case(opts, device, &name, batch, train, amp)
                .map_err(|e| format!("{name} on {device}: {e}"))?;
            out.push(r);
        }
    }
    Ok(())
}

fn case(
    opts: &Options,
    device: Device,
    name: &str,
    batch: usize,
    train: bool,
    amp: Option<DType>,
) -> Result<Record, String> {
    let emulated = device.is_cuda() && cuda::is_emulated();
    let (batch, image) = if emulated {
        (2, 32)
    } else if opts.quick && !device.is_cuda() {
        (batch.min(2), 64)
    } else {
        (batch, 224)
    };
    let model = ResNet18::new(1000)?;
    model.to(device).map_err(err)?;
    let x = Tensor::randn([batch, 3, image, image], (device, DType::F32)).map_err(err)?;
    let region = || amp.map(|dt| autocast(device, dt)).transpose().map_err(err);
    let (value, unit, peak, steps, counts, times) = if train {
        model.train(true);
        let y = Tensor::randint(0, 1000, [batch], (device, DType::I64)).map_err(err)?;
        let loss_fn = CrossEntropyLoss::new();
        let mut opt = SGD::new(
            model.parameters(),
            SgdOptions {
                lr: 0.01,
                momentum: 0.9,
                ..SgdOptions::default()
            },
        )
        .map_err(err)?;
        // f16 needs loss scaling; bf16 (and f32) run with the scaler disabled, a
        // pass-through.
        let mut scaler = GradScaler::with_options(
            device,
            GradScalerOptions {
                enabled: amp == Some(DType::F16),
                ..Default::default()
            },
        )
        .map_err(err)?;
        let mut step = || {
            opt.zero_grad(true).map_err(err)?;
            let loss = {
                let _region = region()?;
                loss_fn
                    .forward(&model.forward(&x).map_err(err)?, &y)
                    .map_err(err)?
            };
            scaler.scale(&loss).map_err(err)?.backward().map_err(err)?;
            scaler.step(&mut opt).map_err(err)?;
            scaler.update().map_err(err)
        };
        // The first step makes the momentum buffers; the peak is a step's after that.
        step()?;
        let peak = peak_of(device, &mut step)?;
        let (ns, times) = with_times(|| time(device, opts.quick, &mut step));
        let steps = 1e9 / ns?;
        let counts = emulated_counts(device, &mut step)?;
        (
            steps * batch as f64,
            "samples/s",
            peak,
            Some(steps),
            counts,
            times,
        )
    } else {
        model.train(false);
        let _no_grad = ember_autograd::no_grad();
        let mut fwd = || {
            let _region = region()?;
            model.forward(&x).map(drop).map_err(err)
        };
        fwd()?;
        let peak = peak_of(device, &mut fwd)?;
        let (ns, times) = with_times(|| time(device, opts.quick, &mut fwd));
        let ns = ns?;
        let counts = emulated_counts(device, &mut fwd)?;
        (ns * 1e-6, "ms", peak, None, counts, times)
    };
    let mut r = record(name, device, value, unit);
    if let Some(s) = steps {
        r.extra.insert("steps_per_s".into(), s.into());
    }
    r.extra.insert("peak_memory_bytes".into(), peak.into());
    mark_run(&mut r, opts.quick, emulated, batch);
    if emulated || image != 224 {
        r.extra.insert("image".into(), image.into());
    }
    if let Some(dt) = amp {
        r.extra.insert("autocast".into(), dt.name().into());
    }
    if !device.is_cuda() {
        insert_times(&mut r.extra, times);
        r.extra.insert(
            "conv_backend".into(),
            ember_tensor::backends::mkldnn::conv_path(amp.unwrap_or(DType::F32))
                .0
                .into(),
        );
        if opts.quick {
            r.extra.insert("batch".into(), batch.into());
        }
    }
    insert_counts(&mut r.extra, counts);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parameter names and counts are torchvision's: 62 tensors, 11,689,512 values.
    #[test]
    fn parameters_match_torchvision() {
        let m = ResNet18::new(1000).unwrap();
        let named = m.named_parameters();
        assert_eq!(named.len(), 62);
        let total: usize = named.iter().map(|(_, p)| p.numel()).sum();
        assert_eq!(total, 11_689_512);
        let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
        for n in [
            "conv1.weight",
            "bn1.weight",
            "layer1.0.conv1.weight",
            "layer2.0.downsample.0.weight",
            "layer2.0.downsample.1.bias",
            "layer4.1.bn2.weight",
            "fc.weight",
            "fc.bias",
        ] {
            assert!(names.contains(&n), "{n} not in {names:?}");
        }
        let buffers: Vec<String> = m.named_buffers().into_iter().map(|(n, _)| n).collect();
        assert!(buffers.contains(&"layer3.0.downsample.1.running_var".to_string()));
    }
}
