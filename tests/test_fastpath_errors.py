"""The agent answers an error exactly as the plugin does in-process: for every error class of
cni_dra.errors (and a bug, code 999), the whole error JSON and the exit code are the same
on both paths, byte for byte.

The agent runs in this process (its threads call the same ``cni_dra.cni.run``), so one
replaced verb raises on both paths: the STATUS verb is made to raise each error in turn
(monkeypatch: the verbs have no injected host yet); the agent is asked through the
plugin's own entry point in a subprocess (``CNI_DRA_AGENT=require``), in-process is
``cni_dra.cni.run`` called here.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cni_dra.errors
import cni_dra.verbs.status
from cni_dra.cni import run
from cni_dra.errors import CniError, IpamError
from cni_dra.fastpath.server import start_fastpath

ROOT = Path(__file__).resolve().parent.parent


def _error_classes() -> list[type[CniError]]:
    found, todo = [], [CniError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted({c for c in found if c.__module__ == cni_dra.errors.__name__}, key=lambda c: c.__name__)


ERRORS = [cls("failed to check thing t: the cause", "more about it") for cls in _error_classes()]
ERRORS += [
    IpamError("failed to allocate from ipam host-local: no addresses", "range full", code=7),
    CniError("failed to do it: no details"),
    RuntimeError("a bug"),
]


@pytest.fixture
def agent(tmp_path):
    server = start_fastpath(str(tmp_path / "agent" / "fp.sock"), warm=False)
    try:
        yield server
    finally:
        server.stop()


def test_every_error_class_is_covered() -> None:
    names = {type(e).__name__ for e in ERRORS}
    assert {
        "CniError",
        "ClaimError",
        "StateWriteError",
        "CheckFailedError",
        "NetlinkError",
        "IpamError",
    } <= names
    assert len(_error_classes()) >= 17


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: f"{type(e).__name__}-{getattr(e, 'code', 999)}")
def test_the_agent_answers_an_error_exactly_as_in_process(agent, tmp_path, monkeypatch, error) -> None:
    def fail(inv):
        raise error

    monkeypatch.setattr(cni_dra.verbs.status, "cmd_status", fail)
    stdin = json.dumps(
        {
            "cniVersion": "1.1.0",
            "name": "n",
            "type": "cni-dra",
            "stateDir": str(tmp_path / "st"),
            "inventory": str(tmp_path / "slice.json"),
        }
    ).encode()
    env = {"CNI_COMMAND": "STATUS", "CNI_PATH": "/opt/cni/bin"}
    out = io.StringIO()
    local_rc = run(env, stdin, out)
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from cni_dra.main import main; sys.exit(main())"
    served = subprocess.run(
        [sys.executable, "-IS", "-c", code],
        input=stdin,
        capture_output=True,
        check=False,
        cwd=os.getcwd(),
        env={**env, "CNI_DRA_AGENT": "require", "CNI_DRA_AGENT_SOCKET": agent.socket_path},
    )
    assert agent.served == 1, served.stderr
    assert (served.returncode, served.stdout.decode()) == (local_rc, out.getvalue())
    doc = json.loads(out.getvalue())
    assert local_rc == 1 and doc["cniVersion"] == "1.1.0"
    assert doc["code"] == getattr(error, "code", 999)
    if isinstance(error, CniError):
        assert doc["msg"] == error.msg and doc.get("details", "") == error.details
