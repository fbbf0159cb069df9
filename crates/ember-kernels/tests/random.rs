//! The Philox kernels of `kernels/random.cu` on the emulated `cuda:0`, bit for bit against the
//! CPU generator itself: `Tensor::rand_with`/`randn_with`/`randint_with`/`bernoulli_mask_with`/
//! `dropout_mask_with` from a `Generator` set to the same seed and offset (and, for parameters
//! the tensor API does not take, `ember_tensor::random::philox::samples` with create.rs'
//! conversions). Every kernel, every dtype; n = 0, n not a multiple of 4 or 2, a misaligned
//! output (scalar stores) and an aligned one (vector stores); counters crossing 2^32 and
//! wrapping past 2^64; seeds with high bits; the normal's tails and its r = small end.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{B, Buf, Elem, launch, setup};
use ember_device::driver::{Driver, ModuleHandle};
use ember_kernels::{KernelArgs, launch_config_1d};
use ember_tensor::random::philox::{
    self, Normal32, Normal64, Sampler, Uniform32, Uniform64, block, key_of,
};
use ember_tensor::random::{Generator, GeneratorState};
use ember_tensor::{DType, Device, Tensor};
use half::{bf16, f16};

/// A kernel output dtype and how to read the CPU tensor of it.
trait Out: Elem {
    const SUFFIX: &'static str;
    const DTYPE: DType;
    fn host(t: &Tensor) -> Vec<Self>;
    /// create.rs' conversion of an f64 sample (floats only).
    fn from_sample(v: f64) -> Self;
}

macro_rules! out {
    ($t:ty, $s:literal, $d:expr, $conv:expr) => {
        impl Out for $t {
            const SUFFIX: &'static str = $s;
            const DTYPE: DType = $d;
            fn host(t: &Tensor) -> Vec<Self> {
                t.to_vec::<$t>().unwrap()
            }
            fn from_sample(v: f64) -> Self {
                $conv(v)
            }
        }
    };
}
out!(f32, "f32", DType::F32, |v: f64| v as f32);
out!(f64, "f64", DType::F64, |v: f64| v);
out!(f16, "f16", DType::F16, f16::from_f64);
out!(bf16, "bf16", DType::Bf16, bf16::from_f64);
out!(i64, "i64", DType::I64, |_| unreachable!("not a float"));
out!(i32, "i32", DType::I32, |_| unreachable!("not a float"));
out!(u8, "u8", DType::U8, |_| unreachable!("not a float"));

impl Out for B {
    const SUFFIX: &'static str = "bool";
    const DTYPE: DType = DType::Bool;
    fn host(t: &Tensor) -> Vec<Self> {
        t.to_vec::<bool>().unwrap().into_iter().map(B).collect()
    }
    fn from_sample(_: f64) -> Self {
        unreachable!("not a float")
    }
}

fn bytes<T: Elem>(v: &[T]) -> Vec<u8> {
    let mut b = Vec::new();
    v.iter().for_each(|&x| x.write(&mut b));
    b
}

fn assert_bits<T: Elem>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (g, w) = (bytes(got), bytes(want));
    if let Some(i) =
        (0..got.len()).find(|&i| g[i * T::SIZE..][..T::SIZE] != w[i * T::SIZE..][..T::SIZE])
    {
        panic!("{what}: element {i}: got {:?}, want {:?}", got[i], want[i]);
    }
}

/// A CPU generator whose next op uses key `key_of(seed)` and first counter `base`.
fn generator_at(seed: u64, base: u64) -> Generator {
    let g = Generator::with_seed(seed, Device::Cpu);
    g.set_state(&GeneratorState { seed, offset: base });
    g
}

/// How one kernel launch is laid out: output offset in elements (1: misaligned, scalar
/// stores) and the grid (None: one thread per counter).
#[derive(Clone, Copy, Debug)]
struct Geometry {
    offset: usize,
    grid: Option<(u32, u32)>,
}

const GEOMETRIES: [Geometry; 3] = [
    Geometry {
        offset: 0,
        grid: None,
    },
    Geometry {
        offset: 1,
        grid: None,
    },
    Geometry {
        offset: 0,
        grid: Some((2, 32)),
    },
];

