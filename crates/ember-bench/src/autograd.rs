//! `autograd_chain_1000`: the overhead of autograd per op — recording a chain of 1000
//! small ops (`y = y * 1.0001` on 4 floats) and running backward through it, in µs per
//! op. The PyTorch side runs the same chain in `bench/torch_side_by_side.py`; the target is
//! at most 0.3× PyTorch's time per op.

use ember_autograd::Tensor;
use ember_device::Device;
use ember_tensor::DType;

use crate::harness::{Options, Record, ns_per_iter};

const CHAIN: usize = 1000;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One forward + backward over the chain.
fn chain(x: &Tensor) -> ember_autograd::Result<()> {
    let mut y = x.clone();
    for _ in 0..CHAIN {
        y = y.mul(1.0001)?;
    }
    y.sum_all()?.backward()?;
    x.set_grad(None)
}

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    let name = "autograd_chain_1000";
    if !opts.wants(name) || !opts.cpu() {
        return Ok(());
    }
    let x = Tensor::randn([4], (&Device::Cpu, DType::F32))
        .and_then(|t| t.requires_grad_(true))
        .map_err(err)?;
    chain(&x).map_err(err)?;
    let t = std::time::Instant::now();
    chain(&x).map_err(err)?;
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let iters = ((0.2 / once) as usize).clamp(1, 10_000);
    let ns = ns_per_iter(5, iters, || {
        let _ = chain(&x);
    });
    out.push(Record {
        name: name.to_string(),
        device: Device::Cpu.to_string(),
        threads: rayon::current_num_threads(),
        value: ns * 1e-3 / CHAIN as f64,
        unit: "us",
        extra: serde_json::Map::new(),
    });
    Ok(())
}
