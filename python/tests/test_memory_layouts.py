"""The memory layouts layer_head (vLLM's LHBNC) and page_unified (SGLang's MHA host layout) from
Python, and describe / totals with DeepSeek-V4's kv_layout. Figures worked by hand in the
comments."""

from __future__ import annotations

import json

import kvlayout
import numpy as np
import pytest
from kvlayout.tensors import TensorBuffer


def kv_pool(memory_layout) -> kvlayout.Geometry:
    side = lambda n: {"name": n, "layers": 3, "arrangement": "token_major",  # noqa: E731
                      "sections": [{"name": n, "dtype": "bf16", "shape": [4, 2]}]}
    return kvlayout.Geometry.from_json(json.dumps({
        "schema": "kvlayout.geometry/v3", "name": "t", "page_size_tokens": 2, "pages": 5,
        "memory_layout": memory_layout, "buffers": [side("k"), side("v")]}))


def test_page_unified_regions_and_mirror():
    # SGLang page_dims (5 pages, 2 groups, 3 layers, 2, 2 tokens, 2 heads, 2 dims) of bf16:
    # strides 192, 96, 32, 16 (K|V), 8 (token) B.
    g = kv_pool({"page_unified": {"heads_per_group": 2}})
    assert (g.memory_layout, g.heads_per_group) == ("page_unified", 2)
    (region,) = g.regions()
    k, v = region["buffers"]
    assert (k["page_step_bytes"], k["head_step_bytes"], k["layer_step_bytes"]) == (192, 96, 32)
    assert (v["offset_bytes"], k["heads"], k["run_bytes"]) == (16, 2, 16)
    m = g.mirror(7, memory_layout="page_first")
    assert m.memory_layout == "page_first" and m.heads_per_group is None
    back = m.mirror(7, memory_layout="page_unified", heads_per_group=4)
    assert back.heads_per_group == 4 and len(back.regions()) == 1
    with pytest.raises(kvlayout.InvalidGeometry, match="heads_per_group"):
        m.mirror(7, memory_layout="page_unified")
    with pytest.raises(kvlayout.InvalidGeometry, match="only page_unified takes it"):
        m.mirror(7, memory_layout="page_first", heads_per_group=2)
    with pytest.raises(kvlayout.InvalidGeometry, match="3 does not divide the 4 heads"):
        m.mirror(7, memory_layout="page_unified", heads_per_group=3)
    # A v1 file cannot carry the parameter.
    text = json.loads(g.to_json())
    assert text["schema"] == "kvlayout.geometry/v3"
    text["schema"] = "kvlayout.geometry/v1"
    with pytest.raises(kvlayout.InvalidGeometry, match="needs \"schema\": \"kvlayout.geometry/v3\""):
        kvlayout.Geometry.from_json(json.dumps(text))


def test_layer_head_regions():
    # [layer][head][page][token][head row]: a head's page 2 tokens x 2 x 2 B = 8 B; head step
    # 5 pages x 8 = 40; layer step 4 heads x 40 = 160.
    g = kv_pool("layer_head")
    k = g.regions()[0]["buffers"][0]
    assert (k["page_step_bytes"], k["head_step_bytes"], k["layer_step_bytes"]) == (8, 40, 160)


def test_tensors_read_as_page_unified_and_checked():
    # numpy kv_buffer in SGLang's page_dims (page, group, layer, 2, token, head, dim), u8 bytes
    # standing for bf16 (declared sections give the meaning).
    kv = np.zeros((5, 2, 3, 2, 2, 2, 4), dtype=np.uint8)
    axes = ("page", "group", "layer", "page_token", "head", "dim")
    sec = lambda n: [{"name": n, "dtype": "bf16", "shape": [4, 2]}]  # noqa: E731
    bufs = [TensorBuffer("k", kv[:, :, :, 0], axes=axes, sections=sec("k")),
            TensorBuffer("v", kv[:, :, :, 1], axes=axes, sections=sec("v"))]
    g = kvlayout.geometry_from_tensors(bufs, page_size_tokens=2,
                                       memory_layout={"page_unified": {"heads_per_group": 2}})
    assert kvlayout.compare(g, kv_pool({"page_unified": {"heads_per_group": 2}}), "storage") == []
    assert (g.pages, g.heads_per_group) == (5, 2)
    # K and V swapped: V's view sits before K's.
    with pytest.raises(kvlayout.TensorMismatch, match="offset_bytes"):
        kvlayout.geometry_from_tensors(bufs[::-1], page_size_tokens=2,
                                       memory_layout={"page_unified": {"heads_per_group": 2}})
    # The same bytes read with one group of 4: the group stride is not the layout's.
    with pytest.raises(kvlayout.TensorMismatch, match="strides"):
        kvlayout.geometry_from_tensors(bufs, page_size_tokens=2,
                                       memory_layout={"page_unified": {"heads_per_group": 1}})


def test_describe_and_totals_take_kv_layout():
    # DeepSeek-V4-Flash (models/tests/deepseek_v4.rs): trtllm's record 448 + 64 e4m3 = 512 B,
    # flashmla's 584 B (padded pages). swa: 43 layers x 128-token window.
    trt = kvlayout.totals("deepseek-v4-flash", kv_layout="trtllm")
    assert trt["window_bytes_per_request_max"] == 512 * 43 * 128 == 2_818_048
    # c4_kv 512 x 21 / 4 = 2,688; c4_index_k 132 x 21 / 4 = 693; c128_kv 512 x 20 / 128 = 80;
    # c4_state 8,192 x 21 / 32 = 5,376; c4_index_state 2,048 x 21 / 32 = 1,344.
    assert trt["compressed_bytes_per_token"] == 2_688 + 693 + 80 + 5_376 + 1_344 == 10_181
    flash = kvlayout.totals("deepseek-v4-flash", kv_layout="flashmla")
    assert flash == kvlayout.totals("deepseek-v4-flash")
    assert flash["compressed_bytes_per_token"] == 10_570.25
    g = kvlayout.describe("deepseek-v4-flash", kv_layout="trtllm")
    swa = next(b for b in g.buffers if b["name"] == "swa")
    # 256 tokens x 512 B, no padding.
    assert (swa["bytes_per_token"], swa["page_stride_bytes"]) == (512, 131_072)
    for call in (kvlayout.describe, kvlayout.totals):
        with pytest.raises(kvlayout.InvalidGeometry, match="kv_layout.*not DeepSeek-V4"):
            call("llama-3.1-8b", kv_layout="trtllm")
        with pytest.raises(kvlayout.InvalidGeometry, match="kv_layout.*expected"):
            call("deepseek-v4-flash", kv_layout="cutlass")
