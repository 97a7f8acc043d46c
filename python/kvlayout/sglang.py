"""SGLang wiring in one line: ``kvlayout.sglang.install()`` before SGLang builds its pools.

.. code-block:: python

    import kvlayout.sglang
    kvlayout.sglang.install()      # then start SGLang in this process (sglang.launch_server ...)

Nothing in SGLang is edited; ``install`` wraps, in the running process:

1. the HiCache transfer ops where SGLang 0.5.23 imports them: the host pool modules
   ``sglang.srt.mem_cache.pool_host.{mha,mla,dsa}`` and ``memory_pool_host`` (DeepSeek-V4), the
   ``sgl_kernel.kvcacheio`` ops and the JIT ``jit_transfer_hicache_*`` kernels
   (:func:`kvlayout.adapters.sglang.guard_transfer_ops`): a call whose item size or rows
   disagree with its tensors is refused before the kernel runs;
2. ``HiCacheController.__init__`` (``sglang/srt/managers/cache_controller.py``, also run by its
   subclass ``HybridCacheController``): once the device and host pools are paired,
   :func:`kvlayout.adapters.sglang.transfer_guard` and ``check_item_sizes`` run on each pair
   (:func:`pairs`: each entry of a host pool group with its own device pool, so both halves of
   a SWA hybrid; the DSA index-K host, ``DSAIndexerPoolHost``, passed as ``indexer=``); the
   guards are kept as ``controller.kvlayout_guards`` (by pool name) and the KV pair's as
   ``controller.kvlayout_guard``. A pair that does not mirror raises ``Incompatible`` and
   SGLang does not start; a pool the adapter does not read (a Mamba state pool) is named in a
   ``UserWarning``;
3. the prefill/decode bootstrap (``sglang/srt/disaggregation``, Mooncake): the decode rank's
   registration message (``build_receiver_registration_message``) gets one more frame, the
   ``kvlayout.pd`` handshake message with its geometry; the prefill rank reads it
   (``KVArgsRegisterInfo.from_zmq``) and runs :func:`kvlayout.pd.check_peer` in
   ``MooncakeKVManager._publish_peer_registration``, before the peer enters
   ``decode_kv_args_table``, so before any ``send_kvcache``. A refused peer is never published
   (its transfers cannot start) and the refusal is returned as SGLang's rejection reason. The
   rank's own geometry is given with :func:`set_pd_geometry` (e.g. ``kvlayout.adapters.sglang.
   device_geometry(token_to_kv_pool)``); without it the frame is not sent and peers are checked
   against nothing (a warning).

Tested on SGLang 0.5.23 (:data:`TESTED_SGLANG`); another version is refused loudly
(``KvLayoutError`` naming it), since the modules and methods wrapped move between releases.
"""

from __future__ import annotations

import functools
import importlib
import logging
import warnings
from typing import Any, Optional

import kvlayout

from .adapters import sglang as _adapter
from .errors import KvLayoutError

__all__ = ["TESTED_SGLANG", "HOST_POOL_MODULES", "check_version", "install", "set_pd_geometry",
           "pd_frame", "read_pd_frame", "pairs", "guard_pairs", "guard_pair"]

TESTED_SGLANG = ("0.5.23",)
HOST_POOL_MODULES = ("sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.pool_host.mla",
                     "sglang.srt.mem_cache.pool_host.dsa", "sglang.srt.mem_cache.memory_pool_host")
_log = logging.getLogger("kvlayout.sglang")
_state: dict = {"geometry": None, "require": False, "installed": False}


def check_version(version: Optional[str] = None) -> str:
    """Checks an SGLang version against the ones this wiring was tested on
    (:data:`TESTED_SGLANG`: SGLang 0.5.23) and returns it as a string.

    ``version``: the version to check (compared as ``str(version)``, exactly: ``"0.5.23"``, not
    ``"0.5"``); ``None`` (the default) checks the installed SGLang's
    (``sglang.version.__version__``), importing it. Passing a version only checks that string:
    it neither changes nor skips the check :func:`install` makes of the installed SGLang.

    # Errors
    ``KvLayoutError`` naming the version and the tested ones when it is not in
    :data:`TESTED_SGLANG`; ``ImportError`` when ``version`` is ``None`` and SGLang is not
    installed."""
    if version is None:
        from sglang.version import __version__ as version  # type: ignore[no-redef]
    if str(version) not in TESTED_SGLANG:
        raise KvLayoutError(f"kvlayout.sglang: SGLang {version} is not a version this wiring was "
                            f"tested on ({', '.join(TESTED_SGLANG)}); the modules it wraps may "
                            "have moved: refused")
    return str(version)


