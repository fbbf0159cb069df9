//! Helpers shared by the emulated-kernel tests: the emulator, typed copies, launches, test
//! inputs and layouts. The references, closeness and random data are `ember_testing`'s.
#![allow(dead_code)]

use std::sync::Arc;

use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_device::driver::{DevicePtr, Driver, LaunchConfig, ModuleHandle, StreamHandle};
use ember_kernels::{KernelArgs, KernelsError, load_module};
use ember_testing::Lcg;
use ember_testing::reference::{contiguous_strides, offset_of};
use half::{bf16, f16};

pub const S0: StreamHandle = StreamHandle::DEFAULT;

/// The process's emulated driver (two devices, as every test in the workspace) and Ember's
/// kernels loaded on `device`.
pub fn setup(device: usize) -> (Arc<dyn Driver>, ModuleHandle) {
    cuda::use_emulator(EmulatorConfig::devices(2)).expect("emulator");
    let driver = cuda::driver().expect("driver");
    let module = load_module(driver.as_ref(), device).expect("module");
    (driver, module)
}

/// Element types the tests move to and from the device.
pub trait Elem: Copy + PartialEq + std::fmt::Debug + 'static {
    const SIZE: usize;
    fn write(self, out: &mut Vec<u8>);
    fn read(bytes: &[u8]) -> Self;
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("element size"))
            }
        }
    )*};
}
elem!(f32, f64, i32, u32, i64, u16, f16, bf16, u8);

