#![allow(clippy::unwrap_used)]
//! Random numbers: reproducibility, generator state, the element -> counter mapping, dtype
//! rules, and distribution checks (moments, Kolmogorov–Smirnov).

use ember_tensor::random::philox::{self, Normal32, Sampler, Uniform32};
use ember_tensor::random::{self, Generator, GeneratorState};
use ember_tensor::{DType, Device, Tensor, TensorError};

const CPU: Device = Device::Cpu;

fn f32s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

#[test]
fn default_generators_follow_manual_seed() {
    // The only test touching the default generators (tests run on parallel threads).
    random::manual_seed(1234);
    let a = Tensor::randn([3, 5], ()).unwrap();
    let m = Tensor::dropout_mask([64], 0.5, ()).unwrap();
    random::manual_seed(1234);
    assert_eq!(f32s(&a), f32s(&Tensor::randn([3, 5], ()).unwrap()));
    assert_eq!(
        m.to_vec::<bool>().unwrap(),
        Tensor::dropout_mask([64], 0.5, ())
            .unwrap()
            .to_vec::<bool>()
            .unwrap()
    );
    assert_eq!(random::initial_seed(), 1234);
    assert_eq!(
        random::default_generator(Device::Cuda(3)).initial_seed(),
        1234
    );
    let st = random::get_rng_state();
    let x = Tensor::rand([10], ()).unwrap();
    random::set_rng_state(&st);
    assert_eq!(f32s(&x), f32s(&Tensor::rand([10], ()).unwrap()));
    let s = random::seed();
    assert_eq!(random::initial_seed(), s);
    assert_ne!(random::seed(), s);

    // A thread's own CPU generator (what DataLoader workers use): its draws, seeding and
    // state calls stay on that thread, scopes nest, and the CUDA default is still shared.
    random::manual_seed(77);
    let global = random::get_rng_state();
    let on_thread = |seed: u64| {
        std::thread::spawn(move || {
            let own = random::ThreadGenerator::with_seed(seed);
            assert_eq!(random::initial_seed(), seed);
            let a = f32s(&Tensor::rand([6], ()).unwrap());
            assert_eq!(own.generator().get_state().offset, 2);
            random::manual_seed(seed + 1);
            let b = f32s(&Tensor::rand([6], ()).unwrap());
            let st = random::get_rng_state();
            assert_eq!(st.seed, seed + 1);
            {
                let _inner = random::ThreadGenerator::with_seed(5);
                assert_eq!(random::initial_seed(), 5);
            }
            assert_eq!(random::get_rng_state(), st);
            assert_eq!(
                random::default_generator(Device::Cuda(3)).initial_seed(),
                77
            );
            drop(own);
            (a, b)
        })
        .join()
        .unwrap()
    };
    let (a, b) = on_thread(9);
    assert_eq!(random::get_rng_state(), global);
    assert_eq!(
        random::default_generator(Device::Cuda(3)).initial_seed(),
        77
    );
    let g = Generator::with_seed(9, CPU);
    assert_eq!(a, f32s(&Tensor::rand_with([6], (), &g).unwrap()));
    g.manual_seed(10);
    assert_eq!(b, f32s(&Tensor::rand_with([6], (), &g).unwrap()));
    assert_eq!(on_thread(9), (a.clone(), b));
    assert_ne!(on_thread(11).0, a);
    // Outside any scope the thread uses the process-wide generator again.
    let (x, moved) = std::thread::spawn(|| {
        drop(random::ThreadGenerator::with_seed(3));
        (
            f32s(&Tensor::rand([6], ()).unwrap()),
            random::get_rng_state(),
        )
    })
    .join()
    .unwrap();
    random::set_rng_state(&global);
    assert_eq!(x, f32s(&Tensor::rand([6], ()).unwrap()));
    assert_eq!(moved, random::get_rng_state());
}

