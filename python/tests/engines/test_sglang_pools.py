"""kvlayout's SGLang adapter on SGLang 0.5.23's own pools (sglang_build.py builds them on the CPU).

Every geometry is checked against the tensors' own sizes and strides, with the arithmetic written
out (``row_bytes`` reads ``stride(0) x element_size()``), never against the adapter's output;
each correct device/host pair builds a ``TransferGuard``; each mismatched pair is refused.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import kvlayout
from kvlayout.adapters import sglang as kvl

warnings.filterwarnings("ignore", category=UserWarning)
from conftest import row_bytes  # noqa: E402
from sglang_build import (  # noqa: E402
    MHATokenToKVPoolMXFP8,
    MLATokenToKVPoolFP4,
    dsa,
    env,
    indexer_host,
    mha,
    mha_host,
    mla,
    mla_host,
)

MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_unified"]
INDEX_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def buf(g, name):
    return next(b for b in g.buffers if b["name"] == name)


def assert_pair(device, host, **kw):
    """The pair's geometries agree, a guard builds, the item sizes match, and a host page past
    the host's pages is refused (host pages counted from the host tensors by the caller)."""
    dev_g = kvl.device_geometry(device)
    host_g = kvl.host_geometry(host, device_pool=device, **kw)
    assert kvlayout.compare(dev_g, host_g) == []
    guard = kvl.transfer_guard(device, host, **kw)
    kvl.check_item_sizes(device, host, **kw)
    guard.check_pages("load", 0, [host_g.pages - 1, 0], [dev_g.pages - 1, 1])
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("load", 0, [host_g.pages], [0])
    assert e.value.kind == "page_out_of_range"
    return dev_g, host_g


# ---- MHA -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,itemsize,file_dtype", [
    (torch.bfloat16, 2, "bf16"), (torch.float16, 2, "f16"), (torch.float8_e4m3fn, 1, "f8e4m3")])
def test_mha_device(dtype, itemsize, file_dtype):
    pool = mha(dtype)
    g = kvl.device_geometry(pool)
    k = pool.k_buffer[0]
    # [size + page_size, heads, head_dim] = [448 + 64, 2, 64]; 2 heads x 64 x itemsize per token.
    assert tuple(k.shape) == (512, 2, 64)
    assert row_bytes(k) == 2 * 64 * itemsize
    for side in ("k", "v"):
        b = buf(g, side)
        assert b["bytes_per_token"] == row_bytes(k) == 2 * 64 * itemsize
        assert b["page_stride_bytes"] == 64 * row_bytes(k)
        assert b["layers"] == len(pool.k_buffer) == 2
        assert b["sections"][0]["dtype"] == file_dtype
    assert g.pages == k.shape[0] // 64 == 8


