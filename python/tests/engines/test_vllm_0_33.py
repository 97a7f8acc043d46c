"""kvlayout's vLLM adapter on vLLM 0.33.0's own KV caches (vllm_build.py: vLLM's config, spec,
planning and ``allocate_kv_cache`` code on the CPU). Each geometry is checked against the
tensors' own sizes and strides and ``KVCacheTensor``'s, with the arithmetic written out."""

from __future__ import annotations

import warnings

import pytest
import torch

import kvlayout
from kvlayout.adapters import vllm as kvl

warnings.filterwarnings("ignore", category=UserWarning)
import vllm  # noqa: E402
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    SparseCacheRole,
)

from vllm_build import BLOCKS, allocate, attn, full, vllm_config  # noqa: E402

assert vllm.__version__ == "0.33.0", vllm.__version__


def buf(g, name):
    return next(b for b in g.buffers if b["name"] == name)


def layout_of(vc):
    return vc.cache_config.kv_cache_layout


@pytest.mark.parametrize("layout,memory_layout,arrangement", [
    ("LBNHC", "layer_first", "token_major"), ("LBHNC", "layer_first", "head_major"),
    ("BLNHC", "page_first", "token_major"), ("BLHNC", "page_first", "head_major")])
def test_dense_attention_layouts(tmp_path, layout, memory_layout, arrangement):
    vc = vllm_config(tmp_path, layout)
    cfg, kv = allocate(vc, {attn(0): full(), attn(1): full()})
    t = kv[attn(0)]
    # [B, H, N, C] = [10 blocks, 2 heads, 16 tokens, 64 K + 64 V]; a block: 16 x 2 x 128 x 2 B.
    assert tuple(t.shape) == (10, 2, 16, 128)
    page = 16 * 2 * 128 * 2
    (kt,) = cfg.kv_cache_tensors
    assert kt.size == 2 * BLOCKS * page
    g = kvl.geometry(kv, cfg, kv_cache_layout=layout_of(vc))
    b = buf(g, "kv")
    assert b["bytes_per_token"] == 2 * (64 + 64) * 2 == page // 16
    assert b["page_stride_bytes"] == page
    assert b["arrangement"] == arrangement and g.memory_layout == memory_layout
    assert b["layers"] == 2 and g.pages == BLOCKS
    # the block stride vLLM placed: the page, or (block-outermost) both layers' pages.
    assert kt.block_stride == t.stride(0) * t.element_size() == (page if memory_layout == "layer_first" else 2 * page)
    assert g.total_bytes == kt.size == kvl.allocated_bytes(kv)


@pytest.mark.parametrize("layout,memory_layout,steps", [
    # (block, head, layer) steps by hand, a block of one head 16 tokens x 128 x 2 B = 4096 B:
    # LHBNC [L][H][B][N][C]: block 4096, head 10 blocks x 4096, layer 2 heads x 40960;
    # BHLNC [B][H][L][N][C]: layer 4096, head 2 layers x 4096, block 2 heads x 8192.
    ("LHBNC", "layer_head", (4096, 40960, 81920)),
    ("BHLNC", "page_head", (16384, 8192, 4096))])
