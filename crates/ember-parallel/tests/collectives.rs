//! Every collective × every reduction × f32/f64/bf16/i64 on 2 and 3 MPI ranks, against
//! references computed locally; the async forms and their trace ranges; CUDA tensors
//! (emulated) staged through host memory. Each test runs its body as N ranks
//! (`ember_parallel::testing`).
#![cfg(feature = "mpi")]

use std::sync::{Arc, Mutex};

use ember_autograd::{Result, Tensor};
use ember_device::trace::{self, Subscriber, TraceEvent};
use ember_parallel::group::{self, Backend, InitMethod, ProcessGroup, ReduceOp};
use ember_parallel::testing;
use ember_tensor::{DType, Device, Tensor as Raw};

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Product,
];
const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::Bf16, DType::I64];
const N: usize = 10;

/// Rank `r`'s value at `i`: small integers of both signs, exact in every dtype tested,
/// whose products over 3 ranks stay exact in bf16.
fn value(r: usize, i: usize) -> f64 {
    let base = [1.0, -2.0, 3.0, 1.0, -1.0][i % 5];
    base * (r as f64 + 1.0) + (i / 5) as f64
}

fn values(r: usize, shift: f64) -> Vec<f64> {
    (0..N).map(|i| value(r, i) + shift).collect()
}

fn tensor(v: &[f64], dtype: DType) -> Result<Tensor> {
    Raw::from_vec(v.to_vec(), [2, N / 2], Device::Cpu)?.to_dtype(dtype)
}

/// The naive reduction of `per_rank` (one vector per rank) element by element; `Avg` of
/// integers truncates, as the backend documents.
fn reference(per_rank: &[Vec<f64>], op: ReduceOp, dtype: DType) -> Vec<f64> {
    (0..per_rank[0].len())
        .map(|i| {
            let xs = per_rank.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => xs.sum(),
                ReduceOp::Avg if dtype == DType::I64 => {
                    (xs.sum::<f64>() / per_rank.len() as f64).trunc()
                }
                ReduceOp::Avg => xs.sum::<f64>() / per_rank.len() as f64,
                ReduceOp::Max => xs.fold(f64::MIN, f64::max),
                ReduceOp::Min => xs.fold(f64::MAX, f64::min),
                ReduceOp::Product => xs.product(),
            }
        })
        .collect()
}

/// `got` against `want` rounded to `dtype` (bf16 within its half-ulp).
fn check(what: &str, got: &Tensor, want: &[f64], dtype: DType) -> Result<()> {
    assert_eq!(got.dtype(), dtype, "{what}");
    let want = Raw::from_vec(want.to_vec(), [want.len()], Device::Cpu)?
        .to_dtype(dtype)?
        .to_vec::<f64>()?;
    let got = got.to_vec::<f64>()?;
    let tol = if dtype == DType::Bf16 { 1e-2 } else { 1e-6 };
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: element {i}: got {g}, expected {w} (all: {got:?} vs {want:?})"
        );
    }
    Ok(())
}

fn init() -> Result<ProcessGroup> {
    group::init_process_group(Backend::Mpi, InitMethod::Mpi)
}

/// Every collective, reduction and dtype on the group's world.
fn all_collectives(pg: &ProcessGroup) -> Result<()> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let all: Vec<Vec<f64>> = (0..world).map(|r| values(r, 0.0)).collect();
    for dtype in DTYPES {
        for op in OPS {
            let t = tensor(&all[rank], dtype)?;
            pg.all_reduce(&t, op)?;
            check(
                &format!("all_reduce {op:?} {dtype}"),
                &t,
                &reference(&all, op, dtype),
                dtype,
            )?;
            // reduce_scatter: rank r's inputs[q] is its values shifted by q.
            let inputs: Vec<Tensor> = (0..world)
                .map(|q| tensor(&values(rank, q as f64), dtype))
                .collect::<Result<_>>()?;
            let out = tensor(&[0.0; N], dtype)?;
            pg.reduce_scatter(&out, &inputs, op)?;
            let mine: Vec<Vec<f64>> = (0..world).map(|r| values(r, rank as f64)).collect();
            check(
                &format!("reduce_scatter {op:?} {dtype}"),
                &out,
                &reference(&mine, op, dtype),
                dtype,
            )?;
        }
        let src = world - 1;
        let t = tensor(&all[rank], dtype)?;
        pg.broadcast(&t, src)?;
        check(&format!("broadcast {dtype}"), &t, &all[src], dtype)?;

        let outputs: Vec<Tensor> = (0..world)
            .map(|_| tensor(&[0.0; N], dtype))
            .collect::<Result<_>>()?;
        pg.all_gather(&outputs, &tensor(&all[rank], dtype)?)?;
        for (q, o) in outputs.iter().enumerate() {
            check(&format!("all_gather[{q}] {dtype}"), o, &all[q], dtype)?;
        }
        pg.barrier()?;
    }
    // A strided view is staged through a contiguous copy and written back in place.
    let t = tensor(&all[rank], DType::F32)?;
    let view = t.t()?;
    pg.all_reduce(&view, ReduceOp::Sum)?;
    check(
        "all_reduce of a transposed view",
        &t,
        &reference(&all, ReduceOp::Sum, DType::F32),
        DType::F32,
    )?;
    Ok(())
}

