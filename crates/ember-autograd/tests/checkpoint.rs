#![allow(clippy::unwrap_used)]
//! Tests that read the CPU's global state (`memory_allocated`, the default generator):
//! they hold one lock so that they never run at the same time as each other, and this
//! file has no other tests that could allocate or draw random numbers meanwhile.

use std::sync::Mutex;

use ember_autograd::{Tensor, checkpoint};
use ember_tensor::{DType, Device};

const CPU: Device = Device::Cpu;
static SERIAL: Mutex<()> = Mutex::new(());

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

#[test]
fn saved_tensors_are_freed_as_backward_runs() {
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dev = CPU;
    let x = Tensor::randn([256, 256], (&dev, DType::F32))
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let y = x.exp().unwrap().exp().unwrap().sum_all().unwrap();
    let before = ember_memory::memory_allocated(dev).unwrap();
    y.backward().unwrap();
    // The two exp outputs were saved; after backward only `x.grad` is new.
    let after = ember_memory::memory_allocated(dev).unwrap();
    assert!(
        after < before + 256 * 256 * 4 * 2,
        "before {before}, after {after}"
    );
}

/// A stack of layers with dropout: checkpointed and plain runs give the same gradients,
/// and the checkpointed forward keeps less memory.
#[test]
fn checkpoint_matches_and_saves_memory() {
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    const DROP: f64 = 0.2;
    fn block(xs: &[Tensor]) -> ember_autograd::Result<Tensor> {
        let mut h = xs[0].clone();
        for _ in 0..8 {
            h = h.matmul(&xs[1])?.tanh()?.dropout(DROP, true)?;
        }
        Ok(h)
    }
    let dev = CPU;
    let x = Tensor::randn([64, 128], (&dev, DType::F64)).unwrap();
    let w = Tensor::randn([128, 128], (&dev, DType::F64))
        .unwrap()
        .mul(0.05)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let xr = x.requires_grad_(true).unwrap();

    ember_tensor::random::manual_seed(7);
    let base = ember_memory::memory_allocated(dev).unwrap();
    let plain = block(&[xr.clone(), w.clone()]).unwrap();
    let plain_mem = ember_memory::memory_allocated(dev).unwrap() - base;
    plain.sum_all().unwrap().backward().unwrap();
    let (gx, gw) = (vals(&xr.grad().unwrap()), vals(&w.grad().unwrap()));
    drop(plain);
    xr.set_grad(None).unwrap();
    w.set_grad(None).unwrap();

    ember_tensor::random::manual_seed(7);
    let base = ember_memory::memory_allocated(dev).unwrap();
    let ck = checkpoint(block, &[xr.clone(), w.clone()]).unwrap();
    let ck_mem = ember_memory::memory_allocated(dev).unwrap() - base;
    assert_eq!(ck.grad_fn_name(), Some("CheckpointFunctionBackward"));
    ck.sum_all().unwrap().backward().unwrap();
    let max_diff = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    assert_eq!(
        max_diff(&vals(&xr.grad().unwrap()), &gx),
        0.0,
        "x.grad differs"
    );
    assert_eq!(
        max_diff(&vals(&w.grad().unwrap()), &gw),
        0.0,
        "w.grad differs"
    );
    assert!(
        ck_mem * 4 < plain_mem,
        "checkpointed forward kept {ck_mem} bytes, plain {plain_mem}"
    );
}

/// A parameter the checkpointed function captures (as a module's weight is) receives the
/// same gradient as without checkpointing, and the input's gradient is unchanged too.
#[test]
fn captured_parameters_get_their_gradients() {
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let w = Tensor::from_vec(vec![0.5f64, -1.0, 2.0, 0.25], [2, 2], CPU)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let x = Tensor::from_vec(vec![1.0f64, 2.0, -3.0, 0.5], [2, 2], CPU)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let wc = w.clone();
    let f = move |xs: &[Tensor]| xs[0].matmul(&wc)?.tanh()?.matmul(&wc);
    f(std::slice::from_ref(&x))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let (gx, gw) = (vals(&x.grad().unwrap()), vals(&w.grad().unwrap()));
    x.set_grad(None).unwrap();
    w.set_grad(None).unwrap();
    let y = checkpoint(f, std::slice::from_ref(&x)).unwrap();
    assert!(w.grad().is_none());
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), gx);
    assert_eq!(vals(&w.grad().unwrap()), gw);
}
