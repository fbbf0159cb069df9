//! The launch helpers on the emulated `cuda:0`: the same results as the CPU kernel (dropout
//! included: both draw the same Philox mask), and device memory that stays O(L).
#![allow(clippy::unwrap_used)]

use ember_device::Device;
use ember_testing::Lcg;

use super::*;
use crate::cpu::attention::{
    AttnDims, AttnDropout, AttnMask, AttnView, attention_backward as cpu_backward,
    attention_forward as cpu_forward,
};
use crate::random::Generator;
use crate::storage::CpuStorage;

fn gpu() -> std::sync::Arc<Ctx> {
    ember_testing::prepare(Device::Cuda(0)).unwrap();
    super::super::ctx("attention test", 0).unwrap()
}

fn upload<T: crate::dtype::WithDType>(ctx: &std::sync::Arc<Ctx>, x: &[T]) -> CudaStorage {
    CudaStorage::upload(ctx, &CpuStorage::from_slice(x).unwrap()).unwrap()
}

fn download_f32(s: &CudaStorage) -> Vec<f32> {
    s.download().unwrap().as_slice::<f32>().unwrap().to_vec()
}

fn close(what: &str, cpu: &[f32], gpu: &[f32]) {
    assert_eq!(cpu.len(), gpu.len(), "{what}");
    let scale = cpu
        .iter()
        .filter(|x| x.is_finite())
        .fold(1e-3f32, |m, x| m.max(x.abs()));
    for (i, (&a, &b)) in cpu.iter().zip(gpu).enumerate() {
        let ok = a == b || (a - b).abs() <= 1e-4 * a.abs() + 2e-5 * scale;
        assert!(ok, "{what} element {i}: cpu {a}, cuda {b}");
    }
}

#[test]
fn cuda_and_cpu_kernels_agree_with_a_mask_and_dropout() {
    let ctx = gpu();
    let (b, h, g, l, s, e) = (2, 4, 2, 40, 70, 16);
    let mut rng = Lcg(5);
    let mut vals = |n: usize| (0..n).map(|_| rng.f32(2.0)).collect::<Vec<f32>>();
    let (q, k, v, dout) = (
        vals(b * h * l * e),
        vals(b * g * s * e),
        vals(b * g * s * e),
        vals(b * h * l * e),
    );
    // A key-padding mask [B, 1, 1, S] broadcast over heads and queries.
    let mask: Vec<bool> = (0..b * s).map(|x| x % s < s - 3 * (x / s + 1)).collect();
    let mstr = [s, 0, 0, 1];
    let gen_ = Generator::with_seed(77, Device::Cpu);
    let (key, base) = gen_.reserve(ember_kernels::attention::dropout_counters(b, h, l, s));
    let opts = AttnOptions {
        scale: 0.25,
        causal: true,
        dropout: Some(AttnDropout { p: 0.3, key, base }),
    };
    // The CPU kernel.
    let dims = AttnDims {
        batch: b,
        heads: h,
        kv_heads: g,
        len_q: l,
        len_kv: s,
        dim_qk: e,
        dim_v: e,
    };
    let cq = [h * l * e, l * e, e];
    let ck = [g * s * e, s * e, e];
    let view = |data, strides| AttnView { data, strides };
    let (mut out, mut lse) = (vec![0f32; b * h * l * e], vec![0f32; b * h * l]);
    let cmask = AttnMask::Bool(&mask, mstr);
    cpu_forward(
        &dims,
        view(&q, cq),
        view(&k, ck),
        view(&v, ck),
        cmask,
        &opts,
        &mut out,
        &mut lse,
    )
    .unwrap();
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; q.len()],
        vec![0f32; k.len()],
        vec![0f32; v.len()],
    );
    cpu_backward(
        &dims,
        (view(&q, cq), view(&k, ck), view(&v, ck)),
        cmask,
        &opts,
        (&out, view(&dout, cq), &lse),
        &mut dq,
        &mut dk,
        &mut dv,
    )
    .unwrap();
    // The CUDA kernels on the same inputs.
    let lq = Layout::contiguous([b, h, l, e]);
    let lk = Layout::contiguous([b, g, s, e]);
    let lm = Layout::new([b, h, l, s].into(), vec![s, 0, 0, 1], 0);
    let (gq, gk, gv, gd) = (
        upload(&ctx, &q),
        upload(&ctx, &k),
        upload(&ctx, &v),
        upload(&ctx, &dout),
    );
    let gm = upload(&ctx, &mask);
    let (o, ls) =
        attention_forward((&gq, &lq), (&gk, &lk), (&gv, &lk), Some((&gm, &lm)), &opts).unwrap();
    let (gdq, gdk, gdv) = attention_backward(
        (&gq, &lq),
        (&gk, &lk),
        (&gv, &lk),
        Some((&gm, &lm)),
        &opts,
        &o,
        &ls,
        (&gd, &lq),
    )
    .unwrap();
    close("out", &out, &download_f32(&o));
    close("lse", &lse, &download_f32(&ls));
    close("dq", &dq, &download_f32(&gdq));
    close("dk", &dk, &download_f32(&gdk));
    close("dv", &dv, &download_f32(&gdv));
    // Dropout did drop: without it the output differs.
    let plain = AttnOptions {
        dropout: None,
        ..opts
    };
    let (o2, _) =
        attention_forward((&gq, &lq), (&gk, &lk), (&gv, &lk), Some((&gm, &lm)), &plain).unwrap();
    assert_ne!(download_f32(&o2), download_f32(&o));
}

