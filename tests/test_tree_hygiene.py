"""The tree speaks of the product: no tracker numbers in code, docstrings, comments or tests.

A reader of the code cannot open a tracker entry named by its number; what it refers to
belongs in the text itself (or in the commit that made the change).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("cni_dra", "tests", "netns_tests", "scripts", "bench")
SUFFIXES = {".py", ".c", ".h", ".go", ".sh", ".in", ".md", ".yaml", ".yml", ".toml", ""}
# the word, then a number: parenthesised, with "#", capitalised, plural
TRACKER_REF = re.compile(r"\b" + "issue" + r"s?\s*#?\d+", re.IGNORECASE)


def _files() -> list[Path]:
    found = [REPO / "README.md"]
    for top in SCANNED:
        for path in (REPO / top).rglob("*"):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                found.append(path)
    return found


def test_no_tracker_numbers_in_the_tree() -> None:
    hits = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if TRACKER_REF.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert hits == []
