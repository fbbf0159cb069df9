#![allow(clippy::unwrap_used)]
//! `Tensor::scaled_dot_product_attention` on both paths (the fused kernels and the math
//! path, `backends::sdpa`) and every device (`test_device!`: the CPU and the emulated or real
//! `cuda:0`): forward and gradients against the f64 reference
//! (`ember_testing::reference::attention`) and PyTorch's numbers
//! (`attention_reference.json`), bool and float masks, causal with `L != S`, grouped-query
//! attention, 3-D and broadcast inputs, dropout (both paths draw the same weights from the
//! same generator state), f64/f32/f16/bf16, and the errors PyTorch reports.

use std::sync::Mutex;

use ember_tensor::backends::sdpa::{self, SdpaKernel};
use ember_tensor::random::default_generator;
use ember_tensor::{DType, Device, SdpaOptions, Tensor};
use ember_testing::reference::{
    AttnCase, AttnData, MaskKind, assert_attn_close, attention, attention_grad, torch_cases,
};
use ember_testing::{test_device, values};

/// Dropout draws from the device's default generator: the tests that seed it take turns.
static RNG: Mutex<()> = Mutex::new(());

const FUSED_CPU: &str = "ScaledDotProductFlashAttentionForCpuBackward0";
const FUSED_CUDA: &str = "ScaledDotProductFlashAttentionBackward0";

fn t(x: &[f64], dims: &[usize], dtype: DType, device: &Device) -> Tensor {
    Tensor::from_vec(x.to_vec(), dims, device)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn leaf(x: &[f64], dims: &[usize], dtype: DType, device: &Device) -> Tensor {
    t(x, dims, dtype, device).requires_grad_(true).unwrap()
}

/// The round trip of `x` through `dtype` (what a 16-bit op sees).
fn rounder(dtype: DType) -> impl Fn(f64) -> f64 {
    move |x| match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::Bf16 => half::bf16::from_f64(x).to_f64(),
        _ => x,
    }
}

/// Relative and absolute (times the largest magnitude) tolerances per dtype and path: the
/// math path rounds its scores and weights to 16 bits, the fused kernels compute in f32.
fn tol(dtype: DType, fused: bool) -> (f64, f64) {
    match (dtype, fused) {
        (DType::F64, _) => (1e-10, 1e-11),
        (DType::F32, _) => (2e-4, 5e-5),
        (DType::F16, true) => (4e-3, 4e-3),
        (DType::F16, false) => (2e-2, 2e-2),
        (DType::Bf16, true) => (3e-2, 3e-2),
        _ => (8e-2, 8e-2),
    }
}

struct Got {
    out: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    grad_fn: Option<&'static str>,
}

/// The case's shapes, with the heads dim dropped when `three_d` (`B = 1`: `[H, L, E]`).
fn dims(case: &AttnCase, heads: usize, len: usize, dim: usize, three_d: bool) -> Vec<usize> {
    if three_d {
        vec![heads, len, dim]
    } else {
        vec![case.batch, heads, len, dim]
    }
}

/// Runs the op on `data` with `kernel`, backward with `data.dout`.
fn run(
    case: &AttnCase,
    data: &AttnData,
    kernel: SdpaKernel,
    dtype: DType,
    device: &Device,
    three_d: bool,
) -> Got {
    let c = case;
    let q = leaf(
        &data.q,
        &dims(c, c.heads, c.len_q, c.dim_qk, three_d),
        dtype,
        device,
    );
    let k = leaf(
        &data.k,
        &dims(c, c.kv_heads, c.len_kv, c.dim_qk, three_d),
        dtype,
        device,
    );
    let v = leaf(
        &data.v,
        &dims(c, c.kv_heads, c.len_kv, c.dim_v, three_d),
        dtype,
        device,
    );
    let dout = t(
        &data.dout,
        &dims(c, c.heads, c.len_q, c.dim_v, three_d),
        dtype,
        device,
    );
    let mut ms = case.mask_shape().to_vec();
    if three_d {
        ms.remove(0);
    }
    let attn_mask = match case.mask {
        MaskKind::None => None,
        MaskKind::Bool => {
            let m: Vec<u8> = data.mask_bool.iter().map(|&b| u8::from(b)).collect();
            let m = Tensor::from_vec(m, &ms[..], device).unwrap();
            Some(m.to_dtype(DType::Bool).unwrap())
        }
        MaskKind::Float => Some(t(&data.mask_float, &ms, dtype, device)),
    };
    let opts = SdpaOptions {
        attn_mask,
        dropout_p: case.dropout,
        is_causal: case.causal,
        scale: Some(case.scale),
        enable_gqa: case.heads != case.kv_heads,
    };
    let _k = sdpa::scoped(kernel);
    let out = q.scaled_dot_product_attention(&k, &v, &opts).unwrap();
    assert_eq!(out.dtype(), dtype);
    assert_eq!(out.dims(), dims(c, c.heads, c.len_q, c.dim_v, three_d));
    out.backward_with(&dout).unwrap();
    Got {
        out: values(&out),
        dq: values(&q.grad().unwrap()),
        dk: values(&k.grad().unwrap()),
        dv: values(&v.grad().unwrap()),
        grad_fn: out.grad_fn_name(),
    }
}