#[test]
fn device_memory_stays_linear_in_the_length() {
    // L = S = 4096: one L×S f32 matrix is 64 MiB. The forward and backward allocate their
    // outputs, lse and delta only: the allocator's peak over the inputs stays far below it.
    let ctx = gpu();
    let (l, e) = (4096, 8);
    let mut rng = Lcg(9);
    let mut vals = |n: usize| (0..n).map(|_| rng.f32(1.0)).collect::<Vec<f32>>();
    let (q, k, v, dout) = (vals(l * e), vals(l * e), vals(l * e), vals(l * e));
    let lay = Layout::contiguous([1, 1, l, e]);
    let (gq, gk, gv, gd) = (
        upload(&ctx, &q),
        upload(&ctx, &k),
        upload(&ctx, &v),
        upload(&ctx, &dout),
    );
    ctx.driver.synchronize(0).unwrap();
    let device = Device::Cuda(0);
    let before = ember_memory::memory_allocated(device).unwrap();
    ember_memory::reset_peak_memory_stats(device).unwrap();
    let opts = AttnOptions {
        scale: 0.3,
        causal: true,
        dropout: None,
    };
    let (o, lse) = attention_forward((&gq, &lay), (&gk, &lay), (&gv, &lay), None, &opts).unwrap();
    let grads = attention_backward(
        (&gq, &lay),
        (&gk, &lay),
        (&gv, &lay),
        None,
        &opts,
        &o,
        &lse,
        (&gd, &lay),
    )
    .unwrap();
    let peak = ember_memory::max_memory_allocated(device).unwrap() - before;
    let scores = (l * l * 4) as u64;
    // out, dq, dk, dv (L·E f32 each), lse and delta (L f32 each), rounded up by the allocator.
    assert!(
        peak < scores / 32,
        "peak {peak} bytes over the inputs, one L×S f32 matrix is {scores}"
    );
    assert!(
        peak >= (4 * l * e * 4 + 2 * l * 4) as u64,
        "peak {peak}: the outputs were not counted"
    );
    // The last row against the CPU kernel: causal, it attends to every key.
    let dims = AttnDims {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        len_q: l,
        len_kv: l,
        dim_qk: e,
        dim_v: e,
    };
    let st = [l * e, l * e, e];
    let view = |data| AttnView { data, strides: st };
    let (mut out, mut cl) = (vec![0f32; l * e], vec![0f32; l]);
    cpu_forward(
        &dims,
        view(&q),
        view(&k),
        view(&v),
        AttnMask::None,
        &opts,
        &mut out,
        &mut cl,
    )
    .unwrap();
    close("out", &out, &download_f32(&o));
    close("lse", &cl, &download_f32(&lse));
    drop(grads);
}