/// Launches `philox_{sampler}_{T}` over n elements with the key of `seed`, counter `base` and
/// the sampler's trailing arguments; returns the n outputs, checking that the elements around
/// them stay untouched.
#[allow(clippy::too_many_arguments)]
fn run<T: Out>(
    d: &Arc<dyn Driver>,
    m: ModuleHandle,
    sampler: &str,
    n: usize,
    seed: u64,
    base: u64,
    k: usize,
    geometry: Geometry,
    params: &dyn Fn(&mut KernelArgs),
) -> Vec<T> {
    let pad = 3;
    let buf = Buf::<T>::zeros(d, 0, geometry.offset + n + pad);
    let key = key_of(seed);
    let mut args = KernelArgs::new();
    args.ptr(buf.at(geometry.offset))
        .push(n as i64)
        .push(key[0])
        .push(key[1])
        .push(base);
    params(&mut args);
    let (grid, block) = geometry.grid.unwrap_or_else(|| {
        let c = launch_config_1d(n.div_ceil(k));
        (c.grid.0, c.block.0)
    });
    let name = format!("philox_{sampler}_{}", T::SUFFIX);
    launch(d, m, &name, grid, block, 0, &mut args).unwrap();
    let all = buf.to_vec();
    let zero = bytes(&[T::read(&vec![0u8; T::SIZE])]);
    for i in (0..geometry.offset).chain(geometry.offset + n..all.len()) {
        assert_eq!(
            bytes(&all[i..=i]),
            zero,
            "{name}: n={n}: element {i} outside the output was written"
        );
    }
    all[geometry.offset..geometry.offset + n].to_vec()
}

/// (seed, base) pairs: zero; small; counters crossing 2^32 (the high counter word changes);
/// counters wrapping past 2^64; seeds with high bits set.
const STREAMS: [(u64, u64); 5] = [
    (0, 0),
    (1, 7),
    (0xDEAD_BEEF_CAFE_F00D, 0xFFFF_FFFE),
    (u64::MAX, u64::MAX - 2),
    (0x8000_0000_0000_0000, 0x1_0000_0000),
];

/// Element counts: empty, below one counter, not multiples of 4 or 2, several chunks.
const SIZES: [usize; 8] = [0, 1, 2, 3, 5, 6, 7, 1003];

/// Compares the kernel with the CPU op `cpu` (a tensor from the generator) over every stream,
/// size and geometry, and checks the generator advanced by ceil(n / k) counters, which is what
/// the host must reserve for the kernel.
fn check<T: Out>(
    sampler: &str,
    k: usize,
    params: &dyn Fn(&mut KernelArgs),
    cpu: &dyn Fn(usize, &Generator) -> Tensor,
) {
    let (d, m) = setup(0);
    for &(seed, base) in &STREAMS {
        for &n in &SIZES {
            let g = generator_at(seed, base);
            let want = T::host(&cpu(n, &g));
            let advanced = g.get_state().offset.wrapping_sub(base);
            assert_eq!(
                advanced,
                n.div_ceil(k) as u64,
                "{sampler}_{}: counters of n={n}",
                T::SUFFIX
            );
            for geometry in GEOMETRIES {
                let got = run::<T>(&d, m, sampler, n, seed, base, k, geometry, params);
                let what = format!(
                    "philox_{sampler}_{} seed={seed:#x} base={base:#x} n={n} {geometry:?}",
                    T::SUFFIX
                );
                assert_bits(&got, &want, &what);
            }
        }
    }
    // One long stream, which the CPU fills in parallel chunks, on a small grid-stride grid.
    let n = 70_001;
    let g = generator_at(42, 1 << 40);
    let want = T::host(&cpu(n, &g));
    let geometry = Geometry {
        offset: 0,
        grid: Some((3, 128)),
    };
    let got = run::<T>(&d, m, sampler, n, 42, 1 << 40, k, geometry, params);
    assert_bits(
        &got,
        &want,
        &format!("philox_{sampler}_{} n={n}", T::SUFFIX),
    );
}

fn two_f64(a: f64, b: f64) -> impl Fn(&mut KernelArgs) {
    move |args: &mut KernelArgs| {
        args.push(a).push(b);
    }
}

fn uniform_case<T: Out>(k: usize) {
    check::<T>("uniform", k, &two_f64(0.0, 1.0), &|n, g| {
        Tensor::rand_with([n], T::DTYPE, g).unwrap()
    });
}

fn normal_case<T: Out>(k: usize) {
    check::<T>("normal", k, &two_f64(0.0, 1.0), &|n, g| {
        Tensor::randn_with([n], T::DTYPE, g).unwrap()
    });
}

#[test]
fn uniform_matches_rand_for_every_float_dtype() {
    uniform_case::<f32>(4);
    uniform_case::<f16>(4);
    uniform_case::<bf16>(4);
    uniform_case::<f64>(2);
}

