"""The layer and library-owner contracts of .importlinter hold, and cover the whole package."""

from __future__ import annotations

import configparser
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cni_dra

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "cni_dra"


def _contract(name: str) -> configparser.SectionProxy:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / ".importlinter")
    return cfg[f"importlinter:contract:{name}"]


def _lines(value: str) -> set[str]:
    return {line.strip() for line in value.splitlines() if line.strip()}


def test_only_netlink_may_import_pyroute2_and_every_other_package_is_listed() -> None:
    contract = _contract("pyroute2-owner")
    every = {f"cni_dra.{m.name}" for m in pkgutil.iter_modules(cni_dra.__path__)}
    assert _lines(contract["source_modules"]) == every - {"cni_dra.netlink"}
    assert _lines(contract["forbidden_modules"]) == {"pyroute2"}


def test_only_netlink_speaks_rtnetlink_even_without_pyroute2() -> None:
    """A raw AF_NETLINK socket is rtnetlink too: it belongs to cni_dra.netlink."""
    outside = [
        str(path.relative_to(REPO))
        for path in PACKAGE.rglob("*.py")
        if PACKAGE / "netlink" not in path.parents and re.search(r"\bAF_NETLINK\b", path.read_text())
    ]
    assert outside == []


def test_lint_imports_keeps_every_contract() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    lint = str(exe) if exe.exists() else shutil.which("lint-imports")
    if lint is None:
        pytest.skip("import-linter is not installed")
    out = subprocess.run(
        [lint, "--no-cache", ".importlinter"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout
