"""Socket activation (``cni_dra.fastpath.activation``): the sd_listen_fds protocol read from
the environment, the fast-path socket picked among the inherited descriptors and checked,
and the whole hand-over through systemd's own ``systemd-socket-activate``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

from cni_dra.fastpath.activation import FDNAME, SD_LISTEN_FDS_START, InheritedFd, listen_fds, take_listener
from cni_dra.fastpath.server import start_fastpath
from tests.builders import wait_for


@pytest.fixture
def short():
    d = tempfile.mkdtemp(prefix="cdact", dir="/tmp")  # 0700, short unix socket paths
    yield d
    shutil.rmtree(d)


def _listening(path: str, mode: int = 0o600) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, mode)
    s.listen(8)
    return s


def test_descriptors_meant_for_another_process_are_ignored_and_the_variables_removed():
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "fastpath", "OTHER": "x"}
    assert listen_fds(env) == []
    assert env == {"OTHER": "x"}


def test_no_variables_no_descriptors():
    env: dict[str, str] = {}
    assert listen_fds(env) == [] and env == {}


@pytest.mark.parametrize(
    "env, match",
    [
        ({"LISTEN_PID": "me", "LISTEN_FDS": "1"}, "not numbers"),
        ({"LISTEN_PID": "{pid}", "LISTEN_FDS": "two"}, "not numbers"),
        ({"LISTEN_PID": "{pid}", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "fastpath"}, "names 1 descriptors"),
    ],
    ids=["pid", "count", "names"],
)
def test_a_malformed_environment_is_an_error_and_still_removed(env, match):
    env = {k: v.format(pid=os.getpid()) for k, v in env.items()}
    with pytest.raises(ValueError, match=match):
        listen_fds(env)
    assert env == {}


def test_descriptors_are_named_numbered_from_3_and_made_close_on_exec():
    """In a child whose fds 3 and 4 are two sockets, as systemd leaves them (inheritable)."""
    code = textwrap.dedent("""
        import fcntl, json, os, socket, sys
        from cni_dra.fastpath.activation import listen_fds
        a, b = socket.socketpair()
        for fd, target in ((a.fileno(), 3), (b.fileno(), 4)):
            os.dup2(fd, target)  # inheritable, as systemd passes them
        os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="2", LISTEN_FDNAMES="fastpath:")
        got = listen_fds()
        print(json.dumps({"fds": [[f.fd, f.name] for f in got],
                          "cloexec": [bool(fcntl.fcntl(f.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC) for f in got],
                          "env": sorted(k for k in os.environ if k.startswith("LISTEN_"))}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"fds": [[3, "fastpath"], [4, "unknown"]], "cloexec": [True, True], "env": []}
    assert SD_LISTEN_FDS_START == 3


def test_take_listener_picks_the_named_socket_bound_to_the_path(short):
    other, mine = _listening(f"{short}/other.sock"), _listening(f"{short}/agent.sock")
    try:
        got = take_listener(
            f"{short}/agent.sock",
            [InheritedFd(other.fileno(), "metrics"), InheritedFd(mine.fileno(), FDNAME)],
        )
        assert (
            got is not None and got.getsockname() == f"{short}/agent.sock" and got.fileno() != mine.fileno()
        )
        assert not got.get_inheritable()
        got.close()
        # unnamed: the one bound to the path
        got = take_listener(
            f"{short}/agent.sock",
            [InheritedFd(other.fileno(), "unknown"), InheritedFd(mine.fileno(), "unknown")],
        )
        assert got is not None and got.getsockname() == f"{short}/agent.sock"
        got.close()
    finally:
        other.close()
        mine.close()


def test_take_listener_without_descriptors_binds_nothing(short):
    assert take_listener(f"{short}/agent.sock", []) is None


def test_a_socket_bound_elsewhere_is_refused_rather_than_replaced(short):
    """The unit and --fastpath-socket disagree: binding our own would unlink systemd's file."""
    other = _listening(f"{short}/other.sock")
    try:
        with pytest.raises(OSError, match=f"bound to {short}/agent.sock .*other.sock"):
            take_listener(f"{short}/agent.sock", [InheritedFd(other.fileno(), FDNAME)])
    finally:
        other.close()


def test_a_socket_that_is_not_listening_is_refused(short):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(f"{short}/agent.sock")
    try:
        with pytest.raises(OSError, match="not listening"):
            take_listener(f"{short}/agent.sock", [InheritedFd(s.fileno(), FDNAME)])
    finally:
        s.close()


@pytest.mark.parametrize(
    "sock_mode, dir_mode, match",
    [
        (0o666, 0o700, "cannot write"),
        (0o600, 0o755, "closed to group and others"),
    ],
    ids=["socket-writable-by-others", "directory-open"],
)
def test_a_socket_others_could_reach_is_refused(short, sock_mode, dir_mode, match):
    os.mkdir(f"{short}/run")
    s = _listening(f"{short}/run/agent.sock", sock_mode)
    os.chmod(f"{short}/run", dir_mode)
    try:
        with pytest.raises(PermissionError, match=match):
            take_listener(f"{short}/run/agent.sock", [InheritedFd(s.fileno(), FDNAME)])
    finally:
        s.close()


def test_an_inherited_socket_is_served_and_outlives_the_server(short):
    """The server on systemd's socket: serves, leaves the file and the socket listening
    when it stops (systemd keeps it for the next agent), and queued connections wait."""
    from cni_dra.fastpath.client import ask_agent

    path = f"{short}/agent.sock"
    systemd_copy = _listening(path)
    try:
        listener = take_listener(path, [InheritedFd(systemd_copy.fileno(), FDNAME)])
        server = start_fastpath(path, warm=False, workers=2, listener=listener)
        answer = ask_agent({b"CNI_COMMAND": b"VERSION"}, b'{"cniVersion": "1.0.0"}', path)
        assert answer is not None and answer[0] == 0 and b"supportedVersions" in answer[1], answer
        server.stop()
        assert os.path.exists(path)
        assert systemd_copy.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        waiting.connect(path)  # still accepted by the kernel: queued for the next agent
        systemd_copy.settimeout(5)
        conn, _ = systemd_copy.accept()
        conn.close()
        waiting.close()
    finally:
        systemd_copy.close()


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None and not os.environ.get("CI"),
    reason="systemd-socket-activate not installed (apt install systemd)",
)
def test_systemd_socket_activate_hands_over_the_socket_on_the_first_connection(short):
    """systemd's own tool: it listens, and on the first connection execs the command in its
    own process with LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES; take_listener finds the socket and
    the variables are gone."""
    path = f"{short}/agent.sock"
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.getcwd()!r})
        from cni_dra.fastpath.activation import take_listener
        s = take_listener({path!r})
        conn, _ = s.accept()
        conn.sendall(repr((s.getsockname(), sorted(k for k in os.environ if k.startswith("LISTEN_")))).encode())
        conn.close()
    """)
    proc = subprocess.Popen(
        ["systemd-socket-activate", "--listen", path, f"--fdname={FDNAME}", sys.executable, "-c", code],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: os.path.exists(path), what="the socket")
        assert os.readlink(f"/proc/{proc.pid}/exe").endswith("systemd-socket-activate")  # nothing started yet
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(path)
        c.settimeout(30)
        got = b""
        while chunk := c.recv(4096):
            got += chunk
        c.close()
        assert got.decode() == repr((path, [])), proc.stderr
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
