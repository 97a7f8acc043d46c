"""Recomputes kvlayout's fingerprints of a geometry file (v1, v2 or v3) from the byte streams
documented in layout-core/src/fingerprint.rs, with nothing but the standard library, and
compares them with the expected values. Exit 0 on a match, 1 on a mismatch.

usage: python3 layout-core/tests/fingerprint_reference.py [FILE.json 0xPOOL [BUFFER=0xTOKEN ...]]
Without arguments it checks the pools whose fingerprints the README publishes and one file of
each v3 field (compressed rows, replicated heads, split groups), pool and token fingerprints.
"""
import json
import sys

DTYPE = {"f32": 1, "f16": 2, "bf16": 3, "f8e4m3": 4, "f8e4m3fnuz": 5, "f8e5m2": 6,
         "f8e5m2fnuz": 7, "ue8m0": 8, "u8": 9, "i8": 10, "f4e2m1": 11, "i32": 12, "i64": 13}
BITS = {"f32": 32, "f16": 16, "bf16": 16, "f4e2m1": 4, "i32": 32, "i64": 64}
ARRANGEMENT = {"token_major": 1, "section_major": 2, "head_major": 3}
MEMORY_LAYOUT = {"layer_first": 1, "page_first": 2, "page_first_direct": 3, "page_head": 4,
                 "layer_head": 5, "page_unified": 6, "page_head_token": 7}


def fnv(items):
    h = 0xCBF29CE484222325
    for item in items:
        if isinstance(item, str):
            data = item.encode()
            data = len(data).to_bytes(8, "little") + data
        else:
            data = item.to_bytes(8, "little")
        for byte in data:
            h = ((h ^ byte) * 0x100000001B3) % 2**64
    return h


def arrangement_items(buf):
    """Arrangement code, then for planes the plane count and each plane's length and indices."""
    arr = buf["arrangement"]
    if isinstance(arr, str):
        return [ARRANGEMENT[arr]]
    names = [s["name"] for s in buf["sections"]]
    items = [4, len(arr["planes"])]
    for plane in arr["planes"]:
        items += [len(plane)] + [names.index(n) for n in plane]
    return items


def scale_items(buf, s):
    names = [x["name"] for x in buf["sections"]]
    return [1, names.index(s["scales"]), s["block_elems"]] if "scales" in s else [0]


def core_hash(buf):
    sections = buf["sections"]
    items = ["kvlayout.layout/v1"] + arrangement_items(buf) + [len(sections)]
    for s in sections:
        items += [DTYPE[s["dtype"]], len(s["shape"])] + s["shape"] + scale_items(buf, s)
    return fnv(items)


def row_bytes(buf):
    bits = 0
    for s in buf["sections"]:
        elems = 1
        for d in s["shape"]:
            elems *= d
        bits += elems * BITS.get(s["dtype"], 8)
    return bits // 8


def page_size(buf, pool_page):
    if buf.get("attention") == "state":
        return 1
    return buf.get("page_size_tokens", pool_page)