@pytest.mark.parametrize("layout", MHA_LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_mha_host_pairs(layout, dtype):
    device = mha(dtype)
    host = mha_host(device, layout)
    # SGLang keeps no device pool on the host and stores fp8 as uint8: the pairing gives meaning.
    assert not hasattr(host, "device_pool")
    _, host_g = assert_pair(device, host)
    # the host tensor's bytes: 2 (K, V) x host tokens x 2 layers x 2 heads x 64 x itemsize.
    kv = host.kv_buffer
    per_token = 2 * 64 * kv.element_size()
    assert buf(host_g, "k")["bytes_per_token"] == per_token == host.token_stride_size
    assert host_g.pages == host.page_num == kv.numel() // (2 * 2 * per_token // kv.element_size()) // 64
    # SGLang's page_head ([page][head][token][layer][dim]) is kvlayout's page_head_token.
    assert host_g.memory_layout == {"page_head": "page_head_token"}.get(layout, layout)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_mha_page_head_host_placement_is_the_tensors(dtype):
    """SGLang's ``page_head`` host (``pool_host/mha.py``: ``(2, page_num, head_num, page_size,
    layer_num, head_dim)``): every step of kvlayout's placement is a stride of the tensor."""
    device = mha(dtype)
    host = mha_host(device, "page_head")
    kv = host.kv_buffer
    item = kv.element_size()
    assert tuple(kv.shape) == (2, host.page_num, 2, 64, 2, 64)
    s = [x * item for x in kv.stride()]  # K|V, page, head, token, layer, dim
    # By hand: dim item; layer 64 x item; token 2 layers x 64 x item; head 64 tokens; page 2 heads.
    row = 64 * item
    assert s[1:] == [2 * 64 * 2 * row, 64 * 2 * row, 2 * row, row, item]
    _, host_g = assert_pair(device, host)
    k, v = (r["buffers"][0] for r in host_g.regions())
    for b in (k, v):
        assert (b["page_step_bytes"], b["head_step_bytes"], b["layer_step_bytes"]) == (s[1], s[2], s[4])
        assert (b["heads"], b["runs"], b["run_bytes"], b["run_step_bytes"]) == (2, 64, row, s[3])
    # kvlayout's page_head ([page][head][layer][token], vLLM's BHLNC) is not this tensor.
    with pytest.raises(kvlayout.TensorMismatch, match="strides"):
        from kvlayout.tensors import TensorBuffer, check_pieces
        bufs = [TensorBuffer(n, kv[i], axes=("page", "head", "page_token", "layer", "dim"),
                             sections=[{"name": n, "dtype": "bf16", "shape": [2, 64]}])
                for i, n in enumerate("kv")]
        check_pieces(host_g.mirror(host_g.pages, memory_layout="page_head"), bufs)


def test_mha_fp8_host_without_its_device_is_refused_naming_the_fix():
    device = mha(torch.float8_e4m3fn)
    host = mha_host(device, "page_first")
    assert host.kv_buffer.dtype == torch.uint8
    with pytest.raises(kvlayout.KvLayoutError, match="uint8 storage .* pass device_pool="):
        kvl.host_geometry(host)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_mha_page_unified_host(dtype, groups):
    """SGLang's ``page_unified`` host (``pool_host/page_unified.py``): ``kv_buffer`` of shape
    ``(page_num, head_group_num, layer_num, 2, page_size, heads_per_group, head_dim)``, read as
    kvlayout's ``page_unified`` with ``heads_per_group = head_num // head_group_num``. The
    placement is checked against the tensor's own strides; fp8 through the paired device pool."""
    device = mha(dtype)
    host = mha_host(device, "page_unified", head_group_num=groups)
    kv = host.kv_buffer
    item = kv.element_size()
    per_group = 2 // groups
    assert tuple(kv.shape) == (host.page_num, groups, 2, 2, 64, per_group, 64)
    dev_g, host_g = assert_pair(device, host)
    assert host_g.memory_layout == "page_unified" and host_g.heads_per_group == per_group
    strides = [s * item for s in kv.stride()]  # page, group, layer, K|V, token, head, dim
    # By hand: a token's group row per_group x 64 x item; a (group, layer) cell K then V of 64
    # tokens; a group all 2 layers' cells; a page every group.
    row = per_group * 64 * item
    assert strides[4:] == [row, 64 * item, item]
    assert strides[:4] == [groups * 2 * 2 * 64 * row, 2 * 2 * 64 * row, 2 * 64 * row, 64 * row]
    (region,) = host_g.regions()
    k, v = region["buffers"]
    for b in (k, v):
        assert (b["page_step_bytes"], b["head_step_bytes"], b["layer_step_bytes"]) == tuple(strides[:3])
        assert (b["heads"], b["run_bytes"]) == (groups, 64 * strides[4])
    assert v["offset_bytes"] - k["offset_bytes"] == strides[3]
    assert region["len_bytes"] == kv.numel() * item
    assert host_g.pages == host.page_num == kv.shape[0]


def test_mha_page_unified_mismatches_refused():
    device = mha()
    # A host from another device (fp16 vs bf16): the pairing lists the dtype of K and V.
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.transfer_guard(device, mha_host(mha(torch.float16), "page_unified", head_group_num=2))
    assert any(line.startswith("k.sections[0].dtype") for line in e.value.lines), e.value.lines
    # head_group_num that contradicts the tensor: the strides say 2 groups of 1 head.
    host = mha_host(device, "page_unified", head_group_num=2)
    host.head_group_num = 1
    with pytest.raises(kvlayout.TensorMismatch, match="strides"):
        kvl.host_geometry(host, device_pool=device)
    # A page_unified geometry at the storage level differs from page_first_direct's and from
    # another group size: the same page bytes are not the same stored object.
    other = kvl.host_geometry(mha_host(device, "page_unified", head_group_num=1), device_pool=device)
    two = kvl.host_geometry(mha_host(device, "page_unified", head_group_num=2), device_pool=device)
    assert kvlayout.compare(other, two) == []
    assert kvlayout.compare(other, two, "storage") == [
        "memory_layout: page_unified (2 heads per group), page_unified (1 heads per group)"]


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_asymmetric_mha_host(layout):
    device = mha(v_head_dim=32)
    host = mha_host(device, layout)
    assert type(host).__name__ == "AsymmetricMHATokenToKVPoolHost"
    k, v = host.kv_buffer
    dev_g, host_g = assert_pair(device, host)
    # K 2 heads x 64 x 2 B = 256 B/token, V 2 x 32 x 2 = 128 B/token.
    assert buf(host_g, "k")["bytes_per_token"] == 2 * 64 * 2 == k.shape[-1] * k.shape[-2] * 2
    assert buf(host_g, "v")["bytes_per_token"] == 2 * 32 * 2 == v.shape[-1] * v.shape[-2] * 2
    assert buf(dev_g, "v")["bytes_per_token"] == row_bytes(device.v_buffer[0]) == 128


@pytest.mark.parametrize("layout", ["page_head", "page_unified"])
def test_asymmetric_mha_host_layouts_sglang_refuses(layout):
    """Documented refusal: SGLang itself builds no asymmetric host in these layouts."""
    device = mha(v_head_dim=32)
    with pytest.raises((ValueError, NotImplementedError)):
        mha_host(device, layout)


def test_hnd_device_pool():
    with env("SGLANG_USE_HND_KVCACHE", "1"):
        pool = mha()
    k = pool.k_buffer[0]
    # [pages, heads, page_size, head_dim] = [8, 2, 64, 64]: heads outside the page's tokens.
    assert tuple(k.shape) == (8, 2, 64, 64) and pool.use_hnd
    g = kvl.device_geometry(pool)
    b = buf(g, "k")
    assert b["arrangement"] == "head_major"
    assert b["page_stride_bytes"] == k.stride(0) * k.element_size() == 2 * 64 * 64 * 2
    assert b["bytes_per_token"] == 2 * 64 * 2
    assert g.pages == 8
    # An NHD device of the same model holds the same bytes per page in another order.
    nhd = kvl.device_geometry(mha())
    assert kvlayout.compare(g, nhd) == ["k.arrangement: head_major, token_major",
                                        "v.arrangement: head_major, token_major"]


def test_hnd_device_vs_nhd_host_refused():
    """SGLang builds a host for an HND device without complaint; its rows are token slots."""
    with env("SGLANG_USE_HND_KVCACHE", "1"):
        device = mha()
    host = mha_host(device, "layer_first")
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.transfer_guard(device, host)
    assert "k.arrangement: head_major, token_major" in e.value.lines
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.check_item_sizes(device, host)
    # device rows: one page of one head = 64 x 64 x 2 = 8192 B apart; host: 2 x 64 x 2 = 256.
    assert e.value.lines[0] == ("k.item_size_bytes: device 16384 (k_buffer[0] row stride), "
                                "host 256 (token_stride_size)")


def test_mxfp8_device_page_64_flat_scales():
    pool = mha(torch.float8_e4m3fn, cls=MHATokenToKVPoolMXFP8)
    g = kvl.device_geometry(pool)
    s = pool.k_scale_buffer[0]
    # one ue8m0 scale per 32 of 64 dims: [512, 2 heads, 2] x 1 B = 4 B/token.
    assert tuple(s.shape) == (512, 2, 2) and s.dtype == torch.float8_e8m0fnu
    assert buf(g, "k_scale")["bytes_per_token"] == 2 * 64 // 32 == row_bytes(s)
    assert buf(g, "k")["bytes_per_token"] == 2 * 64 == row_bytes(pool.k_buffer[0])


def test_mxfp8_device_page_128_interleaved_scales():
    pool = mha(torch.float8_e4m3fn, cls=MHATokenToKVPoolMXFP8, page=128, size=384)
    assert pool.mxfp8_sf_interleaved
    s = pool.k_scale_buffer[0]
    # [pages, heads, 32, page_size // 32, head_dim // 32] = [4, 2, 32, 4, 2]: 512 B per page.
    assert tuple(s.shape) == (4, 2, 32, 4, 2)
    g = kvl.device_geometry(pool)
    b = buf(g, "k_scale")
    assert b["page_stride_bytes"] == s.stride(0) * s.element_size() == 2 * 32 * 4 * 2
    assert b["bytes_per_token"] == 2 * 2
    assert b["arrangement"] == "head_major"
    assert b["sections"][0]["order"] == kvl.MXFP8_INTERLEAVED_ORDER
    assert g.pages == 4 == pool.k_buffer[0].shape[0] // 128


@pytest.mark.parametrize("page,size", [(64, 448), (128, 384)])
def test_mxfp8_host_sglang_cannot_build_on_cpu(page, size):
    """Documented refusal: SGLang's MHATokenToKVPoolMXFP8Host refuses the flat page-64 scales
    ("KV scale layout 'token'") and at page 128 needs the CUDA JIT write-back kernel."""
    device = mha(torch.float8_e4m3fn, cls=MHATokenToKVPoolMXFP8, page=page, size=size)
    with pytest.raises(Exception) as e:
        mha_host(device, "page_first")
    assert type(e.value).__name__ in ("ValueError", "RuntimeError", "AssertionError", "NotImplementedError")


# ---- mismatched MHA pairs --------------------------------------------------------------------

def test_fp16_device_vs_bf16_host_refused():
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.transfer_guard(mha(torch.float16), mha_host(mha(torch.bfloat16), "page_first"))
    assert "k.sections[0].dtype: f16, bf16" in e.value.lines


def test_layer_and_head_count_mismatches_refused():
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.transfer_guard(mha(layers=3), mha_host(mha(layers=2), "layer_first"))
    assert "k.layers: 3, 2" in e.value.lines
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.check_item_sizes(mha(heads=4), mha_host(mha(heads=2), "layer_first"))
    # 4 heads x 64 x 2 B = 512 B rows on the device, 2 x 64 x 2 = 256 B on the host.
    assert e.value.lines[0] == ("k.item_size_bytes: device 512 (k_buffer[0] row stride), host "
                                "256 (token_stride_size)")


# ---- MLA, DSA, FP4 ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", MLA_LAYOUTS)
@pytest.mark.parametrize("dtype,itemsize", [(torch.bfloat16, 2), (torch.float8_e4m3fn, 1)])
def test_mla_pairs(layout, dtype, itemsize):
    device = mla(dtype)
    t = device.kv_buffer[0]
    assert tuple(t.shape) == (512, 1, 576) and row_bytes(t) == 576 * itemsize
    host = mla_host(device, layout)
    dev_g, host_g = assert_pair(device, host)
    assert buf(dev_g, "kv")["bytes_per_token"] == (512 + 64) * itemsize
    assert host_g.pages == host.page_num
    # page_unified's MLA page (page, layer, page_size, dim) is page_first_direct's byte order.
    assert host_g.memory_layout == ("page_first_direct" if layout == "page_unified" else layout)


@pytest.mark.parametrize("layout", INDEX_LAYOUTS)
@pytest.mark.parametrize("dtype,dim", [(torch.float8_e4m3fn, 656), (torch.bfloat16, 576)])
def test_dsa_with_indexer_host(layout, dtype, dim):
    device = dsa(dtype, kv_cache_dim=dim)
    host = mla_host(device, layout)
    indexer = indexer_host(device, host)
    dev_g, host_g = assert_pair(device, host, indexer=indexer)
    kv, idx = device.kv_buffer[0], device.index_k_with_scale_buffer[0]
    # FlashMLA fp8 row: 512 e4m3 + 512 / 128 x 4 B scales + 64 x 2 B bf16 RoPE = 656 B;
    # bf16: (512 + 64) x 2 = 1152 B.
    assert buf(dev_g, "kv")["bytes_per_token"] == row_bytes(kv) == (656 if dim == 656 else 1152)
    # index-K: 128 e4m3 keys + 128 / 128 x 4 B f32 scale = 132 B per token, 64 per page.
    assert buf(dev_g, "index_k")["bytes_per_token"] == 132
    assert buf(dev_g, "index_k")["page_stride_bytes"] == row_bytes(idx) == 64 * 132
    assert indexer.indexer_page_stride_size == 64 * 132
    assert dev_g.buffers[1]["layers"] == buf(host_g, "index_k")["layers"] == 3


def test_dsa_index_kpool_2():
    device = dsa(index_kpool=2, page=128)
    idx = device.index_k_with_scale_buffer[0]
    # one key per 2 tokens: 128 // 2 = 64 keys of 132 B per 128-token page = 8448 B.
    assert device.index_page_size == 64 and row_bytes(idx) == 64 * 132
    host = mla_host(device, "page_first")
    indexer = indexer_host(device, host)
    dev_g, host_g = assert_pair(device, host, indexer=indexer)
    b = buf(dev_g, "index_k")
    assert b["page_size_tokens"] == 64 and b["bytes_per_token"] == 132
    assert b["page_stride_bytes"] == 8448


def test_dsa_61_layers_equals_describe():
    device = dsa(layers=61)
    assert kvlayout.compare(kvl.device_geometry(device),
                            kvlayout.describe("deepseek-v3.2-exp", index_k="fp8")) == []


def test_dsa_without_indexer_refused():
    device = dsa(torch.bfloat16, kv_cache_dim=576)
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.transfer_guard(device, mla_host(device, "page_first"))
    assert e.value.lines[0].startswith("index_k: present (132 B/token")


def test_dsa_3_layers_vs_2_layer_host_refused():
    other = dsa(layers=2)
    host = mla_host(other, "page_first")
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.transfer_guard(dsa(layers=3), host, indexer=indexer_host(other, host))
    assert {"kv.layers: 3, 2", "index_k.layers: 3, 2"} <= set(e.value.lines)


def test_mla_fp8_device_vs_bf16_host_refused():
    with pytest.raises(kvlayout.Incompatible) as e:
        kvl.transfer_guard(mla(torch.float8_e4m3fn), mla_host(mla(torch.bfloat16), "page_first"))
    assert "kv.bytes_per_token: 576, 1152" in e.value.lines


def test_fp4_mla_device():
    pool = mla(torch.float4_e2m1fn_x2, cls=MLATokenToKVPoolFP4)
    kv, sc = pool.kv_buffer[0], pool.kv_scale_buffer[0]
    # 576 e2m1 values, two per byte: 288 B; one ue8m0 scale per 16 values: 576 / 16 = 36 B.
    assert tuple(kv.shape) == (512, 1, 288) and tuple(sc.shape) == (512, 36)
    g = kvl.device_geometry(pool)
    assert buf(g, "kv")["bytes_per_token"] == row_bytes(kv) == 576 // 2
    assert buf(g, "kv_scale")["bytes_per_token"] == row_bytes(sc) == 576 // 16
    assert [s["dtype"] for s in buf(g, "kv")["sections"]] == ["f4e2m1", "f4e2m1"]


def test_fp4_mla_host_sglang_refuses():
    """Documented refusal: SGLang's MLA host "does not support target FP4 KV"."""
    pool = mla(torch.float4_e2m1fn_x2, cls=MLATokenToKVPoolFP4)
    with pytest.raises(ValueError, match="FP4"):
        mla_host(pool, "layer_first")
