"""Geometry v3 through Python: compressed rows, heads replicated over ranks and split groups
in `Geometry` (from_json / to_json / buffers / regions), `describe`, the token plans and the
prefill/decode handshake. Figures are worked by hand in the comments."""

from __future__ import annotations

import json

import kvlayout
import numpy as np
import pytest
from conftest import ROOT
from kvlayout.pd import handshake
from kvlayout.pd.handshake import PeerRefused
from kvlayout.pd.verify import patterns, verify

CASES = ROOT / "cli/tests/shared-cases"
C4 = CASES / "28-dsv4-c4-indexer-host-per-token-vs-per-row"
QWEN35 = CASES / "29-compatible-replicated-heads-tp2-to-tp4-token-level"
GDN = CASES / "30-compatible-gdn-conv-split-groups-tp2-vs-tp4-token-level"


def geo(path, rank=None, pages=None, **top) -> kvlayout.Geometry:
    g = json.loads(path.read_text())
    if rank is not None:
        g["buffers"][0]["shard"]["rank"] = rank
    if pages is not None:
        g["pages"] = pages
    g.update(top)
    return kvlayout.Geometry.from_json(json.dumps(g))


def test_v3_fields_round_trip_and_show_in_buffers_and_regions():
    g = geo(C4 / "a.json")
    assert json.loads(g.to_json())["schema"] == "kvlayout.geometry/v3"
    assert kvlayout.Geometry.from_json(g.to_json()) == g
    (b,) = g.buffers
    # 64 tokens / R 4 = 16 rows of 128 + 4 = 132 B: 2,112 B a page.
    assert (b["compress_ratio"], b["rows_per_page"], b["bytes_per_token"]) == (4, 16, 132)
    assert b["bytes_per_page"] == b["page_stride_bytes"] == 16 * 132
    place = g.regions()[0]["buffers"][0]
    assert (place["page_size_tokens"], place["compress_ratio"], place["rows_per_page"]) == (
        64,
        4,
        16,
    )
    # One row per 4 tokens has no whole bytes per token: refused naming the ratio.
    with pytest.raises(kvlayout.InvalidGeometry, match="compress_ratio"):
        _ = g.bytes_per_token
    # The host side (a v1 file, R 1) is still written as v1.
    host = geo(C4 / "b.json")
    assert json.loads(host.to_json())["schema"] == "kvlayout.geometry/v1"
    lines = kvlayout.compare(g, host)
    assert "index_k.compress_ratio: 4, 1" in lines
    assert "index_k.bytes_per_page: 2112, 8448" in lines


def test_replicated_heads_name_the_head_each_rank_holds():
    # 2 KV heads on 4 ranks: 2 replicas per head, rank r holds head r // 2.
    for rank, head in [(0, 0), (1, 0), (2, 1), (3, 1)]:
        (b,) = geo(QWEN35 / "b.json", rank=rank).buffers
        assert b["shard"]["heads_total"] == 2  # the model's KV heads, never 2 x replicas
        assert b["heads_held"] == [head, head + 1]
    # TP 2 rank 1 and TP 4 rank 2 hold head 1: compatible at the token level; TP 4 rank 0
    # holds head 0 and is refused naming both heads.
    assert kvlayout.compare(geo(QWEN35 / "a.json"), geo(QWEN35 / "b.json"), "token") == []
    lines = kvlayout.compare(geo(QWEN35 / "a.json"), geo(QWEN35 / "b.json", rank=0), "token")
    assert lines == [
        (
            "full_attn.shard.heads_held: head 1 of 2 (tp_size 2 rank 1, 1 replicas), "
            "head 0 of 2 (tp_size 4 rank 0, 2 replicas)"
        )
    ]


def test_split_groups_show_in_buffers():
    (b,) = geo(GDN / "b.json").buffers
    assert b["sections"][0]["split_groups"] == [2048, 2048, 4096]
    assert b["sections"][0]["shape"] == [2048, 3]
    assert b["heads_held"] == [0, 2048]  # 8,192 / 4 of the whole axis at rank 0


