//! fill, arange and the binary elementwise kernels, run on the emulated `cuda:0` through the
//! driver trait with their real grids and blocks, against Rust references computed as the CPU
//! backend computes (f16/bf16 in f32, one rounding by the `half` crate). Results must match
//! bit for bit.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Buf, Elem, launch, setup};
use ember_kernels::{KernelArgs, Module, StridedLayout, launch_config_1d};
use ember_testing::Lcg;
use ember_testing::reference::{contiguous_strides, offset_of};
use half::{bf16, f16};

/// A float dtype of the kernels: its suffix and conversions through f32/f64.
trait FloatElem: Elem {
    const SUFFIX: &'static str;
    fn from_f32(v: f32) -> Self;
    fn from_f64(v: f64) -> Self;
    fn to_f32(self) -> f32;
}

impl FloatElem for f32 {
    const SUFFIX: &'static str = "f32";
    fn from_f32(v: f32) -> Self {
        v
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f32(self) -> f32 {
        self
    }
}
impl FloatElem for f16 {
    const SUFFIX: &'static str = "f16";
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
}
impl FloatElem for bf16 {
    const SUFFIX: &'static str = "bf16";
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
}

fn bits<T: Elem>(v: &[T]) -> Vec<Vec<u8>> {
    v.iter()
        .map(|&x| {
            let mut b = Vec::new();
            x.write(&mut b);
            b
        })
        .collect()
}

fn assert_same<T: Elem>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (g, w) = (bits(got), bits(want));
    if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
        panic!("{what}: element {i}: got {:?}, want {:?}", got[i], want[i]);
    }
}

fn fill_case<T: Elem>(suffix: &str, value: T) {
    let (d, m) = setup(0);
    // Aligned bulk + tail, a single element, and an unaligned start (scalar path).
    for (n, offset, grid, block) in [
        (1003, 0, 4, 128),
        (1, 0, 1, 32),
        (77, 1, 2, 64),
        (5000, 0, 3, 96),
    ] {
        let buf = Buf::<T>::zeros(&d, 0, n + offset);
        let mut args = KernelArgs::new();
        args.ptr(buf.at(offset)).push(n as i64).push(value);
        launch(
            &d,
            m,
            &format!("ember_fill_{suffix}"),
            grid,
            block,
            0,
            &mut args,
        )
        .unwrap();
        let got = buf.to_vec();
        let zero = T::read(&vec![0u8; T::SIZE]);
        let mut want = vec![zero; offset];
        want.extend(std::iter::repeat_n(value, n));
        assert_same(&got, &want, &format!("fill_{suffix} n={n} offset={offset}"));
    }
}

#[test]
fn fill_every_dtype() {
    fill_case("f32", -1.25f32);
    fill_case("f16", f16::from_f32(3.5));
    fill_case("bf16", bf16::from_f32(-7.0));
    fill_case("i64", 0x0123_4567_89AB_CDEFi64);
    fill_case("f64", -0.1f64);
    fill_case("i32", -123_456_789i32);
    fill_case("u8", 0xA5u8);
    fill_bool();
    // NaN and infinity bit patterns travel unchanged.
    fill_case("f16", f16::from_bits(0x7E01));
    fill_case("bf16", bf16::INFINITY);
}

/// bool is one byte 0/1; the buffer is read back as u8.
fn fill_bool() {
    let (d, m) = setup(0);
    for (n, value) in [(1003usize, true), (17, false)] {
        let buf = Buf::<u8>::from_slice(&d, 0, &vec![7u8; n]);
        let mut args = KernelArgs::new();
        args.ptr(buf.ptr).push(n as i64).push(value);
        launch(&d, m, "ember_fill_bool", 3, 128, 0, &mut args).unwrap();
        assert_eq!(buf.to_vec(), vec![u8::from(value); n], "fill_bool n={n}");
    }
}

fn arange_float_case<T: FloatElem>(start: f64, step: f64, n: usize) {
    let (d, m) = setup(0);
    let buf = Buf::<T>::zeros(&d, 0, n);
    let mut args = KernelArgs::new();
    args.ptr(buf.ptr).push(n as i64).push(start).push(step);
    launch(
        &d,
        m,
        &format!("ember_arange_{}", T::SUFFIX),
        3,
        128,
        0,
        &mut args,
    )
    .unwrap();
    // The CPU backend: `start + i as f64 * step`, then one conversion from f64.
    let want: Vec<T> = (0..n)
        .map(|i| T::from_f64(start + i as f64 * step))
        .collect();
    assert_same(
        &buf.to_vec(),
        &want,
        &format!("arange_{} {start} {step}", T::SUFFIX),
    );
}

#[test]
fn arange_floats_match_the_cpu_rounding() {
    for (start, step, n) in [
        (0.0, 1.0, 1000),
        (-3.7, 0.3, 777),
        (1e-3, 1.0 / 3.0, 2049),
        (70000.0, -17.1, 5000),
    ] {
        arange_float_case::<f32>(start, step, n);
        arange_float_case::<f16>(start, step, n);
        arange_float_case::<bf16>(start, step, n);
    }
}