fn fused_name(device: &Device) -> &'static str {
    if device.is_cuda() {
        FUSED_CUDA
    } else {
        FUSED_CPU
    }
}

/// Both paths (and `auto`, which must take the fused one here) against the reference.
fn check(case: &AttnCase, dtype: DType, device: &Device, three_d: bool) {
    let data = case.data().rounded(rounder(dtype));
    let a = case.attention(&data);
    let want = attention(&a, &data.q, &data.k, &data.v);
    let grads = attention_grad(&a, &data.q, &data.k, &data.v, &data.dout);
    let fused_ok = !(device.is_cuda() && dtype == DType::F64);
    for kernel in [SdpaKernel::Flash, SdpaKernel::Math, SdpaKernel::Auto] {
        let fused = kernel != SdpaKernel::Math && fused_ok;
        if kernel == SdpaKernel::Flash && !fused_ok {
            continue; // not a skip: CUDA has no f64 kernel (the error is tested below)
        }
        let got = run(case, &data, kernel, dtype, device, three_d);
        if fused {
            assert_eq!(got.grad_fn, Some(fused_name(device)), "{kernel:?}");
        } else {
            assert!(
                !got.grad_fn.unwrap().starts_with("ScaledDotProduct"),
                "{kernel:?}"
            );
        }
        let tl = tol(dtype, fused);
        let what = |x: &str| format!("{x} {kernel:?} {dtype} 3d={three_d} {case:?}");
        assert_attn_close(&what("out"), &got.out, &want.out, tl);
        assert_attn_close(&what("dq"), &got.dq, &grads.dq, tl);
        assert_attn_close(&what("dk"), &got.dk, &grads.dk, tl);
        assert_attn_close(&what("dv"), &got.dv, &grads.dv, tl);
    }
}

fn case(shape: [usize; 7], causal: bool, mask: MaskKind, bcast: [bool; 4]) -> AttnCase {
    let mut c = AttnCase::new(shape);
    c.causal = causal;
    c.mask = mask;
    c.mask_broadcast = bcast;
    c
}

fn cases() -> Vec<AttnCase> {
    vec![
        case([2, 2, 2, 5, 7, 8, 6], false, MaskKind::None, [false; 4]),
        // A key-padding bool mask [B, 1, 1, S] and a float mask [1, H, L, S].
        case(
            [2, 2, 2, 6, 9, 8, 8],
            false,
            MaskKind::Bool,
            [false, true, true, false],
        ),
        case(
            [1, 3, 3, 6, 5, 4, 4],
            false,
            MaskKind::Float,
            [true, false, false, false],
        ),
        // Causal with L < S and L > S (rows i >= S see every key).
        case([1, 2, 2, 4, 9, 8, 8], true, MaskKind::None, [false; 4]),
        case([2, 1, 1, 9, 4, 8, 5], true, MaskKind::None, [false; 4]),
        // Grouped-query attention, 6 query heads over 2 kv heads, with a full bool mask.
        case([1, 6, 2, 5, 6, 4, 4], false, MaskKind::Bool, [false; 4]),
    ]
}

fn matches_reference(device: &Device) {
    for c in cases() {
        check(&c, DType::F64, device, false);
        check(&c, DType::F32, device, false);
    }
}
test_device!(matches_reference, matches_reference);

fn matches_reference_16_bit(device: &Device) {
    for c in &cases()[1..4] {
        check(c, DType::F16, device, false);
        check(c, DType::Bf16, device, false);
    }
}
test_device!(matches_reference_16_bit, matches_reference_16_bit);

fn three_d_inputs(device: &Device) {
    // [H, L, E] operands (B = 1), with a mask [L, S] and causal.
    let mut c = case(
        [1, 3, 3, 5, 6, 8, 4],
        false,
        MaskKind::Bool,
        [true, true, false, false],
    );
    check(&c, DType::F32, device, true);
    c.mask = MaskKind::None;
    c.causal = true;
    check(&c, DType::F64, device, true);
}
test_device!(three_d_inputs, three_d_inputs);

