"""kvlayout.pd handshake: the message, the level choice and the receiver's check (no engine)."""

from __future__ import annotations

import json

import kvlayout
import pytest
from conftest import ROOT
from kvlayout.pd import handshake
from kvlayout.pd.handshake import PeerRefused, UncheckedPeerWarning

DSV32 = ROOT / "configs/geometry/host-index-k-fp8-formula.json"
SEED = ROOT / "cli/tests/shared-cases/00-dsa-index-k-bf16-vs-fp8-host"
TP = ROOT / "cli/tests/shared-cases/22-hetero-tp-1-to-2-token-level"


def geo(path, **edit) -> kvlayout.Geometry:
    g = json.loads(path.read_text())
    for name, arrangement in edit.items():
        next(b for b in g["buffers"] if b["name"] == name)["arrangement"] = arrangement
    return kvlayout.Geometry.from_json(json.dumps(g))


def message(g, agent="prefill-0"):
    return handshake.parse_message(handshake.make_message(agent, g, {"kv": [4096, 64]}))


def test_compatible_pool_level():
    g = geo(DSV32)
    v = handshake.check_peer(g, message(g))
    assert v.level == "pool"
    assert v.peer_geometry.fingerprint == g.fingerprint


def test_seed_case_refused_with_the_diff():
    with pytest.raises(PeerRefused) as e:
        handshake.check_peer(geo(SEED / "b.json"), message(geo(SEED / "a.json")))
    text = "\n".join(e.value.lines)
    # device bf16 index-K 128 x 2 = 256 B/token, host fp8 formula 128 + 4 = 132 B/token
    assert "index_k" in text and str(128 * 2) in text and str(128 + 4) in text
    assert e.value.level == "pool"
    assert isinstance(e.value, kvlayout.Incompatible)


def test_same_length_other_arrangement_refused():
    peer, local = geo(DSV32, index_k="token_major"), geo(DSV32)
    with pytest.raises(PeerRefused) as e:
        handshake.check_peer(local, message(peer))
    assert any("index_k" in ln and "arrangement" in ln for ln in e.value.lines)


def test_hetero_tp_is_checked_at_the_token_level():
    a, b = geo(TP / "a.json"), geo(TP / "b.json")
    assert handshake.choose_level(a.to_json(), b.to_json()) == "token"
    assert kvlayout.compare(a, b, "pool") != []  # whole pages differ (fa 4,096 vs 2,048 B/token)
    assert handshake.check_peer(b, message(a)).level == "token"


def test_page_size_ratio_is_token_level_and_same_split_is_pool():
    g = json.loads(DSV32.read_text())
    small = dict(g, page_size_tokens=32)
    assert handshake.choose_level(json.dumps(small), json.dumps(g)) == "token"
    assert handshake.choose_level(json.dumps(g), json.dumps(g)) == "pool"


def test_fingerprint_that_does_not_match_the_geometry_is_refused():
    g = geo(DSV32)
    msg = message(g)
    msg["fingerprints"]["pool"] ^= 1
    with pytest.raises(PeerRefused, match="fingerprints.pool"):
        handshake.check_peer(g, msg)


def test_peer_without_geometry_warns_or_refuses():
    g = geo(DSV32)
    bare = handshake.parse_message(handshake.make_message("old-engine", None, {}))
    with pytest.warns(UncheckedPeerWarning, match="old-engine"):
        assert handshake.check_peer(g, bare).level is None
    with pytest.raises(PeerRefused, match="require=True"):
        handshake.check_peer(g, bare, require=True)


def test_unreadable_messages_are_refused_by_name():
    with pytest.raises(PeerRefused, match="not JSON"):
        handshake.parse_message(b"\xff")
    with pytest.raises(PeerRefused, match="handshake.schema"):
        handshake.parse_message(b'{"schema": "other"}')
    g = geo(DSV32)
    msg = message(g)
    msg["geometry"] = msg["geometry"].replace('"f8e4m3"', '"f9"', 1)
    with pytest.raises(PeerRefused, match="unreadable"):
        handshake.check_peer(g, msg)


def test_published_regions_must_hold_the_geometry():
    g = json.loads(DSV32.read_text())
    g["pages"] = 2
    geometry = kvlayout.Geometry.from_json(json.dumps(g))
    kv_bytes = 61 * 2 * 64 * (512 + 4 * 4 + 64 * 2)  # layers x pages x page bytes
    ik_bytes = 61 * 2 * 64 * (128 + 4)
    ok = {"regions": {"kv": [4096, kv_bytes], "index_k": [8192, ik_bytes]}}
    handshake.check_regions(ok, geometry)
    short = {"regions": {"kv": [4096, kv_bytes - 1]}}
    with pytest.raises(PeerRefused) as e:
        handshake.check_regions(short, geometry)
    assert e.value.lines == [
        f"regions.kv: {kv_bytes - 1} bytes published, geometry lays out {kv_bytes} bytes",
        f"regions.index_k: missing, geometry lays out {ik_bytes} bytes",
    ]
    # page_first_direct: one region for the whole pool
    g["memory_layout"] = "page_first_direct"
    direct = kvlayout.Geometry.from_json(json.dumps(g))
    with pytest.raises(PeerRefused) as e:
        handshake.check_regions(ok, direct)
    assert e.value.lines == [
        f"regions.pool: missing, geometry lays out {kv_bytes + ik_bytes} bytes"
    ]


