"""README's wiring snippets (the fenced blocks after ``<!-- readme-wiring: NAME -->``), copied
out of README.md and run on the real engines: SGLang 0.5.23's modules and pools, vLLM 0.33.0's
connector factory."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import warnings

import kvlayout
import kvlayout.vllm as kv_vllm

warnings.filterwarnings("ignore", category=UserWarning)

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def snippet(name: str) -> str:
    text = README.read_text()
    m = re.search(rf"<!-- readme-wiring: {re.escape(name)} -->\n```\w+\n(.*?)```", text, re.S)
    assert m, f"README has no wiring snippet {name!r}"
    return m.group(1)


def test_sglang_install_snippet():
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.pool_host import mha

    exec(snippet("sglang"), {})
    assert hasattr(HiCacheController.__init__, "__kvlayout_unchecked__")
    op = getattr(mha, "transfer_kv_per_layer", None)  # absent on a CPU: no sgl_kernel import
    assert op is None or hasattr(op, "__kvlayout_unchecked__")


def test_sglang_pools_snippet():
    from sglang_build import dsa, indexer_host, mla_host

    device_pool = dsa()
    host_pool = mla_host(device_pool, "page_first")
    ns = {"device_pool": device_pool, "host_pool": host_pool,
          "indexer_host": indexer_host(device_pool, host_pool)}
    exec(snippet("sglang-pools"), ns)
    assert isinstance(ns["guard"], kvlayout.TransferGuard)


def test_vllm_snippet(vllm_tp_group):
    """The README's ``--kv-transfer-config`` JSON, as given, through vLLM's connector factory:
    the worker connector is built and registers its KV caches (plus ``kv_buffer_device="cpu"``
    and an ``engine_id``, which vLLM's CPU platform and a server would add)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector
    from vllm_build import connector

    words = shlex.split(snippet("vllm"))
    assert words[:3] == ["vllm", "serve", "MODEL"]
    config = json.loads(words[words.index("--kv-transfer-config") + 1])
    conn, _ = connector(None, vllm_tp_group, KVConnectorRole.WORKER, "readme-0", None,
                        transfer=config)
    assert type(conn).__name__ == "KvlayoutNixlConnector" and isinstance(conn, NixlConnector)
    assert isinstance(conn.kvlayout_geometry, kvlayout.Geometry)
    assert kv_vllm._require(conn._vllm_config) is True  # "kvlayout_require": true
