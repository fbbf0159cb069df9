#![allow(clippy::unwrap_used)]
//! The backward engine and the tape: accumulation, retain_graph, version counters, deep
//! chains, hooks, grad modes, `grad()`, device and dtype flow, checkpointing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ember_autograd::{
    AutogradError, GradOptions, Tensor, grad, inference_mode, no_grad, set_grad_enabled,
};
use ember_device::cuda;
use ember_device::driver::emulator::EmulatorConfig;
use ember_tensor::{DType, Device};

const CPU: Device = Device::Cpu;

fn leaf(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec(), CPU)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

#[test]
fn a_transposed_weight_gets_a_contiguous_gradient() {
    // `Linear`'s `x @ w.t()`: w's gradient arrives contiguous, in w's own layout (as
    // PyTorch's mm_mat2_backward gives it), with the values of xᵀ-products in f64.
    let (n, k, m) = (3usize, 4usize, 2usize);
    let xv: Vec<f64> = (0..n * k).map(|i| (i as f64 * 0.37).sin()).collect();
    let wv: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.71).cos()).collect();
    let gv: Vec<f64> = (0..n * m).map(|i| 1.0 + i as f64).collect();
    let x = leaf(&xv, &[n, k]);
    let w = leaf(&wv, &[m, k]);
    let g = Tensor::from_vec(gv.clone(), [n, m], CPU).unwrap();
    x.matmul(&w.t().unwrap())
        .unwrap()
        .backward_with(&g)
        .unwrap();
    let (gw, gx) = (w.grad().unwrap(), x.grad().unwrap());
    assert!(gw.is_contiguous() && gx.is_contiguous());
    // dL/dw[j][c] = sum_i g[i][j] x[i][c]; dL/dx[i][c] = sum_j g[i][j] w[j][c].
    let want_w: Vec<f64> = (0..m * k)
        .map(|jc| {
            (0..n)
                .map(|i| gv[i * m + jc / k] * xv[i * k + jc % k])
                .sum()
        })
        .collect();
    let want_x: Vec<f64> = (0..n * k)
        .map(|ic| {
            (0..m)
                .map(|j| gv[ic / k * m + j] * wv[j * k + ic % k])
                .sum()
        })
        .collect();
    for (got, want) in [(vals(&gw), want_w), (vals(&gx), want_x)] {
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }
    // The same for a transposed left operand.
    let a = leaf(&wv, &[k, m]);
    a.t()
        .unwrap()
        .matmul(&x.t().unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(a.grad().unwrap().is_contiguous());
}

#[test]
fn gradients_accumulate_until_cleared() {
    let x = leaf(&[1.0, 2.0], &[2]);
    for _ in 0..2 {
        x.mul(3.0).unwrap().sum_all().unwrap().backward().unwrap();
    }
    assert_eq!(vals(&x.grad().unwrap()), vec![6.0, 6.0]);
    x.set_grad(None).unwrap();
    x.mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 4.0]);
}

#[test]
fn leaf_flags_and_names() {
    let x = leaf(&[1.0], &[1]);
    assert!(x.is_leaf() && x.requires_grad());
    let y = x.exp().unwrap();
    assert!(!y.is_leaf() && y.requires_grad());
    assert_eq!(y.grad_fn_name(), Some("ExpBackward0"));
    assert!(x.detach().grad_fn_name().is_none() && !x.detach().requires_grad());
    assert!(y.to_string().ends_with("grad_fn=<ExpBackward0>)"), "{y}");
    assert!(x.to_string().ends_with("requires_grad=True)"), "{x}");
    // Only leaves can be switched off; only floats can require grad.
    assert!(y.requires_grad_(false).is_err());
    let i = Tensor::new(&[1i64], CPU).unwrap();
    let e = i.requires_grad_(true).unwrap_err().to_string();
    assert!(e.contains("floating point"), "{e}");
}

