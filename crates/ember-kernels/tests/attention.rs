//! The fused attention kernels (`kernels/attention.cu`) on the emulator against the f64 math
//! reference (`ember_testing::reference::attention`, PyTorch's math path): the forward's
//! output and log-sum-exp, then the backward's dq, dk and dv, for causal and not, bool and
//! float masks broadcast over batch or heads (with fully masked rows), grouped-query
//! attention, L != S, L = 1, lengths and head dims at and around the tiles (16 rows, 32 keys,
//! 32-dim chunks, 128-dim passes), strided operands, f32/f16/bf16, and dropout with the mask
//! `Tensor::dropout_mask` draws on the CPU from the same seed.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{Buf, Dt, S0, setup};
use ember_device::driver::{DevicePtr, Driver, ModuleHandle};
use ember_kernels::KernelArgs;
use ember_kernels::attention::{
    AttnKernel, AttnParams, attn_launch_config, dropout_counters, keep_threshold,
};
use ember_tensor::Device;
use ember_tensor::random::Generator;
use ember_testing::reference::{
    AttnCase, AttnData, MaskKind, assert_attn_close, attention, attention_grad, torch_cases,
};
use half::{bf16, f16};

/// How q, k, v and dout lie in memory: `[B, H, L, E]` or `[B, L, H, E]` (heads inner, as a
/// batch-first projection leaves them before the transpose).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mem {
    Contiguous,
    HeadsInner,
}

/// Element `(b, h, i, e)` of a `[B, H, L, D]` operand stored as `mem` says: the buffer and
/// the strides over (b, h, i).
fn store<T: Dt>(x: &[f64], [b, h, l, d]: [usize; 4], mem: Mem) -> (Vec<T>, [i64; 3]) {
    let strides = match mem {
        Mem::Contiguous => [h * l * d, l * d, d],
        Mem::HeadsInner => [l * h * d, d, h * d],
    };
    let mut out = vec![T::from_f64(0.0); x.len()];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..l {
                for e in 0..d {
                    let at = bi * strides[0] + hi * strides[1] + i * strides[2] + e;
                    out[at] = T::from_f64(x[((bi * h + hi) * l + i) * d + e]);
                }
            }
        }
    }
    (out, strides.map(|s| s as i64))
}

/// Tolerances (relative, and absolute as a fraction of max(1, the tensor's largest magnitude)): f32
/// for the kernels' f32 arithmetic (exp2f, sums in another order), 16-bit for the output's
/// one rounding.
fn tol<T: Dt>() -> (f64, f64) {
    match T::SUFFIX {
        "f32" => (1e-4, 2e-5),
        "f16" => (2e-3, 2e-3),
        _ => (1.6e-2, 1.6e-2),
    }
}

fn compare(what: &str, case: &AttnCase, got: &[f64], want: &[f64], tol: (f64, f64)) {
    assert_attn_close(&format!("{what} ({case:?})"), got, want, tol);
}

/// Launches `kernel` for dtype `T` with `params`, unless it has nothing to do.
fn launch<T: Dt>(
    d: &Arc<dyn Driver>,
    m: ModuleHandle,
    kernel: AttnKernel,
    p: &AttnParams,
    ptrs: &[DevicePtr],
) {
    let Some(config) = attn_launch_config(kernel, p).unwrap() else {
        return;
    };
    let mut args = KernelArgs::new();
    args.push(*p);
    for &ptr in ptrs {
        args.ptr(ptr);
    }
    let f = d.module_function(m, &kernel.name(T::SUFFIX)).unwrap();
    let mut params = args.params();
    // SAFETY: the parameter lists of kernels/attention.cu's header; every buffer is sized
    // for the shapes in `p` (see `run`).
    unsafe { d.launch_kernel(f, config, S0, &mut params).unwrap() };
}

