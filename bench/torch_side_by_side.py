#!/usr/bin/env python3
"""Ember against PyTorch on the same machine, in the same run, side by side.

    python3 bench/torch_side_by_side.py [--filter matmul [--exact]] [--rounds 3] [--threads 2] [--json]
                                        [--ember-bin target/release/ember-bench] [--no-install]
                                        [--device cpu|cuda] [--python python3] [--rank-threads 1]
                                        [--save [--host NAME] [--notes TEXT]]

Each round takes every selected case in turn and runs it in Ember's benchmark program (`cargo
xtask bench --json --device cpu --filter NAME`, or the binary given by --ember-bin) and right
after in a persistent PyTorch process, so both sides see the same noise from a shared host; the table shows per-side medians and the median of
the per-round ratios (Ember/PyTorch for rates, PyTorch/Ember for times: above 1 means Ember is
ahead either way).

PyTorch comes from PyPI into a virtualenv at target/bench-venv, created on first use (pinned
TORCH_VERSION). The CPU-only wheel index (download.pytorch.org/whl/cpu) is tried first; where
only PyPI is reachable, PyPI's x86_64 wheel is a CUDA build whose CUDA libraries (nvidia-*
wheels, ~3 GB) must be installed for `import torch` to work, though its CPU kernels (MKL,
oneDNN) are the same as the CPU build's. Where PyTorch is absent and cannot be installed, only
Ember's side is printed, with the reason.

With `--device cuda` both sides run the cases on `cuda:0` (a real GPU: Ember's benchmark
program then carries the H100 bound of each case), each call followed by a device
synchronisation on both sides, as Ember's harness does. `--python` names an interpreter whose
torch to use instead of the virtualenv's (a GPU machine's own CUDA build).

With `--save` the rows are also written to bench/results/<date>-<host>-<device>.json with the
machine's description (CPU model and flags, cores, GPU, Ember's version and commit, PyTorch's
version), the format `cargo xtask bench --save` writes (see xtask/src/results.rs);
`cargo xtask bench-report` renders the saved files into docs/performance.md.

The multi-process cases (`all_reduce_mpi_*` against MPI_Allreduce through mpi4py on the same
Open MPI, `ddp_train_mlp_2000_1000_100_b128_2ranks` against PyTorch DDP over gloo, and
`..._2nodes`, 2 nodes x 1 process on loopback, against torchrun --nnodes 2; 2 ranks of
--rank-threads threads each on both sides) run their other side in processes of their own:
see bench/dist_side_by_side.py. mpi4py is installed from PyPI into the same interpreter as
torch when missing (unless --no-install); without it those rows say why and show Ember alone.

To add cases: append a Case to CASES below (same name and unit as Ember's record). `setup`
builds the inputs and returns (fn, work): the PyTorch side times fn() and reports work/seconds
for rates (e.g. FLOP → GFLOP/s with scale 1e-9) or seconds*scale for times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "target" / "bench-venv"
TORCH_VERSION = "2.15.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# torch's own dependencies, installed next to a --no-deps torch.
TORCH_DEPS = ["typing-extensions", "numpy", "sympy", "networkx", "jinja2", "fsspec", "filelock"]
ROUNDS_PER_CASE = 5
ROUND_S = 0.15
# A call slower than this (PyTorch's bf16/f16 products on a CPU without AVX-512 BF16/FP16
# take seconds to a minute: 0.3-1.3 GFLOP/s on an AVX2-only AMD EPYC) gets no further
# warm-up: its timing call is the first sample, and only as many more calls are timed as fit
# in SLOW_BUDGET_S, so one case costs two calls, not eight.
SLOW_CALL_S = 1.0
SLOW_BUDGET_S = 8.0
# The device the PyTorch side's cases run on ("cpu" or "cuda"), set by the worker.
DEVICE = "cpu"


@dataclass
class Case:
    """One benchmark case as PyTorch runs it; `name` and `unit` match Ember's record."""

    name: str
    unit: str
    higher_is_better: bool
    # Returns (fn, work) or (fn, work, teardown): a rate is work / seconds * scale, a time is
    # seconds * scale; teardown (if any) runs after the timing.
    setup: Callable[[], tuple[Callable[[], object], float]]
    scale: float = 1.0
    # Also measure the peak memory of one call (`peak_memory_bytes` in the record).
    peak_memory: bool = False
    # The devices the case runs on (Ember's benchmark program has the same ones).
    devices: tuple[str, ...] = ("cpu", "cuda")
    # A multi-process case: its other side runs in processes of its own
    # (bench/dist_side_by_side.py), not in the PyTorch worker; "mpi4py" or "torch".
    external: str | None = None


def _no_setup():
    raise RuntimeError("a multi-process case runs in bench/dist_side_by_side.py")


def _matmul(m: int, k: int, n: int, dtype: str = "float32", trans: str = "") -> Callable:
    def setup():
        import torch

        dt, d = getattr(torch, dtype), DEVICE
        a = torch.randn(k, m, device=d).t() if trans == "a" else torch.randn(m, k, device=d)
        b = torch.randn(n, k, device=d).t() if trans == "b" else torch.randn(k, n, device=d)
        a, b = a.to(dt), b.to(dt)
        c = torch.empty(m, n, dtype=dt, device=d)
        return (lambda: torch.mm(a, b, out=c)), 2.0 * m * n * k

    return setup


N16M = 16 * 1024 * 1024


