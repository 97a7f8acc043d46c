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


# Llama-3.1-8B, page size 1: buffer "kv" holds K and V of 8 KV heads x 128 dims in bf16, so one
# page (one token) is 8 x 128 x 2 B x 2 (K and V) = 4,096 B, laid with no padding: a page
# stride of 4,096 B (derived by hand, not read back from the geometry).
LLAMA_PAGE_1 = kvlayout.describe("llama-3.1-8b", page_size_tokens=1)
LLAMA_STRIDE = 8 * 128 * 2 * 2
ROWS_4080 = (r'^data: rows of 4080 bytes \(shape \({}\), {}-byte items\), but buffer "kv" has '
             r'a page stride of 4096 bytes: a region of 2 or more dimensions is read a page per '
             r'row, so its rows must be 4096 bytes; pass the layer\'s region shaped so, or flat '
             r'\(1-D bytes\)$')


def test_a_shaped_region_whose_rows_are_not_the_page_stride_is_refused_naming_both_sizes():
    """Trial finding: with a Llama-3.1-8B page-size-1 guard (4,096 B page stride),
    ``record_backup("kv", 0, np.zeros((8192, 4080), np.uint8), [1], [10])`` returned 1: the
    page was read at 4,096 x 1 .. + 4,096, not row 1 (4,080 B), so other bytes than the
    caller's row were checksummed, silently. A region of 2 or more dimensions must have rows
    (bytes per leading index) of the page stride; each call refuses other rows naming data,
    both byte counts and the buffer, in every mode, before reading a byte."""
    assert LLAMA_STRIDE == 4096
    rows = np.zeros((8192, 4080), np.uint8)
    want = ROWS_4080.format("8192, 4080", 1)
    guard = kvlayout.TransferGuard(LLAMA_PAGE_1, LLAMA_PAGE_1, checksum="all")
    off = kvlayout.TransferGuard(LLAMA_PAGE_1, LLAMA_PAGE_1)
    with pytest.raises(ValueError, match=want):
        guard.record_backup("kv", 0, rows, [1], [10])
    with pytest.raises(ValueError, match=want):
        guard.page_checksums("kv", 0, rows, [1])
    with pytest.raises(ValueError, match=want):
        guard.verify_load("kv", 0, rows, [10], [1])
    for method in (off.record_backup, off.verify_load):
        with pytest.raises(ValueError, match=want):
            method("kv", 0, rows, [1], [10])
    # The row is bytes per leading index, whatever the dtype and the number of dimensions:
    # 2,040 uint16 and [8 heads][255 dims] of uint16 are 4,080 B too.
    with pytest.raises(ValueError, match=ROWS_4080.format("8192, 2040", 2)):
        guard.record_backup("kv", 0, np.zeros((8192, 2040), np.uint16), [1], [10])
    with pytest.raises(ValueError, match=ROWS_4080.format("8192, 8, 255", 2)):
        guard.record_backup("kv", 0, np.zeros((8192, 8, 255), np.uint16), [1], [10])
    # Any buffer-protocol object with a shape, not only numpy.
    view = memoryview(bytearray(16 * 4080)).cast("B", (16, 4080))
    with pytest.raises(ValueError, match=ROWS_4080.format("16, 4080", 1)):
        guard.page_checksums("kv", 0, view, [1])
    # Nothing was recorded: a load of host page 10 verifies no page.
    assert guard.verify_load("kv", 0, np.zeros((16, 4096), np.uint8), [10], [1]) == 0


def test_a_region_with_page_stride_rows_or_flat_is_accepted():
    """Rows of the page stride (4,096 B: [page][4096 B], or [page][8 heads][256] of uint16)
    and flat bytes of any length (engines pass a flat region and keep a padding page) are
    read as before, with the same checksums."""
    rng = np.random.default_rng(11)
    pages = rng.integers(0, 256, size=(16, LLAMA_STRIDE), dtype=np.uint8)
    guard = kvlayout.TransferGuard(LLAMA_PAGE_1, LLAMA_PAGE_1, checksum="all")
    want = kvlayout.page_checksum(LLAMA_PAGE_1, "kv", 0, pages[1])
    assert guard.page_checksums("kv", 0, pages, [1]) == [want]
    assert guard.page_checksums("kv", 0, pages.view(np.uint16).reshape(16, 8, 256), [1]) == [want]
    flat = pages.reshape(-1)
    assert guard.page_checksums("kv", 0, flat, [1]) == [want]
    assert guard.page_checksums("kv", 0, bytes(flat), [1]) == [want]
    # Flat and not a whole number of pages: read at page-stride offsets, as before.
    assert guard.record_backup("kv", 0, np.zeros(8192 * 4080, np.uint8), [1], [10]) == 1
    assert guard.record_backup("kv", 0, pages, [1], [11]) == 1
    assert guard.verify_load("kv", 0, flat, [11], [1]) == 1