/// A device buffer of `n` elements of `T` on `device`, freed on drop.
pub struct Buf<T: Elem> {
    pub driver: Arc<dyn Driver>,
    pub device: usize,
    pub ptr: DevicePtr,
    pub len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Elem> Buf<T> {
    pub fn zeros(driver: &Arc<dyn Driver>, device: usize, len: usize) -> Buf<T> {
        let ptr = driver
            .malloc(device, (len * T::SIZE).max(1))
            .expect("malloc");
        driver
            .memset_d8_async(ptr, 0, (len * T::SIZE).max(1), S0)
            .expect("memset");
        Buf {
            driver: Arc::clone(driver),
            device,
            ptr,
            len,
            _t: std::marker::PhantomData,
        }
    }

    pub fn from_slice(driver: &Arc<dyn Driver>, device: usize, data: &[T]) -> Buf<T> {
        let b = Buf::zeros(driver, device, data.len());
        let mut bytes = Vec::with_capacity(data.len() * T::SIZE);
        data.iter().for_each(|&v| v.write(&mut bytes));
        if !bytes.is_empty() {
            driver.memcpy_htod(b.ptr, &bytes, S0).expect("htod");
        }
        b
    }

    pub fn to_vec(&self) -> Vec<T> {
        let mut bytes = vec![0u8; self.len * T::SIZE];
        if !bytes.is_empty() {
            self.driver
                .memcpy_dtoh(&mut bytes, self.ptr, S0)
                .expect("dtoh");
        }
        bytes.chunks(T::SIZE).map(T::read).collect()
    }

    /// The address of element `i` (for unaligned and offset views).
    pub fn at(&self, i: usize) -> DevicePtr {
        self.ptr.offset((i * T::SIZE) as u64)
    }
}

impl<T: Elem> Drop for Buf<T> {
    fn drop(&mut self) {
        let _ = self.driver.free(self.device, self.ptr);
    }
}

/// Launch `name` with a 1-D grid and block.
pub fn launch(
    driver: &Arc<dyn Driver>,
    module: ModuleHandle,
    name: &str,
    grid: u32,
    block: u32,
    shared: u32,
    args: &mut KernelArgs,
) -> Result<(), KernelsError> {
    let f = driver.module_function(module, name)?;
    let config = LaunchConfig {
        grid: (grid, 1, 1),
        block: (block, 1, 1),
        shared_mem_bytes: shared,
    };
    let mut params = args.params();
    // SAFETY: every test builds `args` in the order and with the types of the kernel's
    // parameters (documented in the kernel's .cu file); buffers are sized for the launch.
    unsafe { driver.launch_kernel(f, config, S0, &mut params)? };
    Ok(())
}

/// A bool element as the kernels store it: one byte, 0 or 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct B(pub bool);

impl Elem for B {
    const SIZE: usize = 1;
    fn write(self, out: &mut Vec<u8>) {
        out.push(u8::from(self.0));
    }
    fn read(bytes: &[u8]) -> Self {
        assert!(
            bytes[0] <= 1,
            "a bool byte that is neither 0 nor 1: {}",
            bytes[0]
        );
        B(bytes[0] != 0)
    }
}

/// The eight dtypes of the kernels, with the CPU backend's conversions (crates/ember-tensor
/// `WithDType`): `from_f64` truncates toward zero and saturates into integers (NaN -> 0; u8
/// through i64, wrapping), rounds into f16/bf16 through f32; `from_i64` wraps.
pub trait Dt: Elem {
    const SUFFIX: &'static str;
    const FLOAT: bool;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    fn from_f64(v: f64) -> Self;
    fn from_i64(v: i64) -> Self;
    /// Relative tolerance of a float result computed in this dtype (0 for exact types).
    const TOL: f64;
}

macro_rules! dt_float {
    ($t:ty, $s:literal, $tol:expr, $to:expr, $from:expr) => {
        impl Dt for $t {
            const SUFFIX: &'static str = $s;
            const FLOAT: bool = true;
            const TOL: f64 = $tol;
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn to_i64(self) -> i64 {
                self.to_f64() as i64
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn from_i64(v: i64) -> Self {
                // The CPU's from_i64: one rounding into f32/f64, through f32 for the halves.
                if $s == "f64" {
                    $from(v as f64)
                } else {
                    $from(v as f32 as f64)
                }
            }
        }
    };
}
dt_float!(f32, "f32", 2e-6, |x: f32| x as f64, |v: f64| v as f32);
dt_float!(f64, "f64", 1e-13, |x: f64| x, |v: f64| v);
dt_float!(f16, "f16", 2e-3, |x: f16| x.to_f64(), |v: f64| {
    f16::from_f32(v as f32)
});
dt_float!(bf16, "bf16", 1.6e-2, |x: bf16| x.to_f64(), |v: f64| {
    bf16::from_f32(v as f32)
});

macro_rules! dt_int {
    ($t:ty, $s:literal, $from:expr) => {
        impl Dt for $t {
            const SUFFIX: &'static str = $s;
            const FLOAT: bool = false;
            const TOL: f64 = 0.0;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
dt_int!(i64, "i64", |v: f64| v as i64);
dt_int!(i32, "i32", |v: f64| v as i32);
dt_int!(u8, "u8", |v: f64| (v as i64) as u8);

impl Dt for B {
    const SUFFIX: &'static str = "bool";
    const FLOAT: bool = false;
    const TOL: f64 = 0.0;
    fn to_f64(self) -> f64 {
        if self.0 { 1.0 } else { 0.0 }
    }
    fn to_i64(self) -> i64 {
        i64::from(self.0)
    }
    fn from_f64(v: f64) -> Self {
        B(v != 0.0)
    }
    fn from_i64(v: i64) -> Self {
        B(v != 0)
    }
}

/// Test inputs of dtype `T`: `n` values from `rng` (floats uniform in [-scale, scale), integers
/// over their whole range for 1-byte types and a mix of small and huge values otherwise),
/// with `specials` (NaN, ±inf, ±0 for floats; extremes for integers) sprinkled in.
pub fn values<T: Dt>(rng: &mut Lcg, n: usize, scale: f32, specials: bool) -> Vec<T> {
    let special_f = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
    ];
    let special_i = [
        i64::MIN,
        i64::MAX,
        -1,
        0,
        1,
        i32::MIN as i64,
        i32::MAX as i64,
        255,
    ];
    (0..n)
        .map(|i| {
            if specials && i % 13 == 5 {
                let k = (i / 13) % 8;
                if T::FLOAT {
                    T::from_f64(special_f[k % special_f.len()])
                } else {
                    T::from_i64(special_i[k])
                }
            } else if T::FLOAT {
                T::from_f64(rng.f32(scale) as f64)
            } else if T::SUFFIX == "bool" {
                T::from_i64((rng.next_u64() >> 63) as i64)
            } else if T::SIZE <= 1 || i % 3 == 0 {
                T::from_i64(rng.next_u64() as i64)
            } else {
                T::from_i64((rng.next_u64() % 41) as i64 - 20)
            }
        })
        .collect()
}

/// One strided operand of an elementwise test: its strides over the iteration shape and the
/// element it starts at (an offset of 1 makes the pointer misaligned: the scalar path).
#[derive(Clone, Debug)]
pub struct View {
    pub strides: Vec<isize>,
    pub offset: usize,
}

/// Iteration shapes with one view per operand (up to three): contiguous aligned (vector path
/// plus tail), contiguous misaligned, transposed, broadcast (stride 0), rank 4 (the kernels'
/// 32-bit strided loop: a reversed permutation, a broadcast, an offset) and rank 8 (their
/// general loop).
pub fn layouts() -> Vec<(Vec<usize>, [View; 3])> {
    let v = |s: &[isize], o: usize| View {
        strides: s.to_vec(),
        offset: o,
    };
    let c1003 = contiguous_strides(&[1003]);
    let c57 = contiguous_strides(&[5, 7]);
    let c8 = contiguous_strides(&[2, 1, 3, 2, 1, 2, 3, 2]);
    let c4 = contiguous_strides(&[2, 3, 4, 5]);
    vec![
        (vec![1003], [v(&c1003, 0), v(&c1003, 0), v(&c1003, 0)]),
        (vec![1003], [v(&c1003, 1), v(&c1003, 0), v(&c1003, 3)]),
        (vec![5, 7], [v(&[1, 5], 0), v(&[1, 0], 0), v(&c57, 2)]),
        (vec![5, 7], [v(&c57, 0), v(&[0, 0], 1), v(&[0, 1], 0)]),
        (
            vec![2, 3, 4, 5],
            [v(&[1, 2, 6, 24], 0), v(&[0, 5, 0, 1], 2), v(&c4, 1)],
        ),
        (
            vec![2, 1, 3, 2, 1, 2, 3, 2],
            [v(&c8, 0), v(&[0, 0, 1, 0, 0, 0, 3, 0], 0), v(&c8, 1)],
        ),
    ]
}

/// A device copy of `data` and, for each iteration index, the host element `view` reads.
pub fn gathered<T: Elem>(data: &[T], shape: &[usize], view: &View) -> Vec<T> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| data[view.offset + offset_of(i, shape, &view.strides)])
        .collect()
}
