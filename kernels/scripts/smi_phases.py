#!/usr/bin/env python3
"""Power and SM clock per phase of a `gpu_bench --hold` run, from an `nvidia-smi` log.

Usage: smi_phases.py SMI.csv BENCH_LOG [--trim-start S] [--trim-end S]

SMI.csv: `nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,... --format=csv -lms 50`
(timestamp first, power second, SM clock third; the machine's clock in UTC).
BENCH_LOG: the bench's output; each `HOLD shape | path | HH:MM:SS.mmm-HH:MM:SS.mmm UTC | ...`
line names a phase's wall-clock interval. Samples within the interval, less `--trim-start`
seconds at its start and `--trim-end` at its end (the first builds printed the end after the
streams drained, up to about 0.5 s later), are summarised: count, median power (W), mean and
median SM clock (MHz).
"""
import argparse
import statistics


def seconds_of_day(hms: str) -> float:
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def samples(path):
    out = []
    with open(path) as f:
        next(f)  # header
        for line in f:
            cols = [c.strip() for c in line.split(",")]
            try:
                when = seconds_of_day(cols[0].split(" ")[1])
                watts = float(cols[1].split()[0])
                sm_mhz = float(cols[2].split()[0])
            except (IndexError, ValueError):
                continue
            out.append((when, watts, sm_mhz))
    return out


def phases(lines):
    """(shape, path, start s, end s) of each `HOLD` line, in seconds of the day."""
    out = []
    for line in lines:
        if not line.startswith("HOLD "):
            continue
        cols = [c.strip() for c in line.split("|")]
        start, end = cols[2].replace(" UTC", "").split("-")
        out.append((cols[0][5:], cols[1], seconds_of_day(start), seconds_of_day(end)))
    return out


def summarise(rows, phase_list, trim_start, trim_end):
    """Per phase: (shape, path, samples, median W, mean SM MHz, median SM MHz), or the
    statistics as None where no sample falls inside the trimmed interval."""
    out = []
    for shape, path, start, end in phase_list:
        lo, hi = start + trim_start, end - trim_end
        sel = [r for r in rows if lo <= r[0] <= hi]
        if not sel:
            out.append((shape, path, 0, None, None, None))
            continue
        out.append(
            (
                shape,
                path,
                len(sel),
                statistics.median(r[1] for r in sel),
                statistics.mean(r[2] for r in sel),
                statistics.median(r[2] for r in sel),
            )
        )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("smi")
    ap.add_argument("log")
    ap.add_argument("--trim-start", type=float, default=0.25)
    ap.add_argument("--trim-end", type=float, default=0.6)
    a = ap.parse_args()
    with open(a.log) as f:
        phase_list = phases(f)
    for shape, path, n, watts, mean_mhz, median_mhz in summarise(
        samples(a.smi), phase_list, a.trim_start, a.trim_end
    ):
        if n == 0:
            print(f"{shape} | {path} | no samples")
        else:
            print(
                f"{shape} | {path} | n {n} | W median {watts:.1f} | SM MHz mean "
                f"{mean_mhz:.0f}, median {median_mhz:.0f}"
            )


if __name__ == "__main__":
    main()