#[test]
fn same_seed_same_numbers_different_seeds_differ() {
    for dtype in [DType::F32, DType::F64, DType::F16, DType::Bf16] {
        let (g1, g2, g3) = (
            Generator::with_seed(5, CPU),
            Generator::with_seed(5, CPU),
            Generator::with_seed(6, CPU),
        );
        let a = Tensor::randn_with([100], dtype, &g1).unwrap();
        let b = Tensor::randn_with([100], dtype, &g2).unwrap();
        let c = Tensor::randn_with([100], dtype, &g3).unwrap();
        assert_eq!(a.dtype(), dtype);
        assert_eq!(f32s(&a), f32s(&b));
        assert_ne!(f32s(&a), f32s(&c));
    }
    let (g1, g2) = (Generator::with_seed(9, CPU), Generator::with_seed(9, CPU));
    let a = Tensor::randint_with(0, 1000, [50], (), &g1).unwrap();
    let b = Tensor::randint_with(0, 1000, [50], (), &g2).unwrap();
    assert_eq!(a.to_vec::<i64>().unwrap(), b.to_vec::<i64>().unwrap());
}

#[test]
fn offset_advances_and_state_replays() {
    let g = Generator::with_seed(11, CPU);
    let a = Tensor::rand_with([7], (), &g).unwrap();
    // 7 f32 samples take ceil(7 / 4) = 2 counters; f64 samples take one counter per two.
    assert_eq!(
        g.get_state(),
        GeneratorState {
            seed: 11,
            offset: 2
        }
    );
    let st = g.get_state();
    let b = Tensor::rand_with([7], (), &g).unwrap();
    assert_ne!(f32s(&a), f32s(&b));
    Tensor::randn_with([3], DType::F64, &g).unwrap();
    assert_eq!(g.get_state().offset, 6);
    let restored = Generator::new(CPU);
    restored.set_state(&GeneratorState::from_bytes(&st.to_bytes()).unwrap());
    assert_eq!(
        f32s(&b),
        f32s(&Tensor::rand_with([7], (), &restored).unwrap())
    );
    assert!(GeneratorState::from_bytes(&[0; 15]).is_err());
    assert!(GeneratorState::from_bytes(&[0; 17]).is_err());
    g.manual_seed(11);
    assert_eq!(f32s(&a), f32s(&Tensor::rand_with([7], (), &g).unwrap()));
    let c = g.clone();
    assert_eq!(c.get_state(), g.get_state());
}

