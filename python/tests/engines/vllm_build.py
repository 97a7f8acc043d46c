"""vLLM KV caches built with vLLM's own code on the CPU (../shared/ENGINES.md, "Exact steps").

vLLM 0.33: ``VllmConfig`` over a tiny ``config.json`` (Llama, 2 layers), layer specs built with
vLLM's spec classes as each layer's ``get_kv_cache_spec`` builds them, ``KVCacheConfig`` from
``get_kv_cache_config_builder`` + ``kv_cache_planning.get_kv_cache_groups_from_builder`` +
``get_kv_cache_config_from_groups(vc, groups, 10)`` (10 blocks), and the tensors from
``vllm.v1.worker.utils.allocate_kv_cache`` (the call both model runners make before
``register_kv_caches``). Each attention layer: ``FullAttentionSpec(block_size=16,
num_kv_heads=2, head_size=64)`` unless a test says otherwise.
"""

from __future__ import annotations

import json
import os
import pathlib

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402

BLOCKS = 10
BLOCK_TOKENS = 16

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512, "rope_theta": 500000.0,
    "vocab_size": 1024, "torch_dtype": "bfloat16",
}


def vllm_config(tmp: pathlib.Path, layout: str = "LBNHC", *, cache_dtype: str = "auto",
                block_tokens: int = BLOCK_TOKENS):
    from vllm.config import CacheConfig, ModelConfig, VllmConfig

    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    vc = VllmConfig(
        model_config=ModelConfig(model=str(model), skip_tokenizer_init=True, max_model_len=512,
                                 dtype="bfloat16"),
        cache_config=CacheConfig(block_size=block_tokens, cache_dtype=cache_dtype))
    vc.cache_config.kv_cache_layout = layout  # vLLM: preset "for tests and standalone tools"
    return vc


def allocate(vc, specs: dict):
    """``(kv_cache_config, kv_caches)`` for ``{layer_name: spec}``, as vLLM's runners make them."""
    from vllm.v1.core import kv_cache_planning
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    builder = get_kv_cache_config_builder(vc)
    groups = kv_cache_planning.get_kv_cache_groups_from_builder(builder, vc, specs)
    cfg = builder.get_kv_cache_config_from_groups(vc, groups, BLOCKS)
    layout = KVCacheLayout[vc.cache_config.kv_cache_layout]
    return cfg, allocate_kv_cache(cfg, torch.device("cpu"), layout)


def full(heads=2, head=64, dtype=torch.bfloat16, *, block_tokens=BLOCK_TOKENS, **kw):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=block_tokens, num_kv_heads=heads, head_size=head,
                             dtype=dtype, **kw)


def attn(n: int) -> str:
    return f"model.layers.{n}.self_attn.attn"


# The connectors (kvlayout.vllm) on vLLM's CPU platform: the CPU attention backend needs blocks
# of a multiple of 32 tokens ("No common block size for 16 (CPU_ATTN: [MultipleOf(32)])").
NIXL_BLOCK_TOKENS = 32
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def init_tp_group(model_dir: pathlib.Path) -> None:
    """vLLM's tensor-parallel group of one rank (gloo), which the NIXL worker reads."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    with set_current_vllm_config(vllm_config(model_dir, block_tokens=NIXL_BLOCK_TOKENS)):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://{LOOPBACK}:{free_port()}")
        ensure_model_parallel_initialized(1, 1)


def connector(cls, model_dir, role, engine_id, kv_role, *, heads=2, extra=None, register=True,
              transfer=None):
    """``(connector, kv_caches)``: a connector built by vLLM's ``KVConnectorFactory``
    (``create_connector``) from ``transfer`` (``--kv-transfer-config``'s JSON as a dict; default
    the class by name, and ``kv_connector_module_path`` ``kvlayout.vllm`` for kvlayout's), plus
    ``kv_buffer_device="cpu"`` (vLLM's CPU platform) and ``engine_id``. A worker has registered
    its KV caches: 2 layers of ``FullAttentionSpec(32 tokens, heads, 64)`` bf16, 10 blocks,
    layout LBHNC (the one ``NixlConnector.get_required_kvcache_layout`` asks for)."""
    from vllm.config import KVTransferConfig, set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    vc = vllm_config(model_dir, "LBHNC", block_tokens=NIXL_BLOCK_TOKENS)
    if transfer is None:
        transfer = {"kv_connector": cls.__name__, "kv_role": kv_role,
                    "kv_connector_extra_config": extra or {}}
        if cls.__module__ == "kvlayout.vllm":
            transfer["kv_connector_module_path"] = "kvlayout.vllm"
    vc.kv_transfer_config = KVTransferConfig(**transfer, kv_buffer_device="cpu",
                                             engine_id=engine_id)
    spec = full(heads=heads, block_tokens=NIXL_BLOCK_TOKENS)
    with set_current_vllm_config(vc):
        cfg, kv = allocate(vc, {attn(0): spec, attn(1): spec})
        affinity = os.sched_getaffinity(0)
        try:
            conn = KVConnectorFactory.create_connector(vc, role, cfg)
        finally:
            # vLLM's CPU worker pins the process to one core per NUMA node (nixl/base_worker.py).
            os.sched_setaffinity(0, affinity)
        if role.name == "WORKER" and register:
            conn.register_kv_caches(kv)
    return conn, kv