def test_heads_outside_block_layouts(tmp_path, layout, memory_layout, steps):
    vc = vllm_config(tmp_path, layout)
    cfg, kv = allocate(vc, {attn(0): full(), attn(1): full()})
    t = kv[attn(0)]
    e = t.element_size()
    assert tuple(t.shape) == (10, 2, 16, 128)
    (kt,) = cfg.kv_cache_tensors
    # The tensors' own strides and KVCacheTensor's layer stride are the steps worked above.
    assert (t.stride(0) * e, t.stride(1) * e, kt.layer_stride) == steps
    assert kv[attn(1)].data_ptr() - t.data_ptr() == kt.layer_stride
    g = kvl.geometry(kv, cfg, kv_cache_layout=layout_of(vc))
    assert g.memory_layout == memory_layout
    b = buf(g, "kv")
    assert b["bytes_per_token"] == 2 * (64 + 64) * 2 and b["arrangement"] == "head_major"
    (region,) = g.regions()
    (p,) = region["buffers"]
    assert (p["page_step_bytes"], p["head_step_bytes"], p["layer_step_bytes"]) == steps
    assert (p["heads"], p["run_bytes"]) == (2, 16 * t.stride(2) * e)
    assert g.total_bytes == kt.size == kvl.allocated_bytes(kv) == 2 * 10 * 2 * 4096
    # A host copy from the same config pairs; one with 4 heads is refused.
    kvl.transfer_guard(kv, kv, cfg, kv_cache_layout=layout)
    cfg4, kv4 = allocate(vllm_config(tmp_path, layout), {attn(0): full(heads=4),
                                                           attn(1): full(heads=4)})
    with pytest.raises(kvlayout.Incompatible):
        kvlayout.TransferGuard(g, kvl.geometry(kv4, cfg4, kv_cache_layout=layout))


@pytest.mark.parametrize("allocated,declared,match", [
    ("LHBNC", "BHLNC", "strides"), ("BHLNC", "LHBNC", "declared layer_head")])
def test_heads_outside_block_declared_wrong_refused(tmp_path, allocated, declared, match):
    vc = vllm_config(tmp_path, allocated)
    cfg, kv = allocate(vc, {attn(0): full(), attn(1): full()})
    with pytest.raises(kvlayout.TensorMismatch, match=match):
        kvl.geometry(kv, cfg, kv_cache_layout=declared)


def test_layout_not_given_is_refused(tmp_path):
    vc = vllm_config(tmp_path)
    cfg, kv = allocate(vc, {attn(0): full(), attn(1): full()})
    assert cfg.kv_cache_layout is None
    with pytest.raises(kvlayout.KvLayoutError, match="no kv_cache_layout"):
        kvl.geometry(kv, cfg)
    cfg.kv_cache_layout = "LBNHC"  # what the engine core records on the KVCacheConfig
    assert buf(kvl.geometry(kv, cfg), "kv")["bytes_per_token"] == 512


def test_declared_layout_contradicting_strides_refused(tmp_path):
    vc = vllm_config(tmp_path, "LBHNC")
    cfg, kv = allocate(vc, {attn(0): full(), attn(1): full()})
    with pytest.raises(kvlayout.TensorMismatch, match="declared LBNHC"):
        kvl.geometry(kv, cfg, kv_cache_layout="LBNHC")


def test_fp8(tmp_path):
    vc = vllm_config(tmp_path, cache_dtype="fp8")
    cfg, kv = allocate(vc, {attn(i): full(dtype=torch.uint8) for i in range(2)})
    assert kv[attn(0)].dtype == torch.uint8
    g = kvl.geometry(kv, cfg, kv_cache_dtype="fp8", kv_cache_layout="LBNHC")
    assert buf(g, "kv")["bytes_per_token"] == 2 * 128 * 1
    assert buf(g, "kv")["sections"][0]["dtype"] == "f8e4m3"


def test_sliding_window_hybrid_aliased_groups(tmp_path):
    vc = vllm_config(tmp_path)
    swa = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16,
                            sliding_window=128)
    cfg, kv = allocate(vc, {attn(0): swa, attn(1): full(), attn(2): swa, attn(3): full()})
    g = kvl.geometry(kv, cfg, kv_cache_layout="LBNHC")
    assert buf(g, "swa")["layer_ids"] == [0, 2] and buf(g, "full")["layer_ids"] == [1, 3]
    assert buf(g, "swa")["attention"] == {"sliding_window_tokens": 128}
    # The two groups overlay one allocation: layer 0 and layer 1 start at the same byte.
    assert kv[attn(0)].data_ptr() == kv[attn(1)].data_ptr()
    page = 16 * 2 * 128 * 2
    assert {t.size for t in cfg.kv_cache_tensors} == {2 * BLOCKS * page}
    assert kvl.allocated_bytes(kv) == 2 * BLOCKS * page
    assert g.total_bytes == 2 * kvl.allocated_bytes(kv)  # the buffers as if disjoint


