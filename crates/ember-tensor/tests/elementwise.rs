#![allow(clippy::unwrap_used)]
//! Elementwise ops: broadcasting, promotion, values against f64 references, in-place; on
//! every device (`ember_testing::test_device!`: `cpu` and the emulated or real `cuda:0`),
//! the CPU's parallel paths on the CPU.

use ember_tensor::{DType, Device, Scalar, Tensor, TensorError};
use ember_testing::test_device;
use half::f16;

fn f32s(v: &[f32], s: &[usize], device: &Device) -> Tensor {
    Tensor::from_slice(v, s, device).unwrap()
}

fn broadcasting_and_promotion(device: &Device) {
    let a = Tensor::arange(0, 3, device).unwrap(); // i64 [3]
    let b = Tensor::ones([2, 1], (device, DType::F16)).unwrap();
    let c = a.add(&b).unwrap();
    assert_eq!((c.dims(), c.dtype()), (vec![2usize, 3], DType::F16));
    assert_eq!(
        c.to_vec2::<f16>().unwrap()[1],
        vec![f16::from_f32(1.), f16::from_f32(2.), f16::from_f32(3.)]
    );
    assert_eq!(a.add(0.5).unwrap().dtype(), DType::F32);
    assert_eq!(a.mul(2).unwrap().to_vec::<i64>().unwrap(), vec![0, 2, 4]);
    let u8t = Tensor::new(&[250u8, 10], device).unwrap();
    assert_eq!(u8t.add(10).unwrap().to_vec::<u8>().unwrap(), vec![4, 20]); // stays u8, wraps
    let bools = Tensor::new(&[true, false], device).unwrap();
    assert_eq!(bools.add(1).unwrap().dtype(), DType::I64);
    assert_eq!(
        bools.add(&bools).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false]
    );
    assert!(matches!(
        bools.sub(&bools).unwrap_err().downcast_ref::<TensorError>(),
        Some(TensorError::UnsupportedDType { .. })
    ));
    // a 0-dim f64 tensor does not promote an f32 tensor (same category)
    let s = Tensor::scalar(2.0f64, device).unwrap();
    assert_eq!(
        f32s(&[1., 2.], &[2], device).mul(&s).unwrap().dtype(),
        DType::F32
    );
    let e = f32s(&[1.; 6], &[2, 3], device)
        .add(&f32s(&[1.; 4], &[4], device))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "add: shapes [2, 3] and [4] cannot be broadcast"
    );
}
test_device!(broadcasting_and_promotion, broadcasting_and_promotion);

fn true_division_and_pow(device: &Device) {
    let a = Tensor::new(&[7i64, -7, 1], device).unwrap();
    let b = Tensor::new(&[2i64, 2, 0], device).unwrap();
    let q = a.div(&b).unwrap();
    assert_eq!(q.dtype(), DType::F32);
    assert_eq!(q.to_vec::<f32>().unwrap(), vec![3.5, -3.5, f32::INFINITY]);
    assert_eq!(a.pow(2).unwrap().to_vec::<i64>().unwrap(), vec![49, 49, 1]);
    // PyTorch: "Integers to negative integer powers are not allowed."
    let e = a.pow(-1).unwrap_err().to_string();
    assert!(e.contains("negative integer powers"), "{e}");
    assert_eq!(a.pow(0.5).unwrap().dtype(), DType::F32);
    let f = f32s(&[4., 9.], &[2], device);
    assert_eq!(f.pow(0.5).unwrap().to_vec::<f32>().unwrap(), vec![2., 3.]);
    assert_eq!(f.div(2).unwrap().to_vec::<f32>().unwrap(), vec![2., 4.5]);
}
test_device!(true_division_and_pow, true_division_and_pow);

