"""vLLM wiring in one line: KV connectors loadable by module path, nothing in vLLM edited.

.. code-block:: sh

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvlayoutNixlConnector",
        "kv_connector_module_path": "kvlayout.vllm", "kv_role": "kv_producer"}'

vLLM's ``KVConnectorFactory.get_connector_class`` imports ``kv_connector_module_path`` and takes
the class named ``kv_connector`` from it (``vllm/distributed/kv_transfer/kv_connector/factory.py``).

- :class:`KvlayoutNixlConnector` (vLLM's ``NixlConnector``, the pull connector): at
  ``register_kv_caches`` it reads the rank's geometry from its tensors
  (:func:`kvlayout.adapters.vllm.geometry`, with ``CacheConfig.kv_cache_layout``, the
  ``--kv-cache-dtype`` and the tensor-parallel size and rank) and adds it to the handshake
  metadata vLLM already sends (``NixlAgentMetadata``, as the fields ``kvlayout_geometry`` (the
  geometry file's text) and ``kvlayout_fingerprint``). When a peer's metadata arrives,
  ``add_remote_agent`` first runs :func:`kvlayout.pd.check_peer` on it; a
  :class:`kvlayout.pd.PeerRefused` fails the handshake before the peer is registered with NIXL,
  so before any transfer. A peer without geometry is refused when ``kv_connector_extra_config``
  has ``"kvlayout_require": true``, else it warns.
- :class:`KvlayoutOffloadingConnector` (vLLM's ``OffloadingConnector``, CPU offload): the same
  geometry; every store and load the offloading worker submits has its GPU block ids checked by
  a :class:`kvlayout.TransferGuard` (each id inside the device pool, no destination block twice)
  before it is submitted.

Tested on vLLM 0.33.0 (:data:`TESTED_VLLM`); another version is refused at construction naming
it (``KvLayoutError``), since the connector internals it wraps move between releases.
"""

from __future__ import annotations

from typing import Any, Optional

import kvlayout

from .adapters import vllm as _adapter
from .errors import KvLayoutError

__all__ = ["TESTED_VLLM", "check_version", "KvlayoutNixlConnector",
           "KvlayoutOffloadingConnector", "with_geometry", "check_remote", "rank_geometry",
           "guard_offload_worker"]

TESTED_VLLM = ("0.33.0",)


def check_version(version: Optional[str] = None) -> str:
    """Checks a vLLM version against the ones this wiring was tested on (:data:`TESTED_VLLM`)
    and returns it as a string.

    ``version``: the version to check (compared as ``str(version)``, exactly: ``"0.33.0"``, not
    ``"0.33"``); ``None`` (the default) checks the installed vLLM's (``vllm.__version__``),
    importing it.

    # Errors
    ``KvLayoutError`` naming the version and the tested ones when it is not in
    :data:`TESTED_VLLM`; ``ImportError`` when ``version`` is ``None`` and vLLM is not
    installed."""
    if version is None:
        import vllm

        version = vllm.__version__
    version = str(version)
    if version not in TESTED_VLLM:
        raise KvLayoutError(f"kvlayout.vllm: vLLM {version} is not a version this wiring was "
                            f"tested on ({', '.join(TESTED_VLLM)}); its connector internals may "
                            "have moved: refused")
    return version


def rank_geometry(kv_caches: dict, vllm_config: Any, kv_cache_config: Any) -> kvlayout.Geometry:
    """The worker's geometry: its tensors, ``kv_cache_config``, ``CacheConfig.kv_cache_layout``,
    ``--kv-cache-dtype`` and the tensor-parallel size and rank."""
    tp, rank = 1, 0
    try:
        from vllm.distributed import (get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)

        tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    except (AssertionError, ImportError, RuntimeError):
        pass  # no initialised tensor-parallel group: a single rank
    cache = vllm_config.cache_config
    return _adapter.geometry(kv_caches, kv_cache_config, kv_cache_dtype=str(cache.cache_dtype),
                             kv_cache_layout=getattr(cache, "kv_cache_layout", None),
                             tp=tp, rank=rank)


