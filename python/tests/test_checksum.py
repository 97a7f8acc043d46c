"""Page checksums from Python (kvlayout.checksum/v1): computed in Rust on arrays and tensors in
place, equal to the independent Python reference (layout-core/tests/checksum_reference.py);
TransferGuard's checksum mode records at backup and refuses a mismatching load by page."""

from __future__ import annotations

import importlib.util

import pytest

import kvlayout

from conftest import ROOT

np = pytest.importorskip("numpy", reason="numpy not installed: array inputs not tested")

_spec = importlib.util.spec_from_file_location(
    "checksum_reference", ROOT / "layout-core/tests/checksum_reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

PAGES = 4
# index_k: 128 bf16 per token = 256 B, 64 tokens: 16,384 B per page; layer_ids [5, 9].
GEOMETRY = kvlayout.Geometry.from_json("""{
  "schema": "kvlayout.geometry/v2", "page_size_tokens": 64, "pages": 4,
  "memory_layout": "layer_first",
  "buffers": [{"name": "index_k", "layers": 2, "arrangement": "section_major",
               "layer_ids": [5, 9],
               "sections": [{"name": "values", "dtype": "bf16", "shape": [128]}]}]}""")
PAGE_BYTES = 64 * 128 * 2


def _layer(seed: int) -> np.ndarray:
    """One layer of the device buffer, [page][16,384 B], as bf16-sized uint16 words."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**16, size=(PAGES, PAGE_BYTES // 2), dtype=np.uint16)


def test_page_checksum_equals_the_python_reference_seeded_by_token_fingerprint_and_model_layer():
    data = _layer(1)
    token = GEOMETRY.token_fingerprints["index_k"]
    for layer, model_layer in [(0, 5), (1, 9)]:
        want = reference.page_checksum(token, model_layer, data[2].tobytes())
        assert kvlayout.page_checksum(GEOMETRY, "index_k", layer, data[2]) == want
    with pytest.raises(ValueError, match="8448 bytes given to a checksum of a 16384-byte"):
        kvlayout.page_checksum(GEOMETRY, "index_k", 0, bytes(8448))
    with pytest.raises(kvlayout.InvalidGeometry, match='no buffer named "kv"'):
        kvlayout.page_checksum(GEOMETRY, "kv", 0, data[0])


def test_guard_page_checksums_read_the_layer_in_place():
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    assert guard.checksum == "all"
    data = _layer(2)
    sums = guard.page_checksums("index_k", 1, data, [3, 0])
    token = GEOMETRY.token_fingerprints["index_k"]
    assert sums == [reference.page_checksum(token, 9, data[p].tobytes()) for p in (3, 0)]
    with pytest.raises(ValueError, match="page 4"):
        guard.page_checksums("index_k", 1, data, [4])


def test_a_mismatching_load_is_refused_naming_the_pages_and_both_values():
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    device = _layer(3)
    assert guard.record_backup("index_k", 0, device, [0, 1], [2, 3]) == 2
    # A clean load of host pages 2, 3 into device pages 3, 2: the bytes land there.
    loaded = device.copy()
    loaded[3], loaded[2] = device[0], device[1]
    assert guard.verify_load("index_k", 0, loaded, [2, 3], [3, 2]) == 2
    # The seed bug's short copy: 132 of 256 bytes per token of host page 3 landed in device
    # page 1; the rest is stale.
    torn = loaded.copy()
    torn[1] = _layer(9)[1]  # the slot held another request's page
    short = torn[1].view(np.uint8).reshape(64, 256)
    short[:, :132] = device[1].view(np.uint8).reshape(64, 256)[:, :132]
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.verify_load("index_k", 0, torn, [2, 3], [3, 1])
    assert e.value.kind == "checksum_mismatch"
    assert e.value.pages == [(3, 1)]
    token = GEOMETRY.token_fingerprints["index_k"]
    recorded = reference.page_checksum(token, 5, device[1].tobytes())
    found = reference.page_checksum(token, 5, torn[1].tobytes())
    text = str(e.value)
    assert "index_k layer 0 (model layer 5)" in text and "host page 3 -> device page 1" in text
    assert f"{recorded:#018x}" in text and f"{found:#018x}" in text
    # One sentence, single-spaced (the message once carried two runs of 18 spaces from its
    # source's line breaks).
    assert ("(model layer 5), refused (treat them as a miss); first: host page 3 -> device "
            f"page 1: checksum {recorded:#018x} at backup") in text
    assert "  " not in text


def test_checksum_pages_out_of_range_or_named_twice_are_refused_and_nothing_is_recorded():
    # Both pools hold 4 pages (GEOMETRY "pages": 4): page 4 is past either pool. Before, a
    # backup to host page 4 (or 99) was recorded and a later load of it verified.
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    device = _layer(5)
    with pytest.raises(kvlayout.TransferRefused,
                       match=r"host_pages\[1\]: host page 4 out of range "
                             r"\(the host pool has 4 pages\)") as e:
        guard.record_backup("index_k", 0, device, [0, 1], [3, 4])
    assert e.value.kind == "page_out_of_range"
    with pytest.raises(kvlayout.TransferRefused,
                       match=r"host_pages\[1\]: page 2 is already the destination of "
                             r"host_pages\[0\]") as e:
        guard.record_backup("index_k", 0, device, [0, 1], [2, 2])
    assert e.value.kind == "duplicate_destination"
    # Neither refused backup recorded anything: loads of host pages 2 and 3 verify no page.
    assert guard.verify_load("index_k", 0, device, [2, 3], [0, 1]) == 0
    assert guard.record_backup("index_k", 0, device, [0, 1], [2, 3]) == 2
    with pytest.raises(kvlayout.TransferRefused,
                       match=r"device_pages\[0\]: device page 7 out of range "
                             r"\(the device pool has 4 pages\)"):
        guard.verify_load("index_k", 0, device, [2], [7])
    with pytest.raises(kvlayout.TransferRefused,
                       match=r"device_pages\[1\]: page 0 is already the destination of "
                             r"device_pages\[0\]"):
        guard.verify_load("index_k", 0, device, [2, 3], [0, 0])


def test_checksum_layer_arguments_are_named_when_refused():
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    data = _layer(6)
    # Before, pyo3's "can't convert negative int to unsigned" named neither layer nor -1, and
    # True was read as layer 1.
    with pytest.raises(ValueError, match=r"layer: -1 is not a layer index"):
        guard.page_checksums("index_k", -1, data, [0])
    with pytest.raises(ValueError, match=r"layer: 1180591620717411303424 is not a layer index"):
        kvlayout.page_checksum(GEOMETRY, "index_k", 2**70, data[0])
    with pytest.raises(TypeError, match=r"layer: True is not a layer index"):
        guard.record_backup("index_k", True, data, [0], [0])
    with pytest.raises(TypeError, match=r"layer: '0' is not a layer index"):
        guard.verify_load("index_k", "0", data, [0], [0])
    assert guard.page_checksums("index_k", np.int64(1), data, [0]) == guard.page_checksums(
        "index_k", 1, data, [0])


def test_modes_off_and_sampled():
    off = kvlayout.TransferGuard(GEOMETRY, GEOMETRY)
    assert off.checksum == "off"
    assert off.record_backup("index_k", 0, _layer(4), [0], [0]) == 0
    sampled = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="sampled:2")
    # Host pages 0 and 2 are covered, 1 and 3 are not.
    assert sampled.record_backup("index_k", 0, _layer(4), [0, 1, 2, 3], [0, 1, 2, 3]) == 2
    with pytest.raises(ValueError, match="sampled:N"):
        kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="sampled:0")


def test_mode_off_still_refuses_bad_arguments_by_name():
    """Trial finding: with checksum="off" record_backup / verify_load returned 0 for any
    arguments (an unknown buffer, a layer past the 2 layers, a str as data, page 99 of a
    4-page pool), so a call wired wrong went unnoticed until checksums were turned on. They
    are checked as in the other modes; no bytes are read, 0 is returned."""
    off = kvlayout.TransferGuard(GEOMETRY, GEOMETRY)
    data = _layer(4)
    for method in (off.record_backup, off.verify_load):
        assert method("index_k", 1, data, [0, 1], [2, 3]) == 0
        with pytest.raises(kvlayout.InvalidGeometry, match='no buffer named "kv"'):
            method("kv", 0, data, [0], [0])
        with pytest.raises(kvlayout.InvalidGeometry, match="layer"):
            method("index_k", 2, data, [0], [0])
        with pytest.raises(TypeError, match=r"layer: '0' is not a layer index"):
            method("index_k", "0", data, [0], [0])
        with pytest.raises(TypeError, match=r"data: expected a C-contiguous buffer .* got str"):
            method("index_k", 0, "not data", [0], [0])
        with pytest.raises(kvlayout.TransferRefused, match=r"page 99 out of range .* 4 pages"):
            method("index_k", 0, data, [99], [99])
        with pytest.raises(kvlayout.TransferRefused, match="is already the destination"):
            method("index_k", 0, data, [0, 0], [1, 1])


def test_a_non_contiguous_array_is_refused_naming_the_argument():
    """Trial finding: a transposed or strided numpy array raised numpy's bare "ndarray is not
    C-contiguous", naming no argument. The error names it (data, payload) and what it expects;
    the type stays numpy's ValueError."""
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    strided = _layer(6)[:, ::2]  # every other bf16 of each page: not C-contiguous
    want = r"^data: expected a C-contiguous buffer; the ndarray given cannot be read as one"
    with pytest.raises(ValueError, match=want):
        guard.page_checksums("index_k", 0, strided, [0])
    with pytest.raises(ValueError, match=want):
        guard.record_backup("index_k", 0, strided, [0], [0])
    with pytest.raises(ValueError, match=want):
        kvlayout.TransferGuard(GEOMETRY, GEOMETRY).verify_load("index_k", 0, strided, [0], [0])
    # One page payload, 64 tokens x 128 bf16, transposed.
    payload = np.zeros((128, 64), dtype=np.uint16).T
    with pytest.raises(ValueError, match=r"^payload: expected a C-contiguous buffer"):
        kvlayout.page_checksum(GEOMETRY, "index_k", 0, payload)


class _MetaDevice:
    type = "meta"

    def __str__(self) -> str:
        return "meta"


class _MetaTensor:
    """Torch-like (``__dlpack__``, no ``__array_interface__``) on the meta device: read through
    ``kvlayout.tensors._host_bytes``, which refuses its device."""

    device = _MetaDevice()

    def __dlpack__(self, *args, **kwargs):
        raise AssertionError("a meta tensor's bytes are never read")


class _StridedCudaTensor:
    """Torch-like CUDA tensor (``is_cuda``) that is not contiguous: read through
    ``kvlayout.tensors._cuda_bytes``, which refuses it before touching the device."""

    is_cuda = True

    def is_contiguous(self) -> bool:
        return False


def test_a_torch_tensor_refused_is_named_by_the_callers_argument():
    """Trial finding: the torch paths (``_host_bytes``, ``_cuda_bytes``) said ``data:`` even
    for ``page_checksum``'s ``payload``. The error names the caller's argument, as the numpy
    path does. Fakes stand for the tensors: both are refused before any byte is read."""
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    meta = r"^{}: a meta tensor; page checksums are computed on the CPU"
    strided = r"^{}: a non-contiguous tensor; pass the pool's contiguous layer tensor"
    with pytest.raises(ValueError, match=meta.format("payload")):
        kvlayout.page_checksum(GEOMETRY, "index_k", 0, _MetaTensor())
    with pytest.raises(ValueError, match=strided.format("payload")):
        kvlayout.page_checksum(GEOMETRY, "index_k", 0, _StridedCudaTensor())
    with pytest.raises(ValueError, match=meta.format("data")):
        guard.page_checksums("index_k", 0, _MetaTensor(), [0])
    with pytest.raises(ValueError, match=strided.format("data")):
        guard.page_checksums("index_k", 0, _StridedCudaTensor(), [0])


def test_a_torch_cpu_tensor_is_checksummed_in_place():
    torch = pytest.importorskip("torch", reason="torch not installed")
    data = _layer(5)
    t = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    assert guard.page_checksums("index_k", 0, t, [1]) == guard.page_checksums("index_k", 0, data, [1])
