"""`python -m kvlayout.pd bench`: pages per second through NIXL (UCX over TCP, DRAM, two
processes on 127.0.0.1) for 64-page transfers of the DeepSeek-V3.2 pool, with and without the
kvlayout check, in the same run (alternating, so drift hits both).

Both modes read the same descriptors: one per (buffer, layer, page) on each side, prepared once
with `prep_xfer_dlist` from each side's geometry (as vLLM's NixlConnector prepares its block
descriptors), a transfer selecting 64 shuffled source pages into 64 shuffled destination pages.
"With the check" adds, before every transfer, the whole handshake check (`check_peer`: the
peer's geometry re-read, its fingerprint recomputed, the pool-level compare) and the page checks
(`kvlayout.TransferGuard.check_pages`: every page in range on both sides, no repeated
destination), each timed on its own. It is an
upper bound: an engine runs `check_peer` once per peer, and only the page checks per transfer.
`check_share_of_transfer` = (median handshake check + median page check) / median transfer
without the check; `median_ratio_with_over_without` and `paired_ratio_median` (median over iterations of
checked / the unchecked transfer just before it) are whole-transfer ratios: they carry the
transfers' own run-to-run spread, given as `without_check_iqr_over_median`.
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import kvlayout

from . import handshake
from .engine_nixl import NixlSide
from .selftest import DSV32, find_repo


def _placements(geometry: kvlayout.Geometry) -> list[tuple[str, dict]]:
    """`(region name, placement)` of every buffer, in buffer order (`Geometry.regions()`)."""
    return [(r["name"], p) for r in geometry.regions() for p in r["buffers"]]


def _table(geometry: kvlayout.Geometry, regions_base: dict[str, int]) -> np.ndarray:
    """Rows `(address, length_bytes, 0)` for every (buffer, layer, page), buffer-major; one page
    of a layer is one piece (`heads == 1`: the bench's pool is not `page_head`)."""
    rows = []
    for region, p in _placements(geometry):
        base = regions_base[region] + p["offset_bytes"]
        for layer in range(p["layers"]):
            for page in range(p["pages"]):
                at = base + layer * p["layer_step_bytes"] + page * p["page_step_bytes"]
                rows.append((at, p["run_bytes"], 0))
    return np.array(rows, dtype=np.uint64)


def _indices(geometry: kvlayout.Geometry, pages: np.ndarray) -> np.ndarray:
    out, base = [], 0
    for _, p in _placements(geometry):
        layer_rows = (np.arange(p["layers"])[:, None] * p["pages"] + pages[None, :]).ravel()
        out.append(base + layer_rows)
        base += p["layers"] * p["pages"]
    return np.concatenate(out).astype(np.int32)


def main(opts) -> int:
    repo = find_repo(Path(opts.repo) if opts.repo else None)
    if repo is None:
        print(f"error: {DSV32} not found; pass --repo", file=sys.stderr)
        return 2
    g = json.loads((repo / DSV32).read_text())
    g["pages"] = opts.pages
    text = json.dumps(g)
    cfg = {
        "engine": "nixl",
        "case": "bench",
        "seed": 7,
        "role": "prefill",
        "addr": "127.0.0.1",
        "port": opts.port,
        "peer_addr": "127.0.0.1",
        "peer_port": opts.port + 1,
        "geometry": text,
        "timeout_s": 60,
        "src_pages": [],
        "dst_pages": [],
    }
    prefill = subprocess.Popen(
        [sys.executable, "-m", "kvlayout.pd", "worker", json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    local = kvlayout.Geometry.from_json(text)
    regions = {r["name"]: np.zeros(r["len_bytes"], dtype=np.uint8) for r in local.regions()}
    side = NixlSide("kvlayout-decode", opts.port + 1)
    side.register(regions)
    msg = handshake.parse_message(side.receive(60))
    handshake.check_peer(local, msg)
    peer = side.connect(base64.b64decode(msg["agent_metadata"]))
    peer_geo = kvlayout.Geometry.from_json(msg["geometry"])
    remote_h = side.agent.prep_xfer_dlist(
        peer, _table(peer_geo, {n: r[0] for n, r in msg["regions"].items()}), "DRAM"
    )
    local_h = side.agent.prep_xfer_dlist(
        "NIXL_INIT_AGENT", _table(local, {n: a.ctypes.data for n, a in regions.items()}), "DRAM"
    )
    guard = kvlayout.TransferGuard(local, peer_geo)
    rng = np.random.default_rng(11)
    n = opts.pages

    def one(checked: bool) -> tuple[float, float, float]:
        src_pages, dst_pages = rng.permutation(n)[:64], rng.permutation(n)[:64]
        t0 = time.perf_counter()
        if checked:
            handshake.check_peer(local, msg)
        th = time.perf_counter()
        if checked:  # host = the peer's pool (source), device = ours (destination)
            guard.check_pages("load", None, src_pages, dst_pages)
        t1 = time.perf_counter()
        h = side.agent.make_prepped_xfer(
            "READ",
            local_h,
            _indices(local, dst_pages),
            remote_h,
            _indices(peer_geo, src_pages),
        )
        state = side.agent.transfer(h)
        while state == "PROC":
            state = side.agent.check_xfer_state(h)
        side.agent.release_xfer_handle(h)
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer state {state}")
        return time.perf_counter() - t0, th - t0, t1 - th

    for _ in range(3):  # warm-up: connection, registration caches
        one(False)
    plain, checked, hs_only, pg_only = [], [], [], []
    for _ in range(opts.iters):
        plain.append(one(False)[0])
        total, hs, pg = one(True)
        checked.append(total)
        hs_only.append(hs)
        pg_only.append(pg)
    page_bytes = local.bytes_per_page
    mp, mc = statistics.median(plain), statistics.median(checked)
    mh, mg = statistics.median(hs_only), statistics.median(pg_only)
    q = statistics.quantiles(plain, n=4)
    out = {
        "bench": "nixl-64-page-transfers",
        "model_pool": DSV32,
        "pool_pages": n,
        "pages_per_transfer": 64,
        "bytes_per_page_all_layers": page_bytes,
        "iters_each": opts.iters,
        "ucx_tls": os.environ.get("UCX_TLS"),
        "median_s_without_check": mp,
        "median_s_with_check": mc,
        "pages_per_s_without_check": 64 / mp,
        "pages_per_s_with_check": 64 / mc,
        "median_handshake_check_s": mh,
        "median_page_check_s": mg,
        "check_share_of_transfer": (mh + mg) / mp,
        "page_check_share_of_transfer": mg / mp,
        "median_ratio_with_over_without": mc / mp,
        "paired_ratio_median": statistics.median(c / p for c, p in zip(checked, plain)),
        "without_check_iqr_over_median": (q[2] - q[0]) / mp,
    }
    print(json.dumps(out), flush=True)
    assert prefill.stdin is not None  # started with stdin=PIPE
    prefill.stdin.write("exit\n")
    prefill.stdin.flush()
    prefill.wait(timeout=30)
    os._exit(0)
