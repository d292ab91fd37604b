"""The compiled client (scripts/cni-dra-client.c), built into tmp with ``cc``.

It must speak :mod:`cni_dra.fastpath.wire` to the agent, print the agent's answer only when
it is ``ok <code>``, and in every other case run the plugin tree's Python executable beside
it (``cni-dra.d``: its loader with ``--library-path <tree>/lib <tree>/bin/python3 -IS
<tree>/libexec/cni-dra``) with the same arguments, environment and stdin; after asking the
agent, with ``CNI_DRA_AGENT_ASKED=<why>`` added, so that the Python executable does not ask
again. Builds, each beside a stand-in tree: one whose "loader" runs the real entry
(scripts/cni-dra-entry.py, on this work tree) with this interpreter, one whose "loader" is a
recorder script that saves what it received, and both again with
``-fsanitize=address,undefined``. A fake agent (:func:`tests.builders.fake_agent`, a
unix-socket server in a thread speaking :func:`encode_frames`/:func:`decode_frames`) plays
the agent; the real server (:func:`cni_dra.fastpath.server.start_fastpath`) too, where it
says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cni_dra.fastpath.wire import (
    ENV_ASKED,
    MAX_MESSAGE_BYTES,
    STDIN_LIMIT_BYTES,
    caller_identity,
    encode_frames,
)
from tests import builders
from tests.builders import FakeAgent

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "scripts" / "cni-dra-client.c"
CC = shutil.which("cc")
STDIN_LIMIT = STDIN_LIMIT_BYTES
BASE_ENV = {"PATH": "/usr/bin:/bin"}

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build scripts/cni-dra-client.c")


# As scripts/install.sh builds it (but dynamic, as the sanitizers need); warnings are errors.
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]
SANITIZE = [
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-Wall",
    "-Wextra",
    "-Werror",
]
# Any report fails the run (exit 86) and says so on stderr; leaks are checked at exit.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:exitcode=86:abort_on_error=0",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=86",
}
ENTRY = ROOT / "scripts" / "cni-dra-entry.py"


def _build(out: Path, flags: list[str] = CFLAGS) -> str:
    proc = subprocess.run(
        [CC, *flags, "-o", str(out), str(SOURCE)], check=False, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr  # a warning fails the build
    return str(out)


def _loader_args(tree: Path) -> list[bytes]:
    """What the client puts before its own arguments when it runs the tree's loader."""
    return [
        b"--library-path",
        os.fsencode(tree / "lib"),
        os.fsencode(tree / "bin" / "python3"),
        b"-IS",
        os.fsencode(tree / "libexec" / "cni-dra"),
    ]


def _stand_in_tree(bin_dir: Path, loader: str) -> Path:
    """``bin_dir/cni-dra.d`` with ``loader`` (a shell script body) as its loader, the entry
    (scripts/cni-dra-entry.py) and this work tree as its packages; returns the tree."""
    tree = bin_dir / "cni-dra.d"
    (tree / "lib" / "python3").mkdir(parents=True)
    (tree / "libexec").mkdir()
    (tree / "lib" / "python3" / "dist-packages").symlink_to(ROOT)
    shutil.copyfile(ENTRY, tree / "libexec" / "cni-dra")
    (tree / "lib" / "ld-linux-x86-64.so.2").write_text("#!/bin/sh\n" + loader)
    (tree / "lib" / "ld-linux-x86-64.so.2").chmod(0o755)
    return tree


