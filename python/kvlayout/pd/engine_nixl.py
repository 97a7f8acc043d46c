"""NIXL (`nixl-cu12`, UCX backend) side of the handshake: the geometry travels in a NIXL
notification, the receiver checks it before `add_remote_agent` (registering the peer) and before
any descriptor list or transfer exists.

Flow (decode pulls, as vLLM's NixlConnector does):
1. both sides start an agent with NIXL's listener thread and register their DRAM regions;
2. prefill fetches decode's agent metadata from decode's listener (`fetch_remote_metadata`), then
   sends the handshake (`send_notif`): geometry, fingerprints, region addresses and its own agent
   metadata (the bytes vLLM carries in `NixlAgentMetadata.agent_metadata`);
3. decode reads the notification, runs `handshake.check_peer`; only when it passes does it call
   `add_remote_agent` and READ the plan's runs.

UCX is asked for TCP only (`UCX_TLS=tcp`) unless the caller set `UCX_TLS`.
"""

from __future__ import annotations

import os
import time

import numpy as np

PREFIX = b"kvlayout.pd:"


def _import():
    os.environ.setdefault("UCX_TLS", "tcp")
    from nixl_cu12 import nixl_agent, nixl_agent_config

    return nixl_agent, nixl_agent_config


class NixlSide:
    def __init__(self, name: str, port: int):
        nixl_agent, nixl_agent_config = _import()
        conf = nixl_agent_config(enable_listen_thread=True, listen_port=port, backends=["UCX"])
        self.agent = nixl_agent(name, conf)
        self.name = name
        self._reg = None

    def register(self, regions: dict[str, np.ndarray]) -> None:
        rows = [(a.ctypes.data, a.nbytes, 0, name) for name, a in regions.items()]
        self._reg = self.agent.register_memory(rows, "DRAM")

    def metadata(self) -> bytes:
        return self.agent.get_agent_metadata()

    def publish(
        self, peer_name: str, peer_addr: str, peer_port: int, message: bytes, timeout_s: float
    ) -> None:
        """Prefill side: load the peer's metadata (so a notification can reach it), send ours."""
        deadline = time.monotonic() + timeout_s
        asked = 0.0
        while not self.agent.check_remote_metadata(peer_name):
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"no NIXL metadata from {peer_name} at {peer_addr}:{peer_port}")
            if now - asked > 1.0:  # the peer's listener may not be up yet: ask again
                self.agent.fetch_remote_metadata(peer_name, peer_addr, peer_port)
                asked = now
            time.sleep(0.005)
        self.agent.send_notif(peer_name, PREFIX + message)

    def receive(self, timeout_s: float) -> bytes:
        """Decode side: the first handshake notification, from any agent (none is loaded yet)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msgs in self.agent.get_new_notifs().values():
                for m in msgs:
                    if m.startswith(PREFIX):
                        return m[len(PREFIX) :]
            time.sleep(0.002)
        raise TimeoutError("no kvlayout handshake notification arrived")

    def connect(self, agent_metadata: bytes) -> str:
        """Registers the peer (after the check passed)."""
        return self.agent.add_remote_agent(agent_metadata)

    def read(self, peer: str, local: np.ndarray, remote: np.ndarray) -> int:
        """READ rows `(address, length_bytes, 0)` of `remote` into `local`; bytes moved."""
        ldesc = self.agent.get_xfer_descs(local, "DRAM")
        rdesc = self.agent.get_xfer_descs(remote, "DRAM")
        handle = self.agent.initialize_xfer("READ", ldesc, rdesc, peer, b"kvlayout.pd:done")
        state = self.agent.transfer(handle)
        while state == "PROC":
            state = self.agent.check_xfer_state(handle)
        self.agent.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer ended in state {state}")
        return int(local[:, 1].sum())

    def close(self) -> None:
        if self._reg is not None:
            self.agent.deregister_memory(self._reg)
            self._reg = None