def _elementwise(op: str) -> Callable:
    """PyTorch's fastest form: into a preallocated `out=` (no page faults on a fresh buffer).
    The target is Ember's ordinary allocating op against this."""

    def setup():
        import torch

        d = DEVICE
        a, b = torch.randn(N16M, device=d), torch.randn(N16M, device=d)
        c = torch.empty(N16M, device=d)
        fns = {
            "add": (lambda: torch.add(a, b, out=c), 12.0 * N16M),
            "relu": (lambda: torch.clamp_min(a, 0.0, out=c), 8.0 * N16M),
            "exp": (lambda: torch.exp(a, out=c), 8.0 * N16M),
            "sum": (lambda: torch.sum(a), 4.0 * N16M),
        }
        return fns[op]

    return setup


def _softmax_ce():
    import torch

    d = DEVICE
    logits = torch.randn(4096, 1000, device=d)
    target = torch.randint(0, 1000, (4096,), device=d)
    return (lambda: torch.nn.functional.cross_entropy(logits, target)), 1.0


def _tiny():
    import torch

    a, b = torch.randn(4, device=DEVICE), torch.randn(4, device=DEVICE)
    return (lambda: torch.add(a, b)), 1.0


def _conv2d(backward: bool = False, amp: str | None = None) -> Callable:
    """A ResNet stage as Ember's `conv2d_f32_32x64x56x56`: 3x3, pad 1, 64 -> 64, batch 32 x 56 x
    56, in GFLOP/s. With `backward` (`conv2d_fwdbwd_*`) the forward and the input and weight
    gradients of a fixed output gradient (three times the flops); with `amp` under autocast
    (`*_bf16`)."""

    def setup():
        import torch

        x = torch.randn(32, 64, 56, 56, device=DEVICE, requires_grad=backward)
        w = torch.randn(64, 64, 3, 3, device=DEVICE, requires_grad=backward)
        gy = torch.randn(32, 64, 56, 56, device=DEVICE)
        flops = 2.0 * 32 * 64 * 56 * 56 * 64 * 9

        def fwd():
            with _autocast(amp):
                return torch.nn.functional.conv2d(x, w, padding=1)

        if not backward:
            return fwd, flops

        def fwd_bwd():
            y = fwd()
            y.backward(gy.to(y.dtype))
            x.grad = None
            w.grad = None

        return fwd_bwd, 3.0 * flops

    return setup