def set_pd_geometry(geometry: Optional[kvlayout.Geometry], *, require: bool = False) -> None:
    """This rank's geometry for the prefill/decode handshake; ``require``: refuse peers that
    send none. Raises ``TypeError`` naming ``geometry`` when it is neither a
    ``kvlayout.Geometry`` nor ``None``, and naming ``require`` when that is not a bool."""
    if geometry is not None and not isinstance(geometry, kvlayout.Geometry):
        raise TypeError(
            f"geometry: expected a kvlayout.Geometry or None, got {type(geometry).__name__}"
        )
    if not isinstance(require, bool):
        raise TypeError(f"require: expected a bool, got {type(require).__name__}")
    _state["geometry"] = geometry
    _state["require"] = require


def _prefix() -> bytes:
    from .pd import handshake

    return handshake.SCHEMA.encode() + b"\n"


def pd_frame(geometry: kvlayout.Geometry, agent: str = "sglang-decode") -> bytes:
    """The registration frame a decode rank appends: the handshake schema line, then the
    ``kvlayout.pd`` message (JSON). Raises ``TypeError`` naming ``geometry`` when it is not a
    ``kvlayout.Geometry``."""
    from .pd import make_message

    if not isinstance(geometry, kvlayout.Geometry):
        raise TypeError(f"geometry: expected a kvlayout.Geometry, got {type(geometry).__name__}")

    return _prefix() + make_message(agent, geometry, {})


def read_pd_frame(frames: list) -> tuple[list, Optional[dict]]:
    """The frames without the kvlayout frame, and its message (``None`` when absent)."""
    from .pd import parse_message

    prefix = _prefix()
    for i, f in enumerate(frames):
        if isinstance(f, (bytes, bytearray)) and bytes(f).startswith(prefix):
            return list(frames[:i]) + list(frames[i + 1:]), parse_message(bytes(f)[len(prefix):])
    return list(frames), None


def install(*, _version: Optional[str] = None) -> list[str]:
    """Wraps SGLang's transfer ops, HiCache pairing and PD bootstrap (module docs). Returns what
    was wrapped; the transfer ops it cannot check are named at WARNING in the
    ``kvlayout.sglang`` log. Idempotent.

    ``_version`` is a test hook, not an option: the SGLang version to check in place of the
    installed one's (a test of the refusal passes an untested version). It does not make
    another version run: wrapping still imports the installed SGLang's modules.

    # Errors
    ``KvLayoutError`` naming an SGLang version not in :data:`TESTED_SGLANG`."""
    check_version(_version)
    done: list[str] = []
    modules = [importlib.import_module(m) for m in HOST_POOL_MODULES]
    with warnings.catch_warnings(record=True) as unchecked:
        warnings.simplefilter("always", UserWarning)
        done += _adapter.guard_transfer_ops(*modules)
    # The ops guard_transfer_ops cannot check (SGLang 0.5.23: the staged layer-first to
    # page-first all-layer ops) go to the log at WARNING, never in silence (before, the warning
    # naming them was ignored and nothing was logged).
    for w in unchecked:
        _log.warning("%s", w.message)
    done += _wrap_hicache()
    done += _wrap_bootstrap()
    _state["installed"] = True
    return done


def _wrapped(obj: Any, name: str, make) -> bool:
    original = getattr(obj, name)
    if hasattr(original, "__kvlayout_unchecked__"):
        return False
    new = make(original)
    new.__kvlayout_unchecked__ = original
    setattr(obj, name, new)
    return True


_INDEXER_HOST = "DSAIndexerPoolHost"


def _modelled(device: Any) -> bool:
    """Whether :mod:`kvlayout.adapters.sglang` reads this device pool: an MHA pool
    (``k_buffer`` / ``v_buffer``) or an MLA/DSA pool (``kv_buffer``)."""
    return hasattr(device, "k_buffer") or hasattr(device, "kv_buffer")


def pairs(device: Any, host: Any) -> list[tuple[str, Any, Any, Any]]:
    """The device/host pairs of a controller, as ``(name, device pool, host pool, indexer host
    or None)``, the KV (anchor) pair first. A plain host pool pairs with ``device``. A
    ``HostPoolGroup`` (``pool_host/group.py``: ``entries`` of ``PoolEntry(name, host_pool,
    device_pool)``, ``anchor_entry`` the KV pool) pairs each entry's host with the entry's own
    device pool, so a hybrid (SWA: ``full_kv_pool`` and ``swa_kv_pool`` under one
    ``SWAKVPool``) pairs each half; a ``DSAIndexerPoolHost`` entry goes with the pair of its
    device pool as ``indexer=``."""
    entries = getattr(host, "entries", None)
    if entries is None:
        return [("kv", device, host, None)]
    indexers = [e for e in entries if type(e.host_pool).__name__ == _INDEXER_HOST]
    ordered = [host.anchor_entry] + [e for e in entries if e is not host.anchor_entry]
    return [(str(getattr(e.name, "value", e.name)), e.device_pool, e.host_pool,
             next((i.host_pool for i in indexers if i.device_pool is e.device_pool), None))
            for e in ordered if all(e is not i for i in indexers)]


