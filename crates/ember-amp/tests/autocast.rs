//! Autocast on every device: the policy table walked op by op, gradients reaching leaves in
//! their own dtype, the cast cache, nesting and `enabled = false`, per-device-type
//! isolation, constructors, bad dtypes, and checkpointed blocks recomputed under the
//! forward's autocast.

use ember_amp::autocast::{
    AutocastOptions, autocast, autocast_cache_len, autocast_with, get_autocast_dtype,
    is_autocast_cache_enabled, is_autocast_enabled, with_autocast,
};
use ember_amp::policy::{CastPolicy, ops_in};
use ember_autograd::{
    CrossEntropyOptions, ErrorKind, NllLossOptions, Reduction, Result, Tensor, checkpoint, no_grad,
};
use ember_nn::functional as F;
use ember_tensor::{Conv2dOptions, DType, Device};
use ember_testing::{Close, rand_vec, test_device};

const LOWER: [DType; 2] = [DType::F16, DType::Bf16];

/// A tensor of `dims` with values in [-1, 1) (f32 unless cast), made from `seed`.
fn rand(dims: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
    let n = dims.iter().product();
    let v: Vec<f32> = rand_vec(n, seed).into_iter().map(|x| x as f32).collect();
    Tensor::from_vec(v, dims, device)
}

/// Values in [0.5, 1.5): positive inputs for log, rsqrt, pow.
fn positive(dims: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
    rand(dims, seed, device)?.mul(0.5)?.add(1.0)
}

/// The device type other than `device`'s.
fn other_type(device: &Device) -> Device {
    if device.is_cuda() {
        Device::Cpu
    } else {
        Device::Cuda(0)
    }
}

