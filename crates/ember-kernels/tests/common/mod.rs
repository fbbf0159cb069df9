//! Helpers shared by the emulated-kernel tests: the emulator, typed copies, launches.
#![allow(dead_code)]

use std::sync::Arc;

use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_device::driver::{DevicePtr, Driver, LaunchConfig, ModuleHandle, StreamHandle};
use ember_kernels::{KernelArgs, KernelsError, load_module};
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
elem!(f32, f64, i32, u32, i64, u16, f16, bf16);

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

/// A small deterministic generator (xorshift64*), so the tests need no RNG crate.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-scale, scale).
    pub fn f32(&mut self, scale: f32) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}
