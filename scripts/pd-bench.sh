#!/usr/bin/env bash
# Pages per second through NIXL (UCX over TCP, two processes on 127.0.0.1, DRAM) for 64-page
# transfers of the DeepSeek-V3.2 pool, with and without the kvlayout check, alternating in one
# run; prints one JSON object (kvlayout.pd bench). Environment: KVLAYOUT_PY (default
# target/py-venv/bin/python), ITERS (default 30). Results: BENCHMARKS.md, "Prefill/decode".
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${KVLAYOUT_PY:-target/py-venv/bin/python}"
exec "$PY" -m kvlayout.pd bench --repo "$PWD" --pages 64 --iters "${ITERS:-30}" "$@"