def guard_pairs(controller: Any) -> dict[str, kvlayout.TransferGuard]:
    """A guard per device/host pair of a ``HiCacheController`` (:func:`pairs`), after
    ``transfer_guard`` and ``check_item_sizes`` (raise ``Incompatible``). A pair whose device
    pool the adapter does not read (a Mamba state pool, say) is named in one ``UserWarning``
    and left unchecked, never passed over in silence."""
    guards, unchecked = {}, []
    for name, device, host, indexer in pairs(controller.mem_pool_device,
                                             controller.mem_pool_host):
        if not _modelled(device):
            unchecked.append(f"{name} ({type(device).__name__})")
            continue
        guards[name] = _adapter.transfer_guard(device, host, indexer=indexer)
        _adapter.check_item_sizes(device, host, indexer=indexer)
    if unchecked:
        warnings.warn("kvlayout.sglang: HiCache pools not checked (not modelled by "
                      f"kvlayout.adapters.sglang): {', '.join(unchecked)}", UserWarning,
                      stacklevel=2)
    return guards


def guard_pair(controller: Any) -> Optional[kvlayout.TransferGuard]:
    """The guard of a ``HiCacheController``'s KV (anchor) pair, or ``None`` when the adapter
    does not read that pool (:func:`guard_pairs` checks every pair; raises ``Incompatible``)."""
    guards = guard_pairs(controller)
    anchor = pairs(controller.mem_pool_device, controller.mem_pool_host)[0][0]
    return guards.get(anchor)


def _wrap_hicache() -> list[str]:
    from sglang.srt.managers import cache_controller

    cls = cache_controller.HiCacheController

    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.kvlayout_guards = guard_pairs(self)
            self.kvlayout_guard = self.kvlayout_guards.get(
                pairs(self.mem_pool_device, self.mem_pool_host)[0][0])

        return __init__

    return ["HiCacheController.__init__"] if _wrapped(cls, "__init__", make) else []


def _wrap_bootstrap() -> list[str]:
    from sglang.srt.disaggregation.mooncake import conn

    done = []
    info = conn.KVArgsRegisterInfo

    def make_from_zmq(original):
        func = original.__func__

        @functools.wraps(func)
        def from_zmq(cls, msg):
            frames, message = read_pd_frame(list(msg))
            obj = func(cls, frames)
            obj.kvlayout_message = message
            return obj

        return classmethod(from_zmq)

    if not hasattr(info.from_zmq, "__kvlayout_unchecked__"):
        original = info.__dict__["from_zmq"]
        new = make_from_zmq(original)
        new.__func__.__kvlayout_unchecked__ = original
        info.from_zmq = new
        done.append("KVArgsRegisterInfo.from_zmq")

    manager = conn.MooncakeKVManager

    def make_publish(original):
        @functools.wraps(original)
        def _publish_peer_registration(self, mooncake_session_id, decode_kv_args):
            refusal = check_registration(decode_kv_args)
            if refusal is not None:
                _log.error("kvlayout: decode peer %s refused: %s", mooncake_session_id, refusal)
                return refusal
            return original(self, mooncake_session_id, decode_kv_args)

        return _publish_peer_registration

    if _wrapped(manager, "_publish_peer_registration", make_publish):
        done.append("MooncakeKVManager._publish_peer_registration")

    def make_build(original):
        @functools.wraps(original)
        def build_receiver_registration_message(self, *args, **kwargs):
            message = original(self, *args, **kwargs)
            if _state["geometry"] is not None:
                message = list(message) + [pd_frame(_state["geometry"])]
            return message

        return build_receiver_registration_message

    for cls in {manager, *[c for c in manager.__mro__ if "build_receiver_registration_message"
                            in c.__dict__]}:
        if "build_receiver_registration_message" in cls.__dict__ and _wrapped(
                cls, "build_receiver_registration_message", make_build):
            done.append(f"{cls.__name__}.build_receiver_registration_message")
    return done


def check_registration(decode_kv_args: Any) -> Optional[str]:
    """``None`` when the decode peer may be published, else the refusal (its diff lines)."""
    from .pd import PeerRefused, check_peer

    local = _state["geometry"]
    message = getattr(decode_kv_args, "kvlayout_message", None)
    if local is None:
        if message is not None:
            warnings.warn("kvlayout: a decode peer sent its geometry but this rank has none "
                          "(kvlayout.sglang.set_pd_geometry): not checked", UserWarning,
                          stacklevel=2)
        return None
    try:
        check_peer(local, message if message is not None else {"agent": getattr(
            decode_kv_args, "mooncake_session_id", None)}, require=_state["require"])
    except PeerRefused as e:
        return f"kvlayout: {e.header}: " + "; ".join(e.lines)
    return None