#[test]
fn normal_matches_randn_for_every_float_dtype() {
    normal_case::<f32>(4);
    normal_case::<f16>(4);
    normal_case::<bf16>(4);
    normal_case::<f64>(2);
}

/// The samples of elements 0..n of `s` from (seed, base), converted as create.rs does.
fn sampled<S: Sampler<Out = f64>, T: Out>(s: &S, seed: u64, base: u64, n: usize) -> Vec<T> {
    philox::samples(s, key_of(seed), base, 0..n)
        .map(T::from_sample)
        .collect()
}

/// Uniform and normal parameters the tensor API does not take (`low`/`high`, `mean`/`std`),
/// against the CPU samplers; the range [1e16, 1e16 + 2) makes half the samples round up to
/// `high` and be clamped below it.
fn parameters_case<T: Out>(k: usize) {
    let (d, m) = setup(0);
    let geometry = GEOMETRIES[0];
    let n = 1003;
    for &(seed, base) in &STREAMS {
        for (low, high) in [(-3.5, 2.25), (1e16, 1e16 + 2.0), (-1e-3, 0.0)] {
            let want: Vec<T> = if T::SUFFIX == "f64" {
                sampled(&Uniform64 { low, high }, seed, base, n)
            } else {
                let bits = match T::SUFFIX {
                    "f32" => 24,
                    "f16" => 11,
                    _ => 8,
                };
                sampled(&Uniform32 { bits, low, high }, seed, base, n)
            };
            let got = run::<T>(
                &d,
                m,
                "uniform",
                n,
                seed,
                base,
                k,
                geometry,
                &two_f64(low, high),
            );
            assert_bits(
                &got,
                &want,
                &format!("uniform_{} [{low}, {high})", T::SUFFIX),
            );
        }
        for (mean, std) in [(3.0, 0.5), (-1e3, 1e-3), (0.0, 0.0)] {
            let want: Vec<T> = if T::SUFFIX == "f64" {
                sampled(&Normal64 { mean, std }, seed, base, n)
            } else {
                sampled(&Normal32 { mean, std }, seed, base, n)
            };
            let got = run::<T>(
                &d,
                m,
                "normal",
                n,
                seed,
                base,
                k,
                geometry,
                &two_f64(mean, std),
            );
            assert_bits(
                &got,
                &want,
                &format!("normal_{} mean={mean} std={std}", T::SUFFIX),
            );
        }
    }
}

#[test]
fn uniform_and_normal_parameters_match_the_cpu_samplers() {
    parameters_case::<f32>(4);
    parameters_case::<f16>(4);
    parameters_case::<bf16>(4);
    parameters_case::<f64>(2);
}

/// Counters whose Box–Muller radius is extreme: u1 = 1 - k1 2^-b near 0 (|z| up to 5.8 for
/// 24 bits, 8.6 for 53) and near 1 (r near 0, ln of 1 - tiny). Found by scanning the stream of
/// `seed`; returns (counter, z-slot-pair) hits for the 24-bit and the 53-bit sampler.
fn tail_counters(seed: u64) -> (Vec<u64>, Vec<u64>) {
    let key = key_of(seed);
    let (mut t24, mut t53) = (Vec::new(), Vec::new());
    for c in 0..1u64 << 22 {
        let w = block(key, 0, c);
        let extreme24 = |x: u32| x >> 8 >= (1 << 24) - 64 || x >> 8 < 4;
        if extreme24(w[0]) || extreme24(w[2]) {
            t24.push(c);
        }
        if w[0] >= u32::MAX - (1 << 14) || w[0] < 1 << 12 {
            t53.push(c);
        }
    }
    (t24, t53)
}

fn tails_case<T: Out>(k: usize, counters: &[u64], seed: u64) -> f64 {
    let (d, m) = setup(0);
    let mut largest = 0f64;
    for &c in counters {
        // The counter's K outputs and the next counter's, from base = c.
        let g = generator_at(seed, c);
        let want = T::host(&Tensor::randn_with([2 * k], T::DTYPE, &g).unwrap());
        let got = run::<T>(
            &d,
            m,
            "normal",
            2 * k,
            seed,
            c,
            k,
            GEOMETRIES[0],
            &two_f64(0.0, 1.0),
        );
        assert_bits(
            &got,
            &want,
            &format!("normal_{} tail at counter {c}", T::SUFFIX),
        );
        if T::SUFFIX == "f64" {
            let g = generator_at(seed, c);
            let z = Tensor::randn_with([2], DType::F64, &g)
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            largest = largest.max(z[0].abs()).max(z[1].abs());
        } else {
            let g = generator_at(seed, c);
            let z = Tensor::randn_with([4], DType::F32, &g)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            largest = z.iter().fold(largest, |a, &b| a.max(f64::from(b.abs())));
        }
    }
    largest
}

