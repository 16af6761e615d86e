"""The source itself: type-checked against stubs that match the compiled core,
notes that resolve, and a compiled core that never imports the API."""
import collections
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


@pytest.mark.timeout(120)
def test_ruff_is_clean():
    pytest.importorskip("ruff", reason="ruff comes with the test extra")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format",
                          "concise", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.timeout(300)
def test_stubs_of_the_compiled_core_match_it():
    """Every compiled module has a stub (mypy then checks each call across the
    Python/C boundary), and stubtest finds the stubs and the modules agree."""
    pytest.importorskip("mypy", reason="mypy comes with the test extra")
    compiled = sorted(p.stem for p in (ROOT / "fastload_c").glob("*.pyx"))
    assert compiled == sorted(p.stem for p in (ROOT / "fastload_c").glob("*.pyi"))
    modules = [f"fastload_c.{name}" for name in compiled]
    # Unused entries are allowed: Python 3.12 has the __buffer__ 3.11 lacks.
    out = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--ignore-unused-allowlist",
                          "--allowlist", str(ROOT / "tests" / "stubtest_allowlist.txt"), *modules],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


IMPORTS_FASTLOAD = re.compile(r"^\s*(from|c?import)\s+fastload(\s|\.|$)", re.MULTILINE)


def test_fastload_c_never_imports_fastload():
    sources = list((ROOT / "fastload_c").glob("*.p*"))
    assert len(sources) >= 5
    offenders = [p.name for p in sources if IMPORTS_FASTLOAD.search(p.read_text())]
    assert offenders == []
    assert IMPORTS_FASTLOAD.search("from fastload.loader import DataLoader")
    assert not IMPORTS_FASTLOAD.search("from fastload_c import shm")


# NOTE [ Name ] names a piece of hard reasoning: written once where it is
# defined (alone on its line), referred to from anywhere else. A name may wrap
# onto the next comment line. A short note used in one place only may be
# written inline, as `NOTE [ Name ]: why`.
NOTE = re.compile(r"NOTE\s*\[([^\]]*)\](:?)")
CONTINUATION = re.compile(r"\s*\n\s*(?:#|\*|//)?\s*")
DEFINITION = re.compile(r"^[ \t]*(?:#|\*|/\*|//|\"\"\")?[ \t]*NOTE \[ [^\]]+ \][ \t]*$", re.MULTILINE)
NOTE_SUFFIXES = {".py", ".pyx", ".pxd", ".pxi", ".c", ".h", ".md", ".toml", ".cfg"}


def _notes():
    """(name, is_definition, where) of every NOTE in the tracked sources."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    paths = [ROOT / p for p in listed.stdout.split()] if listed.returncode == 0 else [
        p for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts]
    notes = []
    for path in paths:
        if path.suffix not in NOTE_SUFFIXES or path == pathlib.Path(__file__) or not path.is_file():
            continue
        text = path.read_text()
        definitions = {m.start() for m in DEFINITION.finditer(text)}
        for m in NOTE.finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            raw = "[" + CONTINUATION.sub(" ", m.group(1)) + "]"
            notes.append((raw, line_start in definitions, m.group(2) == ":",
                          f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"))
    return notes


def test_every_note_is_spelled_one_way_and_defined_once():
    notes = _notes()
    assert len(notes) > 20
    misspelled = [(raw, where) for raw, _, _, where in notes
                  if not re.fullmatch(r"\[ \S(.*\S)? \]", raw)]
    assert misspelled == [], "spell NOTE names as NOTE [ Name ], one space inside the brackets"
    # Case aside: a reference may begin a sentence.
    uses = collections.Counter(raw.casefold() for raw, _, _, _ in notes)
    defined: dict[str, list[str]] = {}
    for raw, alone, inline, where in notes:
        if alone or (inline and uses[raw.casefold()] == 1):
            defined.setdefault(raw.casefold(), []).append(where)
    assert {name: where for name, where in defined.items() if len(where) > 1} == {}
    dangling = [(raw, where) for raw, _, _, where in notes if raw.casefold() not in defined]
    assert dangling == []
    assert "[ ring waiting ]" in defined and not DEFINITION.search("see NOTE [ Ring waiting ].")
