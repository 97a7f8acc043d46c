"""An L3 page store on Mooncake Store whose objects are bound to the layout and checked by content.

Each stored object is one page payload of one layer of one buffer (the bytes the geometry lays,
padding excluded), behind a 32-byte header (schema ``kvlayout.store/v1``), all integers
little-endian:

- bytes 0..8: the magic ``b"kvlstor1"`` (the schema);
- bytes 8..16: the writer's storage fingerprint (``Geometry.storage_fingerprint``: the pool
  fingerprint and the memory layout, so a cross-layer-packed object is never read per layer);
- bytes 16..24: the page checksum (``kvlayout.page_checksum``, ``kvlayout.checksum/v1``: seeded
  with the buffer's token fingerprint and the model layer id);
- bytes 24..32: the payload length in bytes; then the payload.

A reader with another storage fingerprint refuses the object (``StoreRefused``, naming both
fingerprints: the vLLM #49440 collision, shared case 19); a body whose checksum differs, or whose
length is not the reader's page payload, is a miss naming the key (the caller recomputes the
page); an absent key is a miss.

A reader places an object's body into its page slot and verifies the slot (``load_into``), so a
fault between the store and the slot (a stale slot, a torn copy) is caught too. With
``check_geometry=False`` (an engine without kvlayout) the storage fingerprint and the body length
are not compared: the body's bytes are copied over the slot as they come, and only the checksum
of the slot can refuse them.

``python -m kvlayout.store selftest``: starts ``mooncake_master`` (from the Mooncake wheel) on
127.0.0.1, a store client in this process, and prints one JSON line per case
(``{"case", "verdict", "pages", "lines"}``): ``round-trip`` (stored, read back, verified),
``other-geometry`` (refused, 0 pages used) and ``corrupted-body`` (a miss naming the key); and,
with the reader's geometry check off (cases named ``...-no-geometry-check``), each fault caught by
content alone, a miss naming every key: the seed bug
(``seed-index-k-fp8-sized-writer-no-geometry-check``: the writer's index-K buffer sized by the
fp8 formula, 132 B/token, stores 64 x 132 = 8,448 of each bf16 page's 16,384 B), a stale slot
(``stale-slot-no-geometry-check``: the body never reaches the reader's slot, which keeps another
page's bytes) and a torn copy (``torn-copy-no-geometry-check``: half the body reaches it). Exit 0
iff every verdict is the expected one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import kvlayout

MAGIC = b"kvlstor1"
HEADER = struct.Struct("<8sQQQ")


class StoreRefused(kvlayout.KvLayoutError):
    """An object written under another storage layout; nothing of it may be used."""

    def __init__(self, key: str, lines: list[str]) -> None:
        super().__init__(f"{key}: " + "; ".join(lines))
        self.key = key
        self.lines = lines


@dataclass
class Read:
    """What a read gave: the payload, or `None` (a miss) and why."""

    key: str
    payload: Optional[bytes]
    reason: str = ""


def pack(geometry: kvlayout.Geometry, buffer: str, layer: int, payload: bytes) -> bytes:
    """The stored object of one page payload: header, then the payload."""
    checksum = kvlayout.page_checksum(geometry, buffer, layer, payload)
    return HEADER.pack(MAGIC, geometry.storage_fingerprint, checksum, len(payload)) + payload


def unpack(geometry: kvlayout.Geometry, key: str, buffer: str, layer: int, obj: bytes) -> Read:
    """Checks one stored object for `geometry` (`load_into` a fresh slot of the reader's page
    payload, the geometry check on): raises `StoreRefused` on another schema or storage
    fingerprint; a short, mis-sized or mismatching body is a miss naming the key."""
    slot_bytes = next((b["bytes_per_page"] for b in geometry.buffers if b["name"] == buffer), 0)
    return load_into(geometry, key, buffer, layer, obj, bytearray(slot_bytes))


def _place(body: bytes, slot: bytearray) -> None:
    n = min(len(body), len(slot))
    slot[:n] = body[:n]


def load_into(geometry: kvlayout.Geometry, key: str, buffer: str, layer: int, obj: bytes,
              slot: bytearray, check_geometry: bool = True,
              place: Callable[[bytes, bytearray], None] = _place) -> Read:
    """Reads one stored object into `slot` (the reader's page payload of `buffer`, `layer`:
    its `bytes_per_page`) and verifies the slot against the header's checksum, under
    `geometry`. Raises `StoreRefused` on another schema, and (with `check_geometry`) on another
    storage fingerprint; with `check_geometry` a body whose length is not the header's or the
    slot's is a miss before any byte is placed. `place(body, slot)` copies the body in (default:
    its first `min(len(body), len(slot))` bytes; the rest of the slot keeps what it held). A
    slot whose checksum differs is a miss naming the key (the caller recomputes the page)."""
    if not obj:
        return Read(key, None, f"{key}: absent")
    if len(obj) < HEADER.size:
        return Read(key, None, f"{key}: {len(obj)} bytes, shorter than the {HEADER.size}-byte header")
    magic, fingerprint, checksum, length = HEADER.unpack_from(obj)
    if magic != MAGIC:
        raise StoreRefused(key, [f"schema: {magic!r}, expected {MAGIC!r} (kvlayout.store/v1)"])
    body = obj[HEADER.size:]
    if check_geometry:
        mine = geometry.storage_fingerprint
        if fingerprint != mine:
            raise StoreRefused(key, [f"storage fingerprint: object {fingerprint:#018x}, reader "
                                     f"{mine:#018x} (another layout or memory layout wrote it)"])
        if len(body) != length or length != len(slot):
            return Read(key, None, f"{key}: body {len(body)} bytes, header says {length}, the "
                                   f"reader's page payload is {len(slot)}")
    place(body, slot)
    try:
        found = kvlayout.page_checksum(geometry, buffer, layer, slot)
    except ValueError as e:
        return Read(key, None, f"{key}: {e}")
    if found != checksum:
        return Read(key, None, f"{key}: checksum mismatch: {checksum:#018x} stored, "
                               f"{found:#018x} read (the page is not the one stored: a miss, "
                               "recompute it)")
    return Read(key, bytes(slot))


def key_of(prefix: str, buffer: str, layer: int, page: int) -> str:
    return f"{prefix}/{buffer}/{layer}/{page}"


# ---- self-test ----

CASE19_WRITER = "cli/tests/shared-cases/19-storage-cross-layer-vs-per-layer/a.json"
CASE19_READER = "cli/tests/shared-cases/19-storage-cross-layer-vs-per-layer/b.json"
SEED_DEVICE = "cli/tests/shared-cases/00-dsa-index-k-bf16-vs-fp8-host/a.json"  # bf16 index-K
# The fp8 formula's index-K bytes per token (128 fp8 values + 1 f32 scale: shared case 00 b.json).
FP8_FORMULA_BYTES_PER_TOKEN = 128 + 4
PAGES = [0, 3, 5, 6]
LAYERS = [0, 1]


@dataclass
class Case:
    name: str
    writer: str
    reader: str
    expect: str  # "verified" | "refused" | "miss"
    corrupt: bool = False
    lines: list = field(default_factory=list)
    buffer: Optional[str] = None  # default: the writer's first buffer
    # False: the reader compares no storage fingerprint and no length (only the checksum).
    check_geometry: bool = True
    # A content fault: "fp8-sized-writer" (every object), "stale-slot" / "torn-copy" (one).
    fault: Optional[str] = None


CASES = [
    Case("round-trip", CASE19_WRITER, CASE19_WRITER, "verified"),
    Case("other-geometry", CASE19_WRITER, CASE19_READER, "refused"),
    Case("corrupted-body", CASE19_WRITER, CASE19_WRITER, "miss", corrupt=True),
    Case("seed-index-k-fp8-sized-writer-no-geometry-check", SEED_DEVICE, SEED_DEVICE, "miss",
         buffer="index_k", check_geometry=False, fault="fp8-sized-writer"),
    Case("stale-slot-no-geometry-check", CASE19_WRITER, CASE19_WRITER, "miss",
         check_geometry=False, fault="stale-slot"),
    Case("torn-copy-no-geometry-check", CASE19_WRITER, CASE19_WRITER, "miss",
         check_geometry=False, fault="torn-copy"),
]

# The object (layer, page) a one-object fault hits: the last layer's second page.
FAULTY = (LAYERS[-1], PAGES[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _master_binary() -> Optional[str]:
    here = Path(sys.executable).parent / "mooncake_master"
    if here.is_file():
        return str(here)
    try:
        import mooncake

        packaged = Path(mooncake.__file__).parent / "mooncake_master"
        if packaged.is_file():
            return str(packaged)
    except ImportError:
        pass
    return shutil.which("mooncake_master")


def _payload(geometry: kvlayout.Geometry, buffer: str, layer: int, page: int) -> bytes:
    """A seeded page payload of `buffer` (its `bytes_per_page`: one layer, no padding)."""
    import numpy as np

    n = next(b["bytes_per_page"] for b in geometry.buffers if b["name"] == buffer)
    rng = np.random.default_rng([layer, page, 23])
    return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()


def _faulty(case: Case, layer: int, page: int) -> bool:
    return case.fault == "fp8-sized-writer" or (layer, page) == FAULTY


def _object(case: Case, writer: kvlayout.Geometry, buffer: str, layer: int, page: int) -> bytes:
    payload = _payload(writer, buffer, layer, page)
    if case.fault == "fp8-sized-writer":
        # The checksum is the bf16 page's (taken on the device); the writer's buffer, sized by
        # the fp8 formula, holds and stores only its first 64 x 132 B.
        kept = writer.page_size_tokens * FP8_FORMULA_BYTES_PER_TOKEN
        checksum = kvlayout.page_checksum(writer, buffer, layer, payload)
        return HEADER.pack(MAGIC, writer.storage_fingerprint, checksum, kept) + payload[:kept]
    obj = bytearray(pack(writer, buffer, layer, payload))
    if case.corrupt and (layer, page) == FAULTY:
        obj[HEADER.size + len(obj[HEADER.size:]) // 2] ^= 0xFF  # the body, not the header
    return bytes(obj)


def _placer(case: Case, layer: int, page: int) -> Callable[[bytes, bytearray], None]:
    if case.fault == "stale-slot" and (layer, page) == FAULTY:
        return lambda body, slot: None  # the body never lands: the slot keeps its bytes
    if case.fault == "torn-copy" and (layer, page) == FAULTY:
        return lambda body, slot: _place(body[:len(body) // 2], slot)
    return _place


def run_case(store: Any, repo: Path, case: Case, index: int) -> dict:
    writer = kvlayout.Geometry.from_file(str(repo / case.writer))
    reader = kvlayout.Geometry.from_file(str(repo / case.reader))
    buffer = case.buffer or writer.buffers[0]["name"]
    prefix = f"kvlayout-selftest-{os.getpid()}-{index}"
    for layer in LAYERS:
        for page in PAGES:
            key = key_of(prefix, buffer, layer, page)
            if store.put(key, _object(case, writer, buffer, layer, page)) != 0:
                return {"case": case.name, "verdict": "error", "pages": 0,
                        "lines": [f"put {key} failed"]}
    slot_bytes = next(b["bytes_per_page"] for b in reader.buffers if b["name"] == buffer)
    used, lines, verdict = 0, [], "verified"
    for layer in LAYERS:
        for page in PAGES:
            key = key_of(prefix, buffer, layer, page)
            # The reader's slot holds what an earlier request left there: another page's bytes.
            slot = bytearray(_payload(reader, buffer, layer, page + 1000))
            assert len(slot) == slot_bytes
            try:
                r = load_into(reader, key, buffer, layer, store.get(key), slot,
                              check_geometry=case.check_geometry,
                              place=_placer(case, layer, page))
            except StoreRefused as e:
                return {"case": case.name, "verdict": "refused", "pages": 0, "lines": e.lines}
            if r.payload is None:
                verdict = "miss"
                lines.append(r.reason)
            elif r.payload != _payload(writer, buffer, layer, page):
                verdict = "error"
                lines.append(f"{key}: verified but differs from what was written")
            else:
                used += 1
    return {"case": case.name, "verdict": verdict, "pages": used, "lines": lines}


def judge(case: Case, result: dict) -> bool:
    written = len(LAYERS) * len(PAGES)
    faulty = sum(_faulty(case, layer, page) for layer in LAYERS for page in PAGES)
    expected_pages = {"verified": written, "refused": 0, "miss": written - faulty}[case.expect]
    ok = result["verdict"] == case.expect and result["pages"] == expected_pages
    if case.expect == "miss":
        ok = ok and len(result["lines"]) == faulty and all(
            "checksum mismatch" in ln for ln in result["lines"])
    if case.expect == "refused":
        ok = ok and any("storage fingerprint" in ln for ln in result["lines"])
    return ok


def find_repo() -> Optional[Path]:
    for base in [Path.cwd(), Path(__file__).resolve()]:
        for d in [base, *base.parents]:
            if (d / CASE19_WRITER).is_file():
                return d
    return None


def selftest(repo: Optional[Path] = None) -> int:
    repo = repo or find_repo()
    if repo is None:
        print(f"error: repository files not found ({CASE19_WRITER}); run from the repository",
              file=sys.stderr)
        return 2
    master = _master_binary()
    if master is None:
        print("error: mooncake_master not found (pip install mooncake-transfer-engine-non-cuda)",
              file=sys.stderr)
        return 2
    from mooncake.store import MooncakeDistributedStore

    port, metrics = _free_port(), _free_port()
    log = open(os.devnull, "wb")
    proc = subprocess.Popen([master, f"--rpc_port={port}", f"--port={port}",
                             f"--metrics_port={metrics}", "--rpc_address=127.0.0.1",
                             "--metrics_host=127.0.0.1"], stdout=log, stderr=log)
    ok_all = True
    try:
        store = MooncakeDistributedStore()
        deadline = time.monotonic() + 30
        while True:
            rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "",
                             f"127.0.0.1:{port}")
            if rc == 0:
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                print(f"error: the store client did not connect to mooncake_master on "
                      f"127.0.0.1:{port} (setup returned {rc})", file=sys.stderr)
                return 1
            time.sleep(0.5)
        for i, case in enumerate(CASES):
            result = run_case(store, repo, case, i)
            result["expected"] = case.expect
            result["ok"] = judge(case, result)
            ok_all &= result["ok"]
            print(json.dumps(result), flush=True)
        store.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 0 if ok_all else 1


def main(argv: list[str]) -> int:
    """``python -m kvlayout.store selftest``; any other argument (``--help`` too) is handled by
    argparse (help: exit 0, an unknown one: exit 2 naming it). Before, everything after
    ``selftest`` was ignored and the self-test ran."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kvlayout.store")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("selftest", help="the page-store cases on a local mooncake_master; JSON lines")
    ap.parse_args(argv)
    return selftest()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