#[test]
fn arange_i64_wraps_like_the_cpu() {
    let (d, m) = setup(0);
    for (start, step, n) in [
        (0i64, 1i64, 1000usize),
        (-50, 7, 333),
        (i64::MAX - 5, 3, 10),
    ] {
        let buf = Buf::<i64>::zeros(&d, 0, n);
        let mut args = KernelArgs::new();
        args.ptr(buf.ptr).push(n as i64).push(start).push(step);
        launch(&d, m, "ember_arange_i64", 2, 64, 0, &mut args).unwrap();
        let want: Vec<i64> = (0..n as i64)
            .map(|i| start.wrapping_add(i.wrapping_mul(step)))
            .collect();
        assert_eq!(buf.to_vec(), want, "arange_i64 {start} {step}");
    }
}

/// One binary case: inputs of `a_len`/`b_len` elements viewed with the given strides over
/// `shape`, starting `a_off`/`b_off` elements in.
struct Case<'a> {
    shape: &'a [usize],
    a_strides: &'a [isize],
    b_strides: &'a [isize],
    a_off: usize,
    b_off: usize,
    out_off: usize,
}

fn binary_case<T: FloatElem>(op: &str, f: fn(f32, f32) -> f32, case: &Case<'_>, rng: &mut Lcg) {
    let (d, m) = setup(0);
    let n: usize = case.shape.iter().product();
    let span = |strides: &[isize]| -> usize {
        case.shape
            .iter()
            .zip(strides)
            .map(|(&s, &st)| (s.saturating_sub(1)) * st as usize)
            .sum::<usize>()
            + 1
    };
    let a_len = case.a_off + span(case.a_strides);
    let b_len = case.b_off + span(case.b_strides);
    // Values up to 300 so that f16 products overflow to infinity in places.
    let a: Vec<T> = (0..a_len).map(|_| T::from_f32(rng.f32(300.0))).collect();
    let b: Vec<T> = (0..b_len).map(|_| T::from_f32(rng.f32(300.0))).collect();
    let (da, db) = (Buf::from_slice(&d, 0, &a), Buf::from_slice(&d, 0, &b));
    let out = Buf::<T>::zeros(&d, 0, n + case.out_off);
    let la = StridedLayout::new(case.shape, case.a_strides).unwrap();
    let lb = StridedLayout::new(case.shape, case.b_strides).unwrap();
    let mut args = KernelArgs::new();
    args.push(n as i64)
        .push(la)
        .push(lb)
        .ptr(da.at(case.a_off))
        .ptr(db.at(case.b_off))
        .ptr(out.at(case.out_off));
    let name = format!("b{op}_{}", T::SUFFIX);
    launch(&d, m, &name, 4, 128, 0, &mut args).unwrap();
    let want: Vec<T> = (0..n)
        .map(|i| {
            let x = a[case.a_off + offset_of(i, case.shape, case.a_strides)];
            let y = b[case.b_off + offset_of(i, case.shape, case.b_strides)];
            T::from_f32(f(x.to_f32(), y.to_f32()))
        })
        .collect();
    let got = out.to_vec();
    assert_same(
        &got[case.out_off..],
        &want,
        &format!("{name} {:?}", case.shape),
    );
}

fn binary_all_layouts<T: FloatElem>(op: &str, f: fn(f32, f32) -> f32) {
    let mut rng = Lcg(0x9E37_79B9_7F4A_7C15);
    let c1003 = contiguous_strides(&[1003]);
    let c57 = contiguous_strides(&[5, 7]);
    let c345 = contiguous_strides(&[3, 4, 5]);
    let cases = [
        // Contiguous, 16-byte aligned: vector path plus a scalar tail.
        Case {
            shape: &[1003],
            a_strides: &c1003,
            b_strides: &c1003,
            a_off: 0,
            b_off: 0,
            out_off: 0,
        },
        // Contiguous but misaligned by one element: scalar path.
        Case {
            shape: &[1003],
            a_strides: &c1003,
            b_strides: &c1003,
            a_off: 1,
            b_off: 0,
            out_off: 0,
        },
        Case {
            shape: &[1003],
            a_strides: &c1003,
            b_strides: &c1003,
            a_off: 0,
            b_off: 0,
            out_off: 3,
        },
        // A transposed [7, 5] read as [5, 7], times a row broadcast along dim 1.
        Case {
            shape: &[5, 7],
            a_strides: &[1, 5],
            b_strides: &[1, 0],
            a_off: 0,
            b_off: 0,
            out_off: 0,
        },
        // Rank 3 with a broadcast middle dimension and an offset start.
        Case {
            shape: &[3, 4, 5],
            a_strides: &c345,
            b_strides: &[5, 0, 1],
            a_off: 2,
            b_off: 1,
            out_off: 0,
        },
        // A scalar broadcast to everything, and a contiguous 2-D operand.
        Case {
            shape: &[5, 7],
            a_strides: &c57,
            b_strides: &[0, 0],
            a_off: 0,
            b_off: 0,
            out_off: 0,
        },
        // Eight dimensions, every other one broadcast in b.
        Case {
            shape: &[2, 1, 3, 2, 1, 2, 3, 2],
            a_strides: &contiguous_strides(&[2, 1, 3, 2, 1, 2, 3, 2]),
            b_strides: &[0, 0, 1, 0, 0, 0, 3, 0],
            a_off: 0,
            b_off: 0,
            out_off: 0,
        },
    ];
    for case in &cases {
        binary_case::<T>(op, f, case, &mut rng);
    }
}

