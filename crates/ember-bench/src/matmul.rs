//! Matrix products through `ember-gemm`: squares (f32, bf16, f16) and the GEMMs of an MLP
//! training step (small M, one operand transposed), in GFLOP/s. Each record names the
//! backend that ran it; `*_rust` records run the pure-Rust backend whatever is active, so
//! both can be compared in one run.

use std::time::Instant;

use ember_gemm::{Backend, Element, MatMut, MatRef, Parallelism, bf16, f16, gemm, gemm_with};

use crate::harness::{Options, Record, ns_per_iter};

const ROUNDS: usize = 5;
/// Time of one round, in seconds.
const ROUND_S: f64 = 0.15;

/// Which operand a training-shape case reads transposed, as PyTorch's `Linear` does.
#[derive(Clone, Copy, Debug)]
enum Trans {
    None,
    /// `x @ w.t()`: the forward pass.
    B,
    /// `x.t() @ dy`: the weight gradient.
    A,
}

/// (m, k, n, transposed operand): one 1000→512 layer at batch 64 and one 2000→1000 layer at
/// batch 128, forward and both backward products.
const TRAINING: [(usize, usize, usize, Trans); 6] = [
    (64, 1000, 512, Trans::B),
    (64, 512, 1000, Trans::None),
    (1000, 64, 512, Trans::A),
    (128, 2000, 1000, Trans::B),
    (128, 1000, 2000, Trans::None),
    (2000, 128, 1000, Trans::A),
];

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    if !opts.cpu() {
        return Ok(());
    }
    for n in [128, 256, 512, 1024, 2048] {
        let name = format!("matmul_f32_n{n}");
        case::<f32>(opts, out, &name, (n, n, n, Trans::None))?;
    }
    for n in [1024, 2048] {
        case::<bf16>(
            opts,
            out,
            &format!("matmul_bf16_n{n}"),
            (n, n, n, Trans::None),
        )?;
    }
    case::<f16>(
        opts,
        out,
        "matmul_f16_n1024",
        (1024, 1024, 1024, Trans::None),
    )?;
    for shape in TRAINING {
        let name = format!("matmul_f32_{}x{}x{}", shape.0, shape.1, shape.2);
        case::<f32>(opts, out, &name, shape)?;
    }
    Ok(())
}

/// Times one shape on the active backend (record `name`) and, for f32, on the Rust backend
/// (record `{name}_rust`).
fn case<T: Element>(
    opts: &Options,
    out: &mut Vec<Record>,
    name: &str,
    (m, k, n, trans): (usize, usize, usize, Trans),
) -> Result<(), String> {
    let rust_name = format!("{name}_rust");
    let want_rust = T::DTYPE == ember_gemm::DType::F32 && opts.wants(&rust_name);
    if !opts.wants(name) && !want_rust {
        return Ok(());
    }
    let a: Vec<T> = (0..m * k)
        .map(|i| T::from_f32(((i % 17) as f32 - 8.0) / 8.0))
        .collect();
    let b: Vec<T> = (0..k * n)
        .map(|i| T::from_f32(((i % 13) as f32 - 6.0) / 6.0))
        .collect();
    let mut c: Vec<T> = vec![T::from_f32(0.0); m * n];
    let av = match trans {
        Trans::A => MatRef::row_major(&a, k, m).t(),
        _ => MatRef::row_major(&a, m, k),
    };
    let bv = match trans {
        Trans::B => MatRef::row_major(&b, n, k).t(),
        _ => MatRef::row_major(&b, k, n),
    };
    let flops = 2.0 * (m * n * k) as f64;
    let threads = rayon::current_num_threads();
    let mut time = |forced: Option<Backend>| -> Result<(f64, Backend), String> {
        let mut run = || match forced {
            Some(be) => gemm_with(
                be,
                av,
                bv,
                MatMut::row_major(&mut c, m, n),
                1.0,
                0.0,
                Parallelism::All,
            ),
            None => gemm(
                av,
                bv,
                MatMut::row_major(&mut c, m, n),
                1.0,
                0.0,
                Parallelism::All,
            ),
        };
        let t = Instant::now();
        let used = run().map_err(|e| format!("{name}: {e}"))?;
        let once = t.elapsed().as_secs_f64().max(1e-7);
        let iters = ((ROUND_S / once) as usize).clamp(1, 10_000);
        let ns = ns_per_iter(ROUNDS, iters, || {
            let _ = run();
        });
        Ok((flops / ns, used))
    };
    if opts.wants(name) {
        let (gflops, used) = time(None)?;
        out.push(record(name, threads, gflops, used, (m, k, n)));
    }
    if want_rust {
        let (gflops, used) = time(Some(Backend::Rust))?;
        out.push(record(&rust_name, threads, gflops, used, (m, k, n)));
    }
    Ok(())
}

fn record(
    name: &str,
    threads: usize,
    gflops: f64,
    used: Backend,
    mkn: (usize, usize, usize),
) -> Record {
    let mut extra = serde_json::Map::new();
    extra.insert("backend".into(), used.name().into());
    extra.insert("m".into(), mkn.0.into());
    extra.insert("k".into(), mkn.1.into());
    extra.insert("n".into(), mkn.2.into());
    Record {
        name: name.to_string(),
        device: "cpu".to_string(),
        threads,
        value: gflops,
        unit: "GFLOP/s",
        extra,
    }
}
