"""geometry_from_tensors: torch/numpy duck typing, bytes proven by tensors, meaning declared."""

from __future__ import annotations

import pytest

import kvlayout
from kvlayout.tensors import TensorBuffer, geometry_from_tensors, tensor_facts

np = pytest.importorskip("numpy", reason="numpy not installed")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed")


class TorchLike:
    """Duck-types a torch tensor: stride() in elements, element_size() in bytes."""

    def __init__(self, a, dtype_name):
        self.a, self.dtype = a, f"torch.{dtype_name}"
        self.shape = a.shape

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def element_size(self):
        return self.a.itemsize


def test_torch_strides_are_elements_numpy_strides_are_bytes():
    a = np.zeros((10, 8, 128), ml_dtypes.bfloat16)
    t = TorchLike(a, "bfloat16")
    assert tensor_facts(a).strides_bytes == (8 * 128 * 2, 128 * 2, 2)
    assert tensor_facts(t).strides_bytes == (8 * 128 * 2, 128 * 2, 2)
    assert tensor_facts(t).dtype == "bfloat16"


def test_float4_x2_holds_two_values_per_byte():
    # torch.float4_e2m1fn_x2: [pages, 64 tokens, 64 bytes] = 128 e2m1 values per token.
    a = np.zeros((4, 64, 64), np.uint8)
    g = geometry_from_tensors(
        [TensorBuffer("idx", [TorchLike(a, "float4_e2m1fn_x2")], axes=("page", "page_token", "d"))],
        page_size_tokens=64)
    b = g.buffers[0]
    assert b["sections"][0] == {"name": "values", "dtype": "f4e2m1", "shape": [128]}
    assert b["bytes_per_token"] == 128 // 2


def test_declared_format_must_match_the_tensor_bytes():
    # bf16 [pages, 64 * 128] = 256 B/token, declared index_k_fp8 = 132 B/token
    t = np.zeros((8, 64 * 128), ml_dtypes.bfloat16)
    with pytest.raises(kvlayout.TensorMismatch) as e:
        geometry_from_tensors(
            [TensorBuffer("index_k", [t], axes=("page", "page_bytes"), format="index_k_fp8")],
            page_size_tokens=64)
    assert e.value.field == "index_k.bytes_per_token"
    assert "132" in str(e.value) and "256" in str(e.value)
    assert isinstance(e.value, kvlayout.InvalidGeometry)


def test_uint8_storage_takes_declared_fp8_meaning():
    t = np.zeros((8, 64 * 132), np.uint8)
    g = geometry_from_tensors(
        [TensorBuffer("index_k", [t, t], axes=("page", "page_bytes"), format="index_k_fp8")],
        page_size_tokens=64)
    assert g.buffers[0]["bytes_per_token"] == 128 + 4
    assert g.buffers[0]["layers"] == 2 and g.pages == 8


def test_declared_dtype_other_than_a_wide_tensor_dtype_is_refused():
    t = np.zeros((64 * 8, 1024), ml_dtypes.float8_e4m3fn)
    with pytest.raises(kvlayout.TensorMismatch, match="dtype"):
        geometry_from_tensors(
            [TensorBuffer("kv", [t], sections=[{"name": "x", "dtype": "u8", "shape": [1024]}])],
            page_size_tokens=64)


def test_mapping_form_and_pages_are_the_fewest_held():
    k = np.zeros((3, 64 * 5, 8, 128), ml_dtypes.bfloat16)   # layers, tokens, heads, dim
    v = np.zeros((3, 64 * 4, 8, 128), ml_dtypes.bfloat16)
    g = geometry_from_tensors({"k": k, "v": v}, page_size_tokens=64)
    assert g.pages == 4
    assert g.bytes_per_token == 3 * 2 * 8 * 128 * 2
    with pytest.raises(kvlayout.TensorMismatch, match="declared 5 pages, tensor holds 4"):
        geometry_from_tensors({"k": k, "v": v}, page_size_tokens=64, pages=5)


def test_padding_between_tokens_is_refused_with_both_numbers():
    a = np.zeros((64 * 2, 1, 1024), np.uint8)[:, :, :656]
    with pytest.raises(kvlayout.TensorMismatch) as e:
        geometry_from_tensors([TensorBuffer("kv", [a], format="dsa_mla_fp8")], page_size_tokens=64)
    assert "656" in str(e.value) and "1024" in str(e.value)


def test_per_layer_tensors_must_agree():
    a = np.zeros((128, 576), np.uint8)
    b = np.zeros((128, 512), np.uint8)
    with pytest.raises(kvlayout.TensorMismatch, match=r"kv.tensors\[1\]"):
        geometry_from_tensors([TensorBuffer("kv", [a, b], format="mla_fp8")], page_size_tokens=64)


