"""kvlayout.pd regions and plans: byte offsets and runs derived by hand from the geometry-file
contract (dtype widths x per-token shapes, arrangement, memory layout), written as formulas."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from conftest import ROOT
from kvlayout.pd.plan import page_plan, token_plan
from kvlayout.pd.regions import LayoutError, buffer_layouts
from kvlayout.pd.verify import pattern, verify

DSV32 = ROOT / "configs/geometry/host-index-k-fp8-formula.json"
TP_DIR = ROOT / "cli/tests/shared-cases/22-hetero-tp-1-to-2-token-level"

# DeepSeek-V3.2 MLA record: 512 fp8 nope + 4 f32 scales + 64 bf16 rope; index-K 128 fp8 + 1 f32.
KV_TOKEN_BYTES = 512 * 1 + 4 * 4 + 64 * 2  # 656
IK_TOKEN_BYTES = 128 * 1 + 1 * 4  # 132
PAGE_TOKENS = 64


def dsv32(pages=8, memory_layout="layer_first", **edits):
    g = json.loads(DSV32.read_text())
    g["pages"] = pages
    g["memory_layout"] = memory_layout
    for name, arrangement in edits.items():
        next(b for b in g["buffers"] if b["name"] == name)["arrangement"] = arrangement
    return g


def tp_pair(rank=0):
    a = json.loads((TP_DIR / "a.json").read_text())
    b = json.loads((TP_DIR / "b.json").read_text())
    for buf in b["buffers"]:
        buf["shard"]["rank"] = rank
    a["pages"] = b["pages"] = 4
    return a, b


def one_buffer(
    page_tokens, arrangement="token_major", sections=None, pages=4, layers=2, shard=None
):
    buf = {
        "name": "kv",
        "layers": layers,
        "arrangement": arrangement,
        "sections": sections or [{"name": "k", "dtype": "bf16", "shape": [64]}],
    }
    if shard:
        buf["shard"] = shard
    return {
        "schema": "kvlayout.geometry/v2",
        "name": "t",
        "page_size_tokens": page_tokens,
        "pages": pages,
        "memory_layout": "layer_first",
        "buffers": [buf],
    }


def test_dsv32_page_strides_and_offsets():
    lay = buffer_layouts(dsv32())
    assert lay["kv"].page_stride_bytes == PAGE_TOKENS * KV_TOKEN_BYTES == 41_984
    assert lay["index_k"].page_stride_bytes == PAGE_TOKENS * IK_TOKEN_BYTES == 8_448
    # layer_first: (layer * pages + page) * stride
    assert lay["kv"].page_offset_bytes(2, 3) == (2 * 8 + 3) * 41_984
    pf = buffer_layouts(dsv32(memory_layout="page_first"))
    # page_first: (page * layers + layer) * stride
    assert pf["kv"].page_offset_bytes(2, 3) == (3 * 61 + 2) * 41_984
    assert pf["kv"].region_bytes == 61 * 8 * 41_984


def test_core_figures_agree_with_pd_layout():
    import kvlayout

    g = kvlayout.Geometry.from_json(json.dumps(dsv32()))
    lay = buffer_layouts(json.loads(g.to_json()), g.buffers)
    assert lay["index_k"].bytes_per_token == IK_TOKEN_BYTES
    bad = copy.deepcopy(g.buffers)
    bad[1]["page_stride_bytes"] = 8_449
    with pytest.raises(
        LayoutError, match="index_k.page_stride_bytes: pd layout 8448, kvlayout core 8449"
    ):
        buffer_layouts(json.loads(g.to_json()), bad)


def test_piece_runs_per_arrangement():
    sm = buffer_layouts(dsv32())["index_k"]
    # section_major: scale rows after all 64 value rows; token 5's scale
    assert sm.piece_runs(5, 1, 0, 1) == [(PAGE_TOKENS * 128 + 5 * 4, 4)]
    tm = buffer_layouts(dsv32(index_k="token_major"))["index_k"]
    # token_major: row per token, scale after the token's 128 values
    assert tm.piece_runs(5, 1, 0, 1) == [(5 * IK_TOKEN_BYTES + 128, 4)]
    # head_major: [heads][tokens][head_bytes]; 8 heads x 16 bf16 per head = 32 B per head
    hm = buffer_layouts(
        one_buffer(
            16,
            "head_major",
            [{"name": "k", "dtype": "bf16", "shape": [8, 16]}],
            shard={"tp_size": 1, "rank": 0, "split": "heads", "heads_total": 8},
        )
    )["kv"]
    assert hm.piece_runs(3, 0, 2, 4) == [(2 * 16 * 32 + 3 * 32, 32), (3 * 16 * 32 + 3 * 32, 32)]
    # planes: group [a, c] token-major (4 + 8 B rows), then group [b] (2 B rows)
    secs = [
        {"name": "a", "dtype": "f32", "shape": [1]},
        {"name": "b", "dtype": "u8", "shape": [2]},
        {"name": "c", "dtype": "f32", "shape": [2]},
    ]
    pl = buffer_layouts(one_buffer(16, {"planes": [["a", "c"], ["b"]]}, secs))["kv"]
    assert pl.piece_runs(3, 2, 0, 1) == [(3 * 12 + 4, 8)]
    assert pl.piece_runs(3, 1, 0, 1) == [(16 * 12 + 3 * 2, 2)]


def test_page_plan_merges_consecutive_pages_per_layer():
    lay = buffer_layouts(dsv32())
    plan = page_plan(lay, lay, [1, 2, 3], [4, 5, 6])
    assert plan.level == "pool"
    assert len(plan.runs["kv"]) == 61  # one run per layer
    assert plan.runs["kv"][1] == ((1 * 8 + 1) * 41_984, (1 * 8 + 4) * 41_984, 3 * 41_984)
    assert plan.bytes_total == 3 * 61 * (41_984 + 8_448)


def test_page_plan_refuses_repeated_destination_and_range():
    lay = buffer_layouts(dsv32())
    with pytest.raises(LayoutError, match="repeat"):
        page_plan(lay, lay, [1, 2], [4, 4])
    with pytest.raises(LayoutError, match="page 8 of kv outside 0..8"):
        page_plan(lay, lay, [8], [0])


@pytest.mark.parametrize("rank", [0, 1])
def test_token_plan_head_slices_tp1_to_tp2(rank):
    a, b = tp_pair(rank)
    plan = token_plan(buffer_layouts(a), buffer_layouts(b), [2], [1])
    heads_lo = rank * 4  # heads_total 8 / tp_size 2
    assert plan.head_ranges["fa"] == (heads_lo, heads_lo + 4)
    head_bytes = 128 * 2
    src_row, dst_row = 8 * head_bytes, 4 * head_bytes  # fa k (or v) per token: TP1 8 heads, TP2 4
    src_page, dst_page = 2 * 16 * src_row, 2 * 16 * dst_row  # k then v, 16 tokens each
    # fa section_major, layer 0, token 3 of section v: src page 2, dst page 1
    want = (
        2 * src_page + 16 * src_row + 3 * src_row + heads_lo * head_bytes,
        1 * dst_page + 16 * dst_row + 3 * dst_row,
        4 * head_bytes,
    )
    assert want in plan.runs["fa"]
    # mla is replicated: the whole page, one run per layer
    assert len(plan.runs["mla"]) == 20
    assert plan.bytes_total == 20 * 16 * 576 * 2 + 4 * 16 * 2 * 4 * head_bytes


def test_token_plan_glues_two_small_pages_into_one():
    src = buffer_layouts(one_buffer(16))
    dst = buffer_layouts(one_buffer(32))
    plan = token_plan(src, dst, [3, 1], [2])
    row = 64 * 2
    want = []
    for layer in range(2):
        want.append(((layer * 4 + 3) * 16 * row, (layer * 4 + 2) * 32 * row, 16 * row))
        want.append(((layer * 4 + 1) * 16 * row, (layer * 4 + 2) * 32 * row + 16 * row, 16 * row))
    assert plan.runs["kv"] == want
    with pytest.raises(LayoutError, match="3 source pages x 16 tokens != 1 destination pages x 32"):
        token_plan(src, dst, [0, 1, 2], [2])


def _apply(plan, src_regions, dst_regions):
    for name, runs in plan.runs.items():
        for s, d, n in runs:
            dst_regions[name][d : d + n] = src_regions[name][s : s + n]


@pytest.mark.parametrize("rank", [0, 1])
def test_verify_accepts_the_plan_and_catches_a_wrong_one(rank):
    a, b = tp_pair(rank)
    src, dst = buffer_layouts(a), buffer_layouts(b)
    src_regions = {n: pattern(lay, 5, i) for i, (n, lay) in enumerate(src.items())}
    dst_regions = {n: np.zeros(lay.region_bytes, dtype=np.uint8) for n, lay in dst.items()}
    plan = token_plan(src, dst, [0, 3], [2, 1])
    _apply(plan, src_regions, dst_regions)
    equal, stray = verify(src, src_regions, dst, dst_regions, [0, 3], [2, 1], whole_pages=False)
    assert (equal, stray) == (plan.bytes_total, 0)
    # the other rank's heads: same lengths, wrong bytes
    other = token_plan(src, buffer_layouts(tp_pair(1 - rank)[1]), [0, 3], [2, 1])
    wrong = {n: np.zeros(lay.region_bytes, dtype=np.uint8) for n, lay in dst.items()}
    _apply(other, src_regions, wrong)
    equal_wrong, _ = verify(src, src_regions, dst, wrong, [0, 3], [2, 1], whole_pages=False)
    assert equal_wrong < plan.bytes_total


HND_HEADS, HND_DIM = 8, 128  # a vLLM HND cache: [heads, dim] bf16 per token and section


def hnd_pool(page_tokens):
    """K and V of 8 x 128 bf16, head_major, 2 layers, no shard (vLLM HND at tp 1)."""
    secs = [
        {"name": n, "dtype": "bf16", "shape": [HND_HEADS, HND_DIM]} for n in ("k", "v")
    ]
    return buffer_layouts(one_buffer(page_tokens, "head_major", secs, pages=8))


def hnd_element_offset(lay, layer, page, section, head, token):
    """DESIGN's head_major: section after section, heads outermost inside a section, so head h
    of token t of section s at T x (bytes of sections before s) + (h x T + t) x head_row_bytes."""
    t_page = lay.page_size_tokens
    head_row = HND_DIM * 2
    section_block = HND_HEADS * t_page * head_row
    return (
        lay.page_offset_bytes(layer, page)
        + section * section_block
        + (head * t_page + token) * head_row
    )


# Regression (hostile review, session 8): a head_major buffer with no shard counted 1 head, so a
# token plan between 32- and 64-token pages laid it out token-major: 3,584 of 4,096 head rows
# landed in the wrong place, and verify (same head count) reported every byte equal.
def test_token_plan_head_major_without_shard_places_each_head_row():
    src, dst = hnd_pool(32)["kv"], hnd_pool(64)["kv"]
    src_pages, dst_pages = [1, 2, 3, 6], [3, 4]
    plan = token_plan({"kv": src}, {"kv": dst}, src_pages, dst_pages)
    # every byte of 4 source pages moves: 2 layers x 128 tokens x 2 sections x 8 x 128 x 2 B
    assert plan.bytes_total == 2 * 128 * 2 * HND_HEADS * HND_DIM * 2
    def head_rows(lay, pages):
        """(offset in u16 units, tag) of every head row: the tag names the layer, section,
        head and the token's place in the stream of `pages`."""
        t_page = lay.page_size_tokens
        for layer in range(2):
            for i, page in enumerate(pages):
                for sec in range(2):
                    for head in range(HND_HEADS):
                        for t in range(t_page):
                            o = hnd_element_offset(lay, layer, page, sec, head, t) // 2
                            yield o, layer * 20_000 + sec * 10_000 + head * 1000 + i * t_page + t

    src_region = np.zeros(src.region_bytes, dtype=np.uint8)
    src16 = src_region.view(np.uint16)
    for o, tag in head_rows(src, src_pages):
        src16[o : o + HND_DIM] = tag
    dst_region = np.zeros(dst.region_bytes, dtype=np.uint8)
    _apply(plan, {"kv": src_region}, {"kv": dst_region})
    dst16 = dst_region.view(np.uint16)
    wrong = sum(int(np.count_nonzero(dst16[o : o + HND_DIM] != tag))
                for o, tag in head_rows(dst, dst_pages))
    assert wrong == 0


