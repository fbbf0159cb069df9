#![allow(clippy::unwrap_used)]
//! Reductions, softmax, against hand-computed and f64 references; the edge cases on every
//! device (`ember_testing::test_device!`: `cpu` and the emulated or real `cuda:0`), the
//! CPU's splitting of long reductions across threads on the CPU.

use ember_tensor::{DType, Device, Tensor};
use ember_testing::test_device;

const CPU: Device = Device::Cpu;

fn m23(device: &Device) -> Tensor {
    Tensor::from_slice(&[1f32, 5., 3., 4., 2., 6.], [2, 3], device).unwrap()
}

fn f(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn sum_prod_mean_and_dtypes(device: &Device) {
    let t = m23(device);
    assert_eq!(t.sum_all().unwrap().item::<f32>().unwrap(), 21.);
    assert_eq!(f(&t.sum(0).unwrap()), vec![5., 7., 9.]);
    assert_eq!(f(&t.sum(-1).unwrap()), vec![9., 12.]);
    assert_eq!(t.sum((1, true)).unwrap().dims(), &[2, 1]);
    assert_eq!(t.sum([0, 1]).unwrap().rank(), 0);
    assert_eq!(f(&t.prod(1).unwrap()), vec![15., 48.]);
    assert_eq!(f(&t.mean(0).unwrap()), vec![2.5, 3.5, 4.5]);
    assert_eq!(t.mean_all().unwrap().item::<f32>().unwrap(), 3.5);
    let i = Tensor::new(&[1i32, 2, 3], device).unwrap();
    assert_eq!(i.sum_all().unwrap().dtype(), DType::I64);
    assert_eq!(i.prod_all().unwrap().item::<i64>().unwrap(), 6);
    assert_eq!(
        Tensor::new(&[true, true, false], device)
            .unwrap()
            .sum_all()
            .unwrap()
            .item::<i64>()
            .unwrap(),
        2
    );
    let e = i.mean_all().unwrap_err().to_string();
    assert!(
        e.starts_with("mean: not implemented for torch.int32"),
        "{e}"
    );
    // half precision sums accumulate in f32 and do not overflow on the way
    let h = Tensor::full([4], 60000.0, (device, DType::F16)).unwrap();
    assert_eq!(
        h.mean_all()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .item::<f32>()
            .unwrap(),
        60000.
    );
    // empty
    assert_eq!(
        Tensor::zeros([0, 3], device)
            .unwrap()
            .sum(0)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![0.; 3]
    );
    assert!(
        Tensor::zeros([0], device)
            .unwrap()
            .mean_all()
            .unwrap()
            .item::<f32>()
            .unwrap()
            .is_nan()
    );
    assert_eq!(
        Tensor::zeros([0], device)
            .unwrap()
            .prod_all()
            .unwrap()
            .item::<f32>()
            .unwrap(),
        1.
    );
    assert!(t.sum(2).is_err());
    assert!(t.sum([0, -2]).is_err());
    // scalars reduce over dim 0 / -1
    let s = Tensor::scalar(4f32, device).unwrap();
    assert_eq!(s.sum(0).unwrap().item::<f32>().unwrap(), 4.);
    assert_eq!(s.sum((-1, true)).unwrap().rank(), 0);
}
test_device!(sum_prod_mean_and_dtypes, sum_prod_mean_and_dtypes);

fn max_min_arg(device: &Device) {
    let t = m23(device);
    let (v, i) = t.max_dim(1).unwrap();
    assert_eq!(
        (f(&v), i.to_vec::<i64>().unwrap()),
        (vec![5., 6.], vec![1, 2])
    );
    let (v, i) = t.min_dim((0, true)).unwrap();
    assert_eq!(v.dims(), &[1, 3]);
    assert_eq!(
        (f(&v), i.to_vec::<i64>().unwrap()),
        (vec![1., 2., 3.], vec![0, 1, 0])
    );
    assert_eq!(t.argmax_all().unwrap().item::<i64>().unwrap(), 5);
    assert_eq!(t.argmin_all().unwrap().item::<i64>().unwrap(), 0);
    assert_eq!(t.argmax(0).unwrap().to_vec::<i64>().unwrap(), vec![1, 0, 1]);
    assert_eq!(t.argmin(1).unwrap().to_vec::<i64>().unwrap(), vec![0, 1]);
    assert_eq!(f(&t.amax([0, 1]).unwrap()), vec![6.]);
    assert_eq!(f(&t.amin(1).unwrap()), vec![1., 2.]);
    // ties: first occurrence; NaN wins
    let n = Tensor::new(&[1f32, 3., 3., f32::NAN, 7.], device).unwrap();
    assert_eq!(
        n.narrow(0, 0, 3)
            .unwrap()
            .argmax_all()
            .unwrap()
            .item::<i64>()
            .unwrap(),
        1
    );
    assert!(n.max_all().unwrap().item::<f32>().unwrap().is_nan());
    assert_eq!(n.argmax_all().unwrap().item::<i64>().unwrap(), 3);
    assert_eq!(n.argmin_all().unwrap().item::<i64>().unwrap(), 3);
    let ints = Tensor::new(&[i64::MAX, i64::MAX - 1], device).unwrap();
    assert_eq!(ints.min_all().unwrap().item::<i64>().unwrap(), i64::MAX - 1);
    assert!(Tensor::zeros([0], device).unwrap().max_all().is_err());
    assert!(Tensor::zeros([2, 0], device).unwrap().max_dim(1).is_err());
    assert_eq!(
        Tensor::zeros([2, 0], device)
            .unwrap()
            .max_dim(0)
            .unwrap()
            .0
            .dims(),
        &[0]
    );
}
test_device!(max_min_arg, max_min_arg);

fn var_std_with_correction(device: &Device) {
    let t = m23(device);
    // row 0: 1, 5, 3 -> mean 3, squared deviations 4 + 4 + 0 = 8
    assert_eq!(f(&t.var(1).unwrap()), vec![4., 4.]);
    assert_eq!(
        f(&t.var_correction(1, 0.0).unwrap()),
        vec![8. / 3., 8. / 3.]
    );
    assert_eq!(f(&t.std((1, true)).unwrap()), vec![2., 2.]);
    let all = t.var_all(1.0).unwrap().item::<f32>().unwrap();
    assert!((all - 3.5).abs() < 1e-6);
    assert!((t.std_all(0.0).unwrap().item::<f32>().unwrap() - (35f32 / 12.).sqrt()).abs() < 1e-6);
    assert!(
        Tensor::ones([1], device)
            .unwrap()
            .var_all(1.0)
            .unwrap()
            .item::<f32>()
            .unwrap()
            .is_nan()
    );
    assert!(
        Tensor::ones([2], (device, DType::I64))
            .unwrap()
            .var_all(1.0)
            .is_err()
    );
}
test_device!(var_std_with_correction, var_std_with_correction);

fn logsumexp_and_norm(device: &Device) {
    let t = Tensor::new(&[1000f32, 1000., f32::NEG_INFINITY], device).unwrap();
    let l = t.logsumexp(0).unwrap().item::<f32>().unwrap();
    assert!((l - (1000. + 2f32.ln())).abs() < 1e-3, "{l}");
    let inf = Tensor::new(&[f32::NEG_INFINITY, f32::NEG_INFINITY], device).unwrap();
    assert_eq!(
        inf.logsumexp(0).unwrap().item::<f32>().unwrap(),
        f32::NEG_INFINITY
    );
    let i = Tensor::new(&[0i64, 0], device).unwrap();
    let li = i.logsumexp((0, true)).unwrap();
    assert_eq!(li.dtype(), DType::F32);
    assert!((li.to_vec::<f32>().unwrap()[0] - 2f32.ln()).abs() < 1e-6);
    let v = Tensor::new(&[3f64, -4.], device).unwrap();
    assert_eq!(v.norm_all(2.0).unwrap().item::<f64>().unwrap(), 5.);
    assert_eq!(v.norm_all(1.0).unwrap().item::<f64>().unwrap(), 7.);
    assert_eq!(
        v.norm_all(f64::INFINITY).unwrap().item::<f64>().unwrap(),
        4.
    );
    assert_eq!(v.norm_all(0.0).unwrap().item::<f64>().unwrap(), 2.);
    assert!((v.norm_all(3.0).unwrap().item::<f64>().unwrap() - 91f64.cbrt()).abs() < 1e-12);
    assert_eq!(m23(device).norm(2.0, 0).unwrap().dims(), &[3]);
}
test_device!(logsumexp_and_norm, logsumexp_and_norm);

fn softmax_is_stable(device: &Device) {
    let x = Tensor::new(&[1000f32, 1001., 1002.], device).unwrap();
    let s = f(&x.softmax(0).unwrap());
    let e: Vec<f64> = [0f64, 1., 2.].iter().map(|v| v.exp()).collect();
    let z: f64 = e.iter().sum();
    for (a, b) in s.iter().zip(&e) {
        assert!((*a as f64 - b / z).abs() < 1e-6);
    }
    let ls = f(&x.log_softmax(-1).unwrap());
    for (a, b) in ls.iter().zip(&e) {
        assert!((*a as f64 - (b / z).ln()).abs() < 1e-5);
    }
    let m = Tensor::arange(0, 6, (device, DType::F64))
        .unwrap()
        .reshape([2, 3])
        .unwrap();
    let rows = m
        .softmax(1)
        .unwrap()
        .sum(1)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    assert!(rows.iter().all(|r| (r - 1.0).abs() < 1e-12));
    let cols = m.softmax(0).unwrap();
    assert!(
        (cols.select(0, 0).unwrap().to_vec::<f64>().unwrap()[0] - 1.0 / (1.0 + 3f64.exp())).abs()
            < 1e-12
    );
    assert!(Tensor::arange(0, 3, device).unwrap().softmax(0).is_err());
    let h = x.to_dtype(DType::Bf16).unwrap().softmax(0).unwrap();
    assert_eq!(h.dtype(), DType::Bf16);
}
test_device!(softmax_is_stable, softmax_is_stable);

#[test]
fn large_reductions_split_across_threads() {
    let n = 1 << 20;
    let t = Tensor::ones([n], ()).unwrap();
    assert_eq!(t.sum_all().unwrap().item::<f32>().unwrap(), n as f32);
    let a = Tensor::arange(0, n as i64, ()).unwrap();
    assert_eq!(
        a.sum_all().unwrap().item::<i64>().unwrap(),
        (n as i64) * (n as i64 - 1) / 2
    );
    assert_eq!(a.argmax_all().unwrap().item::<i64>().unwrap(), n as i64 - 1);
    let m = a.reshape([1024, 1024]).unwrap();
    let cols = m.sum(0).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(cols[3], (0..1024).map(|r| r * 1024 + 3).sum::<i64>());
    let rows = m.t().unwrap().sum(0).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(rows[2], (0..1024).map(|c| 2 * 1024 + c).sum::<i64>());
}

/// f32 sums of runs long enough to be cut into pieces across threads, of lengths that leave
/// a partial 4096-element block and a partial 64-lane step, against f64; and the index of a
/// maximum placed in each run's last piece (a piece's `start` offsets its indices).
#[test]
fn long_f32_runs_sum_and_argmax_across_pieces() {
    for n in [4095usize, 4097, 100_003, (1 << 20) + 77] {
        let xs: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 64.0 - 7.0)
            .collect();
        let t = Tensor::from_slice(&xs, [n], CPU).unwrap();
        let want: f64 = xs.iter().map(|&x| x as f64).sum();
        let got = t.sum_all().unwrap().item::<f32>().unwrap() as f64;
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
            "n = {n}: {got} against {want}"
        );
        // Three rows of the same run: a reduction to few outputs, each run split.
        let rows = Tensor::from_slice(&[xs.clone(), xs.clone(), xs].concat(), [3, n], CPU).unwrap();
        let per_row = f(&rows.sum(1).unwrap());
        assert!(
            per_row
                .iter()
                .all(|&r| (r as f64 - want).abs() <= 1e-6 * want.abs().max(1.0))
        );
        let mut ys = vec![0f32; n];
        ys[n - 2] = 1.0;
        let y = Tensor::from_slice(&ys, [n], CPU).unwrap();
        assert_eq!(y.argmax_all().unwrap().item::<i64>().unwrap(), n as i64 - 2);
    }
}
