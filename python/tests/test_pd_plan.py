"""Transfer plans (`kvlayout.page_plan` / `token_plan`, the Rust core's) and regions
(`Geometry.regions()`): byte offsets derived by hand from the geometry-file contract (dtype
widths x per-token shapes, arrangement, memory layout), written as formulas; and every plan
applied to seeded regions and read back by `kvlayout.pd.verify`, an independent numpy reading
of the arrangements."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from conftest import ROOT

import kvlayout
from kvlayout.pd.verify import buffers, patterns, verify

DSV32 = ROOT / "configs/geometry/host-index-k-fp8-formula.json"
TP_DIR = ROOT / "cli/tests/shared-cases/22-hetero-tp-1-to-2-token-level"
MEMORY_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")

# DeepSeek-V3.2 MLA record: 512 fp8 nope + 4 f32 scales + 64 bf16 rope; index-K 128 fp8 + 1 f32.
KV_TOKEN_BYTES = 512 * 1 + 4 * 4 + 64 * 2  # 656
IK_TOKEN_BYTES = 128 * 1 + 1 * 4  # 132
PAGE_TOKENS = 64
LAYERS = 61


def geo(obj: dict) -> kvlayout.Geometry:
    return kvlayout.Geometry.from_json(json.dumps(obj))


def dsv32(pages=8, memory_layout="layer_first") -> kvlayout.Geometry:
    g = json.loads(DSV32.read_text())
    g["pages"] = pages
    g["memory_layout"] = memory_layout
    return geo(g)


def tp_pair(rank=0, pages=4, memory_layouts=("layer_first", "layer_first")):
    a = json.loads((TP_DIR / "a.json").read_text())
    b = json.loads((TP_DIR / "b.json").read_text())
    for buf in b["buffers"]:
        buf["shard"]["rank"] = rank
    a["pages"] = b["pages"] = pages
    a["memory_layout"], b["memory_layout"] = memory_layouts
    return geo(a), geo(b)


def one_buffer(
    page_tokens,
    arrangement="token_major",
    sections=None,
    pages=4,
    layers=2,
    shard=None,
    memory_layout="layer_first",
) -> kvlayout.Geometry:
    buf = {
        "name": "kv",
        "layers": layers,
        "arrangement": arrangement,
        "sections": sections or [{"name": "k", "dtype": "bf16", "shape": [64]}],
    }
    if shard:
        buf["shard"] = shard
    return geo(
        {
            "schema": "kvlayout.geometry/v2",
            "name": "t",
            "page_size_tokens": page_tokens,
            "pages": pages,
            "memory_layout": memory_layout,
            "buffers": [buf],
        }
    )


def test_regions_follow_each_memory_layout():
    kv_s, ik_s = PAGE_TOKENS * KV_TOKEN_BYTES, PAGE_TOKENS * IK_TOKEN_BYTES  # 41,984 and 8,448
    assert (kv_s, ik_s) == (41_984, 8_448)
    lf = dsv32(8, "layer_first").regions()
    assert [(r["name"], r["len_bytes"]) for r in lf] == [
        ("kv", LAYERS * 8 * kv_s),
        ("index_k", LAYERS * 8 * ik_s),
    ]
    kv = lf[0]["buffers"][0]
    # layer_first: (layer * pages + page) * stride
    assert (kv["layer_step_bytes"], kv["page_step_bytes"]) == (8 * kv_s, kv_s)
    pf = dsv32(8, "page_first").regions()[0]["buffers"][0]
    # page_first: (page * layers + layer) * stride
    assert (pf["layer_step_bytes"], pf["page_step_bytes"]) == (kv_s, LAYERS * kv_s)
    direct = dsv32(8, "page_first_direct").regions()
    # page_first_direct: one region [page][buffer][layer][stride]
    group = LAYERS * kv_s + LAYERS * ik_s
    assert [(r["name"], r["len_bytes"]) for r in direct] == [("pool", 8 * group)]
    ik = direct[0]["buffers"][1]
    assert (ik["offset_bytes"], ik["page_step_bytes"], ik["layer_step_bytes"]) == (
        LAYERS * kv_s,
        group,
        ik_s,
    )
    assert ik["section_bytes_per_token"] == [128, 4]


def test_page_plan_merges_consecutive_pages_per_layer():
    g = dsv32()
    plan = kvlayout.page_plan(g, g, [1, 2, 3], [4, 5, 6])
    assert plan.level == "pool"
    assert len(plan.runs["kv"]) == LAYERS  # one run per layer
    assert plan.runs["kv"][1] == ((1 * 8 + 1) * 41_984, (1 * 8 + 4) * 41_984, 3 * 41_984)
    assert plan.bytes_total == 3 * LAYERS * (41_984 + 8_448)
    assert plan.regions == {"kv": ("kv", "kv"), "index_k": ("index_k", "index_k")}


def test_a_deepseek_page_tp1_to_tp2_is_one_run_per_layer():
    # issue 24: the Python planner cut this page into 64 tokens x 2 index-K sections per layer
    a = json.loads(DSV32.read_text())
    b = json.loads(DSV32.read_text())
    for g, tp, rank in ((a, 1, 0), (b, 2, 1)):
        g["schema"] = "kvlayout.geometry/v2"
        g["memory_layout"] = "layer_first"
        for buf in g["buffers"]:
            buf["shard"] = {"tp_size": tp, "rank": rank, "split": "replicated"}
    plan = kvlayout.token_plan(geo(a), geo(b), [7], [2])
    pages = a["pages"]
    assert [len(plan.runs[n]) for n in ("kv", "index_k")] == [LAYERS, LAYERS]
    assert plan.runs["index_k"][3] == (
        (3 * pages + 7) * PAGE_TOKENS * IK_TOKEN_BYTES,
        (3 * pages + 2) * PAGE_TOKENS * IK_TOKEN_BYTES,
        PAGE_TOKENS * IK_TOKEN_BYTES,
    )


def test_plans_refuse_bad_page_lists_by_kind():
    g = dsv32()
    cases = [
        (([1, 2], [4, 4]), "duplicate_destination", r"dst_pages\[1\]: page 4 listed twice"),
        (([8], [0]), "page_out_of_range", r"src_pages\[0\]: page 8 out of range \(the source pool has 8 pages\)"),
        (([1, 2], [4]), "length", "page lists: 2 source pages, 1 destination pages"),
        (([-1], [4]), "negative_page", r"src_pages\[0\]: page -1 is negative"),
    ]
    for (src, dst), kind, message in cases:
        with pytest.raises(kvlayout.TransferRefused, match=message) as e:
            kvlayout.page_plan(g, g, src, dst)
        assert e.value.kind == kind
    a, b = tp_pair()
    with pytest.raises(kvlayout.Incompatible, match="fa.shard"):
        kvlayout.page_plan(a, b, [0], [0])


@pytest.mark.parametrize("rank", [0, 1])
def test_token_plan_head_slices_tp1_to_tp2(rank):
    a, b = tp_pair(rank)
    plan = kvlayout.token_plan(a, b, [2], [1])
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
    src, dst = one_buffer(16), one_buffer(32)
    plan = kvlayout.token_plan(src, dst, [3, 1], [2])
    row = 64 * 2
    want = []
    for layer in range(2):
        want.append(((layer * 4 + 3) * 16 * row, (layer * 4 + 2) * 32 * row, 16 * row))
        want.append(((layer * 4 + 1) * 16 * row, (layer * 4 + 2) * 32 * row + 16 * row, 16 * row))
    assert plan.runs["kv"] == want
    with pytest.raises(
        kvlayout.TransferRefused, match="3 source pages x 16 tokens != 1 destination pages x 32"
    ) as e:
        kvlayout.token_plan(src, dst, [0, 1, 2], [2])
    assert e.value.kind == "length"


def test_page_first_direct_offsets_by_hand():
    # MHA K and V [2, 8] bf16 (section_major), 3 layers, 4-token pages, 5 pages
    secs = [{"name": n, "dtype": "bf16", "shape": [2, 8]} for n in ("k", "v")]
    lf = one_buffer(4, "section_major", secs, pages=5, layers=3)
    direct = one_buffer(4, "section_major", secs, pages=5, layers=3, memory_layout="page_first_direct")
    stride = 4 * 2 * (2 * 8 * 2)  # 4 tokens x (k + v) x 16 bf16 = 256 B
    plan = kvlayout.page_plan(lf, direct, [1], [4])
    assert plan.regions == {"kv": ("kv", "pool")}
    # the only buffer: a page group is its 3 layers, page 4 at 4 x 3 strides; pages outermost
    # on the destination, so layers 0..2 of page 1 (layer_first: l * 5 + 1) land one after another
    assert plan.runs["kv"] == [((l * 5 + 1) * stride, (4 * 3 + l) * stride, stride) for l in range(3)]


def _hnd(page_tokens, memory_layout, pages=6, arrangement="head_major"):
    secs = [{"name": n, "dtype": "bf16", "shape": [4, 8]} for n in ("k", "v")]
    return one_buffer(page_tokens, arrangement, secs, pages=pages, layers=3, memory_layout=memory_layout)


def _apply(plan, src_regions, dst_regions):
    for name, runs in plan.runs.items():
        s_reg, d_reg = plan.regions[name]
        for s, d, n in runs:
            dst_regions[d_reg][d : d + n] = src_regions[s_reg][s : s + n]


def _zeros(g):
    return {r["name"]: np.zeros(r["len_bytes"], dtype=np.uint8) for r in g.regions()}


def _moves_exactly(plan, src, dst, src_pages, dst_pages, whole_pages):
    src_regions = patterns(src, 5)
    dst_regions = _zeros(dst)
    _apply(plan, src_regions, dst_regions)
    return verify(src, src_regions, dst, dst_regions, src_pages, dst_pages, whole_pages)


@pytest.mark.parametrize(
    "src_layout,dst_layout", list(itertools.product(MEMORY_LAYOUTS, repeat=2))
)
@pytest.mark.parametrize("arrangement", ["token_major", "section_major", "head_major"])
def test_page_plan_moves_every_byte_between_memory_layouts(src_layout, dst_layout, arrangement):
    src, dst = _hnd(4, src_layout, arrangement=arrangement), _hnd(4, dst_layout, arrangement=arrangement)
    src_pages, dst_pages = [1, 2, 5], [3, 0, 4]
    plan = kvlayout.page_plan(src, dst, src_pages, dst_pages)
    # 3 pages x 3 layers x 4 tokens x (k + v) x 4 heads x 8 bf16
    assert plan.bytes_total == 3 * 3 * 4 * 2 * 4 * 8 * 2
    assert _moves_exactly(plan, src, dst, src_pages, dst_pages, True) == (plan.bytes_total, 0)


@pytest.mark.parametrize(
    "src_layout,dst_layout", list(itertools.product(MEMORY_LAYOUTS, repeat=2))
)
def test_token_plan_moves_every_head_row_between_page_sizes(src_layout, dst_layout):
    src, dst = _hnd(4, src_layout, pages=8), _hnd(8, dst_layout, pages=4)
    src_pages, dst_pages = [1, 2, 7, 6], [3, 0]
    plan = kvlayout.token_plan(src, dst, src_pages, dst_pages)
    assert plan.bytes_total == 3 * 16 * 2 * 4 * 8 * 2
    assert _moves_exactly(plan, src, dst, src_pages, dst_pages, False) == (plan.bytes_total, 0)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("layouts", [
    ("layer_first", "page_first_direct"),
    ("page_first_direct", "page_first"),
    ("page_first", "layer_first"),
])
def test_token_plan_tp1_to_tp2_across_memory_layouts(rank, layouts):
    a, b = tp_pair(rank, pages=6, memory_layouts=layouts)
    plan = kvlayout.token_plan(a, b, [0, 3], [2, 1])
    assert plan.bytes_total == 2 * (20 * 16 * 576 * 2 + 4 * 16 * 2 * 4 * 128 * 2)
    assert _moves_exactly(plan, a, b, [0, 3], [2, 1], False) == (plan.bytes_total, 0)
    # the other rank's heads: same lengths, wrong bytes
    other = kvlayout.token_plan(a, tp_pair(1 - rank, 6, layouts)[1], [0, 3], [2, 1])
    src_regions, wrong = patterns(a, 5), _zeros(b)
    _apply(other, src_regions, wrong)
    equal_wrong, _ = verify(a, src_regions, b, wrong, [0, 3], [2, 1], whole_pages=False)
    assert equal_wrong < plan.bytes_total


HND_HEADS, HND_DIM = 8, 128  # a vLLM HND cache: [heads, dim] bf16 per token and section


def hnd_pool(page_tokens, arrangement="head_major"):
    """K and V of 8 x 128 bf16, 2 layers, no shard (vLLM HND at tp 1)."""
    secs = [{"name": n, "dtype": "bf16", "shape": [HND_HEADS, HND_DIM]} for n in ("k", "v")]
    return one_buffer(page_tokens, arrangement, secs, pages=8)


def hnd_element_offset(page_tokens, layer, page, section, head, token):
    """DESIGN's head_major in a layer_first pool of 8 pages: page at (layer x 8 + page) x
    stride; head h of token t of section s at T x (bytes of sections before s) + (h x T + t) x
    head_row_bytes."""
    head_row = HND_DIM * 2
    section_block = HND_HEADS * page_tokens * head_row
    stride = 2 * section_block
    return (
        (layer * 8 + page) * stride
        + section * section_block
        + (head * page_tokens + token) * head_row
    )


# A head_major buffer with no shard once counted 1 head, so a token plan between 32- and
# 64-token pages laid it out token-major: 3,584 of 4,096 head rows landed in the wrong place.
def test_token_plan_head_major_without_shard_places_each_head_row():
    src, dst = hnd_pool(32), hnd_pool(64)
    src_pages, dst_pages = [1, 2, 3, 6], [3, 4]
    plan = kvlayout.token_plan(src, dst, src_pages, dst_pages)
    # every byte of 4 source pages moves: 2 layers x 128 tokens x 2 sections x 8 x 128 x 2 B
    assert plan.bytes_total == 2 * 128 * 2 * HND_HEADS * HND_DIM * 2

    def head_rows(t_page, pages):
        """(offset in u16 units, tag) of every head row: the tag names the layer, section,
        head and the token's place in the stream of `pages`."""
        for layer in range(2):
            for i, page in enumerate(pages):
                for sec in range(2):
                    for head in range(HND_HEADS):
                        for t in range(t_page):
                            o = hnd_element_offset(t_page, layer, page, sec, head, t) // 2
                            yield o, layer * 20_000 + sec * 10_000 + head * 1000 + i * t_page + t

    (src_len,) = [r["len_bytes"] for r in src.regions()]
    src16 = np.zeros(src_len // 2, dtype=np.uint16)
    for o, tag in head_rows(32, src_pages):
        src16[o : o + HND_DIM] = tag
    dst_regions = _zeros(dst)
    _apply(plan, {"kv": src16.view(np.uint8)}, dst_regions)
    dst16 = dst_regions["kv"].view(np.uint16)
    wrong = sum(
        int(np.count_nonzero(dst16[o : o + HND_DIM] != tag)) for o, tag in head_rows(64, dst_pages)
    )
    assert wrong == 0


def test_verify_catches_head_major_moved_as_token_major():
    src, dst = hnd_pool(32), hnd_pool(64)
    plan = kvlayout.token_plan(src, dst, [1, 2, 3, 6], [3, 4])
    assert _moves_exactly(plan, src, dst, [1, 2, 3, 6], [3, 4], False) == (plan.bytes_total, 0)
    # the runs a token-major reading of the same pools gives: same bytes, wrong places
    wrong_plan = kvlayout.token_plan(
        hnd_pool(32, "token_major"), hnd_pool(64, "token_major"), [1, 2, 3, 6], [3, 4]
    )
    assert wrong_plan.bytes_total == plan.bytes_total
    src_regions, wrong = patterns(src, 5), _zeros(dst)
    _apply(wrong_plan, src_regions, wrong)
    equal_wrong, _ = verify(src, src_regions, dst, wrong, [1, 2, 3, 6], [3, 4], False)
    assert equal_wrong < plan.bytes_total // 2


def test_head_major_one_entry_shape_is_one_head_per_token():
    # the core's Section::heads: a one-entry shape is 1 head, so head_major lays the section's
    # rows token after token: token 3's 64 bf16 at 3 x 128 B, and a whole page is one run
    g = one_buffer(16, "head_major")
    plan = kvlayout.token_plan(g, g, [1], [2])
    page = 16 * 64 * 2
    assert plan.runs["kv"] == [((l * 4 + 1) * page, (l * 4 + 2) * page, page) for l in range(2)]
    assert buffers(g)["kv"].place["section_bytes_per_token"] == [64 * 2]


def test_a_state_buffer_beside_token_pages_is_refused_by_name():
    secs = [{"name": "x", "dtype": "f32", "shape": [4]}]
    g = geo(
        {
            "schema": "kvlayout.geometry/v2",
            "name": "s",
            "page_size_tokens": 16,
            "pages": 4,
            "memory_layout": "layer_first",
            "buffers": [
                {"name": "kv", "layers": 2, "arrangement": "token_major", "sections": secs},
                {"name": "conv", "layers": 2, "attention": "state",
                 "arrangement": "token_major", "sections": secs},
            ],
        }
    )
    with pytest.raises(kvlayout.TransferRefused, match="conv.attention: a state buffer") as e:
        kvlayout.token_plan(g, g, [0], [1])
    assert e.value.kind == "state"


def test_split_groups_conv_state_tp2_to_tp4_moves_each_groups_slice():
    # shared case 30: a GDN conv state, q|k|v channel groups of 2048, 2048, 4096 (bf16 x 3 each),
    # TP 2 rank 0 (4096 channels a slot) -> TP 4 rank 0 (2048): per group the first quarter of
    # the model's channels, which TP 2 rank 0 holds at local 0, 1024 and 2048
    case = ROOT / "cli/tests/shared-cases/30-compatible-gdn-conv-split-groups-tp2-vs-tp4-token-level"
    a, b = (json.loads((case / f).read_text()) for f in ("a.json", "b.json"))
    a["pages"] = b["pages"] = 4
    for buf in b["buffers"]:
        buf["shard"]["rank"] = 0
    src, dst = geo(a), geo(b)
    plan = kvlayout.token_plan(src, dst, [1], [2])
    ch = 3 * 2  # bytes per channel
    s_slot, d_slot = 4096 * ch, 2048 * ch
    layers = a["buffers"][0]["layers"]
    want = []
    for layer in range(layers):
        sb, db = (layer * 4 + 1) * s_slot, (layer * 4 + 2) * d_slot
        want += [(sb, db, 512 * ch), (sb + 1024 * ch, db + 512 * ch, 512 * ch),
                 (sb + 2048 * ch, db + 1024 * ch, 1024 * ch)]
    assert plan.runs["conv"] == want
    assert _moves_exactly(plan, src, dst, [1], [2], False) == (plan.bytes_total, 0)
