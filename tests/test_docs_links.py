"""README.md and docs/ hold no link that leads nowhere: every relative link names a file of
the tree, and every ``#anchor`` a heading of the page it points into (GitHub's rule: lower
case, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _anchors(page: Path) -> set[str]:
    found, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return found


def _broken() -> list[str]:
    broken = []
    for page in _pages():
        fence = False
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                fence = not fence
            if fence:
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(REPO)}:{n}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{where} (no such heading)")
    return broken


def test_every_relative_link_of_readme_and_docs_resolves() -> None:
    assert _broken() == []


def test_readme_stays_short() -> None:
    """README is what a new user reads first; the reference is in docs/."""
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