/// Runs `op` of the policy table on inputs whose floating tensors are `a` (a first dtype)
/// and `b` (a second dtype): one call site per op name, so a name in the table without a
/// runner here fails the walk.
fn run(op: &str, device: &Device, a: DType, b: DType) -> Result<Tensor> {
    let x = |dims: &[usize], seed| -> Result<Tensor> { rand(dims, seed, device)?.to_dtype(a) };
    let y = |dims: &[usize], seed| -> Result<Tensor> { rand(dims, seed, device)?.to_dtype(b) };
    let p = |dims: &[usize], seed| -> Result<Tensor> { positive(dims, seed, device)?.to_dtype(a) };
    let target = Tensor::from_vec(vec![0i64, 2, 1, 2], [4], device)?;
    Ok(match op {
        "matmul" => x(&[4, 8], 1)?.matmul(&y(&[8, 3], 2)?)?,
        "mm" => x(&[4, 8], 1)?.mm(&y(&[8, 3], 2)?)?,
        "bmm" => x(&[2, 4, 8], 1)?.bmm(&y(&[2, 8, 3], 2)?)?,
        "addmm" => y(&[3], 3)?.addmm(&x(&[4, 8], 1)?, &y(&[8, 3], 2)?)?,
        "linear" => F::linear(&x(&[4, 8], 1)?, &y(&[3, 8], 2)?, Some(&y(&[3], 3)?))?,
        "conv2d" => x(&[1, 2, 5, 5], 1)?.conv2d(
            &y(&[3, 2, 3, 3], 2)?,
            Some(&y(&[3], 3)?),
            &Conv2dOptions::default(),
        )?,
        "scaled_dot_product_attention" => {
            // A float mask (the fourth eligible input) in the second dtype.
            let opts = ember_tensor::SdpaOptions {
                attn_mask: Some(y(&[3, 5], 4)?),
                ..Default::default()
            };
            x(&[2, 3, 8], 1)?.scaled_dot_product_attention(
                &y(&[2, 5, 8], 2)?,
                &y(&[2, 5, 4], 3)?,
                &opts,
            )?
        }
        "exp" => x(&[4, 3], 1)?.exp()?,
        "log" => p(&[4, 3], 1)?.log()?,
        "log1p" => p(&[4, 3], 1)?.log1p()?,
        "pow" => p(&[4, 3], 1)?.pow(&y(&[4, 3], 2)?)?,
        "rsqrt" => p(&[4, 3], 1)?.rsqrt()?,
        "reciprocal" => p(&[4, 3], 1)?.reciprocal()?,
        "softplus" => x(&[4, 3], 1)?.softplus()?,
        "sum" => x(&[4, 3], 1)?.sum(1)?,
        "prod" => p(&[4, 3], 1)?.prod(1)?,
        "logsumexp" => x(&[4, 3], 1)?.logsumexp(1)?,
        "norm" => x(&[4, 3], 1)?.norm(2.0, 1)?,
        "softmax" => x(&[4, 3], 1)?.softmax(1)?,
        "log_softmax" => x(&[4, 3], 1)?.log_softmax(1)?,
        "layer_norm" => F::layer_norm(
            &x(&[4, 3], 1)?,
            &[3],
            Some(&y(&[3], 2)?),
            Some(&y(&[3], 3)?),
            1e-5,
        )?,
        "cross_entropy" => x(&[4, 3], 1)?.cross_entropy(&target, &CrossEntropyOptions::new())?,
        "nll_loss" => x(&[4, 3], 1)?
            .log_softmax(1)?
            .to_dtype(a)?
            .nll_loss(&target, &NllLossOptions::new())?,
        "mse_loss" => F::mse_loss(&x(&[4, 3], 1)?, &y(&[4, 3], 2)?, Reduction::Mean)?,
        "l1_loss" => F::l1_loss(&x(&[4, 3], 1)?, &y(&[4, 3], 2)?, Reduction::Mean)?,
        "binary_cross_entropy_with_logits" => F::binary_cross_entropy_with_logits(
            &x(&[4, 3], 1)?,
            &positive(&[4, 3], 2, device)?.sub(0.5)?.to_dtype(b)?,
            None,
            Reduction::Mean,
        )?,
        "add" => x(&[4, 3], 1)?.add(&y(&[4, 3], 2)?)?,
        "sub" => x(&[4, 3], 1)?.sub(&y(&[4, 3], 2)?)?,
        "mul" => x(&[4, 3], 1)?.mul(&y(&[4, 3], 2)?)?,
        "div" => x(&[4, 3], 1)?.div(&p(&[4, 3], 2)?.to_dtype(b)?)?,
        "maximum" => x(&[4, 3], 1)?.maximum(&y(&[4, 3], 2)?)?,
        "minimum" => x(&[4, 3], 1)?.minimum(&y(&[4, 3], 2)?)?,
        "where" => {
            let (u, v) = (x(&[4, 3], 1)?, y(&[4, 3], 2)?);
            ember_autograd::r#where(&u.gt(0.0)?, &u, &v)?
        }
        "cat" => Tensor::cat(&[&x(&[4, 3], 1)?, &y(&[2, 3], 2)?], 0)?,
        "stack" => Tensor::stack(&[&x(&[4, 3], 1)?, &y(&[4, 3], 2)?], 0)?,
        "scatter_add" => {
            let index = Tensor::from_vec(vec![0i64, 1, 2, 0, 1, 2], [2, 3], device)?;
            x(&[4, 3], 1)?.scatter_add(0, &index, &y(&[2, 3], 2)?)?
        }
        other => panic!("the policy table lists {other}, which this test cannot run"),
    })
}

