//! The seam's convolution calls: value types of [`super::Driver::conv`],
//! [`super::Driver::conv_algorithms`] and [`super::Driver::cudnn_version`]. See Note [cuDNN
//! convolutions through the seam].
//!
//! Note [cuDNN convolutions through the seam]:
//!
//! A 2-D convolution is cuDNN's legacy convolution API cut to what Ember needs, as
//! [`super::GemmDesc`] is cuBLAS's strided-batched GEMM: a [`ConvProblem`] (direction,
//! NCHW shapes and element strides, padding, stride, dilation, groups, element type, TF32
//! allowed or not) is asked for its algorithms ([`super::Driver::conv_algorithms`]: cuDNN's
//! heuristics, `cudnnGetConvolution*Algorithm_v7`, or a timed search over real buffers,
//! `cudnnFindConvolution*AlgorithmEx`), and a [`ConvDesc`] (the problem, the chosen
//! algorithm, alpha/beta and the buffers with a workspace) runs one
//! ([`super::Driver::conv`]). Choosing among the algorithms (benchmark mode, determinism,
//! what the workspace allocation allows) and caching the choice is the caller's business
//! (`ember-tensor`'s CUDA backend). Behind the seam, the real driver's graph API keeps
//! state of its own: the plans it makes per problem, cached, and which of them a run takes.
//!
//! Roles are fixed by the forward computation whatever the direction: `x` is the input
//! `[n, c, h, w]`, `w` the filter `[k, c / groups, r, s]` (always packed), `y` the output
//! `[n, k, p, q]`. Forward writes `y` from `x` and `w`; backward-data writes `x` (the input
//! gradient) from `y` (the output gradient) and `w`; backward-filter writes `w` from `x` and
//! `y`. The written tensor is `alpha · result + beta · itself`, and is not read when
//! `beta == 0`. `x` and `y` may be strided (element strides); padding is symmetric and `y`'s
//! spatial size must be `(h + 2·pad - dilation·(r - 1) - 1) / stride + 1`, as cuDNN's
//! cross-correlation mode requires. Algorithms are numbered as cuDNN numbers them per
//! direction (`cudnnConvolutionFwdAlgo_t`, `...BwdDataAlgo_t`, `...BwdFilterAlgo_t`).
//!
//! `align` is the buffers' byte alignment (up to 16), which the caller computes from the
//! addresses it passes: the real driver plans cuDNN's graph API for it (Note [cuDNN's graph
//! API] in `real/cudnn_graph.rs`; its algorithms are numbered from `GRAPH_ALGO_BASE`), and
//! the emulator checks that every buffer of a run has it.
//!
//! The emulator serves these calls with a direct f64-accumulating convolution and a small,
//! documented table of pretend algorithms (with workspace sizes, determinism and modelled
//! times), so the whole selection logic runs in CI; it can also pretend that cuDNN is absent
//! or rejects a shape (`emulator::EmulatedCudnn`).

use serde::{Deserialize, Serialize};

use super::{DevicePtr, GemmType};

/// Which of the three convolution computations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConvDirection {
    /// `y = conv(x, w)`.
    Forward,
    /// The input gradient: `x` from `y` and `w`.
    BackwardData,
    /// The filter gradient: `w` from `x` and `y`.
    BackwardFilter,
}

impl ConvDirection {
    /// `"forward"`, `"backward-data"` or `"backward-filter"`.
    pub fn name(self) -> &'static str {
        match self {
            ConvDirection::Forward => "forward",
            ConvDirection::BackwardData => "backward-data",
            ConvDirection::BackwardFilter => "backward-filter",
        }
    }
}

/// One 2-D convolution, without its buffers. See Note [cuDNN convolutions through the seam].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvProblem {
    /// What is computed.
    pub direction: ConvDirection,
    /// Element type of `x`, `w` and `y` (f16/bf16 accumulate in f32, f64 in f64).
    pub dtype: GemmType,
    /// Input `[n, c, h, w]`.
    pub x_dims: [usize; 4],
    /// Element strides of `x`.
    pub x_strides: [usize; 4],
    /// Filter `[k, c / groups, r, s]`, packed.
    pub w_dims: [usize; 4],
    /// Output `[n, k, p, q]`.
    pub y_dims: [usize; 4],
    /// Element strides of `y`.
    pub y_strides: [usize; 4],
    /// Zero padding on both sides (height, width).
    pub pad: (usize, usize),
    /// Stride (height, width), at least 1.
    pub stride: (usize, usize),
    /// Dilation (height, width), at least 1.
    pub dilation: (usize, usize),
    /// Groups, at least 1, dividing `c` and `k`.
    pub groups: usize,
    /// Allow TF32 tensor cores for f32 (`torch.backends.cudnn.allow_tf32`).
    pub allow_tf32: bool,
    /// The byte alignment every buffer of the call has: the largest power of two up to 16
    /// dividing each address ([`byte_alignment`]). A plan of cuDNN's graph API is made for
    /// it (PyTorch keys its plans by it too); the emulator checks the buffers have it.
    pub align: usize,
}