fn matches_pytorch(device: &Device) {
    let json = include_str!("../../ember-kernels/tests/reference/attention_reference.json");
    let cases = torch_cases(json).unwrap();
    assert!(!cases.is_empty());
    for tc in &cases {
        for dtype in [DType::F64, DType::F32] {
            let data = tc.data.rounded(rounder(dtype));
            for kernel in [SdpaKernel::Auto, SdpaKernel::Math] {
                let got = run(&tc.case, &data, kernel, dtype, device, false);
                let tl = if dtype == DType::F64 {
                    (1e-10, 1e-11)
                } else {
                    (2e-4, 5e-5)
                };
                let what = |x: &str| format!("{} {x} {kernel:?} {dtype}", tc.name);
                assert_attn_close(&what("out"), &got.out, &tc.out, tl);
                assert_attn_close(&what("dq"), &got.dq, &tc.dq, tl);
                assert_attn_close(&what("dk"), &got.dk, &tc.dk, tl);
                assert_attn_close(&what("dv"), &got.dv, &tc.dv, tl);
            }
        }
    }
}
test_device!(matches_pytorch, matches_pytorch);

/// With the device's generator seeded alike, both paths keep the same weights: the fused
/// kernels reserve the counters `Tensor::dropout` over the weights takes. Against the
/// reference with the mask `Tensor::dropout_mask_with` draws from the same seed.
fn dropout_paths_agree(device: &Device) {
    let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = case([2, 2, 1, 7, 9, 8, 8], true, MaskKind::None, [false; 4]);
    c.dropout = 0.3;
    c.seed = 11;
    let data = c.data();
    let a = c.attention(&data);
    let want = attention(&a, &data.q, &data.k, &data.v);
    let grads = attention_grad(&a, &data.q, &data.k, &data.v, &data.dout);
    let gen_ = default_generator(*device);
    if !device.is_cuda() {
        // f64 (the CUDA kernels have none: the f32 runs below cover CUDA).
        let mut states = Vec::new();
        for kernel in [SdpaKernel::Flash, SdpaKernel::Math] {
            gen_.manual_seed(c.seed);
            let got = run(&c, &data, kernel, DType::F64, device, false);
            states.push(gen_.get_state().to_bytes());
            let what = |x: &str| format!("dropout {x} {kernel:?}");
            let tl = (1e-10, 1e-11);
            assert_attn_close(&what("out"), &got.out, &want.out, tl);
            assert_attn_close(&what("dq"), &got.dq, &grads.dq, tl);
            assert_attn_close(&what("dk"), &got.dk, &grads.dk, tl);
            assert_attn_close(&what("dv"), &got.dv, &grads.dv, tl);
        }
        assert_eq!(states[0], states[1], "the generator advances alike");
    }
    let data32 = data.rounded(rounder(DType::F32));
    let mut outs = Vec::new();
    for kernel in [SdpaKernel::Flash, SdpaKernel::Math] {
        gen_.manual_seed(c.seed);
        let got = run(&c, &data32, kernel, DType::F32, device, false);
        assert_attn_close(
            "dropout f32 out",
            &got.out,
            &want.out,
            tol(DType::F32, true),
        );
        assert_attn_close("dropout f32 dq", &got.dq, &grads.dq, tol(DType::F32, true));
        outs.push(got.out);
    }
    assert_attn_close("fused vs math", &outs[0], &outs[1], (2e-5, 2e-6));
}
test_device!(dropout_paths_agree, dropout_paths_agree);

/// A float mask that requires grad takes the math path under `auto` (the kernels do not
/// compute its gradient), gets the gradient of the scores, and is an error under `flash`.
fn float_mask_gradient(device: &Device) {
    let c = case(
        [1, 2, 2, 3, 4, 4, 4],
        false,
        MaskKind::Float,
        [true, false, false, false],
    );
    let data = c.data();
    let q = leaf(&data.q, &[1, 2, 3, 4], DType::F32, device);
    let k = leaf(&data.k, &[1, 2, 4, 4], DType::F32, device);
    let v = leaf(&data.v, &[1, 2, 4, 4], DType::F32, device);
    let m = leaf(&data.mask_float, &[1, 2, 3, 4], DType::F32, device);
    let opts = SdpaOptions {
        attn_mask: Some(m.clone()),
        ..Default::default()
    };
    {
        let _f = sdpa::scoped(SdpaKernel::Flash);
        let e = q.scaled_dot_product_attention(&k, &v, &opts).unwrap_err();
        assert!(e.to_string().contains("attn_mask's gradient"), "{e}");
    }
    let _a = sdpa::scoped(SdpaKernel::Auto);
    let out = q.scaled_dot_product_attention(&k, &v, &opts).unwrap();
    out.sum_all().unwrap().backward().unwrap();
    let gm = values(&m.grad().unwrap());
    // Each row of dS sums to 0 (softmax), and masked-out scores get none.
    for (r, row) in gm.chunks(4).enumerate() {
        let s: f64 = row.iter().sum();
        assert!(s.abs() < 1e-5, "row {r}: {row:?}");
        for (j, g) in row.iter().enumerate() {
            if data.mask_float[r * 4 + j] == f64::NEG_INFINITY {
                assert_eq!(*g, 0.0);
            }
        }
    }
}
test_device!(float_mask_gradient, float_mask_gradient);

