"""A guard shared by threads, model layer ids on hybrid pools, bools refused, pickled
exceptions, argument errors named by field (each a fixed bug, kept as a test)."""

from __future__ import annotations

import pickle
import threading

import pytest

import kvlayout
from kvlayout.pd import PeerRefused


def _hybrid(pages: int) -> kvlayout.Geometry:
    # Two buffers of two layers each, serving model layers 0, 2 (swa) and 1, 3 (full), as
    # gpt-oss alternates them: model layer 3 is layer index 1 of `full`.
    buf = ('{{"name": "{n}", "layers": 2, "layer_ids": {ids}, "arrangement": "token_major",'
           ' "sections": [{{"name": "kv", "dtype": "bf16", "shape": [2, 8]}}]}}')
    return kvlayout.Geometry.from_json(
        '{"schema": "kvlayout.geometry/v2", "page_size_tokens": 16, "pages": %d,'
        ' "memory_layout": "layer_first", "buffers": [%s, %s]}'
        % (pages, buf.format(n="swa", ids=[0, 2]), buf.format(n="full", ids=[1, 3])))


def _plain(pages: int, layers: int = 4) -> kvlayout.Geometry:
    return kvlayout.Geometry.from_json(
        '{"schema": "kvlayout.geometry/v1", "page_size_tokens": 64, "pages": %d,'
        ' "memory_layout": "layer_first", "buffers": [{"name": "kv", "layers": %d,'
        ' "arrangement": "token_major", "sections": [{"name": "k", "dtype": "bf16",'
        ' "shape": [128]}]}]}' % (pages, layers))


def test_hybrid_layer_is_the_model_layer_id():
    g = kvlayout.TransferGuard(_hybrid(8), _hybrid(16))
    # Model layer 3 exists (full's second layer) though each buffer holds only 2 layers.
    assert g.check_pages("load", 3, [1], [2]) is None
    assert g.check_pages("backup", 0, [1], [2]) is None
    with pytest.raises(kvlayout.TransferRefused) as e:
        g.check_pages("load", 4, [1], [2])  # ids cover 0..=3
    assert e.value.kind == "layer" and "model layer 4" in str(e.value)


def test_layer_indices_map_model_layers_to_buffer_indices():
    g = kvlayout.TransferGuard(_hybrid(8), _hybrid(16))
    # swa serves 0, 2 (indices 0, 1); full serves 1, 3 (indices 0, 1)
    assert g.layer_indices(3) == {"full": 1}
    assert g.layer_indices(2) == {"swa": 1}
    with pytest.raises(kvlayout.TransferRefused, match="layer 5"):
        g.layer_indices(5)
    plain = kvlayout.TransferGuard(_plain(8), _plain(16))
    assert plain.layer_indices(3) == {"kv": 3}
    with pytest.raises(TypeError):
        plain.layer_indices(False)


def test_plain_geometry_keeps_layer_indices():
    g = kvlayout.TransferGuard(_plain(8), _plain(16))
    assert g.check_pages("load", 3, [1], [2]) is None  # layers 0..4
    with pytest.raises(kvlayout.TransferRefused) as e:
        g.check_pages("load", 4, [1], [2])
    assert e.value.kind == "layer"