#[test]
fn non_scalar_backward_needs_a_gradient() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul(2.0).unwrap();
    let e = y.backward().unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<AutogradError>(),
            Some(AutogradError::ImplicitGradNonScalar { .. })
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("grad can be implicitly created only for scalar outputs")
    );
    y.backward_with(&Tensor::from_vec(vec![1.0f64, 10.0], [2], CPU).unwrap())
        .unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 20.0]);
    // Not part of any graph.
    let c = Tensor::ones([1], ()).unwrap();
    assert!(matches!(
        c.backward().unwrap_err().downcast_ref::<AutogradError>(),
        Some(AutogradError::NoGradFn { .. })
    ));
}

#[test]
fn second_backward_needs_retain_graph() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.exp().unwrap().sum_all().unwrap();
    y.backward_opts(None, true).unwrap();
    y.backward().unwrap(); // the graph was retained once
    let e = y.backward().unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<AutogradError>(),
            Some(AutogradError::GraphFreed { .. })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("retain_graph"), "{e}");
    let want: Vec<f64> = [1f64, 2.0].iter().map(|v| 2.0 * v.exp()).collect();
    for (a, b) in vals(&x.grad().unwrap()).iter().zip(&want) {
        assert!((a - b).abs() < 1e-12);
    }
}

#[test]
fn inplace_change_of_a_saved_tensor_is_detected() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.exp().unwrap(); // saves its output
    let z = y.sum_all().unwrap();
    let w = y.mul(&y).unwrap().sum_all().unwrap(); // saves y
    {
        let _g = no_grad();
        y.data().add_(1.0).unwrap();
    }
    let e = w.backward().unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<AutogradError>(),
            Some(AutogradError::ModifiedInplace { .. })
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("modified by an inplace operation"),
        "{e}"
    );
    // z's path runs through the same exp, which saved y: that fails too.
    assert!(matches!(
        z.backward().unwrap_err().downcast_ref::<AutogradError>(),
        Some(AutogradError::ModifiedInplace { .. })
    ));
    // A graph that saved nothing modified still works.
    let v = x.mul(2.0).unwrap().sum_all().unwrap();
    v.backward().unwrap();
}

#[test]
fn inplace_ops_are_recorded_and_leaves_refuse_them() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let e = x.add_(1.0).unwrap_err().to_string();
    assert!(e.contains("leaf Variable that requires grad"), "{e}");
    let y = x.mul(2.0).unwrap();
    y.add_(&x).unwrap(); // y = 2x + x
    y.mul_(3.0).unwrap(); // y = 9x
    assert_eq!(y.grad_fn_name(), Some("MulBackward0"));
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![9.0, 9.0]);
    // Under no_grad a leaf may be updated in place (an optimizer step).
    {
        let _g = no_grad();
        x.sub_(&x.grad().unwrap().mul(0.5).unwrap()).unwrap();
    }
    assert_eq!(vals(&x), vec![-3.5, -2.5]);
    assert!(x.is_leaf());
}

#[test]
fn ten_thousand_layer_chain_neither_overflows_nor_recurses() {
    // Runs on a thread with a small stack: recursion over 10 000 nodes would overflow it.
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            let x = leaf(&[0.5], &[1]);
            let mut y = x.clone();
            for _ in 0..10_000 {
                y = y.mul(1.0001).unwrap();
            }
            y.sum_all().unwrap().backward().unwrap();
            let g = vals(&x.grad().unwrap())[0];
            assert!((g - 1.0001f64.powi(10_000)).abs() < 1e-9 * g);
            // A second deep graph dropped without running backward.
            let mut z = x.clone();
            for _ in 0..10_000 {
                z = z.add(1.0).unwrap();
            }
            drop(z);
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn hooks_see_and_replace_gradients() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let h = x
        .register_hook(move |g| {
            s.fetch_add(1, Ordering::SeqCst);
            Some(g.mul(10.0).unwrap())
        })
        .unwrap();
    let y = x.mul(2.0).unwrap();
    y.register_hook(|g| Some(g.add(1.0).unwrap())).unwrap();
    let post = Arc::new(AtomicUsize::new(0));
    let p = post.clone();
    x.register_post_accumulate_grad_hook(move |t| {
        assert!(t.grad().is_some());
        p.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    y.sum_all().unwrap().backward().unwrap();
    // (1 + 1) * 2 * 10
    assert_eq!(vals(&x.grad().unwrap()), vec![40.0, 40.0]);
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert_eq!(post.load(Ordering::SeqCst), 1);
    h.remove();
    x.set_grad(None).unwrap();
    x.mul(2.0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 2.0]);
    assert_eq!(post.load(Ordering::SeqCst), 2);
}

#[test]
fn an_error_in_a_post_accumulate_hook_ends_backward_with_it() {
    let x = leaf(&[1.0, 2.0], &[2]);
    x.register_post_accumulate_grad_hook(|_| {
        Err(ember_autograd::Error::invalid(
            "hook",
            "the all-reduce of bucket 0 failed",
        ))
    })
    .unwrap();
    let e = x
        .mul(2.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap_err();
    assert!(e.to_string().contains("bucket 0 failed"), "{e}");
    // The gradient was accumulated before the hook ran.
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 2.0]);
}

