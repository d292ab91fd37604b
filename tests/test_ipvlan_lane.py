"""The ipvlan lane cannot be green without having run: under CI, ``make ipvlan-uml`` fails
when neither this kernel nor user-mode-linux can run netns_tests/test_ipvlan.py, and that
file fails instead of skipping where the lane knows the kernel has ipvlan.

The Makefile runs from a copy in a temporary directory, beside stub ``scripts/uml-run``,
``scripts/ipvlan-probe`` and venv python that answer as each test says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _lane(tmp_path: Path, *, ci: bool, uml_works: bool) -> tuple[int, str, str]:
    """``make ipvlan-uml`` on a kernel without ipvlan (every probe says no); returns (exit
    code, output, what the stub uml-run was asked to run)."""
    shutil.copy2(REPO / "Makefile", tmp_path / "Makefile")
    log = tmp_path / "uml.log"
    _script(tmp_path / "scripts/ipvlan-probe", "echo 'ipvlan: no'; exit 1")
    _script(
        tmp_path / "scripts/uml-run",
        f'if [ "$1" = --check ]; then {"exit 0" if uml_works else "echo no user-mode-linux here; exit 125"}; fi\n'
        f'echo "required=$CNI_DRA_IPVLAN_REQUIRED env=$UML_RUN_ENV cmd=$1" >>{log}; exit 0',
    )
    _script(tmp_path / "venv/bin/python", "exit 1")  # cni-dra's own probe: no ipvlan either
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MAKEFLAGS", "MAKELEVEL")}
    if ci:
        env["CI"] = "true"
    out = subprocess.run(
        ["make", "--no-print-directory", "ipvlan-uml", f"VENV={tmp_path / 'venv'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode, out.stdout + out.stderr, log.read_text() if log.exists() else ""


def test_under_ci_the_lane_fails_when_ipvlan_cannot_run(tmp_path: Path) -> None:
    code, out, ran = _lane(tmp_path, ci=True, uml_works=False)
    assert code != 0, out
    assert "FAILED" in out and "no user-mode-linux here" in out
    assert ran == ""


def test_outside_ci_the_lane_says_it_skipped(tmp_path: Path) -> None:
    code, out, _ = _lane(tmp_path, ci=False, uml_works=False)
    assert code == 0, out
    assert "SKIPPED" in out


def test_under_user_mode_linux_a_skip_is_a_failure(tmp_path: Path) -> None:
    code, out, ran = _lane(tmp_path, ci=True, uml_works=True)
    assert code == 0, out
    assert "required=1" in ran and "CNI_DRA_IPVLAN_REQUIRED" in ran.split("env=")[1]
    assert "netns_tests/test_ipvlan.py" in ran


def test_the_ipvlan_tests_fail_rather_than_skip_when_the_lane_requires_them() -> None:
    """Where cni-dra's probe says no (this kernel, or a broken probe) while the lane says the
    kernel has ipvlan, every test of the file fails instead of skipping."""
    from cni_dra.netlink.sublink import link_kind_supported

    if link_kind_supported("ipvlan"):
        pytest.skip("this kernel has ipvlan: cni-dra's probe says so, nothing to refuse")
    env = {**os.environ, "CNI_DRA_IPVLAN_REQUIRED": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "netns_tests/test_ipvlan.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0, out.stdout
    assert "cni-dra's probe says this kernel has no ipvlan" in out.stdout
