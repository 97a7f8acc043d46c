"""kvlayout.adapters.sglang against fake pools with SGLang's attribute names and shapes.

Only what SGLang 0.5.23's own code cannot reach on the CPU stays here; the rest runs on the real
pools and controllers in python/tests/engines (scripts/engines-ci.sh):

- the seed pair, a bf16 index-K device against a host sized by the fp8 formula: 0.5.23 has no
  bf16 index-K (``DSATokenToKVPool.index_k_with_scale_buffer_dtype = torch.uint8``), only a fork
  does (``research/integration.md`` 1.5), so its constructors cannot build it;
- pools whose attributes contradict their tensors, or carry a buffer no SGLang pool has: its
  constructors never build one;
- the op gate's argument binding for compiled ops (no Python signature), ``*args`` and renamed
  parameters, and its page-first row and layer arithmetic on calls SGLang's pools never make
  (they pass consistent sizes), all with the ops called directly;
- an MXFP8 host: SGLang cannot build ``MHATokenToKVPoolMXFP8Host`` on the CPU
  (engines/test_sglang_pools.py asserts its refusal)."""

from __future__ import annotations

import pytest

import kvlayout

np = pytest.importorskip("numpy", reason="numpy not installed: fake pools need it")
pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed: bf16/fp8 arrays need it")

import fakes  # noqa: E402
from kvlayout.adapters import sglang  # noqa: E402

# device bf16 index-K: 128 x 2 = 256 B/token, 64 x 256 = 16384 B/page; host fp8 formula
# 128 + 128 // 128 * 4 = 132 B/token, 64 x 132 = 8448 B/page.
SEED_LINES = [
    "index_k.sections.count: 1, 2",
    "index_k.sections[0].dtype: bf16, f8e4m3",
    "index_k.sections[1]: missing, f32 [1] (scale)",
    f"index_k.page_stride_bytes: {64 * 128 * 2}, {64 * (128 + 4)}",
    f"index_k.bytes_per_token: {128 * 2}, {128 + 4}",
    f"index_k.bytes_per_page: {64 * 128 * 2}, {64 * (128 + 4)}",
]


def test_seed_device_bf16_index_k_vs_host_fp8_formula_refused():
    device = fakes.dsa_device(index_k="bf16")
    host = fakes.dsa_host(device)
    with pytest.raises(kvlayout.Incompatible) as e:
        sglang.transfer_guard(device, host)
    assert e.value.lines == SEED_LINES
    with pytest.raises(kvlayout.Incompatible) as items:
        sglang.check_item_sizes(device, host)
    assert items.value.lines == [
        f"index_k.item_size_bytes: device {64 * 256} (index_k_with_scale_buffer[0] row stride), "
        f"host {64 * 132} (indexer_page_stride_size)"]


def test_device_geometry_equals_the_model_description():
    # 61 layers of DeepSeek-V3.2: the CLI's pool from config.json, the adapter's from tensors.
    # fp8 index-K on SGLang's own pool: engines/test_sglang_pools.py::test_dsa_61_layers_equals_describe.
    for index_k in ("bf16",):
        device = fakes.dsa_device(layers=61, index_k=index_k)
        g = sglang.device_geometry(device)
        assert g.fingerprint == kvlayout.describe("deepseek-v3.2-exp", index_k=index_k).fingerprint
        # size + page_size token slots: (7 * 64 + 64) / 64 = 8 pages
        assert g.pages == 8
        by = {b["name"]: b for b in g.buffers}
        assert by["kv"]["bytes_per_token"] == 512 + 4 * 4 + 64 * 2
        assert by["index_k"]["page_stride_bytes"] == 64 * (256 if index_k == "bf16" else 132)


def test_tensor_contradicting_the_attributes_is_refused():
    device = fakes.dsa_device()
    device.kv_lora_rank = 448  # attribute says 448 + 64 + scales; the tensor holds 656 B rows
    with pytest.raises(kvlayout.KvLayoutError, match="656"):
        sglang.device_geometry(device)


class _Recorder:
    def __init__(self):
        self.calls = 0

    def __call__(self, src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim):
        self.calls += 1


