"""ARCHITECTURE.md matches the tree: every module it names exists, every
module of the package is named, every NOTE it lists is defined where it says."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAP = (ROOT / "ARCHITECTURE.md").read_text()


def named_modules():
    return set(re.findall(r"`((?:fastload|fastload_c)?/?[\w/]*?\w+\.(?:py|pyx))`", MAP))


def test_every_module_of_the_package_is_named():
    sources = [p for p in (ROOT / "fastload").glob("*.py")] + list(
        (ROOT / "fastload_c").glob("*.pyx")) + list((ROOT / "fastload_c").glob("*.py"))
    missing = [str(p.relative_to(ROOT)) for p in sources if f"`{p.name}`" not in MAP]
    assert not missing, f"not in ARCHITECTURE.md: {missing}"


def test_every_named_module_exists():
    for name in named_modules():
        if "/" in name:
            assert (ROOT / name).exists(), name
        else:
            assert any(ROOT.glob(f"fastload*/{name}")), name


def test_every_listed_note_is_defined_where_it_says():
    rows = re.findall(r"^\| ([A-Z][^|]+?) \| `([^`]+)` \|$", MAP, re.MULTILINE)
    assert len(rows) >= 10
    for notes, path in rows:
        text = (ROOT / path).read_text()
        for note in notes.split(", "):
            assert re.search(rf"NOTE \[ {re.escape(note)} \]\n", text), (note, path)
