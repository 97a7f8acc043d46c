"""`python -m kvlayout.store selftest` on a real Mooncake Store (`mooncake_master` and the store
client from the `mooncake-transfer-engine-non-cuda` wheel, on 127.0.0.1, started by the
self-test), and the object header without a store.

Skipped, saying why, without the wheel; with KVLAYOUT_PD_REQUIRE_ENGINES=1 (scripts/pd-ci.sh) a
missing wheel fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

import kvlayout
from kvlayout import store

WRITER = kvlayout.Geometry.from_file(str(ROOT / store.CASE19_WRITER))
READER = kvlayout.Geometry.from_file(str(ROOT / store.CASE19_READER))


def test_header_is_32_bytes_of_magic_fingerprint_checksum_length():
    payload = bytes(range(256)) * 256  # 65,536 B: one kv page of one layer (case 19)
    obj = store.pack(WRITER, "kv", 1, payload)
    assert len(obj) == 32 + 65_536
    assert obj[:8] == b"kvlstor1"
    assert int.from_bytes(obj[8:16], "little") == WRITER.storage_fingerprint
    assert int.from_bytes(obj[16:24], "little") == kvlayout.page_checksum(WRITER, "kv", 1, payload)
    assert int.from_bytes(obj[24:32], "little") == 65_536
    assert store.unpack(WRITER, "k", "kv", 1, obj).payload == payload
    # Read under layer 0: another seed, a miss.
    assert store.unpack(WRITER, "k", "kv", 0, obj).payload is None
    # Case 19: the same pool fingerprint, another memory layout: refused by the storage fingerprint.
    assert WRITER.fingerprint == READER.fingerprint
    with pytest.raises(store.StoreRefused, match="storage fingerprint"):
        store.unpack(READER, "k", "kv", 1, obj)
    assert store.unpack(WRITER, "k", "kv", 1, b"").reason == "k: absent"


SEED = kvlayout.Geometry.from_file(str(ROOT / store.SEED_DEVICE))


def test_with_the_geometry_check_off_a_short_body_is_caught_by_the_slot_checksum():
    # bf16 index-K: 64 tokens x 256 B = 16,384 B per page; the fp8 formula's buffer holds
    # 64 x 132 = 8,448 B of it.
    page = bytes(range(256)) * 64
    assert len(page) == 16_384
    obj = store.HEADER.pack(store.MAGIC, SEED.storage_fingerprint,
                            kvlayout.page_checksum(SEED, "index_k", 0, page), 8_448) + page[:8_448]
    # Geometry check on: a miss on the length, before a byte is placed.
    slot = bytearray(b"\x07" * 16_384)
    r = store.load_into(SEED, "k", "index_k", 0, obj, slot)
    assert r.payload is None and "body 8448 bytes" in r.reason and "16384" in r.reason
    assert slot == b"\x07" * 16_384
    # Off: 8,448 B land over the slot, the rest keeps its 7s; the checksum refuses the slot.
    r = store.load_into(SEED, "k", "index_k", 0, obj, slot, check_geometry=False)
    assert r.payload is None and "k: checksum mismatch" in r.reason
    assert slot == page[:8_448] + b"\x07" * (16_384 - 8_448)
    # A whole body verifies with the check off too.
    whole = store.pack(SEED, "index_k", 0, page)
    assert store.load_into(SEED, "k", "index_k", 0, whole, bytearray(16_384),
                           check_geometry=False).payload == page
    # A slot the body never reached (stale) or half reached (torn) is a miss.
    for place in (lambda body, slot: None, lambda body, slot: store._place(body[:100], slot)):
        r = store.load_into(SEED, "k", "index_k", 0, whole, bytearray(16_384),
                            check_geometry=False, place=place)
        assert r.payload is None and "checksum mismatch" in r.reason


def test_selftest_on_mooncake_store():
    try:
        import mooncake.store  # noqa: F401
    except (ImportError, OSError) as e:
        if os.environ.get("KVLAYOUT_PD_REQUIRE_ENGINES") == "1":
            pytest.fail(f"mooncake store required (KVLAYOUT_PD_REQUIRE_ENGINES=1): {e}")
        pytest.skip(f"mooncake-transfer-engine-non-cuda (+ libibverbs1) missing: {e}")
    r = subprocess.run([sys.executable, "-m", "kvlayout.store", "selftest"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, check=False)
    results = {json.loads(line)["case"]: json.loads(line) for line in r.stdout.splitlines()}
    assert set(results) == {"round-trip", "other-geometry", "corrupted-body",
                            "seed-index-k-fp8-sized-writer-no-geometry-check",
                            "stale-slot-no-geometry-check",
                            "torn-copy-no-geometry-check"}, r.stderr[-2000:]
    # 2 layers x 4 pages written per case.
    assert (results["round-trip"]["verdict"], results["round-trip"]["pages"]) == ("verified", 8)
    assert (results["other-geometry"]["verdict"], results["other-geometry"]["pages"]) == ("refused", 0)
    bad = results["corrupted-body"]
    assert (bad["verdict"], bad["pages"]) == ("miss", 7)
    assert "/kv/1/3: checksum mismatch" in bad["lines"][0]
    # The geometry check off: every index_k object of the fp8-sized writer (2 layers x 4 pages)
    # is a miss by content; a stale slot and a torn copy each miss the one object hit (layer 1,
    # page 3).
    seed = results["seed-index-k-fp8-sized-writer-no-geometry-check"]
    assert (seed["verdict"], seed["pages"], len(seed["lines"])) == ("miss", 0, 8)
    assert all("/index_k/" in ln and "checksum mismatch" in ln for ln in seed["lines"])
    for case in ("stale-slot-no-geometry-check", "torn-copy-no-geometry-check"):
        got = results[case]
        assert (got["verdict"], got["pages"], len(got["lines"])) == ("miss", 7, 1), got
        assert "/kv/1/3: checksum mismatch" in got["lines"][0], got
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("args,rc,expect", [
    (["selftest", "--case", "round-trip"], 2, "unrecognized arguments: --case round-trip"),
    (["bogus"], 2, "invalid choice: 'bogus'"),
    (["selftest", "--help"], 0, "usage: python -m kvlayout.store selftest"),
])
def test_store_cli_arguments_are_parsed_not_ignored(args, rc, expect):
    # Before, anything after `selftest` (--help, a --case the store self-test does not have)
    # was ignored and the whole self-test ran (exit 0). argparse answers before any
    # mooncake_master starts, so this runs without the Mooncake wheel.
    r = subprocess.run([sys.executable, "-m", "kvlayout.store", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == rc, r.stderr
    assert expect in r.stdout + r.stderr
    assert '"case"' not in r.stdout  # no case ran
