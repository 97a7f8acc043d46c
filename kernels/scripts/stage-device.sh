#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries on this (CPU-only) machine and stages them in .dev/
# (git-ignored) for the device machine, which has no Rust toolchain. Nothing CUDA is linked at
# build time (cudarc loads libcuda / libnvrtc at run time), so the binaries run there unchanged.
# Run from the workspace root. Then, on the device (carry .dev):
#   .dev/gpu_tests --ignored --test-threads 1
#   .dev/gpu_bench --dump /tmp/q > bench.txt && python3 .dev/torch_check.py /tmp/q
set -euo pipefail
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-kernels}"
cargo build -p kvlayout-kernels --release --bins
tests=$(cargo test -p kvlayout-kernels --release --no-run --message-format=json 2>/dev/null \
  | grep '"name":"gpu"' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)
mkdir -p .dev
cp "$tests" .dev/gpu_tests
cp "$CARGO_TARGET_DIR/release/gpu_bench" .dev/gpu_bench
cp kernels/scripts/torch_check.py .dev/torch_check.py
ls -l .dev
