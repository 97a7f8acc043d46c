#!/usr/bin/env bash
# Every GPU test and the GPU benchmark, with the GPU required.
#
#   scripts/gpu-check.sh build            build (release) and stage into .dev/: the kernels'
#                                         GPU tests (tests/gpu.rs, tests/checksum_gpu.rs), the
#                                         CUDA pool tests (tests/cuda_pools.rs), the CUDA
#                                         backend's unit tests, gpu_bench (package
#                                         kvlayout-gpu-bench), checksum_bench, this script, and
#                                         the Python wheel with the CUDA-tensor checksum test
#                                         (python/tests/test_checksum_cuda.py) when pip is here.
#                                         Needs the Rust toolchain, not a GPU (nothing CUDA is
#                                         linked: cudarc loads libcuda/libnvrtc/libcublas at run
#                                         time), so it runs on a CPU-only build machine.
#   scripts/gpu-check.sh run [--overlap] [--page-size-1]
#                                         run the staged binaries from .dev/ with
#                                         KVLAYOUT_REQUIRE_GPU=1: a test that cannot open the GPU
#                                         fails instead of passing silently; --overlap adds
#                                         gpu_bench --overlap, --page-size-1 adds gpu_bench
#                                         --overlap --page-size-1 --sm-carveout 2. Exits non-zero
#                                         on the first failure.
#   scripts/gpu-check.sh bench ARGS...    run the staged gpu_bench with ARGS (e.g. --overlap
#                                         --page-size-1 --sm-carveout 2 --hold 3), its output
#                                         headed by the commit line below.
#   scripts/gpu-check.sh                  CI: with a GPU, build and run; without one, compile
#                                         the GPU test and benchmark targets (dev profile, so
#                                         they cannot rot), print why the run is skipped, exit 0.
#
# Every log it writes begins with the commit its binaries were built from
# (`gpu-check: commit <git describe --always --dirty>`, recorded in .dev/COMMIT at build time,
# since the device machine has no .git), the GPU and its driver: a figure quoted from a log
# names the code it measured. Write a log with `... 2>&1 | tee $OUT/NAME.txt`.
#
# On a device machine without Rust, carry .dev and run `.dev/gpu-check.sh run` from the
# repository root.
set -euo pipefail

stage=.dev

# `git describe --always --dirty` of the checkout, or "unknown" outside a git checkout.
describe_checkout() {
    git describe --always --dirty 2>/dev/null || echo unknown
}

# The header every log starts with: the commit of the binaries that run (staged ones: the
# commit recorded when they were built; else the checkout's), then the GPU.
log_header() {
    local commit
    if [ -f "$stage/COMMIT" ]; then
        commit=$(cat "$stage/COMMIT")
    else
        commit=$(describe_checkout)
    fi
    echo "gpu-check: commit $commit"
    echo "gpu-check: started $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null \
            | sed 's/^/gpu-check: gpu /' || true
    fi
}

has_gpu() {
    # A driver library and a device node: what cudarc needs to open GPU 0.
    { ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; } && ls /dev/nvidia0 >/dev/null 2>&1
}

build() {
    mkdir -p "$stage"
    describe_checkout >"$stage/COMMIT"
    echo "gpu-check: building commit $(cat "$stage/COMMIT")"
    local json
    json=$(mktemp)
    # gpu_bench prints the chooser's host time per step (feature host-timing of the kernels).
    cargo build --release -p kvlayout-gpu-bench --bin gpu_bench --features kvlayout-kernels/host-timing
    cargo build --release -p kvlayout-kernels --bin checksum_bench
    cargo test --release --no-run --message-format=json \
        -p kvlayout-kernels --test gpu >"$json"
    cargo test --release --no-run --message-format=json \
        -p kvlayout-kernels --test checksum_gpu >>"$json"
    cargo test --release --no-run --message-format=json \
        -p kvlayout-tests --test cuda_pools >>"$json"
    cargo test --release --no-run --message-format=json \
        -p kvlayout-pool --features cuda --lib >>"$json"
    exe() { # $1: target name, $2: kind (test or lib)
        grep "\"name\":\"$1\"" "$json" | grep "\"kind\":\[\"$2\"\]" \
            | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1
    }
    cp "$(exe gpu test)" "$stage/kernels_gpu"
    cp "$(exe checksum_gpu test)" "$stage/checksum_gpu"
    cp "${CARGO_TARGET_DIR:-target}/release/checksum_bench" "$stage/checksum_bench"
    cp "$(exe cuda_pools test)" "$stage/cuda_pools"
    cp "$(exe kvlayout_pool lib)" "$stage/pool_unit"
    cp "${CARGO_TARGET_DIR:-target}/release/gpu_bench" "$stage/gpu_bench"
    cp "$0" "$stage/gpu-check.sh"
    # Debug info off: the staged binaries travel to the device machine (64 MiB in all).
    command -v strip >/dev/null && strip --strip-debug "$stage"/kernels_gpu "$stage"/cuda_pools \
        "$stage"/pool_unit "$stage"/gpu_bench "$stage"/checksum_gpu "$stage"/checksum_bench
    rm -f "$json"
    # The abi3 wheel and the CUDA-tensor test (the device machine has torch and pytest).
    rm -rf "$stage/wheels" && mkdir -p "$stage/wheels"
    if python3 -m pip --version >/dev/null 2>&1; then
        python3 -m pip wheel --no-deps ./python -w "$stage/wheels"
        cp python/tests/test_checksum_cuda.py "$stage/wheels/"
    else
        echo "gpu-check: no pip here: the Python CUDA-tensor test is not staged"
    fi
    ls -l "$stage"
}

