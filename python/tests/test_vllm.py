"""kvlayout.adapters.vllm against fake register_kv_caches tensors and KV cache specs (vLLM
0.20's shapes).

What vLLM's own allocation reaches runs on real caches in python/tests/engines
(test_vllm_0_33.py, test_vllm_0_20.py: FlashAttention NHD/HND, MLA, DeepSeek-V3.2 with its
indexer, hybrids, Mamba, TP ranks). What stays here cannot be built there on the CPU: pools at
a full model's size compared with ``kvlayout describe`` (Llama-3.1-8B's 32 layers, 24 merged
sliding-window layers), specs that contradict the tensors or a host missing a Mamba state
(vLLM allocates the tensors from the specs), and argument checks (``rank`` past ``tp``)."""

from __future__ import annotations

import pytest

import kvlayout

np = pytest.importorskip("numpy", reason="numpy not installed: fake caches need it")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed: bf16 arrays need it")

import fakes  # noqa: E402
from kvlayout.adapters import vllm  # noqa: E402

LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(4)]


def test_flashinfer_layout_equals_the_cli_mha_description():
    # Llama-3.1-8B: 32 layers, 8 KV heads x 128, bf16; FlashInfer's block = [K plane][V plane]
    s = fakes.spec(block_size=64)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(32)]
    caches = {n: fakes.flashinfer_cache(4, s) for n in names}
    g = vllm.geometry(caches, {n: s for n in names})
    assert g.fingerprint == kvlayout.describe("llama-3.1-8b").fingerprint
    assert g.bytes_per_token == 32 * 2 * 8 * 128 * 2


def test_hybrid_groups_keep_windows_and_layer_ids():
    # gpt-oss style: full attention on even layers, sliding window 128 on odd layers
    full = fakes.spec(fakes.FullAttentionSpec, num_kv_heads=8, head_size=64)
    swa = fakes.spec(fakes.SlidingWindowSpec, num_kv_heads=8, head_size=64, sliding_window=128)
    even, odd = LAYERS[0::2], LAYERS[1::2]
    caches = {n: fakes.flashinfer_cache(6, full) for n in LAYERS}
    g = vllm.geometry(caches, fakes.kv_cache_config(6, [(even, full), (odd, swa)]))
    by = {b["name"]: b for b in g.buffers}
    # named as `kvlayout describe` names gpt-oss's buffers: full, swa
    assert by["full"]["layer_ids"] == [0, 2] and by["swa"]["layer_ids"] == [1, 3]
    assert by["swa"]["attention"] == {"sliding_window_tokens": 128}
    assert "attention" not in by["full"] or by["full"]["attention"] == "full"
    # the decode side forgot the sliding group: one buffer missing
    g_full = vllm.geometry({n: caches[n] for n in even}, fakes.kv_cache_config(6, [(even, full)]))
    assert any(line.startswith("swa") for line in kvlayout.compare(g, g_full))


def dsv32_layers():
    """DeepSeek-V3.2 as vLLM registers it: 61 MLA layers (fp8_ds_mla, 656 B rows) and 61
    indexer layers (132 B rows), 4 blocks of 64 tokens: specs, layer names and caches."""
    mla = fakes.spec(fakes.MLAAttentionSpec, block_size=64, num_kv_heads=1, head_size=576,
                     dtype=np.uint8, cache_dtype_str="fp8_ds_mla")
    idx = fakes.spec(fakes.MLAAttentionSpec, block_size=64, num_kv_heads=1, head_size=132,
                     dtype=np.uint8)
    attn = [f"model.layers.{i}.self_attn.attn" for i in range(61)]
    indexer = [f"model.layers.{i}.self_attn.indexer.k_cache" for i in range(61)]
    caches = {n: np.zeros((4, 64, 656), np.uint8) for n in attn}
    caches.update({n: np.zeros((4, 64, 132), np.uint8) for n in indexer})
    return mla, idx, attn, indexer, caches


def test_tensor_disagreeing_with_spec_is_refused():
    s = fakes.spec(head_size=128)
    wrong = fakes.spec(head_size=64)  # spec says 64, tensors hold 128
    caches = {n: fakes.flashinfer_cache(3, s) for n in LAYERS}
    with pytest.raises(kvlayout.TensorMismatch) as e:
        vllm.geometry(caches, {n: wrong for n in LAYERS})
    assert e.value.field == "kv.bytes_per_token"


