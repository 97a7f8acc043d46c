"""The vLLM wiring (kvlayout.vllm) on vLLM 0.33.0's own classes: the connector factory loads the
classes by module path, the handshake metadata is vLLM's ``NixlAgentMetadata`` /
``NixlHandshakePayload`` encoded and decoded with msgspec as ``_nixl_handshake`` does, and the
offload specs are vLLM's ``GPULoadStoreSpec`` / ``CPULoadStoreSpec``.

Not built here: ``NixlConnectorWorker`` itself (it opens a NIXL agent, and no NIXL build is in
this environment); its ``add_remote_agent`` is stood in by a recorder, wrapped exactly as the
connector wraps the real one."""

from __future__ import annotations

import types
import warnings

import msgspec
import pytest

import kvlayout
import kvlayout.vllm as kv_vllm
from kvlayout.pd import PeerRefused

warnings.filterwarnings("ignore", category=UserWarning)
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (  # noqa: E402
    NixlConnector,
    NixlHandshakePayload,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (  # noqa: E402
    OffloadingConnector,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

from vllm_build import allocate, attn, full, vllm_config  # noqa: E402


@pytest.mark.parametrize("name,base", [("KvlayoutNixlConnector", NixlConnector),
                                       ("KvlayoutOffloadingConnector", OffloadingConnector)])
def test_factory_loads_by_module_path(name, base):
    cfg = KVTransferConfig(kv_connector=name, kv_connector_module_path="kvlayout.vllm",
                           kv_role="kv_both")
    cls = KVConnectorFactory.get_connector_class(cfg)
    assert cls.__name__ == name and issubclass(cls, base)


def test_unknown_vllm_version_refused_naming_it():
    assert kv_vllm.check_version() == "0.33.0"
    with pytest.raises(kvlayout.KvLayoutError, match=r"vLLM 0\.34\.0 is not a version"):
        kv_vllm.check_version("0.34.0")


def payload_for(geometry, engine_id="prefill-0"):
    """A NixlHandshakePayload as NixlBaseConnectorWorker.register_kv_caches builds it."""
    cls = kv_vllm._install_metadata()
    assert base_worker.NixlAgentMetadata is cls
    meta = cls(engine_id=engine_id, agent_metadata=b"agent", kv_caches_base_addr=[4096],
               device_id=0, num_blocks=10, block_lens=[8192], block_strides=[8192],
               kv_cache_layout="NHD", block_size=16, ssm_sizes=(0, 0),
               attn_backend_name="FLASH_ATTN", physical_blocks_per_logical_kv_block=1)
    raw = NixlHandshakePayload(compatibility_hash="h",
                               agent_metadata_bytes=msgspec.msgpack.Encoder().encode(meta))
    return raw if geometry is None else kv_vllm.with_geometry(raw, geometry)


def decode(payload):
    """What _nixl_handshake does with the bytes it receives."""
    wire = msgspec.msgpack.encode(payload)
    got = msgspec.msgpack.Decoder(NixlHandshakePayload).decode(wire)
    return msgspec.msgpack.Decoder(base_worker.NixlAgentMetadata).decode(got.agent_metadata_bytes)


def rank(tmp_path, heads):
    vc = vllm_config(tmp_path)
    cfg, kv = allocate(vc, {attn(0): full(heads=heads), attn(1): full(heads=heads)})
    return kv_vllm.rank_geometry(kv, vc, cfg), vc


def connector_with_recorder(local, vc, require=False):
    calls = []
    worker = types.SimpleNamespace(add_remote_agent=lambda meta, *a, **k: calls.append(meta.engine_id))
    vc.kv_transfer_config = KVTransferConfig(kv_connector="KvlayoutNixlConnector",
                                             kv_connector_module_path="kvlayout.vllm",
                                             kv_role="kv_consumer",
                                             kv_connector_extra_config={"kvlayout_require": require})
    conn = types.SimpleNamespace(connector_worker=worker, kvlayout_geometry=local, _vllm_config=vc)
    kv_vllm._guard_worker_adds(conn)
    return conn, calls


def test_handshake_carries_geometry_and_peer_is_checked_first(tmp_path):
    local, vc = rank(tmp_path, 2)
    meta = decode(payload_for(local))
    assert kvlayout.Geometry.from_json(meta.kvlayout_geometry) == local
    assert meta.kvlayout_fingerprint == local.fingerprint
    conn, calls = connector_with_recorder(local, vc)
    conn.connector_worker.add_remote_agent(meta)
    assert calls == ["prefill-0"]


def test_incompatible_peer_refused_before_registration(tmp_path):
    local, vc = rank(tmp_path, 2)
    other, _ = rank(tmp_path, 4)
    conn, calls = connector_with_recorder(local, vc)
    with pytest.raises(PeerRefused) as e:
        conn.connector_worker.add_remote_agent(decode(payload_for(other)))
    assert calls == []  # NIXL never saw the peer
    # 4 heads x 128 x 2 B = 1024 B per token on the peer, 2 x 128 x 2 = 512 here.
    assert any("bytes_per_token" in line and "1024" in line for line in e.value.lines)


def test_peer_without_geometry(tmp_path):
    local, vc = rank(tmp_path, 2)
    plain = decode(payload_for(None))
    assert plain.kvlayout_geometry is None
    conn, calls = connector_with_recorder(local, vc, require=True)
    with pytest.raises(PeerRefused, match="sent none"):
        conn.connector_worker.add_remote_agent(plain)
    assert calls == []
    conn, calls = connector_with_recorder(local, vc, require=False)
    with pytest.warns(kvlayout.pd.UncheckedPeerWarning):
        conn.connector_worker.add_remote_agent(plain)
    assert calls == ["prefill-0"]


def test_offload_jobs_guarded(tmp_path):
    local, _ = rank(tmp_path, 2)
    submitted = []
    worker = types.SimpleNamespace(
        submit_store=lambda job, src, dst: submitted.append(("store", job)) or True,
        submit_load=lambda job, src, dst, expedited=False: submitted.append(("load", job)) or True)
    kv_vllm.guard_offload_worker(worker, kvlayout.TransferGuard(local, local))
    assert worker.submit_store(1, GPULoadStoreSpec([0, 9], group_sizes=[2], block_indices=[0]),
                               CPULoadStoreSpec([0, 1]))
    assert worker.submit_load(2, CPULoadStoreSpec([0, 1]),
                              GPULoadStoreSpec([3, 4], group_sizes=[2], block_indices=[0]))
    # 10 blocks: block 10 is past the pool; a load writing block 3 twice is refused.
    with pytest.raises(kvlayout.TransferRefused) as e:
        worker.submit_store(3, GPULoadStoreSpec([10], group_sizes=[1], block_indices=[0]),
                            CPULoadStoreSpec([0]))
    assert e.value.kind == "page_out_of_range"
    with pytest.raises(kvlayout.TransferRefused) as e:
        worker.submit_load(4, CPULoadStoreSpec([0, 1]),
                           GPULoadStoreSpec([3, 3], group_sizes=[2], block_indices=[0]))
    assert e.value.kind == "duplicate_destination"
    assert submitted == [("store", 1), ("load", 2)]