/// Operands that are views: heads inner (`[B, L, H, E]` transposed), a transposed last dim,
/// and k and v broadcast over the batch.
fn strided_and_broadcast_operands(device: &Device) {
    let (b, h, l, s, e) = (2, 3, 5, 6, 4);
    let data = AttnCase::new([b, h, h, l, s, e, e]).data();
    let q = t(&data.q, &[b, l, h, e], DType::F64, device)
        .transpose(1, 2)
        .unwrap();
    let k = t(&data.k[..h * s * e], &[1, h, e, s], DType::F64, device)
        .transpose(-1, -2)
        .unwrap();
    let v = t(&data.v[..h * s * e], &[h, s, e], DType::F64, device);
    let mut outs = Vec::new();
    for kernel in [SdpaKernel::Auto, SdpaKernel::Math] {
        let _k = sdpa::scoped(kernel);
        let out = q
            .scaled_dot_product_attention(&k, &v, &SdpaOptions::default())
            .unwrap();
        assert_eq!(out.dims(), vec![b, h, l, e]);
        outs.push(values(&out));
    }
    assert_attn_close("strided", &outs[0], &outs[1], (1e-12, 1e-12));
}
test_device!(
    strided_and_broadcast_operands,
    strided_and_broadcast_operands
);

/// `S = 0`: zeros (PyTorch's math path), on both paths; a fully masked row gives 0.
fn empty_keys_and_dead_rows(device: &Device) {
    let q = Tensor::ones([1, 2, 3, 4], (*device, DType::F32)).unwrap();
    let kv = Tensor::ones([1, 2, 0, 4], (*device, DType::F32)).unwrap();
    let dead = Tensor::zeros([3, 5], (*device, DType::Bool)).unwrap();
    let kv5 = Tensor::ones([1, 2, 5, 4], (*device, DType::F32)).unwrap();
    for kernel in [SdpaKernel::Auto, SdpaKernel::Math] {
        let _k = sdpa::scoped(kernel);
        let out = q
            .scaled_dot_product_attention(&kv, &kv, &SdpaOptions::default())
            .unwrap();
        assert_eq!(out.dims(), vec![1, 2, 3, 4]);
        assert!(values(&out).iter().all(|&x| x == 0.0));
        let opts = SdpaOptions {
            attn_mask: Some(dead.clone()),
            ..Default::default()
        };
        let out = q.scaled_dot_product_attention(&kv5, &kv5, &opts).unwrap();
        assert!(values(&out).iter().all(|&x| x == 0.0), "{kernel:?}");
    }
}
test_device!(empty_keys_and_dead_rows, empty_keys_and_dead_rows);

fn err(q: &Tensor, k: &Tensor, v: &Tensor, o: &SdpaOptions) -> String {
    q.scaled_dot_product_attention(k, v, o)
        .unwrap_err()
        .to_string()
}