@dataclass
class Builds:
    real: str  # beside a tree that runs the entry with this interpreter
    python: str  # that entry run directly (what the client must behave as)
    recording: str  # beside a tree whose loader is the recorder
    record_dir: Path

    def recorded(self) -> dict[str, object] | None:
        """What the recorder received (the client's argv[1:] after the loader's arguments,
        which must be the tree's; environment; stdin), None if it did not run."""
        if not (self.record_dir / "stdin").exists():
            return None
        env = {}
        for item in (self.record_dir / "env").read_bytes().split(b"\0"):
            if item:
                k, _, v = item.partition(b"=")
                env[k.decode()] = v.decode()
        argv = (self.record_dir / "argv").read_bytes().split(b"\0")[:-1]
        prefix = _loader_args(Path(self.recording).parent / "cni-dra.d")
        assert argv[: len(prefix)] == prefix
        return {"argv": argv[len(prefix) :], "env": env, "stdin": (self.record_dir / "stdin").read_bytes()}


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> Builds:
    d = tmp_path_factory.mktemp("shim")
    (d / "real").mkdir()
    # the loader's arguments are --library-path DIR PYTHON; the rest is the interpreter's
    tree = _stand_in_tree(d / "real", f'shift 3\nexec {sys.executable} "$@"\n')
    python = d / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -IS {tree / "libexec" / "cni-dra"} "$@"\n')
    python.chmod(0o755)
    rec_dir = d / "rec"
    (d / "recorder").mkdir()
    # env -0 would add nothing of its own; the unset drops what sh exports by itself.
    _stand_in_tree(
        d / "recorder",
        (
            f"cat > '{rec_dir}/stdin'\n"
            f"printf '%s\\0' \"$@\" > '{rec_dir}/argv'\n"
            f"unset PWD OLDPWD SHLVL _; env -0 > '{rec_dir}/env'\n"
            "echo fallback-ran\n"
        ),
    )
    return Builds(
        real=_build(d / "real" / "cni-dra"),
        python=str(python),
        recording=_build(d / "recorder" / "cni-dra"),
        record_dir=rec_dir,
    )


@pytest.fixture
def rec(builds) -> Iterator[Builds]:
    builds.record_dir.mkdir()
    try:
        yield builds
    finally:
        shutil.rmtree(builds.record_dir)


@pytest.fixture
def fake_agent(tmp_path) -> Iterator[Callable[[Callable[[list[bytes]], bytes | None]], FakeAgent]]:
    """Start fake agents (:func:`tests.builders.fake_agent`), each in its own directory."""
    with contextlib.ExitStack() as stack:
        agents: list[FakeAgent] = []

        def start(answer: Callable[[list[bytes]], bytes | None]) -> FakeAgent:
            agents.append(stack.enter_context(builders.fake_agent(tmp_path / f"agent{len(agents)}", answer)))
            return agents[-1]

        yield start


