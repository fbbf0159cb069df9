//! DistributedDataParallel with `ember-amp`'s GradScaler over 2 MPI ranks: the scaled
//! gradients are all-reduced in backward, before `unscale_`, so a non-finite gradient on one
//! rank reaches every rank and all of them skip that step and back off the scale together,
//! and the training equals one process with the global batch and its own scaler.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

use ember_amp::GradScaler;
use ember_autograd::Tensor;
use ember_nn::layers::{Linear, Sequential, Tanh};
use ember_nn::optim::{Optimizer, SGD, SgdOptions};
use ember_nn::{Module, Result};
use ember_parallel::group::{self, Backend, InitMethod};
use ember_parallel::testing;
use ember_parallel::{DdpOptions, DistributedDataParallel};
use ember_tensor::{DType, Device};

const B: usize = 4;
const STEPS: usize = 6;
/// The step whose batch holds a NaN in rank 1's rows only.
const BAD_STEP: usize = 2;

fn mlp(seed: u64) -> Result<Sequential> {
    ember_tensor::random::manual_seed(seed);
    Ok(Sequential::new()
        .add(Linear::new(5, 8, ())?)
        .add(Tanh::new())
        .add(Linear::new(8, 2, ())?))
}

/// Step `s`'s global batch of `n` rows (rank `r`'s shard is rows `r*B..(r+1)*B`); at
/// `BAD_STEP` the first row of rank 1's shard is NaN.
fn global_batch(s: usize, n: usize) -> Result<(Tensor, Tensor)> {
    let mut x: Vec<f32> = (0..n * 5)
        .map(|i| (((i * 7 + s * 13) % 19) as f32 / 9.0) - 1.0)
        .collect();
    if s == BAD_STEP {
        x[B * 5] = f32::NAN;
    }
    let y: Vec<f32> = (0..n * 2)
        .map(|i| (((i * 5 + s * 3) % 11) as f32 / 5.0) - 1.0)
        .collect();
    Ok((
        Tensor::from_vec(x, [n, 5], Device::Cpu)?,
        Tensor::from_vec(y, [n, 2], Device::Cpu)?,
    ))
}

fn loss(model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    model.call(x)?.sub(y)?.square()?.mean_all()
}

fn sgd(params: Vec<Tensor>) -> Result<SGD> {
    SGD::new(
        params,
        SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        },
    )
}

fn values(m: &dyn Module) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    for p in m.parameters() {
        v.extend(p.to_dtype(DType::F64)?.to_vec::<f64>()?);
    }
    Ok(v)
}

fn fail(msg: String) -> ember_nn::Error {
    ember_nn::Error::invalid("test", msg)
}

fn scaled_ddp_matches_one_process() -> Result<()> {
    let pg = group::init_process_group(Backend::Mpi, InitMethod::Mpi)?;
    let (rank, world) = (pg.rank(), pg.world_size());
    let ddp = DistributedDataParallel::new(mlp(7 + rank as u64)?, &pg, DdpOptions::default())?;
    let reference = mlp(7)?;
    let (mut opt, mut ref_opt) = (sgd(ddp.parameters())?, sgd(reference.parameters())?);
    let (mut scaler, mut ref_scaler) =
        (GradScaler::new(Device::Cpu)?, GradScaler::new(Device::Cpu)?);
    for s in 0..STEPS {
        opt.zero_grad(true)?;
        ref_opt.zero_grad(true)?;
        let (x, y) = global_batch(s, world * B)?;
        let (xs, ys) = (x.narrow(0, rank * B, B)?, y.narrow(0, rank * B, B)?);
        scaler.scale(&loss(&ddp, &xs, &ys)?)?.backward()?;
        ref_scaler.scale(&loss(&reference, &x, &y)?)?.backward()?;
        // unscale_ then clipping, as the walk-throughs do, then step.
        scaler.unscale_(&mut opt)?;
        ember_nn::optim::clip_grad_norm_(&ddp.parameters(), 1.0, 2.0)?;
        ref_scaler.unscale_(&mut ref_opt)?;
        ember_nn::optim::clip_grad_norm_(&reference.parameters(), 1.0, 2.0)?;
        let stepped = scaler.step(&mut opt)?;
        let ref_stepped = ref_scaler.step(&mut ref_opt)?;
        scaler.update()?;
        ref_scaler.update()?;
        if stepped != (s != BAD_STEP) || stepped != ref_stepped {
            return Err(fail(format!(
                "rank {rank}, step {s}: stepped {stepped}, one process {ref_stepped}"
            )));
        }
        let (scale, ref_scale) = (scaler.get_scale()?, ref_scaler.get_scale()?);
        if scale != ref_scale {
            return Err(fail(format!(
                "rank {rank}, step {s}: scale {scale}, one process {ref_scale}"
            )));
        }
        let (a, b) = (values(&ddp)?, values(&reference)?);
        let d = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f64::max);
        if d > 1e-5 || a.iter().any(|v| !v.is_finite()) {
            return Err(fail(format!(
                "rank {rank}, step {s}: parameters differ from one process's by {d}"
            )));
        }
    }
    if scaler.get_scale()? != 65536.0 / 2.0 {
        return Err(fail(format!("rank {rank}: scale {}", scaler.get_scale()?)));
    }
    drop(ddp);
    group::destroy_process_group()
}

#[test]
fn grad_scaler_with_ddp_skips_a_step_on_every_rank() {
    testing::ranks(2, "grad_scaler_with_ddp_skips_a_step_on_every_rank", || {
        scaled_ddp_matches_one_process()
    });
}
