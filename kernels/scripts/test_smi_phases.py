#!/usr/bin/env python3
"""Tests of smi_phases.py on a hand-made nvidia-smi log and bench log (stdlib only)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smi_phases  # noqa: E402


def main():
    # Samples every 0.5 s from 10:00:00.0 to 10:00:10.0: power 600 + i W, SM clock 1500 MHz
    # up to 10:00:05.0 and 1400 MHz after it; one line garbled (skipped).
    lines = ["timestamp, power.draw [W], clocks.current.sm [MHz]\n"]
    for i in range(21):
        t = i * 0.5
        mhz = 1500 if t <= 5.0 else 1400
        lines.append(f"2026/12/01 10:00:{t:06.3f}, {600 + i:.2f} W, {mhz} MHz\n")
    lines.insert(3, "2026/12/01 10:00:01.000, [N/A], [N/A]\n")
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.writelines(lines)
        csv = f.name
    rows = smi_phases.samples(csv)
    os.unlink(csv)
    assert len(rows) == 21, len(rows)
    assert rows[0] == (36000.0, 600.0, 1500.0), rows[0]

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

    # Trimmed 0.25 s at the start and 0.6 s at the end: the first phase keeps 00.5 .. 03.0
    # (samples 1..6: 601..606 W, median 603.5; 1500 MHz), the second 06.5 .. 09.0 (samples
    # 13..18: 613..618 W, median 615.5; 1400 MHz).
    got = smi_phases.summarise(rows, phase_list, 0.25, 0.6)
    assert got[0] == ("backup 1024", "GEMM only", 6, 603.5, 1500, 1500), got[0]
    assert got[1] == ("backup 1024", "memcpy", 6, 615.5, 1400, 1400), got[1]

    # A phase shorter than its trims has no samples.
    short = [("s", "p", 36000.0, 36000.5)]
    assert smi_phases.summarise(rows, short, 0.25, 0.6) == [("s", "p", 0, None, None, None)]
    print("smi_phases: 4 checks passed")


if __name__ == "__main__":
    main()
