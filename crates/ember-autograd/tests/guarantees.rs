#![allow(clippy::unwrap_used)]
//! PyTorch's autograd guarantees (issue 26), on `cpu` and the emulated `cuda:0`: hooks and
//! `set_grad` keep a gradient's shape, dtype and device; a second backward through a graph
//! that saved nothing accumulates; an in-place write through a view rebases the base's
//! history (CopySlices), gradchecked.

use ember_autograd::{AutogradError, ErrorKind, GradcheckOptions, Result, Tensor, gradcheck};
use ember_tensor::{DType, Device};
use ember_testing::test_device;

fn leaf(v: &[f64], shape: &[usize], d: &Device) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec(), d)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

test_device!(hook_changing_the_size_is_an_error, |d: &Device| {
    let x = leaf(&[1.0, 2.0, 3.0], &[3], d);
    let y = x.mul(2.0).unwrap();
    let dd = *d;
    y.register_hook(move |_g| Some(Tensor::zeros([2], (&dd, DType::F64)).unwrap()))
        .unwrap();
    let e = y.sum_all().unwrap().backward().unwrap_err();
    assert!(
        e.to_string()
            .contains("hook 'hook' has changed the size of value"),
        "{e}"
    );
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    // On a leaf, of another dtype.
    let x = leaf(&[1.0, 2.0], &[2], d);
    x.register_hook(|g| Some(g.data().to_dtype(DType::F32).unwrap()))
        .unwrap();
    let e = x
        .mul(3.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap_err();
    assert!(e.to_string().contains("changed the type of value"), "{e}");
    assert!(x.grad().is_none());
    // A hook keeping shape, dtype and device still replaces the gradient.
    let x = leaf(&[1.0, 2.0], &[2], d);
    x.register_hook(|g| Some(g.mul(10.0).unwrap())).unwrap();
    x.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![10.0, 10.0]);
});

test_device!(hook_changing_the_device_is_an_error, |d: &Device| {
    if *d == Device::Cpu {
        ember_testing::skip!("a hook moving a gradient to another device needs a CUDA device");
    }
    let x = leaf(&[1.0, 2.0], &[2], d);
    x.register_hook(|g| Some(g.cpu().unwrap())).unwrap();
    let e = x.sum_all().unwrap().backward().unwrap_err();
    assert!(e.to_string().contains("changed the device of value"), "{e}");
});

test_device!(set_grad_checks_dtype_shape_and_device, |d: &Device| {
    let x = leaf(&[1.0, 2.0], &[2], d);
    let g32 = Tensor::ones([2], (d, DType::F32)).unwrap();
    let e = x.set_grad(Some(&g32)).unwrap_err();
    assert!(
        e.to_string()
            .contains("assigned grad has data of a different type"),
        "{e}"
    );
    let g3 = Tensor::ones([3], (d, DType::F64)).unwrap();
    let e = x.set_grad(Some(&g3)).unwrap_err();
    assert!(e.to_string().contains("of a different size"), "{e}");
    if *d != Device::Cpu {
        let gc = Tensor::ones([2], (&Device::Cpu, DType::F64)).unwrap();
        let e = x.set_grad(Some(&gc)).unwrap_err();
        assert!(
            e.to_string().contains("located on a different device"),
            "{e}"
        );
    }
    assert!(x.grad().is_none());
    x.set_grad(Some(&Tensor::ones([2], (d, DType::F64)).unwrap()))
        .unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![1.0, 1.0]);
});

test_device!(
    second_backward_without_saved_tensors_accumulates,
    |d: &Device| {
        let x = leaf(&[1.0, 2.0, 3.0], &[3], d);
        let y = x.add(1.0).unwrap().sum_all().unwrap();
        y.backward().unwrap();
        y.backward().unwrap();
        assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 2.0, 2.0]);
        // A graph that saved tensors refuses, with PyTorch's message.
        let x = leaf(&[1.0, 2.0], &[2], d);
        let y = x.mul(&x).unwrap().sum_all().unwrap();
        y.backward().unwrap();
        let e = y.backward().unwrap_err();
        assert!(
            matches!(
                e.downcast_ref::<AutogradError>(),
                Some(AutogradError::GraphFreed { .. })
            ),
            "{e}"
        );
        assert!(e.to_string().contains("retain_graph"), "{e}");
    }
);

