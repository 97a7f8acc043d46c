"""``kvlayout.sglang.install()`` on SGLang 0.5.23's own modules and classes.

The transfer-op stand-ins: on this CPU SGLang skips ``from sgl_kernel.kvcacheio import ...``
(behind ``if _is_cuda or _is_hip``) and its JIT kernels need CUDA, so the host pool modules hold
no ops here. Each test puts a recording stand-in under the op's real name in the real module
(as SGLang's CUDA import would), runs ``install``, and calls SGLang's own transfer method."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

import kvlayout
import kvlayout.sglang as kv_sglang
from kvlayout.adapters import sglang as kvl

warnings.filterwarnings("ignore", category=UserWarning)
import sglang  # noqa: E402
from sglang.srt.disaggregation.mooncake import conn  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.pool_host import dsa as pool_dsa  # noqa: E402
from sglang.srt.mem_cache.pool_host import mha as pool_mha  # noqa: E402
from sglang.srt.mem_cache.pool_host import mla as pool_mla  # noqa: E402
from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry  # noqa: E402

from sglang_build import dsa, indexer_host, mha, mha_host, mla_host  # noqa: E402

CALLS: list = []


def recorder(name):
    def op(*args, **kwargs):
        CALLS.append(name)
    op.__name__ = name
    return op


@pytest.fixture(scope="module", autouse=True)
def installed():
    for mod in (pool_mha, pool_mla, pool_dsa):
        for name in ("transfer_kv_per_layer", "transfer_kv_per_layer_mla",
                     "jit_transfer_hicache_one_layer", "jit_transfer_hicache_all_layer",
                     "jit_transfer_hicache_one_layer_mla"):
            setattr(mod, name, recorder(name))
    done = kv_sglang.install()
    yield done


def test_version():
    assert sglang.__version__ == "0.5.23"
    with pytest.raises(kvlayout.KvLayoutError, match=r"SGLang 0\.5\.24 is not a version"):
        kv_sglang.install(version="0.5.24")


def test_install_wraps_where_sglang_0_5_23_keeps_the_ops(installed):
    assert "sglang.srt.mem_cache.pool_host.mha.transfer_kv_per_layer" in installed
    assert "sglang.srt.mem_cache.pool_host.dsa.transfer_kv_per_layer_mla" in installed
    assert "sglang.srt.mem_cache.pool_host.mha.jit_transfer_hicache_one_layer" in installed
    # wrapped by this install or an earlier one in the process (README's snippet test)
    assert hasattr(HiCacheController.__init__, "__kvlayout_unchecked__")
    assert hasattr(conn.MooncakeKVManager._publish_peer_registration, "__kvlayout_unchecked__")
    assert kv_sglang.install() == []  # idempotent


def test_sglang_load_goes_through_the_gate():
    device = mha()
    host = mha_host(device, "layer_first")
    CALLS.clear()
    idx = torch.arange(0, 64, dtype=torch.int64)
    host.load_to_device_per_layer(device, idx, idx, 0, "kernel")
    assert CALLS == ["transfer_kv_per_layer"]
    # item size halved after construction (a host sized by another formula): refused, no call.
    host.token_stride_size //= 2
    CALLS.clear()
    with pytest.raises(kvlayout.TransferRefused, match="item_size 128 B, but src_k rows are 256 B"):
        host.load_to_device_per_layer(device, idx, idx, 0, "kernel")
    assert CALLS == []


def test_jit_one_layer_rows_checked():
    op = pool_mha.jit_transfer_hicache_one_layer
    k = torch.zeros(8, 2, 64, dtype=torch.bfloat16)
    half = torch.zeros(8, 2, 32, dtype=torch.bfloat16)
    CALLS.clear()
    op(k_cache_dst=k, v_cache_dst=k, indices_dst=None, k_cache_src=k, v_cache_src=k, indices_src=None)
    assert CALLS == ["jit_transfer_hicache_one_layer"]
    with pytest.raises(kvlayout.TransferRefused, match="rows of 256 B, k_cache_src rows of 128 B"):
        op(k_cache_dst=k, v_cache_dst=k, indices_dst=None, k_cache_src=half, v_cache_src=half,
           indices_src=None)
    with pytest.raises(kvlayout.TransferRefused, match="element_size 512 B exceeds"):
        pool_mha.jit_transfer_hicache_all_layer(None, None, None, None, None, None,
                                                kv_cache_src_stride_bytes=256,
                                                kv_cache_dst_stride_bytes=256, element_size=512)


def test_hicache_pairing_guard_with_indexer_group():
    device = dsa()
    host = mla_host(device, "page_first")
    indexer = indexer_host(device, host)
    group = HostPoolGroup([
        PoolEntry(name="kv", host_pool=host, device_pool=device, layer_mapper=lambda x: x,
                  is_primary_index_anchor=True),
        PoolEntry(name="indexer", host_pool=indexer, device_pool=device, layer_mapper=lambda x: x)])
    controller = types.SimpleNamespace(mem_pool_device=device, mem_pool_host=group)
    guard = kv_sglang.guard_pair(controller)
    assert {b["name"] for b in guard.host.buffers} == {"kv", "index_k"}
    other = dsa(layers=2)
    with pytest.raises(kvlayout.Incompatible):
        kv_sglang.guard_pair(types.SimpleNamespace(mem_pool_device=other, mem_pool_host=group))
    assert hasattr(HiCacheController.__init__, "__kvlayout_unchecked__")


def registration_frames(extra=()):
    return [b"room", b"127.0.0.1", b"9000", b"session-1", b"\0" * 8, b"", b"", b"0", b"1",
            b"256", *extra]


def test_pd_bootstrap_peer_checked_before_publication():
    local = kvl.device_geometry(mha())
    kv_sglang.set_pd_geometry(local, require=True)
    try:
        # the decode rank's frame, parsed by SGLang's own KVArgsRegisterInfo.from_zmq
        same = conn.KVArgsRegisterInfo.from_zmq(registration_frames([kv_sglang.pd_frame(local)]))
        assert same.dst_kv_item_len == 256 and same.kvlayout_message is not None
        assert kv_sglang.check_registration(same) is None
        other = kvl.device_geometry(mha(heads=4))
        refused = conn.KVArgsRegisterInfo.from_zmq(registration_frames([kv_sglang.pd_frame(other)]))
        reason = kv_sglang.check_registration(refused)
        # 4 heads x 64 x 2 B = 512 B per token on the peer, 256 here.
        assert reason is not None and "k.bytes_per_token: 512, 256" in reason  # peer, local
        # the wrapped publication returns the refusal; SGLang's own method (which would touch
        # the manager's tables: this stand-in has none) is never reached.
        publish = conn.MooncakeKVManager._publish_peer_registration
        assert publish(types.SimpleNamespace(), "session-1", refused) == reason
        none = conn.KVArgsRegisterInfo.from_zmq(registration_frames())
        assert "sent none" in kv_sglang.check_registration(none)
    finally:
        kv_sglang.set_pd_geometry(None)


def test_decode_registration_message_gets_the_frame():
    local = kvl.device_geometry(mha())
    kv_sglang.set_pd_geometry(local)
    try:
        cls = next(c for c in conn.MooncakeKVManager.__mro__
                   if "build_receiver_registration_message" in c.__dict__)
        fn = cls.__dict__["build_receiver_registration_message"]
        assert hasattr(fn, "__kvlayout_unchecked__")
        frames, message = kv_sglang.read_pd_frame(registration_frames([kv_sglang.pd_frame(local)]))
        assert frames == registration_frames()
        assert kvlayout.Geometry.from_json(message["geometry"]) == local
    finally:
        kv_sglang.set_pd_geometry(None)
