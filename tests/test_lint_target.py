"""``make lint`` runs every linter it names over the whole tree, and fails when one is
missing or unhappy: never a printed line and a pass.

The linters are replaced by stubs (a fake venv and a PATH without the real shellcheck) that
log how they were called and succeed, fail or are absent as each test says; ``make`` runs
with ``-o venv`` so that it does not install anything. The shell scripts shellcheck must
receive are found here independently of ``scripts/lint-files``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STUB = """#!/bin/sh
printf '%s\\0' "{name}" "$@" >>"$LINT_STUB_LOG"; printf '\\n' >>"$LINT_STUB_LOG"
case " $LINT_STUB_FAIL " in *" {name} "*) exit 1;; esac
exit 0
"""
SHELLS = {"sh", "bash", "dash", "ksh"}

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _stub(path: Path, name: str) -> None:
    path.write_text(STUB.format(name=name))
    path.chmod(0o755)


@pytest.fixture
def lint(tmp_path: Path):
    """Run ``make lint`` against stub linters: ``run(fail=..., missing=...)`` returns
    (exit code, output, the calls each stub logged as argument lists)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    path_dir = tmp_path / "path"  # every program of PATH but the real linters
    path_dir.mkdir()
    for entry in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        if not entry or not os.path.isdir(entry):
            continue
        for prog in os.listdir(entry):
            link = path_dir / prog
            if prog not in {"shellcheck", "ruff", "lint-imports", "mypy"} and not os.path.lexists(link):
                link.symlink_to(os.path.join(entry, prog))
    log = tmp_path / "calls.log"

    def run(fail: tuple[str, ...] = (), missing: tuple[str, ...] = ()) -> tuple[int, str, list[list[str]]]:
        for name, where in (
            ("python", venv / "bin/python"),
            ("lint-imports", venv / "bin/lint-imports"),
            ("ruff", venv / "bin/ruff"),
            ("shellcheck", path_dir / "shellcheck"),
        ):
            if where.exists():
                where.unlink()
            if name not in missing:
                _stub(where, name)
        log.write_text("")
        # python -m mypy --version is how scripts/lint asks whether mypy is there
        env = {
            **os.environ,
            "PATH": str(path_dir),
            "LINT_STUB_LOG": str(log),
            "LINT_STUB_FAIL": " ".join(fail),
            "MAKEFLAGS": "",
            "MAKELEVEL": "",
        }
        env.pop("MYPY_FLAGS", None)
        out = subprocess.run(
            ["make", "--no-print-directory", "-o", "venv", "-o", "deps", "lint", f"VENV={venv}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        calls = [line.split("\0")[:-1] for line in log.read_text().splitlines() if line]
        return out.returncode, out.stdout + out.stderr, calls

    return run


def _shell_scripts() -> set[str]:
    """Every shell script of the tree, by name or by its ``#!`` line."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    found = set()
    for name in filter(None, listed):
        path = REPO / name
        if not path.is_file() or path.is_symlink():
            continue
        if path.suffix in {".sh", ".bash"}:
            found.add(name)
            continue
        with path.open("rb") as f:
            first = f.readline().decode("utf-8", "replace")
        if first.startswith("#!"):
            words = first[2:].split()
            prog = os.path.basename(words[0]) if words else ""
            if prog == "env":
                prog = next((w for w in words[1:] if not w.startswith("-")), "")
            if prog in SHELLS:
                found.add(name)
    return found


def test_lint_fails_when_shellcheck_is_missing(lint) -> None:
    code, out, _ = lint(missing=("shellcheck",))
    assert code != 0, out
    assert "shellcheck" in out


@pytest.mark.parametrize("tool", ["python", "lint-imports", "ruff"])
def test_lint_fails_naming_a_missing_python_linter(lint, tool: str) -> None:
    code, out, _ = lint(missing=(tool,))
    assert code != 0, out
    assert {"python": "mypy", "lint-imports": "import-linter", "ruff": "ruff"}[tool] in out


def test_mypy_that_cannot_run_counts_as_missing(lint) -> None:
    """The venv's python answers, but ``python -m mypy --version`` fails: mypy is missing."""
    code, out, calls = lint(fail=("python",))
    assert code != 0, out
    assert "missing: mypy" in out
    assert not any(call[0] == "shellcheck" for call in calls)


def test_lint_runs_every_linter_over_the_whole_tree(lint) -> None:
    code, out, calls = lint()
    assert code == 0, out
    by_tool: dict[str, list[list[str]]] = {}
    for call in calls:
        by_tool.setdefault(call[0], []).append(call[1:])
    assert ["--no-cache", ".importlinter"] in by_tool["lint-imports"]
    assert any(args[:2] == ["-m", "mypy"] and "--version" not in args for args in by_tool["python"])
    ruff = by_tool["ruff"]
    checks = [args for args in ruff if args[0] == "check"]
    assert any("--select" not in args and "." in args for args in checks), ruff  # the whole lint
    assert any("--select" in args and "I" in args and "." in args for args in checks), (
        ruff
    )  # the import order
    assert any(args[:2] == ["format", "--check"] and "." in args for args in ruff), ruff
    # the Python scripts without a .py name are handed to ruff by name
    for script in ("scripts/render-manifests", "scripts/e2e/smoke-runtimes"):
        assert all(script in args for args in ruff), (script, ruff)
    (shellcheck,) = by_tool["shellcheck"]
    expected = _shell_scripts()
    assert {"scripts/install.sh", ".ci/run", "scripts/e2e/build-lib.sh", "scripts/lint"} <= expected
    assert set(shellcheck) == expected


@pytest.mark.parametrize("tool", ["lint-imports", "ruff", "shellcheck"])
def test_lint_fails_when_a_linter_is_unhappy_and_still_runs_the_others(lint, tool: str) -> None:
    code, out, calls = lint(fail=(tool,))
    assert code != 0, out
    assert "lint: FAILED" in out
    ran = {call[0] for call in calls}
    assert {"lint-imports", "python", "ruff", "shellcheck"} <= ran
