#!/usr/bin/env bash
# The wheel, as a user installs it (built from source; kvlayout is not on PyPI): `pip wheel
# ./python` builds one abi3 wheel (CPython 3.10+) into target/wheel; a fresh virtual environment
# in a temporary folder outside the repository gets only that wheel (and its declared dependency,
# numpy) plus the NIXL wheel (--no-deps, as scripts/pd-ci.sh: it imports torch only for torch
# tensors); from that folder it runs the prefill/decode self-test on the packaged case
# geometries and imports the engine glue (kvlayout.vllm, kvlayout.sglang: no engine imported).
# Environment: PYTHON (default python3). Exit: the self-test's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
rm -rf target/wheel
"$PYTHON" -m pip wheel --quiet --no-deps -w target/wheel ./python
wheel=$(ls target/wheel/kvlayout-*.whl)
case "$wheel" in
    *-abi3-*) echo "wheel-ci: $wheel" ;;
    *) echo "wheel-ci: $wheel is not an abi3 wheel" >&2; exit 1 ;;
esac
outside=$(mktemp -d)
trap 'rm -rf "$outside"' EXIT
"$PYTHON" -m venv "$outside/venv"
"$outside/venv/bin/python" -m pip install --quiet --upgrade pip
"$outside/venv/bin/python" -m pip install --quiet "$PWD/$wheel"
"$outside/venv/bin/python" -m pip install --quiet --no-deps nixl-cu12
cd "$outside"
venv/bin/python -c "import kvlayout.vllm, kvlayout.sglang, sys; assert 'vllm' not in sys.modules and 'sglang' not in sys.modules; print('wheel-ci: engine glue imports without the engines')"
venv/bin/python -m kvlayout.pd selftest --engine nixl