#[test]
fn collectives_on_2_ranks() {
    testing::ranks(2, "collectives_on_2_ranks", || -> Result<()> {
        let pg = init()?;
        assert_eq!(pg.world_size(), 2);
        all_collectives(&pg)?;
        group::destroy_process_group()
    });
}

#[test]
fn collectives_on_3_ranks() {
    testing::ranks(3, "collectives_on_3_ranks", || -> Result<()> {
        let pg = init()?;
        assert_eq!(
            (group::get_world_size()?, group::get_rank()?),
            (3, pg.rank())
        );
        assert!(group::is_initialized());
        all_collectives(&pg)?;
        group::destroy_process_group()?;
        assert!(!group::is_initialized());
        Ok(())
    });
}

#[derive(Debug, Default)]
struct Names(Mutex<Vec<String>>);

impl Subscriber for Names {
    fn on_event(&self, e: &TraceEvent) {
        if let Ok(mut v) = self.0.lock() {
            v.push(e.name.to_string());
        }
    }
}

#[test]
fn async_forms_complete_in_issue_order_and_trace() {
    testing::ranks(
        2,
        "async_forms_complete_in_issue_order_and_trace",
        || -> Result<()> {
            let names = Arc::new(Names::default());
            let sub = trace::subscribe(names.clone());
            let pg = init()?;
            let (rank, world) = (pg.rank(), pg.world_size());
            let all: Vec<Vec<f64>> = (0..world).map(|r| values(r, 0.0)).collect();
            let ts: Vec<Tensor> = (0..4)
                .map(|_| tensor(&all[rank], DType::F32))
                .collect::<Result<_>>()?;
            let mut works = Vec::new();
            for t in &ts {
                works.push(pg.all_reduce_async(t, ReduceOp::Sum)?);
            }
            let b = tensor(&all[rank], DType::F64)?;
            works.push(pg.broadcast_async(&b, 0)?);
            let outs: Vec<Tensor> = (0..world)
                .map(|_| tensor(&[0.0; N], DType::I64))
                .collect::<Result<_>>()?;
            works.push(pg.all_gather_async(&outs, &tensor(&all[rank], DType::I64)?)?);
            let rs = tensor(&[0.0; N], DType::F32)?;
            let rs_in: Vec<Tensor> = (0..world)
                .map(|_| tensor(&all[rank], DType::F32))
                .collect::<Result<_>>()?;
            works.push(pg.reduce_scatter_async(&rs, &rs_in, ReduceOp::Max)?);
            works.push(pg.barrier_async()?);
            // Waiting out of order is fine: the thread runs them in issue order.
            for w in works.iter().rev() {
                w.wait()?;
                assert!(w.is_completed());
            }
            for t in &ts {
                check(
                    "all_reduce_async",
                    t,
                    &reference(&all, ReduceOp::Sum, DType::F32),
                    DType::F32,
                )?;
            }
            check("broadcast_async", &b, &all[0], DType::F64)?;
            for (q, o) in outs.iter().enumerate() {
                check("all_gather_async", o, &all[q], DType::I64)?;
            }
            check(
                "reduce_scatter_async",
                &rs,
                &reference(&all, ReduceOp::Max, DType::F32),
                DType::F32,
            )?;
            drop(sub);
            let seen = names.0.lock().map(|v| v.clone()).unwrap_or_default();
            for name in [
                "mpi:all_reduce",
                "mpi:broadcast",
                "mpi:all_gather",
                "mpi:reduce_scatter",
                "mpi:barrier",
            ] {
                assert!(
                    seen.iter().any(|n| n == name),
                    "no {name} range in {seen:?}"
                );
            }
            group::destroy_process_group()
        },
    );
}

#[test]
fn cuda_tensors_are_staged_through_host_memory() {
    let opts = testing::RunRanks::new(2, "cuda_tensors_are_staged_through_host_memory")
        .env("EMBER_CUDA_EMULATOR", "1");
    let out = testing::in_ranks(&opts, || -> Result<()> {
        let pg = init()?;
        let all: Vec<Vec<f64>> = (0..2).map(|r| values(r, 0.0)).collect();
        let cuda = Device::Cuda(0);
        let t = tensor(&all[pg.rank()], DType::F32)?.to_device(cuda)?;
        pg.all_reduce(&t, ReduceOp::Sum)?;
        assert_eq!(t.device(), cuda);
        check(
            "all_reduce on cuda:0",
            &t,
            &reference(&all, ReduceOp::Sum, DType::F32),
            DType::F32,
        )?;
        let outs: Vec<Tensor> = (0..2)
            .map(|_| tensor(&[0.0; N], DType::Bf16)?.to_device(cuda))
            .collect::<Result<_>>()?;
        pg.all_gather(
            &outs,
            &tensor(&all[pg.rank()], DType::Bf16)?.to_device(cuda)?,
        )?;
        for (q, o) in outs.iter().enumerate() {
            check("all_gather on cuda:0", o, &all[q], DType::Bf16)?;
        }
        group::destroy_process_group()
    });
    if let Some(out) = out {
        assert!(
            out.all_passed(),
            "{}",
            testing::report("cuda staging", &out)
        );
    }
}
