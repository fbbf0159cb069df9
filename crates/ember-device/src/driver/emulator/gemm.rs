//! The emulator's GEMM: cuBLAS's strided-batched GEMM on the CPU.
//!
//! A plain column-major triple loop with f64 accumulation for every element type (so it is a
//! reference rather than a fast kernel). `op(A)` and `op(B)` are first gathered into
//! contiguous f64 panels (rows of `op(A)`, columns of `op(B)`), which also makes `C` aliasing
//! `A` or `B` harmless. As in cuBLAS, `C` is not read when `beta == 0` (NaNs in it do not
//! propagate). `allow_tf32` is ignored: the emulator always computes in f64 and rounds once.
//! Every matrix's extent is bounds-checked through the address translation before any read.

use half::{bf16, f16};

use crate::driver::{DevicePtr, GemmDesc, GemmType};
use crate::error::{DeviceError, Result};

use super::memory::MemoryState;

/// Bytes of one element.
pub(crate) fn element_size(dtype: GemmType) -> usize {
    match dtype {
        GemmType::F32 => 4,
        GemmType::F64 => 8,
        GemmType::F16 | GemmType::Bf16 => 2,
    }
}

pub(crate) fn read(dtype: GemmType, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        GemmType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        GemmType::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        GemmType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        GemmType::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
    }
}

pub(crate) fn write(dtype: GemmType, value: f64, out: &mut [u8]) {
    match dtype {
        GemmType::F32 => out.copy_from_slice(&(value as f32).to_le_bytes()),
        GemmType::F64 => out.copy_from_slice(&value.to_le_bytes()),
        GemmType::F16 => out.copy_from_slice(&f16::from_f64(value).to_le_bytes()),
        GemmType::Bf16 => out.copy_from_slice(&bf16::from_f64(value).to_le_bytes()),
    }
}

/// Elements spanned by `batch` column-major `rows × cols` matrices with leading dimension
/// `ld`, `stride` elements apart; checks `ld >= rows`. `name` is `A`, `B` or `C`.
fn extent(
    name: &str,
    rows: usize,
    cols: usize,
    ld: usize,
    stride: usize,
    batch: usize,
) -> Result<usize> {
    let invalid = |detail: String| DeviceError::Driver {
        call: "cublasGemmStridedBatchedEx",
        code: "CUBLAS_STATUS_INVALID_VALUE".into(),
        detail,
    };
    if ld < rows.max(1) {
        return Err(invalid(format!(
            "leading dimension of {name} must be at least max(1, {rows}) (its stored rows), found {ld}"
        )));
    }
    let one = (rows - 1)
        .checked_add(
            (cols - 1)
                .checked_mul(ld)
                .ok_or_else(|| invalid(format!("{name} is too large")))?,
        )
        .and_then(|x| x.checked_add(1));
    let all = one.and_then(|one| {
        stride
            .checked_mul(batch - 1)
            .and_then(|s| s.checked_add(one))
    });
    all.ok_or_else(|| invalid(format!("{name} is too large")))
}

/// Gather `batch` matrices `op(X)` (`rows × inner` of op) starting at `ptr` into f64.
struct Operand {
    values: Vec<f64>,
}

fn load(mem: &MemoryState, desc: &GemmDesc, ptr: DevicePtr, elements: usize) -> Result<Operand> {
    let size = element_size(desc.dtype);
    let bytes = elements.checked_mul(size).ok_or_else(|| {
        DeviceError::driver("cublasGemmStridedBatchedEx", "CUBLAS_STATUS_INVALID_VALUE")
    })?;
    let slice = mem.slice("cublasGemmStridedBatchedEx", ptr, bytes)?;
    Ok(Operand {
        values: read(desc.dtype, slice),
    })
}

/// Bytes that `C` spans (every batch's matrix), checked.
pub(crate) fn c_bytes(desc: &GemmDesc) -> Result<usize> {
    if desc.m == 0 || desc.n == 0 || desc.batch == 0 {
        return Ok(0);
    }
    extent("C", desc.m, desc.n, desc.ldc, desc.stride_c, desc.batch)?
        .checked_mul(element_size(desc.dtype))
        .ok_or_else(|| {
            DeviceError::driver("cublasGemmStridedBatchedEx", "CUBLAS_STATUS_INVALID_VALUE")
        })
}

/// Run the GEMM described by `desc` on emulated memory.
pub(crate) fn gemm(mem: &mut MemoryState, desc: &GemmDesc) -> Result<()> {
    let GemmDesc { m, n, k, batch, .. } = *desc;
    if m == 0 || n == 0 || batch == 0 {
        return Ok(());
    }
    let size = element_size(desc.dtype);
    let c_extent = extent("C", m, n, desc.ldc, desc.stride_c, batch)?;
    // Panels: a_rows[b][i*k + p] = op(A)(i, p); b_cols[b][j*k + p] = op(B)(p, j).
    let mut a_rows = Vec::new();
    let mut b_cols = Vec::new();
    if k > 0 {
        let (ar, ac) = if desc.trans_a { (k, m) } else { (m, k) };
        let (br, bc) = if desc.trans_b { (n, k) } else { (k, n) };
        let a = load(
            mem,
            desc,
            desc.a,
            extent("A", ar, ac, desc.lda, desc.stride_a, batch)?,
        )?;
        let b = load(
            mem,
            desc,
            desc.b,
            extent("B", br, bc, desc.ldb, desc.stride_b, batch)?,
        )?;
        a_rows = vec![0.0; batch * m * k];
        b_cols = vec![0.0; batch * n * k];
        for bi in 0..batch {
            let (a0, b0) = (bi * desc.stride_a, bi * desc.stride_b);
            for i in 0..m {
                for p in 0..k {
                    let idx = if desc.trans_a {
                        p + i * desc.lda
                    } else {
                        i + p * desc.lda
                    };
                    a_rows[(bi * m + i) * k + p] = a.values[a0 + idx];
                }
            }
            for j in 0..n {
                for p in 0..k {
                    let idx = if desc.trans_b {
                        j + p * desc.ldb
                    } else {
                        p + j * desc.ldb
                    };
                    b_cols[(bi * n + j) * k + p] = b.values[b0 + idx];
                }
            }
        }
    }
    let c_bytes = c_extent.checked_mul(size).ok_or_else(|| {
        DeviceError::driver("cublasGemmStridedBatchedEx", "CUBLAS_STATUS_INVALID_VALUE")
    })?;
    let c = mem.slice_mut("cublasGemmStridedBatchedEx", desc.c, c_bytes)?;
    for bi in 0..batch {
        for j in 0..n {
            for i in 0..m {
                let dot: f64 = if k > 0 {
                    let ar = &a_rows[(bi * m + i) * k..][..k];
                    let bc = &b_cols[(bi * n + j) * k..][..k];
                    ar.iter().zip(bc).map(|(x, y)| x * y).sum()
                } else {
                    0.0
                };
                let at = (bi * desc.stride_c + i + j * desc.ldc) * size;
                let out = &mut c[at..at + size];
                let value = if desc.beta == 0.0 {
                    desc.alpha * dot
                } else {
                    desc.alpha * dot + desc.beta * read(desc.dtype, out)[0]
                };
                write(desc.dtype, value, out);
            }
        }
    }
    Ok(())
}
