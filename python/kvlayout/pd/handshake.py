"""The prefill/decode geometry handshake: what a rank publishes, and the check its peer runs.

A rank publishes one JSON message (`kvlayout.pd.handshake/v1`) through the transfer engine's
own channel (a NIXL notification, a key beside the segment descriptor in Mooncake's metadata
store):

```json
{"schema": "kvlayout.pd.handshake/v1", "agent": "...",
 "geometry": "<the rank's geometry file text>", "fingerprints": {"pool": 123},
 "regions": {"kv": [address, length_bytes], "index_k": [...]}, ...engine fields}
```

`regions` has one entry per region of the rank's pool (`Geometry.regions()`: one per buffer,
named after it, or one named `pool` for the whole pool under `page_first_direct`).

The receiving side calls `check_peer` before it registers the peer with the engine or creates any
transfer. It re-reads the peer's geometry, checks the fingerprint it was sent against the one it
computes, picks the compare level (`pool` when every buffer has the same page size and
tensor-parallel split on both sides, `token` otherwise) and raises `PeerRefused` with the diff
lines when the two pools cannot exchange pages. A peer that sends no geometry is a warning, or a
refusal with `require=True`.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Literal

import kvlayout

SCHEMA = "kvlayout.pd.handshake/v1"


class PeerRefused(kvlayout.Incompatible):
    """The peer's pool cannot exchange pages with ours; nothing was registered or moved.

    `.lines`: the diff lines (`buffer.field: peer value, local value`); `.level`: the compare
    level that refused (`pool`, `token`, or `handshake` for a message that could not be read).
    """

    def __init__(self, lines, level: str, header: str | None = None) -> None:
        super().__init__(lines, header)
        self.level = level


class UncheckedPeerWarning(UserWarning):
    """A peer published no geometry; its pages are moved unchecked."""


@dataclass(frozen=True)
class Verdict:
    level: str | None  # None: the peer sent no geometry and require was False
    peer: dict  # the whole message
    peer_geometry: kvlayout.Geometry | None


def fingerprints(geometry: kvlayout.Geometry) -> dict:
    """The fingerprints a rank publishes beside its geometry."""
    return {"pool": geometry.fingerprint}


def make_message(
    agent: str, geometry: kvlayout.Geometry | None, regions: dict, **engine_fields
) -> bytes:
    """The handshake message, UTF-8 JSON. `geometry=None` publishes none (an unchecked peer)."""
    msg = {"schema": SCHEMA, "agent": agent, "regions": regions, **engine_fields}
    if geometry is not None:
        msg["geometry"] = geometry.to_json()
        msg["fingerprints"] = fingerprints(geometry)
    return json.dumps(msg).encode()


def _refuse(line: str) -> PeerRefused:
    return PeerRefused([line], "handshake")


def parse_message(raw: bytes) -> dict:
    """The peer's message as a dict; `PeerRefused` (level `handshake`) naming what is wrong
    when it is not JSON, too deeply nested, not an object or of another schema."""
    try:
        msg = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, ValueError) as e:
        raise _refuse(f"handshake: not JSON ({e})") from None
    except RecursionError:
        raise _refuse("handshake: JSON nested too deeply") from None
    if not isinstance(msg, dict) or msg.get("schema") != SCHEMA:
        got = msg.get("schema") if isinstance(msg, dict) else type(msg).__name__
        raise PeerRefused([f"handshake.schema: {got!r}, expected {SCHEMA!r}"], "handshake")
    return msg


def choose_level(peer_json: str, local_json: str) -> Literal["pool", "token"]:
    """`token` when a buffer present on both sides has another page size or another
    tensor-parallel split (tp_size, or rank of a heads-split buffer); `pool` otherwise."""
    peer, local = json.loads(peer_json), json.loads(local_json)
    local_buffers = {b["name"]: b for b in local["buffers"]}
    for a in peer["buffers"]:
        b = local_buffers.get(a["name"])
        if b is None:
            continue
        if a.get("page_size_tokens", peer["page_size_tokens"]) != b.get(
            "page_size_tokens", local["page_size_tokens"]
        ):
            return "token"
        sa, sb = a.get("shard") or {}, b.get("shard") or {}
        if sa.get("tp_size", 1) != sb.get("tp_size", 1):
            return "token"
        if sa.get("split") == "heads" and sa.get("rank") != sb.get("rank"):
            return "token"
    return "pool"


def disjoint_heads(peer_json: str, local_json: str) -> list[str]:
    """Lines for each heads-split buffer whose two ranks hold no head in common at the same
    `tp_size`: rank r of one side pairs with rank r of the other, and any other pairing would
    move no byte of that buffer (a wiring error, refused). Ranks that are replicas of one head
    (fewer KV heads than ranks: TP 4 ranks 2 and 3 of 2 heads both hold head 1) share it. At
    different `tp_size` a rank may rightly share no heads with one of its peers; that is left to
    the plan (and with replicated heads the `token` level names the heads each side holds). The
    heads each rank holds are the core's (`Geometry.buffers`' `heads_held`)."""
    peer = {b["name"]: b for b in kvlayout.Geometry.from_json(peer_json).buffers}
    local = {b["name"]: b for b in kvlayout.Geometry.from_json(local_json).buffers}
    lines = []
    for name, a in peer.items():
        b = local.get(name)
        if b is None:
            continue
        sa, sb = a.get("shard") or {}, b.get("shard") or {}
        if not (
            sa.get("split") == "heads"
            and sb.get("split") == "heads"
            and sa.get("tp_size") == sb.get("tp_size")
            and sa.get("rank") != sb.get("rank")
        ):
            continue
        (alo, ahi), (blo, bhi) = a["heads_held"], b["heads_held"]
        if max(alo, blo) < min(ahi, bhi):
            continue  # replicas of the same heads
        lines.append(
            f"{name}.shard.rank: {sa.get('rank')}, {sb.get('rank')} (tp_size {sa.get('tp_size')} "
            f"on both sides: rank r pairs with rank r; the ranks' slices [{alo}, {ahi}) and "
            f"[{blo}, {bhi}) of heads_total {sa.get('heads_total')} do not overlap, so no byte "
            "of this buffer would move)"
        )
    return lines


def check_peer(local: kvlayout.Geometry, msg: dict, require: bool = False) -> Verdict:
    """Checks a peer's handshake against the local geometry; raises `PeerRefused` with the diff.

    Runs before the peer is registered with the engine: a refusal leaves no trace in it."""
    if not isinstance(msg, dict):
        raise _refuse(f"handshake: a {type(msg).__name__}, expected a JSON object")
    text = msg.get("geometry")
    if text is not None and not isinstance(text, str):
        raise _refuse(
            f"geometry: a {type(text).__name__}, expected the geometry file's text (a string)"
        )
    if text is None:
        if require:
            raise PeerRefused(
                [f"geometry: peer {msg.get('agent')!r} sent none (require=True)"], "handshake"
            )
        warnings.warn(
            f"peer {msg.get('agent')!r} sent no kvlayout geometry: its pages move unchecked",
            UncheckedPeerWarning,
            stacklevel=2,
        )
        return Verdict(None, msg, None)
    try:
        peer = kvlayout.Geometry.from_json(text)
    except kvlayout.InvalidGeometry as e:
        raise PeerRefused([f"geometry: peer's file unreadable: {e}"], "handshake") from None
    fps = msg.get("fingerprints")
    if fps is not None and not isinstance(fps, dict):
        raise _refuse(f"fingerprints: a {type(fps).__name__}, expected an object {{\"pool\": int}}")
    sent = (fps or {}).get("pool")
    if sent != peer.fingerprint:
        raise PeerRefused(
            [
                f"fingerprints.pool: sent {sent!r}, computed from the sent geometry {peer.fingerprint:#018x}"
            ],
            "handshake",
        )
    # The core's own rendering of the peer's file: what it parsed (a BOM, say, skipped).
    peer_json, local_json = peer.to_json(), local.to_json()
    level: Literal["pool", "token"] = choose_level(peer_json, local_json)
    lines = kvlayout.compare(peer, local, level) or disjoint_heads(peer_json, local_json)
    if lines:
        raise PeerRefused(
            lines,
            level,
            f"incompatible at the {level} level: {len(lines)} differing field"
            f"{'' if len(lines) == 1 else 's'} (peer {msg.get('agent')!r} fingerprint "
            f"{peer.fingerprint:#018x}, local {local.fingerprint:#018x})",
        )
    return Verdict(level, msg, peer)


def check_regions(msg: dict, geometry: kvlayout.Geometry) -> None:
    """The peer's published regions (`{region: [address, length_bytes]}`) must hold what its
    geometry lays out (`Geometry.regions()`: one per buffer, or `pool` under
    `page_first_direct`); raises `PeerRefused` otherwise, so a plan never reads past what the
    peer registered."""
    if not isinstance(msg, dict):
        raise _refuse(f"handshake: a {type(msg).__name__}, expected a JSON object")
    regions = msg.get("regions") or {}
    if not isinstance(regions, dict):
        raise _refuse(f"regions: a {type(regions).__name__}, expected an object {{region: [address, length_bytes]}}")
    lines = []
    for region in geometry.regions():
        name, want = region["name"], region["len_bytes"]
        got = regions.get(name)
        if got is None:
            lines.append(f"regions.{name}: missing, geometry lays out {want} bytes")
            continue
        if (
            not isinstance(got, (list, tuple))
            or len(got) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in got)
        ):
            raise _refuse(f"regions.{name}: {got!r}, expected [address, length_bytes] (two ints >= 0)")
        if got[1] < want:
            lines.append(f"regions.{name}: {got[1]} bytes published, geometry lays out {want} bytes")
    if lines:
        raise PeerRefused(lines, "handshake")
