//! The fused scaled-dot-product attention on untracked tensors: the operands already brought
//! to the kernels' 4-D layouts by the op (`ops/attention.rs`), one call down through
//! `backend_fused.rs` to the CPU or CUDA kernels (docs/attention.md) for the forward and one
//! for the backward. The profiler sees PyTorch's names of the fused ops
//! (`_scaled_dot_product_flash_attention` on CUDA, `..._for_cpu` on the CPU, and their
//! `_backward`s).

use crate::backend_fused::AttnOperands;
use crate::cpu::attention::AttnOptions;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::profile::Input;
use crate::raw::{RawTensor, same_device};
use crate::storage::read_many;

/// The operands of one fused attention: q `[B, H, L, E]`, k `[B, G, S, E]`, v
/// `[B, G, S, Ev]` with unit last stride, the mask (bool or the operands' dtype) expanded to
/// `[B, H, L, S]`.
#[derive(Clone, Debug)]
pub(crate) struct FusedAttention {
    pub q: RawTensor,
    pub k: RawTensor,
    pub v: RawTensor,
    pub mask: Option<RawTensor>,
    pub opts: AttnOptions,
}

impl FusedAttention {
    fn cuda(&self) -> bool {
        self.q.device().is_cuda()
    }

    fn tensors(&self) -> Vec<&RawTensor> {
        let mut all = vec![&self.q, &self.k, &self.v];
        all.extend(self.mask.as_ref());
        all
    }

    /// Runs `f` on the operands' storages.
    fn with_operands<R>(
        &self,
        extra: &[&RawTensor],
        f: impl FnOnce(&AttnOperands<'_>, &[&crate::storage::Storage]) -> Result<R>,
    ) -> Result<R> {
        let mut all = self.tensors();
        let n = all.len();
        all.extend(extra);
        same_device(&all)?;
        let cells: Vec<_> = all.iter().map(|t| t.cell()).collect();
        read_many(&cells, |s| {
            let ops = AttnOperands {
                q: (s[0], self.q.layout()),
                k: (s[1], self.k.layout()),
                v: (s[2], self.v.layout()),
                mask: self.mask.as_ref().map(|m| (s[3], m.layout())),
            };
            f(&ops, &s[n..])
        })
    }

    /// `true` when nothing is attended or nothing comes out (no query, no key, no output
    /// dim): the output is zeros (or empty), the gradients zeros, with no kernel launched
    /// (an empty operand has no device address to give one).
    fn trivial(&self) -> bool {
        let (q, v) = (self.q.dims(), self.v.dims());
        q[0] * q[1] * q[2] == 0 || v[2] == 0 || v[3] == 0
    }

    /// The dtype of the saved log-sum-exp: f32, f64 for f64 on the CPU.
    fn lse_dtype(&self) -> DType {
        if self.q.dtype() == DType::F64 && !self.cuda() {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// `(out [B, H, L, Ev], lse [B, H, L])`: out in the operands' dtype, lse f32 on CUDA and
    /// the CPU's compute dtype on the CPU (f64 for f64); `+inf` for rows without keys.
    pub(crate) fn forward(&self) -> Result<(RawTensor, RawTensor)> {
        let name = if self.cuda() {
            "_scaled_dot_product_flash_attention"
        } else {
            "_scaled_dot_product_flash_attention_for_cpu"
        };
        let inputs: Vec<Input<'_>> = self.tensors().into_iter().map(Input::from).collect();
        let _op = crate::profile::op(name, &inputs);
        let (q, v) = (self.q.dims(), self.v.dims());
        let (b, h, len) = (q[0], q[1], q[2]);
        if self.trivial() {
            let dev = self.q.device();
            // No keys: +inf, as the kernels write (with keys but Ev = 0 the backward,
            // trivial too, does not read it).
            let lse = if v[2] == 0 { f64::INFINITY } else { 0.0 };
            return Ok((
                RawTensor::zeros([b, h, len, v[3]], (dev, self.q.dtype()))?,
                RawTensor::full([b, h, len], lse, (dev, self.lse_dtype()))?,
            ));
        }
        let (o, l) = self.with_operands(&[], |ops, _| ops.attention_fwd(&self.opts))?;
        Ok((
            RawTensor::from_storage(o, [b, h, len, v[3]]),
            RawTensor::from_storage(l, [b, h, len]),
        ))
    }

    /// `(dq, dk, dv)` shaped as q, k, v (contiguous), from the forward's `out` and `lse`
    /// (as [`FusedAttention::forward`] returned them) and the output gradient `dout`
    /// (`[B, H, L, Ev]`, unit last stride, the operands' dtype).
    pub(crate) fn backward(
        &self,
        out: &RawTensor,
        lse: &RawTensor,
        dout: &RawTensor,
    ) -> Result<(RawTensor, RawTensor, RawTensor)> {
        let name = if self.cuda() {
            "_scaled_dot_product_flash_attention_backward"
        } else {
            "_scaled_dot_product_flash_attention_for_cpu_backward"
        };
        let _op = crate::profile::op(
            name,
            &[
                dout.as_input(),
                self.q.as_input(),
                self.k.as_input(),
                self.v.as_input(),
                out.as_input(),
                lse.as_input(),
            ],
        );
        if !out.is_contiguous() || out.storage_offset() != 0 || out.storage_len() != out.numel() {
            return Err(TensorError::invalid(
                "scaled_dot_product_attention",
                "expected the forward's own output (internal error)",
            ));
        }
        if self.trivial() {
            return Ok((
                self.q.zeros_like()?,
                self.k.zeros_like()?,
                self.v.zeros_like()?,
            ));
        }
        let (gq, gk, gv) = self.with_operands(&[out, lse, dout], |ops, s| {
            ops.attention_bwd(&self.opts, s[0], s[1], (s[2], dout.layout()))
        })?;
        Ok((
            RawTensor::from_storage(gq, self.q.shape().clone()),
            RawTensor::from_storage(gk, self.k.shape().clone()),
            RawTensor::from_storage(gv, self.v.shape().clone()),
        ))
    }
}