def stride(buf, rows):
    payload = rows * row_bytes(buf)
    if "page_stride_bytes" in buf:
        return buf["page_stride_bytes"]
    align = buf.get("page_align_bytes")
    return -(-payload // align) * align if align else payload


def attention_items(buf):
    att = buf.get("attention", "full")
    if att == "full":
        return [1, 0]
    if att == "state":
        return [4, 0]
    if "sliding_window_tokens" in att:
        return [2, att["sliding_window_tokens"]]
    return [3, att["chunk_tokens"]]


def layer_id_items(buf):
    ids = buf.get("layer_ids")
    return [0] if ids is None else [1, len(ids)] + ids


def shard_items(buf):
    sh = buf.get("shard")
    if sh is None:
        return [0]
    split = 1 if sh["split"] == "heads" else 2
    return [1, sh["tp_size"], sh["rank"], split, sh.get("heads_total", 0)]


def order_items(buf):
    items = []
    for s in buf["sections"]:
        order = s.get("order")
        items += [0] if order in (None, "linear") else [1, order]
    return items


def group_items(buf):
    items = []
    for s in buf["sections"]:
        g = s.get("split_groups")
        items += [0] if g is None else [1, len(g)] + g
    return items


def replicated_head(buf):
    """The head a rank holds when heads are replicated over ranks, else None."""
    sh = buf.get("shard")
    if sh and sh["split"] == "heads" and sh["heads_total"] < sh["tp_size"]:
        return sh["rank"] // (sh["tp_size"] // sh["heads_total"])
    return None


def has_v3(buf):
    return (buf.get("compress_ratio", 1) != 1 or replicated_head(buf) is not None
            or any("split_groups" in s for s in buf["sections"]))


def has_v2(buf, pool_page):
    return (buf.get("page_size_tokens", pool_page) != pool_page
            or buf.get("attention", "full") != "full" or "layer_ids" in buf or "shard" in buf
            or any(s.get("order") not in (None, "linear") for s in buf["sections"]))


def buffer_hash(buf, pool_page):
    page = page_size(buf, pool_page)
    r = buf.get("compress_ratio", 1)
    if has_v3(buf):
        return fnv(["kvlayout.buffer/v3", buf["name"], buf["layers"], page, r,
                    stride(buf, page // r), core_hash(buf)] + attention_items(buf)
                   + layer_id_items(buf) + shard_items(buf) + order_items(buf) + group_items(buf))
    if has_v2(buf, pool_page):
        return fnv(["kvlayout.buffer/v2", buf["name"], buf["layers"], page, stride(buf, page),
                    core_hash(buf)] + attention_items(buf) + layer_id_items(buf)
                   + shard_items(buf) + order_items(buf))
    return fnv(["kvlayout.buffer/v1", buf["name"], buf["layers"], stride(buf, pool_page),
                core_hash(buf)])


def pool_fingerprint(geometry):
    page = geometry["page_size_tokens"]
    buffers = geometry["buffers"]
    total = sum(buffer_hash(b, page) for b in buffers) % 2**64
    token_axis = any(b.get("attention") != "state" for b in buffers)
    return fnv(["kvlayout.pool/v1", page if token_axis else 0, len(buffers), total])


def storage_fingerprint(geometry):
    """FNV(str("kvlayout.storage/v1"), u64(pool), u64(memory layout code)), then
    u64(heads_per_group) for {"page_unified": {"heads_per_group": N}}."""
    layout = geometry["memory_layout"]
    if isinstance(layout, dict):
        (name, params), = layout.items()
        return fnv(["kvlayout.storage/v1", pool_fingerprint(geometry), MEMORY_LAYOUT[name],
                    params["heads_per_group"]])
    return fnv(["kvlayout.storage/v1", pool_fingerprint(geometry), MEMORY_LAYOUT[layout]])


def token_fingerprint(buf, pool_page):
    v3 = has_v3(buf)
    sh = buf.get("shard")
    heads_total = sh["heads_total"] if sh and sh["split"] == "heads" else 0
    page_bound = not isinstance(buf["arrangement"], str) or buf["arrangement"] == "section_major"
    items = ["kvlayout.token/v3" if v3 else "kvlayout.token/v1", buf["name"], buf["layers"]]
    items += attention_items(buf) + layer_id_items(buf) + arrangement_items(buf)
    items += [page_size(buf, pool_page) if page_bound else 0, heads_total, len(buf["sections"])]
    for s in buf["sections"]:
        shape = s["shape"][1:] if heads_total else s["shape"]
        items += [DTYPE[s["dtype"]], len(shape)] + shape + scale_items(buf, s)
    items += order_items(buf)
    if v3:
        head = replicated_head(buf)
        items += [buf.get("compress_ratio", 1)] + ([0] if head is None else [1, head])
        items += group_items(buf)
    return fnv(items)


CASES = "cli/tests/shared-cases/"
PUBLISHED = [
    # v1, published in README: DeepSeek-V3.2 with a bf16 index-K (the seed bug's device side),
    # and fp8 + fp8.
    (CASES + "00-dsa-index-k-bf16-vs-fp8-host/a.json", "0xc1cdf9932d9f02b1", {}),
    (CASES + "14-namespace-label-only-same-geometry/a.json", "0xeb019e4f84ee0658", {}),
    # v2: planes + page alignment + sliding window (DeepSeek-V4 SWA, FlashMLA record).
    (CASES + "24-dsv4-pd-flashmla-584-vs-trtllm-512/a.json", "0xb80604b9e9ce67be", {}),
    # v3, compress_ratio 4 (DeepSeek-V4 C4 indexer, 16 rows of 132 B per 64-token page).
    (CASES + "28-dsv4-c4-indexer-host-per-token-vs-per-row/a.json", "0x4f8f39636bf81db6", {}),
    # v3, replicated heads (Qwen3.5 TP 4 rank 2 holds head 1 of 2) and the v2 side it matches
    # at token level, whose token fingerprint differs (only the replicated side hashes its head).
    (CASES + "29-compatible-replicated-heads-tp2-to-tp4-token-level/b.json", "0xcf4c3d88138e86c1",
     {"full_attn": "0x03d0ecd94e4aeffc"}),
    (CASES + "29-compatible-replicated-heads-tp2-to-tp4-token-level/a.json", "0x52aca57767715f33",
     {"full_attn": "0xfed9833c02190b2f"}),
    # v3, split_groups (GDN conv q|k|v at TP 2 and TP 4: one token fingerprint).
    (CASES + "30-compatible-gdn-conv-split-groups-tp2-vs-tp4-token-level/a.json",
     "0x4c9d2b1b4d08550b", {"conv": "0xea9ec2b8ea632e8c"}),
    (CASES + "30-compatible-gdn-conv-split-groups-tp2-vs-tp4-token-level/b.json",
     "0xa05043f792e86b9f", {"conv": "0xea9ec2b8ea632e8c"}),
]

# Storage fingerprints (memory layout included): a v1 layer_first pool (the README's storage
# key) and SGLang's MHA page_unified host layout (2 heads per group; layout-core
# tests/pool_geometry.rs new_memory_layouts_in_geometry_files).
PAGE_UNIFIED = {
    "schema": "kvlayout.geometry/v3", "page_size_tokens": 2, "pages": 5,
    "memory_layout": {"page_unified": {"heads_per_group": 2}},
    "buffers": [{"name": n, "layers": 3, "arrangement": "token_major",
                 "sections": [{"name": n, "dtype": "bf16", "shape": [4, 2]}]} for n in "kv"]}
STORAGE = [
    (CASES + "14-namespace-label-only-same-geometry/a.json", "0xbe105f0cf9618c3e"),
    (PAGE_UNIFIED, "0x4a874bbd003475ad"),
]

if __name__ == "__main__":
    if len(sys.argv) >= 3:
        tokens = dict(arg.split("=", 1) for arg in sys.argv[3:])
        cases = [(sys.argv[1], sys.argv[2], tokens)]
    else:
        cases = PUBLISHED
    ok = True
    for path, expected, tokens in cases:
        geometry = json.load(open(path))
        got = pool_fingerprint(geometry)
        print(f"{path}: pool fingerprint {got:#018x}, expected {expected}")
        ok = ok and got == int(expected, 16)
        by_name = {b["name"]: b for b in geometry["buffers"]}
        for name, want in tokens.items():
            got = token_fingerprint(by_name[name], geometry["page_size_tokens"])
            print(f"  token {name}: {got:#018x}, expected {want}")
            ok = ok and got == int(want, 16)
    if len(sys.argv) < 3:
        for geometry, expected in STORAGE:
            where = geometry if isinstance(geometry, str) else "page_unified (2 heads per group)"
            if isinstance(geometry, str):
                geometry = json.load(open(geometry))
            got = storage_fingerprint(geometry)
            print(f"{where}: storage fingerprint {got:#018x}, expected {expected}")
            ok = ok and got == int(expected, 16)
    sys.exit(0 if ok else 1)