run() {
    local page1=0 overlap=0
    for a in "$@"; do
        case "$a" in
            --page-size-1) page1=1 ;;
            --overlap) overlap=1 ;;
            *) echo "gpu-check.sh run: unknown option $a" >&2; exit 2 ;;
        esac
    done
    log_header
    export KVLAYOUT_REQUIRE_GPU=1
    # cuBLAS for gpu_bench --overlap: the CUDA toolkit's, or the pip wheel's.
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        "$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null || true)"; do
        [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    echo "== kernels: GPU tests (every path against its CPU reference, bit for bit)"
    "$stage/kernels_gpu" --ignored --test-threads 1
    echo "== kernels: the page checksum kernel against the CPU reference, bit for bit"
    "$stage/checksum_gpu" --ignored --test-threads 1
    if ls "$stage"/wheels/*.whl >/dev/null 2>&1; then
        echo "== python: CUDA-tensor page checksums against the CPU (the staged wheel)"
        rm -rf /tmp/kvlayout-site
        python3 -m pip install -q --no-index --no-deps --target /tmp/kvlayout-site "$stage"/wheels/*.whl
        PYTHONPATH=/tmp/kvlayout-site python3 -m pytest -rs -p no:cacheprovider \
            "$stage/wheels/test_checksum_cuda.py"
    else
        echo "gpu-check: no staged wheel: the Python CUDA-tensor test did not run" >&2
        exit 1
    fi
    echo "== pools: CUDA backend unit tests"
    "$stage/pool_unit" backend::cuda --test-threads 1
    echo "== pools: CUDA pool tests (tests/cuda_pools.rs)"
    "$stage/cuda_pools" --ignored --test-threads 1
    if [ "$page1" = 1 ]; then
        echo "== gpu_bench --overlap --page-size-1 --sm-carveout 2"
        "$stage/gpu_bench" --overlap --page-size-1 --sm-carveout 2
    fi
    if [ "$overlap" = 1 ]; then
        echo "== gpu_bench --overlap"
        "$stage/gpu_bench" --overlap
    fi
    echo "== gpu-check: all passed"
}

bench() {
    log_header
    echo "gpu-check: gpu_bench $*"
    "$stage/gpu_bench" "$@"
}

case "${1:-}" in
    build) build ;;
    run) shift; run "$@" ;;
    bench) shift; bench "$@" ;;
    "")
        if has_gpu; then
            build
            run
        else
            log_header
            cargo build -p kvlayout-gpu-bench --bin gpu_bench
            cargo test --no-run -p kvlayout-kernels --test gpu
            cargo test --no-run -p kvlayout-kernels --test checksum_gpu
            cargo test --no-run -p kvlayout-tests --test cuda_pools
            cargo test --no-run -p kvlayout-pool --features cuda --lib
            echo "gpu-check: GPU run skipped: no CUDA driver (libcuda) or no /dev/nvidia0 on this machine; the GPU tests and gpu_bench compiled"
        fi
        ;;
    *) echo "usage: $0 [build | run [--overlap] [--page-size-1] | bench ARGS...]" >&2; exit 2 ;;
esac
