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


def test_vllm_snippet():
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

    words = shlex.split(snippet("vllm"))
    config = json.loads(words[words.index("--kv-transfer-config") + 1])
    cls = KVConnectorFactory.get_connector_class(KVTransferConfig(**config))
    assert cls.__name__ == "KvlayoutNixlConnector" and issubclass(cls, NixlConnector)
    assert config["kv_connector_extra_config"] == {"kvlayout_require": True}
