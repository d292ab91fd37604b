"""The fast path without privileges: wire format, the thin client's imports, the agent's
socket permissions and refusals, and the same answers with and without the agent."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.fastpath.client import ask_agent
from cni_dra.fastpath.server import start_fastpath
from cni_dra.fastpath.wire import MAGIC, caller_identity, decode_frames, encode_frames

ROOT = Path(__file__).resolve().parent.parent
THIRD_PARTY = ("pyroute2", "pydantic", "filelock", "click", "kubernetes", "yaml", "celpy", "cel")


@given(st.lists(st.binary(max_size=300), max_size=6))
def test_frames_round_trip(parts):
    assert decode_frames(encode_frames(*parts), len(parts)) == parts


@given(st.lists(st.binary(max_size=50), min_size=1, max_size=4), st.data())
def test_truncated_or_padded_frames_are_refused(parts, data):
    wire = encode_frames(*parts)
    cut = data.draw(st.integers(min_value=0, max_value=len(wire) - 1))
    with pytest.raises(ValueError):
        decode_frames(wire[:cut], len(parts))
    with pytest.raises(ValueError):
        decode_frames(wire + b"x", len(parts))


@pytest.mark.parametrize("module", ["cni_dra.fastpath.client", "cni_dra.main"])
def test_client_imports_only_the_standard_library(module):
    """The Python executable's entry (cni_dra.main) and the client load in milliseconds."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module}; "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-IS", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    mods = set(out.split())
    ours = {m for m in mods if m.split(".")[0] == "cni_dra"}
    assert ours <= {
        "cni_dra",
        "cni_dra.main",
        "cni_dra.fastpath",
        "cni_dra.fastpath.client",
        "cni_dra.fastpath.wire",
    }
    assert not {m for m in mods if m.split(".")[0] in THIRD_PARTY}
    assert "asyncio" not in mods and "socket" not in mods  # _socket only: socket.py costs ~9 ms


@pytest.fixture
def agent(tmp_path):
    server = start_fastpath(str(tmp_path / "agent" / "fp.sock"), warm=False)
    try:
        yield server
    finally:
        server.stop()


def test_socket_and_directory_are_private(agent):
    st_sock = os.lstat(agent.socket_path)
    st_dir = os.stat(os.path.dirname(agent.socket_path))
    assert stat.S_ISSOCK(st_sock.st_mode) and stat.S_IMODE(st_sock.st_mode) == 0o600
    assert stat.S_IMODE(st_dir.st_mode) == 0o700
    assert st_sock.st_uid == st_dir.st_uid == os.geteuid()


def test_open_directory_is_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    with pytest.raises(PermissionError):
        start_fastpath(str(d / "fp.sock"), warm=False)


def test_stop_removes_the_socket(tmp_path):
    server = start_fastpath(str(tmp_path / "a" / "fp.sock"), warm=False)
    server.stop()
    assert not os.path.exists(server.socket_path)
    assert ask_agent({b"CNI_COMMAND": b"VERSION"}, b"{}", server.socket_path) is None


def test_absent_agent_means_in_process(tmp_path):
    assert ask_agent({b"CNI_COMMAND": b"VERSION"}, b"{}", str(tmp_path / "none.sock")) is None


def test_socket_in_a_directory_others_can_write_is_not_trusted(agent):
    d = os.path.dirname(agent.socket_path)
    os.chmod(d, 0o777)
    try:
        assert ask_agent({b"CNI_COMMAND": b"VERSION"}, b"{}", agent.socket_path) is None
    finally:
        os.chmod(d, 0o700)
    assert agent.served == 0


def test_agent_serves_version(agent):
    answer = ask_agent({b"CNI_COMMAND": b"VERSION"}, b'{"cniVersion": "1.0.0"}', agent.socket_path)
    assert answer is not None
    code, out = answer
    doc = json.loads(out)
    assert code == 0 and doc["cniVersion"] == "1.0.0" and "1.1.0" in doc["supportedVersions"]
    assert agent.served == 1