fn bad_inputs_are_errors(device: &Device) {
    let f = |d: &[usize]| Tensor::ones(d, (*device, DType::F32)).unwrap();
    let (q, k, v) = (f(&[2, 4, 3, 8]), f(&[2, 4, 5, 8]), f(&[2, 4, 5, 6]));
    let none = SdpaOptions::default();
    let e = err(&q, &k.to_dtype(DType::F64).unwrap(), &v, &none);
    assert!(
        e.contains("same dtype") && e.contains("key.dtype: torch.float64"),
        "{e}"
    );
    let e = err(&f(&[8]), &k, &v, &none);
    assert!(e.contains("at least 2 dimensional"), "{e}");
    let e = err(&q, &f(&[2, 4, 5, 7]), &v, &none);
    assert!(e.contains("last dim") && e.contains("[2, 4, 5, 7]"), "{e}");
    let e = err(&q, &k, &f(&[2, 4, 6, 6]), &none);
    assert!(e.contains("sequence length 5"), "{e}");
    let e = err(&q, &f(&[3, 4, 5, 8]), &v, &none);
    assert!(e.contains("do not broadcast"), "{e}");
    let mask = Tensor::ones([3, 5], (*device, DType::Bool)).unwrap();
    let both = SdpaOptions {
        attn_mask: Some(mask),
        is_causal: true,
        ..Default::default()
    };
    let e = err(&q, &k, &v, &both);
    assert!(e.contains("should not be set when is_causal=True"), "{e}");
    let o = SdpaOptions {
        attn_mask: Some(Tensor::ones([4, 5], (*device, DType::Bool)).unwrap()),
        ..Default::default()
    };
    let e = err(&q, &k, &v, &o);
    assert!(
        e.contains("broadcastable") && e.contains("[2, 4, 3, 5]"),
        "{e}"
    );
    let o = SdpaOptions {
        attn_mask: Some(Tensor::ones([3, 5], (*device, DType::I64)).unwrap()),
        ..Default::default()
    };
    let e = err(&q, &k, &v, &o);
    assert!(e.contains("attn_mask dtype to be bool or float"), "{e}");
    let o = SdpaOptions {
        dropout_p: 1.5,
        ..Default::default()
    };
    assert!(err(&q, &k, &v, &o).contains("between 0 and 1"));
    let gqa = SdpaOptions {
        enable_gqa: true,
        ..Default::default()
    };
    let e = err(&q, &f(&[2, 3, 5, 8]), &f(&[2, 3, 5, 6]), &gqa);
    assert!(e.contains("multiple of"), "{e}");
    let e = err(&q, &f(&[2, 2, 5, 8]), &f(&[2, 1, 5, 6]), &gqa);
    assert!(e.contains("same number of heads"), "{e}");
    // Without enable_gqa, heads that differ do not broadcast.
    let e = err(&q, &f(&[2, 2, 5, 8]), &f(&[2, 2, 5, 6]), &none);
    assert!(e.contains("do not broadcast"), "{e}");
    if device.is_cuda() {
        let d = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let _f = sdpa::scoped(SdpaKernel::Flash);
        let e = err(&d(&q), &d(&k), &d(&v), &none);
        assert!(
            e.contains("cannot run this case") && e.contains("not f64"),
            "{e}"
        );
    }
}
test_device!(bad_inputs_are_errors, bad_inputs_are_errors);

/// The fused paths keep O(L) memory: at L = S = 4096 a causal forward and backward peaks, in
/// the allocator, below what one L×S f32 score matrix would take (64 MiB); the math path,
/// which materialises the scores, peaks above it (so the measure can fail). The other tests
/// of this file allocate kilobytes, far below the margin.
fn fused_paths_keep_linear_memory(device: &Device) {
    let (l, e) = (4096, 16);
    let scores = (l * l * 4) as u64;
    let input = || {
        Tensor::randn([1, 1, l, e], (*device, DType::F32))
            .unwrap()
            .requires_grad_(true)
            .unwrap()
    };
    let (q, k, v) = (input(), input(), input());
    let causal = SdpaOptions {
        is_causal: true,
        ..Default::default()
    };
    let peak_of = |f: &dyn Fn()| {
        if let Device::Cuda(i) = device {
            ember_device::cuda::synchronize(Some(*i)).unwrap();
        }
        let before = ember_memory::memory_allocated(*device).unwrap();
        ember_memory::reset_peak_memory_stats(*device).unwrap();
        f();
        if let Device::Cuda(i) = device {
            ember_device::cuda::synchronize(Some(*i)).unwrap();
        }
        ember_memory::max_memory_allocated(*device).unwrap() - before
    };
    let fused = peak_of(&|| {
        let _flash = sdpa::scoped(SdpaKernel::Flash);
        let out = q.scaled_dot_product_attention(&k, &v, &causal).unwrap();
        out.sum_all().unwrap().backward().unwrap();
    });
    assert!(
        fused < scores,
        "fused forward + backward at L = {l} peaked at {fused} bytes, not below one L×S f32 \
         matrix ({scores} bytes)"
    );
    let math = peak_of(&|| {
        let _math = sdpa::scoped(SdpaKernel::Math);
        let _out = q.scaled_dot_product_attention(&k, &v, &causal).unwrap();
    });
    assert!(
        math >= scores,
        "the math path materialises the scores: expected a peak of at least {scores} bytes, \
         found {math}"
    );
}
test_device!(
    fused_paths_keep_linear_memory,
    fused_paths_keep_linear_memory
);
