"""Tests on the engines' own code (scripts/engines-ci.sh builds their environment).

Under ``KVLAYOUT_ENGINES_REQUIRED=1`` (set by scripts/engines-ci.sh) a skipped test is reported as
a failure: nothing in that run passes by not running. Where an engine itself cannot build
something on the CPU, the test asserts SGLang's or vLLM's own refusal instead (a documented
refusal, with the reason), never a skip.
"""

from __future__ import annotations

import os

import pytest

REQUIRED = os.environ.get("KVLAYOUT_ENGINES_REQUIRED") == "1"
# vLLM picks its CPU platform (0.33; 0.20 takes DeviceConfig(device="cpu")) before any import.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRED and report.skipped:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: skipped under KVLAYOUT_ENGINES_REQUIRED=1, which "
                           f"allows no skips: {report.longrepr}")


def row_bytes(t) -> int:
    """Bytes from one token slot (dim 0) to the next, from the tensor's own strides."""
    return t.stride(0) * t.element_size()


def nbytes(t) -> int:
    return t.numel() * t.element_size()


@pytest.fixture(scope="session")
def vllm_tp_group(tmp_path_factory):
    """A model directory shared by every vLLM instance of the session (the model path is in
    vLLM's NIXL compatibility hash), and vLLM's tensor-parallel group of one rank."""
    from vllm.distributed import destroy_distributed_environment, destroy_model_parallel
    from vllm_build import init_tp_group

    model_dir = tmp_path_factory.mktemp("vllm-model")
    init_tp_group(model_dir)
    yield model_dir
    destroy_model_parallel()
    destroy_distributed_environment()
