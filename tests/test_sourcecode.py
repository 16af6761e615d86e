"""The source itself: type-checked, and the compiled core never imports the API."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_mypy_is_clean_on_fastload():
    pytest.importorskip("mypy", reason="mypy comes with the test extra")
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


IMPORTS_FASTLOAD = re.compile(r"^\s*(from|c?import)\s+fastload(\s|\.|$)", re.MULTILINE)


def test_fastload_c_never_imports_fastload():
    sources = list((ROOT / "fastload_c").glob("*.p*"))
    assert len(sources) >= 5
    offenders = [p.name for p in sources if IMPORTS_FASTLOAD.search(p.read_text())]
    assert offenders == []
    assert IMPORTS_FASTLOAD.search("from fastload.loader import DataLoader")
    assert not IMPORTS_FASTLOAD.search("from fastload_c import shm")
