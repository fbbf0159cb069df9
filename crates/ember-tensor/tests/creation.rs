#![allow(clippy::unwrap_used)]
//! Creation, reading back, casts and `Display`.

use ember_tensor::{DType, Device, Scalar, Tensor, TensorError};
use half::{bf16, f16};

const CPU: Device = Device::Cpu;

#[test]
fn from_vec_and_read_back() {
    let t = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], CPU).unwrap();
    assert_eq!(t.dims(), &[2, 3]);
    assert_eq!(t.strides(), &[3, 1]);
    assert_eq!((t.rank(), t.numel(), t.storage_offset()), (2, 6, 0));
    assert_eq!(
        t.to_vec2::<f32>().unwrap(),
        vec![vec![1., 2., 3.], vec![4., 5., 6.]]
    );
    // Another dtype is converted as `to_dtype` converts (PyTorch's `x.long().tolist()`).
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(t.to_vec::<f64>().unwrap(), vec![1., 2., 3., 4., 5., 6.]);
    assert!(matches!(
        Tensor::from_vec(vec![1f32; 5], [2, 3], CPU)
            .unwrap_err()
            .downcast_ref::<TensorError>(),
        Some(TensorError::ElementCount { numel: 5, .. })
    ));
    assert!(t.to_vec3::<f32>().is_err());
    let u = t.reshape([1, 2, 3]).unwrap();
    assert_eq!(u.to_vec3::<f32>().unwrap()[0][1], vec![4., 5., 6.]);
}

#[test]
fn item_and_scalar() {
    let s = Tensor::scalar(2.5f64, CPU).unwrap();
    assert_eq!(s.rank(), 0);
    assert_eq!(s.item::<f64>().unwrap(), 2.5);
    assert_eq!(s.item::<f32>().unwrap(), 2.5);
    assert_eq!(s.item::<i64>().unwrap(), 2);
    let e = Tensor::ones([2, 3], ()).unwrap().item::<f32>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "item: a Tensor with 6 elements cannot be converted to Scalar"
    );
    assert_eq!(
        Tensor::full([1], 7, ()).unwrap().to_scalar().unwrap(),
        Scalar::Int(7)
    );
}

#[test]
fn constants_and_defaults() {
    assert_eq!(Tensor::zeros([2], ()).unwrap().dtype(), DType::F32);
    assert_eq!(Tensor::full([2], 3, ()).unwrap().dtype(), DType::I64);
    assert_eq!(
        Tensor::full([2], true, ())
            .unwrap()
            .to_vec::<bool>()
            .unwrap(),
        vec![true, true]
    );
    assert_eq!(Tensor::full([2], 1.5, ()).unwrap().dtype(), DType::F32);
    let h = Tensor::ones([3], DType::F16).unwrap();
    assert_eq!(h.to_vec::<f16>().unwrap(), vec![f16::ONE; 3]);
    let e = Tensor::empty([0, 4], DType::Bf16).unwrap();
    assert_eq!((e.numel(), e.dtype()), (0, DType::Bf16));
    let like = h.full_like(2).unwrap();
    assert_eq!((like.dtype(), like.dims()), (DType::F16, vec![3usize]));
    assert_eq!(
        h.zeros_like().unwrap().to_vec::<f16>().unwrap(),
        vec![f16::ZERO; 3]
    );
    assert_eq!(h.ones_like().unwrap().dtype(), DType::F16);
    assert_eq!(h.empty_like().unwrap().dims(), &[3]);
}

