#!/usr/bin/env python3
"""The multi-process cases of bench/torch_side_by_side.py: their other side, in processes of
its own (ember-bench starts its ranks itself, see Note [Benchmark ranks] in
crates/ember-bench/src/dist.rs).

- all_reduce_mpi_{1kib,64kib,1mib,16mib,256mib}: MPI_Allreduce (sum, MPI_IN_PLACE) of a
  float32 numpy buffer of that size, called directly through mpi4py on 2 ranks started by
  `mpirun -n 2 --oversubscribe --bind-to none` (as root also `--allow-run-as-root`): the
  same Open MPI that Ember's `mpi` backend calls. Bus bandwidth in GB/s as nccl-tests define
  it for all-reduce (algbw * 2(n-1)/n). mpi4py comes from PyPI (`pip install mpi4py`); its
  wheel loads the system's libmpi.
- ddp_train_mlp_2000_1000_100_b128_2ranks: torch.nn.parallel.DistributedDataParallel over
  the gloo backend, 2 processes started by torch.multiprocessing.spawn (rendezvous on
  127.0.0.1), each training Linear(2000,1000)-ReLU-Linear(1000,100) with SGD (lr 0.01) and
  cross-entropy on 64 rows of a global batch of 128; samples/s of the global batch.
- ddp_train_mlp_2000_1000_100_b128_2nodes: the same step on 2 nodes x 1 process on loopback:
  two `torchrun --nnodes 2 --nproc-per-node 1 --node-rank R --master-addr 127.0.0.1` (gloo
  over TCP on lo), each process on 64 rows; Ember's side is two `ember launch --nnodes 2`
  (Note [Benchmark nodes] in crates/ember-bench/src/dist_nodes.rs).

Both sides time alike: the calls per round come from the slower rank's first timed call, a
barrier starts each of 5 rounds, a round's time is the slower rank's, and the median round
is kept. Threads per rank: --threads (the script's --rank-threads; 1 each on a 2-core
machine), for PyTorch through torch.set_num_threads and OMP_NUM_THREADS.

Run by torch_side_by_side.py; by hand (in a Python with mpi4py / torch):
    mpirun -n 2 python3 bench/dist_side_by_side.py --mpi4py-rank all_reduce_mpi_1mib --out r.json
    python3 bench/dist_side_by_side.py --torch-ddp --threads 1 --out r.json
    python3 bench/dist_side_by_side.py --torch-ddp-nodes --threads 1 --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ALL_REDUCE = {
    "all_reduce_mpi_1kib": 1 << 10,
    "all_reduce_mpi_64kib": 64 << 10,
    "all_reduce_mpi_1mib": 1 << 20,
    "all_reduce_mpi_16mib": 16 << 20,
    "all_reduce_mpi_256mib": 256 << 20,
}
DDP = "ddp_train_mlp_2000_1000_100_b128_2ranks"
DDP_NODES = "ddp_train_mlp_2000_1000_100_b128_2nodes"
RANKS = 2
ROUNDS = 5
ROUND_S = 0.2
# A job of ranks that takes longer than this is ended (a rank that died or hangs).
JOB_TIMEOUT_S = 600


def default_rank_threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // RANKS)


def mpirun(n: int) -> list[str]:
    """The mpirun flags ember-bench uses (ember_parallel::testing::mpirun_command)."""
    cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def ranks_seconds_per_call(f, barrier, max_all) -> float:
    """Seconds per call of f, agreed by the ranks, as ember-bench's `ranks_ns_per_call`."""
    f()
    barrier()
    t0 = time.perf_counter()
    f()
    once = max_all(max(time.perf_counter() - t0, 1e-7))
    iters = max(1, min(10_000, int(ROUND_S / once)))
    for _ in range(min(iters, 64)):
        f()
    samples = []
    for _ in range(ROUNDS):
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            f()
        samples.append(max_all(time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def busbw(nbytes: int, seconds: float, n: int = RANKS) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, GB/s."""
    return nbytes / seconds / 1e9 * 2 * (n - 1) / n


# ---------------------------------------------------------------- the ranks


def mpi4py_rank(name: str, out: str) -> None:
    import mpi4py
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    nbytes = ALL_REDUCE[name]
    buf = np.zeros(nbytes // 4, dtype=np.float32)
    s = ranks_seconds_per_call(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                               comm.Barrier, lambda v: comm.allreduce(v, op=MPI.MAX))
    if comm.Get_rank() == 0:
        rec = {"name": name, "value": busbw(nbytes, s, comm.Get_size()), "unit": "GB/s",
               "us_per_call": s * 1e6, "ranks": comm.Get_size(), "bytes": nbytes,
               "mpi4py": mpi4py.__version__,
               "mpi": MPI.Get_library_version().split(",")[0].strip(" \x00\n")}
        Path(out).write_text(json.dumps(rec))


def _ddp_rank(rank: int, world: int, port: int | None, threads: int, out: str,
              name: str = DDP) -> None:
    """One rank of a DDP case; `port` None: under torchrun, whose variables say where."""
    if port is not None:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(threads)
    if port is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2000, 1000), torch.nn.ReLU(),
                                torch.nn.Linear(1000, 100))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_rank = 128 // world
    torch.manual_seed(1 + rank)
    x = torch.randn(per_rank, 2000)
    y = torch.randint(0, 100, (per_rank,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        opt.step()

    def max_all(v: float) -> float:
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    s = ranks_seconds_per_call(step, dist.barrier, max_all)
    if rank == 0:
        rec = {"name": name, "value": 128 / s, "unit": "samples/s", "steps_per_s": 1 / s,
               "ranks": world, "batch_per_rank": per_rank, "threads": threads,
               "torch": torch.__version__, "backend": "gloo"}
        Path(out).write_text(json.dumps(rec))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_rank(threads: int, out: str) -> None:
    """A rank started by torchrun (the 2-node case): rank and world from its variables."""
    _ddp_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, threads, out,
              DDP_NODES)


def torch_ddp_nodes(python: str, threads: int, out: str) -> None:
    """Two torchrun launchers, node ranks 0 and 1, one process each, on loopback."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([python, "-m", "torch.distributed.run", "--nnodes", "2",
                               "--nproc-per-node", "1", "--node-rank", str(node),
                               "--master-addr", "127.0.0.1", "--master-port", str(port),
                               str(Path(__file__).resolve()), "--torchrun-rank",
                               "--threads", str(threads), "--out", out],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for node in (0, 1)]
    failed = []
    for node, p in enumerate(procs):
        text, _ = p.communicate(timeout=JOB_TIMEOUT_S)
        if p.returncode != 0:
            failed.append(f"node {node} ({p.returncode}):\n{text[-2000:]}")
    if failed:
        raise SystemExit("torchrun --nnodes 2 failed: " + "\n".join(failed))