fn comparisons_logical_where(device: &Device) {
    let a = f32s(&[1., 2., f32::NAN], &[3], device);
    assert_eq!(
        a.gt(1.5).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, false]
    );
    assert_eq!(
        a.eq(&a).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, false]
    );
    assert_eq!(
        a.ne(&a).unwrap().to_vec::<bool>().unwrap(),
        vec![false, false, true]
    );
    assert_eq!(
        a.le(2).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, false]
    );
    let i = Tensor::new(&[0i64, 3, -1], device).unwrap();
    assert_eq!(
        i.lt(&a).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false]
    );
    assert_eq!(
        i.ge(0).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, false]
    );
    assert_eq!(
        i.logical_and(&a).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, true]
    );
    assert_eq!(
        i.logical_or(0).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, true]
    );
    assert_eq!(
        i.logical_xor(true).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false]
    );
    assert_eq!(
        i.logical_not().unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false]
    );
    let w = ember_tensor::r#where(&i.gt(0).unwrap(), &i, 0.5).unwrap();
    assert_eq!(w.dtype(), DType::F32);
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.5, 3., 0.5]);
    let e = ember_tensor::r#where(&i, &i, &i).unwrap_err().to_string();
    assert_eq!(e, "where: expected dtype torch.bool, but found torch.int64");
    let cond = Tensor::new(&[true, false], device)
        .unwrap()
        .reshape([2, 1])
        .unwrap();
    assert_eq!(ember_tensor::r#where(&cond, 1, &i).unwrap().dims(), &[2, 3]);
}
test_device!(comparisons_logical_where, comparisons_logical_where);

fn check_unary(name: &str, t: &Tensor, f: impl Fn(f64) -> f64, tol: f64) {
    let xs = t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let got = match name {
        "neg" => t.neg(),
        "abs" => t.abs(),
        "sign" => t.sign(),
        "exp" => t.exp(),
        "log" => t.log(),
        "log1p" => t.log1p(),
        "sqrt" => t.sqrt(),
        "rsqrt" => t.rsqrt(),
        "sin" => t.sin(),
        "cos" => t.cos(),
        "tanh" => t.tanh(),
        "sigmoid" => t.sigmoid(),
        "reciprocal" => t.reciprocal(),
        "relu" => t.relu(),
        "gelu" => t.gelu(()),
        "gelu_tanh" => t.gelu(ember_tensor::Approximate::Tanh),
        "silu" => t.silu(),
        "softplus" => t.softplus(),
        _ => unreachable!(),
    }
    .unwrap()
    .to_dtype(DType::F64)
    .unwrap()
    .to_vec::<f64>()
    .unwrap();
    for (x, g) in xs.iter().zip(&got) {
        let e = f(*x);
        let ok = (e.is_nan() && g.is_nan()) || e == *g || (e - g).abs() <= tol * e.abs().max(1.0);
        assert!(ok, "{name}({x}) = {g}, expected {e}");
    }
}

