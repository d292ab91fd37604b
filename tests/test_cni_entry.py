"""The CNI entry point as a function of (env, stdin, stdout): codes, JSON on stdout, nothing else."""

from __future__ import annotations

import io
import json
import logging

import pytest

from cni_dra.cni import run
from tests.builders import cni_env, netconf_bytes


def _env(command: str, **extra: str) -> dict[str, str]:
    return cni_env(command, netns="/var/run/netns/nope", **extra)


def _conf(**kw) -> bytes:
    return netconf_bytes("1.0.0", **kw)


def _run(env, stdin: bytes) -> tuple[int, dict]:
    out = io.StringIO()
    code = run(env, stdin, out)
    return code, json.loads(out.getvalue()) if out.getvalue() else None


def test_version_lists_supported_versions():
    code, doc = _run({"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "1.0.0"}')
    assert code == 0
    assert doc["cniVersion"] == "1.0.0"
    for v in ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"):
        assert v in doc["supportedVersions"]


@pytest.mark.parametrize(
    ("env", "stdin", "code"),
    [
        ({"CNI_COMMAND": "FROB"}, _conf(), 4),
        (_env("ADD", CNI_IFNAME=""), _conf(), 4),
        (_env("ADD", CNI_IFNAME="a/b"), _conf(), 4),
        (_env("ADD", CNI_IFNAME="waytoolonginterfacename"), _conf(), 4),
        (_env("ADD", CNI_CONTAINERID="-bad"), _conf(), 4),
        (_env("ADD"), b"{", 6),
        (_env("ADD"), _conf(cniVersion="0.0.7"), 1),
        (_env("CHECK"), _conf(cniVersion="0.3.1"), 1),
        (_env("ADD"), _conf(linkType="sriov"), 7),
        (_env("ADD", CNI_ARGS="K8S_POD_NAME=x;FOO=bar"), _conf(), 2),
        (_env("ADD"), _conf(inventory="/nonexistent/slice.yaml"), 5),
    ],
)
def test_errors_are_cni_error_json_on_stdout(env, stdin, code, capsys):
    rc, doc = _run(env, stdin)
    assert rc != 0
    assert doc["code"] == code
    assert doc["msg"]
    assert set(doc) <= {"cniVersion", "code", "msg", "details"}


def test_error_reply_uses_the_config_version():
    rc, doc = _run(_env("ADD"), _conf(cniVersion="0.4.0", linkType="sriov"))
    assert (rc, doc["cniVersion"], doc["code"]) == (1, "0.4.0", 7)


class _Records(logging.Handler):
    """Collects the ``cni_dra`` logger's records (it may not propagate to the root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records():
    handler = _Records()
    logger = logging.getLogger("cni_dra")
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("command", "stdin"),
    [
        (
            "ADD",
            f'{{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra", "args": {{"x": {_nested(100_000)}}}}}',
        ),
        (
            "DEL",
            f'{{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra", '
            f'"prevResult": {{"cniVersion": "1.0.0", "interfaces": {_nested(100_000)}}}}}',
        ),
        (
            "CHECK",
            f'{{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra", "prevResult": {_nested(3000)}}}',
        ),
        (
            "GC",
            f'{{"cniVersion": "1.1.0", "name": "n", "type": "cni-dra", "cni.dev/valid-attachments": {_nested(3000)}}}',
        ),
        ("VERSION", f'{{"cniVersion": "1.0.0", "x": {_nested(100_000)}}}'),
    ],
)
def test_deeply_nested_json_is_code_6_without_a_traceback(command, stdin, records, capsys):
    """Under the 1 MiB limit but nested deeper than the interpreter recurses: code 6 like any
    undecodable input, one log line, no traceback (logged or printed)."""
    rc, doc = _run(_env(command), stdin.encode())
    assert rc == 1 and doc["code"] == 6 and "nested too deeply" in doc["msg"], doc
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_text(""), "it is a regular file, not a directory"),
        (lambda p: p.symlink_to(p.parent), "it is a symlink"),
        (lambda p: (p.mkdir(), p.chmod(0o777)), "it is writable by group or others (mode 0777)"),
    ],
    ids=["file", "symlink", "mode-0777"],
)
def test_unsafe_state_dir_is_code_5_naming_the_problem(tmp_path, make, says):
    state_dir = tmp_path / "state"
    make(state_dir)
    stdin = _conf(cniVersion="1.1.0", stateDir=str(state_dir), **{"cni.dev/valid-attachments": []})
    rc, doc = _run({"CNI_COMMAND": "GC", "CNI_PATH": "/opt/cni/bin"}, stdin)
    assert rc == 1 and doc["code"] == 5, doc
    assert doc["msg"].startswith(f"failed to use state directory {state_dir}: {says}"), doc
