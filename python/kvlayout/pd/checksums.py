"""Page checksums on the prefill/decode wire (`kvlayout.checksum/v1`, computed in Rust by
`kvlayout.page_checksum`): the sender publishes the checksum of every (buffer, layer, page) it
offers in the message that tells the receiver the pages are ready (the NIXL notification, the
Mooncake metadata entry); after the transfer the receiver checksums the pages it wrote, under its
own geometry, before any of them is used, and refuses the pages that differ.

Checksums compare only when pages move whole (`pool` level: both sides lay a page alike, so the
token fingerprint and the payload, hence the seed, are the same); a `token`-level transfer (pages
cut or glued, heads split) is not verified here and says so.
"""

from __future__ import annotations

import kvlayout

from .regions import BufferLayout


def _payload(layout: BufferLayout, region, layer: int, page: int):
    start = layout.page_offset_bytes(layer, page)
    return region[start:start + layout.page_size_tokens * layout.bytes_per_token]


def page_checksums(geometry: kvlayout.Geometry, layouts: dict[str, BufferLayout],
                   regions: dict, pages: list[int]) -> dict[str, list[list[str]]]:
    """`{buffer: [[hex checksum per page of pages] per layer]}` of the pages in `regions`
    (numpy byte arrays); hex strings, so JSON keeps all 64 bits."""
    return {
        name: [[f"{kvlayout.page_checksum(geometry, name, layer, _payload(lay, regions[name], layer, p)):#018x}"
                 for p in pages] for layer in range(lay.layers)]
        for name, lay in layouts.items()
    }


def mismatches(geometry: kvlayout.Geometry, layouts: dict[str, BufferLayout], regions: dict,
               sent: dict, src_pages: list[int], dst_pages: list[int]) -> tuple[int, list[str]]:
    """Checks the destination pages `dst_pages` in `regions` against the sender's checksums of
    `src_pages` (`sent`, from `page_checksums`); returns the page payloads checked and one line
    per mismatch naming buffer, layer, both pages and both values."""
    got = page_checksums(geometry, layouts, regions, dst_pages)
    lines, checked = [], 0
    for name, per_layer in got.items():
        for layer, values in enumerate(per_layer):
            for i, value in enumerate(values):
                per = sent.get(name, [])
                want = per[layer][i] if layer < len(per) and i < len(per[layer]) else None
                if want is None:
                    lines.append(f"checksum: {name} layer {layer}: the sender sent no checksum")
                    continue
                checked += 1
                if value != want:
                    lines.append(
                        f"checksum mismatch: {name} layer {layer}, source page {src_pages[i]} -> "
                        f"destination page {dst_pages[i]}: {want} sent, {value} received")
    return checked, lines


__all__ = ["mismatches", "page_checksums"]