/// The kernels' outputs, read back as f64.
struct Outputs {
    out: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// Forward and backward of `case` in dtype `T` on the emulator, operands laid out as `mem`.
fn run<T: Dt>(case: &AttnCase, data: &AttnData, mem: Mem) -> Outputs {
    let (d, m) = setup(0);
    let (b, h, g, l, s) = (
        case.batch,
        case.heads,
        case.kv_heads,
        case.len_q,
        case.len_kv,
    );
    let (e, ev) = (case.dim_qk, case.dim_v);
    let (q, qs) = store::<T>(&data.q, [b, h, l, e], mem);
    let (k, ks) = store::<T>(&data.k, [b, g, s, e], mem);
    let (v, vs) = store::<T>(&data.v, [b, g, s, ev], mem);
    let (dout, ds) = store::<T>(&data.dout, [b, h, l, ev], mem);
    let ms = data.mask_strides.map(|x| x as i64);
    let mut p = AttnParams {
        batch: b as i64,
        heads: h as i64,
        kv_heads: g as i64,
        len_q: l as i64,
        len_kv: s as i64,
        dim_qk: e as i64,
        dim_v: ev as i64,
        q_sb: qs[0],
        q_sh: qs[1],
        q_sl: qs[2],
        k_sb: ks[0],
        k_sh: ks[1],
        k_sl: ks[2],
        v_sb: vs[0],
        v_sh: vs[1],
        v_sl: vs[2],
        do_sb: ds[0],
        do_sh: ds[1],
        do_sl: ds[2],
        m_sb: ms[0],
        m_sh: ms[1],
        m_sl: ms[2],
        m_ss: ms[3],
        causal: i32::from(case.causal),
        scale: case.scale as f32,
        ..AttnParams::default()
    };
    if case.dropout > 0.0 {
        // The generator the op would draw from, at the state the reference's mask started at.
        let gen_ = Generator::with_seed(case.seed, Device::Cpu);
        let ([key0, key1], base) = gen_.reserve(dropout_counters(b, h, l, s));
        p.philox_key0 = key0;
        p.philox_key1 = key1;
        p.philox_base = base;
        p.dropout = 1;
        p.keep_threshold = keep_threshold(case.dropout);
        p.dropout_scale = (1.0 / (1.0 - case.dropout)) as f32;
    }
    let bq = Buf::from_slice(&d, 0, &q);
    let bk = Buf::from_slice(&d, 0, &k);
    let bv = Buf::from_slice(&d, 0, &v);
    let bdo = Buf::from_slice(&d, 0, &dout);
    let fmask: Vec<T> = data.mask_float.iter().map(|&x| T::from_f64(x)).collect();
    let bmask: Vec<u8> = data.mask_bool.iter().map(|&x| u8::from(x)).collect();
    let bfm = Buf::from_slice(&d, 0, &fmask);
    let bbm = Buf::from_slice(&d, 0, &bmask);
    let (fm_ptr, bm_ptr) = match case.mask {
        MaskKind::None => (DevicePtr(0), DevicePtr(0)),
        MaskKind::Float => (bfm.ptr, DevicePtr(0)),
        MaskKind::Bool => (DevicePtr(0), bbm.ptr),
    };
    let out = Buf::<T>::zeros(&d, 0, b * h * l * ev);
    let lse = Buf::<f32>::zeros(&d, 0, b * h * l);
    launch::<T>(
        &d,
        m,
        AttnKernel::Forward,
        &p,
        &[bq.ptr, bk.ptr, bv.ptr, fm_ptr, bm_ptr, out.ptr, lse.ptr],
    );
    let delta = Buf::<f32>::zeros(&d, 0, b * h * l);
    launch::<T>(
        &d,
        m,
        AttnKernel::BackwardPrep,
        &p,
        &[out.ptr, bdo.ptr, delta.ptr],
    );
    let dk = Buf::<T>::zeros(&d, 0, b * g * s * e);
    let dv = Buf::<T>::zeros(&d, 0, b * g * s * ev);
    let qkv = [
        bq.ptr, bk.ptr, bv.ptr, fm_ptr, bm_ptr, bdo.ptr, lse.ptr, delta.ptr,
    ];
    let mut ptrs = qkv.to_vec();
    ptrs.extend([dk.ptr, dv.ptr]);
    launch::<T>(&d, m, AttnKernel::BackwardDkDv, &p, &ptrs);
    let dq = Buf::<T>::zeros(&d, 0, b * h * l * e);
    let mut ptrs = qkv.to_vec();
    ptrs.push(dq.ptr);
    launch::<T>(&d, m, AttnKernel::BackwardDq, &p, &ptrs);
    let f = |x: &Buf<T>| x.to_vec().into_iter().map(Dt::to_f64).collect::<Vec<_>>();
    Outputs {
        out: f(&out),
        lse: lse.to_vec().into_iter().map(f64::from).collect(),
        dq: f(&dq),
        dk: f(&dk),
        dv: f(&dv),
    }
}

/// Runs `case` in `T` and checks every output against the reference on the same
/// (rounded) inputs.
fn check<T: Dt>(case: &AttnCase, mem: Mem) {
    let data = case.data().rounded(|x| T::from_f64(x).to_f64());
    let got = run::<T>(case, &data, mem);
    let a = case.attention(&data);
    let want = attention(&a, &data.q, &data.k, &data.v);
    let grads = attention_grad(&a, &data.q, &data.k, &data.v, &data.dout);
    let t = tol::<T>();
    compare(&format!("{} out", T::SUFFIX), case, &got.out, &want.out, t);
    compare(
        &format!("{} lse", T::SUFFIX),
        case,
        &got.lse,
        &want.lse,
        (1e-5, 1e-6),
    );
    compare(&format!("{} dq", T::SUFFIX), case, &got.dq, &grads.dq, t);
    compare(&format!("{} dk", T::SUFFIX), case, &got.dk, &grads.dk, t);
    compare(&format!("{} dv", T::SUFFIX), case, &got.dv, &grads.dv, t);
}

fn case(shape: [usize; 7]) -> AttnCase {
    AttnCase::new(shape)
}

#[test]
fn plain_attention_in_every_dtype() {
    // B 2, H 3, L 37, S 45, E 16, Ev 24: partial query and key tiles, Ev != E.
    let c = case([2, 3, 3, 37, 45, 16, 24]);
    check::<f32>(&c, Mem::Contiguous);
    check::<f16>(&c, Mem::Contiguous);
    check::<bf16>(&c, Mem::Contiguous);
}

#[test]
fn strided_operands() {
    let mut c = case([2, 4, 2, 19, 23, 8, 8]);
    c.seed = 3;
    check::<f32>(&c, Mem::HeadsInner);
    c.causal = true;
    check::<bf16>(&c, Mem::HeadsInner);
}

#[test]
fn causal_with_equal_and_unequal_lengths() {
    // Top-left aligned (tril(ones(L, S))): with L > S the rows past S see every key; with
    // L < S each row i sees keys 0..=i only.
    for (l, s) in [(50, 50), (20, 45), (45, 20), (1, 9), (33, 1)] {
        let mut c = case([1, 2, 2, l, s, 32, 32]);
        c.causal = true;
        c.seed = 7 + l as u64;
        check::<f32>(&c, Mem::Contiguous);
    }
}

#[test]
fn bool_and_float_masks_broadcast_with_fully_masked_rows() {
    // Row 1 of every stored mask row block is fully masked: output 0, lse +inf, no NaN, and
    // 0 gradients through it (PyTorch's _safe_softmax).
    for kind in [MaskKind::Bool, MaskKind::Float] {
        for broadcast in [
            [false; 4],
            [false, true, false, false],
            [true, false, false, false],
            [true, true, false, false],
        ] {
            let mut c = case([2, 2, 1, 21, 35, 16, 8]);
            c.mask = kind;
            c.mask_broadcast = broadcast;
            c.seed = 11;
            check::<f32>(&c, Mem::Contiguous);
        }
        let mut c = case([1, 3, 3, 17, 40, 24, 24]);
        c.mask = kind;
        // A mask broadcast over queries (key padding): [B, H, 1, S].
        c.mask_broadcast = [false, false, true, false];
        check::<f16>(&c, Mem::Contiguous);
    }
}

#[test]
fn fully_masked_rows_are_zero_not_nan() {
    let mut c = case([1, 1, 1, 5, 9, 8, 8]);
    c.mask = MaskKind::Bool;
    let data = c.data();
    let got = run::<f32>(&c, &data, Mem::Contiguous);
    let (l, ev) = (c.len_q, c.dim_v);
    assert!(
        data.mask_bool[9..18].iter().all(|&m| !m),
        "row 1 is fully masked"
    );
    assert!(
        got.out[ev..2 * ev].iter().all(|&x| x == 0.0),
        "{:?}",
        &got.out[ev..2 * ev]
    );
    assert_eq!(got.lse[1], f64::INFINITY);
    assert!(got.dq[8..16].iter().all(|&x| x == 0.0));
    for x in [&got.out, &got.dq, &got.dk, &got.dv] {
        assert!(x.iter().all(|v| v.is_finite()));
    }
    assert!(
        got.lse[..l]
            .iter()
            .enumerate()
            .all(|(i, v)| i == 1 || v.is_finite())
    );
}

#[test]
fn grouped_query_attention() {
    // H 6 over G 2 (3 query heads per kv head), and G 1 (multi-query).
    for g in [2, 1] {
        let mut c = case([2, 6, g, 18, 27, 16, 16]);
        c.causal = g == 1;
        c.seed = 20 + g as u64;
        check::<f32>(&c, Mem::Contiguous);
    }
    let mut c = case([1, 4, 2, 9, 33, 32, 16]);
    c.mask = MaskKind::Float;
    c.mask_broadcast = [false, true, false, false];
    check::<bf16>(&c, Mem::HeadsInner);
}

#[test]
fn decoding_one_query() {
    // L = 1 against a cache of S keys: one partial query tile.
    for s in [1, 31, 32, 33, 100] {
        let mut c = case([2, 4, 2, 1, s, 64, 64]);
        c.seed = 30 + s as u64;
        check::<f32>(&c, Mem::Contiguous);
    }
    let c = case([1, 2, 1, 1, 77, 64, 64]);
    check::<f16>(&c, Mem::Contiguous);
}

#[test]
fn lengths_at_and_around_the_tiles() {
    // 16 query rows per block, 32 keys per tile (and 16 keys per dkdv block).
    for n in [15, 16, 17, 31, 32, 33, 64, 65] {
        let mut c = case([1, 1, 1, n, n + 2, 8, 8]);
        c.seed = 40 + n as u64;
        c.causal = n % 2 == 1;
        check::<f32>(&c, Mem::Contiguous);
    }
}

#[test]
fn head_dims_at_and_around_the_chunks_and_passes() {
    // 32-dim chunks through shared memory; 128 output dims per pass (grid.y), 256 at most.
    for (e, ev) in [
        (1, 1),
        (31, 33),
        (32, 32),
        (33, 31),
        (64, 96),
        (127, 128),
        (129, 64),
        (64, 129),
        (200, 256),
        (256, 256),
    ] {
        let mut c = case([1, 2, 1, 19, 34, e, ev]);
        c.seed = 50 + e as u64;
        c.causal = e % 2 == 0;
        check::<f32>(&c, Mem::Contiguous);
    }
    let mut c = case([1, 1, 1, 17, 20, 256, 128]);
    c.mask = MaskKind::Bool;
    check::<bf16>(&c, Mem::Contiguous);
}

#[test]
fn empty_keys_and_queries() {
    // S = 0: no key to attend, every row fully masked (PyTorch: zeros); L = 0: nothing to do
    // but dk, dv = 0.
    let c = case([1, 2, 1, 5, 0, 8, 8]);
    let data = c.data();
    let got = run::<f32>(&c, &data, Mem::Contiguous);
    assert!(got.out.iter().all(|&x| x == 0.0) && got.dq.iter().all(|&x| x == 0.0));
    assert!(got.lse.iter().all(|&x| x == f64::INFINITY));
    let c = case([1, 2, 1, 0, 7, 8, 8]);
    check::<f32>(&c, Mem::Contiguous);
}

#[test]
fn dropout_uses_the_cpu_mask_of_the_same_seed() {
    // The reference drops exactly what Tensor::dropout_mask_with([B, H, L, S], p) drops
    // from a CPU generator with the same seed; the kernels draw from the counters the op
    // reserves, which start where that mask's did.
    for (p, causal, g) in [(0.3, false, 2), (0.5, true, 1), (0.1, true, 3)] {
        let mut c = case([2, 6, g, 23, 29, 16, 16]);
        c.dropout = p;
        c.causal = causal;
        c.seed = 1000 + (p * 10.0) as u64;
        check::<f32>(&c, Mem::Contiguous);
        let gen_ = Generator::with_seed(c.seed, Device::Cpu);
        let state_before = gen_.get_state();
        gen_.reserve(dropout_counters(2, 6, 23, 29));
        let cpu = Generator::with_seed(c.seed, Device::Cpu);
        ember_tensor::Tensor::dropout_mask_with([2, 6, 23, 29], p, (), &cpu).unwrap();
        // Both generators advanced by the same counters.
        assert_eq!(gen_.get_state().offset, cpu.get_state().offset);
        assert_eq!(state_before.offset, 0);
    }
    let mut c = case([1, 2, 2, 40, 40, 32, 32]);
    c.dropout = 0.25;
    c.mask = MaskKind::Float;
    check::<bf16>(&c, Mem::Contiguous);
}

#[test]
fn a_longer_sequence() {
    // Several 16-row blocks and 32-key tiles per (b, h), causal, in f16.
    let mut c = case([1, 2, 1, 150, 150, 64, 64]);
    c.causal = true;
    check::<f16>(&c, Mem::Contiguous);
}

#[test]
fn pytorch_reference_values() {
    // PyTorch's own numbers (reference/make_attention_reference.py: its math backend in f64):
    // GQA with a bool mask and a fully masked row, causal with L > S and L < S, a float mask
    // broadcast over heads, one query. The f64 reference must agree to rounding, the f32
    // kernels (on the f32-rounded inputs) to f32's accuracy.
    let cases = torch_cases(include_str!("reference/attention_reference.json")).unwrap();
    assert_eq!(cases.len(), 5);
    for t in &cases {
        let a = t.case.attention(&t.data);
        let want = attention(&a, &t.data.q, &t.data.k, &t.data.v);
        let grads = attention_grad(&a, &t.data.q, &t.data.k, &t.data.v, &t.data.dout);
        let exact = (1e-12, 1e-13);
        compare(
            &format!("{} reference out", t.name),
            &t.case,
            &want.out,
            &t.out,
            exact,
        );
        compare(
            &format!("{} reference dq", t.name),
            &t.case,
            &grads.dq,
            &t.dq,
            exact,
        );
        compare(
            &format!("{} reference dk", t.name),
            &t.case,
            &grads.dk,
            &t.dk,
            exact,
        );
        compare(
            &format!("{} reference dv", t.name),
            &t.case,
            &grads.dv,
            &t.dv,
            exact,
        );
        let data = t.data.rounded(|x| x as f32 as f64);
        let got = run::<f32>(&t.case, &data, Mem::Contiguous);
        let f32_tol = (2e-4, 5e-5);
        compare(
            &format!("{} kernel out", t.name),
            &t.case,
            &got.out,
            &t.out,
            f32_tol,
        );
        compare(
            &format!("{} kernel dq", t.name),
            &t.case,
            &got.dq,
            &t.dq,
            f32_tol,
        );
        compare(
            &format!("{} kernel dk", t.name),
            &t.case,
            &got.dk,
            &t.dk,
            f32_tol,
        );
        compare(
            &format!("{} kernel dv", t.name),
            &t.case,
            &got.dv,
            &t.dv,
            f32_tol,
        );
    }
}
