"""`python -m kvlayout.pd selftest --engine nixl|mooncake`: the handshake on a real engine, two
processes, one JSON line per case; exit 0 iff every verdict is the expected one (moved cases
verified byte for byte with no stray byte, refused cases with zero bytes moved and the receiving
pool untouched).

The cases' geometries are the repository's files (the public bug reports turned into geometry
pairs); `pages` is set to the small pool each side allocates here (`pages` is never compared).

Content checks (issue 23): the sender's page checksums travel with its notification and the
receiver verifies the pages it wrote before any is used. The cases whose names end in
`-no-geometry-check` switch the receiver's geometry check off (the case option
`geometry_check=False`: the receiver ignores the peer's geometry and assumes the peer mirrors its
own, as an engine without kvlayout does), so only the content check stands between a fault and
the model: the seed bug (the receiver's index-K buffer sized by the fp8 formula, 132 B/token, while
the sender's data is bf16, 256 B/token: 132 of 256 bytes per token move), a stale slot and a torn
copy are each refused by content, naming the pages.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DSV32 = "configs/geometry/host-index-k-fp8-formula.json"  # DeepSeek-V3.2 pool, fp8 index-K
SEED_A = "cli/tests/shared-cases/00-dsa-index-k-bf16-vs-fp8-host/a.json"
SEED_B = "cli/tests/shared-cases/00-dsa-index-k-bf16-vs-fp8-host/b.json"
TP1 = "cli/tests/shared-cases/22-hetero-tp-1-to-2-token-level/a.json"
TP2_R0 = "cli/tests/shared-cases/22-hetero-tp-1-to-2-token-level/b.json"
# Qwen3.5 full attention, 2 KV heads: prefill TP 2 rank 1, decode TP 4 rank 2 (replicas 2).
QWEN35_TP2 = "cli/tests/shared-cases/29-compatible-replicated-heads-tp2-to-tp4-token-level/a.json"
QWEN35_TP4 = "cli/tests/shared-cases/29-compatible-replicated-heads-tp2-to-tp4-token-level/b.json"
# Qwen3.5 GDN conv state, split_groups q|k|v = 2048|2048|4096: TP 2 rank 0, TP 4 rank 0.
GDN_TP2 = "cli/tests/shared-cases/30-compatible-gdn-conv-split-groups-tp2-vs-tp4-token-level/a.json"
GDN_TP4 = "cli/tests/shared-cases/30-compatible-gdn-conv-split-groups-tp2-vs-tp4-token-level/b.json"


def _set(path: tuple, value):
    def edit(g: dict) -> None:
        obj = g
        for key in path[:-1]:
            obj = next(b for b in obj if b["name"] == key) if isinstance(obj, list) else obj[key]
        obj[path[-1]] = value

    return edit


def _rank(buffer: str, rank: int):
    return _set(("buffers", buffer, "shard", "rank"), rank)


def _drop_buffer(name: str):
    def edit(g: dict) -> None:
        g["buffers"] = [b for b in g["buffers"] if b["name"] != name]

    return edit


# Pages each side allocates, and the pages moved (source -> destination; not the identity).
POOL_PAGES = 8
SRC_PAGES = [1, 2, 3, 6]
DST_PAGES = [0, 5, 6, 7]


@dataclass
class Case:
    name: str
    prefill: str  # repo-relative geometry file
    decode: str
    expect: str  # "moved" | "refused"
    note: str
    prefill_edits: list = field(default_factory=list)
    decode_edits: list = field(default_factory=list)
    publish_geometry: bool = True
    require: bool = False
    src_pages: list = field(default_factory=lambda: list(SRC_PAGES))
    dst_pages: list = field(default_factory=lambda: list(DST_PAGES))
    fault: str | None = None  # a content-only fault the decode side injects after the move
    # False: the decode side skips the geometry check (and assumes the peer mirrors it), so
    # only the content check can refuse.
    geometry_check: bool = True
    # Page payloads a content-refused case mismatches (its `checksum_mismatches`).
    mismatches: int = 1


CASES = [
    Case(
        "compatible",
        DSV32,
        DSV32,
        "moved",
        "DeepSeek-V3.2 pool both sides; prefill page_first, decode layer_first (pool level "
        "ignores memory layout; each side's offsets come from its own geometry)",
        prefill_edits=[_set(("memory_layout",), "page_first")],
        decode_edits=[_set(("memory_layout",), "layer_first")],
    ),
    Case(
        "seed-index-k-bf16-vs-fp8-host",
        SEED_A,
        SEED_B,
        "refused",
        "device bf16 index-K (256 B/token) vs fp8 formula (132 B/token)",
    ),
    Case(
        "same-length-other-arrangement",
        DSV32,
        DSV32,
        "refused",
        "fp8 index-K token_major vs section_major: both 64 x 132 = 8,448 B/page",
        prefill_edits=[_set(("buffers", "index_k", "arrangement"), "token_major")],
    ),
    Case(
        "hetero-tp-1-to-2",
        TP1,
        TP2_R0,
        "moved",
        "prefill TP1 -> decode TP2 rank 0: mla whole, fa heads 0-3 of 8 (token level)",
    ),
    Case(
        "hetero-tp-1-to-2-rank-1",
        TP1,
        TP2_R0,
        "moved",
        "the same pair, decode rank 1: fa heads 4-7 of 8",
        decode_edits=[
            _set(("buffers", "fa", "shard", "rank"), 1),
            _set(("buffers", "mla", "shard", "rank"), 1),
        ],
    ),
    Case(
        "no-geometry-require",
        DSV32,
        DSV32,
        "refused",
        "prefill publishes no geometry; decode asks require=True",
        publish_geometry=False,
        require=True,
    ),
    Case(
        "no-geometry-warn",
        DSV32,
        DSV32,
        "moved",
        "prefill publishes no geometry; decode warns (UncheckedPeerWarning) and moves unchecked",
        publish_geometry=False,
    ),
    Case(
        "page-ratio-32-to-64",
        DSV32,
        DSV32,
        "moved",
        "DeepSeek-V3.2 MLA buffer only, prefill 32-token pages, decode 64: four source pages "
        "glued into two destination pages (token level)",
        prefill_edits=[_drop_buffer("index_k"), _set(("page_size_tokens",), 32)],
        decode_edits=[_drop_buffer("index_k")],
        dst_pages=[3, 4],
    ),
    Case(
        "page-ratio-section-major-index-k",
        DSV32,
        DSV32,
        "refused",
        "the whole DeepSeek-V3.2 pool at 32 vs 64 tokens: a section_major index-K page cannot "
        "be cut or glued",
        prefill_edits=[_set(("page_size_tokens",), 32)],
        dst_pages=[3, 4],
    ),
    Case(
        "replicated-heads-tp-2-to-4",
        QWEN35_TP2,
        QWEN35_TP4,
        "moved",
        "Qwen3.5 (2 KV heads) prefill TP 2 rank 1 -> decode TP 4 rank 2: 2 replicas per head, "
        "rank 2 holds head 2 // 2 = 1 = the prefill rank's head (token level)",
    ),
    Case(
        "replicated-heads-tp-2-to-4-rank-1",
        QWEN35_TP2,
        QWEN35_TP4,
        "moved",
        "the same pair, decode rank 1 (head 1 // 2 = 0) from prefill rank 0",
        prefill_edits=[_rank("full_attn", 0)],
        decode_edits=[_rank("full_attn", 1)],
    ),
    Case(
        "replicated-heads-rank-mod-heads",
        QWEN35_TP2,
        QWEN35_TP4,
        "refused",
        "decode TP 4 rank 2 paired with prefill rank 2 % 2 = 0 (SGLang #23746's map): head 0 "
        "into a rank that holds head 1, refused at the token level naming both heads",
        prefill_edits=[_rank("full_attn", 0)],
    ),
    Case(
        "gdn-conv-split-groups-tp-2-to-4",
        GDN_TP2,
        GDN_TP4,
        "moved",
        "Qwen3.5 GDN conv state (one slot per request) prefill TP 2 rank 0 -> decode TP 4 "
        "rank 1: q[512,1024) k[512,1024) v[1024,2048), three slices of the prefill slot "
        "(rows 512, 1,536, 3,072), never its rows [2048, 4096) as one block",
        decode_edits=[_rank("conv", 1)],
    ),
    Case(
        "gdn-conv-split-groups-tp-2-to-4-rank-3",
        GDN_TP2,
        GDN_TP4,
        "moved",
        "the same pair, prefill rank 1 -> decode rank 3: q[1536,2048) k[1536,2048) v[3072,4096)",
        prefill_edits=[_rank("conv", 1)],
        decode_edits=[_rank("conv", 3)],
    ),
    Case(
        "stale-destination",
        DSV32,
        DSV32,
        "refused",
        "compatible pools; the first destination page of kv layer 0 keeps its old bytes (they "
        "never arrived): the sender's checksums, sent with its notification, refuse that page",
        fault="stale-destination",
    ),
    Case(
        "corrupted-in-flight",
        DSV32,
        DSV32,
        "refused",
        "compatible pools; one byte of the last destination page of kv layer 0 flipped after "
        "the move: refused by content, naming the page",
        fault="corrupted-in-flight",
    ),
    Case(
        "seed-index-k-fp8-sized-receiver-no-geometry-check",
        SEED_A,
        SEED_B,
        "refused",
        "the seed bug with the geometry check off: the sender holds bf16 index-K (256 B/token), "
        "the receiver's index-K buffer is sized by the fp8 formula (132 B/token) and assumes the "
        "peer mirrors it, so 132 of each token's 256 bytes move (64 x 132 = 8,448 of 16,384 B "
        "per page); every index_k page payload (4 pages x 61 layers) is refused by content, kv "
        "(laid alike) verifies",
        decode_edits=[_set(("memory_layout",), "layer_first")],
        geometry_check=False,
        mismatches=4 * 61,
    ),
    Case(
        "stale-slot-no-geometry-check",
        DSV32,
        DSV32,
        "refused",
        "geometry check off; the first destination page of kv layer 0 keeps its old bytes (a "
        "reused slot whose bytes never arrived): refused by content alone, naming the page",
        fault="stale-destination",
        geometry_check=False,
    ),
    Case(
        "torn-copy-no-geometry-check",
        DSV32,
        DSV32,
        "refused",
        "geometry check off; the copy into the last destination page of kv layer 0 stopped half "
        "way (its second half keeps its old bytes): refused by content alone, naming the page",
        fault="torn-copy",
        geometry_check=False,
    ),
]


# The case files shipped in the wheel (package data), at their repository paths; a test keeps
# them byte-equal to the repository's (python/tests/test_package_data.py).
PACKAGED_CASES = Path(__file__).resolve().parent / "cases"


def find_repo(start: Path | None = None) -> Path | None:
    for base in [start] if start else [Path.cwd(), Path(__file__).resolve()]:
        for d in [base, *base.parents]:
            if (d / DSV32).is_file():
                return d
    if start is None and (PACKAGED_CASES / DSV32).is_file():
        return PACKAGED_CASES  # an installed wheel, outside the repository
    return None


def load_geometry(repo: Path, rel: str, edits: list) -> str:
    g = json.loads((repo / rel).read_text())
    g["pages"] = POOL_PAGES
    for edit in edits:
        edit(g)
    return json.dumps(g)


def _read_line(proc: subprocess.Popen, timeout_s: float) -> dict | None:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None  # started with stdout=PIPE
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if not line:
                return None
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue  # an engine's stray stdout line
        if proc.poll() is not None:
            return None
    return None


def _spawn(prefix: list[str], cfg: dict, log: Path, stdin=None) -> subprocess.Popen:
    cmd = [*prefix, sys.executable, "-m", "kvlayout.pd", "worker", json.dumps(cfg)]
    return subprocess.Popen(
        cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=log.open("wb"), text=True
    )


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_case(case: Case, engine: str, repo: Path, opts, index: int, logdir: Path) -> dict:
    base_port = opts.base_port + 10 * index
    common = {
        "engine": engine,
        "case": case.name,
        "seed": 1000 + index,
        "src_pages": case.src_pages,
        "dst_pages": case.dst_pages,
        "timeout_s": opts.timeout_s,
        "metadata_url": f"http://{opts.prefill_addr}:{base_port + 2}/metadata",
    }
    p_cfg = {
        **common,
        "role": "prefill",
        "addr": opts.prefill_addr,
        "port": base_port,
        "peer_addr": opts.decode_addr,
        "peer_port": base_port + 1,
        "geometry": load_geometry(repo, case.prefill, case.prefill_edits),
        "publish_geometry": case.publish_geometry,
    }
    d_cfg = {
        **common,
        "role": "decode",
        "addr": opts.decode_addr,
        "port": base_port + 1,
        "peer_addr": opts.prefill_addr,
        "peer_port": base_port,
        "geometry": load_geometry(repo, case.decode, case.decode_edits),
        "require": case.require,
        "fault": case.fault,
        "geometry_check": case.geometry_check,
    }
    server = prefill = decode = None
    try:
        if engine == "mooncake":
            server = subprocess.Popen(
                [
                    *opts.prefill_prefix,
                    sys.executable,
                    "-m",
                    "mooncake.http_metadata_server",
                    "--host",
                    opts.prefill_addr,
                    "--port",
                    str(base_port + 2),
                    "--log-level",
                    "WARNING",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(logdir / f"{case.name}.metadata.log").open("wb"),
            )
        decode = _spawn(opts.decode_prefix, d_cfg, logdir / f"{case.name}.decode.log")
        prefill = _spawn(
            opts.prefill_prefix, p_cfg, logdir / f"{case.name}.prefill.log", stdin=subprocess.PIPE
        )
        result = _read_line(decode, opts.timeout_s + 30)
        if result is None:
            result = {
                "case": case.name,
                "engine": engine,
                "verdict": "error",
                "bytes_moved": 0,
                "bytes_verified_equal": 0,
                "lines": [f"decode side gave no result (logs in {logdir})"],
            }
    finally:
        if prefill is not None and prefill.stdin is not None:
            try:
                prefill.stdin.write("exit\n")
                prefill.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
        _stop(prefill)
        _stop(decode)
        if server is not None:
            server.terminate()
            _stop(server)
    return result


def judge(case: Case, result: dict) -> bool:
    if result.get("verdict") != case.expect:
        return False
    if case.fault or not case.geometry_check:
        # Refused by content: bytes moved, the expected page payloads mismatched, each named.
        return (
            result.get("level") == "checksum"
            and result.get("bytes_moved", 0) > 0
            and result.get("checksum_mismatches") == case.mismatches
            and len(result["lines"]) == case.mismatches
            and all("destination page" in line for line in result["lines"])
        )
    if case.expect == "moved":
        return (
            result["bytes_moved"] > 0
            and result["bytes_verified_equal"] == result["bytes_moved"]
            and result.get("stray_bytes") == 0
        )
    return result["bytes_moved"] == 0 and result.get("stray_bytes") == 0 and bool(result["lines"])


def main(opts) -> int:
    repo = find_repo(Path(opts.repo) if opts.repo else None)
    if repo is None:
        print(f"error: repository files not found ({DSV32}); pass --repo", file=sys.stderr)
        return 2
    unknown = sorted(set(opts.case or ()) - {c.name for c in CASES})
    if unknown:
        # A run that tests nothing (or less than asked) is not a pass.
        print(
            f"error: --case {', '.join(unknown)}: no such case "
            f"(cases: {', '.join(c.name for c in CASES)})",
            file=sys.stderr,
        )
        return 2
    selected = [c for c in CASES if not opts.case or c.name in opts.case]
    logdir = Path(tempfile.mkdtemp(prefix=f"kvlayout-pd-{opts.engine}-"))
    ok_all = True
    for i, case in enumerate(selected):
        missing = [p for p in (case.prefill, case.decode) if not (repo / p).is_file()]
        if missing:
            result = {
                "case": case.name,
                "engine": opts.engine,
                "verdict": "error",
                "bytes_moved": 0,
                "bytes_verified_equal": 0,
                "lines": [f"missing geometry file {m}" for m in missing],
            }
        else:
            result = run_case(case, opts.engine, repo, opts, i, logdir)
        result["expected"] = case.expect
        result["ok"] = judge(case, result)
        ok_all &= result["ok"]
        print(json.dumps(result), flush=True)
    if not ok_all:
        print(
            f"selftest: some verdicts differ from the expected ones; worker logs in {logdir}",
            file=sys.stderr,
        )
    return 0 if ok_all else 1


def env_ready(engine: str) -> str | None:
    """None when the engine's wheel imports; else why not (for skips and the CLI)."""
    mod = "nixl_cu12" if engine == "nixl" else "mooncake.engine"
    try:
        __import__(mod)
    except (ImportError, OSError) as e:  # OSError: a missing libibverbs1
        return f"{mod} not importable: {type(e).__name__}: {e}"
    return None


__all__ = ["CASES", "Case", "env_ready", "find_repo", "load_geometry", "main"]
