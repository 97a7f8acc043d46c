#!/usr/bin/env bash
# The Python package's tests: builds and installs ./python (pip, maturin from PyPI) with pytest,
# numpy, ml_dtypes and mypy (test_typing.py) into a virtual environment under target/py-venv, then runs pytest on
# python/tests. Exit: pytest's, except 5 ("no tests collected"), which fails with a message.
# Environment: PYTHON (default python3, >= 3.10), KVLAYOUT_PY_VENV (default target/py-venv),
# KVLAYOUT_CLI (a built `kvlayout` binary: the fingerprint-equals-CLI tests run against it;
# default target/debug/kvlayout when present).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${KVLAYOUT_PY_VENV:-target/py-venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet pytest numpy ml_dtypes mypy
"$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps ./python
set +e
"$VENV/bin/python" -m pytest python/tests --ignore=python/tests/engines "$@"  # engines: scripts/engines-ci.sh
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "python-tests: pytest collected no tests under python/tests: failing (a run that tests nothing is not a pass)" >&2
    exit 1
fi
exit "$rc"