#[test]
fn reachable_leaves_are_the_leaves_backward_would_reach() {
    let (a, b, unused) = (leaf(&[1.0], &[1]), leaf(&[2.0], &[1]), leaf(&[3.0], &[1]));
    let constant = Tensor::from_vec(vec![4.0], vec![1], CPU).unwrap();
    // `a` twice (one entry), `b` through a longer path, a constant that needs no grad.
    let y = a
        .mul(&a)
        .unwrap()
        .add(&b.mul(2.0).unwrap().exp().unwrap())
        .unwrap();
    let y = y.add(&constant).unwrap();
    let found = ember_autograd::reachable_leaves(&[&y]);
    assert_eq!(found.len(), 2);
    assert!(found.iter().any(|t| t.same(&a)) && found.iter().any(|t| t.same(&b)));
    assert!(!found.iter().any(|t| t.same(&unused)));
    // A leaf output is its own reachable leaf; a tensor needing no grad reaches nothing.
    assert!(ember_autograd::reachable_leaves(&[&unused])[0].same(&unused));
    assert!(ember_autograd::reachable_leaves(&[&constant]).is_empty());
}

#[test]
fn retain_grad_fills_non_leaf_grad() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul(3.0).unwrap();
    y.retain_grad().unwrap();
    let z = y.mul(&y).unwrap().sum_all().unwrap();
    z.backward().unwrap();
    assert_eq!(vals(&y.grad().unwrap()), vec![6.0, 12.0]);
    assert!(y.retains_grad());
}

#[test]
fn autograd_grad_leaves_dot_grad_alone() {
    let x = leaf(&[2.0], &[1]);
    let y = x.mul(&x).unwrap();
    let z = y.mul(&x).unwrap().sum_all().unwrap();
    let g = grad(
        std::slice::from_ref(&z),
        &[x.clone(), y.clone()],
        &[],
        GradOptions::default(),
    )
    .unwrap();
    assert_eq!(vals(g[0].as_ref().unwrap()), vec![12.0]); // d(x³)/dx
    assert_eq!(vals(g[1].as_ref().unwrap()), vec![2.0]); // dz/dy = x
    assert!(x.grad().is_none());
    let unused = leaf(&[1.0], &[1]);
    let w = x.mul(2.0).unwrap().sum_all().unwrap();
    let e = grad(&[w], &[unused], &[], GradOptions::default()).unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<AutogradError>(),
            Some(AutogradError::UnusedInput { index: 0 })
        ),
        "{e}"
    );
}

#[test]
fn grad_modes_stop_recording() {
    let x = leaf(&[1.0], &[1]);
    {
        let _g = no_grad();
        assert!(!x.mul(2.0).unwrap().requires_grad());
    }
    {
        let _g = set_grad_enabled(false);
        assert!(!x.exp().unwrap().requires_grad());
    }
    let t = {
        let _g = inference_mode();
        let t = x.mul(2.0).unwrap();
        assert!(!t.requires_grad() && t.is_inference());
        t
    };
    // An inference tensor cannot be saved for backward.
    let e = x.mul(&t).unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<AutogradError>(),
            Some(AutogradError::InferenceTensor { .. })
        ),
        "{e}"
    );
    assert!(x.mul(2.0).unwrap().requires_grad());
}

