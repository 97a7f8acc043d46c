"""``kvlayout.sglang.install()`` on SGLang 0.5.23's own modules and classes, on the CPU.

SGLang's ``HiCacheController`` (``managers/cache_controller.py``) and its subclass
``HybridCacheController`` (``mem_cache/hybrid_cache/hybrid_cache_controller.py``, what
``build_kv_only_stack`` and the DSA stack build for HiRadixCache) are built by their own
constructors on the CPU (SGLang's CPU device module, ``torch.cpu``, gives them streams and events)
over pools built as the engine tests build them and SGLang's ``PagedTokenToKVPoolAllocator``;
backups and loads run through the controllers' own ``write`` / ``load`` + ``start_loading``.

The transfer-op stand-ins: on the CPU SGLang skips ``from sgl_kernel.kvcacheio import ...``
(behind ``if _is_cuda or _is_hip``) and its JIT kernels need CUDA, so the host pool modules hold
no ops. Before ``install`` runs, a recording stand-in is put under each name that SGLang's CUDA
import binds in that module (:data:`KVCACHEIO`, copied from ``pool_host/{mha,mla,dsa}.py``), so
that SGLang's own transfer methods call them through kvlayout's gate; the stand-ins copy nothing,
the tests assert which op was called, or that none was."""

from __future__ import annotations

import threading
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
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: E402
    HybridCacheController,
)
from sglang.srt.mem_cache.pool_host import dsa as pool_dsa  # noqa: E402
from sglang.srt.mem_cache.pool_host import mha as pool_mha  # noqa: E402
from sglang.srt.mem_cache.pool_host import mla as pool_mla  # noqa: E402
from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402

from sglang_build import PAGE_TOKENS, SIZE_TOKENS, dsa, indexer_host, mha, mha_host, mla_host  # noqa: E402

CALLS: list = []
# The names each host pool module binds from sgl_kernel.kvcacheio on CUDA (pool_host/mha.py:61,
# mla.py:55, dsa.py:48) and the JIT kernels it imports (mha.py:14-29, mla.py:14-20).
KVCACHEIO = {
    pool_mha: ("transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf",
               "transfer_kv_all_layer_lf_pf", "transfer_kv_all_layer_lf_ph",
               "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct", "transfer_kv_per_layer",
               "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_per_layer_mla",
               "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf",
               "transfer_kv_per_layer_ph_lf", "jit_transfer_hicache_one_layer",
               "jit_transfer_hicache_all_layer", "jit_transfer_hicache_one_layer_mla"),
    pool_mla: ("transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_mla",
               "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct",
               "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_per_layer_mla",
               "transfer_kv_per_layer_mla_pf_lf", "jit_transfer_hicache_one_layer_mla"),
    pool_dsa: ("transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_mla",
               "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct",
               "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_per_layer_mla",
               "transfer_kv_per_layer_mla_pf_lf"),
}


def recorder(name):
    def op(*args, **kwargs):
        CALLS.append(name)
    op.__name__ = name
    return op


@pytest.fixture(scope="module", autouse=True)
def installed():
    for mod, names in KVCACHEIO.items():
        for name in names:
            setattr(mod, name, recorder(name))
    done = kv_sglang.install()
    yield done


def test_version():
    assert sglang.__version__ == "0.5.23"
    with pytest.raises(kvlayout.KvLayoutError, match=r"SGLang 0\.5\.24 is not a version"):
        kv_sglang.install(_version="0.5.24")


def test_install_wraps_where_sglang_0_5_23_keeps_the_ops(installed):
    assert "sglang.srt.mem_cache.pool_host.mha.transfer_kv_per_layer" in installed
    assert "sglang.srt.mem_cache.pool_host.dsa.transfer_kv_per_layer_mla" in installed
    assert "sglang.srt.mem_cache.pool_host.mha.jit_transfer_hicache_one_layer" in installed
    # wrapped by this install or an earlier one in the process (README's snippet test)
    assert hasattr(HiCacheController.__init__, "__kvlayout_unchecked__")
    assert hasattr(conn.MooncakeKVManager._publish_peer_registration, "__kvlayout_unchecked__")
    assert kv_sglang.install() == []  # idempotent


def allocator(device):
    """SGLang's paged allocator over ``device`` (448 tokens in pages of 64)."""
    return PagedTokenToKVPoolAllocator(size=SIZE_TOKENS, page_size=PAGE_TOKENS, dtype=torch.int64,
                                       device="cpu", kvcache=device, need_sort=False)