fn unary_against_f64_references(device: &Device) {
    let vals: Vec<f32> = (-40..=40).map(|i| i as f32 * 0.37).collect();
    let t = f32s(&vals, &[vals.len()], device);
    let pos = t.abs().unwrap().add(0.01).unwrap();
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let erf_ref = |x: f64| {
        // Abramowitz-Stegun 7.1.26 is too coarse; use the series in f64 for |x| < 6.
        let mut sum = x;
        let mut term = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        if x.abs() > 5.0 {
            x.signum()
        } else {
            sum * 2.0 / std::f64::consts::PI.sqrt()
        }
    };
    let tol = 2e-6;
    check_unary("neg", &t, |x| -x, 0.0);
    check_unary("abs", &t, f64::abs, 0.0);
    check_unary(
        "sign",
        &t,
        |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        },
        0.0,
    );
    check_unary("exp", &t, f64::exp, tol);
    check_unary("log", &pos, f64::ln, tol);
    check_unary("log1p", &pos, f64::ln_1p, tol);
    check_unary("sqrt", &pos, f64::sqrt, tol);
    check_unary("rsqrt", &pos, |x| 1.0 / x.sqrt(), tol);
    check_unary("sin", &t, f64::sin, tol);
    check_unary("cos", &t, f64::cos, tol);
    check_unary("tanh", &t, f64::tanh, tol);
    check_unary("sigmoid", &t, sig, tol);
    check_unary("reciprocal", &pos, |x| 1.0 / x, tol);
    check_unary("relu", &t, |x| x.max(0.0), 0.0);
    check_unary(
        "gelu",
        &t,
        |x| 0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt())),
        tol,
    );
    let k = (2.0 / std::f64::consts::PI).sqrt();
    check_unary(
        "gelu_tanh",
        &t,
        |x| 0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh()),
        tol,
    );
    check_unary("silu", &t, |x| x * sig(x), tol);
    check_unary(
        "softplus",
        &t,
        |x| if x > 20.0 { x } else { x.exp().ln_1p() },
        tol,
    );
    // f64 inputs are exact to f64 precision
    let d = t.to_dtype(DType::F64).unwrap();
    check_unary("exp", &d, f64::exp, 1e-15);
    // the reference series is accurate to ~1e-13 for |x| <= 4
    let d4 = d
        .clamp(Some(Scalar::Int(-4)), Some(Scalar::Int(4)))
        .unwrap();
    check_unary(
        "gelu",
        &d4,
        |x| 0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt())),
        1e-12,
    );
    // f16 computes in f32 and rounds once
    let h = t.to_dtype(DType::F16).unwrap();
    check_unary("tanh", &h, |x| f16::from_f64(x.tanh()).to_f64(), 1e-3);
}
test_device!(unary_against_f64_references, unary_against_f64_references);

fn unary_dtype_rules(device: &Device) {
    let i = Tensor::new(&[-2i64, 0, 3], device).unwrap();
    assert_eq!(i.exp().unwrap().dtype(), DType::F32);
    assert_eq!(i.neg().unwrap().to_vec::<i64>().unwrap(), vec![2, 0, -3]);
    assert_eq!(i.relu().unwrap().to_vec::<i64>().unwrap(), vec![0, 0, 3]);
    assert_eq!(i.sign().unwrap().to_vec::<i64>().unwrap(), vec![-1, 0, 1]);
    assert_eq!(i.abs().unwrap().to_vec::<i64>().unwrap(), vec![2, 0, 3]);
    assert!(i.gelu(()).is_err());
    let b = Tensor::new(&[true], device).unwrap();
    assert_eq!(
        b.neg().unwrap_err().to_string(),
        "neg: not implemented for torch.bool"
    );
    assert_eq!(b.sign().unwrap().dtype(), DType::Bool);
    assert_eq!(
        f32s(&[f32::NAN, -1.], &[2], device)
            .relu()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[1],
        0.
    );
    assert!(
        f32s(&[f32::NAN], &[1], device)
            .relu()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[0]
            .is_nan()
    );
}
test_device!(unary_dtype_rules, unary_dtype_rules);

fn clamp_rules(device: &Device) {
    let t = f32s(&[-2., 0.5, 3., f32::NAN], &[4], device);
    let c = t
        .clamp(Some(Scalar::Float(-1.)), Some(Scalar::Float(1.)))
        .unwrap();
    let v = c.to_vec::<f32>().unwrap();
    assert_eq!(&v[..3], &[-1., 0.5, 1.]);
    assert!(v[3].is_nan());
    assert!(t.clamp((), ()).is_err());
    let i = Tensor::new(&[-5i64, 5], device).unwrap();
    assert_eq!(
        i.clamp_min(0.5).unwrap().to_vec::<f32>().unwrap(),
        vec![0.5, 5.]
    );
    assert_eq!(
        i.clamp_max(2).unwrap().to_vec::<i64>().unwrap(),
        vec![-5, 2]
    );
    // min > max: max wins, as PyTorch
    assert_eq!(
        i.clamp(Some(Scalar::Int(3)), Some(Scalar::Int(1)))
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![1, 1]
    );
}
test_device!(clamp_rules, clamp_rules);

