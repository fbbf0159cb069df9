//! The CPU attention backward (FlashAttention-2's, on the CPU): per (batch, kv head) task,
//! every block of queries of each of the group's query heads against every block of keys,
//! recomputing `P = exp(s - lse)` from q, k and the forward's log-sum-exp, with
//! `delta_i = Σ dout_i·out_i`:
//!
//! - `dv_j += Σ_i P_ij Z_ij dout_i`, `dS_ij = P_ij (Z_ij (dout_i · v_j) - delta_i)`,
//! - `dk_j += scale Σ_i dS_ij q_i`, `dq_i += scale Σ_j dS_ij k_j`.
//!
//! dk and dv of the task's kv head accumulate in `S × dim` buffers (O(S), not O(L·S)); the
//! task owns them and its heads' rows of dq, so tasks never reduce into shared memory and the
//! result does not depend on the number of threads.

use ember_gemm::parallel::for_each_chunk_mut;

use super::{
    AttnDims, AttnElem, AttnFloat, AttnMask, AttnOptions, AttnView, BK, BQ, dropout_factors,
    dropout_index, invalid, key_end, load_rows, madd, mask_row, padded, split_pieces,
};
use crate::error::Result;
use crate::math::FastExp;

/// The gradients of q, k and v (`dq` `[B, H, L, E]`, `dk` `[B, G, S, E]`, `dv`
/// `[B, G, S, Ev]`, contiguous) from the forward's `out` (`[B, H, L, Ev]`, contiguous) and
/// `lse`, and the output gradient `dout`; the same `opts` (and dropout stream) as the
/// forward.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward<T: AttnElem>(
    dims: &AttnDims,
    (q, k, v): (AttnView<'_, T>, AttnView<'_, T>, AttnView<'_, T>),
    mask: AttnMask<'_, T>,
    opts: &AttnOptions,
    (out, dout, lse): (&[T], AttnView<'_, T>, &[T::Acc]),
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) -> Result<()> {
    dims.check()?;
    let d = *dims;
    let (l, s, e, ev) = (d.len_q, d.len_kv, d.dim_qk, d.dim_v);
    q.check("q", [d.batch, d.heads, l, e])?;
    k.check("k", [d.batch, d.kv_heads, s, e])?;
    v.check("v", [d.batch, d.kv_heads, s, ev])?;
    dout.check("the output gradient", [d.batch, d.heads, l, ev])?;
    mask.check(dims)?;
    let (rows, keys) = (d.batch * d.heads * l, d.batch * d.kv_heads * s);
    let sizes = [out.len(), lse.len(), dq.len(), dk.len(), dv.len()];
    if sizes != [rows * ev, rows, rows * e, keys * e, keys * ev] {
        return Err(invalid(format!(
            "expected out, lse, dq, dk, dv of {:?} elements, found {sizes:?} (internal error)",
            [rows * ev, rows, rows * e, keys * e, keys * ev]
        )));
    }
    let tasks = d.batch * d.kv_heads;
    let group = d.group();
    let mut work: Vec<_> = split_pieces(dq, (0..tasks).map(|_| group * l * e))
        .into_iter()
        .zip(split_pieces(dk, (0..tasks).map(|_| s * e)))
        .zip(split_pieces(dv, (0..tasks).map(|_| s * ev)))
        .enumerate()
        .collect();
    let saved = Saved { out, dout, lse };
    for_each_chunk_mut(&mut work, 1, |_, task| {
        for (t, ((dq, dk), dv)) in task.iter_mut() {
            crate::cpu::simd::widest(
                #[inline(always)]
                || backward_task(&d, (&q, &k, &v), &mask, opts, &saved, *t, (dq, dk, dv)),
            );
        }
    });
    Ok(())
}

/// What the backward reads of the forward and the output gradient.
struct Saved<'a, T: AttnElem> {
    out: &'a [T],
    dout: AttnView<'a, T>,
    lse: &'a [T::Acc],
}

/// The tile buffers of one task (columns padded to whole groups, zero past the data).
struct Scratch<C> {
    q: Vec<C>,
    dout: Vec<C>,
    kt: Vec<C>,
    k: Vec<C>,
    vt: Vec<C>,
    s: Vec<C>,
    dp: Vec<C>,
    dq: Vec<C>,
    z: Vec<C>,
}