def test_transfer_op_gate_checks_item_size_against_strides():
    device = fakes.dsa_device(index_k="bf16")
    host = fakes.dsa_host(device, layout="page_first")
    op = _Recorder()

    def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size,
                                        src_layout_dim):
        op(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim)

    ns = {"__name__": "pool_host.dsa",
          "transfer_kv_per_layer_mla_pf_lf": transfer_kv_per_layer_mla_pf_lf}
    assert sglang.guard_transfer_ops(ns) == ["pool_host.dsa.transfer_kv_per_layer_mla_pf_lf"]
    assert sglang.guard_transfer_ops(ns) == []  # already wrapped
    gated = ns["transfer_kv_per_layer_mla_pf_lf"]
    src = host.index_k_with_scale_buffer
    stride = host.indexer_page_stride_size
    # What SGLang's NSA host does: item_size = indexer_page_stride_size (8448) into a bf16
    # device index-K whose rows are 16384 B apart.
    with pytest.raises(kvlayout.TransferRefused) as e:
        gated(src=src, dst=device.index_k_with_scale_buffer[0], src_indices=None,
              dst_indices=None, layer_id=0, item_size=stride,
              src_layout_dim=stride * host.layer_num)
    assert e.value.kind == "item_size"
    assert "item_size 8448 B" in str(e.value) and "16384 B apart" in str(e.value)
    assert op.calls == 0
    fp8 = fakes.dsa_device(index_k="fp8")
    gated(src, fp8.index_k_with_scale_buffer[0], None, None, 0, stride, stride * host.layer_num)
    assert op.calls == 1
    with pytest.raises(kvlayout.TransferRefused, match="src_layout_dim"):
        gated(src, fp8.index_k_with_scale_buffer[0], None, None, 0, stride, stride)


def test_separate_dsa_indexer_host_pool():
    # Newer SGLang: MLATokenToKVPoolHost for the latent, DSAIndexerPoolHost (pool_host/dsa.py) for
    # index-K, which reads index_head_dim / quant_block_size from its device_pool.
    import types

    device = fakes.dsa_device(index_k="bf16")
    host = fakes.dsa_host(device)
    indexer = types.SimpleNamespace(
        device_pool=device, layout=host.layout, page_size=host.page_size,
        indexer_page_stride_size=host.indexer_page_stride_size,
        index_k_with_scale_buffer=host.index_k_with_scale_buffer)
    del host.index_k_with_scale_buffer
    with pytest.raises(kvlayout.Incompatible) as e:
        sglang.transfer_guard(device, host, indexer=indexer)
    assert e.value.lines == SEED_LINES
    # without the indexer the host has no index_k buffer at all: refused by name
    with pytest.raises(kvlayout.Incompatible) as missing:
        sglang.transfer_guard(device, host)
    # 128 x 2 = 256 B/token, 64 x 256 = 16384 B/page, 3 layers (fakes.dsa_device default)
    assert missing.value.lines == [
        "index_k: present (256 B/token, 16384 B/page of 64 tokens, 3 layers), missing"]


class _CompiledOp:
    """Stands for a compiled op: no Python signature (inspect.signature raises)."""

    __signature__ = property(lambda self: (_ for _ in ()).throw(ValueError("no signature")))

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1


def test_gate_binds_positional_arguments_of_a_compiled_op():
    # MHA per-layer op, positional as SGLang passes them: item_size 2048 (8 x 128 x 2) against
    # rows of 4096 B (the device K buffer of 16 heads).
    device = fakes.mha_device(heads=16)
    op = _CompiledOp()
    ns = {"transfer_kv_per_layer": op}
    sglang.guard_transfer_ops(ns)
    gated = ns["transfer_kv_per_layer"]
    host = fakes.mha_host(fakes.mha_device(heads=8))
    k, v = host.kv_buffer[0][0], host.kv_buffer[1][0]
    with pytest.raises(kvlayout.TransferRefused, match="item_size 2048 B, but dst_k rows are 4096 B"):
        gated(k, device.k_buffer[0], v, device.v_buffer[0], None, None, 8 * 128 * 2)
    assert op.calls == 0
    gated(k, k, v, v, None, None, 8 * 128 * 2)
    assert op.calls == 1


@pytest.mark.parametrize("kind", ["varargs", "renamed"])
def test_gate_binds_varargs_and_renamed_ops_by_sglang_order(kind):
    # A `(*args, **kwargs)` op or one with renamed parameters: bound by sgl-kernel's order
    # (src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size), not passed unchecked.
    calls = []
    if kind == "varargs":
        def transfer_kv_per_layer(*args, **kwargs):
            calls.append(args)
    else:
        def transfer_kv_per_layer(a, b, c, d, e, f, g):
            calls.append((a, b, c, d, e, f, g))
    ns = {"transfer_kv_per_layer": transfer_kv_per_layer}
    assert sglang.guard_transfer_ops(ns) == ["namespace.transfer_kv_per_layer"]
    gated = ns["transfer_kv_per_layer"]
    device = fakes.mha_device(heads=16)  # rows of 16 x 128 x 2 = 4096 B
    host = fakes.mha_host(fakes.mha_device(heads=8))
    k, v = host.kv_buffer[0][0], host.kv_buffer[1][0]
    with pytest.raises(kvlayout.TransferRefused, match="item_size 2048 B, but dst_k rows are 4096 B"):
        gated(k, device.k_buffer[0], v, device.v_buffer[0], None, None, 8 * 128 * 2)
    assert calls == []
    gated(k, k, v, v, None, None, 8 * 128 * 2)
    assert len(calls) == 1
    # A call whose item_size cannot be found is refused, not passed unchecked.
    with pytest.raises(kvlayout.TransferRefused) as e:
        gated(k, k, v, v, None, None, size=8 * 128 * 2)
    assert e.value.kind == "unchecked" and "item_size" in str(e.value)
    assert len(calls) == 1