def test_one_tensor_without_a_layer_axis_is_refused_by_name():
    t = np.zeros((128, 576), np.uint8)
    with pytest.raises(ValueError, match="no 'layer' axis"):
        geometry_from_tensors([TensorBuffer("kv", t, axes=("token", "dim"), format="mla_fp8")],
                              page_size_tokens=64)


def test_overlapping_layers_are_refused():
    # [4 layers, 128 tokens, 8 heads, 128 dim] bf16: one layer spans 128 x 8 x 128 x 2 =
    # 262144 B, but the layer stride is 2048 B (= one token's row): layers overlap.
    base = np.zeros(128 * 8 * 128 + 3 * 1024, ml_dtypes.bfloat16)
    a = np.lib.stride_tricks.as_strided(base, shape=(4, 128, 8, 128),
                                        strides=(2048, 2048, 256, 2))
    with pytest.raises(kvlayout.TensorMismatch) as e:
        geometry_from_tensors({"kv": a}, page_size_tokens=64)
    # extent: 2 + 127 x 2048 + 7 x 256 + 127 x 2 = 262144
    assert e.value.field == "kv.strides"
    assert "layer stride 2048 B" in str(e.value) and f"{2 + 127 * 2048 + 7 * 256 + 127 * 2} B" in str(e.value)
    zero = np.lib.stride_tricks.as_strided(base, shape=(4, 128, 8, 128),
                                           strides=(0, 2048, 256, 2))
    with pytest.raises(kvlayout.TensorMismatch, match="layer stride 0 B"):
        geometry_from_tensors({"kv": zero}, page_size_tokens=64)


def test_fewer_tokens_than_a_page_names_the_buffer():
    with pytest.raises(kvlayout.TensorMismatch) as e:
        geometry_from_tensors({"kv": np.zeros((2, 10, 4), np.float16)}, page_size_tokens=64)
    assert e.value.field == "kv.pages" and "10 tokens" in str(e.value)


def test_bad_arguments_raise_kvlayout_errors():
    with pytest.raises(kvlayout.InvalidGeometry) as e:
        geometry_from_tensors([], page_size_tokens=64)
    assert e.value.field == "buffers"
    with pytest.raises(kvlayout.InvalidGeometry) as e:
        geometry_from_tensors({"kv": np.zeros((2, 64, 4), np.float16)}, page_size_tokens=0)
    assert e.value.field == "page_size_tokens"
    with pytest.raises(TypeError, match="kv: not a tensor: str"):
        geometry_from_tensors({"kv": "x"}, page_size_tokens=64)


def test_unpacked_float4_is_refused_by_name():
    # ml_dtypes.float4_e2m1fn keeps one 4-bit value per byte: not a packed e2m1 layout.
    a = np.zeros((2, 64, 16), ml_dtypes.float4_e2m1fn)
    with pytest.raises(kvlayout.TensorMismatch, match="float4_e2m1fn"):
        geometry_from_tensors({"kv": a}, page_size_tokens=64)


# Regression (hostile review, session 8): extra replaced what the tensor proves. A bf16
# [2 layers, 128 tokens, 8, 64] tensor with extra sections f16 was accepted as f16 (the dtype
# check skipped), extra layers 99 gave a 99-layer geometry over 2 layers of memory, and extra
# name renamed the buffer.
@pytest.mark.parametrize(
    "key, value",
    [
        ("sections", [{"name": "k", "dtype": "f16", "shape": [8, 64]}]),
        ("layers", 99),
        ("name", "v"),
        ("arrangement", "head_major"),
        ("page_align_bytes", 4096),
    ],
)
def test_extra_cannot_override_what_the_tensor_shows(key, value):
    a = np.zeros((2, 128, 8, 64), ml_dtypes.bfloat16)
    with pytest.raises(kvlayout.InvalidGeometry) as e:
        geometry_from_tensors(
            [TensorBuffer("k", a, extra={key: value})], page_size_tokens=64)
    assert e.value.field == f"k.extra.{key}"


def test_extra_page_stride_is_checked_against_the_tensor():
    a = np.zeros((2, 128, 8, 64), ml_dtypes.bfloat16)
    # a 64-token page of 8 x 64 bf16 rows: 64 x 1,024 B = 65,536 B apart in the tensor
    g = geometry_from_tensors(
        [TensorBuffer("k", a, extra={"page_stride_bytes": 65_536})], page_size_tokens=64)
    assert g.buffers[0]["page_stride_bytes"] == 65_536
    with pytest.raises(kvlayout.TensorMismatch, match="k.page_stride_bytes: declared 131072 B"):
        geometry_from_tensors(
            [TensorBuffer("k", a, extra={"page_stride_bytes": 131_072})], page_size_tokens=64)