def _agent_metadata_class():
    """vLLM's ``NixlAgentMetadata`` with the two kvlayout fields (defaults ``None``): the class
    each side encodes and decodes the handshake with once :func:`_install_metadata` ran."""
    from dataclasses import dataclass

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata as nixl_metadata

    base = nixl_metadata.NixlAgentMetadata
    if getattr(base, "__kvlayout__", False):
        return base

    @dataclass
    class KvlayoutAgentMetadata(base):  # type: ignore[valid-type,misc]
        kvlayout_geometry: Optional[str] = None
        kvlayout_fingerprint: Optional[int] = None

    KvlayoutAgentMetadata.__kvlayout__ = True  # type: ignore[attr-defined]
    KvlayoutAgentMetadata.__qualname__ = base.__qualname__
    return KvlayoutAgentMetadata


def _install_metadata():
    """Points ``base_worker.NixlAgentMetadata``, the name vLLM's NIXL worker encodes and decodes
    the handshake with, at the subclass with the kvlayout fields, so the decoder keeps them (a
    peer without kvlayout decodes as ``None``).

    Process-wide rather than per worker because vLLM offers no narrower hook:
    ``_nixl_handshake`` builds ``msgspec.msgpack.Decoder(NixlAgentMetadata)`` from that module
    global inside the method, between receiving the bytes and calling ``add_remote_agent``
    (msgspec drops the fields a dataclass does not declare), and ``restore_kv_caches`` decodes
    and re-encodes the payload with it too. The change is confined to that one name: vLLM's
    class (``metadata.NixlAgentMetadata``) and the compatibility hash are untouched, a plain
    ``NixlConnector`` in the same process sends the two fields as ``None``, and a vLLM without
    kvlayout decodes a payload carrying them (msgspec skips unknown fields)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    cls = _agent_metadata_class()
    base_worker.NixlAgentMetadata = cls
    return cls


def with_geometry(payload: Any, geometry: kvlayout.Geometry) -> Any:
    """vLLM's ``NixlHandshakePayload`` with the geometry added to its ``NixlAgentMetadata``
    (``kvlayout_geometry``, ``kvlayout_fingerprint``); the compatibility hash is unchanged."""
    import msgspec

    cls = _agent_metadata_class()
    meta = msgspec.msgpack.Decoder(cls).decode(payload.agent_metadata_bytes)
    meta.kvlayout_geometry = geometry.to_json()
    meta.kvlayout_fingerprint = geometry.fingerprint
    return type(payload)(compatibility_hash=payload.compatibility_hash,
                         agent_metadata_bytes=msgspec.msgpack.encode(meta))


def check_remote(local: kvlayout.Geometry, meta: Any, *, require: bool = False):
    """:func:`kvlayout.pd.check_peer` on a peer's decoded ``NixlAgentMetadata``: raises
    ``PeerRefused`` (the diff lines) when the two pools cannot exchange pages."""
    from kvlayout.pd import check_peer

    text = getattr(meta, "kvlayout_geometry", None)
    msg: dict = {"agent": getattr(meta, "engine_id", None)}
    if text is not None:
        msg["geometry"] = text
        msg["fingerprints"] = {"pool": getattr(meta, "kvlayout_fingerprint", None)}
    return check_peer(local, msg, require=require)


def _require(vllm_config: Any) -> bool:
    """``kv_connector_extra_config.kvlayout_require`` (default false): a JSON bool; anything
    else raises ``KvLayoutError`` naming it (before, ``"false"`` read as true)."""
    extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
    value = extra.get("kvlayout_require", False)
    if not isinstance(value, bool):
        raise KvLayoutError(f"kv_connector_extra_config.kvlayout_require: {value!r} is not a "
                            "bool (pass true or false)")
    return value


def _nixl_base():
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

    return NixlConnector


def _offloading_base():
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import \
        OffloadingConnector

    return OffloadingConnector


def _guard_worker_adds(connector: Any) -> None:
    """Wraps the NIXL worker's ``add_remote_agent`` so the peer is checked first."""
    worker = getattr(connector, "connector_worker", None)
    if worker is None or hasattr(worker.add_remote_agent, "__kvlayout_unchecked__"):
        return
    original = worker.add_remote_agent

    def add_remote_agent(nixl_agent_meta, *args, **kwargs):
        local = getattr(connector, "kvlayout_geometry", None)
        if local is None:
            raise KvLayoutError("kvlayout.vllm: a peer arrived before register_kv_caches built "
                                "this rank's geometry: refused")
        check_remote(local, nixl_agent_meta, require=_require(connector._vllm_config))
        return original(nixl_agent_meta, *args, **kwargs)

    add_remote_agent.__kvlayout_unchecked__ = original  # type: ignore[attr-defined]
    worker.add_remote_agent = add_remote_agent


