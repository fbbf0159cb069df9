//! Helpers shared by the tests that run ops on the CPU and on `cuda:0` (the emulator in CI)
//! and compare: setup, deterministic inputs and strided views, and the comparison itself.

#![allow(dead_code, clippy::unwrap_used)]

use ember_tensor::{DType, Device, Result, Tensor};

pub const CPU: Device = Device::Cpu;
pub const GPU: Device = Device::Cuda(0);

/// `cuda:0` ready: the emulator with two devices, or under `cargo xtask gpu-test`
/// (`EMBER_GPU_TEST=1`) the real driver, which must then be there (`ember_testing::prepare`,
/// Note [Test devices]). (The cuda:1 tests need two GPUs.)
pub fn setup() {
    if let Err(s) = ember_testing::prepare(GPU) {
        panic!("{s}");
    }
}

/// Relative tolerance of a float dtype's results (kernels and CPU differ in evaluation
/// order and transcendental implementations).
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2e-3,
        DType::Bf16 => 1.6e-2,
        DType::F32 => 2e-5,
        _ => 1e-12,
    }
}

/// Asserts a CUDA result equals the CPU one: device, dtype and shape, then values.
pub fn assert_matches(what: &str, cpu: &Tensor, gpu: &Tensor) {
    assert_matches_within(what, cpu, gpu, 1.0);
}

/// [`assert_matches`] with the float tolerance scaled by `slack`.
pub fn assert_matches_within(what: &str, cpu: &Tensor, gpu: &Tensor, slack: f64) {
    assert_eq!(gpu.device(), GPU, "{what}: device");
    assert_eq!(cpu.dtype(), gpu.dtype(), "{what}: dtype");
    assert_eq!(cpu.dims(), gpu.dims(), "{what}: shape");
    let g = gpu.to_device(CPU).unwrap();
    if cpu.dtype().is_float() {
        let (a, b) = (
            cpu.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            g.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
        );
        let t = tol(cpu.dtype()) * slack;
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= t * x.abs().max(1.0);
            assert!(ok, "{what}: element {i}: cpu {x}, cuda {y}");
        }
    } else {
        let (a, b) = (
            cpu.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
            g.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        );
        assert_eq!(a, b, "{what}");
    }
}

/// `set_float32_matmul_precision` is process-wide, as in PyTorch: comparisons hold it for
/// reading, and the test that allows TF32 holds it for writing, so that no other test's
/// products run in TF32 on a real GPU (the emulator's GEMM ignores the switch).
pub static MATMUL_PRECISION: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// `cuda:1` where there is one; on a machine with a single real GPU, `None` after an
/// `ember-skip-part:` line (Note [Skipped tests]; the two-device paths still run on the
/// emulator's two devices in CI).
pub fn second_gpu(test: &str) -> Option<Device> {
    match ember_testing::prepare(Device::Cuda(1)) {
        Ok(d) => Some(d),
        Err(s) => {
            ember_testing::skip_part(format_args!("{test}'s cuda:1 part: {s}"));
            None
        }
    }
}

/// Runs `f` on the CPU inputs and on copies on `cuda:0`; both succeed and match, or both
/// fail with the same message.
pub fn same(what: &str, inputs: &[&Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    same_within(what, inputs, 1.0, f);
}

/// [`same`] with the float tolerance scaled by `slack`.
pub fn same_within(
    what: &str,
    inputs: &[&Tensor],
    slack: f64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    let _precision = MATMUL_PRECISION
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cpu: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
    let gpu: Vec<Tensor> = inputs.iter().map(|t| t.to_device(GPU).unwrap()).collect();
    match (f(&cpu), f(&gpu)) {
        (Ok(c), Ok(g)) => assert_matches_within(what, &c, &g, slack),
        (Err(c), Err(g)) => assert_eq!(c.to_string(), g.to_string(), "{what}: errors"),
        (c, g) => panic!("{what}: cpu gave {c:?}, cuda gave {g:?}"),
    }
}

/// Deterministic values for `dtype`: small integers, or floats in [-3, 3) with a few
/// specials when `specials`.
pub fn values(dtype: DType, n: usize, seed: u64, specials: bool) -> Tensor {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f64> = (0..n)
        .map(|i| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            if specials && i % 7 == 3 {
                [f64::NAN, f64::INFINITY, -0.0, f64::NEG_INFINITY][(state % 4) as usize]
            } else if dtype.is_float() {
                u * 6.0 - 3.0
            } else {
                (u * 11.0).floor() - 5.0
            }
        })
        .collect();
    Tensor::from_slice(&v, [n], CPU)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// A strided view of `dtype` with shape `dims`: made larger, then sliced and permuted.
pub fn view(dtype: DType, dims: &[usize], seed: u64, transposed: bool) -> Tensor {
    let big: Vec<usize> = dims.iter().map(|&d| d + 1).collect();
    let n: usize = big.iter().product();
    let mut t = values(dtype, n, seed, false).reshape(big).unwrap();
    for (d, &len) in dims.iter().enumerate() {
        t = t.narrow(d, 1, len).unwrap();
    }
    if transposed && dims.len() >= 2 {
        // The same shape, transposed strides: transpose a transposed copy.
        let r = dims.len();
        t = t
            .transpose(r - 2, r - 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .transpose(r - 2, r - 1)
            .unwrap();
    }
    t
}