def _tiny_profiled():
    """`tiny_op_overhead` while `torch.profiler.profile(activities=[CPU(, CUDA)],
    record_shapes=True)` records (Ember's `profiler_on_tiny_op_overhead`); the teardown stops
    it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(4, device=DEVICE), torch.randn(4, device=DEVICE)
    activities = [ProfilerActivity.CPU]
    if DEVICE == "cuda":
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, record_shapes=True)
    prof.__enter__()
    return (lambda: torch.add(a, b)), 1.0, lambda: prof.__exit__(None, None, None)


CHAIN = 1000


def _autograd_chain():
    """Record and run backward through a chain of 1000 small ops; the time is per op."""
    import torch

    x = torch.randn(4, requires_grad=True, device=DEVICE)

    def fn():
        y = x
        for _ in range(CHAIN):
            y = y * 1.0001
        y.sum().backward()
        x.grad = None

    return fn, 1.0


def _mlp(widths: tuple[int, ...]):
    import torch

    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        if i > 0:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(a, b))
    return torch.nn.Sequential(*layers).to(DEVICE)


def _autocast(amp: str | None):
    """`torch.autocast(DEVICE, dtype=amp)`, or a region that does nothing for f32."""
    import contextlib

    import torch

    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(DEVICE, dtype=getattr(torch, amp))


def _backward_step(loss, opt, scaler) -> None:
    """`loss.backward(); opt.step()`, through the GradScaler when there is one (float16)."""
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def _train(widths: tuple[int, ...], batch: int, amp: str | None = None,
           profiler: bool = False) -> Callable:
    """One Adam step of a `Linear-ReLU-Linear`, as Ember's `train_mlp_*`; the rate is samples/s.
    With `amp` ("bfloat16", "float16") the forward and loss run under autocast on the f32
    master weights, as Ember's `train_mlp_*_bf16`/`_f16`; float16 steps through a GradScaler.
    With `profiler`, `torch.profiler.profile(activities=[CPU(, CUDA)], record_shapes=True)` is
    active around all the timed steps (Ember's `profiler_on_*`); the case's teardown stops it."""

    def setup():
        import torch

        model = _mlp(widths)
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(batch, widths[0], device=DEVICE)
        y = torch.randint(0, widths[-1], (batch,), device=DEVICE)
        loss_fn = torch.nn.CrossEntropyLoss()
        scaler = torch.amp.GradScaler(DEVICE) if amp == "float16" else None

        def step():
            opt.zero_grad(set_to_none=True)
            with _autocast(amp):
                loss = loss_fn(model(x), y)
            _backward_step(loss, opt, scaler)

        if profiler:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if DEVICE == "cuda":
                activities.append(ProfilerActivity.CUDA)
            prof = profile(activities=activities, record_shapes=True)
            prof.__enter__()
            return step, float(batch), lambda: prof.__exit__(None, None, None)
        return step, float(batch)

    return setup


def _forward(widths: tuple[int, ...], batch: int, amp: str | None = None) -> Callable:
    """A forward under `no_grad`, as Ember's `fwd_mlp_*` (time per call, and its peak memory),
    under autocast when `amp` is given (`fwd_mlp_*_bf16`/`_f16`)."""

    def setup():
        import torch

        model = _mlp(widths)
        x = torch.randn(batch, widths[0], device=DEVICE)

        def fwd():
            with torch.no_grad(), _autocast(amp):
                model(x)

        return fwd, 1.0

    return setup


def _resnet18(train: bool, batch: int = 32, amp: str | None = None) -> Callable:
    """torchvision's ResNet-18 (1000 classes) at batch x 3 x 224 x 224, as Ember's
    `train_resnet18_b32` (one SGD step with momentum 0.9; samples/s) and `fwd_resnet18_b32`
    (eval mode under `no_grad`; ms). With `amp`, the forward (and loss) under autocast, as
    Ember's `*_bf16` and `*_f16` cases (f16 with a GradScaler, bf16 without: PyTorch's AMP
    recipe). PyTorch's defaults: cuDNN with TF32 for convolutions, no `cudnn.benchmark`;
    oneDNN on the CPU."""

    def setup():
        import torch
        import torchvision

        model = torchvision.models.resnet18().to(DEVICE)
        x = torch.randn(batch, 3, 224, 224, device=DEVICE)
        if not train:
            model.eval()

            def fwd():
                with torch.no_grad(), _autocast(amp):
                    model(x)

            return fwd, 1.0
        y = torch.randint(0, 1000, (batch,), device=DEVICE)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        scaler = torch.amp.GradScaler(DEVICE) if amp == "float16" else None

        def step():
            opt.zero_grad(set_to_none=True)
            with _autocast(amp):
                loss = loss_fn(model(x), y)
            _backward_step(loss, opt, scaler)

        return step, float(batch)

    return setup


def _sdpa(backward: bool, shape: tuple[int, int, int, int], dtype: str = "float32") -> Callable:
    """`F.scaled_dot_product_attention(q, k, v, is_causal=True)` on `shape` inputs, as Ember's
    `sdpa_*_causal` (ms per call): under `no_grad`, or (`sdpa_fwdbwd_*`) the forward and the
    backward of a fixed output gradient into q, k and v. PyTorch's default backend choice:
    its flash kernel on the CPU and on CUDA for these inputs."""

    def setup():
        import torch
        import torch.nn.functional as F

        dt = getattr(torch, dtype)
        q, k, v = (torch.randn(*shape, device=DEVICE, dtype=dt, requires_grad=backward)
                   for _ in range(3))
        g = torch.randn(*shape, device=DEVICE, dtype=dt)

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            for t in (q, k, v):
                t.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

        return (fwd_bwd if backward else fwd), 1.0

    return setup


# `ember train --model gpt`'s defaults (crates/ember-cli/src/train.rs): 2 blocks, 4 heads, width
# 64, 64 characters of context, batch 32, Adam at lr 2e-3; the vocabulary is the shipped text's.
GPT_LAYERS, GPT_HEADS, GPT_WIDTH, GPT_BLOCK, GPT_BATCH, GPT_LR = 2, 4, 64, 64, 32, 2e-3


def gpt_vocab_size() -> int:
    """The characters of data/text/ember-docs.txt.gz, as Ember's `Vocab::from_text` counts them."""
    import gzip

    with gzip.open(ROOT / "data" / "text" / "ember-docs.txt.gz", "rt", encoding="utf-8") as f:
        return len(set(f.read()))


