"""The case geometries shipped in the wheel (kvlayout/pd/cases, read by `python -m kvlayout.pd
selftest` outside the repository) are byte-equal to the repository's files, and every file the
self-test names is shipped."""

from __future__ import annotations

import pathlib

from kvlayout.pd import selftest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGED = ROOT / "python" / "kvlayout" / "pd" / "cases"


def test_packaged_cases_equal_the_repository_files():
    names = {c.prefill for c in selftest.CASES} | {c.decode for c in selftest.CASES}
    assert {selftest.DSV32, selftest.SEED_A, selftest.TP1, selftest.GDN_TP4} <= names
    shipped = {str(p.relative_to(PACKAGED)) for p in PACKAGED.rglob("*.json")}
    assert shipped == names
    for rel in names:
        assert (PACKAGED / rel).read_bytes() == (ROOT / rel).read_bytes(), rel


def test_an_explicit_start_outside_the_repository_finds_nothing(tmp_path):
    """--repo names a folder: no fallback to the packaged cases then."""
    assert selftest.find_repo(tmp_path) is None
    assert (selftest.PACKAGED_CASES / selftest.DSV32).is_file()