/// Every row of the table under autocast gives the documented dtype, for both lower
/// dtypes: products of f32 inputs come out in the region's dtype, f32 ops of lower-precision
/// inputs come out f32, promoting ops of a lower and an f32 input come out f32 and of two
/// lower inputs stay lower. Outside a region each op keeps its inputs' dtype.
fn policy_table_walk(device: &Device) -> Result<()> {
    for lower in LOWER {
        let _g = autocast(*device, lower)?;
        for op in ops_in(CastPolicy::LowerPrecision) {
            let y = run(op, device, DType::F32, DType::F32)?;
            assert_eq!(y.dtype(), lower, "{op} under autocast({lower})");
        }
        for op in ops_in(CastPolicy::Fp32) {
            let y = run(op, device, lower, lower)?;
            assert_eq!(y.dtype(), DType::F32, "{op} of {lower} under autocast");
        }
        for op in ops_in(CastPolicy::Promote) {
            let y = run(op, device, lower, DType::F32)?;
            assert_eq!(y.dtype(), DType::F32, "{op} of {lower} and f32");
            let y = run(op, device, lower, lower)?;
            assert_eq!(y.dtype(), lower, "{op} of {lower} and {lower}");
        }
        // Unlisted ops run as given.
        let r = rand(&[4, 3], 1, device)?;
        assert_eq!(r.relu()?.dtype(), DType::F32);
        assert_eq!(r.to_dtype(lower)?.tanh()?.dtype(), lower);
        assert_eq!(r.to_dtype(lower)?.mean_all()?.dtype(), lower);
        // f64 is not eligible: a product of f64 inputs stays f64 (PyTorch's is_eligible).
        let d = r.to_dtype(DType::F64)?;
        assert_eq!(d.matmul(&d.t()?)?.dtype(), DType::F64);
    }
    for op in ops_in(CastPolicy::LowerPrecision)
        .chain(ops_in(CastPolicy::Fp32))
        .chain(ops_in(CastPolicy::Promote))
    {
        assert_eq!(
            run(op, device, DType::F32, DType::F32)?.dtype(),
            DType::F32,
            "{op}"
        );
    }
    // Outside a region the f32 ops keep lower-precision inputs' dtype: the f32 above is
    // autocast's doing, not the op's.
    for op in ops_in(CastPolicy::Fp32) {
        for lower in LOWER {
            assert_eq!(
                run(op, device, lower, lower)?.dtype(),
                lower,
                "{op} of {lower}"
            );
        }
    }
    Ok(())
}
test_device!(policy_table_walk, policy_table_walk);

/// Numerics: a product under autocast equals the f64 product of the inputs rounded to the
/// lower dtype, to the lower dtype's precision; an f32 op of lower inputs equals the f32 op
/// of the same (rounded) values.
fn numerics_match_references(device: &Device) -> Result<()> {
    let a = rand(&[16, 32], 11, device)?;
    let b = rand(&[32, 8], 12, device)?;
    for (lower, tol) in [(DType::F16, 2e-3), (DType::Bf16, 2e-2)] {
        let y = with_autocast(*device, lower, || a.matmul(&b))??;
        assert_eq!(y.dtype(), lower);
        let (a64, b64) = (
            a.to_dtype(lower)?.to_dtype(DType::F64)?,
            b.to_dtype(lower)?.to_dtype(DType::F64)?,
        );
        let want = a64.matmul(&b64)?;
        Close::new()
            .rtol_atol(tol, tol)
            .check_dtype(false)
            .context(format!("matmul under autocast({lower})"))
            .assert(&y.data(), &want.data());
        // softmax of lower inputs computes in f32: equal to the f32 softmax of the values.
        let x = a.to_dtype(lower)?;
        let s = with_autocast(*device, lower, || x.softmax(1))??;
        assert_eq!(s.dtype(), DType::F32);
        let want = x.to_dtype(DType::F32)?.softmax(1)?;
        Close::new()
            .rtol_atol(1e-6, 1e-7)
            .assert(&s.data(), &want.data());
    }
    Ok(())
}
test_device!(numerics_match_references, numerics_match_references);

