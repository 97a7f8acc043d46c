"""One side of a prefill/decode pair, run in its own process (`python -m kvlayout.pd worker`).

The prefill side fills its regions with a seeded pattern, registers them and publishes the
handshake; it then waits for a line on stdin and leaves with `os._exit` (a process that made a
UCX backend may crash in interpreter teardown). The decode side registers zeroed regions, waits
for the handshake, checks it, and moves and verifies bytes only when the check passes. It prints
one JSON line, the case's result.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import warnings

import numpy as np

import kvlayout

from . import checksums, handshake
from .plan import page_plan, token_plan
from .regions import buffer_layouts
from .verify import pattern, verify


def _layouts(geometry: kvlayout.Geometry):
    return buffer_layouts(json.loads(geometry.to_json()), geometry.buffers)


def _side(cfg: dict):
    if cfg["engine"] == "nixl":
        from .engine_nixl import NixlSide

        return NixlSide(f"kvlayout-{cfg['role']}", cfg["port"])
    from .engine_mooncake import MooncakeSide

    return MooncakeSide(f"{cfg['addr']}:{cfg['port']}", cfg["metadata_url"], cfg["addr"])


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def prefill(cfg: dict) -> None:
    geometry = kvlayout.Geometry.from_json(cfg["geometry"])
    layouts = _layouts(geometry)
    regions = {name: pattern(lay, cfg["seed"], i) for i, (name, lay) in enumerate(layouts.items())}
    side = _side(cfg)
    side.register(regions)
    addrs = {name: [a.ctypes.data, a.nbytes] for name, a in regions.items()}
    published = geometry if cfg.get("publish_geometry", True) else None
    # The pages offered are final now: their checksums travel in the same message (the NIXL
    # notification, the Mooncake metadata entry) that says they are ready.
    sums = checksums.page_checksums(geometry, layouts, regions, cfg["src_pages"])
    if cfg["engine"] == "nixl":
        msg = handshake.make_message(
            side.name,
            published,
            addrs,
            seed=cfg["seed"],
            agent_metadata=base64.b64encode(side.metadata()).decode(),
            checksums=sums,
        )
        side.publish("kvlayout-decode", cfg["peer_addr"], cfg["peer_port"], msg, cfg["timeout_s"])
    else:
        msg = handshake.make_message(
            side.segment, published, addrs, seed=cfg["seed"], segment=side.segment,
            checksums=sums,
        )
        side.publish(msg)
    _emit({"event": "published"})
    sys.stdin.readline()  # the orchestrator says when the decode side is done
    side.close()
    os._exit(0)


def _descriptors(plan, src_regions: dict, dst_regions: dict) -> tuple[np.ndarray, np.ndarray]:
    local, remote = [], []
    for name, runs in plan.runs.items():
        sbase, dbase = src_regions[name][0], dst_regions[name].ctypes.data
        for s_off, d_off, n in runs:
            local.append((dbase + d_off, n, 0))
            remote.append((sbase + s_off, n, 0))
    return np.array(local, dtype=np.uint64).reshape(-1, 3), np.array(
        remote, dtype=np.uint64
    ).reshape(-1, 3)


def decode(cfg: dict) -> dict:
    geometry = kvlayout.Geometry.from_json(cfg["geometry"])
    layouts = _layouts(geometry)
    regions = {name: np.zeros(lay.region_bytes, dtype=np.uint8) for name, lay in layouts.items()}
    side = _side(cfg)
    side.register(regions)
    result = {"case": cfg["case"], "engine": cfg["engine"]}
    if cfg["engine"] == "nixl":
        raw = side.receive(cfg["timeout_s"])
    else:
        raw = side.receive(f"{cfg['peer_addr']}:{cfg['peer_port']}", cfg["timeout_s"])
    try:
        msg = handshake.parse_message(raw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            verdict = handshake.check_peer(geometry, msg, require=cfg.get("require", False))
    except handshake.PeerRefused as e:
        stray = sum(int(np.count_nonzero(a)) for a in regions.values())
        side.close()
        return {
            **result,
            "verdict": "refused",
            "bytes_moved": 0,
            "bytes_verified_equal": 0,
            "lines": e.lines,
            "level": e.level,
            "stray_bytes": stray,
        }
    if verdict.peer_geometry is None:  # unchecked peer: the engine assumes it mirrors us
        peer_layouts = layouts
    else:
        peer_layouts = _layouts(verdict.peer_geometry)
    try:
        handshake.check_regions(msg, peer_layouts)
    except handshake.PeerRefused as e:
        side.close()
        return {
            **result,
            "verdict": "refused",
            "bytes_moved": 0,
            "bytes_verified_equal": 0,
            "lines": e.lines,
            "level": e.level,
            "stray_bytes": 0,
        }
    build = token_plan if verdict.level == "token" else page_plan
    plan = build(peer_layouts, layouts, cfg["src_pages"], cfg["dst_pages"])
    local, remote = _descriptors(plan, msg["regions"], regions)
    if cfg["engine"] == "nixl":
        peer = side.connect(base64.b64decode(msg["agent_metadata"]))
        moved = side.read(peer, local, remote)
    else:
        moved = side.read(msg["segment"], local, remote)
    fault = cfg.get("fault")
    if fault:
        _inject(fault, layouts, regions, cfg["dst_pages"])
    # The receiver verifies the pages it wrote against the sender's checksums before any is
    # used (pages moved whole only: a token-level plan cuts pages).
    checked, bad = 0, []  # type: int, list[str]
    if plan.level == "pool" and "checksums" in msg:
        checked, bad = checksums.mismatches(
            geometry, layouts, regions, msg["checksums"], cfg["src_pages"], cfg["dst_pages"]
        )
    if bad:
        side.close()
        return {
            **result,
            "verdict": "refused",
            "bytes_moved": moved,
            "bytes_verified_equal": 0,
            "lines": bad,
            "level": "checksum",
            "checksummed_pages": checked,
            "checksum_mismatches": len(bad),
            "stray_bytes": 0,
        }
    src_regions = {
        n: pattern(lay, msg["seed"], i) for i, (n, lay) in enumerate(peer_layouts.items())
    }
    equal, stray = verify(
        peer_layouts,
        src_regions,
        layouts,
        regions,
        cfg["src_pages"],
        cfg["dst_pages"],
        whole_pages=plan.level == "pool",
    )
    side.close()
    return {
        **result,
        "verdict": "moved",
        "bytes_moved": moved,
        "bytes_verified_equal": equal,
        "lines": [
            str(w.message) for w in caught if issubclass(w.category, handshake.UncheckedPeerWarning)
        ],
        "level": verdict.level,
        "runs": plan.run_count,
        "stray_bytes": stray,
        "checksummed_pages": checked,
        "checksum_mismatches": 0,
        "head_ranges": {k: list(v) for k, v in plan.head_ranges.items()},
    }


def _inject(fault: str, layouts: dict, regions: dict, dst_pages: list[int]) -> None:
    """A content-only fault on the first buffer's layer 0 after the transfer:
    `stale-destination` puts back what the first destination page held before (zeros: its
    bytes never arrived, a reused slot); `corrupted-in-flight` inverts one byte in the middle of
    the last destination page (a wire or DMA error the engine did not report)."""
    name, lay = next(iter(layouts.items()))
    payload = lay.page_size_tokens * lay.bytes_per_token
    if fault == "stale-destination":
        start = lay.page_offset_bytes(0, dst_pages[0])
        regions[name][start:start + payload] = 0
    elif fault == "corrupted-in-flight":
        at = lay.page_offset_bytes(0, dst_pages[-1]) + payload // 2
        regions[name][at] ^= 0xFF
    else:
        raise ValueError(f"fault {fault!r}: expected stale-destination or corrupted-in-flight")


def main(cfg: dict) -> None:
    if cfg["role"] == "prefill":
        prefill(cfg)
    try:
        out = decode(cfg)
    except Exception as e:  # noqa: BLE001 -- any failure is the case's result line
        out = {
            "case": cfg["case"],
            "engine": cfg["engine"],
            "verdict": "error",
            "bytes_moved": 0,
            "bytes_verified_equal": 0,
            "lines": [f"{type(e).__name__}: {e}"],
        }
    _emit(out)
    os._exit(0)