def hicache(device, host, cls=HiCacheController, **kw):
    """The controller as SGLang builds it (``io_backend="kernel"``, no TP group on one rank)."""
    return cls(allocator(device), host, PAGE_TOKENS, None, threading.Event(),
               io_backend="kernel", **kw)


def round_trip(controller, tokens=128):
    """A backup then a load through the controller's own methods: ``write`` (device -> host,
    submitted at once), ``load`` + ``start_loading`` (host -> device, one op per layer).
    Returns the ops called by each."""
    device_indices = controller.mem_pool_device_allocator.alloc(tokens)
    CALLS.clear()
    host_indices = controller.write(device_indices)
    backup = list(CALLS)
    CALLS.clear()
    controller.load(host_indices)
    controller.start_loading()
    return backup, list(CALLS)


@pytest.mark.parametrize("layout,backup_op,load_op", [
    ("layer_first", "transfer_kv_all_layer", "transfer_kv_per_layer"),
    ("page_first", "transfer_kv_all_layer_lf_pf", "transfer_kv_per_layer_pf_lf")])
def test_hicache_controller_round_trip_through_the_gate(layout, backup_op, load_op):
    device = mha()
    host = mha_host(device, layout)
    controller = hicache(device, host)
    # The pairing guard, by hand: device 448 + 64 = 512 token slots / 64 = 8 pages; host
    # 2.0 x 448 = 896 tokens -> 896 // 64 + 1 = 15 pages (pool_host sizing); 2 layers.
    guard = controller.kvlayout_guard
    assert repr(guard).endswith("device_pages=8, host_pages=15, layers=2)")
    backup, load = round_trip(controller)
    assert backup == [backup_op]
    assert load == [load_op, load_op]  # one per layer
    # The host's item size halved after construction (a host sized by another formula):
    # SGLang passes it as item_size; the per-layer load is refused before its kernel.
    host.token_stride_size //= 2
    device_indices = allocator(device).alloc(64)
    CALLS.clear()
    controller.load(controller.write(device_indices))
    # SGLang's L2TransferEngine._submission answers an error with stream.synchronize(), which
    # torch.cpu.Stream lacks (mem_cache/l2_transfer.py): on the CPU the refusal arrives as the
    # context of that AttributeError (on CUDA it propagates itself).
    with pytest.raises(AttributeError, match="synchronize") as e:
        controller.start_loading()
    refusal = e.value.__context__
    assert isinstance(refusal, kvlayout.TransferRefused)
    assert "item_size 128 B, but" in str(refusal)
    assert load_op not in CALLS


def test_hicache_controller_refuses_a_host_that_does_not_mirror():
    device = mha()
    host = mha_host(mha(heads=4), "layer_first")  # sized for 4 heads
    with pytest.raises(kvlayout.Incompatible) as e:
        hicache(device, host)
    # 2 heads x 64 x 2 B = 256 B per token on the device, 512 on the host.
    assert any("bytes_per_token" in line and "256" in line and "512" in line
               for line in e.value.lines)


def dsa_group(device, layout="page_first", *, host_from=None):
    """The DSA host as SGLang's DSA stack builds it: a HostPoolGroup of the MLA host (anchor)
    and the ``DSAIndexerPoolHost`` (``pool_host/group.py``), both entries with ``device`` as
    their device pool (what ``HybridCacheController._l2_transfers`` moves between); the hosts
    are sized from ``host_from`` (default ``device``)."""
    source = device if host_from is None else host_from
    host = mla_host(source, layout)
    return HostPoolGroup([
        PoolEntry(name=PoolName.KV, host_pool=host, device_pool=device, layer_mapper=lambda x: x,
                  is_primary_index_anchor=True),
        PoolEntry(name=PoolName.INDEXER, host_pool=indexer_host(source, host),
                  device_pool=device, layer_mapper=lambda x: x)])


def test_hybrid_controller_dsa_fp8_with_indexer():
    device = dsa()  # DeepSeek-V3.2's fp8 FlashMLA row (656 B), index-K, 3 layers
    controller = hicache(device, dsa_group(device), cls=HybridCacheController,
                         transfer_layer_id_max=device.layer_num)
    assert {b["name"] for b in controller.kvlayout_guard.host.buffers} == {"kv", "index_k"}
    backup, load = round_trip(controller)
    assert backup == ["transfer_kv_all_layer_mla_lf_pf"]
    assert load == ["transfer_kv_per_layer_mla_pf_lf"] * 3
    # Hosts sized for a 2-layer pool paired with the 3-layer device: SGLang does not start.
    with pytest.raises(kvlayout.Incompatible) as e:
        hicache(device, dsa_group(device, host_from=dsa(layers=2)), cls=HybridCacheController,
                transfer_layer_id_max=device.layer_num)
    assert "kv.layers: 3, 2" in e.value.lines and "index_k.layers: 3, 2" in e.value.lines


