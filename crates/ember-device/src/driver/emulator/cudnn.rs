//! The emulator's cuDNN: the seam's convolution calls (Note [cuDNN convolutions through the
//! seam]) served by `conv.rs`'s CPU convolution, with a pretend algorithm table so that the
//! caller's algorithm selection runs in CI.
//!
//! Note [Emulated cuDNN algorithms]:
//!
//! Every emulated algorithm computes the same f64-accumulated result; what differs is what
//! it claims, chosen so that each selection rule has a visible effect:
//!
//! | direction | algo (cuDNN's name) | workspace | deterministic | heuristic rank | time factor |
//! | --- | --- | --- | --- | --- | --- |
//! | forward | 1 `IMPLICIT_PRECOMP_GEMM` | 8·(c/g)·r·s B | yes | 1st | 1.0 |
//! | forward | 0 `IMPLICIT_GEMM` | 0 | yes | 2nd | 1.5 |
//! | forward | 2 `GEMM` | (c/g)·r·s·p·q elements | yes | 3rd | 0.8 |
//! | backward-data | 0 `ALGO_0` | 0 | no | 1st | 1.0 |
//! | backward-data | 1 `ALGO_1` | 8·(c/g)·r·s B | yes | 2nd | 1.2 |
//! | backward-filter | 0 `ALGO_0` | 0 | no | 1st | 1.0 |
//! | backward-filter | 1 `ALGO_1` | 8·(c/g)·r·s B | yes | 2nd | 1.3 |
//! | backward-filter | 3 `ALGO_3` | (c/g)·r·s·p·q elements | no | 3rd | 0.9 |
//!
//! So the heuristic's first choice differs from the benchmark's fastest (forward: 1 vs 2),
//! deterministic mode changes both backward choices, and the zero-workspace algorithms are
//! what remains when workspace cannot be allocated. A benchmark search reports
//! `factor · 2·n·k·p·q·(c/g)·r·s / 1e9` milliseconds, the "measurement" of an algorithm, runs
//! nothing (the written buffer is left alone; the seam allows garbage there) and skips
//! algorithms needing more than the workspace given. Runs check that the workspace covers
//! what the algorithm claims, fill it with a poison pattern, and compute.
//!
//! [`EmulatedCudnn`] changes the claims: absent (`EMBER_CUDA_EMULATOR_CUDNN=0` for the
//! process, or per thread with [`set_thread_cudnn`]), a lower limit on tensor sizes than
//! cuDNN's 2³¹ − 1 elements (a shape "cuDNN rejects" with `CUDNN_STATUS_NOT_SUPPORTED`), or
//! a huge workspace claimed by the algorithms that use one (or by every algorithm). Each
//! call is recorded per thread ([`thread_conv_calls`]) so tests can prove the path taken.

use std::cell::RefCell;
use std::sync::OnceLock;

use crate::driver::{ConvAlgoPerf, ConvDesc, ConvDirection, ConvProblem, ConvSearch, DevicePtr};
use crate::error::{DeviceError, Result};

use super::gemm::element_size;
use super::memory::MemoryState;

/// The variable that makes the emulator's cuDNN absent for the process (`0`); anything
/// else, or unset, leaves it present.
pub const ENV_EMULATOR_CUDNN: &str = "EMBER_CUDA_EMULATOR_CUDNN";

/// The cuDNN version the emulator reports (9.1.0, as `cudnnGetVersion` spells it).
pub const EMULATED_CUDNN_VERSION: usize = 90100;

/// What the emulator's cuDNN claims. See Note [Emulated cuDNN algorithms].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmulatedCudnn {
    /// `false`: `cudnn_version` fails as on a machine without `libcudnn`.
    pub present: bool,
    /// Tensors with more elements are `CUDNN_STATUS_NOT_SUPPORTED` (cuDNN: 2³¹ − 1).
    pub max_tensor_elements: usize,
    /// Algorithms that use a workspace claim this many bytes instead.
    pub workspace_override: Option<usize>,
    /// With `workspace_override`, the zero-workspace algorithms claim it too.
    pub every_algorithm_needs_workspace: bool,
}