/// f32 master weights stay f32: the gradient of a small MLP's loss under autocast reaches
/// each weight as f32, close to the f32 run's gradient; a leaf in the lower dtype gets its
/// gradient in the lower dtype.
fn gradients_reach_leaves_in_their_dtype(device: &Device) -> Result<()> {
    let x = rand(&[4, 8], 21, device)?;
    let target = Tensor::from_vec(vec![0i64, 2, 1, 2], [4], device)?;
    let w1 = rand(&[16, 8], 22, device)?.requires_grad_(true)?;
    let b1 = rand(&[16], 23, device)?.requires_grad_(true)?;
    let w2 = rand(&[3, 16], 24, device)?.requires_grad_(true)?;
    let forward = || -> Result<Tensor> {
        let h = F::linear(&x, &w1, Some(&b1))?.relu()?;
        let logits = F::linear(&h, &w2, None)?;
        logits.cross_entropy(&target, &CrossEntropyOptions::new())
    };
    // Reference: the f32 run.
    forward()?.backward()?;
    let want: Vec<Tensor> = [&w1, &b1, &w2]
        .iter()
        .map(|w| {
            w.grad()
                .ok_or_else(|| ember_autograd::Error::invalid("test", "no grad"))
        })
        .collect::<Result<_>>()?;
    for lower in LOWER {
        for w in [&w1, &b1, &w2] {
            w.set_grad(None)?;
        }
        let loss = {
            let _g = autocast(*device, lower)?;
            let loss = forward()?;
            assert_eq!(loss.dtype(), DType::F32, "cross_entropy runs in f32");
            loss
        };
        loss.backward()?;
        for (w, want) in [&w1, &b1, &w2].iter().zip(&want) {
            let g = w
                .grad()
                .ok_or_else(|| ember_autograd::Error::invalid("test", "no grad"))?;
            assert_eq!(g.dtype(), DType::F32, "the master weight's grad is f32");
            Close::new()
                .rtol_atol(5e-2, 2e-2)
                .context(format!("grad under autocast({lower}) against f32"))
                .assert(&g.data(), &want.data());
        }
        // A leaf already in the lower dtype, through an f32 op: its grad is in its dtype.
        let h = rand(&[4, 3], 25, device)?
            .to_dtype(lower)?
            .requires_grad_(true)?;
        let s = with_autocast(*device, lower, || {
            h.softmax(1)?.mul(&h.to_dtype(DType::F32)?)
        })??;
        s.sum_all()?.backward()?;
        assert_eq!(h.grad().map(|g| g.dtype()), Some(lower));
    }
    Ok(())
}
test_device!(
    gradients_reach_leaves_in_their_dtype,
    gradients_reach_leaves_in_their_dtype
);

/// One cast per weight per region: two products with one f32 weight leave one entry in
/// the cache, its gradient is the sum of both uses, inputs that are not leaves requiring
/// grad are not cached, a weight written in place is cast again, nested regions share the
/// cache, and the outermost region's end drops it.
fn cast_cache(device: &Device) -> Result<()> {
    let w = rand(&[8, 3], 31, device)?.requires_grad_(true)?;
    let x = rand(&[4, 8], 32, device)?;
    let c = rand(&[8, 3], 33, device)?; // f32, no grad: not cached
    for lower in LOWER {
        w.set_grad(None)?;
        assert_eq!(autocast_cache_len(), 0);
        let (y1, y2) = {
            let _g = autocast(*device, lower)?;
            assert!(is_autocast_cache_enabled());
            let y1 = x.matmul(&w)?;
            assert_eq!(autocast_cache_len(), 1, "one cast of w");
            let y2 = x.mul(2.0)?.matmul(&w)?;
            assert_eq!(autocast_cache_len(), 1, "w's cast reused");
            x.matmul(&c)?;
            assert_eq!(
                autocast_cache_len(),
                1,
                "a tensor without grad is not cached"
            );
            {
                let _inner = autocast(*device, lower)?;
                x.matmul(&w)?;
                assert_eq!(autocast_cache_len(), 1, "nested regions share the cache");
            }
            assert_eq!(autocast_cache_len(), 1, "an inner region's end keeps it");
            (y1, y2)
        };
        assert_eq!(
            autocast_cache_len(),
            0,
            "the outermost region's end drops it"
        );
        // d/dw Σ(x@w + 2x@w) = 3 xᵀ·1, in f32.
        y1.to_dtype(DType::F32)?
            .add(&y2.to_dtype(DType::F32)?)?
            .sum_all()?
            .backward()?;
        let g = w
            .grad()
            .ok_or_else(|| ember_autograd::Error::invalid("test", "no grad"))?;
        assert_eq!(g.dtype(), DType::F32);
        let want = x.t()?.matmul(&Tensor::ones([4, 3], device)?)?.mul(3.0)?;
        Close::new()
            .rtol_atol(2e-2, 2e-2)
            .assert(&g.data(), &want.data());

        // A weight written in place within the region is cast again (no stale copy).
        let _g = autocast(*device, lower)?;
        let before = x.matmul(&w)?;
        {
            let _ng = no_grad();
            w.add_(1.0)?;
        }
        let after = x.matmul(&w)?;
        let shift = x.sum((1, true))?.expand([4, 3])?; // x @ (w + 1) - x @ w
        Close::new().rtol_atol(5e-2, 5e-2).assert(
            &after
                .to_dtype(DType::F32)?
                .sub(&before.to_dtype(DType::F32)?)?
                .data(),
            &shift.data(),
        );
        {
            let _ng = no_grad();
            w.sub_(1.0)?;
        }
    }
    // cache_enabled = false: nothing cached.
    let _g = autocast_with(AutocastOptions::new(*device).cache_enabled(false))?;
    assert!(!is_autocast_cache_enabled());
    x.matmul(&w)?;
    assert_eq!(autocast_cache_len(), 0);
    Ok(())
}
test_device!(cast_cache, cast_cache);

