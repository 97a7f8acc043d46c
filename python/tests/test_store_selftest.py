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
    assert set(results) == {"round-trip", "other-geometry", "corrupted-body"}, r.stderr[-2000:]
    # 2 layers x 4 pages written per case.
    assert (results["round-trip"]["verdict"], results["round-trip"]["pages"]) == ("verified", 8)
    assert (results["other-geometry"]["verdict"], results["other-geometry"]["pages"]) == ("refused", 0)
    bad = results["corrupted-body"]
    assert (bad["verdict"], bad["pages"]) == ("miss", 7)
    assert "/kv/1/3: checksum mismatch" in bad["lines"][0]
    assert r.returncode == 0, r.stderr[-2000:]