def _gpt_model(vocab: int):
    """Ember's `Gpt` (crates/ember-cli/src/train/gpt.rs) in PyTorch, as nanoGPT writes it:
    token and position embeddings, pre-norm blocks of causal self-attention (one c_attn to q,
    k, v; SDPA with is_causal) and a GELU MLP, a final LayerNorm, the head tied to wte."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(GPT_WIDTH, 3 * GPT_WIDTH)
            self.c_proj = nn.Linear(GPT_WIDTH, GPT_WIDTH)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(c, dim=2)
            q, k, v = (z.view(b, t, GPT_HEADS, c // GPT_HEADS).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(GPT_WIDTH), Attn()
            self.ln_2 = nn.LayerNorm(GPT_WIDTH)
            self.mlp = nn.Sequential(nn.Linear(GPT_WIDTH, 4 * GPT_WIDTH), nn.GELU(),
                                     nn.Linear(4 * GPT_WIDTH, GPT_WIDTH))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, GPT_WIDTH)
            self.wpe = nn.Embedding(GPT_BLOCK, GPT_WIDTH)
            self.h = nn.ModuleList(Block() for _ in range(GPT_LAYERS))
            self.ln_f = nn.LayerNorm(GPT_WIDTH)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                x = b(x)
            return F.linear(self.ln_f(x), self.wte.weight)

    return Gpt().to(DEVICE)


def _train_gpt(amp: str | None = None) -> Callable:
    """One training step of `ember train --model gpt`'s default model, as Ember's
    `train_gpt_b32_t64` (samples/s): Adam, cross-entropy over every position, the loss read
    back with `.item()` as the program does; with `amp` the forward and loss under autocast
    (float16 with a GradScaler)."""

    def setup():
        import torch

        vocab = gpt_vocab_size()
        model = _gpt_model(vocab)
        opt = torch.optim.Adam(model.parameters(), lr=GPT_LR)
        x = torch.randint(0, vocab, (GPT_BATCH, GPT_BLOCK), device=DEVICE)
        y = torch.randint(0, vocab, (GPT_BATCH * GPT_BLOCK,), device=DEVICE)
        loss_fn = torch.nn.CrossEntropyLoss()
        scaler = torch.amp.GradScaler(DEVICE) if amp == "float16" else None

        def step():
            opt.zero_grad(set_to_none=True)
            with _autocast(amp):
                loss = loss_fn(model(x).reshape(GPT_BATCH * GPT_BLOCK, vocab), y)
            _backward_step(loss, opt, scaler)
            loss.item()

        return step, float(GPT_BATCH)

    return setup


def peak_memory_bytes(fn: Callable) -> int:
    """The peak of memory allocated during one call of `fn`, above what was allocated before.
    On CUDA the caching allocator's statistics; on the CPU, where PyTorch keeps none, the
    profiler's memory events (`profile_memory=True`: each allocation and free with the running
    total)."""
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    totals = [e["args"]["Total Allocated"] for e in events
              if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0]
    # The profiler's totals count from its start, so the first event's total is its own size.
    return max(totals, default=0)


CASES: list[Case] = (
    [Case(f"matmul_f32_n{n}", "GFLOP/s", True, _matmul(n, n, n), 1e-9) for n in (128, 256, 512, 1024, 2048)]
    + [Case(f"matmul_bf16_n{n}", "GFLOP/s", True, _matmul(n, n, n, "bfloat16"), 1e-9) for n in (1024, 2048)]
    + [Case("matmul_f16_n1024", "GFLOP/s", True, _matmul(1024, 1024, 1024, "float16"), 1e-9)]
    + [
        Case(f"matmul_f32_{m}x{k}x{n}", "GFLOP/s", True, _matmul(m, k, n, trans=t), 1e-9)
        for (m, k, n, t) in [
            (64, 1000, 512, "b"),
            (64, 512, 1000, ""),
            (1000, 64, 512, "a"),
            (128, 2000, 1000, "b"),
            (128, 1000, 2000, ""),
            (2000, 128, 1000, "a"),
        ]
    ]
    + [Case(f"{op}_f32_16m", "GB/s", True, _elementwise(op), 1e-9) for op in ("add", "relu", "exp", "sum")]
    + [Case("softmax_ce_4096x1000", "ms", False, _softmax_ce, 1e3)]
    + [Case("tiny_op_overhead", "us", False, _tiny, 1e6)]
    + [Case("profiler_on_tiny_op_overhead", "us", False, _tiny_profiled, 1e6)]
    + [Case("autograd_chain_1000", "us", False, _autograd_chain, 1e6 / CHAIN)]
    + [Case("conv2d_f32_32x64x56x56", "GFLOP/s", True, _conv2d(), 1e-9)]
    # The CPU's convolution cases (Ember's conv.rs): forward + backward, and both under
    # autocast(cpu, bf16).
    + [
        Case(f"conv2d{kind}_f32_32x64x56x56{suffix}", "GFLOP/s", True,
             _conv2d(kind == "_fwdbwd", amp), 1e-9, devices=("cpu",))
        for kind in ("", "_fwdbwd")
        for amp, suffix in ((None, ""), ("bfloat16", "_bf16"))
        if kind or amp
    ]
    + [
        Case("train_mlp_1000_512_10_b64", "samples/s", True, _train((1000, 512, 10), 64)),
        Case("train_mlp_2000_1000_100_b128", "samples/s", True, _train((2000, 1000, 100), 128)),
        Case("profiler_off_train_mlp_1000_512_10_b64", "samples/s", True,
             _train((1000, 512, 10), 64)),
        Case("profiler_on_train_mlp_1000_512_10_b64", "samples/s", True,
             _train((1000, 512, 10), 64, profiler=True)),
        Case("fwd_mlp_10000_5000_2000_10_b256", "ms", False,
             _forward((10000, 5000, 2000, 10), 256), 1e3, peak_memory=True),
    ]
    + [
        Case("train_resnet18_b32", "samples/s", True, _resnet18(True), peak_memory=True),
        Case("fwd_resnet18_b32", "ms", False, _resnet18(False), 1e3, peak_memory=True),
        Case("train_resnet18_b8", "samples/s", True, _resnet18(True, 8), peak_memory=True,
             devices=("cpu",)),
    ]
    # ResNet-18 under autocast(cpu, bf16), as Ember's resnet.rs runs it on the CPU.
    + [
        Case("train_resnet18_b8_bf16", "samples/s", True, _resnet18(True, 8, "bfloat16"),
             peak_memory=True, devices=("cpu",)),
        Case("train_resnet18_b32_bf16", "samples/s", True, _resnet18(True, 32, "bfloat16"),
             peak_memory=True, devices=("cpu", "cuda")),
        Case("train_resnet18_b32_f16", "samples/s", True, _resnet18(True, amp="float16"),
             peak_memory=True, devices=("cuda",)),
        Case("fwd_resnet18_b32_bf16", "ms", False, _resnet18(False, 32, "bfloat16"), 1e3,
             peak_memory=True, devices=("cpu",)),
    ]
    # Under autocast: bf16 on the CPU and CUDA, f16 (with a GradScaler) on CUDA only, as
    # Ember's benchmark program runs them.
    + [
        case
        for amp, short, devices in [("bfloat16", "bf16", ("cpu", "cuda")), ("float16", "f16", ("cuda",))]
        for case in [
            Case(f"train_mlp_1000_512_10_b64_{short}", "samples/s", True,
                 _train((1000, 512, 10), 64, amp), devices=devices),
            Case(f"train_mlp_2000_1000_100_b128_{short}", "samples/s", True,
                 _train((2000, 1000, 100), 128, amp), devices=devices),
            Case(f"fwd_mlp_10000_5000_2000_10_b256_{short}", "ms", False,
                 _forward((10000, 5000, 2000, 10), 256, amp), 1e3, peak_memory=True,
                 devices=devices),
        ]
    ]
    # Attention (Ember's attention.rs): f32 on the CPU, bf16 on CUDA.
    + [
        Case(f"sdpa{kind}_b8_h8_l1024_d64_causal{suffix}", "ms", False,
             _sdpa(kind == "_fwdbwd", (8, 8, 1024, 64), dtype), 1e3, peak_memory=True,
             devices=(device,))
        for kind in ("", "_fwdbwd")
        for device, dtype, suffix in (("cpu", "float32", ""), ("cuda", "bfloat16", "_bf16"))
    ]
    + [Case("sdpa_fwdbwd_b1_h8_l8192_d64_causal_bf16", "ms", False,
            _sdpa(True, (1, 8, 8192, 64), "bfloat16"), 1e3, peak_memory=True, devices=("cuda",))]
    # A training step of `ember train --model gpt`'s default model.
    + [
        Case("train_gpt_b32_t64", "samples/s", True, _train_gpt(), peak_memory=True),
        Case("train_gpt_b32_t64_bf16", "samples/s", True, _train_gpt("bfloat16"),
             peak_memory=True),
        Case("train_gpt_b32_t64_f16", "samples/s", True, _train_gpt("float16"),
             peak_memory=True, devices=("cuda",)),
    ]
    # Several processes, the other side in bench/dist_side_by_side.py.
    + [Case(f"all_reduce_mpi_{size}", "GB/s", True, _no_setup, devices=("cpu",), external="mpi4py")
       for size in ("1kib", "64kib", "1mib", "16mib", "256mib")]
    + [Case(f"ddp_train_mlp_2000_1000_100_b128_{shape}", "samples/s", True, _no_setup,
            devices=("cpu",), external="torch") for shape in ("2ranks", "2nodes")]
)


# ---------------------------------------------------------------- the PyTorch side (worker)


def torch_case(case: Case, threads: int) -> dict:
    """Times one case in PyTorch, as Ember's harness does (warm-up, 5 rounds, median); calls
    slower than SLOW_CALL_S get fewer rounds (see there)."""
    import torch

    fn, work, *teardown = case.setup()
    if DEVICE == "cuda":
        # Synchronise after every call, as Ember's harness does on a GPU.
        inner = fn

        def fn():
            inner()
            torch.cuda.synchronize()

    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    iters = max(1, min(10_000, int(ROUND_S / once)))
    samples, rounds = [], ROUNDS_PER_CASE
    if once > SLOW_CALL_S:
        # Warm already (one call before `once`): `once` is the first sample, and a few more
        # multi-second calls, if any fit in the budget, give the median.
        samples = [once]
        rounds = min(ROUNDS_PER_CASE, int(SLOW_BUDGET_S / once)) - 1
    else:
        for _ in range(min(iters, 64)):
            fn()
    import resource

    ru0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(max(rounds, 0)):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters)
    ru1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - w0
    for stop in teardown:
        stop()
    s = statistics.median(samples)
    value = work / s * case.scale if case.higher_is_better else s * case.scale
    rec = {"name": case.name, "device": DEVICE, "threads": threads, "value": value,
           "unit": case.unit, "torch": torch.__version__}
    if wall > 0:
        # System time over wall time of the timed calls, as Ember's records carry it.
        rec["sys_fraction"] = (ru1.ru_stime - ru0.ru_stime) / wall
    if case.peak_memory:
        rec["peak_memory_bytes"] = peak_memory_bytes(fn)
    return rec


def torch_worker(threads: int, device: str) -> None:
    """Runs in the venv's python: reads case names on stdin, answers one JSON line each."""
    import torch

    global DEVICE
    DEVICE = device
    torch.set_num_threads(threads)
    cases = {c.name: c for c in CASES}
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else None
    print(json.dumps({"ready": torch.__version__, "gpu": gpu}), flush=True)
    for line in sys.stdin:
        case = cases.get(line.strip())
        print(json.dumps(torch_case(case, threads) if case else None), flush=True)


