"""TransferGuard.check_pages: the shim's checks on lists, numpy arrays, buffers and DLPack."""

from __future__ import annotations

import array

import pytest

import kvlayout

np = pytest.importorskip("numpy", reason="numpy not installed: array inputs not tested")

HOST_PAGES = 16
DEVICE_PAGES = 8


def _geometry(pages: int, layers: int = 4) -> kvlayout.Geometry:
    return kvlayout.Geometry.from_json(f"""{{
      "schema": "kvlayout.geometry/v1", "page_size_tokens": 64, "pages": {pages},
      "memory_layout": "layer_first",
      "buffers": [{{"name": "index_k", "layers": {layers}, "arrangement": "section_major",
                   "sections": [{{"name": "values", "dtype": "bf16", "shape": [128]}}]}}]}}""")


@pytest.fixture
def guard() -> kvlayout.TransferGuard:
    return kvlayout.TransferGuard(_geometry(DEVICE_PAGES), _geometry(HOST_PAGES))


def _forms(values):
    a = np.asarray(values, dtype=np.int64)
    return [list(values), tuple(values), a, memoryview(a), array.array("q", values),
            np.asarray(values + values, dtype=np.int64)[::2]]


def test_valid_transfers_pass_in_every_form(guard):
    for src in _forms([0, 15, 3]):
        for dst in _forms([7, 0, 1]):
            assert guard.check_pages("load", None, src, dst) is None
            assert guard.check_pages("load", 3, src, dst) is None
    assert guard.check_pages("backup", 0, [7, 0], [15, 14]) is None
    assert guard.check_pages("backup", None, [], []) is None


def test_range_both_sides(guard):
    # load: host -> device; the device has 8 pages, the host 16.
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("load", None, np.array([1, 2]), np.array([0, DEVICE_PAGES]))
    assert e.value.kind == "page_out_of_range"
    assert f"device page {DEVICE_PAGES} out of range (device pool has {DEVICE_PAGES} pages)" in str(e.value)
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("backup", None, [DEVICE_PAGES - 1], [HOST_PAGES])
    assert f"host page {HOST_PAGES} out of range" in str(e.value)
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("backup", None, [-1], [0])
    assert e.value.kind == "page_out_of_range" and "-1" in str(e.value)


def test_duplicate_destination(guard):
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("backup", None, np.array([0, 1, 2]), np.array([5, 6, 5]))
    assert e.value.kind == "duplicate_destination"
    assert "pairs[2]: host page 5 is already the destination of pairs[0]" in str(e.value)
    # duplicate sources are allowed
    assert guard.check_pages("backup", None, [1, 1], [2, 3]) is None


def test_layer_and_length(guard):
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("load", 4, [0], [0])
    assert e.value.kind == "layer" and "layer 4" in str(e.value)
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("load", None, [0, 1], [0])
    assert e.value.kind == "length"
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("load", None, list(range(DEVICE_PAGES + 1)), list(range(DEVICE_PAGES + 1)))
    assert e.value.kind == "too_many_pairs"
    with pytest.raises(ValueError, match="direction"):
        guard.check_pages("sideways", None, [0], [0])


def test_wrong_dtype_and_shape_refused_by_name(guard):
    with pytest.raises(TypeError, match="src_pages: page indices must be int64"):
        guard.check_pages("load", None, np.array([1, 2], dtype=np.int32), [0, 1])
    with pytest.raises(TypeError, match="dst_pages: page indices must be one-dimensional"):
        guard.check_pages("load", None, [0, 1], np.zeros((1, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="src_pages: expected a list"):
        guard.check_pages("load", None, {1, 2}, [0, 1])


def test_dlpack_is_read_in_place(guard):
    class DlpackOnly:
        """Exposes only __dlpack__ / __dlpack_device__, like a torch CPU tensor."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kwargs):
            return self.a.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    src = DlpackOnly(np.array([3, 4], dtype=np.int64))
    assert guard.check_pages("load", None, src, DlpackOnly(np.array([0, 1], dtype=np.int64))) is None
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("load", None, src, DlpackOnly(np.array([1, 1], dtype=np.int64)))
    assert e.value.kind == "duplicate_destination"
    # a strided view through DLPack: elements 0 and 2 of [5, 99, 6]
    strided = DlpackOnly(np.array([5, 99, 6], dtype=np.int64)[::2])
    assert guard.check_pages("load", None, strided, [0, 1]) is None


def test_guard_properties(guard):
    assert guard.fingerprint == guard.device.fingerprint == guard.host.fingerprint
    assert guard.host.pages == HOST_PAGES


def test_list_items_that_are_not_int64_are_refused_by_index(guard):
    with pytest.raises(TypeError, match=r"src_pages\[1\]: not an int64"):
        guard.check_pages("load", None, [1, "x"], [0, 1])
    with pytest.raises(TypeError, match=r"dst_pages\[0\]: not an int64"):
        guard.check_pages("load", None, (1,), (1.0,))


# Regressions (hostile review, session 8): numpy integers were refused as arguments (TypeError
# "got int64") though numpy page lists were accepted; a page index past 64 bits was a TypeError
# while a layer past 64 bits was a TransferRefused.
def test_numpy_integers_are_ints_and_numpy_bools_are_not():
    device = _geometry(DEVICE_PAGES)
    host = device.mirror(pages=np.int64(HOST_PAGES))
    assert host.pages == HOST_PAGES
    guard = kvlayout.TransferGuard(device, host)
    guard.check_pages("load", np.int64(3), [1], [2])
    guard.check_pages("load", np.uint32(3), [1], [2])
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.check_pages("load", np.int64(4), [1], [2])  # 4 layers: 0..=3
    assert e.value.kind == "layer"
    with pytest.raises(TypeError, match="layer"):
        guard.check_pages("load", np.bool_(True), [1], [2])


def test_a_page_past_64_bits_is_out_of_range(guard):
    for page in (2**63, 1 << 70):
        with pytest.raises(kvlayout.TransferRefused) as e:
            guard.check_pages("load", 0, (page,), (1,))
        assert e.value.kind == "page_out_of_range"
        assert "src_pages[0]" in str(e.value)
