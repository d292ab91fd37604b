"""Unit-test session settings.

``CNI_DRA_STATE_VERIFY=1``: after every commit the state store re-reads its files from
scratch and fails when they differ from the state in memory (a change the journal missed).

Tests write only under temporary directories: the session fails at its end when the
source tree holds a file or directory it did not hold before (ignored by git or not),
other than the caches of the tools that run the tests.
"""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["CNI_DRA_STATE_VERIFY"] = "1"

REPO = Path(__file__).resolve().parents[1]
# What the test runners themselves keep in the tree (not written by a test).
RUNNER_CACHES = (
    "__pycache__/",
    ".pytest_cache/",
    ".hypothesis/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".import_linter_cache/",
)


def tree_extras() -> set[str] | None:
    """Paths in the work tree that git does not track (untracked or ignored), runner caches
    left out; None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--ignored", "--untracked-files=normal"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    paths = {line[3:] for line in out.splitlines() if line[:2] in ("??", "!!")}
    return {
        p for p in paths if not any(p == c or p.endswith("/" + c) or p.startswith(c) for c in RUNNER_CACHES)
    }


@pytest.fixture(scope="session", autouse=True)
def _source_tree_stays_clean() -> Iterator[None]:
    before = tree_extras()
    yield
    after = tree_extras()
    if before is not None and after is not None:
        assert sorted(after - before) == [], "tests wrote into the source tree (write under tmp_path instead)"


@pytest.fixture(autouse=True)
def _no_pod_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """``state repair`` scans ``/var/run/netns`` (untracked links, leaked ifb devices): unit
    tests see none, whatever namespaces the machine has (netns_tests/ run the real scan)."""
    from cni_dra.attach import rebuild as repair

    monkeypatch.setattr(repair, "_pod_netns_paths", lambda host: [])  # the kernel host of `state repair`