def test_jit_one_layer_rows_checked():
    """The JIT ops called directly: SGLang's host pools call them only on CUDA
    (``can_use_jit = (_is_cuda or _is_hip) and can_use_hicache_jit_kernel(...)``), which the
    controller tests above cannot reach on the CPU."""
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


def swa_group(device, full_host=None):
    """A SWA hybrid's host as ``build_hybrid_swa_group`` pairs it: the full-attention host (KV,
    anchor) with ``full_kv_pool``, the sliding-window host with ``swa_kv_pool``."""
    if full_host is None:
        full_host = mha_host(device.full_kv_pool, "layer_first")
    return HostPoolGroup([
        PoolEntry(name=PoolName.KV, host_pool=full_host,
                  device_pool=device.full_kv_pool, layer_mapper=lambda x: x,
                  is_primary_index_anchor=True),
        PoolEntry(name=PoolName.SWA, host_pool=mha_host(device.swa_kv_pool, "layer_first"),
                  device_pool=device.swa_kv_pool, layer_mapper=lambda x: x)])


def swa_device():
    """SGLang's ``SWAKVPool``: layer 0 full attention, layer 1 sliding window, 2 heads x 64."""
    return SWAKVPool(size=SIZE_TOKENS, size_swa=SIZE_TOKENS, page_size=PAGE_TOKENS,
                     dtype=torch.bfloat16, head_num=2, head_dim=64, swa_attention_layer_ids=[1],
                     full_attention_layer_ids=[0], device="cpu")


def test_hybrid_controller_swa_pairs_each_half():
    # Regression: the controller's device pool is the SWAKVPool, which holds no k_buffer itself;
    # pairing it with the anchor host refused every SWA model's HiCache start
    # ("SWAKVPool: neither k_buffer/v_buffer (MHA) nor kv_buffer (MLA)").
    device = swa_device()
    controller = hicache(device, swa_group(device), cls=HybridCacheController,
                         transfer_layer_id_max=2)
    assert set(controller.kvlayout_guards) == {"kv", "swa"}
    assert controller.kvlayout_guard is controller.kvlayout_guards["kv"]
    # one layer per half: 2 heads x 64 x 2 B = 256 B per token and layer, K and V.
    for guard in controller.kvlayout_guards.values():
        assert guard.device.bytes_per_token == 2 * 256
    wrong = mha_host(mha(layers=1, heads=4), "layer_first")  # a full host sized for 4 heads
    with pytest.raises(kvlayout.Incompatible):
        hicache(device, swa_group(device, wrong), cls=HybridCacheController,
                transfer_layer_id_max=2)


def test_a_pool_the_adapter_does_not_read_is_named_not_passed_silently():
    device = swa_device()
    group = swa_group(device)
    group.entries[1].device_pool = device  # the SWAKVPool wrapper itself: no k_buffer of its own
    with pytest.warns(UserWarning, match=r"HiCache pools not checked .*: swa \(SWAKVPool\)"):
        controller = hicache(device, group, cls=HybridCacheController, transfer_layer_id_max=2)
    assert set(controller.kvlayout_guards) == {"kv"}


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


def test_install_logs_the_transfer_ops_it_does_not_check(caplog):
    # SGLang 0.5.23's staged layer-first -> page-first all-layer ops are not among the ops the
    # adapter checks: install names them at WARNING (before, their UserWarning was ignored and
    # nothing was logged, though the comment said "listed in the log"). Every install call
    # names them again: they stay unwrapped.
    with caplog.at_level("WARNING", logger="kvlayout.sglang"):
        kv_sglang.install()
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "kvlayout.sglang")
    for module in ("mha", "mla", "dsa"):
        assert (f"sglang.srt.mem_cache.pool_host.{module}."
                "jit_transfer_hicache_all_layer_mla_staged_lf_pf") in text
    assert "sglang.srt.mem_cache.pool_host.mha.jit_transfer_hicache_all_layer_staged_lf_pf" in text
