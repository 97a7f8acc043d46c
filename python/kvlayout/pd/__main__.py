"""`python -m kvlayout.pd selftest --engine nixl|mooncake` (and the `worker` / `bench` roles)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys

# The highest TCP port; each selftest case uses three from --base-port + 10 x its index.
_MAX_PORT = 65535


def _seconds(text: str) -> float:
    """``--timeout-s``: a positive, finite number of seconds (0 or less timed every case out)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}: must be a positive number of seconds")
    return value


def _port_error(base_port: int, cases: int) -> str | None:
    """Why ``--base-port`` cannot serve ``cases`` cases (ports ``base .. base + 10 x (cases -
    1) + 2``), or ``None``. Before, a port past 65535 reached NIXL as a ``TypeError`` in every
    case (exit 1, as if the cases had failed)."""
    last = base_port + 10 * (max(cases, 1) - 1) + 2
    if base_port < 1 or last > _MAX_PORT:
        return (f"--base-port {base_port}: the {cases} case(s) use ports {base_port}..{last}; "
                f"pass 1..{_MAX_PORT - (last - base_port)}")
    return None


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
    st.add_argument("--timeout-s", type=_seconds, default=60.0)
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
    from .selftest import CASES, env_ready
    from .selftest import main as selftest_main

    why = _port_error(opts.base_port, len(set(opts.case)) if opts.case else len(CASES))
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    why = env_ready(opts.engine)
    if why is not None:
        print(f"error: {opts.engine} engine unavailable: {why}", file=sys.stderr)
        return 2
    opts.prefill_prefix = shlex.split(opts.prefill_prefix)
    opts.decode_prefix = shlex.split(opts.decode_prefix)
    return selftest_main(opts)


if __name__ == "__main__":
    sys.exit(main())
