//! Data and host references shared by the NCCL tests: values exact in every type, the naive
//! reduction, and tolerant comparison.
#![allow(dead_code, clippy::unwrap_used)]

use ember_device::driver::{NcclType, ReduceOp};
use half::{bf16, f16};

pub const DTYPES: [NcclType; 5] = [
    NcclType::F32,
    NcclType::F16,
    NcclType::Bf16,
    NcclType::F64,
    NcclType::I64,
];
pub const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

pub fn encode(dtype: NcclType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in values {
        match dtype {
            NcclType::F32 => out.extend((v as f32).to_le_bytes()),
            NcclType::F64 => out.extend(v.to_le_bytes()),
            NcclType::F16 => out.extend(f16::from_f64(v).to_le_bytes()),
            NcclType::Bf16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            NcclType::I64 => out.extend((v as i64).to_le_bytes()),
            NcclType::I32 => out.extend((v as i32).to_le_bytes()),
            NcclType::I8 | NcclType::U8 => out.push(v as i64 as u8),
        }
    }
    out
}

pub fn decode(dtype: NcclType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size())
        .map(|c| match dtype {
            NcclType::F32 => f64::from(f32::from_le_bytes(c.try_into().unwrap())),
            NcclType::F64 => f64::from_le_bytes(c.try_into().unwrap()),
            NcclType::F16 => f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            NcclType::Bf16 => bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            NcclType::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            NcclType::I32 => f64::from(i32::from_le_bytes(c.try_into().unwrap())),
            NcclType::I8 => f64::from(c[0] as i8),
            NcclType::U8 => f64::from(c[0]),
        })
        .collect()
}

/// Small integers (exact in every type, products of three included), distinct per rank.
pub fn data(rank: usize, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7 + rank * 5 + 3) % 9) as f64 - 4.0)
        .collect()
}

/// The reduction of `inputs` by the naive loop, then rounded as the type stores it.
pub fn reference(dtype: NcclType, op: ReduceOp, inputs: &[Vec<f64>]) -> Vec<f64> {
    let n = inputs.len();
    (0..inputs[0].len())
        .map(|i| {
            let col = inputs.iter().map(|v| v[i]);
            let r = match op {
                ReduceOp::Sum => col.sum(),
                ReduceOp::Avg => {
                    let s: f64 = col.sum();
                    if dtype == NcclType::I64 {
                        ((s as i64) / n as i64) as f64
                    } else {
                        s / n as f64
                    }
                }
                ReduceOp::Prod => col.product(),
                ReduceOp::Max => col.fold(f64::MIN, f64::max),
                ReduceOp::Min => col.fold(f64::MAX, f64::min),
            };
            decode(dtype, &encode(dtype, &[r]))[0]
        })
        .collect()
}

pub fn tol(dtype: NcclType) -> f64 {
    match dtype {
        NcclType::F16 => 1e-3,
        NcclType::Bf16 => 1e-2,
        NcclType::F32 => 1e-6,
        _ => 0.0,
    }
}

pub fn assert_values(dtype: NcclType, got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol(dtype) * w.abs().max(1.0),
            "{what} ({dtype:?}) element {i}: got {g}, expected {w}"
        );
    }
}
