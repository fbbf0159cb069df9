#![allow(clippy::unwrap_used)]
//! PyTorch's integer and memory guarantees (issue 26) on every device: integer tensors to
//! negative integer powers and values that overflow the dtype they are stored as are
//! errors; integer matrix products compute on CUDA as on the CPU; host materialisations
//! of huge views are out-of-memory error values, never an abort.

use ember_device::ErrorKind;
use ember_tensor::{DType, Device, Tensor};
use ember_testing::test_device;

fn integer_to_a_negative_power_is_an_error(device: &Device) {
    for dt in [DType::I64, DType::I32, DType::U8, DType::Bool] {
        let x = Tensor::ones([3], (device, dt)).unwrap();
        let e = x.pow(-1).unwrap_err();
        assert!(
            e.to_string()
                .contains("Integers to negative integer powers are not allowed"),
            "{dt}: {e}"
        );
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    let x = Tensor::new(&[2i64, 3], device).unwrap();
    assert_eq!(x.pow(2).unwrap().to_vec::<i64>().unwrap(), vec![4, 9]);
    // A float exponent promotes; float bases take negative powers.
    assert_eq!(
        x.pow(-1.0).unwrap().to_vec::<f32>().unwrap(),
        vec![0.5, 1.0 / 3.0]
    );
    let f = Tensor::new(&[2f32], device).unwrap();
    assert_eq!(f.pow(-1).unwrap().to_vec::<f32>().unwrap(), vec![0.5]);
}
test_device!(
    integer_to_a_negative_power_is_an_error,
    integer_to_a_negative_power_is_an_error
);

fn values_that_overflow_the_dtype_are_errors(device: &Device) {
    let cases: &[(f64, DType, &str)] = &[
        (1e30, DType::I32, "int32_t"),
        (300.0, DType::U8, "uint8_t"),
        (f64::NAN, DType::I64, "int64_t"),
        (f64::INFINITY, DType::I32, "int32_t"),
        (1e39, DType::F32, "float"),
        (1e5, DType::F16, "Half"),
        (9.3e18, DType::I64, "int64_t"),
    ];
    for &(v, dt, ty) in cases {
        let e = Tensor::full([2], v, (device, dt)).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("value cannot be converted to type") && msg.contains(ty),
            "{v} as {dt}: {msg}"
        );
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let t = Tensor::zeros([2], (device, dt)).unwrap();
        assert!(t.fill_(v).is_err(), "fill_ {v} as {dt}");
        assert!(
            Tensor::scalar(v, (device, dt)).is_err(),
            "scalar {v} as {dt}"
        );
    }
    assert!(Tensor::full([1], 300i64, (device, DType::U8)).is_err());
    assert!(Tensor::full([1], 1i64 << 40, (device, DType::I32)).is_err());
    // What PyTorch accepts: truncation, u8's negative wrap, inf and NaN into floats, bool.
    let ok = |v: f64, dt: DType| Tensor::full([1], v, (device, dt)).unwrap();
    assert_eq!(ok(2.5, DType::I32).to_vec::<i32>().unwrap(), vec![2]);
    ok(-1.0, DType::U8);
    assert_eq!(ok(255.0, DType::U8).to_vec::<u8>().unwrap(), vec![255]);
    assert!(ok(f64::INFINITY, DType::F16).to_vec::<f32>().unwrap()[0].is_infinite());
    assert!(ok(f64::NAN, DType::F32).to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(ok(7.0, DType::Bool).to_vec::<bool>().unwrap(), vec![true]);
    assert_eq!(
        Tensor::full([1], i64::MAX, (device, DType::I64))
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![i64::MAX]
    );
}
test_device!(
    values_that_overflow_the_dtype_are_errors,
    values_that_overflow_the_dtype_are_errors
);

fn integer_matmul_computes(device: &Device) {
    let a = Tensor::arange(0, 6, device)
        .unwrap()
        .reshape([2, 3])
        .unwrap();
    let b = Tensor::arange(0, 12, device)
        .unwrap()
        .reshape([3, 4])
        .unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.dtype(), DType::I64);
    assert_eq!(
        c.to_vec2::<i64>().unwrap(),
        vec![vec![20, 23, 26, 29], vec![56, 68, 80, 92]]
    );
    // Batched, broadcast, vector forms and other integer dtypes agree with the CPU's i64
    // product (values small enough that u8 does not wrap).
    let range = |a: i64, b: i64, shape: &[usize]| {
        Tensor::arange(a, b, device)
            .unwrap()
            .reshape(shape.to_vec())
            .unwrap()
    };
    for (dt, x, y) in [
        (
            DType::I64,
            range(-20, 28, &[2, 4, 6]),
            range(0, 30, &[6, 5]),
        ),
        (
            DType::I32,
            range(-20, 28, &[2, 4, 6]),
            range(0, 30, &[6, 5]),
        ),
        (DType::U8, range(0, 8, &[2, 2, 2]), range(0, 6, &[2, 3])),
    ] {
        let want = x.cpu().unwrap().matmul(&y.cpu().unwrap()).unwrap();
        let (x, y) = (x.to_dtype(dt).unwrap(), y.to_dtype(dt).unwrap());
        let got = x.matmul(&y).unwrap();
        assert_eq!(got.dtype(), dt);
        assert_eq!(
            got.to_vec::<i64>().unwrap(),
            want.to_vec::<i64>().unwrap(),
            "{dt}"
        );
    }
    let v = Tensor::arange(0, 6, device).unwrap();
    assert_eq!(v.matmul(&v).unwrap().item::<i64>().unwrap(), 55);
    let e = Tensor::zeros([2, 0], (device, DType::I64)).unwrap();
    let z = e
        .matmul(&Tensor::zeros([0, 3], (device, DType::I64)).unwrap())
        .unwrap();
    assert_eq!(z.to_vec::<i64>().unwrap(), vec![0; 6]);
}
test_device!(integer_matmul_computes, integer_matmul_computes);

fn huge_host_materialisations_are_oom_errors(device: &Device) {
    // 2^46 f32 elements = 256 TiB: beyond the 128 TiB address space of any host (whatever
    // its overcommit policy), and a broadcast view costs nothing.
    let x = Tensor::ones([1], (device, DType::F32))
        .unwrap()
        .expand([1usize << 46])
        .unwrap();
    let e = x.to_vec::<f32>().unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let e = x.to_vec::<f64>().unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let e = x.contiguous().unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let e = x
        .to_device(Device::Cpu)
        .and_then(|t| t.contiguous())
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let m = Tensor::ones([1, 1], (device, DType::F32))
        .unwrap()
        .expand([1usize << 23, 1usize << 23])
        .unwrap();
    assert!(m.to_vec2::<f32>().unwrap_err().is_out_of_memory());
    // Still usable afterwards.
    assert_eq!(
        x.narrow(0, 0, 2).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 1.0]
    );
}
test_device!(
    huge_host_materialisations_are_oom_errors,
    huge_host_materialisations_are_oom_errors
);