/// Kv head `t % G` of batch `t / G`: its rows of dk and dv, and dq of its query heads.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn backward_task<T: AttnElem>(
    d: &AttnDims,
    (q, k, v): (&AttnView<'_, T>, &AttnView<'_, T>, &AttnView<'_, T>),
    mask: &AttnMask<'_, T>,
    opts: &AttnOptions,
    saved: &Saved<'_, T>,
    t: usize,
    (dq, dk, dv): (&mut [T], &mut [T], &mut [T]),
) {
    let zero = T::Acc::ZERO;
    let (b, g) = (t / d.kv_heads, t % d.kv_heads);
    let (l, s, e, ev) = (d.len_q, d.len_kv, d.dim_qk, d.dim_v);
    let (ep, evp, bkp) = (padded(e), padded(ev), padded(BK));
    let scale = T::Acc::from_f64(opts.scale);
    let keep = opts.dropout.map(|dr| T::Acc::from_f64(1.0 / (1.0 - dr.p)));
    let mut dk_acc = vec![zero; s * ep];
    let mut dv_acc = vec![zero; s * evp];
    let mut w = Scratch {
        q: vec![zero; BQ * ep],
        dout: vec![zero; BQ * evp],
        kt: vec![zero; e * bkp],
        k: vec![zero; BK * ep],
        vt: vec![zero; ev * bkp],
        s: vec![zero; BQ * bkp],
        dp: vec![zero; BQ * bkp],
        dq: vec![zero; BQ * ep],
        z: vec![zero; BK],
    };
    let mut delta = [zero; BQ];
    let group = d.group();
    for hh in 0..group {
        let h = g * group + hh;
        let bh = b * d.heads + h;
        let mut q0 = 0;
        while q0 < l {
            let rows = (l - q0).min(BQ);
            load_rows(q, (b, h), q0, rows, e, &mut w.q, ep, false);
            load_rows(&saved.dout, (b, h), q0, rows, ev, &mut w.dout, evp, false);
            for (r, dl) in delta.iter_mut().enumerate().take(rows) {
                let o = &saved.out[(bh * l + q0 + r) * ev..][..ev];
                *dl = o
                    .iter()
                    .zip(&w.dout[r * evp..][..ev])
                    .fold(zero, |acc, (&x, &y)| x.widen().fma(y, acc));
            }
            let lse = &saved.lse[bh * l + q0..][..rows];
            w.dq.fill(zero);
            let n_end = key_end(d, opts, q0 + rows);
            let mut k0 = 0;
            while k0 < n_end {
                let nk = (n_end - k0).min(BK);
                load_rows(k, (b, g), k0, nk, e, &mut w.kt, bkp, true);
                load_rows(k, (b, g), k0, nk, e, &mut w.k, ep, false);
                load_rows(v, (b, g), k0, nk, ev, &mut w.vt, bkp, true);
                w.s.fill(zero);
                w.dp.fill(zero);
                madd((rows, nk, e), &w.q, (ep, 1), &w.kt, bkp, &mut w.s, bkp);
                madd(
                    (rows, nk, ev),
                    &w.dout,
                    (evp, 1),
                    &w.vt,
                    bkp,
                    &mut w.dp,
                    bkp,
                );
                for r in 0..rows {
                    let i = q0 + r;
                    let sr = &mut w.s[r * bkp..][..nk];
                    mask_row(sr, scale, mask, (b, h, i), k0, opts.causal);
                    let dpr = &mut w.dp[r * bkp..][..nk];
                    let z = &mut w.z[..nk];
                    match (opts.dropout, keep) {
                        (Some(dr), Some(keep)) => {
                            dropout_factors(&dr, dropout_index(d, bh, i, k0), z, keep)
                        }
                        _ => z.fill(T::Acc::ONE),
                    }
                    // s becomes P∘Z (dv's weights), dp becomes dS (dk's and dq's).
                    for ((x, y), &f) in sr.iter_mut().zip(dpr.iter_mut()).zip(z.iter()) {
                        let p = (*x - lse[r]).fast_exp();
                        *y = p * (f * *y - delta[r]);
                        *x = p * f;
                    }
                }
                madd(
                    (nk, ev, rows),
                    &w.s,
                    (1, bkp),
                    &w.dout,
                    evp,
                    &mut dv_acc[k0 * evp..],
                    evp,
                );
                madd(
                    (nk, e, rows),
                    &w.dp,
                    (1, bkp),
                    &w.q,
                    ep,
                    &mut dk_acc[k0 * ep..],
                    ep,
                );
                madd((rows, e, nk), &w.dp, (bkp, 1), &w.k, ep, &mut w.dq, ep);
                k0 += BK;
            }
            let dq_rows = &mut dq[(hh * l + q0) * e..][..rows * e];
            for (r, o) in dq_rows.chunks_mut(e.max(1)).enumerate() {
                for (x, &a) in o.iter_mut().zip(&w.dq[r * ep..]) {
                    *x = T::narrow(a * scale);
                }
            }
            q0 += rows;
        }
    }
    for j in 0..s {
        for (x, &a) in dk[j * e..][..e].iter_mut().zip(&dk_acc[j * ep..]) {
            *x = T::narrow(a * scale);
        }
        for (x, &a) in dv[j * ev..][..ev].iter_mut().zip(&dv_acc[j * evp..]) {
            *x = T::narrow(a);
        }
    }
}
