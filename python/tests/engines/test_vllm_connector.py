"""The vLLM wiring (kvlayout.vllm) on vLLM 0.33.0's own classes, on the CPU.

NIXL connector: the real ``NixlConnector`` worker (``NixlPullConnectorWorker``) and scheduler,
built by the connectors' own constructors with NIXL 1.5.1 (``nixl`` + ``nixl-cu13``, the UCX
backend on host memory: vLLM's CPU platform registers ``kv_buffer_device="cpu"`` as DRAM,
``nixl/utils.py`` ``_NIXL_SUPPORTED_DEVICE``). Each prefill worker registers its KV caches
(``register_kv_caches``: NIXL memory registration, the handshake payload), its scheduler serves
the payload on a loopback side channel, and the decode worker runs vLLM's own
``_nixl_handshake`` against it: the compatibility hash, the metadata decode, then
``add_remote_agent``, which the connector checks first. Two workers of one process, each its
own NIXL agent. The CPU attention backend needs blocks of a multiple of 32 tokens
(``CPU_ATTN: [MultipleOf(32)]``), so these pools use 32-token blocks.

Offloading connector: the real ``OffloadingConnector`` and its ``OffloadingConnectorWorker``.
vLLM cannot build its CPU offloading worker without a GPU: ``CPUOffloadingSpec.get_worker``
refuses ("CPU Offloading is currently only supported on CUDA-alike and XPU GPUs",
``v1/kv_offload/cpu/spec.py``), and past that ``SingleDirectionOffloadingHandler`` asserts
``gpu_tensor.is_cuda or gpu_tensor.is_xpu`` (``v1/kv_offload/cpu/gpu_worker.py``). The first is
asserted here; for the guard, only that CUDA worker is stood in (a recording subclass of vLLM's
``OffloadingWorker``), and vLLM's own ``register_kv_caches``, ``wait_for_save`` and
``start_load_kv`` submit the jobs of vLLM's ``OffloadingConnectorMetadata`` to it."""

from __future__ import annotations

import contextlib
import warnings

import msgspec
import pytest

import kvlayout
import kvlayout.vllm as kv_vllm
from kvlayout.pd import PeerRefused, UncheckedPeerWarning

