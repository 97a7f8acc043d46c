#!/usr/bin/env bash
# The adapters against the engines' own code, on the CPU (issue 22; ../shared/ENGINES.md, "Exact steps").
#
# Makes a virtual environment under target/engines-venv holding torch (the CPU build from
# download.pytorch.org when that index answers, else PyPI's default build, used on the CPU), the
# pinned engine releases installed with --no-deps (SGLang 0.5.23, vLLM 0.33.0, NIXL 1.5.1) plus
# the packages their imports need, vLLM 0.20.0 unpacked into a side folder (put first on
# PYTHONPATH for its own pytest run), and ./python. Then runs python/tests/engines twice: once
# over SGLang 0.5.23 and vLLM 0.33.0, once over vLLM 0.20.0. KVLAYOUT_ENGINES_REQUIRED=1 is set
# for both: a skipped test fails the run (python/tests/engines/conftest.py), so nothing passes by
# not running.
#
# Environment: PYTHON (default python3, >= 3.10), KVLAYOUT_ENGINES_VENV (default
# target/engines-venv), KVLAYOUT_ENGINES_WHEELS (download folder, default target/engines-wheels).
# Downloads on a fresh machine: see README, "Tests on the engines' own code".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${KVLAYOUT_ENGINES_VENV:-target/engines-venv}"
WHEELS="${KVLAYOUT_ENGINES_WHEELS:-target/engines-wheels}"
TORCH_VERSION=2.14.0          # vllm 0.33.0 pins torch==2.14.0 (sglang 0.5.23 asks 2.14.1; --no-deps)
SGLANG_VERSION=0.5.23
VLLM_VERSION=0.33.0
VLLM_OLD_VERSION=0.20.0
NIXL_VERSION=1.5.1            # vLLM 0.33.0's NixlConnector asks NIXL >= 1.5.0 (check_nixl_version)
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
started=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"${PIP[@]}" install --quiet --upgrade pip

# torch: the CPU index is ~10x smaller; PyPI's build carries the CUDA libraries but runs on the CPU.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if ! "${PIP[@]}" install --quiet --timeout 15 --retries 0 \
        --index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION"; then
        echo "engines-ci: the CPU torch index did not answer; torch==$TORCH_VERSION from PyPI" >&2
        "${PIP[@]}" install --quiet "torch==$TORCH_VERSION"
    fi
fi

# The engines without their dependency sets (flashinfer, CUDA kernels, servers): only what the
# imports of their pools, configs and connectors need, each pinned where the engine pins it.
"${PIP[@]}" install --quiet --no-deps "sglang==$SGLANG_VERSION" "vllm==$VLLM_VERSION"
"${PIP[@]}" install --quiet \
    numpy pytest orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq \
    tqdm ipython aiohttp "transformers==5.19.0" dill "apache-tvm-ffi==0.1.11" sentencepiece \
    "compressed-tensors==0.18.0" gguf cachetools cloudpickle blake3 py-cpuinfo pyyaml regex einops \
    huggingface_hub safetensors cbor2 openai-harmony openai uvloop prometheus-client xgrammar \
    fastapi partial-json-parser llguidance
"${PIP[@]}" install --quiet --no-deps "torchvision==0.29.0"
# NIXL for vLLM's real NixlConnector worker (python/tests/engines/test_vllm_connector.py): vLLM
# imports `nixl._api`; the `nixl` meta package loads `nixl_cu13` (or cu12) and declares both, so
# --no-deps with the one backend. It links no CUDA library: UCX on host memory runs on the CPU.
"${PIP[@]}" install --quiet --no-deps "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION"

# vLLM 0.20.0 beside 0.33.0: unpacked, not installed; its tests run with it first on PYTHONPATH.
OLD="$VENV/side/vllm-$VLLM_OLD_VERSION"
if [ ! -d "$OLD/vllm" ]; then
    mkdir -p "$WHEELS" "$OLD"
    "${PIP[@]}" download --quiet --no-deps -d "$WHEELS" "vllm==$VLLM_OLD_VERSION"
    "$VENV/bin/python" -m zipfile -e "$WHEELS"/vllm-"$VLLM_OLD_VERSION"-*.whl "$OLD"
fi

"${PIP[@]}" install --quiet --force-reinstall --no-deps ./python
echo "engines-ci: environment ready after $(( $(date +%s) - started )) s"

export KVLAYOUT_ENGINES_REQUIRED=1 VLLM_TARGET_DEVICE=cpu
"$VENV/bin/python" -m pytest -q python/tests/engines --ignore=python/tests/engines/test_vllm_0_20.py "$@"
PYTHONPATH="$PWD/$OLD" VLLM_CACHE_ROOT="$PWD/$VENV/side/vllm-cache" \
    "$VENV/bin/python" -m pytest -q python/tests/engines/test_vllm_0_20.py "$@"
echo "engines-ci: passed in $(( $(date +%s) - started )) s"