def test_chunked_local(tmp_path):
    vc = vllm_config(tmp_path)
    ch = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                                   dtype=torch.bfloat16, attention_chunk_size=64)
    cfg, kv = allocate(vc, {attn(0): ch, attn(1): full()})
    g = kvl.geometry(kv, cfg, kv_cache_layout="LBNHC")
    assert buf(g, "chunked")["attention"] == {"chunk_tokens": 64}


def test_mla_bf16(tmp_path):
    vc = vllm_config(tmp_path)
    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    cfg, kv = allocate(vc, {attn(0): spec, attn(1): spec})
    t = kv[attn(0)]
    assert tuple(t.shape) == (10, 1, 64, 576)
    g = kvl.geometry(kv, cfg, kv_cache_layout="LBNHC")
    # 576 x 2 B = 1152 B per token, 64 tokens a block.
    assert buf(g, "kv")["bytes_per_token"] == 1152 == t.stride(2) * t.element_size()
    assert buf(g, "kv")["page_stride_bytes"] == 64 * 1152 == t.stride(0) * t.element_size()


def dsv32_specs(cache):
    if cache == "fp8_ds_mla":
        mla = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.uint8,
                               cache_dtype_str="fp8_ds_mla", state_content_bytes=656)
    else:
        mla = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    idx = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype=torch.uint8,
                           cache_role=SparseCacheRole.INDEXER)
    specs = {}
    for i in range(2):
        specs[attn(i)] = mla
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = idx
    return specs


@pytest.mark.parametrize("cache,row", [("fp8_ds_mla", 656), ("auto", 1152)])
def test_deepseek_v32_with_indexer(tmp_path, cache, row):
    vc = vllm_config(tmp_path)
    cfg, kv = allocate(vc, dsv32_specs(cache))
    a, i = kv[attn(0)], kv["model.layers.0.self_attn.indexer.k_cache"]
    # fp8_ds_mla: 512 e4m3 + 4 f32 scales + 64 bf16 = 656 B; indexer 128 e4m3 + 1 f32 = 132 B.
    assert a.shape[-1] * a.element_size() == row and tuple(i.shape) == (10, 1, 64, 132)
    g = kvl.geometry(kv, cfg, kv_cache_layout="LBNHC")
    assert buf(g, "kv")["bytes_per_token"] == row
    assert buf(g, "index_k")["bytes_per_token"] == 132
    assert buf(g, "index_k")["page_stride_bytes"] == 64 * 132 == i.stride(0)
    # the indexer's KVCacheTensor sits after the MLA layers in the one allocation.
    kt = [t for t in cfg.kv_cache_tensors if "indexer" in t.layers[0]][0]
    assert kt.offset == 2 * BLOCKS * 64 * row and kt.layer_stride == BLOCKS * 64 * 132


def test_deepseek_v32_fp8_equals_describe_per_token(tmp_path):
    vc = vllm_config(tmp_path)
    cfg, kv = allocate(vc, dsv32_specs("fp8_ds_mla"))
    g = kvl.geometry(kv, cfg, kv_cache_layout="LBNHC")
    d = kvlayout.describe("deepseek-v3.2-exp", index_k="fp8")
    assert [s["dtype"] for s in buf(g, "kv")["sections"]] == [s["dtype"] for s in buf(d, "kv")["sections"]]
    assert buf(g, "index_k")["sections"] == buf(d, "index_k")["sections"]