def test_verify_catches_head_major_moved_as_token_major():
    src, dst = hnd_pool(32), hnd_pool(64)
    src_regions = {"kv": pattern(src["kv"], 7, 0)}
    right = {"kv": np.zeros(dst["kv"].region_bytes, dtype=np.uint8)}
    plan = token_plan(src, dst, [1, 2, 3, 6], [3, 4])
    _apply(plan, src_regions, right)
    assert verify(src, src_regions, dst, right, [1, 2, 3, 6], [3, 4], False) == (
        plan.bytes_total,
        0,
    )
    # the runs a token-major reading of the same pools gives: same bytes, wrong places
    rows = [{"name": s, "dtype": "bf16", "shape": [HND_HEADS, HND_DIM]} for s in ("k", "v")]
    as_rows = {
        n: buffer_layouts(one_buffer(t, "token_major", rows, pages=8))
        for n, t in (("src", 32), ("dst", 64))
    }
    wrong_plan = token_plan(as_rows["src"], as_rows["dst"], [1, 2, 3, 6], [3, 4])
    assert wrong_plan.bytes_total == plan.bytes_total
    wrong = {"kv": np.zeros(dst["kv"].region_bytes, dtype=np.uint8)}
    _apply(wrong_plan, src_regions, wrong)
    equal_wrong, _ = verify(src, src_regions, dst, wrong, [1, 2, 3, 6], [3, 4], False)
    assert equal_wrong < plan.bytes_total // 2