def _run(
    exe: str, env: dict[str, str], stdin: bytes | int = b"", args: tuple[str, ...] = ()
) -> tuple[int, bytes]:
    kw = {"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}
    proc = subprocess.run(
        [exe, *args], env={**BASE_ENV, **env}, capture_output=True, timeout=60, check=False, **kw
    )
    return proc.returncode, proc.stdout


def _big_config() -> bytes:
    """A VERSION input over a pipe buffer (64 KiB), under the 1 MiB limit."""
    doc = json.dumps(
        {"cniVersion": "0.4.0", "name": "n", "type": "cni-dra", "pad": "x" * (300 << 10)}
    ).encode()
    assert 64 << 10 < len(doc) < 1 << 20
    return doc


ABSENT = {"CNI_DRA_AGENT_SOCKET": "/nonexistent/cni-dra-test/agent.sock"}
CASES = [
    ({"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "0.4.0"}'),
    ({"CNI_COMMAND": "ADD"}, b'{"cniVersion": "1.0.0", "name": "n", "type": "cni-dra"}'),
    (
        {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": "/nope",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/x",
        },
        b"not json",
    ),
    ({"CNI_COMMAND": "VERSION"}, b"x" * (2 << 20)),  # above the limit: code 6 either way
]


@pytest.mark.parametrize("env,stdin", CASES)
def test_without_agent_the_answer_is_the_python_executables(builds, env, stdin):
    expected = _run(builds.python, {**env, **ABSENT}, stdin)
    assert expected[1]  # the Python executable printed a CNI result or error
    assert _run(builds.real, {**env, **ABSENT}, stdin) == expected


def test_ok_answer_is_printed_exactly_with_its_exit_code(rec, fake_agent):
    agent = fake_agent(lambda frames: encode_frames(b"ok 3", b'{"some": "stdout"}\n'))
    env = {"CNI_COMMAND": "DEL", "CNI_DRA_AGENT_SOCKET": agent.path, "X": "a=b"}
    assert _run(rec.recording, env, b'{"cniVersion": "1.1.0"}', args=("arg1",)) == (
        3,
        b'{"some": "stdout"}\n',
    )
    assert rec.recorded() is None
    ((ident, cwd, env_block, stdin),) = agent.requests
    assert (
        ident == caller_identity() and cwd == os.fsencode(os.getcwd()) and stdin == b'{"cniVersion": "1.1.0"}'
    )
    assert sorted(env_block.split(b"\0")) == sorted(
        f"{k}={v}".encode() for k, v in {**BASE_ENV, **env}.items()
    )


def test_agent_stdout_above_a_pipe_buffer_is_written_whole(rec, fake_agent):
    out = b"y" * (1 << 20)
    agent = fake_agent(lambda frames: encode_frames(b"ok 0", out))
    assert _run(rec.recording, {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": agent.path}) == (0, out)


ANSWERS = {
    "declined": lambda frames: encode_frames(b"declined caller sees another namespace", b""),
    "closed": lambda frames: None,
    "bad magic": lambda frames: b"CNIDRA-FP2\n" + encode_frames(b"ok 0", b"x")[11:],
    "trailing bytes": lambda frames: encode_frames(b"ok 0", b"x") + b"!",
    "truncated": lambda frames: encode_frames(b"ok 0", b"xyz")[:-1],
    "not an int": lambda frames: encode_frames(b"ok zero", b"x"),
    "too large": lambda frames: encode_frames(b"ok 0", b"z" * MAX_MESSAGE_BYTES),
}


# Why each was not served, as CNI_DRA_AGENT_ASKED carries it (the words of client.py's last_refusal).
WHY = {
    "declined": "declined caller sees another namespace",
    "closed": "no whole answer: bad magic",
    "bad magic": "no whole answer: bad magic",
    "trailing bytes": "no whole answer: trailing bytes",
    "truncated": "no whole answer: truncated frame",
    "not an int": "malformed answer",
    "too large": "answer too large",
}


@pytest.mark.parametrize("answer", ANSWERS)
def test_any_answer_but_ok_execs_python_with_identical_input(rec, fake_agent, answer):
    agent = fake_agent(ANSWERS[answer])
    env = {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": agent.path, "CNI_ARGS": "K=V;A=B"}
    stdin = _big_config()
    assert _run(rec.recording, env, stdin, args=("one", "two words")) == (0, b"fallback-ran\n")
    handed = {**BASE_ENV, **env, ENV_ASKED: WHY[answer]}
    assert rec.recorded() == {"argv": [b"one", b"two words"], "env": handed, "stdin": stdin}
    assert agent.connections == 1


@pytest.mark.parametrize("answer", ANSWERS)
def test_the_python_client_words_each_refusal_the_same(fake_agent, answer):
    """What the compiled client hands over is what the Python client would have said."""
    from cni_dra.fastpath import client

    agent = fake_agent(ANSWERS[answer])
    assert client.ask_agent({b"CNI_COMMAND": b"ADD"}, b"{}", agent.path, timeout_s=30) is None
    assert client.last_refusal == WHY[answer]


def test_declined_then_python_answers_in_process(builds, fake_agent):
    agent = fake_agent(ANSWERS["declined"])
    env = {"CNI_COMMAND": "VERSION", "CNI_DRA_AGENT_SOCKET": agent.path}
    stdin = _big_config()
    expected = _run(builds.python, {**env, **ABSENT}, stdin)
    assert json.loads(expected[1])["cniVersion"] == "0.4.0"
    assert _run(builds.real, env, stdin) == expected
    assert agent.connections == 1  # the compiled client only: the Python executable works at once


def test_stdin_is_read_up_to_the_limit_and_passed_on(rec, fake_agent):
    agent = fake_agent(ANSWERS["declined"])
    stdin = bytes(range(256)) * ((2 << 20) // 256)
    _run(rec.recording, {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": agent.path}, stdin)
    assert agent.requests[0][3] == stdin[:STDIN_LIMIT]
    recorded = rec.recorded()
    assert recorded is not None and recorded["stdin"] == stdin[:STDIN_LIMIT]


def test_no_answer_within_the_timeout_execs_python(rec, fake_agent):
    release = threading.Event()

    def stall(frames):
        release.wait(30)
        return encode_frames(b"ok 0", b"late")

    agent = fake_agent(stall)
    try:
        env = {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": agent.path, "CNI_DRA_AGENT_TIMEOUT": "0.3"}
        assert _run(rec.recording, env, b"{}") == (0, b"fallback-ran\n")
    finally:
        release.set()
    recorded = rec.recorded()
    assert recorded is not None and recorded["stdin"] == b"{}"
    assert recorded["env"][ENV_ASKED] == "no whole answer: timed out"


@pytest.mark.parametrize("env", [{}, {"CNI_COMMAND": ""}, {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT": "off"}])
def test_cli_and_agent_off_never_ask_the_agent(rec, fake_agent, env):
    agent = fake_agent(ANSWERS["declined"])
    full = {**env, "CNI_DRA_AGENT_SOCKET": agent.path}
    assert _run(rec.recording, full, b"input", args=("--version",)) == (0, b"fallback-ran\n")
    assert rec.recorded() == {"argv": [b"--version"], "env": {**BASE_ENV, **full}, "stdin": b"input"}
    assert agent.connections == 0


def test_cli_version_runs_the_operator_cli(builds):
    code, out = _run(builds.real, {}, args=("--version",))
    assert code == 0 and out.startswith(b"cni-dra, version ")
    assert (code, out) == _run(builds.python, {}, args=("--version",))


def test_version_on_a_tty_reads_nothing(rec, fake_agent):
    agent = fake_agent(lambda frames: encode_frames(b"ok 0", b"v"))
    primary, secondary = pty.openpty()
    try:
        assert _run(
            rec.recording, {"CNI_COMMAND": "VERSION", "CNI_DRA_AGENT_SOCKET": agent.path}, secondary
        ) == (0, b"v")
    finally:
        os.close(primary)
        os.close(secondary)
    assert agent.requests[0][3] == b""


def test_require_without_agent_fails_with_code_11(builds, tmp_path):
    env = {
        "CNI_COMMAND": "VERSION",
        "CNI_DRA_AGENT": "require",
        "CNI_DRA_AGENT_SOCKET": str(tmp_path / "x.sock"),
    }
    code, out = _run(builds.real, env, b'{"cniVersion": "1.0.0"}')
    doc = json.loads(out)
    assert code == 1 and doc["code"] == 11 and doc["cniVersion"] == "1.0.0"


def test_socket_in_a_directory_others_can_write_is_not_used(rec, fake_agent):
    agent = fake_agent(lambda frames: encode_frames(b"ok 0", b"agent"))
    os.chmod(os.path.dirname(agent.path), 0o770)
    assert _run(rec.recording, {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": agent.path}) == (
        0,
        b"fallback-ran\n",
    )
    assert agent.connections == 0


def test_a_file_that_is_no_socket_is_not_used(rec, tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / "fp.sock").write_text("")
    env = {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": str(d / "fp.sock")}
    assert _run(rec.recording, env) == (0, b"fallback-ran\n")


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another uid")


@root_only
@pytest.mark.parametrize("what", ["socket", "directory"])
def test_socket_or_directory_of_another_uid_is_not_used(rec, fake_agent, what):
    agent = fake_agent(lambda frames: encode_frames(b"ok 0", b"agent"))
    os.chown(agent.path if what == "socket" else os.path.dirname(agent.path), 65534, -1)
    assert _run(rec.recording, {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": agent.path}) == (
        0,
        b"fallback-ran\n",
    )
    assert agent.connections == 0


@root_only
def test_listener_of_another_uid_is_not_used(rec, tmp_path):
    """The socket file is ours but the process behind it is not (SO_PEERCRED): no request sent."""
    open_dir = Path(tempfile.mkdtemp(prefix="cni-dra-shim-"))  # tmp_path is closed to that uid
    os.chmod(open_dir, 0o777)
    answer = encode_frames(b"ok 0", b"agent")  # a valid answer: only SO_PEERCRED stops it
    code = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); print('ready', flush=True)\n"
        "while True:\n c, _ = s.accept()\n while c.recv(1 << 16): pass\n"
        f" c.sendall({answer!r}); c.close()\n"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code, str(open_dir / "fp.sock")], user=65534, stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == b"ready\n"
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        os.rename(open_dir / "fp.sock", private / "fp.sock")
        os.chown(private / "fp.sock", 0, 0)
        env = {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": str(private / "fp.sock")}
        assert _run(rec.recording, env, b"{}") == (0, b"fallback-ran\n")
    finally:
        server.kill()
        server.wait()
        assert server.stdout is not None
        server.stdout.close()
        shutil.rmtree(open_dir)


def test_environment_sent_keeps_the_first_of_duplicate_keys(rec, fake_agent):
    """As os.environb (and getenv): the first ``KEY=`` entry of the process environment wins."""
    agent = fake_agent(lambda frames: encode_frames(b"ok 0", b"ok"))
    envp = [
        b"CNI_COMMAND=ADD",
        b"DUP=first",
        b"DUP=second",
        b"NOEQUALS",
        f"CNI_DRA_AGENT_SOCKET={agent.path}".encode(),
    ]
    code = (
        "import ctypes, sys; libc = ctypes.CDLL(None); arr = lambda xs: (ctypes.c_char_p * (len(xs) + 1))(*xs, None)\n"
        f"libc.execve({rec.recording.encode()!r}, arr([b'cni-dra']), arr({envp!r})); sys.exit(99)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], input=b"", capture_output=True, timeout=60, check=False
    )
    assert (proc.returncode, proc.stdout) == (0, b"ok")
    assert agent.requests[0][2].split(b"\0") == [envp[0], envp[1], envp[4]]


def test_failing_exec_prints_cni_error_json(tmp_path):
    exe = _build(tmp_path / "cni-dra")  # no tree beside it
    code, out = _run(exe, {"CNI_COMMAND": "ADD", **ABSENT}, b"{}")
    doc = json.loads(out)
    assert code == 1 and doc["code"] == 999 and doc["cniVersion"] == "1.1.0"
    assert (
        str(tmp_path / "cni-dra.d" / "lib" / "ld-linux-x86-64.so.2") in doc["msg"]
        and "No such file" in doc["msg"]
    )


def test_the_tree_is_found_beside_the_real_file_of_a_link(rec, tmp_path):
    """A link to the client (e.g. on PATH) runs the tree beside the client's real file."""
    link = tmp_path / "elsewhere" / "cni-dra"
    link.parent.mkdir()
    link.symlink_to(rec.recording)
    assert _run(str(link), {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT": "off"}, b"{}", args=("a",)) == (
        0,
        b"fallback-ran\n",
    )
    recorded = rec.recorded()  # checks the loader's arguments name the tree beside the real file
    assert recorded is not None and recorded["argv"] == [b"a"] and recorded["stdin"] == b"{}"


def test_require_names_why_the_compiled_client_was_not_served(builds, fake_agent):
    """``CNI_DRA_AGENT=require``: the agent is asked once, by the compiled client; the Python
    executable's code 11 names the reason it handed over."""
    agent = fake_agent(ANSWERS["declined"])
    env = {"CNI_COMMAND": "VERSION", "CNI_DRA_AGENT": "require", "CNI_DRA_AGENT_SOCKET": agent.path}
    code, out = _run(builds.real, env, b'{"cniVersion": "1.0.0"}')
    doc = json.loads(out)
    assert code == 1 and doc["code"] == 11 and doc["cniVersion"] == "1.0.0"
    assert "declined caller sees another namespace" in doc["msg"] and agent.path in doc["msg"]
    assert agent.connections == 1


@pytest.fixture(scope="module")
def sanitized(builds, tmp_path_factory) -> Builds:
    """The client built with AddressSanitizer and UndefinedBehaviorSanitizer (each finding
    fails the run), against the same fallbacks as :func:`builds`."""
    d = tmp_path_factory.mktemp("asan")
    probe = subprocess.run(
        [CC, "-fsanitize=address,undefined", "-x", "c", "-o", str(d / "probe"), "-"],
        input="int main(void) { return 0; }\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0 or subprocess.run([str(d / "probe")], check=False).returncode != 0:
        pytest.skip(f"{CC} cannot build or run sanitizer programs here: {probe.stderr.strip()}")
    real, recording = (
        Path(builds.real).parent / "cni-dra-asan",
        Path(builds.recording).parent / "cni-dra-asan",
    )
    return Builds(
        real=_build(real, SANITIZE),
        python=builds.python,
        recording=_build(recording, SANITIZE),
        record_dir=builds.record_dir,
    )


def _run_sanitized(
    exe: str, env: dict[str, str], stdin: bytes = b"", cwd: str | None = None
) -> tuple[int, bytes]:
    proc = subprocess.run(
        [exe],
        input=stdin,
        env={**BASE_ENV, **SANITIZER_ENV, **env},
        capture_output=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )
    for marker in (b"AddressSanitizer", b"LeakSanitizer", b"runtime error", b"UndefinedBehaviorSanitizer"):
        assert marker not in proc.stderr, proc.stderr.decode(errors="replace")
    assert proc.returncode != 86, proc.stderr.decode(errors="replace")
    return proc.returncode, proc.stdout


def test_sanitized_build_relays_a_fake_agents_answers(sanitized, fake_agent):
    small = fake_agent(lambda frames: encode_frames(b"ok 3", b'{"some": "stdout"}\n'))
    env = {"CNI_COMMAND": "DEL", "CNI_DRA_AGENT_SOCKET": small.path}
    assert _run_sanitized(sanitized.recording, env, b'{"cniVersion": "1.1.0"}') == (
        3,
        b'{"some": "stdout"}\n',
    )
    big = fake_agent(lambda frames: encode_frames(b"ok 0", b"y" * (1 << 20)))
    env = {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": big.path}
    assert _run_sanitized(sanitized.recording, env, _big_config()) == (0, b"y" * (1 << 20))
    assert big.requests[0][3] == _big_config()


@pytest.mark.parametrize("answer", ["declined", "truncated", "not an int", "too large"])
def test_sanitized_build_hands_every_refusal_over(sanitized, rec, fake_agent, answer):
    agent = fake_agent(ANSWERS[answer])
    env = {"CNI_COMMAND": "ADD", "CNI_DRA_AGENT_SOCKET": agent.path}
    assert _run_sanitized(sanitized.recording, env, b"{}") == (0, b"fallback-ran\n")
    recorded = rec.recorded()
    assert recorded is not None and recorded["stdin"] == b"{}" and recorded["env"][ENV_ASKED] == WHY[answer]


def test_sanitized_build_against_the_real_agent_and_without_one(sanitized, builds, tmp_path):
    """Served by :func:`start_fastpath` (this process's namespaces and working directory);
    then with the agent gone, answered in-process by the Python executable."""
    from cni_dra.fastpath.server import start_fastpath

    stdin = b'{"cniVersion": "0.4.0"}'
    expected = _run(builds.python, {"CNI_COMMAND": "VERSION", **ABSENT}, stdin)
    assert json.loads(expected[1])["cniVersion"] == "0.4.0"
    server = start_fastpath(str(tmp_path / "agent" / "fp.sock"), warm=False, workers=2)
    try:
        env = {
            "CNI_COMMAND": "VERSION",
            "CNI_DRA_AGENT_SOCKET": server.socket_path,
            "CNI_DRA_AGENT": "require",
        }
        for _ in range(3):
            assert _run_sanitized(sanitized.real, env, stdin, cwd=os.getcwd()) == expected
        assert server.served == 3
    finally:
        server.stop()
    for socket_path in (server.socket_path, ABSENT["CNI_DRA_AGENT_SOCKET"]):
        env = {"CNI_COMMAND": "VERSION", "CNI_DRA_AGENT_SOCKET": socket_path}
        assert _run_sanitized(sanitized.real, env, stdin) == expected
    env = {"CNI_COMMAND": "VERSION", "CNI_DRA_AGENT": "require", **ABSENT}
    code, out = _run_sanitized(sanitized.real, env, stdin)
    assert code == 1 and json.loads(out)["code"] == 11


def test_sanitized_build_without_a_tree(tmp_path):
    exe = _build(tmp_path / "cni-dra", SANITIZE)
    code, out = _run_sanitized(exe, {"CNI_COMMAND": "ADD", **ABSENT}, b"{}")
    doc = json.loads(out)
    assert code == 1 and doc["code"] == 999 and "No such file" in doc["msg"]
