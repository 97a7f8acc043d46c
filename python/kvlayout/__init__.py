"""kvlayout: KV-cache buffer layouts for LLM serving, checked where the pools live.

One geometry describes a pool (page size, buffers, each buffer's layers and token layout);
two pools exchange pages only if their geometries agree field by field. This package is the
Rust core (``kvlayout._kvlayout``, the same code as the ``kvlayout`` CLI) plus duck-typed
readers for torch / numpy tensors and SGLang / vLLM pool objects. Importing it imports
neither torch nor numpy nor ml_dtypes.

>>> import kvlayout
>>> dev = kvlayout.describe("deepseek-v3.2-exp", index_k="bf16")
>>> host = kvlayout.Geometry.from_file("configs/geometry/host-index-k-fp8-formula.json")
>>> kvlayout.compare(dev, host)[4]       # the CLI's diff lines; [] when compatible
'index_k.bytes_per_token: 256, 132'
>>> guard = kvlayout.TransferGuard(dev, dev)
>>> guard.check_pages("load", None, [3, 4], [0, 0])
Traceback (most recent call last):
...
kvlayout.errors.TransferRefused: pairs[1]: device page 0 is already the destination of pairs[0]
"""

from __future__ import annotations

from ._kvlayout import (
    CHECKS_COMPILED,
    SCHEMA,
    Geometry,
    Plan,
    TransferGuard,
    check,
    compare,
    describe,
    formats,
    page_checksum,
    page_plan,
    token_plan,
    totals,
)
from .tensors import TensorBuffer, geometry_from_tensors
from .errors import (
    Incompatible,
    InvalidGeometry,
    KvLayoutError,
    ModelError,
    TensorMismatch,
    TransferRefused,
)

__all__ = [
    "CHECKS_COMPILED",
    "SCHEMA",
    "Geometry",
    "Plan",
    "TransferGuard",
    "check",
    "compare",
    "describe",
    "formats",
    "page_checksum",
    "page_plan",
    "token_plan",
    "totals",
    "geometry_from_tensors",
    "TensorBuffer",
    "Incompatible",
    "InvalidGeometry",
    "KvLayoutError",
    "ModelError",
    "TensorMismatch",
    "TransferRefused",
]

__version__ = "0.1.0"