def torch_ddp(threads: int, out: str) -> None:
    import torch.multiprocessing as mp

    os.environ["OMP_NUM_THREADS"] = str(threads)
    mp.spawn(_ddp_rank, args=(RANKS, free_port(), threads, out), nprocs=RANKS, join=True)


# ---------------------------------------------------------------- the parent's side


def _run_job(cmd: list[str], env: dict | None = None) -> tuple[dict | None, str | None]:
    """Runs one job whose rank 0 writes a JSON record to the file named after --out."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "record.json")
        try:
            r = subprocess.run(cmd + ["--out", out], capture_output=True, text=True,
                               timeout=JOB_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            return None, f"{' '.join(cmd)} took longer than {JOB_TIMEOUT_S} s"
        if r.returncode != 0 or not os.path.exists(out):
            return None, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        return json.loads(Path(out).read_text()), None


def run_mpi4py(python: str, name: str) -> dict:
    rec, err = _run_job(mpirun(RANKS) + [python, str(Path(__file__).resolve()), "--mpi4py-rank", name])
    if err is not None:
        raise SystemExit(f"the mpi4py side of {name}: {err}")
    rec["threads"] = 1
    return rec


def run_torch_ddp(python: str, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    rec, err = _run_job([python, str(Path(__file__).resolve()), "--torch-ddp", "--threads",
                         str(threads)], env)
    if err is not None:
        raise SystemExit(f"the PyTorch DDP side of {DDP}: {err}")
    return rec


def run_torch_ddp_nodes(python: str, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    rec, err = _run_job([python, str(Path(__file__).resolve()), "--torch-ddp-nodes",
                         "--python", python, "--threads", str(threads)], env)
    if err is not None:
        raise SystemExit(f"the PyTorch DDP side of {DDP_NODES}: {err}")
    return rec


def mpi4py_unavailable(python: str) -> str | None:
    """None when `python` imports mpi4py against an MPI and mpirun is on PATH, else why not."""
    if shutil.which("mpirun") is None:
        return "mpirun is not on PATH (install Open MPI: Debian's openmpi-bin)"
    r = subprocess.run([python, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        return None
    last = (r.stderr.strip().splitlines() or ["import mpi4py failed"])[-1]
    return f"{last} (install it into that Python with `{python} -m pip install mpi4py`)"


def install_mpi4py(python: str, log) -> str | None:
    """pip install mpi4py into `python`'s environment; None when it then works."""
    log(f"installing mpi4py into {python} ...")
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "mpi4py"],
                   capture_output=True, text=True)
    return mpi4py_unavailable(python)


