"""Type stubs of the Rust extension kvlayout._kvlayout (see python/src/*.rs)."""

from __future__ import annotations

import os
from typing import Any, Literal, Optional, Sequence, TypeAlias, Union


SCHEMA: str
CHECKS_COMPILED: bool

# Typing-only aliases (private: they exist in this stub, not in the runtime module).
_Level: TypeAlias = Literal["pool", "storage", "token"]
_PageIndices: TypeAlias = Union[Sequence[int], Any]  # list/tuple of int, int64 buffer, or __dlpack__ tensor

class Geometry:
    """A validated pool geometry (kvlayout.geometry/v1 or /v2)."""

    @staticmethod
    def from_json(text: str) -> Geometry:
        """Reads and validates a geometry file's text (``kvlayout.geometry/v1``, ``/v2`` or
        ``/v3``; one leading UTF-8 BOM skipped). Raises InvalidGeometry (``.field``,
        ``.problem``: unknown schema, field, dtype or arrangement, zero dimension, overflow, JSON
        syntax with line and column, a field given twice, a ``compress_ratio`` that does not
        divide the page, a head split or ``split_groups`` that ``tp_size`` does not divide, text
        that is not valid Unicode); TypeError for a non-str."""
    @staticmethod
    def from_file(path: Union[str, os.PathLike[str]]) -> Geometry:
        """Reads a geometry file of at most 16 MiB; InvalidGeometry as ``from_json``, its field
        prefixed with the path (also for a missing or unreadable file)."""
    def to_json(self) -> str:
        """The geometry file (pretty JSON, trailing newline), as ``kvlayout describe --json``."""
    @property
    def fingerprint(self) -> int:
        """Pool fingerprint (64-bit FNV-1a over exactly the fields the ``pool`` level compares),
        equal to the CLI's (printed there as hex)."""
    @property
    def storage_fingerprint(self) -> int:
        """``storage`` fingerprint (64-bit): the pool fingerprint and the memory layout."""
    @property
    def token_fingerprints(self) -> dict[str, int]:
        """``{buffer name: 64-bit int}``: each buffer's ``token``-level fingerprint (attention,
        dtypes, per-head shapes, scale relations, orders, arrangement), in buffer order."""
    @property
    def name(self) -> str: ...
    @property
    def page_size_tokens(self) -> int: ...
    @property
    def pages(self) -> int: ...
    @property
    def memory_layout(self) -> str:
        """``layer_first``, ``page_first``, ``page_first_direct``, ``page_head``
        (``[page][head][layer][token][head row]``: vLLM's BHLNC), ``page_head_token``
        (``[page][head][token][layer][head row]``: SGLang's MHA ``page_head`` host), ``layer_head``
        (``[layer][head][page][token][head row]``: vLLM's LHBNC) or ``page_unified`` (SGLang's
        MHA host layout ``(page_num, head_group_num, layer_num, 2, page_size, heads_per_group,
        head_dim)``: one region ``[page][group][layer][buffer][token][group row]``)."""
    @property
    def heads_per_group(self) -> Optional[int]:
        """``page_unified``'s heads per group (``head_num // head_group_num``), else None."""
    @property
    def buffers(self) -> list[dict[str, Any]]:
        """Per buffer: the file form (v3: ``compress_ratio``, ``split_groups``) plus
        arrangement_text, bytes_per_token (one row), rows_per_page, bytes_per_page,
        page_stride_bytes, heads_held (``[lo, hi)`` for a heads split), layout_fingerprint."""
    @property
    def bytes_per_token(self) -> int:
        """All buffers and layers, bytes per token (``InvalidGeometry`` naming
        ``compress_ratio`` when a buffer stores one row per several tokens)."""
    @property
    def bytes_per_page(self) -> int:
        """All buffers and layers, bytes per page at each buffer's page stride."""
    @property
    def total_bytes(self) -> int:
        """Bytes of the whole pool in its memory layout (every buffer, layer and page)."""
    def regions(self) -> list[dict[str, Any]]:
        """The contiguous regions of the pool, in buffer order: one per buffer (its name), or
        one named ``pool`` under ``page_first_direct`` and ``page_unified``. Each: ``name``, ``pool_offset_bytes``,
        ``len_bytes``, ``buffers`` (one dict per buffer held: ``name``, ``layers``, ``pages``,
        ``page_size_tokens``, ``compress_ratio``, ``rows_per_page`` (tokens per page / the
        ratio), ``offset_bytes``, ``page_step_bytes``, ``layer_step_bytes``,
        ``head_step_bytes``, ``heads``, ``run_bytes``, ``runs``, ``run_step_bytes``,
        ``section_bytes_per_token``): head ``h``
        of page ``p`` of layer ``l`` starts at ``offset_bytes + p * page_step_bytes + l *
        layer_step_bytes + h * head_step_bytes`` and is ``run_bytes`` long (``heads`` is 1
        except under ``page_head``, ``page_head_token`` and ``layer_head``, where it counts
        heads, and ``page_unified``, where it counts head groups); ``runs`` runs of a piece,
        ``run_step_bytes`` apart (``runs`` is 1 except under ``page_head_token``: one run a
        token, ``layers`` head rows apart)."""
    def mirror(self, pages: int, memory_layout: Optional[str] = None,
               name: Optional[str] = None, heads_per_group: Optional[int] = None) -> Geometry:
        """A mirror pool's geometry: every compared field from self; pages, layout, name new.
        ``memory_layout="page_unified"`` needs ``heads_per_group``; ``heads_per_group`` with any
        other layout, or one that does not divide the heads, raises ``InvalidGeometry``."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

def page_checksum(geometry: Geometry, buffer: str, layer: int, payload: Any) -> int: ...

class TransferGuard:
    """A device/host pair checked at construction (raises Incompatible). checksum: "off"
    (default), "all" or "sampled:N". With "off", record_backup and verify_load read no bytes
    and return 0, but still check every argument (buffer, layer, page lists, data) and raise as
    in the other modes: a call wired wrong fails before checksums are turned on."""

    def __new__(cls, device: Geometry, host: Geometry, checksum: str = "off") -> TransferGuard: ...
    @property
    def checksum(self) -> str: ...
    def page_checksums(self, buffer: str, layer: int, data: Any, pages: _PageIndices) -> list[int]:
        """data: the layer's device region [page][page stride]: a C-contiguous numpy array or
        buffer, a CPU torch tensor (hashed in Rust in place), or a CUDA torch tensor (hashed on
        its device by the Rust kernel, on PyTorch's current stream; ValueError naming data when
        the CUDA driver cannot be loaded). Flat (1-D) data is read at page-stride offsets; data
        of 2 or more dimensions must have rows (bytes per leading index) of the page stride, or
        of one page row where pages have no padding (SGLang's [tokens][heads][head dim]), else
        ValueError naming data, both byte counts and the buffer (record_backup and verify_load
        too, in every checksum mode)."""
        ...
    def record_backup(self, buffer: str, layer: int, data: Any, device_pages: _PageIndices,
                      host_pages: _PageIndices) -> int:
        """Raises TransferRefused (kind page_out_of_range, duplicate_destination: a host page
        named twice) and records nothing then."""
        ...
    def verify_load(self, buffer: str, layer: int, data: Any, host_pages: _PageIndices,
                    device_pages: _PageIndices) -> int:
        """Raises TransferRefused (kind checksum_mismatch, .pages: [(host, device)]; kind
        page_out_of_range or duplicate_destination, a device page named twice, before any
        page is read)."""
        ...
    @property
    def device(self) -> Geometry: ...
    @property
    def host(self) -> Geometry: ...
    @property
    def fingerprint(self) -> int: ...
    def check_pages(
        self,
        direction: Literal["load", "backup"],
        layer: Optional[int],
        src_pages: _PageIndices,
        dst_pages: _PageIndices,
    ) -> None:
        """`layer`: an index, or the model layer id on a geometry whose buffers carry
        `layer_ids`; None: all layers (ints: Python's or numpy's). Raises TransferRefused
        (kind: layer, length, too_many_pairs, page_out_of_range (negative, past the pool, or
        past the int64 range), duplicate_destination); TypeError for a bool, or indices that are not
        integers / int64 arrays / one-dimensional / host-readable. Safe to share between
        threads."""
    def layer_indices(self, layer: int) -> dict[str, int]:
        """{buffer name: layer index} of the buffers that hold `layer` (a model layer id when
        the buffers carry `layer_ids`); TransferRefused (kind layer) when none does."""

class Plan:
    """A transfer plan between two pools (``page_plan`` / ``token_plan``), merged into maximal
    runs."""

    @property
    def level(self) -> Literal["pool", "token"]: ...
    @property
    def runs(self) -> dict[str, list[tuple[int, int, int]]]:
        """``{buffer: [(src_offset_bytes, dst_offset_bytes, length_bytes), ...]}``, offsets inside
        the buffer's region on each side (``regions``)."""
    @property
    def regions(self) -> dict[str, tuple[str, str]]:
        """``{buffer: (source region name, destination region name)}``."""
    @property
    def head_ranges(self) -> dict[str, tuple[int, int]]:
        """``{buffer: (lo, hi)}``: the global heads moved, for buffers split by heads on both
        sides."""
    @property
    def bytes_total(self) -> int: ...
    @property
    def run_count(self) -> int: ...

def page_plan(src: Geometry, dst: Geometry, src_pages: _PageIndices,
              dst_pages: _PageIndices) -> Plan:
    """Whole pages ``src_pages[i]`` -> ``dst_pages[i]`` in every layer, for pools compatible at
    the ``pool`` level (any memory layouts). Raises Incompatible (the ``pool``-level diff lines),
    TransferRefused (kind: page_out_of_range, duplicate_destination, length, negative_page,
    state)."""
def token_plan(src: Geometry, dst: Geometry, src_pages: _PageIndices,
               dst_pages: _PageIndices) -> Plan:
    """Token runs with head slices, for pools compatible at the ``token`` level (page sizes,
    head splits and memory layouts may differ, except that ``section_major`` and ``planes``
    pages cannot be cut or glued: those buffers need equal page sizes): the source pages are
    one token stream cut into the destination's pages. Raises as ``page_plan`` at the
    ``token`` level, and TransferRefused (kind ``length``: different token counts; ``heads``: a
    section's bytes per head differ)."""

def compare(a: Geometry, b: Geometry, level: _Level = "pool") -> list[str]:
    """The diff lines of ``kvlayout check --level LEVEL A B`` (``field: A value, B value``, one
    per differing field); ``[]`` when compatible. ``level``: ``pool`` (whole pages move),
    ``storage`` (``pool`` plus memory layout) or ``token`` (tokens convertible per head; page
    size ignored, except that ``section_major`` and ``planes`` pages cannot be cut or glued, so
    those buffers still need equal page sizes). An unknown level raises InvalidGeometry (field
    ``level``, a ValueError)."""
def check(a: Geometry, b: Geometry, level: _Level = "pool") -> None:
    """None when compatible at ``level``; raises Incompatible (``.lines`` as ``compare``,
    ``.header`` with the count, the level and both fingerprints). An unknown level raises
    InvalidGeometry (field ``level``)."""
def describe(
    model: Union[str, os.PathLike[str]],
    kv_dtype: Optional[Literal["bf16", "fp8"]] = None,
    index_k: Optional[Literal["fp8", "bf16", "fp4"]] = None,
    tp: Optional[int] = None,
    rank: Optional[int] = None,
    *,
    state_dtype: Optional[Literal["f32", "bf16", "f16"]] = None,
    page_size_tokens: Optional[int] = None,
    pages: int = 1024,
    equal_page_bytes: bool = False,
    kv_layout: Optional[Literal["flashmla", "trtllm"]] = None,
) -> Geometry:
    """The device pool geometry of one tensor-parallel rank of ``model`` (a built-in name, a
    config.json path or a Hugging Face model directory), as ``kvlayout describe --json``.
    ``kv_dtype`` default fp8 for DSA models, else bf16; ``index_k`` default fp8 (DeepSeek
    indexer models only: given for another model it raises InvalidGeometry, a ValueError,
    naming ``index_k`` and the model, as the CLI refuses ``--index-k``); ``state_dtype``
    recurrent-state dtype (models with linear-attention, KDA, RG-LRU or Mamba layers only:
    InvalidGeometry naming ``state_dtype`` otherwise); ``page_size_tokens``
    tokens per page (default the engine's: 256 for DeepSeek-V4, else 64); ``pages`` page count;
    ``kv_layout`` DeepSeek-V4's KV record, as the CLI's ``--kv-layout``: ``flashmla`` (default,
    SGLang's ``DeepSeekV4SingleKVPool``: 584 B a token) or ``trtllm``
    (``DeepSeekV4UniformFP8KVPool``: 512 B, no in-cache scales); given for a model that is not
    DeepSeek-V4 it raises InvalidGeometry naming ``kv_layout``. Geometry v3 fields come with the model:
    ``compress_ratio`` (DeepSeek-V4's C4/C128 rows), replicated heads (fewer KV heads than
    ``tp``), ``split_groups`` (a conv state's q|k|v or x|B|C under ``tp``).
    Raises ModelError (unreadable config, or a field that changes the cache and is not modelled,
    named) or ValueError / TypeError (a bad option, named)."""
def totals(
    model: Union[str, os.PathLike[str]],
    kv_dtype: Optional[Literal["bf16", "fp8"]] = None,
    index_k: Optional[Literal["fp8", "bf16", "fp4"]] = None,
    tp: Optional[int] = None,
    rank: Optional[int] = None,
    *,
    state_dtype: Optional[Literal["f32", "bf16", "f16"]] = None,
    kv_layout: Optional[Literal["flashmla", "trtllm"]] = None,
) -> dict[str, Any]:
    """`kvlayout describe --totals`: model, full_bytes_per_token, window_bytes_per_request_max,
    state_bytes_per_request, compressed_bytes_per_token (an int when whole, else a float:
    DeepSeek-V4-Flash 10570.25), layers_by_attention. Options as :func:`describe`
    (``kv_layout`` DeepSeek-V4 only)."""
def formats() -> list[dict[str, Any]]:
    """The built-in token layouts, as ``kvlayout formats --json`` (fingerprint as an int), each
    with its file form (``arrangement``, ``sections``, alignment) under ``"layout"``."""
