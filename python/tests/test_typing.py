"""mypy over the package and its stubs (scripts/python-tests.sh installs mypy into the venv)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("mypy", reason="mypy not installed: the typing check needs it")

USE = '''
import kvlayout
from kvlayout import _kvlayout
g = kvlayout.describe("llama-3.1-8b")
guard = kvlayout.TransferGuard(g, g.mirror(pages=2048))
guard.check_pages("load", None, [1], [2])
lines: list[str] = kvlayout.compare(g, g, level="token")
'''


def test_mypy_package_and_stub_usage_clean(tmp_path):
    use = tmp_path / "use.py"
    use.write_text(USE)
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "python/pyproject.toml"),
         "--no-incremental", str(ROOT / "python/kvlayout"), str(use)],
        capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_typing_only_aliases_are_not_in_the_runtime_module():
    import kvlayout._kvlayout as ext

    assert not hasattr(ext, "Level") and not hasattr(ext, "_Level")
    # the stub declares __new__, as the runtime class defines it (no __init__ of its own)
    assert "__new__" in vars(ext.TransferGuard) and "__init__" not in vars(ext.TransferGuard)