test_device!(inplace_through_a_view_rebases_the_base, |d: &Device| {
    // y = a * 1; y[0] *= 3; y.sum().backward()  →  a.grad = [3, 1, 1]
    let a = leaf(&[1.0, 2.0, 3.0], &[3], d);
    let y = a.mul(1.0).unwrap();
    y.select(0, 0).unwrap().mul_(3.0).unwrap();
    assert_eq!(y.grad_fn_name(), Some("CopySlices"));
    assert_eq!(vals(&y), vec![3.0, 2.0, 3.0]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&a.grad().unwrap()), vec![3.0, 1.0, 1.0]);
});

test_device!(
    views_taken_before_a_write_see_the_new_history,
    |d: &Device| {
        let x = leaf(&[1.0, 2.0, 3.0], &[3], d);
        let y = x.mul(2.0).unwrap();
        let w = y.narrow(0, 1, 2).unwrap();
        y.mul_(3.0).unwrap();
        // w now holds 6x: its history is regenerated from y's.
        w.sum_all().unwrap().backward().unwrap();
        assert_eq!(vals(&x.grad().unwrap()), vec![0.0, 6.0, 6.0]);
        assert_eq!(w.grad_fn_name(), Some("AsStridedBackward0"));
    }
);

test_device!(
    inplace_on_views_that_cannot_be_rebased_is_refused,
    |d: &Device| {
        // A view of a leaf that requires grad.
        let a = leaf(&[1.0, 2.0], &[2], d);
        let e = a.narrow(0, 0, 1).unwrap().mul_(2.0).unwrap_err();
        assert!(e.to_string().contains("view of a leaf Variable"), "{e}");
        // An expanded view (one element written twice).
        let y = leaf(&[1.0], &[1], d).mul(1.0).unwrap();
        let e = y.expand([3]).unwrap().mul_(2.0).unwrap_err();
        assert!(e.to_string().contains("single memory location"), "{e}");
        // A view made under no_grad, written with grad mode on.
        let y = leaf(&[1.0, 2.0], &[2], d).mul(1.0).unwrap();
        let v = {
            let _g = ember_autograd::no_grad();
            y.narrow(0, 0, 1).unwrap()
        };
        let e = v.mul_(2.0).unwrap_err();
        assert!(e.to_string().contains("no_grad mode"), "{e}");
    }
);

fn gradcheck_inplace_views(d: &Device) -> Result<()> {
    let a = leaf(&[0.3, -1.2, 2.0, 0.7, 1.1, -0.4], &[2, 3], d);
    let b = leaf(&[0.5, 1.5, -0.8], &[3], d);
    let opts = GradcheckOptions::default();
    // y[0] *= b (a tensor operand that requires grad), then y used whole.
    gradcheck(
        |xs| {
            let y = xs[0].mul(1.0)?;
            y.select(0, 0)?.mul_(&xs[1])?;
            y.mul(&y)
        },
        &[a.clone(), b.clone()],
        opts,
    )?;
    // A transposed narrow written by add_, copy_ and clamp_; a view of a view.
    gradcheck(
        |xs| {
            // (tanh would save its output, which the writes below modify: an error, as in PyTorch.)
            let y = xs[0].mul(1.5)?.add(0.1)?;
            let v = y.t()?.narrow(0, 1, 2)?;
            v.add_(&xs[0].t()?.narrow(0, 0, 2)?)?;
            v.select(1, 1)?.clamp_(-0.5, 0.9)?;
            y.narrow(1, 2, 1)?
                .copy_(&xs[1].narrow(0, 0, 2)?.unsqueeze(1)?.mul(2.0)?)?;
            y.exp()
        },
        &[a.clone(), b.clone()],
        opts,
    )?;
    // fill_ through a view, then the view itself used.
    gradcheck(
        |xs| {
            let y = xs[0].mul(&xs[0])?;
            let v = y.reshape([6])?.narrow(0, 2, 2)?;
            v.fill_(0.25)?;
            v.mul(&xs[1].narrow(0, 0, 2)?)?
                .sum_all()?
                .add(&y.sum_all()?)
        },
        &[a, b],
        opts,
    )
}

test_device!(inplace_through_views_gradchecks, |d: &Device| {
    gradcheck_inplace_views(d).unwrap();
});