#[test]
fn arange_and_linspace_follow_pytorch() {
    assert_eq!(
        Tensor::arange(0, 5, ()).unwrap().to_vec::<i64>().unwrap(),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(
        Tensor::arange_step(1, 10, 3, ())
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![1, 4, 7]
    );
    assert_eq!(
        Tensor::arange_step(5, 0, -2, ())
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![5, 3, 1]
    );
    // float: ceil((1 - 0) / 0.3) = 4 values
    let f = Tensor::arange_step(0.0, 1.0, 0.3, ()).unwrap();
    assert_eq!((f.dtype(), f.numel()), (DType::F32, 4));
    assert_eq!(
        Tensor::arange(0, 3, DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap(),
        vec![0., 1., 2.]
    );
    assert!(Tensor::arange_step(0, 5, 0, ()).is_err());
    assert!(Tensor::arange_step(0, 5, -1, ()).is_err());
    assert!(Tensor::arange(0.0, f64::INFINITY, ()).is_err());
    assert_eq!(Tensor::arange(3, 3, ()).unwrap().numel(), 0);
    let l = Tensor::linspace(0.0, 1.0, 5, ()).unwrap();
    assert_eq!(l.to_vec::<f32>().unwrap(), vec![0., 0.25, 0.5, 0.75, 1.]);
    assert_eq!(
        Tensor::linspace(2.0, 3.0, 1, ())
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![2.]
    );
    assert_eq!(Tensor::linspace(2.0, 3.0, 0, ()).unwrap().numel(), 0);
}

#[test]
fn eye() {
    let e = Tensor::eye(3, DType::I32).unwrap();
    assert_eq!(
        e.to_vec2::<i32>().unwrap(),
        vec![vec![1, 0, 0], vec![0, 1, 0], vec![0, 0, 1]]
    );
    let r = Tensor::eye_rect(2, 3, ()).unwrap();
    assert_eq!(
        r.to_vec2::<f32>().unwrap(),
        vec![vec![1., 0., 0.], vec![0., 1., 0.]]
    );
    assert_eq!(Tensor::eye_rect(2, 0, ()).unwrap().numel(), 0);
}

#[test]
fn casts_round_and_truncate_as_pytorch() {
    let t = Tensor::new(&[-2.7f32, -0.5, 0.0, 0.5, 2.7, f32::NAN], CPU).unwrap();
    assert_eq!(
        t.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![-2, 0, 0, 0, 2, 0]
    );
    assert_eq!(
        t.to_dtype(DType::Bool).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, false, true, true, true]
    );
    let u = Tensor::new(&[-1.0f64, 256.0, 3.9], CPU).unwrap();
    assert_eq!(
        u.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(),
        vec![255, 0, 3]
    );
    // ties to even into bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    let h = Tensor::new(&[1.0f32 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)], CPU).unwrap();
    assert_eq!(
        h.to_dtype(DType::Bf16).unwrap().to_vec::<bf16>().unwrap(),
        vec![bf16::from_f32(1.0), bf16::from_f32(1.0 + 2f32.powi(-6))]
    );
    let big = Tensor::new(&[i64::MAX, -1], CPU).unwrap();
    assert_eq!(
        big.to_dtype(DType::I32).unwrap().to_vec::<i32>().unwrap(),
        vec![-1, -1]
    );
    assert_eq!(
        big.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
        vec![i64::MAX as f64, -1.]
    );
    // every pair of dtypes converts
    for a in ember_tensor::ALL_DTYPES {
        let x = Tensor::arange(0, 4, a).unwrap();
        for b in ember_tensor::ALL_DTYPES {
            let y = x
                .to_dtype(b)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            let expect: Vec<f64> = if a == DType::Bool || b == DType::Bool {
                vec![0., 1., 1., 1.]
            } else {
                vec![0., 1., 2., 3.]
            };
            assert_eq!(y, expect, "{a} -> {b}");
        }
    }
}

#[test]
fn devices() {
    let t = Tensor::ones([2], ()).unwrap();
    let same = t.to_device(CPU).unwrap();
    assert!(same.shares_storage(&t));
    assert!(t.cpu().unwrap().shares_storage(&t));
    // CUDA targets work where CUDA (or the emulator, EMBER_CUDA_EMULATOR=N) is available,
    // and are errors naming the device otherwise.
    let cuda = ember_device::cuda::is_available();
    if cuda {
        assert_eq!(t.cuda().unwrap().device(), Device::Cuda(0));
        assert_eq!(
            Tensor::zeros([2], Device::Cuda(0))
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![0.0, 0.0]
        );
    } else {
        let e = t.cuda().unwrap_err().to_string();
        assert!(e.contains("cuda:0"), "{e}");
        assert!(Tensor::zeros([2], Device::Cuda(0)).is_err());
    }
    assert_eq!(t.to((&CPU, DType::F64)).unwrap().dtype(), DType::F64);
    assert!(t.to("cpu").unwrap().shares_storage(&t));
    assert!(t.to(DType::F32).unwrap().shares_storage(&t));
    if cuda {
        let h = t.to(("cuda:1", DType::F16)).unwrap();
        assert_eq!((h.device(), h.dtype()), (Device::Cuda(1), DType::F16));
    } else {
        let e = t.to("cuda:0").unwrap_err().to_string();
        assert!(e.contains("cuda:0"), "{e}");
        let e = t.to(("cuda:1", DType::F16)).unwrap_err().to_string();
        assert!(e.contains("cuda:1"), "{e}");
    }
    let e = t.to("cuda:99").unwrap_err().to_string();
    assert!(e.contains("99"), "{e}");
    let e = t.to("tpu").unwrap_err().to_string();
    assert!(e.contains("tpu"), "{e}");
}

fn show(t: &Tensor) -> String {
    t.to_string()
}

#[test]
fn display_like_pytorch() {
    let f = |v: &[f32], s: &[usize]| Tensor::from_slice(v, s, CPU).unwrap();
    assert_eq!(
        show(&Tensor::ones([1, 3], ()).unwrap()),
        "tensor([[1., 1., 1.]])"
    );
    assert_eq!(
        show(&Tensor::new(&[1i64, 2, 3], CPU).unwrap()),
        "tensor([1, 2, 3])"
    );
    assert_eq!(
        show(&Tensor::new(&[true, false], CPU).unwrap()),
        "tensor([ True, False])"
    );
    assert_eq!(show(&f(&[1.5, 2.25], &[2])), "tensor([1.5000, 2.2500])");
    assert_eq!(show(&f(&[-1.0, 0.5], &[2])), "tensor([-1.0000,  0.5000])");
    assert_eq!(
        show(&f(&[1e-5, 1.0], &[2])),
        "tensor([1.0000e-05, 1.0000e+00])"
    );
    assert_eq!(
        show(&f(&[100000.0, 1.0], &[2])),
        "tensor([1.0000e+05, 1.0000e+00])"
    );
    assert_eq!(
        show(&f(&[f32::NAN, 1.0, f32::NEG_INFINITY], &[3])),
        "tensor([nan, 1., -inf])"
    );
    assert_eq!(show(&f(&[0.0, 0.0], &[2])), "tensor([0., 0.])");
    assert_eq!(show(&Tensor::scalar(3f32, CPU).unwrap()), "tensor(3.)");
    assert_eq!(
        show(&Tensor::scalar(3i32, CPU).unwrap()),
        "tensor(3, dtype=torch.int32)"
    );
    assert_eq!(
        show(&Tensor::new(&[1f64, 2.], CPU).unwrap()),
        "tensor([1., 2.], dtype=torch.float64)"
    );
    assert_eq!(show(&Tensor::zeros([0], ()).unwrap()), "tensor([])");
    assert_eq!(
        show(&Tensor::zeros([0, 3], ()).unwrap()),
        "tensor([], size=(0, 3))"
    );
    assert_eq!(
        show(&Tensor::zeros([0], DType::I64).unwrap()),
        "tensor([], dtype=torch.int64)"
    );
    assert_eq!(
        show(
            &Tensor::arange(0, 6, DType::F32)
                .unwrap()
                .reshape([2, 3])
                .unwrap()
        ),
        "tensor([[0., 1., 2.],\n        [3., 4., 5.]])"
    );
    assert_eq!(
        show(&Tensor::zeros([2, 1, 2], ()).unwrap()),
        "tensor([[[0., 0.]],\n\n        [[0., 0.]]])"
    );
    assert_eq!(
        show(&Tensor::arange(0, 1001, ()).unwrap()),
        "tensor([   0,    1,    2,  ...,  998,  999, 1000])"
    );
    assert_eq!(
        show(&Tensor::ones([3], DType::F16).unwrap()),
        "tensor([1., 1., 1.], dtype=torch.float16)"
    );
}

#[test]
fn display_wraps_long_rows_and_summarises_matrices() {
    let t = Tensor::arange(0, 30, DType::F32).unwrap().div(7).unwrap();
    let s = show(&t);
    // width 7 ("4.1429") + 2 per element: (80 - 7) / 8 = 9 per line
    let first = s.lines().next().unwrap();
    assert_eq!(first.matches(',').count(), 9, "{s}");
    assert!(s.lines().nth(1).unwrap().starts_with("        "), "{s}");
    let m = show(&Tensor::zeros([100, 100], ()).unwrap());
    assert!(m.contains("...,"), "{m}");
    assert_eq!(m.lines().count(), 7, "{m}");
}