impl Default for EmulatedCudnn {
    fn default() -> Self {
        EmulatedCudnn {
            present: true,
            max_tensor_elements: i32::MAX as usize,
            workspace_override: None,
            every_algorithm_needs_workspace: false,
        }
    }
}

impl EmulatedCudnn {
    /// The process default: present unless `EMBER_CUDA_EMULATOR_CUDNN=0`.
    pub fn from_env() -> EmulatedCudnn {
        static PRESENT: OnceLock<bool> = OnceLock::new();
        let present = *PRESENT.get_or_init(|| !super::config::switched_off(ENV_EMULATOR_CUDNN));
        EmulatedCudnn {
            present,
            ..EmulatedCudnn::default()
        }
    }
}

/// One call of the emulated cuDNN, as recorded for [`thread_conv_calls`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvCall {
    /// A heuristic query.
    Heuristic(ConvDirection),
    /// A benchmark search.
    Benchmark(ConvDirection),
    /// A convolution run with this algorithm and workspace (bytes).
    Run(ConvDirection, u32, usize),
}

thread_local! {
    static OVERRIDE: RefCell<Option<EmulatedCudnn>> = const { RefCell::new(None) };
    static CALLS: RefCell<Vec<ConvCall>> = const { RefCell::new(Vec::new()) };
}

/// Make the emulated cuDNN claim `cudnn` for calls from this thread (`None`: back to the
/// process default). Per thread, so tests running in parallel do not see each other's.
pub fn set_thread_cudnn(cudnn: Option<EmulatedCudnn>) {
    OVERRIDE.with(|o| *o.borrow_mut() = cudnn);
}

/// What the emulated cuDNN claims for this thread.
pub fn thread_cudnn() -> EmulatedCudnn {
    OVERRIDE
        .with(|o| *o.borrow())
        .unwrap_or_else(EmulatedCudnn::from_env)
}

/// The emulated cuDNN calls this thread made, in order (take the length before a call and
/// look at what follows).
pub fn thread_conv_calls() -> Vec<ConvCall> {
    CALLS.with(|c| c.borrow().clone())
}

fn record(call: ConvCall) {
    CALLS.with(|c| c.borrow_mut().push(call));
}

/// Which workspace an emulated algorithm claims (sizes in `workspace`).
#[derive(Clone, Copy)]
enum Ws {
    None,
    Small,
    Col,
}

/// (algo, workspace, deterministic, time factor) in heuristic order: Note [Emulated cuDNN
/// algorithms]'s table.
fn table(direction: ConvDirection) -> &'static [(u32, Ws, bool, f32)] {
    match direction {
        ConvDirection::Forward => &[
            (1, Ws::Small, true, 1.0),
            (0, Ws::None, true, 1.5),
            (2, Ws::Col, true, 0.8),
        ],
        ConvDirection::BackwardData => &[(0, Ws::None, false, 1.0), (1, Ws::Small, true, 1.2)],
        ConvDirection::BackwardFilter => &[
            (0, Ws::None, false, 1.0),
            (1, Ws::Small, true, 1.3),
            (3, Ws::Col, false, 0.9),
        ],
    }
}

fn workspace(p: &ConvProblem, ws: Ws, cfg: &EmulatedCudnn) -> usize {
    let [_, cg, r, s] = p.w_dims;
    let [_, _, op, oq] = p.y_dims;
    let natural = match ws {
        Ws::None => 0,
        Ws::Small => 8 * cg * r * s,
        Ws::Col => cg * r * s * op * oq * element_size(p.dtype),
    };
    match cfg.workspace_override {
        Some(bytes) if natural > 0 || cfg.every_algorithm_needs_workspace => bytes,
        _ => natural,
    }
}

fn not_supported(call: &'static str, detail: String) -> DeviceError {
    DeviceError::Driver {
        call,
        code: "CUDNN_STATUS_NOT_SUPPORTED".into(),
        detail,
    }
}