# ---------------------------------------------------------------- setup


PYTHON: Path | None = None  # --python: use this interpreter's torch instead of the venv's


def venv_python() -> Path:
    return PYTHON if PYTHON is not None else VENV / "bin" / "python"


def torch_importable() -> str | None:
    """None when the venv's torch imports, else why not."""
    if PYTHON is None and not venv_python().exists():
        return f"no virtualenv at {VENV}"
    r = subprocess.run([str(venv_python()), "-c", "import torch; print(torch.__version__)"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        return None
    return (r.stderr.strip().splitlines() or ["import torch failed"])[-1]


def install_torch(log) -> str | None:
    """Creates the venv and installs PyTorch; None on success, else why it failed."""
    if not venv_python().exists():
        r = subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True)
        if r.returncode != 0:
            return f"cannot create {VENV}: {r.stderr.strip()}"
    pip = [str(venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # 1. The CPU-only build from PyTorch's own index, where that index is reachable.
    log(f"installing torch=={TORCH_VERSION} (CPU build) from {CPU_INDEX} ...")
    r = subprocess.run(pip + ["--index-url", CPU_INDEX, "--timeout", "15", "--retries", "0",
                              f"torch=={TORCH_VERSION}"], capture_output=True, text=True)
    if r.returncode == 0 and torch_importable() is None:
        return None
    # 2. PyPI: the wheel with its dependencies (CUDA libraries included, unused here).
    log(f"CPU index unavailable; installing torch=={TORCH_VERSION} from PyPI (with its CUDA "
        "libraries, ~4.5 GB, needed to import it) ...")
    r = subprocess.run(pip + [f"torch=={TORCH_VERSION}"] + TORCH_DEPS, capture_output=True, text=True)
    if r.returncode != 0:
        return f"pip install torch=={TORCH_VERSION} failed: {r.stderr.strip()[-500:]}"
    return torch_importable()


# ---------------------------------------------------------------- the Ember side


def run_ember(args, name: str) -> list[dict]:
    """Ember's records for one case (and its `_rust` twin, where it has one)."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads),
               EMBER_BENCH_RANK_THREADS=str(args.rank_threads))
    flags = ["--json", "--device", args.device, "--filter", name, "--exact"]
    cmd = ([args.ember_bin] if args.ember_bin else ["cargo", "xtask", "bench"]) + flags
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"ember-bench failed ({' '.join(cmd)}):\n{r.stderr}")
    return [x for x in json.loads(r.stdout) if x["name"] in (name, name + "_rust")]


class TorchWorker:
    """A persistent PyTorch process (imports torch once), asked one case at a time."""

    def __init__(self, threads: int, device: str):
        self.p = subprocess.Popen([str(venv_python()), str(Path(__file__).resolve()), "--torch-worker",
                                   "--threads", str(threads), "--device", device],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.p.stdout.readline())
        self.version = ready.get("ready")
        self.gpu = ready.get("gpu")

    def run(self, name: str) -> dict | None:
        self.p.stdin.write(name + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait()


# ---------------------------------------------------------------- saved results


SCHEMA = "ember-bench-results/1"


def cpu_description() -> tuple[str | None, list[str]]:
    """The CPU's model name and its vector/matrix flags, from /proc/cpuinfo where there is one."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, []
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    keep = ("avx", "amx")
    flags = sorted({f for f in fields.get("flags", "").split()
                    if f.startswith(keep) or f in ("fma", "f16c", "sse4_2", "bmi2")})
    return fields.get("model name"), flags


def gpu_driver() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
    except OSError:
        return None
    lines = r.stdout.strip().splitlines()
    return lines[0].strip() if r.returncode == 0 and lines else None


def ember_version() -> dict:
    """Ember's version and commit: from a GPU bundle's bundle.json, else from git in a checkout."""
    try:
        return json.loads((ROOT / "bundle.json").read_text()).get("ember", {})
    except (OSError, ValueError):
        pass

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is not None:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        version = None
        try:
            m = re.search(r'(?m)^version = "([^"]+)"', (ROOT / "Cargo.toml").read_text())
            version = m.group(1) if m else None
        except OSError:
            pass
        return {"version": version, "commit": commit, "dirty": bool(dirty) if dirty is not None else None}
    return {"version": None, "commit": None, "dirty": None}


def command_line() -> str:
    """This run's command, with paths inside the checkout (or bundle) written relative to it
    and paths outside it shortened to their last three parts (`.../bench-venv/bin/python`):
    saved results name no developer's machine."""
    words = []
    for a in sys.argv[1:]:
        if os.path.isabs(a):
            try:
                a = str(Path(a).resolve().relative_to(ROOT))
            except ValueError:
                a = "/".join(["...", *[p for p in Path(a).parts if p != "/"][-3:]])
        words.append(shlex.quote(a))
    return " ".join(["python3 bench/torch_side_by_side.py", *words])


def save(args, rows: list[dict], worker: "TorchWorker | None", other: list[list[dict]]) -> Path:
    """Writes bench/results/<date>-<host>-<device>.json and returns its path. `other`: the
    other side's records, round by round (the versions of PyTorch and mpi4py they ran)."""
    host = args.host or socket.gethostname() or "unknown"
    now = datetime.datetime.now(datetime.timezone.utc)
    date = now.date().isoformat()
    model, flags = cpu_description()
    others = [r for rnd in other for r in rnd]
    side_by_side = worker is not None or any(r["torch"] is not None for r in rows)
    doc = {
        "schema": SCHEMA,
        "kind": "side-by-side" if side_by_side else "ember",
        "date": date,
        "time": now.strftime("%H:%M:%S"),
        "host": host,
        "device": args.device,
        "command": command_line(),
        "machine": {
            "cpu_model": model,
            "cpu_flags": flags,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "gpu": worker.gpu if worker is not None else None,
            "gpu_driver": gpu_driver() if args.device == "cuda" else None,
            "notes": args.notes,
        },
        "ember": ember_version(),
        "threads": args.threads,
        "rounds": args.rounds,
        "records": rows,
    }
    torch_version = worker.version if worker is not None else next(
        (r["torch"] for r in others if r.get("torch")), None)
    mpi4py = next((r for r in others if r.get("mpi4py")), None)
    if mpi4py is not None:
        doc["mpi4py"] = {"version": mpi4py["mpi4py"], "mpi": mpi4py["mpi"]}
    if side_by_side:
        if torch_version is not None:
            doc["torch"] = {"version": torch_version}
    else:
        # Without PyTorch only Ember's values mean anything: keep them as Ember records.
        doc["records"] = [{"name": r["name"], "device": args.device, "threads": r["threads"],
                           "value": r["ember"], "unit": r["unit"],
                           **({"backend": r["backend"]} if r.get("backend") else {})}
                          for r in rows]
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = "-".join(p for p in re.sub(r"[^a-z0-9]", "-", host.lower()).split("-") if p) or "unknown"
    path = out_dir / f"{date}-{slug}-{args.device}.json"
    n = 2
    while path.exists():
        path = out_dir / f"{date}-{slug}-{args.device}-{n}.json"
        n += 1
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


# ---------------------------------------------------------------- table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--filter", default="matmul",
                    help="substring of case names, or several separated by commas (default: matmul)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rank-threads", type=int, default=None,
                    help="threads per rank of the multi-process cases, both sides (default: the "
                         "cores divided among the 2 ranks, at least 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON array instead of a table")
    ap.add_argument("--ember-bin", help="run this ember-bench binary instead of `cargo xtask bench`")
    ap.add_argument("--exact", action="store_true",
                    help="--filter names whole cases (comma-separated), not substrings")
    ap.add_argument("--no-install", action="store_true", help="never create the venv or install torch")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where both sides run the cases (default cpu)")
    ap.add_argument("--python", help="use this interpreter's torch (no virtualenv, no install)")
    ap.add_argument("--save", action="store_true",
                    help="also write bench/results/<date>-<host>-<device>.json (see the docstring)")
    ap.add_argument("--host", help="with --save: the machine's name (default: the hostname)")
    ap.add_argument("--notes", help="with --save: free text for the machine's description")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        torch_worker(args.threads, args.device)
        return
    if args.python:
        global PYTHON
        PYTHON = Path(args.python)
        args.no_install = True

    log = (lambda s: print(s, file=sys.stderr)) if args.json else print
    why = torch_importable()
    if why is not None and not args.no_install:
        why = install_torch(log)
    if why is not None:
        log(f"PyTorch side skipped: {why}")

    wanted = args.filter.split(",")
    selected = [c for c in CASES
                if any(w == c.name if args.exact else w in c.name for w in wanted)
                and args.device in c.devices]
    dist = None
    if any(c.external for c in selected):
        import dist_side_by_side as dist  # beside this script
        if args.rank_threads is None:
            args.rank_threads = dist.default_rank_threads()
    # Why each kind of multi-process case has no other side (None: it has one).
    external_why = {"torch": why}
    if dist is not None and any(c.external == "mpi4py" for c in selected):
        py = str(venv_python()) if venv_python().exists() else sys.executable
        external_why["mpi4py"] = dist.mpi4py_unavailable(py)
        if external_why["mpi4py"] is not None and not args.no_install:
            external_why["mpi4py"] = dist.install_mpi4py(py, log)
        if external_why["mpi4py"] is not None:
            log(f"mpi4py side skipped: {external_why['mpi4py']}")
    worker = (TorchWorker(args.threads, args.device)
              if why is None and any(not c.external for c in selected) else None)
    ember_rounds: list[list[dict]] = []
    torch_rounds: list[list[dict]] = []
    for i in range(args.rounds):
        log(f"round {i + 1}/{args.rounds} ({len(selected)} cases, Ember then PyTorch per case) ...")
        e_rnd, t_rnd = [], []
        for case in selected:
            e_rnd += run_ember(args, case.name)
            t = None
            if case.external and external_why.get(case.external) is None:
                py = str(venv_python()) if venv_python().exists() else sys.executable
                t = (dist.run_mpi4py(py, case.name) if case.external == "mpi4py"
                     else dist.run_torch_ddp_nodes(py, args.rank_threads) if case.name == dist.DDP_NODES
                     else dist.run_torch_ddp(py, args.rank_threads))
            elif not case.external and worker is not None:
                t = worker.run(case.name)
            if t is not None:
                t_rnd.append(t)
        ember_rounds.append(e_rnd)
        torch_rounds.append(t_rnd)
    if not ember_rounds or not ember_rounds[0]:
        raise SystemExit(f"no Ember records match --filter {args.filter!r}")

    case_of = {c.name: c for c in CASES}
    rows = []
    for rec in ember_rounds[0]:
        name = rec["name"]
        e_vals = [r["value"] for rnd in ember_rounds for r in rnd if r["name"] == name]
        # `*_rust` twins compare with PyTorch's case of the base name.
        base = name.removesuffix("_rust")
        t_vals = [r["value"] for rnd in torch_rounds for r in rnd if r["name"] == base]
        case = case_of.get(base)
        higher = case.higher_is_better if case else rec["unit"].endswith("/s")
        ratios = []
        for e_rnd, t_rnd in zip(ember_rounds, torch_rounds):
            e = next((r["value"] for r in e_rnd if r["name"] == name), None)
            t = next((r["value"] for r in t_rnd if r["name"] == base), None)
            if e and t:
                ratios.append(e / t if higher else t / e)
        rows.append({
            "name": name, "unit": rec["unit"], "threads": rec["threads"],
            "ember": statistics.median(e_vals),
            "torch": statistics.median(t_vals) if t_vals else None,
            "ratio": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "rounds": len(e_vals),
            "backend": rec.get("backend"),
            "h100_bound_us": rec.get("h100_bound_us"),
            "fraction_of_h100_bound": rec.get("fraction_of_h100_bound"),
        })
        # System time over wall time of the timed calls, each side's median, where recorded.
        for side, rnds, key in (("ember", ember_rounds, name), ("torch", torch_rounds, base)):
            fr = [r["sys_fraction"] for rnd in rnds for r in rnd
                  if r["name"] == key and r.get("sys_fraction") is not None]
            if fr:
                rows[-1][f"{side}_sys_fraction"] = statistics.median(fr)
        if rec.get("conv_backend"):
            rows[-1]["backend"] = f"conv:{rec['conv_backend']}"
        split = [k for k in ("steps_per_s_cpu_activity_only", "steps_per_s_cuda_activity_only")
                 if k in rec]
        if split:
            # The profiler's overhead split by activity (Ember's extras, medians of rounds).
            def med(k):
                return statistics.median(r[k] for rnd in ember_rounds for r in rnd
                                         if r["name"] == name and k in r)
            rows[-1]["note"] = "Ember steps/s: all activities {:.0f}, {}".format(
                med("steps_per_s"),
                ", ".join(f"{k.removeprefix('steps_per_s_').replace('_', ' ')} {med(k):.0f}"
                          for k in split))
        if "trace_clock" in rec:
            # Which clock Ember's profiler stamps ranges with, and what one read costs here.
            stamps = [r["trace_stamp_ns"] for rnd in ember_rounds for r in rnd
                      if r["name"] == name and "trace_stamp_ns" in r]
            clocks = [r["clock_now_ns"] for rnd in ember_rounds for r in rnd
                      if r["name"] == name and "clock_now_ns" in r]
            clock = "trace clock {} ({:.0f} ns per stamp; Instant::now {:.0f} ns)".format(
                rec["trace_clock"], statistics.median(stamps) if stamps else float("nan"),
                statistics.median(clocks) if clocks else float("nan"))
            rows[-1]["note"] = f"{rows[-1]['note']}; {clock}" if rows[-1].get("note") else clock
        if case is not None and case.external:
            e_recs = [r for rnd in ember_rounds for r in rnd if r["name"] == name]
            t_recs = [r for rnd in torch_rounds for r in rnd if r["name"] == base]
            rows[-1]["threads"] = rec["threads"]
            rows[-1]["backend"] = "mpi"
            rows[-1]["note"] = dist.note(name, e_recs, t_recs)
            if not t_recs:
                rows[-1]["note"] += f" (other side skipped: {external_why.get(case.external)})"

    # Peak memory, where both sides report it: a row of its own, in MB, lower is better.
    for rec in ember_rounds[0]:
        name = rec["name"]
        if "peak_memory_bytes" not in rec:
            continue
        e_vals = [r["peak_memory_bytes"] for rnd in ember_rounds for r in rnd
                  if r["name"] == name and "peak_memory_bytes" in r]
        t_vals = [r["peak_memory_bytes"] for rnd in torch_rounds for r in rnd
                  if r["name"] == name and "peak_memory_bytes" in r]
        e_mb = statistics.median(e_vals) / 1e6
        t_mb = statistics.median(t_vals) / 1e6 if t_vals else None
        ratio = t_mb / e_mb if t_mb and e_mb else None
        rows.append({
            "name": name + ":peak_memory", "unit": "MB", "threads": rec["threads"],
            "ember": e_mb, "torch": t_mb, "ratio": ratio, "ratio_min": ratio, "ratio_max": ratio,
            "rounds": len(e_vals), "backend": None, "h100_bound_us": None,
            "fraction_of_h100_bound": None,
        })

    if worker is not None:
        worker.close()
    if args.save:
        log(f"saved {save(args, rows, worker, torch_rounds)}; `cargo xtask bench-report` renders "
            "docs/performance.md")
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"\n{'case':<44} {'unit':<9} {'ember':>10} {'pytorch':>10} {'ratio':>7}  {'(min-max)':<13} backend")
    for r in rows:
        t = f"{r['torch']:10.2f}" if r["torch"] is not None else f"{'-':>10}"
        q = f"{r['ratio']:7.2f}" if r["ratio"] is not None else f"{'-':>7}"
        span = f"({r['ratio_min']:.2f}-{r['ratio_max']:.2f})" if r["ratio"] is not None else ""
        sys_share = ""
        if r.get("ember_sys_fraction") is not None:
            t_sys = r.get("torch_sys_fraction")
            sys_share = f"  sys/wall {r['ember_sys_fraction']:.1%}" + (
                f" (pytorch {t_sys:.1%})" if t_sys is not None else "")
        print(f"{r['name']:<44} {r['unit']:<9} {r['ember']:10.2f} {t} {q}  {span:<13} "
              f"{r['backend'] or ''}{sys_share}")
    print(f"\nratio > 1: Ember ahead (rates: Ember/PyTorch; times and memory: PyTorch/Ember); "
          f"{args.threads} threads, {args.rounds} alternating rounds, medians, on {args.device}.")
    for r in rows:
        if r.get("note") and case_of.get(r["name"]) and case_of[r["name"]].external:
            print(f"{r['name']}: {r['note']}")
    bounds = [r for r in rows if r["fraction_of_h100_bound"] is not None]
    if bounds:
        print(f"\n{'case':<32} {'H100 bound (us)':>16} {'fraction of bound':>18}")
        for r in bounds:
            print(f"{r['name']:<32} {r['h100_bound_us']:16.1f} {r['fraction_of_h100_bound']:18.3f}")
    if why is not None:
        print(f"PyTorch side skipped: {why}")


if __name__ == "__main__":
    main()