# Regression (hostile review, session 8): the declared arrangement, memory layout and axis names
# were not checked against the strides; each of these was accepted.
def test_head_major_declared_over_token_major_strides_is_refused():
    a = np.zeros((2, 128, 8, 64), ml_dtypes.bfloat16)  # NHD: a token's 8 x 64 row packed
    with pytest.raises(kvlayout.TensorMismatch) as e:
        geometry_from_tensors([TensorBuffer("k", a, arrangement="head_major")], page_size_tokens=64)
    assert e.value.field == "k.arrangement"
    assert "declared head_major, tensor token_major" in e.value.problem


def test_token_major_declared_over_hnd_strides_is_refused():
    # vLLM HND per layer: [blocks 4, heads 8, block 16, dim 64], axes named in that order
    a = np.zeros((4, 8, 16, 64), ml_dtypes.bfloat16)
    axes = ("page", "head", "page_token", "dim")
    ok = geometry_from_tensors([TensorBuffer("k", [a, a], axes=axes, arrangement="head_major")],
                               page_size_tokens=16, memory_layout="page_first_direct")
    assert ok.buffers[0]["bytes_per_token"] == 8 * 64 * 2
    with pytest.raises(kvlayout.TensorMismatch, match="declared token_major, tensor head_major"):
        geometry_from_tensors([TensorBuffer("k", [a, a], axes=axes)], page_size_tokens=16,
                              memory_layout="page_first_direct")


def test_memory_layout_must_match_where_the_layer_axis_lies():
    layer_outer = np.zeros((2, 128, 8, 64), ml_dtypes.bfloat16)
    with pytest.raises(kvlayout.TensorMismatch) as e:
        geometry_from_tensors({"k": layer_outer}, page_size_tokens=64, memory_layout="page_first")
    assert e.value.field == "k.memory_layout"
    # layer stride 128 x 1,024 B, token stride 1,024 B
    assert "layer stride 131072 B, token stride 1024 B" in e.value.problem
    # SGLang's page_first host pool: [tokens, layers, heads, dim]
    token_outer = np.zeros((128, 2, 8, 64), ml_dtypes.bfloat16)
    axes = ("token", "layer", "head", "dim")
    g = geometry_from_tensors([TensorBuffer("k", token_outer, axes=axes)], page_size_tokens=64,
                              memory_layout="page_first")
    assert g.buffers[0]["layers"] == 2
    with pytest.raises(kvlayout.TensorMismatch, match="declared layer_first, tensor a page-first"):
        geometry_from_tensors([TensorBuffer("k", token_outer, axes=axes)], page_size_tokens=64)


@pytest.mark.parametrize(
    "axes", [("layer", "token", "token", "dim"), ("layer", "token", "layer", "dim")])
def test_an_axis_named_twice_is_refused(axes):
    a = np.zeros((2, 128, 8, 64), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="more than once"):
        geometry_from_tensors([TensorBuffer("k", a, axes=axes)], page_size_tokens=64)


def test_numpy_integer_arguments_are_ints():
    a = np.zeros((2, 128, 8, 64), ml_dtypes.bfloat16)
    g = geometry_from_tensors({"k": a}, page_size_tokens=np.int64(64), pages=np.int32(2))
    assert (g.page_size_tokens, g.pages) == (64, 2)
    with pytest.raises(TypeError, match="page_size_tokens"):
        geometry_from_tensors({"k": a}, page_size_tokens=True)
    with pytest.raises(TypeError, match="pages"):
        geometry_from_tensors({"k": a}, page_size_tokens=64, pages=2.0)


# Regression (hostile review, session 8): a zero-length axis was reported as a stride problem
# ("content axis 'd1' has stride 0 B" for 0 layers, "layer stride 0 B" for 0 tokens).
@pytest.mark.parametrize("shape, axis", [((0, 128, 8, 64), "'layer'"), ((2, 0, 8, 64), "'token'")])
def test_a_zero_length_axis_is_named(shape, axis):
    a = np.zeros(shape, ml_dtypes.bfloat16)
    with pytest.raises(kvlayout.TensorMismatch, match=f"k.shape: axis {axis} of") as e:
        geometry_from_tensors({"k": a}, page_size_tokens=64)
    assert e.value.field == "k.shape"
