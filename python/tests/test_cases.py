"""The shared geometry cases (cli/tests/shared-cases/NN-*/{a,b,expect}.json: public bug reports
turned into geometry pairs) through the Python API: the exit code `kvlayout check` must give maps
to None (0), Incompatible (1) or InvalidGeometry (2), and the strings it must mention appear in
what the Python error carries."""

from __future__ import annotations

import json

import pytest

import kvlayout
from conftest import ROOT

CASES = sorted(p for p in (ROOT / "cli" / "tests" / "shared-cases").iterdir() if p.is_dir())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_shared_case(case):
    expect = json.loads((case / "expect.json").read_text())
    args = expect.get("args", [])
    level = args[args.index("--level") + 1] if "--level" in args else "pool"
    try:
        a = kvlayout.Geometry.from_file(case / "a.json")
        b = kvlayout.Geometry.from_file(case / "b.json")
        kvlayout.check(a, b, level=level)
        code, text = 0, "compatible"
    except kvlayout.Incompatible as e:
        code, text = 1, str(e)
        if "max_lines" in expect:
            assert len(e.lines) + 1 <= expect["max_lines"], e.lines
    except kvlayout.InvalidGeometry as e:
        code, text = 2, str(e)
    assert code == expect["exit"], text
    for m in expect["mentions"]:
        assert m.lower() in text.lower(), (m, text)


def test_levels_differ_where_the_design_says():
    case = ROOT / "cli" / "tests" / "shared-cases" / "19-storage-cross-layer-vs-per-layer"
    a = kvlayout.Geometry.from_file(case / "a.json")
    b = kvlayout.Geometry.from_file(case / "b.json")
    assert kvlayout.compare(a, b, level="pool") == []
    assert kvlayout.compare(a, b, level="storage") != []
    assert a.fingerprint == b.fingerprint
    assert a.storage_fingerprint != b.storage_fingerprint