def _mamba_states(num_blocks, shapes, dtypes, block_bytes):
    """vLLM's view of one Mamba layer's raw cache: state j is [num_blocks, *shapes[j]] at
    offset sum(previous states' bytes) inside each block of block_bytes."""
    raw = np.zeros(num_blocks * block_bytes, np.uint8)
    out, offset = [], 0
    for shape, dtype in zip(shapes, dtypes):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        view = np.lib.stride_tricks.as_strided(
            raw[offset:].view(np.uint8), shape=(num_blocks, n), strides=(block_bytes, 1))
        out.append(np.lib.stride_tricks.as_strided(
            view.view(dtype), shape=(num_blocks, *shape),
            strides=(block_bytes, *np.zeros(shape, dtype).strides)))
        offset += n
    return out


def test_mamba_state_groups_next_to_attention():
    # Qwen3-Next style: linear-attention layers keep a conv state (3 x 1024 bf16 = 6144 B) and
    # an ssm state (16 x 128 x 128 f32 = 1,048,576 B) per request, padded to the attention page.
    conv, ssm = (3, 1024), (16, 128, 128)
    payload = 3 * 1024 * 2 + 16 * 128 * 128 * 4
    m = fakes.MambaSpec(block_size=1024, shapes=(conv, ssm),
                        dtypes=(np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)),
                        page_size_padded=payload + 1024)
    full = fakes.spec(block_size=64, num_kv_heads=2, head_size=256)
    attn, linear = LAYERS[3:], LAYERS[:3]
    caches = {n: fakes.flashinfer_cache(5, full) for n in attn}
    caches.update({n: _mamba_states(5, (conv, ssm), (ml_dtypes.bfloat16, np.float32), payload + 1024)
                   for n in linear})
    g = vllm.geometry(caches, fakes.kv_cache_config(5, [(attn, full), (linear, m)]))
    by = {b["name"]: b for b in g.buffers}
    assert by["state.state1"]["attention"] == "state"
    assert by["state.state1"]["bytes_per_token"] == 16 * 128 * 128 * 4
    assert by["state.state0"]["page_stride_bytes"] == payload + 1024
    assert g.page_size_tokens == 64  # the attention group's block size, not the Mamba block
    # the host copy forgot the ssm state: refused by name
    host = {n: caches[n] for n in attn}
    host.update({n: caches[n][:1] for n in linear})
    with pytest.raises(kvlayout.KvLayoutError, match="2 state tensors"):
        vllm.geometry(host, fakes.kv_cache_config(5, [(attn, full), (linear, m)]))


def test_uint8_needs_kv_cache_dtype():
    s = fakes.spec(dtype=np.uint8)
    caches = {n: fakes.flashinfer_cache(3, s) for n in LAYERS}
    with pytest.raises(kvlayout.KvLayoutError, match="kv_cache_dtype"):
        vllm.geometry(caches, {n: s for n in LAYERS})
    g = vllm.geometry(caches, {n: s for n in LAYERS}, kv_cache_dtype="fp8")
    assert g.buffers[0]["sections"][0]["dtype"] == "f8e4m3"


def test_tp1_prefill_tp2_decode_compare_at_token_level():
    # Llama-3.1-8B, FlashInfer: TP1 holds 8 KV heads; a TP2 rank holds 8 / 2 = 4.
    names = [f"model.layers.{i}.self_attn.attn" for i in range(32)]
    s1, s2 = fakes.spec(block_size=64), fakes.spec(block_size=64, num_kv_heads=4)
    tp1 = vllm.geometry({n: fakes.flashinfer_cache(4, s1) for n in names}, {n: s1 for n in names},
                        tp=1)
    tp2 = vllm.geometry({n: fakes.flashinfer_cache(4, s2) for n in names}, {n: s2 for n in names},
                        tp=2, rank=1)
    kv = tp2.buffers[0]
    assert kv["shard"] == {"split": "heads", "tp_size": 2, "rank": 1, "heads_total": 4 * 2}
    assert kvlayout.compare(tp1, tp2, level="token") == []
    assert kvlayout.compare(tp1, tp2, level="pool") != []
    # and against the model's own description of that rank: same fingerprint
    assert tp2.fingerprint == kvlayout.describe("llama-3.1-8b", tp=2, rank=1, pages=4).fingerprint
    with pytest.raises(kvlayout.InvalidGeometry) as e:
        vllm.geometry({n: fakes.flashinfer_cache(4, s2) for n in names}, {n: s2 for n in names},
                      tp=2, rank=2)
    assert e.value.field == "rank"