/// Regions nest: an inner `enabled = false` region restores full precision, an inner region
/// of another dtype computes in it, and each end restores the enclosing state. Without a
/// dtype a region takes the current one (by default f16 on CUDA, bf16 on the CPU).
fn nesting_and_enabled_false(device: &Device) -> Result<()> {
    let a = rand(&[4, 4], 41, device)?;
    let default = if device.is_cuda() {
        DType::F16
    } else {
        DType::Bf16
    };
    assert_eq!(get_autocast_dtype(*device), default);
    assert!(!is_autocast_enabled(*device));
    let _outer = autocast_with(AutocastOptions::new(*device))?;
    assert!(is_autocast_enabled(*device));
    assert_eq!(a.matmul(&a)?.dtype(), default);
    {
        let _off = autocast_with(AutocastOptions::new(*device).enabled(false))?;
        assert!(!is_autocast_enabled(*device));
        assert_eq!(a.matmul(&a)?.dtype(), DType::F32, "full precision inside");
        {
            let _on = autocast(*device, DType::Bf16)?;
            assert_eq!(a.matmul(&a)?.dtype(), DType::Bf16);
        }
        assert_eq!(a.matmul(&a)?.dtype(), DType::F32);
    }
    let other = if default == DType::F16 {
        DType::Bf16
    } else {
        DType::F16
    };
    {
        let _inner = autocast(*device, other)?;
        assert_eq!(get_autocast_dtype(*device), other);
        assert_eq!(a.matmul(&a)?.dtype(), other);
        let _keep = autocast_with(AutocastOptions::new(*device))?;
        assert_eq!(
            get_autocast_dtype(*device),
            other,
            "no dtype: the current one"
        );
    }
    assert_eq!(get_autocast_dtype(*device), default);
    assert_eq!(a.matmul(&a)?.dtype(), default);
    Ok(())
}
test_device!(nesting_and_enabled_false, nesting_and_enabled_false);

/// A region of one device type leaves ops of the other alone (a CUDA region does not change
/// CPU ops, as PyTorch), and regions are per thread.
fn device_types_and_threads_are_isolated(device: &Device) -> Result<()> {
    let a = rand(&[4, 4], 51, device)?;
    let other = other_type(device);
    {
        let _g = autocast(other, DType::F16)?;
        assert!(is_autocast_enabled(other));
        assert!(!is_autocast_enabled(*device));
        assert_eq!(a.matmul(&a)?.dtype(), DType::F32);
        let _mine = autocast(*device, DType::Bf16)?;
        assert_eq!(a.matmul(&a)?.dtype(), DType::Bf16);
        assert_eq!(get_autocast_dtype(other), DType::F16);
    }
    let _g = autocast(*device, DType::F16)?;
    let dev = *device;
    let elsewhere = std::thread::spawn(move || is_autocast_enabled(dev))
        .join()
        .map_err(|_| ember_autograd::Error::invalid("test", "thread panicked"))?;
    assert!(!elsewhere, "another thread is not in this thread's region");
    Ok(())
}
test_device!(
    device_types_and_threads_are_isolated,
    device_types_and_threads_are_isolated
);

