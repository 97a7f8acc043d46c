from ._kvlayout import (
    CHECKS_COMPILED as CHECKS_COMPILED,
    SCHEMA as SCHEMA,
    Geometry as Geometry,
    Plan as Plan,
    TransferGuard as TransferGuard,
    check as check,
    compare as compare,
    describe as describe,
    formats as formats,
    page_checksum as page_checksum,
    page_plan as page_plan,
    token_plan as token_plan,
    totals as totals,
)
from .errors import (
    Incompatible as Incompatible,
    InvalidGeometry as InvalidGeometry,
    KvLayoutError as KvLayoutError,
    ModelError as ModelError,
    TensorMismatch as TensorMismatch,
    TransferRefused as TransferRefused,
)
from .tensors import (
    TensorBuffer as TensorBuffer,
    geometry_from_tensors as geometry_from_tensors,
)

__version__: str
__all__: list[str]