def test_qwen3_next_mamba_raw_tensors(tmp_path):
    vc = vllm_config(tmp_path)
    conv, temporal = MambaStateShapeCalculator.gated_delta_net_state_shape(1, 2, 4, 32, 32, 4)
    dtypes = (torch.bfloat16, torch.bfloat16)
    specs = {f"model.layers.{i}.linear_attn": MambaSpec(
        block_size=64, shapes=(conv, temporal), dtypes=dtypes, page_size_padded=32768)
        for i in range(3)}
    specs[attn(3)] = FullAttentionSpec(block_size=64, num_kv_heads=2, head_size=64,
                                       dtype=torch.bfloat16)
    cfg, kv = allocate(vc, specs)
    raw = kv["model.layers.0.linear_attn"]
    # one raw int8 [B, 1, 1, C] per Mamba layer; C = conv + temporal state bytes:
    conv_bytes = conv[0] * conv[1] * 2
    temporal_bytes = temporal[0] * temporal[1] * temporal[2] * 2
    assert raw.dtype == torch.int8 and tuple(raw.shape) == (10, 1, 1, conv_bytes + temporal_bytes)
    assert raw.stride(0) == 32768  # padded block
    g = kvl.geometry(kv, cfg, kv_cache_layout="LBNHC")
    s0, s1 = buf(g, "state.state0"), buf(g, "state.state1")
    assert s0["bytes_per_token"] == conv_bytes and s1["bytes_per_token"] == temporal_bytes
    assert s0["page_stride_bytes"] == 32768 and s0["attention"] == "state"
    assert buf(g, "full")["page_stride_bytes"] == 64 * 2 * 128 * 2 == 32768
    # every group overlays the one allocation of 10 blocks x 32768 B.
    assert kvl.allocated_bytes(kv) == {t.size for t in cfg.kv_cache_tensors}.pop() == 10 * 32768


def test_tp2_ranks_compare_with_tp1_at_token_level(tmp_path):
    vc = vllm_config(tmp_path)
    cfg1, kv1 = allocate(vc, {attn(0): full(heads=2), attn(1): full(heads=2)})
    cfg2, kv2 = allocate(vc, {attn(0): full(heads=1), attn(1): full(heads=1)})
    g1 = kvl.geometry(kv1, cfg1, kv_cache_layout="LBNHC", tp=1, rank=0)
    for r in (0, 1):
        g2 = kvl.geometry(kv2, cfg2, kv_cache_layout="LBNHC", tp=2, rank=r)
        kvlayout.check(g1, g2, level="token")
        assert kvlayout.compare(g1, g2) != []


def test_mismatched_pairs_refused(tmp_path):
    vc = vllm_config(tmp_path)
    cfg_a, kv_a = allocate(vc, {attn(0): full(), attn(1): full()})
    cfg_b, kv_b = allocate(vc, {attn(0): full(head=128), attn(1): full(head=128)})
    with pytest.raises(kvlayout.Incompatible) as e:
        kvlayout.TransferGuard(kvl.geometry(kv_a, cfg_a, kv_cache_layout="LBNHC"),
                               kvl.geometry(kv_b, cfg_b, kv_cache_layout="LBNHC"))
    assert "kv.bytes_per_token: 512, 1024" in e.value.lines
    guard = kvl.transfer_guard(kv_a, kv_a, cfg_a, kv_cache_layout="LBNHC")
    guard.check_pages("load", 0, [9, 0], [0, 9])


def test_view_not_where_kv_cache_tensor_says_refused(tmp_path):
    vc = vllm_config(tmp_path)
    cfg, kv = allocate(vc, {attn(0): full(), attn(1): full()})
    (kt,) = cfg.kv_cache_tensors
    # layer 1 starts 10 blocks x 8192 B = 81920 B after layer 0; a config claiming 40960 B lies.
    assert kt.layer_stride == 81920
    kt.layer_stride = 40960
    with pytest.raises(kvlayout.TensorMismatch, match="puts layer model.layers.1.self_attn.attn at "
                       "40960 B, its view starts at 81920 B"):
        kvl.geometry(kv, cfg, kv_cache_layout="LBNHC")
