#!/usr/bin/env bash
# Runs Ember's GPU checks from prebuilt binaries on a machine with a real GPU and no Rust
# toolchain (a lent GPU machine): the device-generic test suites under EMBER_GPU_TEST=1,
# `ember info`, `ember train` on cuda:0, the CUDA benchmarks side by side with that machine's
# own PyTorch, and compute-sanitizer (memcheck, racecheck, synccheck) over the suites.
#
#   bench/gpu_session.sh BUNDLE OUT [STEP...]     STEP: info tests train bench sanitize (all)
#
# BUNDLE is a tar.xz made by `bench/gpu_bundle.sh` (release binaries built against a fatbin,
# stripped); OUT a directory for the logs (left as OUT/logs.tar.gz and OUT/summary.txt).
# Each step has its own time limit, and the run starts no step after
# EMBER_GPU_SESSION_BUDGET seconds (default 540), so that it ends inside a 10-minute call.
# The last lines printed are a summary.
set -u
BUNDLE=${1:?usage: gpu_session.sh BUNDLE OUT [STEP...]}
OUT=${2:?usage: gpu_session.sh BUNDLE OUT [STEP...]}
shift 2
STEPS=${*:-info tests train bench sanitize}
BUDGET=${EMBER_GPU_SESSION_BUDGET:-540}
START=$SECONDS
BIN=/tmp/ember-gpu-bin
mkdir -p "$OUT" "$BIN"
tar -xJf "$BUNDLE" -C "$BIN" || { echo "cannot unpack $BUNDLE"; exit 1; }

# cuBLAS: the CUDA toolkit's, or the one in the Python environment's nvidia-cublas wheel.
for d in /usr/local/cuda/lib64 \
    $(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
# The test binaries read data files through the workspace path they were built in.
BUILT_IN=$(cat "$BIN/workspace" 2>/dev/null || echo /work/main)
if [ ! -e "$BUILT_IN" ]; then
    mkdir -p "$(dirname "$BUILT_IN")" && ln -s "$PWD" "$BUILT_IN"
fi
unset EMBER_CUDA_EMULATOR EMBER_CUDA_EMULATOR_MEMORY

SUMMARY=()
left() { echo $((BUDGET - (SECONDS - START))); }
# step NAME LIMIT CMD...: runs CMD with a time limit, its output in $OUT/NAME.log.
step() {
    local name=$1 limit=$2
    shift 2
    local l
    l=$(left)
    if [ "$l" -le 10 ]; then
        SUMMARY+=("$name: not run (time budget spent)")
        return
    fi
    [ "$limit" -gt "$l" ] && limit=$l
    local t0=$SECONDS
    echo "==> $name (limit ${limit}s)"
    timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local tail
    tail=$(grep -E '^test result:|passed|failed|error' "$OUT/$name.log" | tail -1)
    SUMMARY+=("$name: rc=$rc in $((SECONDS - t0))s ${tail}")
    tail -5 "$OUT/$name.log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv \
    >"$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt"

for s in $STEPS; do
    case $s in
    info)
        step info 60 "$BIN/ember" info --json
        cat "$OUT/info.log"
        ;;
    tests)
        for t in $(cat "$BIN/tests"); do
            [ -x "$BIN/$t" ] || { SUMMARY+=("$t: missing from the bundle"); continue; }
            step "test-$t" 240 env EMBER_GPU_TEST=1 "$BIN/$t"
        done
        ;;
    train)
        step train-mlp 120 "$BIN/ember" train --device cuda --json
        step train-cnn 180 "$BIN/ember" train --device cuda --model cnn --json
        ;;
    bench)
        step bench-ember 180 "$BIN/ember-bench" --json --device cuda
        step bench-side-by-side 240 python3 bench/torch_side_by_side.py --device cuda \
            --python python3 --ember-bin "$BIN/ember-bench" --filter "" --rounds 3 --threads 16
        ;;
    sanitize)
        # memcheck over the op, gradient and layer suites and one epoch of training;
        # synccheck and racecheck over the op suite (barriers, shuffles, shared memory).
        for t in cuda_ops gradcheck nn; do
            step "memcheck-$t" 120 env EMBER_GPU_TEST=1 compute-sanitizer --tool memcheck \
                --error-exitcode 3 "$BIN/$t"
        done
        step memcheck-train 120 compute-sanitizer --tool memcheck --error-exitcode 3 \
            "$BIN/ember" train --device cuda --epochs 1 --json
        step synccheck-cuda_ops 150 env EMBER_GPU_TEST=1 compute-sanitizer --tool synccheck \
            --error-exitcode 3 "$BIN/cuda_ops"
        # racecheck is slow (the whole op suite takes over 150 s): the suites whose kernels
        # share memory between threads (reductions, softmax and the losses, random numbers).
        step racecheck-cuda_ops 200 env EMBER_GPU_TEST=1 compute-sanitizer --tool racecheck \
            --error-exitcode 3 "$BIN/cuda_ops" reductions losses same_seed --test-threads 4
        ;;
    *) SUMMARY+=("$s: unknown step") ;;
    esac
done

echo
echo "==> summary (${SECONDS}s)"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
# One archive of every log (a lent machine returns only a few files).
(cd "$OUT" && tar -czf logs.tar.gz ./*.log ./*.txt && rm -f ./*.log)
