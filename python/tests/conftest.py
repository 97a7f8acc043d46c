"""Shared fixtures: the repository root and a pure-Python reference fingerprint.

`reference_fingerprint` reimplements the documented algorithm (layout-core/src/fingerprint.rs,
module docs) from the geometry file's JSON, so the Rust value is checked against an independent
computation, not against itself.
"""

from __future__ import annotations

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1
DTYPE_CODE = {
    "f32": 1, "f16": 2, "bf16": 3, "f8e4m3": 4, "f8e4m3fnuz": 5, "f8e5m2": 6,
    "f8e5m2fnuz": 7, "ue8m0": 8, "u8": 9, "i8": 10, "f4e2m1": 11,
}
DTYPE_BITS = {
    "f32": 32, "f16": 16, "bf16": 16, "f8e4m3": 8, "f8e4m3fnuz": 8, "f8e5m2": 8,
    "f8e5m2fnuz": 8, "ue8m0": 8, "u8": 8, "i8": 8, "f4e2m1": 4,
}
ARRANGEMENT_CODE = {"token_major": 1, "section_major": 2, "head_major": 3}


def _fnv(h: int, data: bytes) -> int:
    for b in data:
        h ^= b
        h = (h * FNV_PRIME) & MASK
    return h


def _u64(h: int, v: int) -> int:
    return _fnv(h, v.to_bytes(8, "little"))


def _str(h: int, s: str) -> int:
    b = s.encode()
    return _fnv(_u64(h, len(b)), b)


def _prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def reference_fingerprint(doc: dict) -> int:
    """Pool fingerprint of a v1 geometry document (named arrangements, no alignment)."""
    page = doc["page_size_tokens"]
    total = 0
    for b in doc["buffers"]:
        sections = b["sections"]
        index = {s["name"]: i for i, s in enumerate(sections)}
        core = _str(FNV_OFFSET, "kvlayout.layout/v1")
        core = _u64(core, ARRANGEMENT_CODE[b["arrangement"]])
        core = _u64(core, len(sections))
        bits = 0
        for s in sections:
            core = _u64(core, DTYPE_CODE[s["dtype"]])
            core = _u64(core, len(s["shape"]))
            for d in s["shape"]:
                core = _u64(core, d)
            if "scales" in s:
                core = _u64(core, 1)
                core = _u64(core, index[s["scales"]])
                core = _u64(core, s["block_elems"])
            else:
                core = _u64(core, 0)
            bits += _prod(s["shape"]) * DTYPE_BITS[s["dtype"]]
        stride = bits // 8 * page
        h = _str(FNV_OFFSET, "kvlayout.buffer/v1")
        h = _str(h, b["name"])
        h = _u64(h, b["layers"])
        h = _u64(h, stride)
        h = _u64(h, core)
        total = (total + h) & MASK
    h = _str(FNV_OFFSET, "kvlayout.pool/v1")
    h = _u64(h, page)
    h = _u64(h, len(doc["buffers"]))
    return _u64(h, total)


@pytest.fixture
def root() -> pathlib.Path:
    return ROOT


def load_json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())
