"""Mooncake transfer engine (`mooncake-transfer-engine-non-cuda`, TCP) side of the handshake.

Mooncake keeps each engine's segment descriptor in its metadata store (here the HTTP store it
ships, `python -m mooncake.http_metadata_server`, under `mooncake/ram/<segment>`). The prefill
side puts its handshake beside it, under `kvlayout/pd/<segment>`; the decode side reads that key
and runs `handshake.check_peer` before its first transfer to the segment (the Python engine opens
a peer segment, i.e. registers the peer, on the first transfer to it).
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

KEY_PREFIX = "kvlayout/pd/"


def wait_for_store(metadata_url: str, timeout_s: float) -> None:
    """Waits until the metadata store answers HTTP (a 404 for an absent key is an answer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{metadata_url}?key=kvlayout%2Fpd%2Fprobe", timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Mooncake metadata store {metadata_url} did not answer"
                ) from None
            time.sleep(0.05)


class MooncakeSide:
    def __init__(self, segment: str, metadata_url: str, bind_addr: str, timeout_s: float = 30.0):
        wait_for_store(metadata_url, timeout_s)
        # The engine's RPC and TCP data sockets bind here instead of the first interface found.
        os.environ["MC_TCP_BIND_ADDRESS"] = bind_addr
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        self.segment = segment
        self.url = metadata_url
        rc = self.engine.initialize(segment, metadata_url, "tcp", "")
        if rc != 0:
            raise RuntimeError(
                f"Mooncake initialize({segment!r}, {metadata_url!r}, tcp) returned {rc}"
            )
        self._regions: list[int] = []

    def register(self, regions: dict[str, np.ndarray]) -> None:
        for name, a in regions.items():
            rc = self.engine.register_memory(a.ctypes.data, a.nbytes)
            if rc != 0:
                raise RuntimeError(f"Mooncake register_memory({name}, {a.nbytes} B) returned {rc}")
            self._regions.append(a.ctypes.data)

    def _key_url(self, segment: str) -> str:
        return f"{self.url}?key={urllib.parse.quote(KEY_PREFIX + segment, safe='')}"

    def publish(self, message: bytes) -> None:
        req = urllib.request.Request(self._key_url(self.segment), data=message, method="PUT")
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise RuntimeError(f"metadata PUT {KEY_PREFIX}{self.segment}: HTTP {r.status}")

    def receive(self, peer_segment: str, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self._key_url(peer_segment), timeout=10) as r:
                    return r.read()
            except urllib.error.HTTPError as e:
                if e.code != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def read(self, peer_segment: str, local: np.ndarray, remote: np.ndarray) -> int:
        """READ rows `(address, length_bytes, 0)` of `remote` into `local`; bytes moved."""
        rc = self.engine.batch_transfer_sync_read(
            peer_segment,
            [int(x) for x in local[:, 0]],
            [int(x) for x in remote[:, 0]],
            [int(x) for x in local[:, 1]],
        )
        if rc != 0:
            raise RuntimeError(f"Mooncake batch_transfer_sync_read returned {rc}")
        return int(local[:, 1].sum())

    def close(self) -> None:
        for addr in self._regions:
            self.engine.unregister_memory(addr)
        self._regions.clear()
