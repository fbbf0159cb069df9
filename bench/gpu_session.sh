#!/usr/bin/env bash
# The next GPU session in one call of at most 10 minutes (docs/benchmarks.md, "The next GPU
# session"): unpacks the bundle of `cargo xtask gpu-bundle` and runs its `gpu-session` in
# three parts with budgets of their own, so that slow suites cannot starve the benchmarks:
#
#   1. `info tests`: every suite on the GPU, every test's outcome recorded (the `cudnn`
#      suite on both cuDNN APIs), and the suites file `results/*-cuda-suites.json`;
#   2. `bench train`: the side-by-side cases still owed a measurement (FILTER) against the
#      machine's PyTorch, saved as `results/*-cuda.json`, then `ember train --device cuda`;
#   3. `ncu`: the ResNet-18 step's kernels, as CSV.
#
# Usage (from the repository root, where the bundle was built):
#   bash bench/gpu_session.sh [BUNDLE]        # default target/gpu/ember-gpu.tar.xz
# Results go to $OUT/session-{tests,bench,ncu}/ (OUT defaults to ./gpu-session-out): each
# has summary.txt, logs.tar.gz and results/. Bring the results/*.json back into
# bench/results/ and run `cargo xtask bench-report`.
set -u

bundle="${1:-target/gpu/ember-gpu.tar.xz}"
out="${OUT:-$PWD/gpu-session-out}"
filter="${FILTER:-softmax_ce,conv2d_f32,profiler_,train_mlp_1000_512_10_b64,resnet18}"
if [ ! -f "$bundle" ]; then
    echo "no bundle at $bundle: run \`cargo xtask gpu-bundle\` first" >&2
    exit 2
fi
work="$(mktemp -d)"
tar -xf "$bundle" -C "$work" || exit 2
xtask="$work/ember-gpu/bin/xtask"
mkdir -p "$out"

rc=0
"$xtask" gpu-session --out "$out/session-tests" --budget "${TESTS_BUDGET:-230}" info tests || rc=1
"$xtask" gpu-session --out "$out/session-bench" --budget "${BENCH_BUDGET:-170}" \
    --filter "$filter" bench train || rc=1
"$xtask" gpu-session --out "$out/session-ncu" --budget "${NCU_BUDGET:-70}" ncu || rc=1
for part in tests bench ncu; do
    echo "==> $part"
    cat "$out/session-$part/summary.txt" 2>/dev/null
done
exit "$rc"
