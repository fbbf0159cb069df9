#!/usr/bin/env bash
# Builds what `bench/gpu_session.sh` runs on a GPU machine without a Rust toolchain, into one
# small archive: `ember`, `ember-bench` and the device-generic test binaries, in release mode,
# against a fatbin for one architecture (default sm_90, the H100/H200), stripped.
#
#   bench/gpu_bundle.sh OUT.tar.xz [ARCH]
#
# The one-architecture fatbin keeps the binaries small (8 MB of kernels rather than 40 MB for
# every architecture); the build goes to target/gpu so that target/main is left as it is.
set -euo pipefail
OUT_FILE=${1:?usage: gpu_bundle.sh OUT.tar.xz [ARCH]}
ARCH=${2:-90}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
NVCC=${NVCC:-$(command -v nvcc || echo target/nvcc/nvidia/cu13/bin/nvcc)}
KDIR=$ROOT/target/kernels-sm$ARCH
mkdir -p "$KDIR"

# 1. The kernels for one architecture (SASS and PTX) from the current sources, with the
#    entry-point names (one per line, as `cargo xtask kernels` writes them) read off the PTX.
ls kernels/*.cu | sed 's/.*/#include "&"/; s|"kernels/|"'"$ROOT"'/kernels/|' >"$KDIR/ember_all.cu"
if [ ! -f "$KDIR/ember.kernels" ] || [ -n "$(find kernels -newer "$KDIR/ember.kernels" -print -quit)" ]; then
    rm -rf "$KDIR/build" && mkdir -p "$KDIR/build"
    "$NVCC" -fatbin -O3 -I "$ROOT/kernels" --keep --keep-dir "$KDIR/build" -o "$KDIR/ember.fatbin" \
        -gencode "arch=compute_$ARCH,code=[sm_$ARCH,compute_$ARCH]" "$KDIR/ember_all.cu"
    sed -n 's/^\.visible \.entry \([A-Za-z0-9_]*\)(.*/\1/p' "$KDIR"/build/*.ptx | LC_ALL=C sort >"$KDIR/ember.kernels.new"
    [ -s "$KDIR/ember.kernels.new" ] || { echo "no entry points in the PTX"; exit 1; }
    mv "$KDIR/ember.kernels.new" "$KDIR/ember.kernels"
fi
echo "$(wc -l <"$KDIR/ember.kernels") kernels for sm_$ARCH"

# 2. The binaries, in one cargo invocation: one feature resolution, so the libraries are
#    compiled once for the programs and the tests alike.
export CARGO_TARGET_DIR=$ROOT/target/gpu EMBER_KERNELS_FATBIN=$KDIR/ember.fatbin
mkdir -p "$CARGO_TARGET_DIR"
# The suites that take EMBER_GPU_TEST=1 (the real driver instead of the emulator).
TESTS="cuda_ops gradcheck nn data optim schedulers walkthroughs"
cargo build --release --locked --message-format=json -p ember -p ember-bench -p ember-tensor \
    -p ember-autograd -p ember-nn --bin ember --bin ember-bench $(printf -- '--test %s ' $TESTS) \
    >"$CARGO_TARGET_DIR/gpu-build.json"

# 3. Stripped copies, test binaries named after their test target, the list of suites, and
#    the workspace path they were built in (their data files are found through it).
STAGE=$CARGO_TARGET_DIR/bundle
rm -rf "$STAGE" && mkdir -p "$STAGE"
python3 - "$CARGO_TARGET_DIR/gpu-build.json" "$STAGE" ember ember-bench $TESTS <<'EOF'
import json, subprocess, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in sys.argv[3:]:
        subprocess.run(["strip", "-o", f"{sys.argv[2]}/{m['target']['name']}", m["executable"]], check=True)
EOF
echo "$TESTS" >"$STAGE/tests"
echo "$ROOT" >"$STAGE/workspace"
tar -C "$STAGE" -cf - . | xz -T0 -9 >"$OUT_FILE"
ls -la "$STAGE" "$OUT_FILE"
