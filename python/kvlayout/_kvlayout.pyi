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
    def from_json(text: str) -> Geometry: ...
    @staticmethod
    def from_file(path: Union[str, os.PathLike[str]]) -> Geometry: ...
    def to_json(self) -> str: ...
    @property
    def fingerprint(self) -> int:
        """Pool fingerprint (64-bit), equal to the CLI's."""
    @property
    def storage_fingerprint(self) -> int: ...
    @property
    def token_fingerprints(self) -> dict[str, int]: ...
    @property
    def name(self) -> str: ...
    @property
    def page_size_tokens(self) -> int: ...
    @property
    def pages(self) -> int: ...
    @property
    def memory_layout(self) -> str: ...
    @property
    def buffers(self) -> list[dict[str, Any]]:
        """Per buffer: the file form plus arrangement_text, bytes_per_token, bytes_per_page,
        page_stride_bytes, layout_fingerprint."""
    @property
    def bytes_per_token(self) -> int:
        """All buffers and layers, bytes per token."""
    @property
    def bytes_per_page(self) -> int:
        """All buffers and layers, bytes per page at each buffer's page stride."""
    @property
    def total_bytes(self) -> int: ...
    def mirror(self, pages: int, memory_layout: Optional[str] = None,
               name: Optional[str] = None) -> Geometry:
        """A mirror pool's geometry: every compared field from self; pages, layout, name new."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class TransferGuard:
    """A device/host pair checked at construction (raises Incompatible)."""

    def __new__(cls, device: Geometry, host: Geometry) -> TransferGuard: ...
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
        `layer_ids`; None: all layers. Raises TransferRefused (kind: layer, length,
        too_many_pairs, page_out_of_range, duplicate_destination); TypeError for a bool, or
        indices that are not int64 / one-dimensional / host-readable. Safe to share between
        threads."""
    def layer_indices(self, layer: int) -> dict[str, int]:
        """{buffer name: layer index} of the buffers that hold `layer` (a model layer id when
        the buffers carry `layer_ids`); TransferRefused (kind layer) when none does."""

def compare(a: Geometry, b: Geometry, level: _Level = "pool") -> list[str]: ...
def check(a: Geometry, b: Geometry, level: _Level = "pool") -> None: ...
def describe(
    model: Union[str, os.PathLike[str]],
    kv_dtype: Optional[Literal["bf16", "fp8"]] = None,
    index_k: Optional[Literal["fp8", "bf16", "fp4"]] = None,
    tp: Optional[int] = None,
    rank: Optional[int] = None,
    *,
    state_dtype: Optional[Literal["f32", "bf16", "f16"]] = None,
    page_size_tokens: int = 64,
    pages: int = 1024,
    equal_page_bytes: bool = False,
) -> Geometry: ...
def totals(
    model: Union[str, os.PathLike[str]],
    kv_dtype: Optional[Literal["bf16", "fp8"]] = None,
    index_k: Optional[Literal["fp8", "bf16", "fp4"]] = None,
    tp: Optional[int] = None,
    rank: Optional[int] = None,
    *,
    state_dtype: Optional[Literal["f32", "bf16", "f16"]] = None,
) -> dict[str, Any]:
    """`kvlayout describe --totals`: model, full_bytes_per_token, window_bytes_per_request_max,
    state_bytes_per_request, layers_by_attention."""
def formats() -> list[dict[str, Any]]: ...
