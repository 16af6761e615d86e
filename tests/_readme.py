"""The README's code blocks, by section, for the tests that run them."""
import pathlib
import re

README_PATH = pathlib.Path(__file__).resolve().parent.parent / "README.md"
# Run by test_multinode_guide.py (under torchrun), not as plain scripts.
MULTINODE = "Multi-node training"


def sections() -> dict[str, str]:
    """Level-2 heading -> its text, for every section of the README."""
    parts = re.split(r"^## (.+)$", README_PATH.read_text(), flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(r"```" + language + r"\n(.*?)```", text, re.DOTALL)
