"""Pools built from real torch tensors: on CUDA when a GPU is present (an H200 in the project's
device runs), on the CPU otherwise. Skipped, saying why, without torch or without a GPU."""

from __future__ import annotations

import types

import pytest

import kvlayout
from kvlayout.adapters import sglang

torch = pytest.importorskip("torch", reason="torch not installed: real-tensor pools not tested")


def _dsa_pools(device: str, layers: int = 61, pages: int = 8, page: int = 64):
    """SGLang's NSATokenToKVPool / NSATokenToKVPoolHost shapes (see tests/fakes.py) in torch."""
    size = pages * page - page
    num_pages = (size + page + 1) // page
    dev = types.SimpleNamespace(
        page_size=page, size=size, layer_num=layers, kv_lora_rank=512, qk_rope_head_dim=64,
        dtype=torch.float8_e4m3fn, store_dtype=torch.uint8, kv_cache_dim=656,
        index_head_dim=128, quant_block_size=128,
        kv_buffer=[torch.zeros((size + page, 1, 656), dtype=torch.uint8, device=device)
                   for _ in range(layers)],
        index_k_with_scale_buffer=[torch.zeros((num_pages, page * 128), dtype=torch.bfloat16,
                                               device=device) for _ in range(layers)])
    host_pages = 2 * pages
    stride = page * (128 + 128 // 128 * 4)
    host = types.SimpleNamespace(
        device_pool=dev, layout="page_first", page_size=page, size=host_pages * page,
        page_num=host_pages, layer_num=layers, kv_lora_rank=512, qk_rope_head_dim=64,
        kv_cache_dim=656, dtype=torch.uint8, token_stride_size=656, index_head_dim=128,
        indexer_quant_block_size=128, indexer_page_stride_size=stride,
        kv_buffer=torch.zeros((host_pages * page, layers, 1, 656), dtype=torch.uint8),
        index_k_with_scale_buffer=torch.zeros(((host_pages * page + page + 1) // page, layers, 1,
                                               stride), dtype=torch.uint8))
    return dev, host


def _run(device: str):
    dev, host = _dsa_pools(device)
    g = sglang.device_geometry(dev)
    # the adapter's geometry from live tensors = the CLI's from config.json
    assert g.fingerprint == kvlayout.describe("deepseek-v3.2-exp", index_k="bf16").fingerprint
    with pytest.raises(kvlayout.Incompatible) as e:
        sglang.transfer_guard(dev, host)
    assert "index_k.bytes_per_token: 256, 132" in e.value.lines
    guard = kvlayout.TransferGuard(g, g)
    guard.check_pages("load", 3, torch.tensor([1, 2]), torch.tensor([3, 4]))
    with pytest.raises(kvlayout.TransferRefused):
        guard.check_pages("load", 3, torch.tensor([1, 2]), torch.tensor([3, 3]))
    return dev, guard


def test_real_tensors_on_cpu():
    _run("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA GPU: the pools on device memory are tested on the H200 runs")
def test_real_tensors_on_cuda():
    dev, guard = _run("cuda")
    assert dev.kv_buffer[0].is_cuda
    # page indices in device memory are refused by name: the check reads them on the CPU
    with pytest.raises(TypeError, match="device memory"):
        guard.check_pages("load", None, torch.tensor([1], device="cuda"), [0])
