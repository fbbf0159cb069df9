//! Every backend against a naive f64 reference: random sizes (zeros included), transposed,
//! padded and non-contiguous operands, broadcast batches, alpha/beta, 16-bit types.
#![allow(clippy::unwrap_used)]

use ember_gemm::{
    Backend, Element, GemmError, MatMut, MatRef, Parallelism, backend_info, bf16, f16, gemm_with,
};
use proptest::prelude::*;

/// Backends to test here: Rust always; MKL when it loads (say so when it does not).
fn backends() -> Vec<Backend> {
    let info = backend_info();
    match info.mkl {
        Ok(_) => vec![Backend::Rust, Backend::Mkl],
        Err(e) => {
            eprintln!("SKIPPED: MKL backend tests (MKL absent: {e})");
            vec![Backend::Rust]
        }
    }
}

/// A storage layout: (slice length, row stride, col stride, batch stride).
fn layout(rows: usize, cols: usize, batch: usize, kind: u8, broadcast: bool) -> [usize; 4] {
    let (rs, cs, elems) = match kind % 4 {
        0 => (cols, 1, rows * cols),
        1 => (1, rows, rows * cols),
        2 => (cols + 3, 1, rows * (cols + 3)),
        _ => (2 * cols + 1, 2, rows * (2 * cols + 1)),
    };
    if broadcast {
        [elems, rs, cs, 0]
    } else {
        let bs = elems + 5;
        [batch * bs, rs, cs, bs]
    }
}

struct Rng(u64);
impl Rng {
    /// Values in [-1, 1) with 6 significant bits, exact in every element type.
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % 128) as f32 / 64.0 - 1.0
    }
}

#[derive(Clone, Debug)]
struct Case {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    kinds: [u8; 3],
    bcast: [bool; 2],
    alpha: f32,
    beta: f32,
    seed: u64,
    threads: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1usize..4, 0usize..70, 0usize..70, 0usize..70),
        (any::<[u8; 3]>(), any::<[bool; 2]>()),
        (
            prop::sample::select(vec![1.0f32, -0.5, 2.0]),
            prop::sample::select(vec![0.0f32, 1.0, -1.5]),
        ),
        (any::<u64>(), 1usize..3),
    )
        .prop_map(
            |((batch, m, n, k), (kinds, bcast), (alpha, beta), (seed, threads))| Case {
                batch,
                m,
                n,
                k,
                kinds,
                bcast,
                alpha,
                beta,
                seed,
                threads,
            },
        )
}