warnings.filterwarnings("ignore", category=UserWarning)
from vllm.config import KVTransferConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (  # noqa: E402
    NixlConnector,
    NixlHandshakePayload,
    base_worker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata as nixl_metadata  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingConnectorMetadata,
    TransferJob,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (  # noqa: E402
    OffloadingConnector,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec, OffloadingWorker  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

from vllm_build import BLOCKS, LOOPBACK as HOST, NIXL_BLOCK_TOKENS as BLOCK_TOKENS  # noqa: E402
from vllm_build import attn, connector, free_port  # noqa: E402


@contextlib.contextmanager
def serving(model_dir, payload, monkeypatch):
    """vLLM's own NIXL scheduler serving ``payload`` as TP rank 0 on a loopback port."""
    port = free_port()
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", HOST)
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(port))
    sched, _ = connector(NixlConnector, model_dir, KVConnectorRole.SCHEDULER, "server",
                         "kv_producer")
    sched.set_xfer_handshake_metadata_pp_aware({(0, 0): payload})
    try:
        yield port
    finally:
        sched.shutdown()


def handshake(decode, port, engine_id):
    """vLLM's own handshake from the decode worker (what ``_background_nixl_handshake`` runs):
    ``{(pp_rank, tp_rank): remote agent name}``."""
    agents, _clock_offset = decode.connector_worker._nixl_handshake(HOST, port, 1, engine_id)
    return agents


@pytest.fixture
def model_dir(vllm_tp_group):
    return vllm_tp_group


def registered(decode, prefill, engine_id) -> bool:
    """Whether vLLM's ``add_remote_agent`` ran: the remote's block count recorded and NIXL
    holding the remote agent's metadata."""
    worker = decode.connector_worker
    return (engine_id in worker.dst_num_blocks
            and worker.nixl_wrapper.check_remote_metadata(prefill.connector_worker.nixl_wrapper.name))


Kvlayout = kv_vllm.KvlayoutNixlConnector


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


def test_real_handshake_carries_geometry_and_matching_peer_is_registered(model_dir, monkeypatch):
    prefill, kv = connector(Kvlayout, model_dir, KVConnectorRole.WORKER, "prefill-0",
                            "kv_producer")
    decode, _ = connector(Kvlayout, model_dir, KVConnectorRole.WORKER, "decode-0", "kv_consumer",
                          extra={"kvlayout_require": True})
    # By hand: LBHNC [blocks, heads, tokens, K|V] = [10, 2, 32, 128] bf16: a token is
    # 2 heads x (64 K + 64 V) x 2 B = 512 B, a block 32 x 512 = 16384 B = stride(0) in bytes.
    t = kv[attn(0)]
    assert tuple(t.shape) == (BLOCKS, 2, BLOCK_TOKENS, 128)
    assert t.stride(0) * t.element_size() == 16384 == BLOCK_TOKENS * 512
    payload = prefill.get_handshake_metadata()
    sent = msgspec.msgpack.decode(payload.agent_metadata_bytes, type=base_worker.NixlAgentMetadata)
    geometry = kvlayout.Geometry.from_json(sent.kvlayout_geometry)
    assert geometry == prefill.kvlayout_geometry
    assert sent.kvlayout_fingerprint == geometry.fingerprint
    assert geometry.bytes_per_token == 2 * 512  # 2 layers
    # A vLLM without kvlayout decodes the same bytes with its own class (unknown fields skipped).
    plain = msgspec.msgpack.decode(payload.agent_metadata_bytes,
                                   type=nixl_metadata.NixlAgentMetadata)
    assert plain.engine_id == "prefill-0" and plain.block_lens == sent.block_lens
    with serving(model_dir, payload, monkeypatch) as port:
        agents = handshake(decode, port, "prefill-0")
    assert agents == {(0, 0): prefill.connector_worker.nixl_wrapper.name.encode()}
    assert registered(decode, prefill, "prefill-0")
    assert decode.connector_worker.dst_num_blocks["prefill-0"] == BLOCKS


def test_mismatched_peer_refused_before_nixl_registers_it(model_dir, monkeypatch):
    # A prefill pool of 4 KV heads on the same model config: vLLM's compatibility hash
    # (model-config factors, nixl/metadata.py compute_nixl_compatibility_hash) is equal, the
    # tensors are not.
    prefill, _ = connector(Kvlayout, model_dir, KVConnectorRole.WORKER, "prefill-1",
                           "kv_producer", heads=4)
    decode, _ = connector(Kvlayout, model_dir, KVConnectorRole.WORKER, "decode-1", "kv_consumer")
    assert prefill.connector_worker.compat_hash == decode.connector_worker.compat_hash
    with serving(model_dir, prefill.get_handshake_metadata(), monkeypatch) as port:
        with pytest.raises(PeerRefused) as e:
            handshake(decode, port, "prefill-1")
    # 4 heads x 128 x 2 B = 1024 B per token on the peer, 2 x 128 x 2 = 512 here.
    assert any("bytes_per_token" in line and "1024" in line and "512" in line
               for line in e.value.lines)
    assert not registered(decode, prefill, "prefill-1")


def without_geometry(payload):
    """The payload as a vLLM without kvlayout sends it (vLLM's own NixlAgentMetadata)."""
    meta = msgspec.msgpack.decode(payload.agent_metadata_bytes, type=nixl_metadata.NixlAgentMetadata)
    raw = msgspec.msgpack.encode(meta)
    assert b"kvlayout" not in raw
    return NixlHandshakePayload(compatibility_hash=payload.compatibility_hash,
                                agent_metadata_bytes=raw)


def test_peer_without_geometry(model_dir, monkeypatch):
    prefill, _ = connector(NixlConnector, model_dir, KVConnectorRole.WORKER, "prefill-2",
                           "kv_producer")
    payload = without_geometry(prefill.get_handshake_metadata())
    strict, _ = connector(Kvlayout, model_dir, KVConnectorRole.WORKER, "decode-2", "kv_consumer",
                          extra={"kvlayout_require": True})
    lax, _ = connector(Kvlayout, model_dir, KVConnectorRole.WORKER, "decode-3", "kv_consumer")
    with serving(model_dir, payload, monkeypatch) as port:
        with pytest.raises(PeerRefused, match="sent none"):
            handshake(strict, port, "prefill-2")
        assert not registered(strict, prefill, "prefill-2")
        with pytest.warns(UncheckedPeerWarning):
            handshake(lax, port, "prefill-2")
    assert registered(lax, prefill, "prefill-2")


def test_geometry_survives_vllm_restore_kv_caches(model_dir):
    """vLLM's ``restore_kv_caches`` (wake-up after sleep) decodes and re-encodes the payload
    with base_worker's ``NixlAgentMetadata``: the reason the connector points that name at the
    subclass (module docs) rather than only adding the fields at ``register_kv_caches``."""
    prefill, _ = connector(Kvlayout, model_dir, KVConnectorRole.WORKER, "prefill-4",
                           "kv_producer")
    prefill.unregister_kv_caches()
    prefill.restore_kv_caches()
    meta = msgspec.msgpack.decode(prefill.get_handshake_metadata().agent_metadata_bytes,
                                  type=base_worker.NixlAgentMetadata)
    assert kvlayout.Geometry.from_json(meta.kvlayout_geometry) == prefill.kvlayout_geometry


class RecordingWorker(OffloadingWorker):
    """Stands in for vLLM's CUDA-only ``CPUOffloadingWorker`` (module docs): records jobs."""

    def __init__(self):
        self.jobs: list = []

    def submit_store(self, job_id, src_spec, dst_spec):
        self.jobs.append(("store", job_id))
        return True

    def submit_load(self, job_id, src_spec, dst_spec, expedited=False):
        self.jobs.append(("load", job_id))
        return True

    def get_finished(self):
        return []

    def wait(self, job_ids):
        pass


def offloading(model_dir):
    return connector(kv_vllm.KvlayoutOffloadingConnector, model_dir, KVConnectorRole.WORKER,
                     "offload-0", "kv_both", extra={"cpu_bytes_to_use": 1 << 22}, register=False)


def test_offloading_worker_refused_by_vllm_on_the_cpu(model_dir):
    conn, kv = offloading(model_dir)
    with set_current_vllm_config(conn._vllm_config):
        with pytest.raises(Exception, match="CPU Offloading is currently only supported on "
                                            "CUDA-alike and XPU GPUs"):
            conn.register_kv_caches(kv)
    assert conn.kvlayout_geometry.bytes_per_token == 2 * 512  # read before vLLM refused


def gpu(ids):
    return GPULoadStoreSpec(ids, group_sizes=[len(ids)], block_indices=[0])


def run_step(conn, load_jobs, store_jobs):
    """One engine step of vLLM's worker-side calls: ``wait_for_save`` queues the stores, the
    next ``start_load_kv`` submits them, then the loads."""
    conn.bind_connector_metadata(OffloadingConnectorMetadata(load_jobs={}, store_jobs=store_jobs))
    conn.wait_for_save()
    conn.bind_connector_metadata(OffloadingConnectorMetadata(load_jobs=load_jobs, store_jobs={}))
    conn.start_load_kv(None)


def test_offload_jobs_guarded_through_vllm_worker_code(model_dir):
    conn, kv = offloading(model_dir)
    recorder = RecordingWorker()
    conn.connector_worker.spec.get_worker = lambda canonical: recorder
    with set_current_vllm_config(conn._vllm_config):
        conn.register_kv_caches(kv)  # vLLM's canonical mapping, then the guard
    assert hasattr(recorder.submit_store, "__kvlayout_unchecked__")
    cpu = CPULoadStoreSpec([0, 1])
    run_step(conn, {2: TransferJob("r", cpu, gpu([3, 4]))}, {1: TransferJob("r", gpu([0, 9]), cpu)})
    assert recorder.jobs == [("store", 1), ("load", 2)]
    # 10 blocks: a store reading block 10 is past the pool; a load writing block 3 twice.
    with pytest.raises(kvlayout.TransferRefused) as e:
        run_step(conn, {}, {3: TransferJob("r", gpu([10]), CPULoadStoreSpec([0]))})
    assert e.value.kind == "page_out_of_range"
    conn.connector_worker._unsubmitted_store_jobs.clear()  # the refused job stays queued in vLLM
    with pytest.raises(kvlayout.TransferRefused) as e:
        run_step(conn, {4: TransferJob("r", cpu, gpu([3, 3]))}, {})
    assert e.value.kind == "duplicate_destination"
    assert recorder.jobs == [("store", 1), ("load", 2)]