# Regression (hostile review, session 8): vLLM without the hybrid allocator promotes sliding
# window layers to FullAttentionSpec and merges the group's window into sliding_window=128; the
# adapter read that as 24 sliding-window layers, though vLLM allocates blocks for every token.
def test_a_full_attention_spec_with_a_merged_window_keeps_every_token():
    names = [f"model.layers.{i}.self_attn.attn" for i in range(24)]
    merged = fakes.spec(fakes.FullAttentionSpec, num_kv_heads=8, head_size=64, sliding_window=128)
    caches = {n: fakes.flashinfer_cache(10, merged) for n in names}
    g = vllm.geometry(caches, fakes.kv_cache_config(10, [(names, merged)]))
    (kv,) = g.buffers
    assert kv["layers"] == 24
    assert kv.get("attention", "full") == "full"
    # 2 (K, V) x 8 heads x 64 x 2 B = 2,048 B/token/layer
    assert g.bytes_per_token == 24 * 2 * 8 * 64 * 2


# Regression: DeepSeek-V3.2 as vLLM groups it (MLA and indexer layers in one
# UniformTypeKVCacheSpecs group) raised AttributeError 'num_kv_heads'.
def test_uniform_type_group_of_mla_and_indexer_layers():
    mla, idx, attn, indexer, caches = dsv32_layers()
    specs = {**{n: mla for n in attn}, **{n: idx for n in indexer}}
    uniform = fakes.UniformTypeKVCacheSpecs(block_size=64, kv_cache_specs=specs)
    g = vllm.geometry(caches, fakes.kv_cache_config(4, [(list(specs), uniform)]))
    by = {b["name"]: (b["layers"], b["bytes_per_token"]) for b in g.buffers}
    # MLA row 512 e4m3 + 4 f32 + 64 bf16 = 656 B; indexer 128 e4m3 + 1 f32 = 132 B
    assert by == {"kv": (61, 656), "index_k": (61, 132)}
    assert g.bytes_per_token == 61 * (656 + 132) == 48_068


# Regression (hostile review, session 8): FlashInfer HND with one KV head per rank (the same
# bytes as NHD) was head_major, so it compared unequal with the NHD cache.
def test_one_head_hnd_is_the_nhd_layout():
    s = fakes.spec(num_kv_heads=1, head_size=128)
    nhd = {n: fakes.flashinfer_cache(4, s) for n in LAYERS}
    # allocated [blocks, 2, heads, block, dim] and permuted, as vLLM does for HND
    hnd = {n: np.zeros((4, 2, 1, 16, 128), fakes.BF16).transpose(0, 1, 3, 2, 4) for n in LAYERS}
    assert hnd[LAYERS[0]].strides != nhd[LAYERS[0]].strides
    a = vllm.geometry(nhd, {n: s for n in LAYERS})
    b = vllm.geometry(hnd, {n: s for n in LAYERS})
    assert kvlayout.compare(a, b) == []
    assert a.buffers[0]["arrangement"] == "section_major"


@pytest.mark.parametrize("value,want", [(True, True), (False, False), (None, False),
                                        ("false", "error"), (1, "error")])
def test_kvlayout_require_must_be_a_json_bool(value, want):
    # Before, bool(value): the string "false" (JSON quoted by mistake) required geometry.
    from types import SimpleNamespace

    from kvlayout import vllm as wiring
    extra = {} if value is None else {"kvlayout_require": value}  # None: the key absent
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra))
    if want == "error":
        want_text = f"kv_connector_extra_config.kvlayout_require: {value!r} is not a bool"
        with pytest.raises(kvlayout.KvLayoutError, match=want_text):
            wiring._require(config)
    else:
        assert wiring._require(config) is want


def test_vllm_check_version_compares_the_exact_string_and_names_both():
    # kvlayout.vllm.check_version: TESTED_VLLM is ("0.33.0",) (the version ENGINES.md tried).
    import kvlayout.vllm as kv

    assert kv.check_version("0.33.0") == "0.33.0"
    doc = kv.check_version.__doc__
    assert "``version``" in doc and "KvLayoutError" in doc and "ImportError" in doc
    for untested in ("0.33", "0.32.1"):
        with pytest.raises(kvlayout.KvLayoutError) as e:
            kv.check_version(untested)
        assert untested in str(e.value) and "0.33.0" in str(e.value)

    class Version:  # a packaging.version.Version-like object: compared as its string
        def __str__(self) -> str:
            return "0.33.0"

    assert kv.check_version(Version()) == "0.33.0"