/// Most alignment a [`ConvProblem`] states (bytes).
pub const MAX_ALIGN: usize = 16;

/// The largest power of two up to [`MAX_ALIGN`] dividing every address in `ptrs` (null
/// ones, for buffers not made yet, are taken as aligned: fresh allocations are).
pub fn byte_alignment(ptrs: &[DevicePtr]) -> usize {
    ptrs.iter()
        .filter(|p| p.0 != 0)
        .map(|p| 1usize << p.0.trailing_zeros().min(MAX_ALIGN.trailing_zeros()))
        .min()
        .unwrap_or(MAX_ALIGN)
}

impl ConvProblem {
    /// Elements of `x`, `w` and `y`.
    pub fn numels(&self) -> [usize; 3] {
        let n = |d: [usize; 4]| d.iter().product();
        [n(self.x_dims), n(self.w_dims), n(self.y_dims)]
    }
}

/// One algorithm for a [`ConvProblem`], as cuDNN's `cudnnConvolution*AlgoPerf_t` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConvAlgoPerf {
    /// cuDNN's number for the algorithm in the problem's direction.
    pub algo: u32,
    /// Measured time (benchmark search) or cuDNN's estimate (heuristics; often `-1`).
    pub time_ms: f32,
    /// Workspace the algorithm needs, bytes.
    pub workspace_bytes: usize,
    /// Whether the algorithm gives bit-identical results run to run.
    pub deterministic: bool,
}

/// Device buffers of one convolution (roles as in Note [cuDNN convolutions through the
/// seam]) and its workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvBuffers {
    /// The input (read by forward and backward-filter, written by backward-data).
    pub x: DevicePtr,
    /// The filter (read by forward and backward-data, written by backward-filter).
    pub w: DevicePtr,
    /// The output (written by forward, read by both backward directions).
    pub y: DevicePtr,
    /// Scratch memory for the algorithm (may be [`DevicePtr::NULL`] with 0 bytes).
    pub workspace: DevicePtr,
    /// Bytes at `workspace`.
    pub workspace_bytes: usize,
}

/// How [`super::Driver::conv_algorithms`] finds the algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvSearch {
    /// cuDNN's heuristics, best first, nothing run.
    Heuristic,
    /// Run and time every algorithm on these buffers (the written one is overwritten with
    /// garbage; algorithms needing more than the workspace are skipped), fastest first.
    Benchmark(ConvBuffers),
}

/// One convolution to run: a problem, an algorithm from [`super::Driver::conv_algorithms`],
/// the blend factors and the buffers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConvDesc {
    /// The computation.
    pub problem: ConvProblem,
    /// cuDNN's number for the algorithm in the problem's direction.
    pub algo: u32,
    /// Scale of the result.
    pub alpha: f64,
    /// Scale of the written tensor's old contents (not read when 0).
    pub beta: f64,
    /// The tensors and the workspace.
    pub buffers: ConvBuffers,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_16_dividing_every_address() {
        assert_eq!(byte_alignment(&[]), 16);
        assert_eq!(byte_alignment(&[DevicePtr(0x1000), DevicePtr::NULL]), 16);
        assert_eq!(byte_alignment(&[DevicePtr(0x1000), DevicePtr(0x1008)]), 8);
        assert_eq!(byte_alignment(&[DevicePtr(0x1002)]), 2);
        assert_eq!(byte_alignment(&[DevicePtr(0x1001), DevicePtr(0x2000)]), 1);
        // Emulated addresses carry their tag in the high bits only.
        assert_eq!(byte_alignment(&[DevicePtr(0xE0A0_0000_0000_0200)]), 16);
    }
}