def test_a_per_token_region_of_unpadded_pages_is_accepted_and_other_rows_name_both_sizes():
    """SGLang's per-layer tensor is [tokens][heads][head dim]: with 64-token pages its rows are
    a token (4,096 B), a 64th of the 262,144-B page stride; pages with no padding are those
    rows back to back, so such rows are read as the flat region. The refusal names both
    accepted sizes."""
    g = kvlayout.describe("llama-3.1-8b", page_size_tokens=64, pages=8)
    stride = 64 * LLAMA_STRIDE
    guard = kvlayout.TransferGuard(g, g, checksum="all")
    tokens = np.random.default_rng(12).integers(0, 256, size=(8 * 64, LLAMA_STRIDE),
                                                dtype=np.uint8)
    flat = tokens.reshape(-1)
    assert guard.page_checksums("kv", 0, tokens.view(np.uint16).reshape(8 * 64, 2, 8, 128),
                                [3]) == guard.page_checksums("kv", 0, flat, [3])
    assert guard.page_checksums("kv", 0, tokens.reshape(8, stride), [3]) == \
        guard.page_checksums("kv", 0, flat, [3])
    with pytest.raises(ValueError, match=(
            rf'^data: rows of 4080 bytes \(shape \(512, 4080\), 1-byte items\), but buffer "kv" '
            rf'has a page stride of {stride} bytes: .* its rows must be {stride} bytes or 4096 '
            r"bytes \(one of a page's 64 rows, as SGLang's per-layer tensor\)")):
        guard.record_backup("kv", 0, np.zeros((512, 4080), np.uint8), [1], [2])


class _Device:
    def __init__(self, kind: str) -> None:
        self.type = kind
        self.index = 0 if kind == "cuda" else None


class _ShapedTensor:
    """Torch-like (``__dlpack__``, no ``__array_interface__`` or buffer protocol) with a
    ``shape`` and ``element_size()``: a CPU one is read through ``kvlayout.tensors._host_bytes``
    (its bytes: the numpy array it wraps), a CUDA one (``is_cuda``) through ``_cuda_bytes``."""

    def __init__(self, array: np.ndarray, kind: str) -> None:
        self._array, self.device, self.is_cuda = array, _Device(kind), kind == "cuda"
        self.shape = array.shape

    def __dlpack__(self, *args, **kwargs):
        raise AssertionError("read through _host_bytes")

    def element_size(self) -> int:
        return self._array.itemsize

    def is_contiguous(self) -> bool:
        return True

    def detach(self):
        return self

    def reshape(self, *shape):
        return _ShapedTensor(self._array.reshape(*shape), self.device.type)

    def view(self, dtype):
        return _ShapedTensor(self._array.view(np.uint8), self.device.type)

    def numpy(self):
        return self._array

    def data_ptr(self) -> int:
        return self._array.ctypes.data

    def numel(self) -> int:
        return self._array.size


def test_shaped_torch_tensors_follow_the_same_rule(monkeypatch):
    """CPU and CUDA torch tensors are shaped too (``_host_bytes`` flattens the CPU one, the
    kernel reads the CUDA one as bytes): rows other than the page stride are refused the same
    way, before the device is touched. Fakes stand for torch (not installed in CI's venv)."""
    import sys
    import types

    fake = types.SimpleNamespace(
        uint8="uint8",
        cuda=types.SimpleNamespace(
            current_device=lambda: 0,
            current_stream=lambda i: types.SimpleNamespace(cuda_stream=0)))
    monkeypatch.setitem(sys.modules, "torch", fake)
    guard = kvlayout.TransferGuard(LLAMA_PAGE_1, LLAMA_PAGE_1, checksum="all")
    rows = np.zeros((16, 4080), np.uint8)
    for kind in ("cpu", "cuda"):
        with pytest.raises(ValueError, match=ROWS_4080.format("16, 4080", 1)):
            guard.record_backup("kv", 0, _ShapedTensor(rows, kind), [1], [10])
        with pytest.raises(ValueError, match=ROWS_4080.format("16, 4080", 1)):
            kvlayout.TransferGuard(LLAMA_PAGE_1, LLAMA_PAGE_1).verify_load(
                "kv", 0, _ShapedTensor(rows, kind), [10], [1])
    pages = np.random.default_rng(13).integers(0, 256, size=(16, 2048), dtype=np.uint16)
    assert guard.page_checksums("kv", 0, _ShapedTensor(pages, "cpu"), [2]) == \
        guard.page_checksums("kv", 0, pages, [2])


def test_a_real_torch_tensor_with_other_rows_is_refused():
    torch = pytest.importorskip("torch", reason="torch not installed")
    guard = kvlayout.TransferGuard(LLAMA_PAGE_1, LLAMA_PAGE_1, checksum="all")
    with pytest.raises(ValueError, match=ROWS_4080.format("16, 4080", 1)):
        guard.record_backup("kv", 0, torch.zeros((16, 4080), dtype=torch.uint8), [1], [10])
    assert guard.record_backup("kv", 0, torch.zeros((16, 4096), dtype=torch.uint8), [1], [10]) == 1