/// Runs one case on `backend` with element types `T` in and `O` out, and compares with f64.
fn check<T: Element, O: Element>(c: &Case, backend: Backend) -> Result<(), TestCaseError> {
    let mut rng = Rng(c.seed);
    let la = layout(c.m, c.k, c.batch, c.kinds[0], c.bcast[0]);
    let lb = layout(c.k, c.n, c.batch, c.kinds[1], c.bcast[1]);
    // C: row-major, column-major or padded, never broadcast.
    let lc = layout(c.m, c.n, c.batch, c.kinds[2] % 3, false);
    let a: Vec<T> = (0..la[0]).map(|_| T::from_f32(rng.next())).collect();
    let b: Vec<T> = (0..lb[0]).map(|_| T::from_f32(rng.next())).collect();
    let fill = if c.beta == 0.0 { f32::NAN } else { 0.0 };
    let mut cdata: Vec<O> = (0..lc[0])
        .map(|_| O::from_f32(if c.beta == 0.0 { fill } else { rng.next() }))
        .collect();
    let c0: Vec<f64> = cdata.iter().map(|x| x.to_f32() as f64).collect();
    let ab = if c.bcast[0] { 1 } else { c.batch };
    let bb = if c.bcast[1] { 1 } else { c.batch };
    let av = MatRef::new(&a, c.m, c.k, la[1], la[2]).batched(ab, la[3]);
    let bv = MatRef::new(&b, c.k, c.n, lb[1], lb[2]).batched(bb, lb[3]);
    let cv = MatMut::new(&mut cdata, c.m, c.n, lc[1], lc[2]).batched(c.batch, lc[3]);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(c.threads)
        .build()
        .unwrap();
    let used = pool
        .install(|| gemm_with(backend, av, bv, cv, c.alpha, c.beta, Parallelism::All))
        .unwrap();
    if backend == Backend::Rust {
        prop_assert_eq!(used, Backend::Rust);
    }
    // 16-bit output: one rounding at the end, half an ulp of the result.
    let out_rel = match O::DTYPE {
        ember_gemm::DType::F32 => 0.0,
        ember_gemm::DType::Bf16 => 1.0 / 256.0,
        ember_gemm::DType::F16 => 1.0 / 2048.0,
    };
    for bi in 0..c.batch {
        for i in 0..c.m {
            for j in 0..c.n {
                let (mut acc, mut mag) = (0f64, 0f64);
                for p in 0..c.k {
                    let ai = if c.bcast[0] { 0 } else { bi * la[3] } + i * la[1] + p * la[2];
                    let bj = if c.bcast[1] { 0 } else { bi * lb[3] } + p * lb[1] + j * lb[2];
                    let x = a[ai].to_f32() as f64 * b[bj].to_f32() as f64;
                    acc += x;
                    mag += x.abs();
                }
                let ci = bi * lc[3] + i * lc[1] + j * lc[2];
                let old = if c.beta == 0.0 { 0.0 } else { c0[ci] };
                let want = c.alpha as f64 * acc + c.beta as f64 * old;
                let got = cdata[ci].to_f32() as f64;
                let tol = 1e-5 * (c.alpha.abs() as f64 * mag + (c.beta as f64 * old).abs())
                    + out_rel * want.abs()
                    + 1e-6;
                prop_assert!(
                    (got - want).abs() <= tol,
                    "{:?} on {:?}: C[{},{},{}] = {} but want {} (tol {})",
                    c,
                    backend,
                    bi,
                    i,
                    j,
                    got,
                    want,
                    tol
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn f32_matches_reference(c in case()) {
        for be in backends() {
            check::<f32, f32>(&c, be)?;
        }
    }

    #[test]
    fn bf16_in_f32_out(c in case()) {
        for be in backends() {
            check::<bf16, f32>(&c, be)?;
        }
    }

    #[test]
    fn bf16_in_bf16_out(c in case()) {
        for be in backends() {
            check::<bf16, bf16>(&c, be)?;
        }
    }

    #[test]
    fn f16_in_f32_and_f16_out(c in case()) {
        for be in backends() {
            check::<f16, f32>(&c, be)?;
            check::<f16, f16>(&c, be)?;
        }
    }

    /// Arbitrary sizes and strides never panic: the call returns Ok or an error.
    #[test]
    fn bad_views_are_errors(
        dims in prop::array::uniform6(0usize..9),
        strides in prop::array::uniform6(prop::sample::select(vec![0usize, 1, 2, 7, usize::MAX / 3])),
        lens in prop::array::uniform3(0usize..80),
    ) {
        let a = vec![1f32; lens[0]];
        let b = vec![1f32; lens[1]];
        for be in backends() {
            let mut c = vec![0f32; lens[2]];
            let av = MatRef::new(&a, dims[0], dims[1], strides[0], strides[1]);
            let bv = MatRef::new(&b, dims[2], dims[3], strides[2], strides[3]);
            let cv = MatMut::new(&mut c, dims[4], dims[5], strides[4], strides[5]);
            let _ = gemm_with(be, av, bv, cv, 1.0, 0.0, Parallelism::All);
        }
    }
}

#[test]
fn errors_name_the_problem() {
    let a = [0f32; 6];
    let b = [0f32; 6];
    let mut c = [0f32; 4];
    let e = gemm_with(
        Backend::Rust,
        MatRef::row_major(&a, 2, 3),
        MatRef::row_major(&b, 2, 3),
        MatMut::row_major(&mut c, 2, 3),
        1.0,
        0.0,
        Parallelism::None,
    )
    .unwrap_err();
    assert!(matches!(e, GemmError::ShapeMismatch { .. }), "{e}");
    let e = gemm_with(
        Backend::Rust,
        MatRef::row_major(&a, 2, 3),
        MatRef::row_major(&b, 3, 2),
        MatMut::row_major(&mut c, 2, 3),
        1.0,
        0.0,
        Parallelism::None,
    )
    .unwrap_err();
    assert!(matches!(e, GemmError::ShapeMismatch { .. }), "{e}");
    let e = gemm_with(
        Backend::Rust,
        MatRef::row_major(&a, 2, 3),
        MatRef::row_major(&b, 3, 2),
        MatMut::new(&mut c, 2, 2, 1, 1),
        1.0,
        0.0,
        Parallelism::None,
    )
    .unwrap_err();
    assert!(matches!(e, GemmError::OverlappingOutput { .. }), "{e}");
    let e = gemm_with(
        Backend::Rust,
        MatRef::row_major(&a, 2, 3).batched(2, 6),
        MatRef::row_major(&b, 3, 2),
        MatMut::row_major(&mut c, 2, 2).batched(3, 0),
        1.0,
        0.0,
        Parallelism::None,
    )
    .unwrap_err();
    assert!(matches!(e, GemmError::BatchMismatch { .. }), "{e}");
    let e = gemm_with(
        Backend::Rust,
        MatRef::row_major(&a, 2, 3).batched(2, 6),
        MatRef::row_major(&b, 3, 2),
        MatMut::row_major(&mut c, 2, 2).batched(2, 4),
        1.0,
        0.0,
        Parallelism::None,
    )
    .unwrap_err();
    assert!(matches!(e, GemmError::OutOfBounds { .. }), "{e}");
    assert!(e.to_string().contains("needs"), "{e}");
    // A view whose highest offset is exactly usize::MAX (3 · (usize::MAX / 3)): its needed
    // length overflows, which must be an error, not a panic (found by the proptest below).
    for (a_view, c_view) in [(true, false), (false, true)] {
        let big = usize::MAX / 3;
        let mut c = [0f32; 4];
        let av = if a_view {
            MatRef::new(&a, 4, 1, big, 1)
        } else {
            MatRef::new(&a, 4, 1, 1, 1)
        };
        let cv = if c_view {
            MatMut::new(&mut c, 4, 1, big, 1)
        } else {
            MatMut::new(&mut c, 4, 1, 1, 1)
        };
        let e = gemm_with(
            Backend::Rust,
            av,
            MatRef::row_major(&b, 1, 1),
            cv,
            1.0,
            0.0,
            Parallelism::None,
        )
        .unwrap_err();
        assert!(matches!(e, GemmError::Overflow { .. }), "{e}");
    }
}

#[test]
fn empty_batch_and_empty_matrices_are_fine() {
    let mut c: [f32; 0] = [];
    for be in backends() {
        gemm_with(
            be,
            MatRef::<f32>::row_major(&[], 0, 5),
            MatRef::row_major(&[], 5, 0),
            MatMut::row_major(&mut c, 0, 0).batched(0, 0),
            1.0,
            0.0,
            Parallelism::All,
        )
        .unwrap();
    }
}

/// Large enough to be cut into blocks on 2 threads, in the training shapes' layouts:
/// X·Wᵀ, dY·W, dYᵀ·X.
#[test]
fn training_shapes_on_two_threads() {
    let (b, i, o) = (64usize, 300usize, 200usize);
    let mut rng = Rng(7);
    let x: Vec<f32> = (0..b * i).map(|_| rng.next()).collect();
    let w: Vec<f32> = (0..o * i).map(|_| rng.next()).collect();
    let dy: Vec<f32> = (0..b * o).map(|_| rng.next()).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let view = |d: &'static [f32], r: usize, c: usize, t: bool| {
        let v = MatRef::row_major(d, r, c);
        if t { v.t() } else { v }
    };
    let (x, w, dy): (&'static [f32], &'static [f32], &'static [f32]) =
        (x.leak(), w.leak(), dy.leak());
    for be in backends() {
        let cases = [
            ((x, b, i, false), (w, o, i, true)),
            ((dy, b, o, false), (w, o, i, false)),
            ((dy, b, o, true), (x, b, i, false)),
        ];
        for ((ad, ar, ac, at), (bd, br, bc, bt)) in cases {
            let (av, bv) = (view(ad, ar, ac, at), view(bd, br, bc, bt));
            let (m, k, n) = (av.rows(), av.cols(), bv.cols());
            let mut c = vec![f32::NAN; m * n];
            pool.install(|| {
                gemm_with(
                    be,
                    av,
                    bv,
                    MatMut::row_major(&mut c, m, n),
                    1.0,
                    0.0,
                    Parallelism::All,
                )
            })
            .unwrap();
            let (sa, sb) = (av.strides(), bv.strides());
            for r in [0, m / 2, m - 1] {
                for col in [0, n / 3, n - 1] {
                    let want: f64 = (0..k)
                        .map(|p| ad[r * sa.0 + p * sa.1] as f64 * bd[p * sb.0 + col * sb.1] as f64)
                        .sum();
                    let got = c[r * n + col] as f64;
                    assert!(
                        (got - want).abs() < 1e-3,
                        "{be:?} {m}x{k}x{n} [{r},{col}] {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// The f32 staging of a 16-bit C is reused between calls and not cleared: a `beta == 0`
/// product after one whose C held NaN and infinities must not see them, on two threads
/// (the parallel conversions) and one, and with `beta != 0` it must read the new C.
#[test]
fn sixteen_bit_output_staging_is_not_stale() {
    let (m, k, n) = (96usize, 80usize, 130usize);
    let mut rng = Rng(11);
    let a: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.next()).collect();
    let mut poisoned = a.clone();
    poisoned[0] = f32::NAN;
    poisoned[k] = f32::INFINITY;
    let want = |i: usize, j: usize| -> f64 {
        (0..k)
            .map(|p| {
                let (x, y) = (bf16::from_f32(a[i * k + p]), bf16::from_f32(b[p * n + j]));
                x.to_f64() * y.to_f64()
            })
            .sum()
    };
    let to16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (a16, p16, b16) = (to16(&a), to16(&poisoned), to16(&b));
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for be in backends() {
            let run = |a: &[bf16], c: &mut [bf16], beta: f32| {
                pool.install(|| {
                    gemm_with(
                        be,
                        MatRef::row_major(a, m, k),
                        MatRef::row_major(&b16, k, n),
                        MatMut::row_major(c, m, n),
                        1.0,
                        beta,
                        Parallelism::All,
                    )
                })
                .unwrap()
            };
            let mut c = vec![bf16::ZERO; m * n];
            run(&p16, &mut c, 0.0);
            assert!(c[0].is_nan() && !c[m * n - 1].is_nan());
            run(&a16, &mut c, 0.0);
            let ones = vec![bf16::ONE; m * n];
            let mut c2 = ones.clone();
            run(&a16, &mut c2, 1.0);
            for i in 0..m {
                for j in 0..n {
                    let (w, tol) = (want(i, j), 0.02 * (1.0 + want(i, j).abs()));
                    let got = c[i * n + j].to_f64();
                    assert!(
                        (got - w).abs() <= tol,
                        "{be:?} t{threads} [{i},{j}] {got} vs {w}"
                    );
                    let got2 = c2[i * n + j].to_f64();
                    assert!((got2 - (w + 1.0)).abs() <= tol + 0.02, "beta=1 [{i},{j}]");
                }
            }
        }
    }
}

/// bf16 products larger than the packed bf16 kernel's blocks (`src/dpbf16.rs`: `MC` = 96
/// rows, `KC` = 2048 of k, `NC` = 1024 columns), with odd k, edges that fill no whole tile,
/// every layout, alpha and beta: that kernel where the CPU has AVX-512 BF16, the widened f32
/// path elsewhere, the same reference either way.
#[test]
fn bf16_products_cross_every_block_boundary() {
    let shapes = [(200, 40, 301), (9, 2100, 5), (33, 47, 2051), (1, 1, 1)];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for (j, &(alpha, beta)) in [(1.0, 0.0), (-0.5, -1.5)].iter().enumerate() {
            let c = Case {
                batch: 1 + j,
                m,
                n,
                k,
                kinds: [i as u8, (i + j) as u8, j as u8],
                bcast: [false, j == 1],
                alpha,
                beta,
                seed: (i * 10 + j) as u64,
                threads: 1 + j,
            };
            check::<bf16, f32>(&c, Backend::Rust).unwrap();
            check::<bf16, bf16>(&c, Backend::Rust).unwrap();
        }
    }
}
