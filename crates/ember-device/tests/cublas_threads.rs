#![allow(clippy::unwrap_used)]
//! cuBLAS across host threads (Note [cuBLAS handles], Note [Emulated cuBLAS]): two threads
//! on two streams of one emulated device run GEMMs of different shapes at once. Each result
//! must equal a naive f64 loop, and each thread's GEMMs must have run on its own stream. With
//! one handle per device shared by the threads (the drivers before the handle pool), the
//! emulated cuBLAS runs a thread's GEMM on the other's stream and hands it the other's
//! result through the shared workspace, and this test fails.

use std::sync::Barrier;

use ember_device::driver::emulator::{Emulator, EmulatorConfig, thread_gemm_streams};
use ember_device::driver::{DevicePtr, Driver, GemmDesc, GemmType, StreamHandle};

const ROUNDS: usize = 300;

fn upload(e: &Emulator, s: StreamHandle, v: &[f32]) -> DevicePtr {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let p = e.malloc(0, bytes.len()).unwrap();
    e.memcpy_htod(p, &bytes, s).unwrap();
    p
}

/// `C = A·B` column-major, `m×k` by `k×n`, in f64 rounded to f32.
fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for j in 0..n {
        for i in 0..m {
            let dot: f64 = (0..k)
                .map(|p| f64::from(a[i + p * m]) * f64::from(b[p + j * k]))
                .sum();
            c[i + j * m] = dot as f32;
        }
    }
    c
}

/// One thread's GEMMs of shape `m×n×k` on its own stream; the rounds whose result was wrong.
fn worker(e: &Emulator, barrier: &Barrier, (m, n, k): (usize, usize, usize), seed: f32) -> usize {
    let s = e.stream_create(0).unwrap();
    let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11 - seed).cos()).collect();
    let want = reference(m, n, k, &a, &b);
    let (pa, pb) = (upload(e, s, &a), upload(e, s, &b));
    let pc = e.malloc(0, m * n * 4).unwrap();
    let desc = GemmDesc {
        trans_a: false,
        trans_b: false,
        m,
        n,
        k,
        alpha: 1.0,
        beta: 0.0,
        a: pa,
        lda: m,
        stride_a: m * k,
        b: pb,
        ldb: k,
        stride_b: k * n,
        c: pc,
        ldc: m,
        stride_c: m * n,
        batch: 1,
        dtype: GemmType::F32,
        allow_tf32: false,
    };
    let before = thread_gemm_streams();
    barrier.wait();
    let mut wrong = 0;
    for _ in 0..ROUNDS {
        e.memset_d8_async(pc, 0, m * n * 4, s).unwrap();
        e.gemm(0, s, &desc).unwrap();
        let mut out = vec![0u8; m * n * 4];
        e.memcpy_dtoh(&mut out, pc, s).unwrap();
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if got
            .iter()
            .zip(&want)
            .any(|(g, w)| (g - w).abs() > 1e-5 * w.abs().max(1.0))
        {
            wrong += 1;
        }
    }
    let after = thread_gemm_streams();
    let ran: Vec<(u64, u64)> = after
        .iter()
        .map(|(&st, &n)| (st, n - before.get(&st).copied().unwrap_or(0)))
        .filter(|&(_, n)| n > 0)
        .collect();
    assert_eq!(
        ran,
        [(s.0, 2 * ROUNDS as u64)],
        "this thread's GEMM kernels ran on streams {ran:?}, not all on its own {s:?}"
    );
    e.stream_destroy(s).unwrap();
    wrong
}

#[test]
fn two_threads_on_two_streams_get_their_own_results() {
    let e = Emulator::new(EmulatorConfig::devices(1)).unwrap();
    let barrier = Barrier::new(2);
    let wrong: Vec<usize> = std::thread::scope(|scope| {
        let a = scope.spawn(|| worker(&e, &barrier, (7, 5, 3), 0.5));
        let b = scope.spawn(|| worker(&e, &barrier, (4, 9, 6), 1.5));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    assert_eq!(wrong, [0, 0], "rounds with a wrong result, per thread");
}