fn in_place_ops(device: &Device) {
    let t = f32s(&[1., 2., 3., 4.], &[2, 2], device);
    let v0 = t.version();
    t.add_(1)
        .unwrap()
        .mul_(&f32s(&[1., 10.], &[2], device))
        .unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![2., 30., 4., 50.]);
    assert_eq!(t.version(), v0 + 2);
    t.t()
        .unwrap()
        .sub_(&f32s(&[1., 2.], &[2, 1], device))
        .unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1., 28., 3., 48.]);
    t.div_(2)
        .unwrap()
        .clamp_(Some(Scalar::Int(1)), Some(Scalar::Int(20)))
        .unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1., 14., 1.5, 20.]);
    // Above the parallel threshold: a scalar operand (read once, the flat loop), through a
    // transposed view too, and `where` with a scalar branch; against plain loops.
    let n = 300;
    let v: Vec<f32> = (0..n * n).map(|i| (i % 97) as f32 - 40.0).collect();
    let big = f32s(&v, &[n, n], device);
    big.mul_(0.5).unwrap();
    big.t().unwrap().add_(1).unwrap();
    let want: Vec<f32> = v.iter().map(|x| x * 0.5 + 1.0).collect();
    assert_eq!(big.to_vec::<f32>().unwrap(), want);
    let kept = ember_tensor::r#where(&big.gt(0).unwrap(), &big, 0).unwrap();
    let want: Vec<f32> = want
        .iter()
        .map(|&x| if x > 0.0 { x } else { 0.0 })
        .collect();
    assert_eq!(kept.to_vec::<f32>().unwrap(), want);
    let i = Tensor::new(&[1i64, 2], device).unwrap();
    let e = i.add_(0.5).unwrap_err();
    assert_eq!(
        e.to_string(),
        "add: result type torch.float32 can't be cast to the desired output type torch.int64"
    );
    assert!(i.div_(2).is_err());
    assert!(i.add_(&f32s(&[1.; 6], &[2, 3], device)).is_err());
    i.copy_(&f32s(&[7.9, -1.5], &[2], device)).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![7, -1]);
    i.zero_().unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 0]);
    assert!(Tensor::new(&[true], device).unwrap().sub_(true).is_err());
}
test_device!(in_place_ops, in_place_ops);

fn std_operators(device: &Device) {
    let a = f32s(&[1., 2.], &[2], device);
    let b = f32s(&[3., 4.], &[2], device);
    assert_eq!((&a + &b).unwrap().to_vec::<f32>().unwrap(), vec![4., 6.]);
    assert_eq!((&a - 1.0).unwrap().to_vec::<f32>().unwrap(), vec![0., 1.]);
    assert_eq!((&a * &b).unwrap().to_vec::<f32>().unwrap(), vec![3., 8.]);
    assert_eq!(
        (a.clone() / 2).unwrap().to_vec::<f32>().unwrap(),
        vec![0.5, 1.]
    );
    assert_eq!((-&a).unwrap().to_vec::<f32>().unwrap(), vec![-1., -2.]);
    let chained = ((&a + &b).unwrap() * &a).unwrap();
    assert_eq!(chained.to_vec::<f32>().unwrap(), vec![4., 12.]);
}
test_device!(std_operators, std_operators);

