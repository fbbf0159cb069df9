//! The CPU attention kernel against the f64 math reference
//! (`ember_testing::reference::attention`, PyTorch's math path): forward (out, lse) and
//! backward (dq, dk, dv) for causal and not, bool and float masks broadcast over batch, heads
//! or queries with fully masked rows, grouped-query attention, L != S, L = 1, lengths and
//! head dims at and around the blocks (64 queries, 64 keys, 16-column groups), strided
//! operands, f32/f64/f16/bf16, and dropout with the mask `Tensor::dropout_mask` draws from
//! the same seed (the CUDA kernels' tests in crates/ember-kernels/tests/attention.rs check
//! the same cases against the same reference).
#![allow(clippy::unwrap_used)]

use ember_testing::reference::{
    AttnCase, AttnData, MaskKind, assert_attn_close, attention, attention_grad, torch_cases,
};
use half::{bf16, f16};

use super::*;
use crate::random::{Generator, philox};

/// The test dtypes: conversions from the reference's f64 and the tolerances (relative, and
/// absolute as a fraction of max(1, the tensor's largest magnitude)).
trait Elem: AttnElem + std::fmt::Debug {
    const NAME: &'static str;
    const TOL: (f64, f64);
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn acc_to_f64(x: Self::Acc) -> f64;
}

macro_rules! elem {
    ($t:ty, $name:literal, $tol:expr, $from:expr, $to:expr, $acc:expr) => {
        impl Elem for $t {
            const NAME: &'static str = $name;
            const TOL: (f64, f64) = $tol;
            fn from_f64(x: f64) -> Self {
                $from(x)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn acc_to_f64(x: Self::Acc) -> f64 {
                $acc(x)
            }
        }
    };
}
elem!(
    f32,
    "f32",
    (1e-4, 2e-5),
    |x: f64| x as f32,
    f64::from,
    f64::from
);
elem!(
    f64,
    "f64",
    (1e-11, 1e-12),
    |x: f64| x,
    |x: f64| x,
    |x: f64| x
);
elem!(
    f16,
    "f16",
    (2e-3, 2e-3),
    f16::from_f64,
    f16::to_f64,
    f64::from
);
elem!(
    bf16,
    "bf16",
    (1.6e-2, 1.6e-2),
    bf16::from_f64,
    bf16::to_f64,
    f64::from
);

/// `[B, H, L, D]` data stored contiguous or as `[B, L, H, D]` (heads inner).
fn store<T: Elem>(x: &[f64], [b, h, l, d]: [usize; 4], heads_inner: bool) -> (Vec<T>, [usize; 3]) {
    let st = if heads_inner {
        [l * h * d, d, h * d]
    } else {
        [h * l * d, l * d, d]
    };
    let mut out = vec![T::from_f64(0.0); x.len()];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..l {
                for e in 0..d {
                    out[bi * st[0] + hi * st[1] + i * st[2] + e] =
                        T::from_f64(x[((bi * h + hi) * l + i) * d + e]);
                }
            }
        }
    }
    (out, st)
}