/// Constructors are not autocast, and a tensor made inside a region keeps its dtype after.
fn constructors_and_outputs(device: &Device) -> Result<()> {
    let a = rand(&[4, 4], 61, device)?;
    let (z, y) = {
        let _g = autocast(*device, DType::F16)?;
        let z = Tensor::zeros([3], device)?;
        assert_eq!(Tensor::ones([2, 2], device)?.dtype(), DType::F32);
        assert_eq!(Tensor::randn([2, 2], device)?.dtype(), DType::F32);
        assert_eq!(a.zeros_like()?.dtype(), DType::F32);
        (z, a.matmul(&a)?)
    };
    assert_eq!(z.dtype(), DType::F32);
    assert_eq!(y.dtype(), DType::F16, "the output keeps its dtype outside");
    assert_eq!(y.matmul(&y)?.dtype(), DType::F16, "no autocast outside");
    assert_eq!(y.softmax(1)?.dtype(), DType::F16);
    Ok(())
}
test_device!(constructors_and_outputs, constructors_and_outputs);

/// An unsupported dtype is an error naming the allowed ones, and changes nothing.
fn bad_dtypes_are_errors(device: &Device) -> Result<()> {
    for bad in [DType::F64, DType::F32, DType::I32, DType::I64, DType::Bool] {
        let e = match autocast(*device, bad) {
            Ok(_) => panic!("autocast({bad}) was accepted"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let msg = e.to_string();
        for part in [DType::F16, DType::Bf16, bad] {
            let part = part.to_string();
            assert!(msg.contains(&part), "{msg:?} does not name {part}");
        }
        assert!(!is_autocast_enabled(*device));
        let mut ran = false;
        assert!(with_autocast(*device, bad, || ran = true).is_err());
        assert!(!ran, "the closure does not run");
    }
    assert_eq!(autocast_cache_len(), 0);
    Ok(())
}
test_device!(bad_dtypes_are_errors, bad_dtypes_are_errors);

/// A region names a device *type*: `autocast(Device::Cuda(0), ..)` applies to ops on every
/// CUDA device, here cuda:1.
fn cuda_index_is_ignored(device: &Device) -> Result<()> {
    let a = rand(&[4, 4], 71, device)?;
    let _g = autocast(Device::Cuda(0), DType::F16)?;
    assert!(is_autocast_enabled(*device));
    assert_eq!(a.matmul(&a)?.dtype(), DType::F16);
    Ok(())
}
test_device!(cuda_index_is_ignored, cuda_index_is_ignored, [cuda1]);

/// A block checkpointed inside a region is recomputed under the region's autocast during a
/// backward that runs after the region ended (Note [Checkpoint] in `ember-autograd`): the
/// gradients equal those of the same block without checkpointing, bit for bit, and the
/// recomputation leaves nothing in the cast cache.
fn checkpoint_recomputes_under_autocast(device: &Device) -> Result<()> {
    let x = rand(&[8, 16], 81, device)?.requires_grad_(true)?;
    let w1 = rand(&[16, 16], 82, device)?.requires_grad_(true)?;
    let w2 = rand(&[16, 4], 83, device)?.requires_grad_(true)?;
    let (v1, v2) = (w1.clone(), w2.clone());
    let block = move |xs: &[Tensor]| xs[0].matmul(&v1)?.relu()?.matmul(&v2);
    for lower in LOWER {
        let mut runs = Vec::new();
        for checkpointed in [false, true] {
            for t in [&x, &w1, &w2] {
                t.set_grad(None)?;
            }
            let y = {
                let _g = autocast(*device, lower)?;
                if checkpointed {
                    checkpoint(block.clone(), std::slice::from_ref(&x))?
                } else {
                    block(std::slice::from_ref(&x))?
                }
            };
            assert_eq!(y.dtype(), lower, "checkpointed: {checkpointed}");
            // The backward runs outside the region, as in a training loop.
            y.to_dtype(DType::F32)?.square()?.sum_all()?.backward()?;
            assert_eq!(autocast_cache_len(), 0, "the recomputation caches nothing");
            let grads = [&x, &w1, &w2]
                .iter()
                .map(|t| {
                    let g = t
                        .grad()
                        .ok_or_else(|| ember_autograd::Error::invalid("test", "no grad"))?;
                    assert_eq!(g.dtype(), DType::F32, "f32 leaves get f32 gradients");
                    g.to_vec::<f32>()
                })
                .collect::<Result<Vec<_>>>()?;
            runs.push(grads);
        }
        assert_eq!(runs[0], runs[1], "checkpointed under autocast({lower})");
    }
    Ok(())
}
test_device!(
    checkpoint_recomputes_under_autocast,
    checkpoint_recomputes_under_autocast
);