def test_head_major_one_entry_shape_is_one_head_per_token():
    # the core's Section::heads: a one-entry shape is 1 head, so head_major lays the section's
    # rows token after token: token 3's 64 bf16 at 3 x 128 B
    lay = buffer_layouts(one_buffer(16, "head_major"))["kv"]
    assert lay.piece_runs(3, 0, 0, 1) == [(3 * 64 * 2, 64 * 2)]


def test_layout_errors_name_the_field():
    g = one_buffer(16, sections=[{"name": "k", "dtype": "f4e2m1", "shape": [3]}])
    with pytest.raises(LayoutError, match="kv.k.shape: 3 f4e2m1 elements are not whole bytes"):
        buffer_layouts(g)
    g = dsv32()
    g["memory_layout"] = "page_head"
    with pytest.raises(LayoutError, match="memory_layout: 'page_head'"):
        buffer_layouts(g)
    bad = one_buffer(
        16,
        sections=[{"name": "k", "dtype": "bf16", "shape": [3, 64]}],
        shard={"tp_size": 2, "rank": 0, "split": "heads", "heads_total": 8},
    )
    with pytest.raises(LayoutError, match=r"kv.k.shape\[0\]: 3 heads, shard implies 8 / 2 = 4"):
        token_plan(buffer_layouts(bad), buffer_layouts(bad), [0], [0])