def _moved(src, dst, src_pages, dst_pages):
    """The plan's runs copied between two seeded pools; (bytes moved, bytes verified, stray)."""
    plan = kvlayout.token_plan(src, dst, src_pages, dst_pages)
    src_regions = patterns(src, 7)
    dst_regions = {r["name"]: np.zeros(r["len_bytes"], np.uint8) for r in dst.regions()}
    for name, runs in plan.runs.items():
        s_region, d_region = plan.regions[name]
        for s, d, n in runs:
            dst_regions[d_region][d : d + n] = src_regions[s_region][s : s + n]
    equal, stray = verify(src, src_regions, dst, dst_regions, src_pages, dst_pages, False)
    return plan, equal, stray


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_a_tp2_to_tp4_pair_moves_the_right_head_into_each_rank(rank):
    src = geo(QWEN35 / "a.json", rank=rank // 2, pages=4)
    dst = geo(QWEN35 / "b.json", rank=rank, pages=4)
    plan, equal, stray = _moved(src, dst, [1, 3], [2, 0])
    assert plan.head_ranges["full_attn"] == (rank // 2, rank // 2 + 1)
    # 2 pages x 10 layers x (K 64 x 512 + V 64 x 512) B, all of the destination's pages.
    assert plan.bytes_total == equal == 2 * 10 * 64 * 1024
    assert stray == 0
    # The map SGLang #23746 fixed, r % 2, pairs rank 2 with prefill rank 0: refused.
    if rank == 2:
        with pytest.raises(kvlayout.Incompatible, match="heads_held"):
            kvlayout.token_plan(geo(QWEN35 / "a.json", rank=0, pages=4), dst, [1], [2])


@pytest.mark.parametrize("src_rank,dst_rank", [(0, 0), (0, 1), (1, 2), (1, 3)])
def test_a_gdn_conv_state_moves_group_by_group(src_rank, dst_rank):
    src = geo(GDN / "a.json", rank=src_rank, pages=4)
    dst = geo(GDN / "b.json", rank=dst_rank, pages=4)
    plan, equal, stray = _moved(src, dst, [3, 1], [0, 2])
    # Three slices per slot and layer (q, k, v): 512 + 512 + 1,024 channels x 3 x 2 B.
    runs = plan.runs["conv"]
    assert len(runs) == 2 * 30 * 3
    ch = 3 * 2
    half = dst_rank % 2  # which half of the prefill rank's slice of each group
    assert [r[2] for r in runs[:3]] == [512 * ch, 512 * ch, 1024 * ch]
    # Source rows: q at 512 * half, k at 1,024 + 512 * half, v at 2,048 + 1,024 * half of
    # slot 3 (layer_first: (layer x 4 + slot) x 4,096 x 6 B).
    base = 3 * 4096 * ch
    assert [r[0] for r in runs[:3]] == [
        base + 512 * half * ch,
        base + (1024 + 512 * half) * ch,
        base + (2048 + 1024 * half) * ch,
    ]
    assert plan.bytes_total == equal == 2 * 30 * 2048 * ch
    assert stray == 0


def test_the_handshake_checks_replicated_heads_at_the_token_level():
    prefill, decode = geo(QWEN35 / "a.json"), geo(QWEN35 / "b.json")
    msg = handshake.parse_message(handshake.make_message("p", prefill, {}))
    v = handshake.check_peer(decode, msg)
    assert v.level == "token"
    wrong = geo(QWEN35 / "a.json", rank=0)
    msg = handshake.parse_message(handshake.make_message("p", wrong, {}))
    with pytest.raises(PeerRefused) as e:
        handshake.check_peer(decode, msg)
    assert e.value.level == "token"
    assert e.value.lines[0].startswith("full_attn.shard.heads_held: head 0 of 2")
    # Equal tp_size: two replicas of one head pair; ranks of different heads do not.
    r2, r3, r0 = (geo(QWEN35 / "b.json", rank=r) for r in (2, 3, 0))
    assert handshake.disjoint_heads(r2.to_json(), r3.to_json()) == []
    assert kvlayout.compare(r2, r0, "token") != []


def test_describe_carries_v3_fields():
    g = kvlayout.describe("deepseek-v4-flash")
    ratios = {b["name"]: b.get("compress_ratio", 1) for b in g.buffers}
    # DeepSeek-V4-Flash's compress_ratios: C4 (KV and indexer) and C128 layers.
    assert ratios["c4_kv"] == 4 and ratios["c4_index_k"] == 4 and ratios["c128_kv"] == 128
    assert json.loads(g.to_json())["schema"] == "kvlayout.geometry/v3"
    assert kvlayout.Geometry.from_json(g.to_json()).fingerprint == g.fingerprint