#[test]
fn normal_tails_match_bit_for_bit() {
    let seed = 0x0123_4567_89AB_CDEF;
    let (t24, t53) = tail_counters(seed);
    assert!(
        t24.len() >= 8 && t53.len() >= 8,
        "{} {}",
        t24.len(),
        t53.len()
    );
    let z32 = tails_case::<f32>(4, &t24, seed);
    tails_case::<f16>(4, &t24, seed);
    tails_case::<bf16>(4, &t24, seed);
    let z64 = tails_case::<f64>(2, &t53, seed);
    // The scan did reach the tails: |z| >= 4.5 needs u1 <= 4e-5.
    assert!(z32 > 4.5 && z64 > 4.5, "largest |z|: f32 {z32}, f64 {z64}");
}

fn randint_case<T: Out>(low: i64, high: i64) {
    let range = high.abs_diff(low);
    let k = if range <= 1 << 32 { 4 } else { 2 };
    let params = move |args: &mut KernelArgs| {
        args.push(low).push(range);
    };
    check::<T>("randint", k, &params, &|n, g| {
        Tensor::randint_with(low, high, [n], T::DTYPE, g).unwrap()
    });
}

#[test]
fn randint_matches_the_cpu_for_every_dtype_and_range() {
    // Ranges of one value, small, exactly 2^32 (still one word a sample), 2^32 + 1 (two words),
    // and the whole of i64.
    randint_case::<i64>(-3, 4);
    randint_case::<i64>(5, 6);
    randint_case::<i64>(0, 1 << 32);
    randint_case::<i64>(-1, 1 << 32);
    randint_case::<i64>(-(1 << 40), 1 << 40);
    randint_case::<i64>(i64::MIN, i64::MAX);
    randint_case::<i32>(i32::MIN.into(), i32::MAX.into());
    randint_case::<i32>(-10, 10);
    randint_case::<u8>(0, 256);
    randint_case::<B>(0, 2);
    randint_case::<f32>(-(1 << 24), (1 << 24) + 1);
    randint_case::<f64>(-(1 << 53), (1 << 53) + 1);
    randint_case::<f64>(-7, 9);
    randint_case::<f16>(-2048, 2049);
    randint_case::<bf16>(-256, 257);
}

fn bernoulli_case<T: Out>() {
    for p in [0.0, 0.3, 0.5, 1.0] {
        let params = move |args: &mut KernelArgs| {
            args.push(p);
        };
        check::<T>("bernoulli", 4, &params, &|n, g| {
            Tensor::bernoulli_mask_with([n], p, T::DTYPE, g).unwrap()
        });
    }
    // dropout's keep-mask is bernoulli(1 - p).
    let drop = 0.25;
    let params = move |args: &mut KernelArgs| {
        args.push(1.0 - drop);
    };
    check::<T>("bernoulli", 4, &params, &|n, g| {
        Tensor::dropout_mask_with([n], drop, T::DTYPE, g).unwrap()
    });
}

#[test]
fn bernoulli_and_dropout_masks_match_the_cpu_for_every_dtype() {
    bernoulli_case::<B>();
    bernoulli_case::<f32>();
    bernoulli_case::<f64>();
    bernoulli_case::<f16>();
    bernoulli_case::<bf16>();
    bernoulli_case::<i64>();
    bernoulli_case::<i32>();
    bernoulli_case::<u8>();
}

#[test]
fn a_split_launch_continues_the_stream() {
    // Two launches over [0, 4k) and [4k, n) from base and base + k counters give the one
    // stream of n elements: what a host that splits a large op (or a later op with the
    // advanced offset) relies on.
    let (d, m) = setup(0);
    let (seed, base, n, split) = (99, 0xFFFF_FFF0, 1001, 400);
    let g = generator_at(seed, base);
    let want = f32::host(&Tensor::randn_with([n], DType::F32, &g).unwrap());
    let first = run::<f32>(
        &d,
        m,
        "normal",
        split,
        seed,
        base,
        4,
        GEOMETRIES[0],
        &two_f64(0.0, 1.0),
    );
    let rest = run::<f32>(
        &d,
        m,
        "normal",
        n - split,
        seed,
        base + (split / 4) as u64,
        4,
        GEOMETRIES[0],
        &two_f64(0.0, 1.0),
    );
    let got: Vec<f32> = first.into_iter().chain(rest).collect();
    assert_bits(&got, &want, "split normal");
}
