#!/usr/bin/env python3
"""Tests of smi_phases.py on hand-made nvidia-smi and bench logs (stdlib only)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smi_phases  # noqa: E402

HEADER = "timestamp, power.draw [W], clocks.current.sm [MHz]\n"


def raises(f, *args):
    try:
        f(*args)
    except smi_phases.InputError:
        return True
    return False


def main():
    checks = 0
    # Samples every 0.5 s from 10:00:00.0 to 10:00:10.0: power 600 + i W, SM clock 1500 MHz
    # up to 10:00:05.0 and 1400 MHz after it; one line nvidia-smi could not fill (skipped).
    lines = [HEADER]
    for i in range(21):
        t = i * 0.5
        mhz = 1500 if t <= 5.0 else 1400
        lines.append(f"2026/12/01 10:00:{t:06.3f}, {600 + i:.2f} W, {mhz} MHz\n")
    lines.insert(3, "2026/12/01 10:00:01.000, [N/A], [N/A]\n")
    rows = smi_phases.samples(lines)
    assert len(rows) == 21, len(rows)
    day_s = 739951 * smi_phases.DAY_S  # 2026-12-01: datetime.date(2026, 12, 1).toordinal()
    assert rows[0] == (day_s + 36000.0, 600.0, 1500.0), rows[0]
    checks += 1

    log = [
        "device: H200\n",
        "HOLD backup 1024 | GEMM only | 10:00:00.000-10:00:04.000 UTC | no transfer | x\n",
        "HOLD backup 1024 | memcpy | 10:00:06.000-10:00:10.000 UTC | 1 x 3.1 MB | x\n",
    ]
    phase_list = smi_phases.phases(log)
    assert phase_list == [
        ("backup 1024", "GEMM only", 36000.0, 36004.0),
        ("backup 1024", "memcpy", 36006.0, 36010.0),
    ], phase_list
    checks += 1

    # Trimmed 0.25 s at the start and 0.6 s at the end: the first phase keeps 00.5 .. 03.0
    # (samples 1..6: 601..606 W, median 603.5; 1500 MHz), the second 06.5 .. 09.0 (samples
    # 13..18: 613..618 W, median 615.5; 1400 MHz).
    got = smi_phases.summarise(rows, phase_list, 0.25, 0.6)
    assert got[0] == ("backup 1024", "GEMM only", 6, 603.5, 1500, 1500), got[0]
    assert got[1] == ("backup 1024", "memcpy", 6, 615.5, 1400, 1400), got[1]
    # A phase shorter than its trims has no samples.
    short = [("s", "p", 36000.0, 36000.5)]
    assert smi_phases.summarise(rows, short, 0.25, 0.6) == [("s", "p", 0, None, None, None)]
    checks += 1

    # Across midnight: 23:59:58 .. 00:00:04 holds the samples of both days (one a second,
    # 23:59:58 to 00:00:04 of the next day: 7 samples, 100..106 W).
    night = [HEADER] + [
        f"2026/12/0{1 if s < 2 else 2} {'23:59:5' + str(8 + s) if s < 2 else '00:00:0' + str(s - 2)}.000, {100 + s} W, 1500 MHz\n"
        for s in range(7)
    ]
    night_rows = smi_phases.samples(night)
    crossing = smi_phases.phases(["HOLD s | p | 23:59:58.000-00:00:04.000 UTC | x\n"])
    assert crossing == [("s", "p", 86398.0, 86404.0)], crossing
    assert smi_phases.summarise(night_rows, crossing, 0.0, 0.0)[0][2:4] == (7, 103), night_rows
    checks += 1

    # Two days at the same time of day: the phase is placed on one day (day 2 has 3 samples of
    # 700 W, day 1 two of 100 W), never both.
    two_days = [HEADER] + [
        f"2026/12/0{d} 10:00:0{s}.000, {100 if d == 1 else 700} W, 1500 MHz\n"
        for d, n in [(1, 2), (2, 3)]
        for s in range(n)
    ]
    one = smi_phases.summarise(
        smi_phases.samples(two_days), [("s", "p", 36000.0, 36009.0)], 0.0, 0.0
    )
    assert one[0][2:4] == (3, 700), one
    checks += 1

    # Columns found by name, any order; with an index column only the asked GPU is read.
    multi = [
        "index, timestamp, clocks.current.sm [MHz], power.draw [W]\n",
        "0, 2026/12/01 10:00:00.000, 1500 MHz, 690 W\n",
        "1, 2026/12/01 10:00:00.000, 345 MHz, 80 W\n",
    ]
    assert smi_phases.samples(multi) == [(day_s + 36000.0, 690.0, 1500.0)]
    assert smi_phases.samples(multi, gpu=1) == [(day_s + 36000.0, 80.0, 345.0)]
    checks += 1

    # Bad input is an error, not a silent "no samples".
    assert raises(smi_phases.samples, [])  # empty: no header
    assert raises(smi_phases.samples, ["timestamp, clocks.sm [MHz]\n"])  # no power column
    for bad in [
        "HOLD s | p\n",  # no interval
        "HOLD s | p | 10:00:01.000 UTC | x\n",  # one time
        "HOLD s | p | 10:00:01-10:00:xx UTC | x\n",  # not a number
        "HOLD s | p | 10:00-10:00:09 UTC | x\n",  # not HH:MM:SS
        "HOLD s | p | 10:00:61-10:00:62 UTC | x\n",  # out of range
    ]:
        assert raises(smi_phases.phases, [bad]), bad
    checks += 1
    print(f"smi_phases: {checks} checks passed")


if __name__ == "__main__":
    main()
