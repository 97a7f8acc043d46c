"""Geometry, compare/check and fingerprints against hand-derived values and the CLI."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import kvlayout
from conftest import ROOT, load_json, reference_fingerprint

SEED_HOST = ROOT / "configs" / "geometry" / "host-index-k-fp8-formula.json"
CASES = ROOT / "cli" / "tests" / "shared-cases"

# The seed: device index-K bf16, 128 x 2 = 256 B/token, a 64-token page 64 x 256 = 16384 B;
# host sized by the fp8 formula, 128 x 1 + 128/128 x 4 = 132 B/token, 64 x 132 = 8448 B/page.
SEED_LINES = [
    "index_k.sections.count: 1, 2",
    "index_k.sections[0].dtype: bf16, f8e4m3",
    "index_k.sections[1]: missing, f32 [1] (scale)",
    f"index_k.page_stride_bytes: {64 * 128 * 2}, {64 * (128 + 4)}",
    f"index_k.bytes_per_token: {128 * 2}, {128 + 128 // 128 * 4}",
    f"index_k.bytes_per_page: {64 * 128 * 2}, {64 * (128 + 4)}",
]


def test_import_pulls_no_tensor_library():
    code = "import sys, kvlayout; print([m for m in ('torch', 'numpy', 'ml_dtypes') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_seed_refused_with_the_six_cli_lines():
    device = kvlayout.describe("deepseek-v3.2-exp", index_k="bf16")
    host = kvlayout.Geometry.from_file(SEED_HOST)
    assert kvlayout.compare(device, host) == SEED_LINES
    with pytest.raises(kvlayout.Incompatible) as e:
        kvlayout.check(device, host)
    assert e.value.lines == SEED_LINES
    assert f"{device.fingerprint:#018x}" in e.value.header
    assert isinstance(e.value, kvlayout.KvLayoutError)
    with pytest.raises(kvlayout.Incompatible) as g:
        kvlayout.TransferGuard(device, host)
    assert g.value.lines == SEED_LINES


def test_compatible_is_empty_and_check_returns_none():
    a = kvlayout.describe("deepseek-v3.2-exp", index_k="bf16")
    b = kvlayout.Geometry.from_json(a.to_json())
    assert kvlayout.compare(a, b) == []
    assert kvlayout.check(a, b) is None
    assert a == b


def test_fingerprint_matches_the_documented_algorithm():
    for path in [SEED_HOST, *sorted(CASES.glob("*/a.json")), *sorted(CASES.glob("*/b.json"))]:
        doc = load_json(path)
        if doc.get("schema") != "kvlayout.geometry/v1":
            continue
        if any(not isinstance(b["arrangement"], str) or "page_align_bytes" in b or "page_stride_bytes" in b
               for b in doc["buffers"]):
            continue  # planes / alignment: outside the reference's scope
        try:
            g = kvlayout.Geometry.from_file(path)
        except kvlayout.InvalidGeometry:
            continue  # the invalid cases
        assert g.fingerprint == reference_fingerprint(doc), path


def test_describe_sizes_by_hand():
    g = kvlayout.describe("deepseek-v3.2-exp", index_k="bf16")
    # 61 layers x (656 B sparse fp8 MLA row + 256 B bf16 index-K)
    assert g.bytes_per_token == 61 * (656 + 256)
    assert g.bytes_per_page == 61 * 64 * (656 + 256)
    by_name = {b["name"]: b for b in g.buffers}
    assert by_name["index_k"]["bytes_per_token"] == 128 * 2
    assert by_name["index_k"]["page_stride_bytes"] == 64 * 256
    assert by_name["kv"]["bytes_per_token"] == 512 + 4 * 4 + 64 * 2
    assert g.memory_layout == "layer_first"
    assert g.page_size_tokens == 64


def test_invalid_geometry_names_field_and_value():
    doc = load_json(SEED_HOST)
    doc["buffers"][1]["sections"][0]["dtype"] = "f9"
    with pytest.raises(kvlayout.InvalidGeometry) as e:
        kvlayout.Geometry.from_json(json.dumps(doc))
    assert "dtype" in e.value.field and "f9" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(kvlayout.InvalidGeometry) as j:
        kvlayout.Geometry.from_json("{")
    assert j.value.field == "json"


def test_unknown_level_is_a_value_error():
    g = kvlayout.Geometry.from_file(SEED_HOST)
    with pytest.raises(ValueError, match="level"):
        kvlayout.compare(g, g, level="nope")


def test_formats_sizes_by_hand():
    by_name = {f["name"]: f for f in kvlayout.formats()}
    assert by_name["index_k_fp8"]["bytes_per_token"] == 128 + 4
    assert by_name["index_k_bf16"]["bytes_per_token"] == 128 * 2
    assert by_name["index_k_fp4"]["bytes_per_token"] == 128 // 2 + 128 // 32
    assert by_name["index_k_fp8"]["bytes_per_page_64"] == 64 * 132


# every built-in model: configs/NAME.json
MODELS = sorted(p.stem for p in (ROOT / "configs").glob("*.json"))


def _cli() -> str | None:
    path = os.environ.get("KVLAYOUT_CLI") or str(ROOT / "target" / "debug" / "kvlayout")
    return path if pathlib.Path(path).is_file() else None


@pytest.mark.skipif(_cli() is None, reason="no kvlayout CLI binary (set KVLAYOUT_CLI or cargo build)")
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tp", [None, 2])
def test_fingerprint_equals_the_cli(model, tp, tmp_path):
    cli = _cli()
    tp_args = [] if tp is None else ["--tp", str(tp), "--rank", "1"]
    described = subprocess.run([cli, "describe", "--model", model, "--json", *tp_args],
                               capture_output=True, text=True)
    if described.returncode == 2:  # the CLI refuses (e.g. heads that do not split): so must we
        with pytest.raises((kvlayout.ModelError, ValueError)):
            kvlayout.describe(model, tp=tp, rank=1)
        return
    text = described.stdout
    table = subprocess.run([cli, "describe", "--model", model, *tp_args],
                           capture_output=True, text=True, check=True).stdout
    g = kvlayout.describe(model, tp=tp, rank=None if tp is None else 1)
    assert f"fingerprint {g.fingerprint:#018x}" in table
    assert g.to_json() == text
    host = tmp_path / "host.json"
    host.write_text(SEED_HOST.read_text())
    dev = tmp_path / "dev.json"
    dev.write_text(g.to_json())
    out = subprocess.run([cli, "check", str(dev), str(host)], capture_output=True, text=True)
    lines = kvlayout.compare(g, kvlayout.Geometry.from_file(host))
    if lines:
        assert out.returncode == 1
        assert out.stdout.splitlines()[1:] == lines
    else:
        assert out.returncode == 0 and out.stdout.startswith("compatible")
        token = " ".join(f"{n}={f:#018x}" for n, f in g.token_fingerprints.items())
        assert (f"A fingerprints: pool {g.fingerprint:#018x}, storage "
                f"{g.storage_fingerprint:#018x}, token {token}") in out.stdout


def test_describe_refuses_bad_options_naming_them():
    with pytest.raises(kvlayout.ModelError, match="not-a-model"):
        kvlayout.describe("not-a-model")
    with pytest.raises(ValueError, match="kv_dtype"):
        kvlayout.describe("llama-3.1-8b", kv_dtype="fp4")
    # index_k on a model without the DeepSeek indexer is refused, as the CLI refuses
    # --index-k there (exit 2, "--index-k does not apply: ..."), naming the option and the model
    with pytest.raises(ValueError, match=r"index_k.*does not apply: llama-3\.1-8b has no "
                       r"DeepSeek sparse-attention indexer") as e:
        kvlayout.describe("llama-3.1-8b", index_k="bf16")
    assert isinstance(e.value, kvlayout.InvalidGeometry)
    with pytest.raises(ValueError, match="index_k"):
        kvlayout.totals("llama-3.1-8b", index_k="fp8")
    g = kvlayout.describe("llama-3.1-8b")
    # Llama-3.1-8B: 32 layers x (K + V) 8 x 128 bf16 = 32 x 4096 B/token
    assert g.bytes_per_token == 32 * 2 * 8 * 128 * 2


def test_state_dtype_on_a_model_without_recurrent_state_is_refused():
    # Was silently ignored; the CLI refuses --state-dtype there, and so does Python now:
    # Llama-3.1-8B has only full-attention layers, nothing the option applies to.
    with pytest.raises(kvlayout.InvalidGeometry, match="state_dtype.*llama-3.1-8b"):
        kvlayout.describe("llama-3.1-8b", state_dtype="bf16")
    with pytest.raises(ValueError, match="state_dtype"):
        kvlayout.totals("llama-3.1-8b", state_dtype="f32")
    # Kimi-Linear's KDA state takes it without a warning: 20 layers x (conv 73,728 B +
    # temporal 32 x 128 x 128 x 2 B = 1,048,576 B) = 22,446,080 B per request.
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = kvlayout.totals("kimi-linear-48b-a3b", state_dtype="bf16")
    assert t["state_bytes_per_request"] == 20 * (73_728 + 32 * 128 * 128 * 2)


def test_mirror_takes_every_compared_field_from_the_device():
    device = kvlayout.describe("deepseek-v3.2-exp", index_k="bf16")
    host = device.mirror(4096, "page_first")
    assert kvlayout.compare(device, host) == []
    assert host.pages == 4096 and host.memory_layout == "page_first"
    assert host.fingerprint == device.fingerprint
    assert host.storage_fingerprint != device.storage_fingerprint
    with pytest.raises(kvlayout.InvalidGeometry, match="pages"):
        device.mirror(0)
    with pytest.raises(kvlayout.InvalidGeometry, match="memory_layout"):
        device.mirror(8, "sideways")


def test_geometry_pickles_through_its_json():
    import pickle

    g = kvlayout.describe("kimi-k2")
    assert pickle.loads(pickle.dumps(g)) == g


def test_tensor_parallel_rank_and_totals():
    # Llama-3.1-8B, 8 KV heads split over 2 ranks: 4 heads x 128 x 2 B x (K + V) per layer
    g = kvlayout.describe("llama-3.1-8b", tp=2, rank=1)
    assert g.bytes_per_token == 32 * 2 * 4 * 128 * 2
    rank0 = kvlayout.describe("llama-3.1-8b", tp=2, rank=0)
    # the pool level compares the shard (DESIGN "Compare levels"); the token level converts
    assert kvlayout.compare(g, rank0) == [
        "kv.shard: tp_size 2 rank 1 split heads of 8, tp_size 2 rank 0 split heads of 8"]
    assert kvlayout.compare(g, rank0, level="token") == []
    with pytest.raises(ValueError, match="rank"):
        kvlayout.describe("llama-3.1-8b", rank=1)
    with pytest.raises(ValueError, match="tp"):
        kvlayout.describe("llama-3.1-8b", tp=2, rank=2)
    # gpt-oss-20b: 12 sliding-window (128) + 12 full layers, 8 KV heads x 64 bf16:
    # 2 x 8 x 64 x 2 = 2,048 B/token/layer
    t = kvlayout.totals("gpt-oss-20b")
    assert t["full_bytes_per_token"] == 12 * 2048
    assert t["window_bytes_per_request_max"] == 12 * 2048 * 128
    assert t["state_bytes_per_request"] == 0