def _raw_request(path: str, *frames: bytes) -> list[bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(encode_frames(*frames))
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return decode_frames(data, 2)


def test_other_namespaces_are_declined(agent):
    ident = caller_identity().replace(b"root=", b"root=9")
    status, out = _raw_request(
        agent.socket_path, ident, os.fsencode(os.getcwd()), b"CNI_COMMAND=VERSION", b"{}"
    )
    assert status.startswith(b"declined ") and out == b""
    assert (agent.served, agent.declined) == (0, 1)


def test_other_working_directory_is_declined(agent, tmp_path):
    status, _ = _raw_request(
        agent.socket_path, caller_identity(), os.fsencode(str(tmp_path)), b"CNI_COMMAND=VERSION", b"{}"
    )
    assert status.startswith(b"declined ")
    assert agent.served == 0


def test_malformed_request_is_declined(agent):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(agent.socket_path)
        s.sendall(MAGIC + b"\xff\xff\xff\xffjunk")
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status, _ = decode_frames(data, 2)
    assert status.startswith(b"declined malformed")


def _plugin(env: dict[str, str], stdin: bytes) -> tuple[int, dict | None]:
    """The Python executable's entry as it runs it (-IS), from this work tree."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from cni_dra.main import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-IS", "-c", code],
        input=stdin,
        env=env,
        capture_output=True,
        check=False,
        cwd=os.getcwd(),
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None


ERROR_CASES = [
    # (env, stdin, expected code): CNI spec 1.1.0 well-known error codes
    ({"CNI_COMMAND": "ADD"}, b'{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra"}', 4),
    (
        {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": "/nope",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/x",
        },
        b"not json",
        6,
    ),
    (
        {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": "/nope",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/x",
        },
        b'{"cniVersion": "9.9.9", "name": "n", "type": "cni-dra"}',
        1,
    ),
    # a relative netns path: another working directory would name another namespace
    (
        {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": "var/run/netns/x",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/x",
        },
        b'{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra"}',
        4,
    ),
    (
        {
            "CNI_COMMAND": "DEL",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": "x",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/x",
        },
        b'{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra"}',
        4,
    ),
    # JSON nested deeper than the interpreter recurses, as the config and as DEL's prevResult
    (
        {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": "/nope",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/x",
        },
        b'{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra", "args": '
        + b"[" * 200_000
        + b"]" * 200_000
        + b"}",
        6,
    ),
    (
        {
            "CNI_COMMAND": "DEL",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": "/nope",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/x",
        },
        b'{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra", "prevResult": {"cniVersion": "1.0.0", "ips": '
        + b"[" * 2000
        + b"]" * 2000
        + b"}}",
        6,
    ),
]


@pytest.mark.parametrize("path", ["agent", "local"])
@pytest.mark.parametrize("env,stdin,code", ERROR_CASES)
def test_error_json_is_the_same_on_both_paths(agent, path, env, stdin, code):
    mode = {"agent": "require", "local": "off"}[path]
    full = {**env, "CNI_DRA_AGENT": mode, "CNI_DRA_AGENT_SOCKET": agent.socket_path}
    rc, doc = _plugin(full, stdin)
    assert rc == 1 and doc is not None and doc["code"] == code and doc["msg"]
    assert agent.served == (1 if path == "agent" else 0)


@pytest.mark.parametrize("path", ["agent", "local"])
def test_deeply_nested_json_leaves_no_traceback_on_either_path(agent, path):
    """The agent logs a code-6 line, not an exception with its traceback; in-process, stderr
    carries no traceback either."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("cni_dra")
    logger.addHandler(handler)
    mode = {"agent": "require", "local": "off"}[path]
    env = {
        "CNI_COMMAND": "DEL",
        "CNI_CONTAINERID": "c",
        "CNI_NETNS": "/nope",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/x",
        "CNI_DRA_AGENT": mode,
        "CNI_DRA_AGENT_SOCKET": agent.socket_path,
    }
    stdin = (
        b'{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra", "prevResult": '
        + b'{"a":' * 5000
        + b"1"
        + b"}" * 5001
    )
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from cni_dra.main import main; sys.exit(main())"
    try:
        proc = subprocess.run(
            [sys.executable, "-IS", "-c", code], input=stdin, env=env, capture_output=True, check=False
        )
    finally:
        logger.removeHandler(handler)
    assert proc.returncode == 1 and json.loads(proc.stdout)["code"] == 6, proc.stdout
    assert agent.served == (1 if path == "agent" else 0)
    assert b"Traceback" not in proc.stderr
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]
    if path == "agent":
        assert any("nested too deeply" in r.getMessage() for r in records)


@pytest.mark.parametrize("path", ["agent", "fallback"])
def test_version_on_both_paths(agent, tmp_path, path):
    sock = agent.socket_path if path == "agent" else str(tmp_path / "absent.sock")
    rc, doc = _plugin({"CNI_COMMAND": "VERSION", "CNI_DRA_AGENT_SOCKET": sock}, b'{"cniVersion": "0.4.0"}')
    assert rc == 0 and doc["cniVersion"] == "0.4.0" and "0.4.0" in doc["supportedVersions"]
    assert agent.served == (1 if path == "agent" else 0)