#[test]
fn gradient_comes_back_in_the_input_dtype() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x
        .to_dtype(DType::F32)
        .unwrap()
        .mul(2.0)
        .unwrap()
        .sum_all()
        .unwrap();
    assert_eq!(y.dtype(), DType::F32);
    y.backward().unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.dtype(), DType::F64);
    assert_eq!(vals(&g), vec![2.0, 2.0]);
}

#[test]
fn gradient_flows_back_across_devices() {
    cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
    let x = leaf(&[1.0, 2.0, 3.0], &[3]);
    let on_gpu = x.to_device(Device::Cuda(0)).unwrap();
    let on_other = on_gpu.to_device(Device::Cuda(1)).unwrap();
    let y = on_other.mul(&on_other).unwrap().sum_all().unwrap();
    assert_eq!(y.device(), Device::Cuda(1));
    y.backward().unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.device(), CPU);
    assert_eq!(vals(&g), vec![2.0, 4.0, 6.0]);
    // A leaf on the GPU gets its gradient on the GPU.
    let w = Tensor::ones([2], (&Device::Cuda(0), DType::F32))
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    w.exp().unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().device(), Device::Cuda(0));
    // Mixing devices in one op is the same-device error.
    let e = w
        .add(&x.to_dtype(DType::F32).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Expected all tensors to be on the same device"),
        "{e}"
    );
}

#[test]
fn dropout_gradient_is_the_scaled_mask() {
    let x = Tensor::ones([1000], (&CPU, DType::F64))
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let y = x.dropout(0.25, true).unwrap();
    assert_eq!(y.grad_fn_name(), Some("NativeDropoutBackward0"));
    y.sum_all().unwrap().backward().unwrap();
    let (g, yv) = (vals(&x.grad().unwrap()), vals(&y));
    // With x = 1 the output is the scaled mask itself: 0 or 1 / 0.75.
    assert_eq!(g, yv);
    let kept = g.iter().filter(|&&v| v != 0.0).count();
    assert!((650..850).contains(&kept), "kept {kept}");
    assert!(
        g.iter()
            .all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-12)
    );
    // Eval mode is the identity (the same tensor).
    assert!(x.dropout(0.25, false).unwrap().same(&x));
    assert!(x.dropout(1.5, true).is_err());
}

/// A write through a view rebases the base's history, and a view taken before a write into
/// its base regenerates its own (Note [View rebase]): PyTorch's gradients either way.
#[test]
fn inplace_through_views_rebases_histories() {
    let x = leaf(&[1.0, 2.0, 3.0], &[3]);
    let y = x.mul(2.0).unwrap();
    let v = y.narrow(0, 0, 1).unwrap();
    assert!(v.is_view());
    v.mul_(3.0).unwrap();
    assert_eq!(y.grad_fn_name(), Some("CopySlices"));
    // In place on the base after the view was taken: the view sees the new history.
    let w = y.narrow(0, 1, 2).unwrap();
    y.mul_(3.0).unwrap();
    w.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![0.0, 6.0, 6.0]);
    x.set_grad(None).unwrap();
    // Through the base's own history: y = 3·(2x with y[0] tripled) → [18, 6, 6].
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![18.0, 6.0, 6.0]);
    // A reshape that had to copy is not a view.
    let t = x.mul(1.0).unwrap().t().unwrap();
    assert!(t.is_view());
    let c = x
        .mul(1.0)
        .unwrap()
        .unsqueeze(1)
        .unwrap()
        .expand([3, 2])
        .unwrap()
        .reshape([6])
        .unwrap();
    assert!(!c.is_view());
    c.add_(1.0).unwrap();
}
