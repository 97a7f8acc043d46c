#!/usr/bin/env bash
# Prefill/decode handshake tests on the real engines (kvlayout.pd; python/tests/test_pd_*.py).
# Installs Debian's libibverbs1 (the Mooncake wheel links it; apt-get, as root) and the two
# transfer-engine wheels into the Python tests' virtual environment (KVLAYOUT_PY_VENV, default
# target/py-venv, the one scripts/python-tests.sh uses), then runs scripts/python-tests.sh on the
# pd tests with KVLAYOUT_PD_REQUIRE_ENGINES=1: a missing engine fails instead of skipping.
# nixl-cu12 is installed without its declared torch dependency: it imports torch only when it is
# handed torch tensors, and the self-test moves DRAM regions (numpy).
# Environment: PYTHON (default python3), KVLAYOUT_PY_VENV. Exit: pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${KVLAYOUT_PY_VENV:-target/py-venv}"
if ! ldconfig -p | grep -q 'libibverbs\.so\.1'; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "pd-ci: libibverbs1 is missing and this is not root: apt-get install -y libibverbs1" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends libibverbs1 \
        || { apt-get update && apt-get install -y --no-install-recommends libibverbs1; }
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet numpy
"$VENV/bin/python" -m pip install --quiet --no-deps nixl-cu12
"$VENV/bin/python" -m pip install --quiet mooncake-transfer-engine-non-cuda
KVLAYOUT_PY_VENV="$VENV" KVLAYOUT_PD_REQUIRE_ENGINES=1 exec scripts/python-tests.sh -k "test_pd_ or test_store_" "$@"