def test_require_without_agent_fails_with_code_11(tmp_path):
    env = {
        "CNI_COMMAND": "VERSION",
        "CNI_DRA_AGENT": "require",
        "CNI_DRA_AGENT_SOCKET": str(tmp_path / "x.sock"),
    }
    rc, doc = _plugin(env, b'{"cniVersion": "1.0.0"}')
    assert rc == 1 and doc["code"] == 11 and doc["cniVersion"] == "1.0.0"


def test_a_failing_request_does_not_cost_a_worker(tmp_path, monkeypatch):
    """An unexpected error in one request closes that connection (the client falls back)
    and leaves the worker serving the next ones."""
    server = start_fastpath(str(tmp_path / "w" / "fp.sock"), warm=False, workers=1)
    try:
        calls = []
        original = server._answer

        def flaky(request):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("boom")
            return original(request)

        monkeypatch.setattr(server, "_answer", flaky)
        assert ask_agent({b"CNI_COMMAND": b"VERSION"}, b"{}", server.socket_path) is None
        answer = ask_agent(
            {b"CNI_COMMAND": b"VERSION"}, b'{"cniVersion": "1.0.0"}', server.socket_path, timeout_s=10
        )
        assert answer is not None and answer[0] == 0
    finally:
        server.stop()


def _gone(pid: int, within_s: float) -> bool:
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_worker_processes_serve_while_the_agent_cannot_and_leave_with_it(tmp_path):
    """``--processes 2``: a second process accepts on the same socket (a burst uses two
    CPUs), answers while the agent process is stopped, and exits when the agent dies."""
    import signal

    sock = tmp_path / "a" / "fp.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cni_dra.fastpath.server",
            "--socket",
            str(sock),
            "--processes",
            "2",
            "--workers",
            "1",
            "--cwd",
            os.getcwd(),
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline().decode()
        pids = [int(p) for p in line.split("pids=")[1].split(",")]
        assert len(pids) == 2 and pids[0] == proc.pid
        env = {b"CNI_COMMAND": b"VERSION", b"PATH": os.environb.get(b"PATH", b"/usr/bin:/bin")}
        # Stop the agent process: only its worker process can accept now. The agent's accept
        # thread may already be the waiter the kernel wakes for the next connection (it then
        # waits for SIGCONT), so three connections go at once: the others reach the worker.
        import threading
        import time

        answers: list = []
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            askers = [
                threading.Thread(
                    target=lambda: answers.append(
                        ask_agent(env, b'{"cniVersion": "1.0.0"}', str(sock), timeout_s=150)
                    )
                )
                for _ in range(3)
            ]
            for t in askers:
                t.start()
            # the worker process may still be importing (it prints nothing when it is ready):
            # on a loaded machine that takes tens of seconds, so the wait is generous
            deadline = time.monotonic() + 120
            while not answers and time.monotonic() < deadline:
                time.sleep(0.05)
            answered_while_stopped = bool(answers)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        for t in askers:
            t.join(150)
        assert answered_while_stopped, "no answer while the agent process was stopped"
        assert len(answers) == 3
        for answer in answers:
            assert answer is not None and answer[0] == 0
            assert "1.1.0" in json.loads(answer[1])["supportedVersions"]
        proc.kill()  # the agent dies without stopping anything
        proc.wait(10)
        assert _gone(pids[1], within_s=30), "worker process outlived the agent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()


def test_require_says_why_the_agent_did_not_serve(agent, tmp_path):
    """``CNI_DRA_AGENT=require``: the code 11 message names the reason (here the agent
    declined a caller in another working directory)."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from cni_dra.main import main; sys.exit(main())"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": "VERSION",
        "CNI_DRA_AGENT": "require",
        "CNI_DRA_AGENT_SOCKET": agent.socket_path,
    }
    proc = subprocess.run(
        [sys.executable, "-IS", "-c", code],
        input=b'{"cniVersion": "1.0.0"}',
        env=env,
        capture_output=True,
        cwd=tmp_path,
        check=False,
    )
    answer = json.loads(proc.stdout)
    assert proc.returncode == 1 and answer["code"] == 11
    assert "declined" in answer["msg"] and "working directory" in answer["msg"]


def test_the_server_module_imports_no_click():
    """The agent's worker processes import the module; only ``python -m`` needs click."""
    code = "import sys, cni_dra.fastpath.server; print('click' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_standalone_server_command_line():
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cni_dra.fastpath.server", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    for flag in ("--help", "-h"):
        out = run(flag)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("Usage: python -m cni_dra.fastpath.server [OPTIONS]")
        for option in ("--socket", "--workers", "--processes", "--cwd", "--log-level"):
            assert option in out.stdout
    out = run("--workers", "many")
    assert out.returncode == 2 and "'many' is not a valid integer" in out.stderr
