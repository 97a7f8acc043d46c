"""Cost of TransferGuard.check_pages against the transfer it guards, measured in one run.

    python python/bench/bench_guard.py [--pages 64] [--repeat 7]

The pool: DeepSeek-V3.2-Exp with bf16 index-K (`kvlayout.describe`), 61 layers, 64-token pages;
one page of one layer is 64 x (656 + 256) = 58,368 B. Baselines, timed in the same process:
a one-page copy of those bytes (numpy.copyto between two preallocated pinned-size buffers, the
CPU stand-in for the cudaMemcpy it guards) and a copy of all the pages checked. Each figure is
the best of `--repeat` timeit runs, per call. Needs numpy; torch is timed when installed.
"""

from __future__ import annotations

import argparse
import os
import platform
import timeit

import numpy as np

import kvlayout


def best_ns(stmt, number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    n = args.pages

    device = kvlayout.describe("deepseek-v3.2-exp", index_k="bf16", pages=4096)
    host = kvlayout.Geometry.from_json(device.to_json().replace('"pages": 4096', '"pages": 16384'))
    guard = kvlayout.TransferGuard(device, host)
    page_bytes = sum(b["page_stride_bytes"] for b in device.buffers)  # one page, one layer
    rng = np.random.default_rng(0)
    src_np = rng.choice(16384, size=n, replace=False).astype(np.int64)
    dst_np = rng.choice(4096, size=n, replace=False).astype(np.int64)
    src_list, dst_list = src_np.tolist(), dst_np.tolist()
    one_src, one_dst = src_np[:1].copy(), dst_np[:1].copy()

    a = np.ones(page_bytes * n, np.uint8)
    b = np.zeros(page_bytes * n, np.uint8)
    a1, b1 = a[:page_bytes], b[:page_bytes]

    rows = []
    rows.append(("memcpy 1 page (numpy.copyto)", best_ns(lambda: np.copyto(b1, a1), 2000, args.repeat), page_bytes))
    rows.append((f"memcpy {n} pages (numpy.copyto)", best_ns(lambda: np.copyto(b, a), 200, args.repeat), page_bytes * n))
    rows.append(("check_pages 1 page, numpy int64", best_ns(lambda: guard.check_pages("load", 0, one_src, one_dst), 20000, args.repeat), None))
    rows.append((f"check_pages {n} pages, numpy int64", best_ns(lambda: guard.check_pages("load", 0, src_np, dst_np), 20000, args.repeat), None))
    rows.append((f"check_pages {n} pages, list", best_ns(lambda: guard.check_pages("load", 0, src_list, dst_list), 20000, args.repeat), None))
    try:
        import torch  # noqa: PLC0415

        ts, td = torch.from_numpy(src_np), torch.from_numpy(dst_np)
        rows.append((f"check_pages {n} pages, torch CPU (DLPack)", best_ns(lambda: guard.check_pages("load", 0, ts, td), 20000, args.repeat), None))
    except ImportError:
        rows.append((f"check_pages {n} pages, torch CPU (DLPack)", None, "torch not installed"))

    one_page_ns = rows[0][1]
    print(f"# kvlayout {kvlayout.__version__}; "
          f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"# page = 64 tokens x (656 + 256) B = {page_bytes} B (one layer)")
    print(f"{'what':<44} {'ns/call':>10} {'x one-page copy':>16}")
    for what, ns, extra in rows:
        if ns is None:
            print(f"{what:<44} {'-':>10} {'-':>16}  ({extra})")
            continue
        print(f"{what:<44} {ns:>10.0f} {ns / one_page_ns:>16.3f}")


if __name__ == "__main__":
    main()