# Regression (hostile review, session 8): an MXFP8 device pool's k_scale_buffer / v_scale_buffer
# were not read, so the pool looked like plain fp8 (2 x 1,024 B/token/layer) and a host without
# scales passed the pairing.
def test_mxfp8_scales_are_buffers_and_a_host_without_them_is_refused():
    device = fakes.mha_mxfp8_device(layers=2)
    g = sglang.device_geometry(device)
    per_layer = {b["name"]: b["bytes_per_token"] for b in g.buffers}
    # K, V: 8 heads x 128 e4m3 = 1,024 B; scales: 8 heads x 128 / 32 ue8m0 = 32 B (DESIGN-facts:
    # MHA MXFP8 8 x 128 = 2,112 B/token/layer)
    assert per_layer == {"k": 1024, "v": 1024, "k_scale": 32, "v_scale": 32}
    assert sum(per_layer.values()) == 2112
    assert g.bytes_per_token == 2 * 2112
    plain_host = fakes.mha_host(device)
    with pytest.raises(kvlayout.Incompatible) as e:
        sglang.transfer_guard(device, plain_host)
    assert any("k_scale" in line for line in e.value.lines)


def test_an_unmodelled_scale_buffer_is_refused_by_name():
    device = fakes.mha_device()
    device.q_scale_buffer = [np.zeros((8, 8), np.float32)]
    with pytest.raises(kvlayout.KvLayoutError, match="q_scale_buffer"):
        sglang.device_geometry(device)
    host = fakes.mha_host(fakes.mha_device())
    host.k_scale_buffer = np.zeros((2, 8), np.uint8)
    with pytest.raises(kvlayout.KvLayoutError, match="k_scale_buffer"):
        sglang.host_geometry(host)


# Regressions (hostile review, session 8): the page-first row was not checked against the
# layers it must hold (item_size 4096 x 2 layers into a 4,096-B row passed; layer_id 5 of a
# 2-layer row passed); ph_lf ops were not wrapped; unchecked ops passed without a word.
def _mha_page_first_pair():
    device = fakes.mha_device(layers=2)  # rows 8 x 128 x 2 = 2,048 B
    host = fakes.mha_host(device, layout="page_first")  # rows 2 layers x 2,048 = 4,096 B
    return device, host


def test_all_layer_backup_must_fit_the_page_first_row():
    device, host = _mha_page_first_pair()
    calls = []

    def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices,
                                    dst_indices, item_size, dst_layout_dim, num_layers):
        calls.append(item_size)

    ns = {"transfer_kv_all_layer_lf_pf": transfer_kv_all_layer_lf_pf}
    sglang.guard_transfer_ops(ns)
    gated = ns["transfer_kv_all_layer_lf_pf"]
    k, v = host.kv_buffer[0], host.kv_buffer[1]
    gated(None, k, None, v, None, None, 2048, 4096, 2)
    assert calls == [2048]
    with pytest.raises(kvlayout.TransferRefused) as e:
        gated(None, k, None, v, None, None, 4096, 4096, 2)
    assert e.value.kind == "item_size"
    assert "num_layers 2 x item_size 4096 B = 8192 B, but dst_layout_dim is 4096 B" in str(e.value)
    assert calls == [2048]
    with pytest.raises(kvlayout.TransferRefused, match="num_layers -1: must be at least 1"):
        gated(None, k, None, v, None, None, 1024, 4096, -1)
    assert calls == [2048]