struct Got {
    out: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

fn run<T: Elem>(case: &AttnCase, data: &AttnData, heads_inner: bool) -> Got {
    let (b, h, g, l, s) = (
        case.batch,
        case.heads,
        case.kv_heads,
        case.len_q,
        case.len_kv,
    );
    let (e, ev) = (case.dim_qk, case.dim_v);
    let dims = AttnDims {
        batch: b,
        heads: h,
        kv_heads: g,
        len_q: l,
        len_kv: s,
        dim_qk: e,
        dim_v: ev,
    };
    let (q, qs) = store::<T>(&data.q, [b, h, l, e], heads_inner);
    let (k, ks) = store::<T>(&data.k, [b, g, s, e], heads_inner);
    let (v, vs) = store::<T>(&data.v, [b, g, s, ev], heads_inner);
    let (dout, ds) = store::<T>(&data.dout, [b, h, l, ev], heads_inner);
    let fmask: Vec<T> = data.mask_float.iter().map(|&x| T::from_f64(x)).collect();
    let mask = match case.mask {
        MaskKind::None => AttnMask::None,
        MaskKind::Bool => AttnMask::Bool(&data.mask_bool, data.mask_strides),
        MaskKind::Float => AttnMask::Float(&fmask, data.mask_strides),
    };
    let dropout = (case.dropout > 0.0).then(|| {
        let gen_ = Generator::with_seed(case.seed, crate::Device::Cpu);
        let (key, base) = gen_.reserve(ember_kernels::attention::dropout_counters(b, h, l, s));
        AttnDropout {
            p: case.dropout,
            key,
            base,
        }
    });
    let opts = AttnOptions {
        scale: case.scale,
        causal: case.causal,
        dropout,
    };
    let view = |data, strides| AttnView { data, strides };
    let mut out = vec![T::from_f64(0.0); b * h * l * ev];
    let mut lse = vec![T::Acc::ZERO; b * h * l];
    attention_forward(
        &dims,
        view(&q, qs),
        view(&k, ks),
        view(&v, vs),
        mask,
        &opts,
        &mut out,
        &mut lse,
    )
    .unwrap();
    let mut dq = vec![T::from_f64(0.0); b * h * l * e];
    let mut dk = vec![T::from_f64(0.0); b * g * s * e];
    let mut dv = vec![T::from_f64(0.0); b * g * s * ev];
    attention_backward(
        &dims,
        (view(&q, qs), view(&k, ks), view(&v, vs)),
        mask,
        &opts,
        (&out, view(&dout, ds), &lse),
        &mut dq,
        &mut dk,
        &mut dv,
    )
    .unwrap();
    let f = |x: &[T]| x.iter().map(|&v| v.to_f64()).collect::<Vec<_>>();
    Got {
        out: f(&out),
        lse: lse.iter().map(|&x| T::acc_to_f64(x)).collect(),
        dq: f(&dq),
        dk: f(&dk),
        dv: f(&dv),
    }
}

fn compare(what: &str, case: &AttnCase, got: &[f64], want: &[f64], tol: (f64, f64)) {
    assert_attn_close(&format!("{what} ({case:?})"), got, want, tol);
}

fn check<T: Elem>(case: &AttnCase, heads_inner: bool) {
    let data = case.data().rounded(|x| T::from_f64(x).to_f64());
    let got = run::<T>(case, &data, heads_inner);
    let a = case.attention(&data);
    let want = attention(&a, &data.q, &data.k, &data.v);
    let grads = attention_grad(&a, &data.q, &data.k, &data.v, &data.dout);
    let name = T::NAME;
    compare(&format!("{name} out"), case, &got.out, &want.out, T::TOL);
    let lse_tol = if name == "f64" {
        (1e-12, 1e-13)
    } else {
        (1e-5, 1e-6)
    };
    compare(&format!("{name} lse"), case, &got.lse, &want.lse, lse_tol);
    compare(&format!("{name} dq"), case, &got.dq, &grads.dq, T::TOL);
    compare(&format!("{name} dk"), case, &got.dk, &grads.dk, T::TOL);
    compare(&format!("{name} dv"), case, &got.dv, &grads.dv, T::TOL);
}

fn case(shape: [usize; 7]) -> AttnCase {
    AttnCase::new(shape)
}

#[test]
fn plain_attention_in_every_dtype() {
    let c = case([2, 3, 3, 37, 45, 16, 24]);
    check::<f32>(&c, false);
    check::<f64>(&c, false);
    check::<f16>(&c, false);
    check::<bf16>(&c, false);
}

#[test]
fn strided_operands() {
    let mut c = case([2, 4, 2, 19, 23, 8, 8]);
    c.seed = 3;
    check::<f64>(&c, true);
    c.causal = true;
    check::<bf16>(&c, true);
}

#[test]
fn causal_with_equal_and_unequal_lengths() {
    for (l, s) in [(70, 70), (20, 130), (130, 20), (1, 9), (33, 1)] {
        let mut c = case([1, 2, 2, l, s, 32, 32]);
        c.causal = true;
        c.seed = 7 + l as u64;
        check::<f64>(&c, false);
        check::<f32>(&c, false);
    }
}

#[test]
fn bool_and_float_masks_broadcast_with_fully_masked_rows() {
    for kind in [MaskKind::Bool, MaskKind::Float] {
        for broadcast in [
            [false; 4],
            [false, true, false, false],
            [true, false, false, false],
            [true, true, false, false],
        ] {
            let mut c = case([2, 2, 1, 21, 70, 16, 8]);
            c.mask = kind;
            c.mask_broadcast = broadcast;
            c.seed = 11;
            check::<f64>(&c, false);
        }
        let mut c = case([1, 3, 3, 17, 40, 24, 24]);
        c.mask = kind;
        c.mask_broadcast = [false, false, true, false];
        check::<f16>(&c, false);
    }
}

#[test]
fn fully_masked_rows_are_zero_not_nan() {
    let mut c = case([1, 1, 1, 5, 9, 8, 8]);
    c.mask = MaskKind::Float;
    let data = c.data();
    let got = run::<f32>(&c, &data, false);
    assert!(
        data.mask_float[9..18]
            .iter()
            .all(|&m| m == f64::NEG_INFINITY)
    );
    assert!(got.out[8..16].iter().all(|&x| x == 0.0));
    assert_eq!(got.lse[1], f64::INFINITY);
    assert!(got.dq[8..16].iter().all(|&x| x == 0.0));
    for x in [&got.out, &got.dq, &got.dk, &got.dv] {
        assert!(x.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn grouped_query_attention() {
    for g in [2, 1] {
        let mut c = case([2, 6, g, 18, 27, 16, 16]);
        c.causal = g == 1;
        c.seed = 20 + g as u64;
        check::<f64>(&c, false);
    }
    let mut c = case([1, 4, 2, 9, 33, 32, 16]);
    c.mask = MaskKind::Float;
    c.mask_broadcast = [false, true, false, false];
    check::<bf16>(&c, true);
}

#[test]
fn decoding_one_query() {
    for s in [1, 63, 64, 65, 200] {
        let mut c = case([2, 4, 2, 1, s, 64, 64]);
        c.seed = 30 + s as u64;
        check::<f32>(&c, false);
    }
}

#[test]
fn lengths_and_head_dims_at_and_around_the_blocks() {
    for n in [15, 16, 17, 63, 64, 65, 129] {
        let mut c = case([1, 1, 1, n, n + 2, 8, 8]);
        c.seed = 40 + n as u64;
        c.causal = n % 2 == 1;
        check::<f64>(&c, false);
    }
    for (e, ev) in [
        (1, 1),
        (15, 17),
        (16, 16),
        (33, 31),
        (64, 96),
        (129, 64),
        (256, 256),
        (300, 20),
    ] {
        let mut c = case([1, 2, 1, 19, 70, e, ev]);
        c.seed = 50 + e as u64;
        c.causal = e % 2 == 0;
        check::<f32>(&c, false);
    }
}

#[test]
fn empty_keys_and_queries() {
    let c = case([1, 2, 1, 5, 0, 8, 8]);
    let got = run::<f32>(&c, &c.data(), false);
    assert!(got.out.iter().all(|&x| x == 0.0) && got.dq.iter().all(|&x| x == 0.0));
    assert!(got.lse.iter().all(|&x| x == f64::INFINITY));
    check::<f32>(&case([1, 2, 1, 0, 7, 8, 8]), false);
    check::<f32>(&case([1, 2, 1, 6, 7, 8, 0]), false);
}

#[test]
fn dropout_uses_the_cpu_mask_of_the_same_seed() {
    for (p, causal, g) in [(0.3, false, 2), (0.5, true, 1), (0.1, true, 3)] {
        let mut c = case([2, 6, g, 23, 70, 16, 16]);
        c.dropout = p;
        c.causal = causal;
        c.seed = 1000 + (p * 10.0) as u64;
        check::<f64>(&c, false);
        check::<f32>(&c, false);
    }
}

#[test]
fn dropout_factors_are_the_bernoulli_samplers() {
    // dropout_factors reproduces Tensor::dropout_mask element by element, from any start.
    let d = AttnDropout {
        p: 0.4,
        key: philox::key_of(99),
        base: 12,
    };
    let gen_ = Generator::with_seed(99, crate::Device::Cpu);
    gen_.reserve(12);
    let mask = crate::Tensor::dropout_mask_with([1000], 0.4, (), &gen_)
        .unwrap()
        .to_vec::<bool>()
        .unwrap();
    for start in [0usize, 1, 3, 4, 517] {
        let mut z = vec![0f64; 1000 - start];
        dropout_factors(&d, start as u64, &mut z, 2.0);
        for (x, &keep) in z.iter().zip(&mask[start..]) {
            assert_eq!(*x, if keep { 2.0 } else { 0.0 });
        }
    }
}

#[test]
fn long_sequences_in_blocks() {
    // 2048 queries and keys: every output row checked against the reference of that row only
    // (the reference's L×S matrices would be the point of the test).
    let mut c = case([1, 1, 1, 2048, 2048, 16, 16]);
    c.causal = true;
    let data = c.data();
    let got = run::<f32>(&c, &data, false);
    for i in [0, 1, 63, 64, 1000, 2047] {
        // Row i of a causal attention is the plain attention of query i over keys 0..=i.
        let mut one = case([1, 1, 1, 1, i + 1, 16, 16]);
        one.seed = c.seed;
        let d1 = AttnData {
            q: data.q[i * 16..(i + 1) * 16].to_vec(),
            k: data.k[..(i + 1) * 16].to_vec(),
            v: data.v[..(i + 1) * 16].to_vec(),
            dout: data.dout[i * 16..(i + 1) * 16].to_vec(),
            ..data.clone()
        };
        let want = attention(&one.attention(&d1), &d1.q, &d1.k, &d1.v);
        compare(
            "long out",
            &c,
            &got.out[i * 16..(i + 1) * 16],
            &want.out,
            f32::TOL,
        );
        compare("long lse", &c, &got.lse[i..=i], &want.lse, (1e-5, 1e-6));
    }
}

#[test]
fn bad_layouts_are_errors_not_panics() {
    let dims = AttnDims {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        len_q: 4,
        len_kv: 4,
        dim_qk: 8,
        dim_v: 8,
    };
    let x = vec![0f32; 64];
    let small = vec![0f32; 10];
    let view = |data, strides| AttnView { data, strides };
    let opts = AttnOptions {
        scale: 1.0,
        causal: false,
        dropout: None,
    };
    let (mut out, mut lse) = (vec![0f32; 64], vec![0f32; 8]);
    let r = attention_forward(
        &dims,
        view(&small, [64, 32, 8]),
        view(&x, [32, 32, 8]),
        view(&x, [32, 32, 8]),
        AttnMask::None,
        &opts,
        &mut out,
        &mut lse,
    );
    assert!(r.is_err());
    let bad = AttnDims {
        kv_heads: 3,
        ..dims
    };
    let r = attention_forward(
        &bad,
        view(&x, [64, 32, 8]),
        view(&x, [32, 32, 8]),
        view(&x, [32, 32, 8]),
        AttnMask::None,
        &opts,
        &mut out,
        &mut lse,
    );
    assert!(r.is_err());
    let mut short = vec![0f32; 3];
    let r = attention_forward(
        &dims,
        view(&x, [64, 32, 8]),
        view(&x, [32, 32, 8]),
        view(&x, [32, 32, 8]),
        AttnMask::None,
        &opts,
        &mut out,
        &mut short,
    );
    assert!(r.is_err());
}

#[test]
fn pytorch_reference_values() {
    // PyTorch's math backend in f64 (crates/ember-kernels/tests/reference/
    // make_attention_reference.py): the f64 kernel agrees to rounding, f32 to its accuracy.
    let json = include_str!("../../../../ember-kernels/tests/reference/attention_reference.json");
    let cases = torch_cases(json).unwrap();
    assert_eq!(cases.len(), 5);
    for t in &cases {
        let got = run::<f64>(&t.case, &t.data, false);
        let exact = (1e-11, 1e-12);
        compare(&format!("{} out", t.name), &t.case, &got.out, &t.out, exact);
        compare(&format!("{} dq", t.name), &t.case, &got.dq, &t.dq, exact);
        compare(&format!("{} dk", t.name), &t.case, &got.dk, &t.dk, exact);
        compare(&format!("{} dv", t.name), &t.case, &got.dv, &t.dv, exact);
        let got = run::<f32>(&t.case, &t.data.rounded(|x| x as f32 as f64), true);
        let f32_tol = (2e-4, 5e-5);
        compare(
            &format!("{} f32 out", t.name),
            &t.case,
            &got.out,
            &t.out,
            f32_tol,
        );
        compare(
            &format!("{} f32 dq", t.name),
            &t.case,
            &got.dq,
            &t.dq,
            f32_tol,
        );
    }
}

#[test]
#[ignore = "a timing run, not a check (seconds in a debug build): cargo test --release -p ember-tensor --lib timing_b8 -- --ignored --nocapture"]
fn timing_b8_h8_l1024_d64_causal() {
    let (b, h, l, e) = (8, 8, 1024, 64);
    let dims = AttnDims {
        batch: b,
        heads: h,
        kv_heads: h,
        len_q: l,
        len_kv: l,
        dim_qk: e,
        dim_v: e,
    };
    let mut rng = ember_testing::Lcg(3);
    let mut vals = |n: usize| (0..n).map(|_| rng.f32(1.0)).collect::<Vec<f32>>();
    let (q, k, v, dout) = (
        vals(b * h * l * e),
        vals(b * h * l * e),
        vals(b * h * l * e),
        vals(b * h * l * e),
    );
    let st = [h * l * e, l * e, e];
    let view = |data| AttnView { data, strides: st };
    let opts = AttnOptions {
        scale: 0.125,
        causal: true,
        dropout: None,
    };
    let (mut out, mut lse) = (vec![0f32; q.len()], vec![0f32; b * h * l]);
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; q.len()],
        vec![0f32; q.len()],
        vec![0f32; q.len()],
    );
    let mut fwd = Vec::new();
    let mut both = Vec::new();
    for _ in 0..6 {
        let t = std::time::Instant::now();
        attention_forward(
            &dims,
            view(&q),
            view(&k),
            view(&v),
            AttnMask::None,
            &opts,
            &mut out,
            &mut lse,
        )
        .unwrap();
        fwd.push(t.elapsed().as_secs_f64());
        attention_backward(
            &dims,
            (view(&q), view(&k), view(&v)),
            AttnMask::None,
            &opts,
            (&out, view(&dout), &lse),
            &mut dq,
            &mut dk,
            &mut dv,
        )
        .unwrap();
        both.push(t.elapsed().as_secs_f64());
    }
    fwd.sort_by(f64::total_cmp);
    both.sort_by(f64::total_cmp);
    println!(
        "ember cpu attention b8 h8 l1024 d64 causal f32: fwd {:.1} ms, fwd+bwd {:.1} ms (medians of 6, threads {})",
        fwd[3] * 1e3,
        both[3] * 1e3,
        rayon::current_num_threads()
    );
}