#[test]
fn large_tensors_take_the_parallel_paths() {
    let n = 200_000usize;
    let a = Tensor::arange(0, n as i64, DType::F32)
        .unwrap()
        .reshape([400, 500])
        .unwrap();
    let b = a.t().unwrap(); // strided
    let s = a.add(&b.t().unwrap()).unwrap();
    let v = s.to_vec::<f32>().unwrap();
    assert!(v.iter().enumerate().all(|(i, &x)| x == 2.0 * i as f32));
    let e = b
        .mul(1e-5)
        .unwrap()
        .exp()
        .unwrap()
        .log()
        .unwrap()
        .contiguous()
        .unwrap();
    let r = e
        .t()
        .unwrap()
        .sub(&a.mul(1e-5).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap();
    assert!(r.item::<f32>().unwrap() <= 1e-6, "{r}");
    let c = a.mul(&Tensor::arange(0, 500, DType::F32).unwrap()).unwrap();
    assert_eq!(
        c.select(0, 1)
            .unwrap()
            .select(0, 2)
            .unwrap()
            .item::<f32>()
            .unwrap(),
        502.0 * 2.0
    );
}

/// Rows of 333 over 301 rows: the parallel pieces start mid-row, so the row-at-a-time path
/// of broadcast operands (`x + bias`, `x * col`, a sliced view) is checked at every element.
#[test]
fn broadcast_rows_split_across_threads_match_a_naive_loop() {
    let (rows, cols) = (301usize, 333usize);
    let x: Vec<f32> = (0..rows * cols).map(|i| (i % 1009) as f32 * 0.25).collect();
    let bias: Vec<f32> = (0..cols).map(|j| j as f32 - 100.0).collect();
    let col: Vec<f32> = (0..rows).map(|i| (i % 7) as f32 - 3.0).collect();
    for dt in [DType::F32, DType::Bf16, DType::F64] {
        let tx = f32s(&x, &[rows, cols], &Device::Cpu).to_dtype(dt).unwrap();
        let tb = f32s(&bias, &[cols], &Device::Cpu).to_dtype(dt).unwrap();
        let tc = f32s(&col, &[rows, 1], &Device::Cpu).to_dtype(dt).unwrap();
        let round = |v: f32| {
            Tensor::scalar(v, Device::Cpu)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
                .item::<f64>()
                .unwrap()
        };
        let (xr, br, cr): (Vec<f64>, Vec<f64>, Vec<f64>) = (
            x.iter().map(|&v| round(v)).collect(),
            bias.iter().map(|&v| round(v)).collect(),
            col.iter().map(|&v| round(v)).collect(),
        );
        let check = |t: Tensor, want: &dyn Fn(usize, usize) -> f64, what: &str| {
            let got = t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            let w = t.dims()[1];
            for (k, &g) in got.iter().enumerate() {
                let (i, j) = (k / w, k % w);
                let want = Tensor::scalar(want(i, j), Device::Cpu)
                    .unwrap()
                    .to_dtype(dt)
                    .unwrap()
                    .item::<f64>()
                    .unwrap();
                assert_eq!(g, want, "{dt:?} {what} at [{i}, {j}]");
            }
        };
        check(
            tx.add(&tb).unwrap(),
            &|i, j| xr[i * cols + j] + br[j],
            "x + bias",
        );
        check(
            tb.sub(&tx).unwrap(),
            &|i, j| br[j] - xr[i * cols + j],
            "bias - x",
        );
        check(
            tx.mul(&tc).unwrap(),
            &|i, j| xr[i * cols + j] * cr[i],
            "x * col",
        );
        check(tc.add(&tb).unwrap(), &|i, j| cr[i] + br[j], "col + bias");
        // Rows that are contiguous but apart: columns 5.. of x.
        let v = tx.narrow(1, 5, cols - 5).unwrap();
        let bv = tb.narrow(0, 5, cols - 5).unwrap();
        check(
            v.add(&bv).unwrap(),
            &|i, j| xr[i * cols + j + 5] + br[j + 5],
            "sliced",
        );
    }
}

#[test]
fn device_mismatch_message() {
    let e = TensorError::DeviceMismatch {
        first: Device::Cuda(0),
        second: Device::Cpu,
    };
    assert_eq!(
        e.to_string(),
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    );
}