def test_per_layer_load_layer_must_lie_in_the_page_first_row():
    device, host = _mha_page_first_pair()
    calls = []

    def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices,
                                    layer_id, item_size, src_layout_dim):
        calls.append(layer_id)

    ns = {"transfer_kv_per_layer_pf_lf": transfer_kv_per_layer_pf_lf}
    sglang.guard_transfer_ops(ns)
    gated = ns["transfer_kv_per_layer_pf_lf"]
    k, v = host.kv_buffer[0], host.kv_buffer[1]
    gated(k, device.k_buffer[1], v, device.v_buffer[1], None, None, 1, 2048, 4096)
    for layer in (2, 5, -1):
        with pytest.raises(kvlayout.TransferRefused) as e:
            gated(k, device.k_buffer[1], v, device.v_buffer[1], None, None, layer, 2048, 4096)
        assert e.value.kind == "layer"
    assert calls == [1]


def test_page_head_load_is_wrapped_and_unchecked_ops_are_named():
    device = fakes.mha_device(heads=16)  # rows 16 x 128 x 2 = 4,096 B
    calls = []

    def transfer_kv_per_layer_ph_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices,
                                    layer_id, item_size, src_layout_dim, page_size, head_num):
        calls.append(layer_id)

    def jit_transfer_hicache_all_layer_staged_lf_pf(*args):  # staged write-back: not checked
        pass

    def transfer_kv_all_layer(*args):  # a pointer-table op: check_item_sizes covers it
        pass

    ns = {"__name__": "pool_host.mha", "transfer_kv_per_layer_ph_lf": transfer_kv_per_layer_ph_lf,
          "transfer_kv_all_layer_lf_ph": lambda *a: None,
          "jit_transfer_hicache_all_layer_staged_lf_pf": jit_transfer_hicache_all_layer_staged_lf_pf,
          "transfer_kv_all_layer": transfer_kv_all_layer}
    with pytest.warns(UserWarning) as w:
        assert sglang.guard_transfer_ops(ns) == ["pool_host.mha.transfer_kv_per_layer_ph_lf"]
    assert str(w[0].message) == (
        "kvlayout: transfer ops not checked by guard_transfer_ops: "
        "pool_host.mha.jit_transfer_hicache_all_layer_staged_lf_pf, "
        "pool_host.mha.transfer_kv_all_layer_lf_ph")
    with pytest.raises(kvlayout.TransferRefused, match="item_size 2048 B, but dst_k rows are 4096 B"):
        ns["transfer_kv_per_layer_ph_lf"](None, device.k_buffer[0], None, device.v_buffer[0],
                                          None, None, 0, 2048, 4096, 64, 8)
    assert calls == []


def test_pd_geometry_of_the_wrong_type_is_refused_naming_it():
    # The trial found set_pd_geometry("deepseek") accepted silently and pd_frame("x") failing
    # with an AttributeError deep inside.
    import kvlayout.sglang as ks

    with pytest.raises(TypeError, match="geometry: expected a kvlayout.Geometry or None, got str"):
        ks.set_pd_geometry("deepseek")
    with pytest.raises(TypeError, match="geometry: .* got dict"):
        ks.set_pd_geometry({"schema": "kvlayout.geometry/v1"})
    with pytest.raises(TypeError, match="require: expected a bool, got str"):
        ks.set_pd_geometry(None, require="yes")
    with pytest.raises(TypeError, match="geometry: expected a kvlayout.Geometry, got str"):
        ks.pd_frame("x")


def test_install_has_no_public_version_option():
    # The trial found install(version=...) undocumented: a test hook that read as an option (a
    # caller could pass "0.5.23" on another SGLang and skip the version check by name). It is
    # private, _version, and documented as a test hook; it refuses an untested version before
    # importing anything of SGLang.
    import kvlayout.sglang as ks

    with pytest.raises(TypeError, match="version"):
        ks.install(version="0.5.23")
    with pytest.raises(kvlayout.KvLayoutError, match=r"SGLang 0\.5\.24 is not a version"):
        ks.install(_version="0.5.24")
    assert "_version" in ks.install.__doc__ and "test hook" in ks.install.__doc__


def test_check_version_documents_its_argument():
    # The trial found check_version(version) public with ``version`` undocumented. Its docstring
    # names the argument, the supported SGLang version and what it raises; a given version is
    # checked as a string, exactly.
    import re

    import kvlayout.sglang as ks

    doc = ks.check_version.__doc__
    assert "``version``" in doc and "``None``" in doc, doc
    assert "0.5.23" in doc and "TESTED_SGLANG" in doc, doc
    assert "KvLayoutError" in doc and "ImportError" in doc, doc
    assert ks.TESTED_SGLANG == ("0.5.23",)
    assert ks.check_version("0.5.23") == "0.5.23"
    for untested in ("0.5.24", "0.5"):
        want = f"SGLang {untested} is not a version this wiring was tested on (0.5.23)"
        with pytest.raises(kvlayout.KvLayoutError, match=re.escape(want)):
            ks.check_version(untested)
