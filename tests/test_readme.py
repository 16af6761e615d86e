"""Every code block of the README runs: the Python ones as they are, the shell
ones by checking that what they name exists (running `pip install` or the
whole CI from inside the suite would recurse). The multi-node section's
blocks are run under torchrun by test_multinode_guide.py."""
import pathlib
import re
import subprocess
import sys

import pytest

tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11's tomllib")

from _readme import MULTINODE, code_blocks, sections  # noqa: E402  (after the skip)

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUN_HERE = "".join(text for title, text in sections().items() if title != MULTINODE)
PYTHON = code_blocks(RUN_HERE, "python")
SHELL = code_blocks(RUN_HERE, "bash")


def test_readme_has_its_blocks():
    assert len(PYTHON) >= 3 and len(SHELL) >= 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("number", range(len(PYTHON)))
def test_python_block_runs(number, tmp_path):
    script = tmp_path / f"readme_block_{number}.py"
    script.write_text(PYTHON[number])
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=110)
    assert out.returncode == 0, out.stdout + out.stderr


def test_shell_blocks_name_real_things():
    shell = "\n".join(SHELL)
    assert "bash .ci/run" in shell and (ROOT / ".ci" / "run").is_file()
    assert "python -m fastload bench" in shell
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in re.findall(r'pip install (?:-e )?"\.\[(\w+)\]"', shell):
        assert extra in extras
    # The CI script runs the test command the README describes.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "torch==2.13.0" in ci and '".[test]"' in ci and "pytest" in ci


def test_api_reference_names_every_public_name():
    import fastload

    reference = sections()["API reference"]
    missing = [name for name in fastload.__all__ if f"`{name}" not in reference]
    assert missing == []
