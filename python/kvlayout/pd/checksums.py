"""Page checksums on the prefill/decode wire (`kvlayout.checksum/v1`, computed in Rust by
`kvlayout.page_checksum`): the sender publishes the checksum of every (buffer, layer, page) it
offers in the message that tells the receiver the pages are ready (the NIXL notification, the
Mooncake metadata entry); after the transfer the receiver checksums the pages it wrote, under its
own geometry, before any of them is used, and refuses the pages that differ.

Checksums compare only when pages move whole (`pool` level: both sides lay a page alike, so the
token fingerprint and the payload, hence the seed, are the same); a `token`-level transfer (pages
cut or glued, heads split) is not verified here. Pages are found through `Geometry.regions()`
(each buffer's region, offset, layer and page steps); a `page_head` placement (a page's heads
apart) is not checksummed here.
"""

from __future__ import annotations

import kvlayout


def _places(geometry: kvlayout.Geometry) -> dict:
    """`{buffer: (region, offset, layer step, page step, payload bytes, layers)}` of the
    buffers whose page of one layer is one contiguous run."""
    out = {}
    for region in geometry.regions():
        for b in region["buffers"]:
            if b["heads"] > 1:
                continue
            payload = b["page_size_tokens"] * sum(b["section_bytes_per_token"])
            out[b["name"]] = (region["name"], b["offset_bytes"], b["layer_step_bytes"],
                              b["page_step_bytes"], payload, b["layers"])
    return out


def page_checksums(geometry: kvlayout.Geometry, regions: dict,
                   pages: list[int]) -> dict[str, list[list[str]]]:
    """`{buffer: [[hex checksum per page of pages] per layer]}` of the pages in `regions`
    (numpy byte arrays by region name); hex strings, so JSON keeps all 64 bits."""
    out = {}
    for name, (region, offset, layer_step, page_step, payload, layers) in _places(geometry).items():
        data = regions[region]
        per_layer = []
        for layer in range(layers):
            row = []
            for p in pages:
                at = offset + layer * layer_step + p * page_step
                row.append(f"{kvlayout.page_checksum(geometry, name, layer, data[at:at + payload]):#018x}")
            per_layer.append(row)
        out[name] = per_layer
    return out


def mismatches(geometry: kvlayout.Geometry, regions: dict, sent: dict, src_pages: list[int],
               dst_pages: list[int]) -> tuple[int, list[str]]:
    """Checks the destination pages `dst_pages` in `regions` against the sender's checksums of
    `src_pages` (`sent`, from `page_checksums`); returns the page payloads checked and one line
    per mismatch naming buffer, layer, both pages and both values."""
    got = page_checksums(geometry, regions, dst_pages)
    lines: list[str] = []
    checked = 0
    for name, per_layer in got.items():
        theirs = sent.get(name, [])
        for layer, values in enumerate(per_layer):
            for i, value in enumerate(values):
                if layer >= len(theirs) or i >= len(theirs[layer]):
                    lines.append(f"checksum: {name} layer {layer}: the sender sent no checksum")
                    continue
                checked += 1
                if value != theirs[layer][i]:
                    lines.append(
                        f"checksum mismatch: {name} layer {layer}, source page {src_pages[i]} -> "
                        f"destination page {dst_pages[i]}: {theirs[layer][i]} sent, {value} received")
    return checked, lines


def inject(fault: str, geometry: kvlayout.Geometry, regions: dict, dst_pages: list[int]) -> None:
    """A content-only fault on the first buffer's layer 0 after the transfer (self-test):
    `stale-destination` puts back what the first destination page held before (zeros: its
    bytes never arrived, a reused slot); `corrupted-in-flight` inverts one byte in the middle of
    the last destination page (a wire or DMA error the engine did not report); `torn-copy` puts
    back what the second half of the last destination page held before (zeros: the copy stopped
    half way)."""
    name, (region, offset, _layer_step, page_step, payload, _layers) = next(
        iter(_places(geometry).items()))
    data = regions[region]
    if fault == "stale-destination":
        at = offset + dst_pages[0] * page_step
        data[at:at + payload] = 0
    elif fault == "corrupted-in-flight":
        at = offset + dst_pages[-1] * page_step + payload // 2
        data[at] ^= 0xFF
    elif fault == "torn-copy":
        at = offset + dst_pages[-1] * page_step
        data[at + payload // 2:at + payload] = 0
    else:
        raise ValueError(
            f"fault {fault!r}: expected stale-destination, corrupted-in-flight or torn-copy")


__all__ = ["inject", "mismatches", "page_checksums"]
