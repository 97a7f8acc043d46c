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
from .verify import patterns, verify


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
    regions = patterns(geometry, cfg["seed"])
    side = _side(cfg)
    side.register(regions)
    addrs = {name: [a.ctypes.data, a.nbytes] for name, a in regions.items()}
    published = geometry if cfg.get("publish_geometry", True) else None
    # The pages offered are final now: their checksums travel in the same message (the NIXL
    # notification, the Mooncake metadata entry) that says they are ready.
    sums = checksums.page_checksums(geometry, regions, cfg["src_pages"])
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


def _descriptors(
    plan: kvlayout.Plan, src_regions: dict, dst_regions: dict
) -> tuple[np.ndarray, np.ndarray]:
    """NIXL/Mooncake descriptor rows `(address, length_bytes, 0)`: the plan's runs at the two
    sides' region addresses (the peer's as published, ours as allocated)."""
    local, remote = [], []
    for name, runs in plan.runs.items():
        src_region, dst_region = plan.regions[name]
        sbase, dbase = src_regions[src_region][0], dst_regions[dst_region].ctypes.data
        for s_off, d_off, n in runs:
            local.append((dbase + d_off, n, 0))
            remote.append((sbase + s_off, n, 0))
    return np.array(local, dtype=np.uint64).reshape(-1, 3), np.array(
        remote, dtype=np.uint64
    ).reshape(-1, 3)


def decode(cfg: dict) -> dict:
    geometry = kvlayout.Geometry.from_json(cfg["geometry"])
    regions = {r["name"]: np.zeros(r["len_bytes"], dtype=np.uint8) for r in geometry.regions()}
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
            if cfg.get("geometry_check", True):
                verdict = handshake.check_peer(geometry, msg, require=cfg.get("require", False))
            else:
                # The geometry check off (self-test switch): the peer's geometry is ignored and
                # assumed to mirror ours, as an engine without kvlayout assumes; only the
                # content check below can refuse.
                verdict = handshake.Verdict(None, msg, None)
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
    # unchecked peer: the engine assumes it mirrors us
    peer_geometry = geometry if verdict.peer_geometry is None else verdict.peer_geometry
    try:
        handshake.check_regions(msg, peer_geometry)
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
    if not cfg.get("geometry_check", True):
        result["geometry_check"] = False
    build = kvlayout.token_plan if verdict.level == "token" else kvlayout.page_plan
    plan = build(peer_geometry, geometry, cfg["src_pages"], cfg["dst_pages"])
    local, remote = _descriptors(plan, msg["regions"], regions)
    if cfg["engine"] == "nixl":
        # The engine's handle of the peer agent (not `peer`, the peer's geometry, which the
        # verification below regenerates the source pattern from).
        agent = side.connect(base64.b64decode(msg["agent_metadata"]))
        moved = side.read(agent, local, remote)
    else:
        moved = side.read(msg["segment"], local, remote)
    fault = cfg.get("fault")
    if fault:
        checksums.inject(fault, geometry, regions, cfg["dst_pages"])
    # The receiver verifies the pages it wrote against the sender's checksums before any is
    # used (pages moved whole only: a token-level plan cuts pages).
    checked, bad = 0, []  # type: int, list[str]
    if plan.level == "pool" and "checksums" in msg:
        checked, bad = checksums.mismatches(
            geometry, regions, msg["checksums"], cfg["src_pages"], cfg["dst_pages"]
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
    src_regions = patterns(peer_geometry, msg["seed"])
    equal, stray = verify(
        peer_geometry,
        src_regions,
        geometry,
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