@pytest.mark.parametrize("edit,field", [
    ({"geometry": {"buffers": []}}, "geometry"),
    ({"geometry": 7}, "geometry"),
    ({"fingerprints": [1, 2]}, "fingerprints"),
])
def test_malformed_handshake_fields_are_refused_by_name(edit, field):
    g = geo(DSV32)
    msg = {**message(g), **edit}
    with pytest.raises(PeerRefused) as e:
        handshake.check_peer(g, msg)
    assert e.value.level == "handshake" and e.value.lines[0].startswith(field + ":")


def test_deeply_nested_message_is_refused():
    with pytest.raises(PeerRefused, match="nested too deeply"):
        handshake.parse_message(b"[" * 100000 + b"]" * 100000)


def _one_region_of_64_bytes() -> kvlayout.Geometry:
    """One buffer `kv`: 1 layer x 1 page of 32 tokens x 1 u8 x 2 = 64 bytes."""
    return kvlayout.Geometry.from_json(json.dumps({
        "schema": "kvlayout.geometry/v1", "name": "t", "page_size_tokens": 32, "pages": 1,
        "memory_layout": "layer_first",
        "buffers": [{"name": "kv", "layers": 1, "arrangement": "token_major",
                     "sections": [{"name": "x", "dtype": "u8", "shape": [2]}]}],
    }))


@pytest.mark.parametrize("regions,field", [
    ([1, 2], "regions"),
    ({"kv": "0x1000"}, "regions.kv"),
    ({"kv": [4096]}, "regions.kv"),
    ({"kv": [4096, "64"]}, "regions.kv"),
    ({"kv": [4096, True]}, "regions.kv"),
])
def test_malformed_regions_are_refused_by_name(regions, field):
    with pytest.raises(PeerRefused) as e:
        handshake.check_regions({"regions": regions}, _one_region_of_64_bytes())
    assert e.value.lines[0].startswith(field + ":")


def test_regions_short_and_whole():
    handshake.check_regions({"regions": {"kv": [4096, 64]}}, _one_region_of_64_bytes())
    with pytest.raises(PeerRefused, match="63 bytes published, geometry lays out 64"):
        handshake.check_regions({"regions": {"kv": [4096, 63]}}, _one_region_of_64_bytes())


# Regressions (hostile review, session 8): a peer geometry with a UTF-8 BOM (which the core
# skips) escaped check_peer as a JSONDecodeError from the level choice, and a lone surrogate as
# a UnicodeEncodeError; both must be verdicts, not crashes.
def test_peer_geometry_with_a_bom_is_read_as_the_core_reads_it():
    g = geo(DSV32)
    msg = message(g)
    msg["geometry"] = "\ufeff" + msg["geometry"]
    assert handshake.check_peer(g, msg).level == "pool"


def test_peer_geometry_that_is_not_unicode_is_refused():
    g = geo(DSV32)
    msg = handshake.parse_message(
        b'{"schema": "kvlayout.pd.handshake/v1", "geometry": "\\ud800"}')
    with pytest.raises(PeerRefused, match="unreadable") as e:
        handshake.check_peer(g, msg)
    assert e.value.level == "handshake"
    with pytest.raises(kvlayout.InvalidGeometry) as e2:
        kvlayout.Geometry.from_json("\ud800")
    assert e2.value.field == "text"


# Regression: `selftest --case bogus` ran nothing and exited 0.
def test_selftest_refuses_an_unknown_case(capsys):
    import argparse

    from kvlayout.pd import selftest

    opts = argparse.Namespace(engine="nixl", case=["compatible", "Compatible"], repo=str(ROOT))
    assert selftest.main(opts) == 2
    assert "--case Compatible: no such case" in capsys.readouterr().err


def _tp2_rank(rank: int) -> kvlayout.Geometry:
    return kvlayout.Geometry.from_json(json.dumps({
        "schema": "kvlayout.geometry/v2", "name": f"r{rank}", "page_size_tokens": 64,
        "pages": 8, "memory_layout": "layer_first",
        "buffers": [{"name": "kv", "layers": 2, "arrangement": "token_major",
                     "shard": {"tp_size": 2, "rank": rank, "split": "heads", "heads_total": 8},
                     "sections": [{"name": "k", "dtype": "bf16", "shape": [4, 128]}]}]}))


# Regression (hostile review, session 8): rank 0 of tp 2 paired with rank 1 of tp 2 passed the
# handshake at the token level, and the plan then moved 0 bytes.
def test_equal_tp_other_rank_is_refused_naming_both_ranks():
    r0, r1 = _tp2_rank(0), _tp2_rank(1)
    assert handshake.check_peer(r1, message(_tp2_rank(1))).level == "pool"
    with pytest.raises(PeerRefused) as e:
        handshake.check_peer(r1, message(r0))
    # 8 heads over 2 ranks: rank 0 holds [0, 4), rank 1 [4, 8)
    assert e.value.lines == [
        "kv.shard.rank: 0, 1 (tp_size 2 on both sides: rank r pairs with rank r; the ranks' "
        "slices [0, 4) and [4, 8) of heads_total 8 do not overlap, so no byte of this buffer "
        "would move)"
    ]
    assert e.value.level == "token"
