#!/usr/bin/env python3
"""Power and SM clock per phase of a `gpu_bench --hold` run, from an `nvidia-smi` log.

Usage: smi_phases.py SMI.csv BENCH_LOG [--trim-start S] [--trim-end S] [--gpu N]

SMI.csv: `nvidia-smi -i 0 --query-gpu=timestamp,power.draw,clocks.sm,... --format=csv -lms 50`
on the machine whose clock is in UTC (the bench prints its phases in UTC). The columns are
found by the header's names (`timestamp`, `power.draw`, `clocks.current.sm` or `clocks.sm`);
with an `index` column only GPU `--gpu` is read, without one the log must be of one GPU
(`-i 0`). BENCH_LOG: the bench's output; each `HOLD shape | path | HH:MM:SS.mmm-HH:MM:SS.mmm
UTC | ...` line names a phase's wall-clock interval (times of day; a phase that crosses midnight
ends on the next day; each phase is placed on the log's day where it holds the most samples).
Samples within the interval, less `--trim-start` seconds at its start and `--trim-end` at its
end (the first builds printed the end after the streams drained, up to about 0.5 s later), are
summarised: count, median power (W), mean and median SM clock (MHz). Bad input (no samples, no
phases, a malformed HOLD line, a missing column) is an error naming what is wrong.
"""
import argparse
import datetime
import statistics
import sys

DAY_S = 86400.0


class InputError(Exception):
    pass


def seconds_of_day(hms: str) -> float:
    """`HH:MM:SS[.fff]` as seconds since midnight; an error for anything else."""
    parts = hms.strip().split(":")
    if len(parts) != 3:
        raise InputError(f"time {hms!r}: expected HH:MM:SS.mmm")
    try:
        h, m, s = int(parts[0]), int(parts[1]), float(parts[2])
    except ValueError:
        raise InputError(f"time {hms!r}: expected HH:MM:SS.mmm") from None
    if not (0 <= h < 24 and 0 <= m < 60 and 0 <= s < 60):
        raise InputError(f"time {hms!r}: out of range")
    return h * 3600 + m * 60 + s


def samples(lines, gpu=0):
    """(seconds since 0001-01-01, W, SM MHz) of each readable row of an nvidia-smi CSV."""
    lines = iter(lines)
    header = next(lines, None)
    if header is None:
        raise InputError("nvidia-smi log: empty (no header)")
    names = [c.strip().split(" [")[0] for c in header.split(",")]

    def column(*wanted):
        for w in wanted:
            if w in names:
                return names.index(w)
        raise InputError(f"nvidia-smi log: no column {' or '.join(wanted)} in {names}")

    at_t, at_w = column("timestamp"), column("power.draw")
    at_mhz = column("clocks.current.sm", "clocks.sm")
    at_gpu = names.index("index") if "index" in names else None
    out = []
    for line in lines:
        cols = [c.strip() for c in line.split(",")]
        try:
            if at_gpu is not None and int(cols[at_gpu]) != gpu:
                continue
            when = datetime.datetime.strptime(cols[at_t], "%Y/%m/%d %H:%M:%S.%f")
            watts = float(cols[at_w].split()[0])
            sm_mhz = float(cols[at_mhz].split()[0])
        except (IndexError, ValueError):
            continue  # a row nvidia-smi could not fill ([N/A]) or cut short
        day_s = when.toordinal() * DAY_S
        out.append((day_s + seconds_of_day(when.strftime("%H:%M:%S.%f")), watts, sm_mhz))
    return out


def phases(lines):
    """(shape, path, start, end) of each `HOLD` line, in seconds of the day (end past
    `DAY_S` when the phase crosses midnight)."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.lstrip().startswith("HOLD "):
            continue
        cols = [c.strip() for c in line.strip().split("|")]
        if len(cols) < 3:
            raise InputError(f"bench log line {n}: a HOLD line needs 'shape | path | interval'")
        interval = cols[2].replace("UTC", "").strip().split("-")
        if len(interval) != 2:
            raise InputError(f"bench log line {n}: interval {cols[2]!r}: expected START-END")
        start, end = (seconds_of_day(t) for t in interval)
        if end < start:
            end += DAY_S
        out.append((cols[0][len("HOLD ") :], cols[1], start, end))
    return out


def summarise(rows, phase_list, trim_start, trim_end):
    """Per phase: (shape, path, samples, median W, mean SM MHz, median SM MHz), or the
    statistics as None where no sample falls inside the trimmed interval."""
    days = sorted({int(r[0] // DAY_S) for r in rows})
    out = []
    for shape, path, start, end in phase_list:
        best = []
        for day in days:
            lo = day * DAY_S + start + trim_start
            hi = day * DAY_S + end - trim_end
            sel = [r for r in rows if lo <= r[0] <= hi]
            if len(sel) > len(best):
                best = sel
        if not best:
            out.append((shape, path, 0, None, None, None))
            continue
        out.append(
            (
                shape,
                path,
                len(best),
                statistics.median(r[1] for r in best),
                statistics.mean(r[2] for r in best),
                statistics.median(r[2] for r in best),
            )
        )
    return out


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (and BENCHMARKS.md, Session 7) for the formats.",
    )
    ap.add_argument("smi", help="nvidia-smi CSV (timestamp, power.draw, clocks.sm columns)")
    ap.add_argument("log", help="gpu_bench --hold output (its HOLD lines)")
    ap.add_argument("--trim-start", type=float, default=0.25, help="seconds left out at a phase's start")
    ap.add_argument("--trim-end", type=float, default=0.6, help="seconds left out at a phase's end")
    ap.add_argument("--gpu", type=int, default=0, help="GPU index, where the CSV has an index column")
    a = ap.parse_args()
    try:
        with open(a.smi) as f:
            rows = samples(f, a.gpu)
        if not rows:
            raise InputError(f"{a.smi}: no readable samples")
        with open(a.log) as f:
            phase_list = phases(f)
        if not phase_list:
            raise InputError(f"{a.log}: no HOLD lines")
    except InputError as e:
        sys.exit(f"smi_phases: {e}")
    for shape, path, n, watts, mean_mhz, median_mhz in summarise(
        rows, phase_list, a.trim_start, a.trim_end
    ):
        if n == 0:
            print(f"{shape} | {path} | no samples in the trimmed interval")
        else:
            print(
                f"{shape} | {path} | n {n} | W median {watts:.1f} | SM MHz mean "
                f"{mean_mhz:.0f}, median {median_mhz:.0f}"
            )


if __name__ == "__main__":
    main()
