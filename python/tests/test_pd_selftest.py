"""The prefill/decode self-test on the real engines: two processes per case on 127.0.0.1.

Skipped, saying which wheel is missing, when `nixl-cu12` or `mooncake-transfer-engine-non-cuda`
is not importable; with KVLAYOUT_PD_REQUIRE_ENGINES=1 (scripts/pd-ci.sh) a missing engine fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from kvlayout.pd.selftest import env_ready

PAGES_MOVED = 4
# DeepSeek-V3.2: 61 layers x 64 tokens x (656 B MLA record + 132 B fp8 index-K)
DSV32_BYTES = PAGES_MOVED * 61 * 64 * ((512 + 4 * 4 + 64 * 2) + (128 + 4))
# TP1 -> TP2: mla 20 layers x 16 tokens x 576 bf16 whole; fa 4 layers x 16 tokens x (k, v) x 4 of 8 heads x 128 bf16
TP_BYTES = PAGES_MOVED * (20 * 16 * 576 * 2 + 4 * 16 * 2 * 4 * 128 * 2)
# Qwen3.5 TP 2 -> TP 4 (2 KV heads, one per rank): 10 layers x 64 tokens x (K + V) x 1 head x
# 256 bf16
QWEN35_BYTES = PAGES_MOVED * 10 * 64 * 2 * 256 * 2
# GDN conv state TP 2 -> TP 4: 4 slots x 30 layers x (512 + 512 + 1,024 channels) x 3 bf16
GDN_BYTES = PAGES_MOVED * 30 * (512 + 512 + 1024) * 3 * 2

EXPECTED = {
    "compatible": ("moved", DSV32_BYTES),
    "seed-index-k-bf16-vs-fp8-host": ("refused", 0),
    "same-length-other-arrangement": ("refused", 0),
    "hetero-tp-1-to-2": ("moved", TP_BYTES),
    "hetero-tp-1-to-2-rank-1": ("moved", TP_BYTES),
    "no-geometry-require": ("refused", 0),
    "no-geometry-warn": ("moved", DSV32_BYTES),
    # 4 source pages x 32 tokens x 61 layers x 656 B (MLA record only)
    "page-ratio-32-to-64": ("moved", 4 * 32 * 61 * (512 + 4 * 4 + 64 * 2)),
    "page-ratio-section-major-index-k": ("refused", 0),
    "replicated-heads-tp-2-to-4": ("moved", QWEN35_BYTES),
    "replicated-heads-tp-2-to-4-rank-1": ("moved", QWEN35_BYTES),
    "replicated-heads-rank-mod-heads": ("refused", 0),
    "gdn-conv-split-groups-tp-2-to-4": ("moved", GDN_BYTES),
    "gdn-conv-split-groups-tp-2-to-4-rank-3": ("moved", GDN_BYTES),
}
# Refused by content after the move (the sender's checksums travel with its notification):
# every byte moved, one page payload of kv layer 0 named.
CONTENT_REFUSED = {
    # the first destination page (0) never received its bytes
    "stale-destination": "source page 1 -> destination page 0",
    # one byte of the last destination page (7) flipped
    "corrupted-in-flight": "source page 6 -> destination page 7",
    # the geometry check off: only the content check stands (a reused slot's old bytes; a copy
    # that stopped half way)
    "stale-slot-no-geometry-check": "source page 1 -> destination page 0",
    "torn-copy-no-geometry-check": "source page 6 -> destination page 7",
}
# The seed bug with the geometry check off: the receiver's index-K buffer sized by the fp8
# formula (128 fp8 values + 1 f32 scale = 132 B/token, shared case 00 b.json) assumes the bf16
# sender (256 B/token) mirrors it: 4 pages x 61 layers x 64 tokens x (656 + 132) B move, and
# every index_k payload (4 x 61) mismatches; kv's 4 x 61 verify.
SEED_NO_CHECK = "seed-index-k-fp8-sized-receiver-no-geometry-check"
SEED_NO_CHECK_BYTES = 4 * 61 * 64 * ((512 + 4 * 4 + 64 * 2) + (128 + 4))


def _need(engine: str) -> None:
    why = env_ready(engine)
    if why is None:
        return
    if os.environ.get("KVLAYOUT_PD_REQUIRE_ENGINES") == "1":
        pytest.fail(f"{engine} engine required (KVLAYOUT_PD_REQUIRE_ENGINES=1) but {why}")
    wheel = "nixl-cu12" if engine == "nixl" else "mooncake-transfer-engine-non-cuda (+ libibverbs1)"
    pytest.skip(f"{engine}: wheel {wheel} missing: {why}")


@pytest.mark.parametrize("engine", ["nixl", "mooncake"])
def test_selftest_cases(engine):
    _need(engine)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvlayout.pd",
            "selftest",
            "--engine",
            engine,
            "--repo",
            str(ROOT),
            "--base-port",
            "17500" if engine == "nixl" else "17600",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = {}
    for line in r.stdout.splitlines():
        obj = json.loads(line)
        results[obj["case"]] = obj
    assert set(results) == set(EXPECTED) | set(CONTENT_REFUSED) | {SEED_NO_CHECK}, r.stderr[-2000:]
    # A case whose decode side gave no result (a crash, a timeout, a port taken by another run
    # on this machine) fails here naming itself, not later on a missing field.
    errors = {c: got["lines"] for c, got in results.items() if got["verdict"] == "error"}
    assert not errors, (errors, r.stderr[-2000:])
    seed = results[SEED_NO_CHECK]
    assert (seed["verdict"], seed["level"], seed["bytes_moved"], seed["geometry_check"]) == (
        "refused", "checksum", SEED_NO_CHECK_BYTES, False), seed
    assert (seed["checksummed_pages"], seed["checksum_mismatches"]) == (4 * 61 * 2, 4 * 61), seed
    assert len(seed["lines"]) == 4 * 61
    assert all(ln.startswith("checksum mismatch: index_k layer ") for ln in seed["lines"]), seed
    assert "index_k layer 60, source page 6 -> destination page 7" in seed["lines"][-1]
    assert seed["ok"] is True
    for case, names in CONTENT_REFUSED.items():
        got = results[case]
        assert (got["verdict"], got["bytes_moved"], got["level"]) == (
            "refused", DSV32_BYTES, "checksum"), (case, got)
        # 4 pages x 61 layers x 2 buffers checked, one mismatching.
        assert (got["checksummed_pages"], got["checksum_mismatches"]) == (4 * 61 * 2, 1), got
        assert len(got["lines"]) == 1 and "kv layer 0, " + names in got["lines"][0], got
        assert got.get("geometry_check", True) is not case.endswith("-no-geometry-check"), got
        assert got["ok"] is True
    # Moved whole pages verify by content too: 4 pages x 61 layers x 2 buffers.
    assert (results["compatible"]["checksummed_pages"],
            results["compatible"]["checksum_mismatches"]) == (4 * 61 * 2, 0)
    for case, (verdict, moved) in EXPECTED.items():
        got = results[case]
        assert got["engine"] == engine
        assert (got["verdict"], got["bytes_moved"]) == (verdict, moved), (case, got)
        assert got["bytes_verified_equal"] == moved, (case, got)
        assert got["stray_bytes"] == 0, (case, got)
        assert got["ok"] is True
    assert results["seed-index-k-bf16-vs-fp8-host"]["lines"]
    assert any("arrangement" in ln for ln in results["same-length-other-arrangement"]["lines"])
    assert results["hetero-tp-1-to-2"]["level"] == "token"
    assert results["hetero-tp-1-to-2-rank-1"]["head_ranges"] == {"fa": [4, 8]}
    assert results["page-ratio-32-to-64"]["level"] == "token"
    assert results["no-geometry-warn"]["level"] is None
    assert any("sent no kvlayout geometry" in ln for ln in results["no-geometry-warn"]["lines"])
    assert any(
        "index_k.page_size_tokens" in ln
        for ln in results["page-ratio-section-major-index-k"]["lines"]
    )
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("args,expect", [
    (["--timeout-s", "0"], "argument --timeout-s: 0: must be a positive number of seconds"),
    (["--timeout-s", "-1"], "argument --timeout-s: -1: must be a positive number of seconds"),
    (["--timeout-s", "nan"], "argument --timeout-s: nan: must be a positive number of seconds"),
    # compatible alone uses ports base..base + 2: 65534..65536 is past 65535.
    (["--case", "compatible", "--base-port", "65534"],
     "--base-port 65534: the 1 case(s) use ports 65534..65536; pass 1..65533"),
    (["--case", "compatible", "--base-port", "0"],
     "--base-port 0: the 1 case(s) use ports 0..2; pass 1..65533"),
])
def test_selftest_options_out_of_range_are_refused_naming_them(args, expect):
    # Before, --timeout-s 0 timed every case out and --base-port 70000 reached NIXL as a
    # TypeError: exit 1, as if the cases had failed. Refused before any engine is imported.
    r = subprocess.run([sys.executable, "-m", "kvlayout.pd", "selftest", "--engine", "nixl",
                        "--repo", str(ROOT), *args], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert expect in r.stderr
    assert r.stdout == ""
