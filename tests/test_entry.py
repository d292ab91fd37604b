"""The Python executable's entry (scripts/cni-dra-entry.py and :func:`cni_dra.main.main`):
one dispatch on ``CNI_COMMAND``, at most one question to the agent, and one "cannot load"
reply.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import cni_dra.main as entry
from cni_dra.fastpath.wire import ENV_ASKED, encode_frames
from tests import builders
from tests.builders import FakeAgent

ROOT = Path(__file__).resolve().parent.parent
BASE_ENV = {"PATH": "/usr/bin:/bin"}


def _executable(tmp: Path, home: Path) -> Path:
    """scripts/cni-dra-entry.py placed as in the plugin tree (``tmp/libexec/cni-dra``, its
    packages in ``tmp/lib/python3/dist-packages``, here a link to ``home``), run by this
    interpreter with ``-IS`` as the tree's loader runs it."""
    exe = tmp / "libexec" / "cni-dra"
    exe.parent.mkdir(parents=True, exist_ok=True)
    (tmp / "lib" / "python3").mkdir(parents=True, exist_ok=True)
    (tmp / "lib" / "python3" / "dist-packages").symlink_to(home)
    exe.write_text(f"#!{sys.executable} -IS\n" + (ROOT / "scripts" / "cni-dra-entry.py").read_text())
    exe.chmod(0o755)
    return exe


def _run(exe: Path, env: dict[str, str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(exe)], input=stdin, env={**BASE_ENV, **env}, capture_output=True, timeout=60, check=False
    )


@pytest.fixture
def counting_agent(tmp_path) -> Iterator[FakeAgent]:
    """A fake agent (:func:`tests.builders.fake_agent`) that answers ``ok 0`` with ``agent``."""
    with builders.fake_agent(tmp_path / "agent", lambda frames: encode_frames(b"ok 0", b"agent")) as agent:
        yield agent


def test_without_the_handoff_the_agent_is_asked_once(tmp_path, counting_agent):
    path = counting_agent.path
    proc = _run(_executable(tmp_path, ROOT), {"CNI_COMMAND": "VERSION", "CNI_DRA_AGENT_SOCKET": path}, b"{}")
    assert (proc.returncode, proc.stdout) == (0, b"agent")
    assert counting_agent.connections == 1


def test_after_the_handoff_the_agent_is_not_asked_again(tmp_path, counting_agent):
    path = counting_agent.path
    env = {"CNI_COMMAND": "VERSION", "CNI_DRA_AGENT_SOCKET": path, ENV_ASKED: "declined test"}
    proc = _run(_executable(tmp_path, ROOT), env, b'{"cniVersion": "0.4.0"}')
    assert proc.returncode == 0 and json.loads(proc.stdout)["cniVersion"] == "0.4.0"
    assert counting_agent.connections == 0


def test_the_handoff_never_reaches_the_plugin(monkeypatch, counting_agent):
    """The variable is gone from the environment before the in-process run (and the IPAM
    plugins it execs) see it."""
    path = counting_agent.path
    seen = {}

    def fake_cni_main(stdin: bytes) -> int:
        seen["environ"] = dict(os.environ)
        seen["stdin"] = stdin
        return 0

    import cni_dra.cni

    monkeypatch.setenv("CNI_COMMAND", "ADD")
    monkeypatch.setenv("CNI_DRA_AGENT_SOCKET", path)
    monkeypatch.setenv(ENV_ASKED, "declined test")
    monkeypatch.setattr(entry, "read_stdin", lambda command: b"{}")
    monkeypatch.setattr(cni_dra.cni, "main", fake_cni_main)
    # (the collector stays on in this test process; tests/test_inprocess_imports.py checks it goes off)
    monkeypatch.setattr(entry, "_without_garbage_collection", lambda: None)
    assert entry.main() == 0
    assert ENV_ASKED not in seen["environ"] and seen["environ"]["CNI_COMMAND"] == "ADD"
    assert seen["stdin"] == b"{}" and counting_agent.connections == 0


def test_require_after_the_handoff_names_the_reason(tmp_path, counting_agent):
    path = counting_agent.path
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_DRA_AGENT": "require",
        "CNI_DRA_AGENT_SOCKET": path,
        ENV_ASKED: "declined caller's working directory differs from the agent's",
    }
    proc = _run(_executable(tmp_path, ROOT), env, b'{"cniVersion": "1.0.0"}')
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["code"] == 11 and doc["cniVersion"] == "1.0.0"
    assert f"failed to reach cni-dra agent at {path}: declined caller's working directory" in doc["msg"]
    assert counting_agent.connections == 0


def _package_without(tmp_path: Path, missing: str) -> Path:
    """A copy of cni_dra whose module ``missing`` (a file under cni_dra/) is gone."""
    home = tmp_path / "home"
    shutil.copytree(ROOT / "cni_dra", home / "cni_dra", ignore=shutil.ignore_patterns("__pycache__"))
    (home / "cni_dra" / missing).unlink()
    return home


@pytest.mark.parametrize("missing", ["main.py", "cni.py"])
def test_a_broken_install_answers_cni_error_999(tmp_path, missing):
    """Whether the entry itself or the in-process plugin cannot be imported, the one reply:
    CNI error JSON, code 999, the config's cniVersion, on stdout; exit 1."""
    exe = _executable(tmp_path, _package_without(tmp_path, missing))
    env = {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT": "off"}
    proc = _run(exe, env, b'{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra"}')
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert doc["code"] == 999 and doc["cniVersion"] == "1.0.0"
    assert (
        doc["msg"]
        == f"failed to load cni-dra from {tmp_path / 'lib/python3/dist-packages'}: ModuleNotFoundError"
    )
    assert "cni_dra." + missing.removesuffix(".py") in doc["details"]


def test_a_broken_install_fails_the_cli_with_a_traceback(tmp_path):
    exe = _executable(tmp_path, _package_without(tmp_path, "main.py"))
    proc = _run(exe, {}, b"")
    assert proc.returncode == 1 and proc.stdout == b"" and b"Traceback" in proc.stderr


def test_the_cli_runs_without_cni_command(tmp_path):
    proc = subprocess.run(
        [str(_executable(tmp_path, ROOT)), "--version"],
        env=BASE_ENV,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.startswith(b"cni-dra, version ")
