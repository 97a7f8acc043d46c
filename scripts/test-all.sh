#!/usr/bin/env bash
# Every test of the project, as CI runs it (README's test command). A fresh machine needs the
# Rust toolchain and Python 3.10+ with pip; Debian's libibverbs1 (for the Mooncake wheel) is
# installed with apt-get when missing and this runs as root.
#
#   1. the Rust tests of the whole workspace (unit, integration, compile-fail, doc tests);
#   2. the pool crate in release with the opt-out feature `unchecked`, so both branches of the
#      per-transfer checks run (`cargo test --workspace` unifies features and never builds it);
#   3. loom model-checking of the concurrent page claims;
#   4. the fingerprint recomputed from its documented byte stream by an independent Python
#      reference, and the page checksum's vectors by another (layout-core/tests/checksum_*);
#   4b. the nvidia-smi phase slicer of `gpu_bench --hold` (kernels/scripts/smi_phases.py) on a
#      hand-made log;
#   5. the Python package (pip install ./python into a venv) and its pytest suite, then the
#      prefill/decode handshake self-tests over real NIXL and Mooncake wheels;
#   6. the wheel (pip wheel ./python, abi3) installed alone in a fresh venv outside the
#      repository: the prefill/decode self-test there (scripts/wheel-ci.sh);
#   7. the adapters on the engines' own code: SGLang 0.5.23, vLLM 0.33.0 and 0.20.0 on the CPU
#      (scripts/engines-ci.sh; download sizes in README);
#   8. the L3 page store self-test on a real Mooncake Store (python -m kvlayout.store selftest).
# GPU tests are not run here (CI has no GPU; they print why they skip): scripts/gpu-check.sh
# runs them all with the GPU required.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==== %s\n' "$*"; }

step "cargo test --workspace"
cargo test --workspace

step "pool crate, release, checks opted out (feature unchecked)"
cargo test --release -p kvlayout-pool --features unchecked

step "loom: concurrent page claims"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p kvlayout-pool --lib loom

step "fingerprint: independent Python reference"
python3 layout-core/tests/fingerprint_reference.py

step "page checksum: independent Python reference"
python3 layout-core/tests/checksum_reference.py

step "gpu_bench --hold's nvidia-smi phase slicer"
python3 kernels/scripts/test_smi_phases.py

step "Python package and its tests"
scripts/python-tests.sh

step "prefill/decode handshake over NIXL and Mooncake"
scripts/pd-ci.sh

step "L3 page store on Mooncake Store (kvlayout.store selftest, mooncake_master on 127.0.0.1)"
"${KVLAYOUT_PY_VENV:-target/py-venv}/bin/python" -m kvlayout.store selftest

step "the wheel, installed outside the repository"
scripts/wheel-ci.sh

step "adapters on the engines' own code (SGLang, vLLM; CPU)"
scripts/engines-ci.sh

printf '\nall tests passed\n'