/// The version, or why the emulated cuDNN is absent.
pub(crate) fn version() -> Result<usize> {
    if thread_cudnn().present {
        Ok(EMULATED_CUDNN_VERSION)
    } else {
        Err(DeviceError::Unsupported {
            what: format!(
                "cuDNN (the emulator pretends it is absent: {ENV_EMULATOR_CUDNN}=0 or set_thread_cudnn)"
            ),
            driver: "emulator",
        })
    }
}

/// Check what cuDNN itself would refuse: absent library, bad geometry, sizes over its
/// limits.
fn check(call: &'static str, p: &ConvProblem, cfg: &EmulatedCudnn) -> Result<()> {
    version()?;
    super::conv::validate(call, p)?;
    let limit = cfg.max_tensor_elements;
    let fits = p.numels().iter().all(|&n| n <= limit)
        && p.x_strides.iter().chain(&p.y_strides).all(|&s| s <= limit);
    if !fits {
        return Err(not_supported(
            call,
            format!(
                "tensors of {:?} elements exceed this cuDNN's limit of {limit}",
                p.numels()
            ),
        ));
    }
    Ok(())
}

fn call_name(direction: ConvDirection, search: ConvSearch) -> &'static str {
    match (direction, search) {
        (ConvDirection::Forward, ConvSearch::Heuristic) => "cudnnGetConvolutionForwardAlgorithm_v7",
        (ConvDirection::BackwardData, ConvSearch::Heuristic) => {
            "cudnnGetConvolutionBackwardDataAlgorithm_v7"
        }
        (ConvDirection::BackwardFilter, ConvSearch::Heuristic) => {
            "cudnnGetConvolutionBackwardFilterAlgorithm_v7"
        }
        (ConvDirection::Forward, _) => "cudnnFindConvolutionForwardAlgorithmEx",
        (ConvDirection::BackwardData, _) => "cudnnFindConvolutionBackwardDataAlgorithmEx",
        (ConvDirection::BackwardFilter, _) => "cudnnFindConvolutionBackwardFilterAlgorithmEx",
    }
}

/// The name of the run call for a direction.
pub(crate) fn run_name(direction: ConvDirection) -> &'static str {
    match direction {
        ConvDirection::Forward => "cudnnConvolutionForward",
        ConvDirection::BackwardData => "cudnnConvolutionBackwardData",
        ConvDirection::BackwardFilter => "cudnnConvolutionBackwardFilter",
    }
}

/// The seam's `conv_algorithms` on emulated memory (buffers are only bounds-checked).
pub(crate) fn algorithms(
    mem: &MemoryState,
    p: &ConvProblem,
    search: ConvSearch,
) -> Result<Vec<ConvAlgoPerf>> {
    let call = call_name(p.direction, search);
    let cfg = thread_cudnn();
    check(call, p, &cfg)?;
    let [_, k, op, oq] = p.y_dims;
    let [n, _, _, _] = p.x_dims;
    let [_, cg, r, s] = p.w_dims;
    let flops = 2.0 * (n * k * op * oq * cg * r * s) as f64;
    let mut out: Vec<ConvAlgoPerf> = table(p.direction)
        .iter()
        .map(|&(algo, ws, deterministic, _)| ConvAlgoPerf {
            algo,
            time_ms: -1.0,
            workspace_bytes: workspace(p, ws, &cfg),
            deterministic,
        })
        .collect();
    match search {
        ConvSearch::Heuristic => record(ConvCall::Heuristic(p.direction)),
        ConvSearch::Benchmark(b) => {
            record(ConvCall::Benchmark(p.direction));
            check_buffers(mem, call, p, b.x, b.w, b.y)?;
            if b.workspace_bytes > 0 {
                mem.slice(call, b.workspace, b.workspace_bytes)?;
            }
            out.retain(|a| a.workspace_bytes <= b.workspace_bytes);
            for a in &mut out {
                if let Some(&(_, _, _, f)) = table(p.direction).iter().find(|t| t.0 == a.algo) {
                    a.time_ms = f * (flops / 1e9) as f32;
                }
            }
            out.sort_by(|a, b| a.time_ms.total_cmp(&b.time_ms));
        }
    }
    Ok(out)
}

