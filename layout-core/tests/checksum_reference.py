"""Recomputes kvlayout's page checksum (kvlayout.checksum/v1, documented byte for byte in
layout-core/src/checksum.rs) with nothing but the standard library, for every vector of
layout-core/tests/checksum_vectors.txt (which the Rust tests check too). Exit 0 when all match.

usage: python3 layout-core/tests/checksum_reference.py
"""
import os
import sys

M = 2**64 - 1


def fmix(x):
    x ^= x >> 33
    x = x * 0xFF51AFD7ED558CCD & M
    x ^= x >> 33
    x = x * 0xC4CEB9FE1A85EC53 & M
    return x ^ (x >> 33)


def page_checksum(token_fingerprint, layer_id, payload):
    h = fmix(fmix(fmix(token_fingerprint ^ int.from_bytes(b"kvlayout", "little")) ^ layer_id)
             ^ len(payload))
    for start in range(0, len(payload), 4096):
        chunk = payload[start:start + 4096]
        chunk += bytes(-len(chunk) % 8)
        lanes = [0] * 8
        for j in range(len(chunk) // 8):
            w = int.from_bytes(chunk[8 * j:8 * j + 8], "little")
            x = w ^ ((j + 1) * 0x9E3779B97F4A7C15 & M)
            lanes[j % 8] = (lanes[j % 8] + (x & 0xFFFFFFFF) * (x >> 32)) & M
            lanes[(j % 8) ^ 1] = (lanes[(j % 8) ^ 1] + w) & M
        h = fmix(h ^ sum(fmix(a ^ ((l + 1) * 0xC2B2AE3D27D4EB4F & M)) for l, a in enumerate(lanes)) % 2**64)
    return h


def payload(length, mul, add):
    """The vectors' payload: byte i is (i * mul + add) mod 256."""
    return bytes((i * mul + add) % 256 for i in range(length))


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checksum_vectors.txt")
    ok, count = True, 0
    for line in open(path):
        if not line.strip() or line.startswith("#"):
            continue
        t, layer, length, mul, add, expected = line.split()
        got = page_checksum(int(t, 16), int(layer), payload(int(length), int(mul), int(add)))
        count += 1
        if got != int(expected, 16):
            ok = False
            print(f"MISMATCH {line.strip()}: reference gives {got:#018x}")
    print(f"checksum reference: {count} vectors, {'all match' if ok else 'MISMATCH'}")
    sys.exit(0 if ok and count > 0 else 1)
