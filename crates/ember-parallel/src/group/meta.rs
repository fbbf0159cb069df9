//! The input check shared by the backends: each rank describes its call in [`META`]
//! integers, the backend all-gathers the descriptions (a tiny collective of its own), and
//! [`compare`] fails on every rank alike when they differ (see
//! [`ProcessGroup::set_check_inputs`](super::ProcessGroup::set_check_inputs)).

use ember_autograd::ErrorKind;

use super::{Collective, EngineError, ReduceOp, dtype_code};

/// Length of one rank's description of a call: kind, dtype, op, src, rank of the shape,
/// element count, then up to `META - 6` dims.
pub(crate) const META: usize = 16;

fn op_code(op: ReduceOp) -> i64 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Avg => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Product => 4,
    }
}

const KINDS: [&str; 6] = [
    "?",
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "barrier",
];
const OPS: [&str; 5] = ["sum", "avg", "max", "min", "product"];

pub(crate) fn describe(c: &Collective) -> [i64; META] {
    let (kind, t, op, src) = match c {
        Collective::AllReduce { tensor, op } => (1, Some(tensor), op_code(*op), -1),
        Collective::Broadcast { tensor, src } => (2, Some(tensor), -1, *src as i64),
        Collective::AllGather { input, .. } => (3, Some(input), -1, -1),
        Collective::ReduceScatter { output, op, .. } => (4, Some(output), op_code(*op), -1),
        Collective::Barrier => (5, None, -1, -1),
    };
    let mut m = [-1i64; META];
    m[0] = kind;
    m[2] = op;
    m[3] = src;
    if let Some(t) = t {
        m[1] = dtype_code(t.dtype());
        m[4] = t.rank() as i64;
        m[5] = t.numel() as i64;
        // Dims past the room left are folded into the last slot.
        let room = META - 6;
        for (i, &d) in t.dims().iter().enumerate() {
            let slot = 6 + i.min(room - 1);
            if i < room {
                m[slot] = d as i64;
            } else {
                m[slot] = m[slot].wrapping_mul(31).wrapping_add(d as i64);
            }
        }
    }
    m
}

fn render(row: &[i64]) -> String {
    let kind = usize::try_from(row[0])
        .ok()
        .and_then(|k| KINDS.get(k))
        .copied()
        .unwrap_or("?");
    if row[0] == 5 {
        return kind.to_string();
    }
    let op = usize::try_from(row[2])
        .ok()
        .and_then(|o| OPS.get(o))
        .map(|o| format!("({o})"))
        .unwrap_or_default();
    let src = if row[3] >= 0 {
        format!("(src {})", row[3])
    } else {
        String::new()
    };
    let dtype = super::dtype_of_code(row[1]).map_or("?".to_string(), |d| d.to_string());
    let ndim = usize::try_from(row[4]).unwrap_or(0);
    let dims: Vec<String> = row[6..6 + ndim.min(META - 6)]
        .iter()
        .map(|d| d.to_string())
        .collect();
    let more = if ndim > META - 6 { ", ..." } else { "" };
    format!("{kind}{op}{src} of {dtype} [{}{more}]", dims.join(", "))
}

/// `Ok` when every rank's row of `all` (`META` integers per rank, in rank order) equals
/// `mine`; else the error listing what each rank passed.
pub(crate) fn compare(mine: &[i64; META], all: &[i64]) -> Result<(), EngineError> {
    let rows: Vec<&[i64]> = all.chunks(META).collect();
    if rows.iter().all(|r| *r == mine.as_slice()) {
        return Ok(());
    }
    let kind = if rows.iter().any(|r| r[1] != mine[1]) {
        ErrorKind::DType
    } else {
        ErrorKind::Shape
    };
    let list: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(r, row)| format!("rank {r}: {}", render(row)))
        .collect();
    Err(EngineError::Invalid(
        kind,
        format!("the ranks' inputs differ ({})", list.join("; ")),
    ))
}
