"""kvlayout.pd: the prefill/decode geometry handshake on real transfer engines (NIXL, Mooncake).

Each rank publishes its geometry JSON and fingerprints through the engine's own channel; the
receiving rank checks them (`handshake.check_peer`) before it registers the peer or creates a
transfer, and builds its transfer descriptors from the core's plan between the two geometries
(`kvlayout.page_plan` / `kvlayout.token_plan`, offsets inside `Geometry.regions()`): this
package holds the engine glue only, no layout arithmetic. Importing it imports no engine;
`python -m kvlayout.pd selftest --engine nixl|mooncake` runs the four contract cases and more
(hetero TP, page ratios, replicated heads, grouped conv state) across two processes.
"""

from kvlayout import Plan, page_plan, token_plan

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

__all__ = [
    "PeerRefused",
    "Plan",
    "UncheckedPeerWarning",
    "Verdict",
    "check_peer",
    "check_regions",
    "choose_level",
    "make_message",
    "page_plan",
    "parse_message",
    "token_plan",
]
