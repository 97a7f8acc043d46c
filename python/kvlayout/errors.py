"""Exceptions of kvlayout. Every one derives from :class:`KvLayoutError`.

- :class:`InvalidGeometry` (also a ``ValueError``): a geometry that breaks a rule; ``.field`` is
  the field path (``buffers[1] (index_k).sections[0] (values).dtype``), ``.problem`` what is
  wrong, with the value. What ``kvlayout check`` exits 2 on.
- :class:`Incompatible`: two pools that cannot exchange pages; ``.lines`` holds the CLI's diff
  lines (``index_k.bytes_per_token: 256, 132``), ``.header`` the summary with both fingerprints
  at the compared level (``incompatible: 1 differing field at level pool (pool fingerprints
  0x..., 0x...)``). What ``kvlayout check`` exits 1 on.
- :class:`TransferRefused`: the transfer guard refused a transfer before any byte moved;
  ``.kind`` is ``layer``, ``length``, ``too_many_pairs``, ``page_out_of_range`` or
  ``duplicate_destination`` (``TransferGuard``), ``item_size`` or ``unchecked`` (the SGLang op
  wrappers of ``kvlayout.adapters.sglang.guard_transfer_ops``).
- :class:`TensorMismatch` (also an :class:`InvalidGeometry`): a tensor's bytes or strides
  disagree with the declared format; the message names the buffer and both numbers.
- :class:`ModelError` (also a ``ValueError``): a model config that cannot be read or mapped to
  a pool.

Every class pickles with its attributes (vLLM and Ray pickle a worker's exception).
"""

from __future__ import annotations

from typing import Sequence

__all__ = [
    "KvLayoutError",
    "InvalidGeometry",
    "TensorMismatch",
    "Incompatible",
    "TransferRefused",
    "ModelError",
]


class KvLayoutError(Exception):
    """Base class of every kvlayout error."""


class InvalidGeometry(KvLayoutError, ValueError):
    """A geometry that breaks a rule: ``field`` (its path) and ``problem`` (with the value)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    def __reduce__(self):  # type: ignore[override]
        return (type(self), (self.field, self.problem), self.__dict__)


class TensorMismatch(InvalidGeometry):
    """A tensor disagrees with the declared format: the buffer, the quantity and both numbers."""


class Incompatible(KvLayoutError):
    """Two pools that cannot exchange pages.

    ``lines``: one line per differing field, ``field: A value, B value``, exactly as
    ``kvlayout check`` prints them; ``header``: ``incompatible: N differing fields at level
    LEVEL (LEVEL fingerprints A, B)``.
    """

    def __init__(self, lines: Sequence[str], header: str | None = None) -> None:
        self.lines = list(lines)
        n = len(self.lines)
        self.header = header or f"incompatible: {n} differing field{'' if n == 1 else 's'}"
        super().__init__("\n".join([self.header, *self.lines]))

    def __reduce__(self):  # type: ignore[override]
        return (_rebuild, (type(self), self.__dict__))


class TransferRefused(KvLayoutError):
    """The guard refused a transfer; nothing may move. ``kind`` classifies the refusal."""

    def __init__(self, reason: str, kind: str = "refused") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind

    def __reduce__(self):  # type: ignore[override]
        return (type(self), (self.reason, self.kind), self.__dict__)


class ModelError(KvLayoutError, ValueError):
    """A model config (built-in name, config.json or model directory) that cannot be mapped."""


def _rebuild(cls: type[Incompatible], state: dict) -> Incompatible:
    """Unpickles an exception whose constructor takes more than its message (subclasses such
    as ``kvlayout.pd.PeerRefused`` add attributes): the instance rebuilt from its attributes."""
    e = Exception.__new__(cls)
    e.__dict__.update(state)
    Exception.__init__(e, "\n".join([state["header"], *state["lines"]]))
    return e
