"""`python -m kvlayout.pd selftest --engine nixl|mooncake` (and the `worker` / `bench` roles)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kvlayout.pd")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("selftest", help="the handshake cases across two processes; JSON lines")
    st.add_argument("--engine", choices=["nixl", "mooncake"], required=True)
    st.add_argument("--case", action="append", help="run only this case (repeatable)")
    st.add_argument("--repo", help="repository root holding the case geometry files")
    st.add_argument("--prefill-addr", default="127.0.0.1")
    st.add_argument("--decode-addr", default="127.0.0.1")
    st.add_argument(
        "--prefill-prefix",
        default="",
        help="command prefix for the prefill side, e.g. 'ip netns exec pd-a'",
    )
    st.add_argument("--decode-prefix", default="", help="command prefix for the decode side")
    st.add_argument("--base-port", type=int, default=17300)
    st.add_argument("--timeout-s", type=float, default=60.0)
    wk = sub.add_parser("worker", help="(internal) one side of a pair; config as JSON")
    wk.add_argument("config")
    bn = sub.add_parser("bench", help="pages/s through NIXL with and without the check")
    bn.add_argument("--repo")
    bn.add_argument("--pages", type=int, default=64)
    bn.add_argument("--iters", type=int, default=30)
    bn.add_argument(
        "--role", choices=["driver", "prefill"], default="driver", help=argparse.SUPPRESS
    )
    bn.add_argument("--port", type=int, default=17900)
    return ap


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    if opts.cmd == "worker":
        from .worker import main as worker_main

        worker_main(json.loads(opts.config))
        return 0
    if opts.cmd == "bench":
        from .bench import main as bench_main

        return bench_main(opts)
    from .selftest import env_ready
    from .selftest import main as selftest_main

    why = env_ready(opts.engine)
    if why is not None:
        print(f"error: {opts.engine} engine unavailable: {why}", file=sys.stderr)
        return 2
    opts.prefill_prefix = shlex.split(opts.prefill_prefix)
    opts.decode_prefix = shlex.split(opts.decode_prefix)
    return selftest_main(opts)


if __name__ == "__main__":
    sys.exit(main())