fn check_buffers(
    mem: &MemoryState,
    call: &'static str,
    p: &ConvProblem,
    x: DevicePtr,
    w: DevicePtr,
    y: DevicePtr,
) -> Result<()> {
    let size = element_size(p.dtype);
    let span = |dims: [usize; 4], strides: [usize; 4]| -> usize {
        if dims.contains(&0) {
            0
        } else {
            1 + dims
                .iter()
                .zip(strides)
                .map(|(&d, s)| (d - 1) * s)
                .sum::<usize>()
        }
    };
    let nx = span(p.x_dims, p.x_strides);
    let ny = span(p.y_dims, p.y_strides);
    let nw = p.numels()[1];
    for (ptr, n) in [(x, nx), (w, nw), (y, ny)] {
        if n > 0 {
            mem.slice(call, ptr, n * size)?;
        }
    }
    Ok(())
}

/// The seam's `conv` on emulated memory.
pub(crate) fn run(mem: &mut MemoryState, desc: &ConvDesc) -> Result<()> {
    let p = &desc.problem;
    let call = run_name(p.direction);
    let cfg = thread_cudnn();
    check(call, p, &cfg)?;
    let Some(&(_, ws, _, _)) = table(p.direction).iter().find(|t| t.0 == desc.algo) else {
        return Err(DeviceError::Driver {
            call,
            code: "CUDNN_STATUS_BAD_PARAM".into(),
            detail: format!(
                "algorithm {} is not a {} algorithm of the emulator",
                desc.algo,
                p.direction.name()
            ),
        });
    };
    let need = workspace(p, ws, &cfg);
    let b = desc.buffers;
    if b.workspace_bytes < need {
        return Err(DeviceError::Driver {
            call,
            code: "CUDNN_STATUS_BAD_PARAM".into(),
            detail: format!(
                "algorithm {} needs {need} bytes of workspace, got {}",
                desc.algo, b.workspace_bytes
            ),
        });
    }
    record(ConvCall::Run(p.direction, desc.algo, b.workspace_bytes));
    check_buffers(mem, call, p, b.x, b.w, b.y)?;
    if b.workspace_bytes > 0 {
        mem.slice_mut(call, b.workspace, b.workspace_bytes)?
            .fill(0xA5);
    }
    super::conv::conv(mem, call, desc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::emulator::{Emulator, EmulatorConfig};
    use crate::driver::{ConvBuffers, Driver, GemmType, StreamHandle};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn back(emu: &Emulator, p: DevicePtr, n: usize) -> Vec<f32> {
        let mut b = vec![0u8; 4 * n];
        emu.memcpy_dtoh(&mut b, p, StreamHandle::DEFAULT).unwrap();
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// x = 0..9 as [1, 1, 3, 3], w = ones [1, 1, 2, 2], y [1, 1, 2, 2].
    fn problem(direction: ConvDirection) -> ConvProblem {
        ConvProblem {
            direction,
            dtype: GemmType::F32,
            x_dims: [1, 1, 3, 3],
            x_strides: [9, 9, 3, 1],
            w_dims: [1, 1, 2, 2],
            y_dims: [1, 1, 2, 2],
            y_strides: [4, 4, 2, 1],
            pad: (0, 0),
            stride: (1, 1),
            dilation: (1, 1),
            groups: 1,
            allow_tf32: true,
            align: 16,
        }
    }

    #[test]
    fn three_directions_known_values_and_refusals() {
        let emu = Emulator::new(EmulatorConfig::devices(1)).unwrap();
        let s = StreamHandle::DEFAULT;
        let x = emu.malloc(0, 36).unwrap();
        let w = emu.malloc(0, 16).unwrap();
        let y = emu.malloc(0, 16).unwrap();
        let ws = emu.malloc(0, 64).unwrap();
        let xs: Vec<f32> = (0..9).map(|v| v as f32).collect();
        emu.memcpy_htod(x, &f32s(&xs), s).unwrap();
        emu.memcpy_htod(w, &f32s(&[1.0; 4]), s).unwrap();
        let buffers = ConvBuffers {
            x,
            w,
            y,
            workspace: ws,
            workspace_bytes: 64,
        };
        let run = |direction, algo| {
            let desc = ConvDesc {
                problem: problem(direction),
                algo,
                alpha: 1.0,
                beta: 0.0,
                buffers,
            };
            emu.conv(0, s, &desc)
        };
        run(ConvDirection::Forward, 1).unwrap();
        assert_eq!(back(&emu, y, 4), vec![8.0, 12.0, 20.0, 24.0]);
        run(ConvDirection::BackwardData, 0).unwrap();
        // Each input position gets one term per window covering it (y = [8, 12, 20, 24]).
        assert_eq!(
            back(&emu, x, 9),
            vec![8.0, 20.0, 12.0, 28.0, 64.0, 36.0, 20.0, 44.0, 24.0]
        );
        emu.memcpy_htod(x, &f32s(&xs), s).unwrap();
        run(ConvDirection::BackwardFilter, 1).unwrap();
        // dw[r, s] = Σ y[p, q] · x[p + r, q + s].
        assert_eq!(back(&emu, w, 4), vec![168.0, 232.0, 360.0, 424.0]);
        // An unknown algorithm, too little workspace, a wrong output size: errors.
        assert!(run(ConvDirection::Forward, 9).is_err());
        let mut small = ConvDesc {
            problem: problem(ConvDirection::Forward),
            algo: 2,
            alpha: 1.0,
            beta: 0.0,
            buffers,
        };
        small.buffers.workspace_bytes = 4;
        let e = emu.conv(0, s, &small).unwrap_err().to_string();
        assert!(e.contains("needs 64 bytes of workspace, got 4"), "{e}");
        small.problem.y_dims = [1, 1, 3, 3];
        assert!(emu.conv(0, s, &small).is_err());
        // A buffer without the alignment the problem states (a view 4 bytes in).
        let mut shifted = ConvDesc {
            problem: problem(ConvDirection::Forward),
            algo: 0,
            alpha: 1.0,
            beta: 0.0,
            buffers,
        };
        shifted.buffers.x = DevicePtr(x.0 + 4);
        shifted.problem.x_dims = [1, 1, 2, 3];
        shifted.problem.y_dims = [1, 1, 1, 2];
        let e = emu.conv(0, s, &shifted).unwrap_err().to_string();
        assert!(e.contains("alignment of 16 bytes"), "{e}");
        shifted.problem.align = crate::driver::byte_alignment(&[shifted.buffers.x, w, y]);
        assert_eq!(shifted.problem.align, 4);
        emu.conv(0, s, &shifted).unwrap();
        // Refusals as the thread's claims say.
        set_thread_cudnn(Some(EmulatedCudnn {
            max_tensor_elements: 4,
            ..EmulatedCudnn::default()
        }));
        let e = emu
            .conv_algorithms(
                0,
                s,
                &problem(ConvDirection::Forward),
                ConvSearch::Heuristic,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("CUDNN_STATUS_NOT_SUPPORTED"), "{e}");
        set_thread_cudnn(Some(EmulatedCudnn {
            present: false,
            ..EmulatedCudnn::default()
        }));
        assert!(emu.cudnn_version(0).is_err());
        set_thread_cudnn(None);
        assert_eq!(emu.cudnn_version(0).unwrap(), EMULATED_CUDNN_VERSION);
        let list = emu
            .conv_algorithms(
                0,
                s,
                &problem(ConvDirection::Forward),
                ConvSearch::Heuristic,
            )
            .unwrap();
        assert_eq!(
            list.iter().map(|a| a.algo).collect::<Vec<_>>(),
            vec![1, 0, 2]
        );
    }
}