def note(name: str, ember: list[dict], other: list[dict]) -> str:
    """The side-by-side row's note: what the other side was, and Ember's extras."""
    def med(recs: list[dict], key: str) -> float | None:
        vals = [r[key] for r in recs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    threads = ember[0].get("threads") if ember else None
    if name in ALL_REDUCE:
        o = other[0] if other else {}
        off = med(ember, "busbw_check_off")
        parts = [f"against MPI_Allreduce through mpi4py {o.get('mpi4py', '?')} ({o.get('mpi', '?')}), "
                 f"{RANKS} ranks"]
        if off is not None:
            parts.append(f"Ember with set_check_inputs(false): {off:.3g} GB/s")
        return "; ".join(parts)
    one, vs = med(ember, "one_process_samples_per_s"), med(ember, "vs_one_process")
    one_threads = ember[0].get("one_process_threads") if ember else None
    if name == DDP_NODES:
        s = (f"against PyTorch DDP (gloo) under torchrun --nnodes 2 on loopback; 2 nodes x 1 process "
             f"x {threads} thread(s) on both sides, Ember's two ember launch --nnodes 2 over Open MPI's TCP")
    else:
        s = f"against PyTorch DDP (gloo), {RANKS} ranks x {threads} thread(s) on both sides"
    if one is not None and vs is not None:
        s += f"; Ember in one process at batch 128 ({one_threads} threads, no DDP): {one:.0f} samples/s, DDP {vs:.2f}x that"
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpi4py-rank", metavar="CASE", help="run as one rank of an all_reduce_mpi_* case")
    ap.add_argument("--torch-ddp", action="store_true", help="run the PyTorch DDP case (spawns its ranks)")
    ap.add_argument("--torch-ddp-nodes", action="store_true",
                    help="run the PyTorch 2-node DDP case (two torchrun --nnodes 2)")
    ap.add_argument("--torchrun-rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch")
    ap.add_argument("--threads", type=int, default=default_rank_threads(), help="threads per rank")
    ap.add_argument("--out", required=True, help="where rank 0 writes its record (JSON)")
    args = ap.parse_args()
    if args.mpi4py_rank:
        mpi4py_rank(args.mpi4py_rank, args.out)
    elif args.torch_ddp:
        torch_ddp(args.threads, args.out)
    elif args.torch_ddp_nodes:
        torch_ddp_nodes(args.python, args.threads, args.out)
    elif args.torchrun_rank:
        torchrun_rank(args.threads, args.out)
    else:
        sys.exit("give --mpi4py-rank CASE, --torch-ddp or --torch-ddp-nodes")


if __name__ == "__main__":
    main()
