"""kvlayout.pd: the prefill/decode geometry handshake on real transfer engines (NIXL, Mooncake).

Each rank publishes its geometry JSON and fingerprints through the engine's own channel; the
receiving rank checks them (`handshake.check_peer`) before it registers the peer or creates a
transfer, and builds its transfer descriptors from the two geometries (`plan`). Importing this
package imports no engine; `python -m kvlayout.pd selftest --engine nixl|mooncake` runs the
four contract cases (and two more) across two processes.
"""

from .handshake import (
    PeerRefused,
    UncheckedPeerWarning,
    Verdict,
    check_peer,
    check_regions,
    choose_level,
    make_message,
    parse_message,
)
from .plan import Plan, page_plan, token_plan
from .regions import BufferLayout, LayoutError, buffer_layouts

__all__ = [
    "BufferLayout",
    "LayoutError",
    "PeerRefused",
    "Plan",
    "UncheckedPeerWarning",
    "Verdict",
    "buffer_layouts",
    "check_peer",
    "check_regions",
    "choose_level",
    "make_message",
    "page_plan",
    "parse_message",
    "token_plan",
]
