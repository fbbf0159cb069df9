//! Tensor ops on the CPU through `ember-tensor`'s public API, as a user calls them: allocating
//! elementwise ops over 16M f32 (GB/s of bytes read + written), a full sum (GB/s read),
//! softmax + cross-entropy over (4096, 1000) (ms), and the cost of one op on tiny tensors
//! (µs). The PyTorch side of the same cases is in `bench/torch_side_by_side.py`.

use std::time::Instant;

use ember_tensor::{CrossEntropyOptions, DType, Tensor};

use crate::harness::{Options, Record, ns_per_iter};

const ROUNDS: usize = 5;
/// Time of one round, in seconds.
const ROUND_S: f64 = 0.2;
const N16M: usize = 16 * 1024 * 1024;

type Case = fn() -> Result<(Box<dyn FnMut() -> ember_tensor::Result<Tensor>>, Work), String>;

/// What one call does, for turning a time into the record's unit.
#[derive(Clone, Copy)]
enum Work {
    /// Bytes moved: the record is GB/s.
    Bytes(f64),
    /// The record is milliseconds per call.
    Millis,
    /// The record is microseconds per call.
    Micros,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn randn(shape: &[usize]) -> Result<Tensor, String> {
    Tensor::randn(shape, ()).map_err(err)
}

const CASES: [(&str, Case); 6] = [
    ("add_f32_16m", || {
        let (a, b) = (randn(&[N16M])?, randn(&[N16M])?);
        Ok((Box::new(move || a.add(&b)), Work::Bytes(12.0 * N16M as f64)))
    }),
    ("relu_f32_16m", || {
        let x = randn(&[N16M])?;
        Ok((Box::new(move || x.relu()), Work::Bytes(8.0 * N16M as f64)))
    }),
    ("exp_f32_16m", || {
        let x = randn(&[N16M])?;
        Ok((Box::new(move || x.exp()), Work::Bytes(8.0 * N16M as f64)))
    }),
    ("sum_f32_16m", || {
        let x = randn(&[N16M])?;
        Ok((
            Box::new(move || x.sum_all()),
            Work::Bytes(4.0 * N16M as f64),
        ))
    }),
    ("softmax_ce_4096x1000", || {
        let logits = randn(&[4096, 1000])?;
        let target = Tensor::randint(0, 1000, [4096], DType::I64).map_err(err)?;
        let opts = CrossEntropyOptions::new();
        Ok((
            Box::new(move || logits.cross_entropy(&target, &opts)),
            Work::Millis,
        ))
    }),
    ("tiny_op_overhead", || {
        let (a, b) = (randn(&[4])?, randn(&[4])?);
        Ok((Box::new(move || a.add(&b)), Work::Micros))
    }),
];

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    if !opts.cpu() {
        return Ok(());
    }
    let threads = rayon::current_num_threads();
    for (name, setup) in CASES {
        if !opts.wants(name) {
            continue;
        }
        let (mut f, work) = setup().map_err(|e| format!("{name}: {e}"))?;
        let t = Instant::now();
        f().map_err(|e| format!("{name}: {e}"))?;
        let once = t.elapsed().as_secs_f64().max(1e-7);
        let iters = ((ROUND_S / once) as usize).clamp(1, 100_000);
        let ns = ns_per_iter(ROUNDS, iters, || {
            let _ = f();
        });
        let (value, unit) = match work {
            Work::Bytes(b) => (b / ns, "GB/s"),
            Work::Millis => (ns * 1e-6, "ms"),
            Work::Micros => (ns * 1e-3, "us"),
        };
        out.push(Record {
            name: name.to_string(),
            device: "cpu".to_string(),
            threads,
            value,
            unit,
            extra: serde_json::Map::new(),
        });
    }
    Ok(())
}