def __getattr__(name: str):
    # The connector classes subclass vLLM's and are built on first access, so that importing
    # kvlayout.vllm (or kvlayout) never imports vLLM.
    if name in ("KvlayoutNixlConnector", "KvlayoutOffloadingConnector"):
        cls = _build(name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module 'kvlayout.vllm' has no attribute {name!r}")


def _build(name: str) -> type:
    if name == "KvlayoutNixlConnector":
        base = _nixl_base()

        class KvlayoutNixlConnector(base):  # type: ignore[valid-type,misc]
            """vLLM's ``NixlConnector`` that sends this rank's geometry with the handshake and
            checks each peer's before registering it (module docs)."""

            def __init__(self, vllm_config, role, kv_cache_config=None):
                check_version()
                _require(vllm_config)  # a bad value fails the start, not the first handshake
                _install_metadata()
                super().__init__(vllm_config, role, kv_cache_config)
                self.kvlayout_geometry: Optional[kvlayout.Geometry] = None
                _guard_worker_adds(self)

            def register_kv_caches(self, kv_caches):
                self.kvlayout_geometry = rank_geometry(kv_caches, self._vllm_config,
                                                       self._kv_cache_config)
                super().register_kv_caches(kv_caches)
                worker = self.connector_worker
                worker.xfer_handshake_metadata = with_geometry(worker.xfer_handshake_metadata,
                                                               self.kvlayout_geometry)

        return KvlayoutNixlConnector

    base = _offloading_base()

    class KvlayoutOffloadingConnector(base):  # type: ignore[valid-type,misc]
        """vLLM's ``OffloadingConnector`` whose offload jobs are checked by a
        ``TransferGuard`` before submission (module docs)."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            check_version()
            super().__init__(vllm_config, role, kv_cache_config)
            self.kvlayout_geometry: Optional[kvlayout.Geometry] = None
            self.kvlayout_guard: Optional[kvlayout.TransferGuard] = None

        def register_kv_caches(self, kv_caches):
            self.kvlayout_geometry = rank_geometry(kv_caches, self._vllm_config,
                                                   self._kv_cache_config)
            self.kvlayout_guard = kvlayout.TransferGuard(self.kvlayout_geometry,
                                                         self.kvlayout_geometry)
            super().register_kv_caches(kv_caches)
            guard_offload_worker(self.connector_worker.worker, self.kvlayout_guard)

    return KvlayoutOffloadingConnector


def guard_offload_worker(worker: Any, guard: kvlayout.TransferGuard) -> None:
    """Wraps an ``OffloadingWorker``'s ``submit_store`` / ``submit_load`` so that the GPU block
    ids of each job (``GPULoadStoreSpec.block_ids``) are checked by ``guard`` first: a store
    reads them (``backup``), a load writes them (``load``: no block twice). A refusal raises
    ``TransferRefused`` and the job is not submitted."""
    for method, direction in (("submit_store", "backup"), ("submit_load", "load")):
        original = getattr(worker, method)
        if hasattr(original, "__kvlayout_unchecked__"):
            continue

        def checked(job_id, src_spec, dst_spec, *args, __o=original, __d=direction, **kwargs):
            gpu = src_spec if __d == "backup" else dst_spec
            ids = [int(x) for x in gpu.block_ids]
            guard.check_pages(__d, None, ids, ids)
            return __o(job_id, src_spec, dst_spec, *args, **kwargs)

        checked.__kvlayout_unchecked__ = original  # type: ignore[attr-defined]
        setattr(worker, method, checked)