#[test]
fn element_to_counter_mapping_is_the_documented_one() {
    // Large enough for the parallel path: values must equal the serial definition of Note
    // [Random streams], so any split over threads gives the same numbers.
    let g = Generator::with_seed(0xDEAD_BEEF_0123_4567, CPU);
    g.set_state(&GeneratorState {
        seed: 0xDEAD_BEEF_0123_4567,
        offset: u64::MAX - 3,
    });
    let n = 100_003;
    let t = Tensor::randn_with([n], (), &g)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let key = philox::key_of(0xDEAD_BEEF_0123_4567);
    let s = Normal32 {
        mean: 0.0,
        std: 1.0,
    };
    for i in (0..n).step_by(4099).chain([n - 1]) {
        // Element i is output i % 4 of counter base + i / 4 (wrapping past u64::MAX).
        let w = philox::block(key, u64::MAX - 3, (i / 4) as u64);
        assert_eq!(t[i], s.outputs(w)[i % 4] as f32, "element {i}");
    }
    // Splitting the work across threads by hand gives the same values.
    let parts: Vec<f32> = std::thread::scope(|sc| {
        let hs: Vec<_> = [0..30_000, 30_000..77_777, 77_777..n]
            .into_iter()
            .map(|r| {
                sc.spawn(move || {
                    philox::samples(&s, key, u64::MAX - 3, r)
                        .map(|v| v as f32)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(t, parts);
    let u = Uniform32 {
        bits: 24,
        low: 0.0,
        high: 1.0,
    };
    let g = Generator::with_seed(3, CPU);
    let r = Tensor::rand_with([9], (), &g)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want: Vec<f32> = philox::samples(&u, philox::key_of(3), 0, 0..9)
        .map(|v| v as f32)
        .collect();
    assert_eq!(r, want);
}

#[test]
fn concurrent_ops_on_one_generator_get_disjoint_counters() {
    let g = Generator::with_seed(77, CPU);
    let outs: Vec<Vec<f64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|_| sc.spawn(|| f32s(&Tensor::rand_with([8], (), &g).unwrap())))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(g.get_state().offset, 8);
    for i in 0..4 {
        for j in i + 1..4 {
            assert_ne!(outs[i], outs[j]);
        }
    }
}

#[test]
fn dtype_rules_and_errors() {
    let g = Generator::with_seed(1, CPU);
    for d in [DType::I64, DType::I32, DType::U8, DType::Bool] {
        assert!(matches!(
            Tensor::rand_with([2], d, &g)
                .as_ref()
                .map_err(|e| e.downcast_ref::<TensorError>()),
            Err(Some(TensorError::UnsupportedDType { .. }))
        ));
        assert!(Tensor::randn_with([2], d, &g).is_err());
    }
    assert_eq!(
        Tensor::randint_with(0, 5, [3], (), &g).unwrap().dtype(),
        DType::I64
    );
    for d in [
        DType::I32,
        DType::U8,
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::F64,
    ] {
        let t = Tensor::randint_with(0, 100, [200], d, &g).unwrap();
        let v = f32s(&t);
        assert!(
            v.iter()
                .all(|x| (0.0..100.0).contains(x) && x.fract() == 0.0),
            "{d}"
        );
    }
    let b = Tensor::randint_with(0, 2, [100], DType::Bool, &g)
        .unwrap()
        .to_vec::<bool>()
        .unwrap();
    assert!(b.contains(&true) && b.contains(&false));
    let e = Tensor::randint_with(5, 5, [1], (), &g)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "randint: expected low < high, but got low=5 >= high=5");
    assert!(Tensor::randint_with(0, 257, [1], DType::U8, &g).is_err());
    assert!(Tensor::randint_with(-1, 2, [1], DType::U8, &g).is_err());
    assert!(Tensor::randint_with(0, 1 << 12, [1], DType::F16, &g).is_err());
    let big = Tensor::randint_with(i64::MIN, i64::MAX, [1000], (), &g)
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    assert!(big.iter().any(|&x| x < -(1 << 40)) && big.iter().any(|&x| x > 1 << 40));
    assert!(
        Tensor::dropout_mask_with([2], 1.5, (), &g)
            .unwrap_err()
            .to_string()
            .contains("between 0 and 1")
    );
    assert!(Tensor::bernoulli_mask_with([2], -0.1, (), &g).is_err());
    let all = Tensor::dropout_mask_with([100], 0.0, (), &g)
        .unwrap()
        .to_vec::<bool>()
        .unwrap();
    assert!(all.iter().all(|&k| k));
    let none = Tensor::dropout_mask_with([100], 1.0, DType::F32, &g)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(none.iter().all(|&k| k == 0.0));
    // Devices: the generator must match; CUDA tensors need CUDA (or the emulator).
    let cuda = Generator::new(Device::Cuda(0));
    assert!(
        Tensor::rand_with([2], (), &cuda)
            .unwrap_err()
            .to_string()
            .contains("generator for device")
    );
    let cuda_ok = ember_device::cuda::is_available();
    assert_eq!(Tensor::rand([2], Device::Cuda(0)).is_ok(), cuda_ok);
    assert_eq!(
        Tensor::rand_with([2], Device::Cuda(0), &cuda).is_ok(),
        cuda_ok
    );
    let x = Tensor::zeros([2, 3], DType::F64).unwrap();
    let r = x.rand_like_with(&g).unwrap();
    assert_eq!((r.dims(), r.dtype()), (vec![2usize, 3], DType::F64));
    // The default-generator forms, on this thread's own generator: the CPU default one
    // is `default_generators_follow_manual_seed`'s alone (tests run in parallel).
    let _own = random::ThreadGenerator::with_seed(1);
    assert_eq!(x.randn_like().unwrap().dims(), &[2, 3]);
    assert!(Tensor::zeros([2], DType::I64).unwrap().rand_like().is_err());
    assert_eq!(Tensor::rand_with([0, 3], (), &g).unwrap().numel(), 0);
}

fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n)
}

/// Kolmogorov–Smirnov statistic of `v` against the CDF `f`.
fn ks(mut v: Vec<f64>, f: impl Fn(f64) -> f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.iter()
        .enumerate()
        .map(|(i, &x)| {
            let c = f(x);
            ((i + 1) as f64 / n - c).max(c - i as f64 / n)
        })
        .fold(0.0, f64::max)
}

fn normal_cdf(x: f64) -> f64 {
    0.5 * (1.0 + ember_testing::reference::erf(x / std::f64::consts::SQRT_2))
}

const N: usize = 100_000;

fn critical() -> f64 {
    // The 0.1% critical value of the KS statistic for large n.
    1.95 / (N as f64).sqrt()
}

#[test]
fn uniform_moments_and_ks() {
    for (dtype, seed) in [
        (DType::F32, 1),
        (DType::F64, 2),
        (DType::Bf16, 3),
        (DType::F16, 4),
    ] {
        let g = Generator::with_seed(seed, CPU);
        let v = f32s(&Tensor::rand_with([N], dtype, &g).unwrap());
        assert!(v.iter().all(|x| (0.0..1.0).contains(x)), "{dtype}");
        let (m, var) = moments(&v);
        assert!(
            (m - 0.5).abs() < 0.005 && (var - 1.0 / 12.0).abs() < 0.003,
            "{dtype}: {m} {var}"
        );
        // bf16 has 8-bit steps: compare against the CDF of its discrete grid's midpoints.
        let d = ks(v, |x| x.clamp(0.0, 1.0));
        let slack = if dtype == DType::Bf16 {
            1.0 / 256.0
        } else {
            0.0
        };
        assert!(d < critical() + slack, "{dtype}: D = {d}");
    }
}

#[test]
fn normal_moments_and_ks() {
    for (dtype, seed) in [(DType::F32, 10), (DType::F64, 11), (DType::F16, 12)] {
        let g = Generator::with_seed(seed, CPU);
        let v = f32s(&Tensor::randn_with([N], dtype, &g).unwrap());
        assert!(v.iter().all(|x| x.is_finite()));
        let (m, var) = moments(&v);
        assert!(
            m.abs() < 0.015 && (var - 1.0).abs() < 0.02,
            "{dtype}: {m} {var}"
        );
        let kurt = v.iter().map(|x| (x - m).powi(4)).sum::<f64>() / N as f64 / (var * var);
        assert!((kurt - 3.0).abs() < 0.1, "{dtype}: kurtosis {kurt}");
        let d = ks(v, normal_cdf);
        let slack = if dtype == DType::F16 { 2e-3 } else { 0.0 };
        assert!(d < critical() + slack, "{dtype}: D = {d}");
    }
}

#[test]
fn randint_and_bernoulli_moments() {
    let g = Generator::with_seed(21, CPU);
    let v: Vec<f64> = Tensor::randint_with(-5, 6, [N], (), &g)
        .unwrap()
        .to_vec::<i64>()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    assert!(v.iter().all(|x| (-5.0..6.0).contains(x)));
    let (m, var) = moments(&v);
    // Discrete uniform over 11 values: mean 0, variance (11^2 - 1) / 12 = 10.
    assert!(m.abs() < 0.05 && (var - 10.0).abs() < 0.15, "{m} {var}");
    let keep = Tensor::dropout_mask_with([N], 0.3, DType::F64, &g)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let (m, _) = moments(&keep);
    assert!((m - 0.7).abs() < 0.006, "{m}");
}