#[test]
fn add_every_float_dtype_and_layout() {
    binary_all_layouts::<f32>("add", |a, b| a + b);
    binary_all_layouts::<f16>("add", |a, b| a + b);
    binary_all_layouts::<bf16>("add", |a, b| a + b);
}

#[test]
fn mul_every_float_dtype_and_layout() {
    binary_all_layouts::<f32>("mul", |a, b| a * b);
    binary_all_layouts::<f16>("mul", |a, b| a * b);
    binary_all_layouts::<bf16>("mul", |a, b| a * b);
}

#[test]
fn kernels_run_on_the_second_device() {
    let (d, m) = setup(1);
    let buf = Buf::<f32>::zeros(&d, 1, 100);
    let mut args = KernelArgs::new();
    args.ptr(buf.ptr).push(100i64).push(4.0f32);
    launch(&d, m, "ember_fill_f32", 1, 64, 0, &mut args).unwrap();
    assert!(buf.to_vec().iter().all(|&v| v == 4.0));
}

#[test]
fn module_caches_functions_and_launches_1d() {
    let (d, _) = setup(0);
    let module = Module::load(std::sync::Arc::clone(&d), 0).unwrap();
    assert_eq!(
        module.function("ember_fill_f32").unwrap(),
        module.function("ember_fill_f32").unwrap()
    );
    assert!(module.function("ember_nope").is_err());
    for n in [0usize, 1, 255, 256, 257, 100_000] {
        let buf = Buf::<f32>::zeros(&d, 0, n);
        let mut args = KernelArgs::new();
        args.ptr(buf.ptr).push(n as i64).push(-3.0f32);
        let config = launch_config_1d(n);
        assert!(config.grid.0 >= 1 && config.grid.0 <= ember_kernels::MAX_GRID_1D);
        // SAFETY: ember_fill_f32(float*, i64, float); `buf` holds n floats (one byte if n = 0,
        // and the kernel writes nothing then).
        unsafe {
            module
                .launch("ember_fill_f32", config, common::S0, &mut args)
                .unwrap()
        };
        assert!(buf.to_vec().iter().all(|&v| v == -3.0), "n = {n}");
    }
    assert_eq!(launch_config_1d(1 << 40).grid.0, ember_kernels::MAX_GRID_1D);
}

#[test]
fn strided_layout_detects_contiguity() {
    let l = StridedLayout::contiguous(&[2, 3]).unwrap();
    assert_eq!((l.rank, l.contiguous), (2, 1));
    assert_eq!(&l.strides[..2], &[3, 1]);
    assert_eq!(StridedLayout::new(&[2, 3], &[1, 2]).unwrap().contiguous, 0);
    // Size-1 dimensions do not break contiguity, whatever their stride.
    assert_eq!(StridedLayout::new(&[1, 3], &[99, 1]).unwrap().contiguous, 1);
    assert!(StridedLayout::contiguous(&[1; 9]).is_err());
}

/// The elementwise grid: one thread per 4 groups of 16 bytes when contiguous (per element
/// otherwise), 256 threads per block, at most 32 blocks per SM, at least one block.
#[test]
fn elementwise_grid_follows_groups_and_sm_count() {
    use ember_kernels::{BLOCK_1D, launch_config_elementwise as cfg};
    let blocks = |n, widest, contiguous, sms| cfg(n, widest, contiguous, sms).grid.0;
    assert_eq!(cfg(1, 4, true, 132).block.0, BLOCK_1D);
    assert_eq!(blocks(0, 4, true, 132), 1);
    assert_eq!(blocks(1, 4, true, 132), 1);
    // 2^24 f32 elements: 2^20 threads of 16 elements = 4096 blocks, under 132 · 32.
    assert_eq!(blocks(1 << 24, 4, true, 132), 4096);
    // f16 and u8 groups hold 8 and 16 elements; f64 2.
    assert_eq!(blocks(1 << 24, 2, true, 132), 2048);
    assert_eq!(blocks(1 << 24, 1, true, 132), 1024);
    assert_eq!(blocks(1 << 20, 8, true, 132), 512);
    // Strided: one thread per element, capped at 32 blocks per SM.
    assert_eq!(blocks(1 << 21, 4, false, 132), 132 * 32);
    assert_eq!(blocks(1 << 12, 4, false, 132), 16);
    // Large tensors loop instead of growing the grid.
    assert_eq!(blocks(1 << 34, 4, true, 132), 132 * 32);
    assert_eq!(blocks(1 << 34, 4, true, 0), 32);
}