def test_describe_gpt_oss_layer_23_is_served():
    dev = kvlayout.describe("gpt-oss-20b")  # 24 layers: 12 sliding, 12 full
    g = kvlayout.TransferGuard(dev, dev.mirror(pages=2048))
    assert g.check_pages("load", 23, [1], [2]) is None
    # full serves the odd layers 1, 3, .., 23: layer 23 is its index (23 - 1) / 2 = 11
    assert g.layer_indices(23) == {"full": (23 - 1) // 2}
    assert g.layer_indices(22) == {"swa": 22 // 2}
    with pytest.raises(kvlayout.TransferRefused, match="model layer 24"):
        g.check_pages("load", 24, [1], [2])


def test_bools_are_refused_as_pages_and_layer():
    g = kvlayout.TransferGuard(_plain(8), _plain(16))
    with pytest.raises(TypeError, match="bool"):
        g.check_pages("load", 0, [True, False], [3, 4])
    with pytest.raises(TypeError, match=r"dst_pages\[1\]: a bool"):
        g.check_pages("load", 0, [1, 2], (3, False))
    with pytest.raises(TypeError, match="layer.*bool"):
        g.check_pages("load", True, [1], [2])


def test_huge_layer_is_refused_not_overflow():
    g = kvlayout.TransferGuard(_plain(8), _plain(16))
    with pytest.raises(kvlayout.TransferRefused) as e:
        g.check_pages("load", 2**70, [1], [2])
    assert e.value.kind == "layer"
    with pytest.raises(TypeError, match="layer"):
        g.check_pages("load", 1.0, [1], [2])


def test_one_guard_shared_by_two_threads():
    # Thread A sits inside an __index__ (Python code: the GIL is released to B) while B checks
    # pages on the same guard: B must be checked normally, not fail "Already borrowed".
    g = kvlayout.TransferGuard(_plain(8), _plain(16))
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    class Slow:
        def __index__(self) -> int:
            inside.set()
            release.wait(10)
            return 5

    def a() -> None:
        try:
            g.check_pages("load", 0, [Slow()], [6])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=a)
    t.start()
    assert inside.wait(10)
    try:
        assert g.check_pages("backup", 1, [0, 7], [15, 3]) is None
        with pytest.raises(kvlayout.TransferRefused) as e:
            g.check_pages("load", 0, [1, 2], [4, 4])  # device page 4 named twice
        assert e.value.kind == "duplicate_destination"
    finally:
        release.set()
        t.join(10)
    assert errors == []


def test_reentrant_check_from_index():
    g = kvlayout.TransferGuard(_plain(8), _plain(16))
    seen = []

    class Reenter:
        def __index__(self) -> int:
            seen.append(g.check_pages("load", 0, [1], [2]))
            return 3

    assert g.check_pages("load", 0, [Reenter()], [4]) is None
    assert seen == [None]
    # The guard's own scratch is clean after both: a duplicate is still found.
    with pytest.raises(kvlayout.TransferRefused) as e:
        g.check_pages("load", 0, [1, 2], [3, 3])
    assert e.value.kind == "duplicate_destination"


def _roundtrip(e: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(e))


def test_exceptions_survive_pickling():
    ig = _roundtrip(kvlayout.InvalidGeometry("pages", "-1 is negative"))
    assert isinstance(ig, kvlayout.InvalidGeometry)
    assert (ig.field, ig.problem, str(ig)) == ("pages", "-1 is negative", "pages: -1 is negative")
    tm = _roundtrip(kvlayout.TensorMismatch("kv", "stride 2, 4"))
    assert type(tm) is kvlayout.TensorMismatch and tm.field == "kv"
    tr = _roundtrip(kvlayout.TransferRefused("page 9 past 8", "page_out_of_range"))
    assert (tr.reason, tr.kind) == ("page 9 past 8", "page_out_of_range")
    inc = _roundtrip(kvlayout.Incompatible(["kv.layers: 4, 2"], "incompatible: 1 differing field"))
    assert inc.lines == ["kv.layers: 4, 2"] and inc.header == "incompatible: 1 differing field"
    pr = _roundtrip(PeerRefused(["kv.layers: 4, 2"], "token"))
    assert type(pr) is PeerRefused and pr.level == "token" and pr.lines == ["kv.layers: 4, 2"]
    assert str(pr) == "incompatible: 1 differing field\nkv.layers: 4, 2"
    try:
        kvlayout.check(_plain(8, 4), _plain(8, 2))
    except kvlayout.Incompatible as e:
        back = _roundtrip(e)
        assert back.lines == e.lines and back.header == e.header and str(back) == str(e)


@pytest.mark.parametrize("kwargs,field", [
    ({"tp": -1}, "tp"), ({"tp": 2, "rank": -1}, "rank"), ({"pages": -1}, "pages"),
    ({"tp": 0}, "tp"), ({"tp": 2, "rank": 2}, "tp"), ({"pages": 2**70}, "pages"),
])
def test_describe_bad_counts_name_the_field(kwargs, field):
    with pytest.raises(kvlayout.InvalidGeometry) as e:
        kvlayout.describe("llama-3.1-8b", **kwargs)
    assert e.value.field == field
    assert isinstance(e.value, ValueError)


def test_mirror_and_level_errors():
    g = _plain(8)
    with pytest.raises(kvlayout.InvalidGeometry) as e:
        g.mirror(pages=-1)
    assert e.value.field == "pages" and "-1" in str(e.value)
    with pytest.raises(kvlayout.InvalidGeometry) as e:
        kvlayout.compare(g, g, level="bogus")
    assert e.value.field == "level" and "bogus" in str(e.value)


def test_describe_directory_without_config(tmp_path):
    with pytest.raises(kvlayout.ModelError) as e:
        kvlayout.describe(str(tmp_path))
    assert str(tmp_path / "config.json") in str(e.value)


def _first_python_block(path, after: str) -> str:
    text = path.read_text()
    start = text.index("```python", text.index(after)) + len("```python")
    return text[start:text.index("```", start)]


@pytest.mark.parametrize("doc,after", [("README.md", "## Python"), ("docs/python.md", "## The surface")])
def test_doc_snippet_runs_as_written(doc, after, monkeypatch, capsys):
    from conftest import ROOT

    monkeypatch.chdir(ROOT)
    exec(compile(_first_python_block(ROOT / doc, after), doc, "exec"), {})
    out = capsys.readouterr().out
    # the DSA seed case: device bf16 index-K vs the fp8 host formula, 6 differing lines
    assert "incompatible: 6 differing fields at level pool" in out


def _lying_dlpack(length: int, stride_elems: int):
    """A DLPack exporter reporting `length` int64 elements `stride_elems` apart over 4 real ones."""
    import ctypes

    np = pytest.importorskip("numpy")

    class Dev(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class DType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", Dev), ("ndim", ctypes.c_int32),
                    ("dtype", DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

    class Managed(ctypes.Structure):
        _fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p),
                    ("deleter", ctypes.c_void_p)]

    backing = np.arange(4, dtype=np.int64)
    shape, strides = (ctypes.c_int64 * 1)(length), (ctypes.c_int64 * 1)(stride_elems)
    m = Managed()
    m.dl_tensor.data, m.dl_tensor.device, m.dl_tensor.ndim = backing.ctypes.data, Dev(1, 0), 1
    m.dl_tensor.dtype, m.dl_tensor.shape, m.dl_tensor.strides = DType(0, 64, 1), shape, strides
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    class Liar:
        keep = (backing, shape, strides, m)

        def __dlpack__(self, **kw):
            return new(ctypes.addressof(m), b"dltensor", None)

    return Liar()


@pytest.mark.parametrize("length,stride", [(-1, 1), (4, 2**61), (2**62, 1)])
def test_absurd_exporter_shape_or_strides_are_refused(length, stride):
    g = kvlayout.TransferGuard(_plain(8), _plain(16))
    with pytest.raises(ValueError, match="src_pages: the exporter reports"):
        g.check_pages("load", 0, _lying_dlpack(length, stride), [1])
    # an honest one through the same path is read
    assert g.check_pages("load", 0, _lying_dlpack(2, 1), [1, 2]) is None
