"""The thin plugin client: hand one CNI invocation to the resident agent, else run it here.

This module is what ``/opt/cni/bin/cni-dra`` imports first (the interpreter runs with
``-I -S``: no ``site``, no third-party packages). It imports only C-level standard modules
(``_socket``, ``os``), so a plugin invocation served by the agent costs about one bare
interpreter start-up instead of ~350 ms of pyroute2/pydantic imports.

Flow of :func:`main` for a CNI invocation (``CNI_COMMAND`` set; CNI spec 1.1.0 section 2):

1. read stdin whole;
2. unless ``CNI_DRA_AGENT=off`` (always in-process; ``require``: never in-process, an
   unanswered invocation fails with code 11 — for tests and diagnosis): connect to the agent socket (``CNI_DRA_AGENT_SOCKET``,
   default :data:`DEFAULT_SOCKET`), checking that the socket file and the listening process
   belong to our effective uid (``SO_PEERCRED``); send the request (see "Wire format"); read
   the answer;
3. the agent answers ``ok <exit code>`` and the plugin's stdout: print it, exit with that code;
4. anything else — no socket, refused, wrong owner, ``declined`` (the agent sees another
   mount or network namespace, root or working directory than we do), no full answer within
   ``CNI_DRA_AGENT_TIMEOUT`` seconds (default :data:`DEFAULT_TIMEOUT_S`), a broken connection
   — and the invocation runs in-process (:func:`run_local`): the same
   :func:`cni_dra.cni.run` on the same input, under the same state lock. Correctness never
   depends on the agent; an ADD the agent had started is seen in the state by the local run
   (it answers the recorded result or "try again later", code 11).

Wire format (version 1, one request per connection, both directions)::

    request  = MAGIC frame(identity) frame(cwd) frame(environment) frame(stdin)   then EOF
    response = MAGIC frame(status) frame(stdout)                                   then EOF
    frame(x) = 4-byte big-endian length of x, then x

``identity`` is ASCII ``mnt=DEV:INO net=DEV:INO root=DEV:INO`` (the caller's mount and
network namespaces and root directory); ``environment`` is ``KEY=VALUE`` byte strings joined
by NUL; ``status`` is ``ok <int>`` or ``declined <reason>``.
"""

from __future__ import annotations

import os

__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_TIMEOUT_S",
    "MAGIC",
    "MAX_MESSAGE_BYTES",
    "caller_identity",
    "encode_frames",
    "decode_frames",
    "ask_agent",
    "run_local",
    "main",
]

DEFAULT_SOCKET = "/run/cni-dra/agent.sock"
"""Where ``cni-dra agent`` listens unless ``CNI_DRA_AGENT_SOCKET`` says otherwise."""

DEFAULT_TIMEOUT_S = 60.0
"""Longest wait (seconds) for the agent's whole answer before running in-process."""

CONNECT_TIMEOUT_S = 2.0
"""Longest wait (seconds) to connect to the agent socket."""

MAGIC = b"CNIDRA-FP1\n"
"""First bytes of every request and response (protocol version 1)."""

MAX_MESSAGE_BYTES = 16 << 20
"""Largest request or response either side accepts (bytes)."""


def _ident(path: str) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def caller_identity() -> bytes:
    """``mnt=DEV:INO net=DEV:INO root=DEV:INO`` of the calling thread (raises OSError).

    Two processes with equal identities and working directories resolve every path (netns
    files, state directory, inventory, IPAM data) to the same objects.
    """
    return (
        f"mnt={_ident('/proc/thread-self/ns/mnt')} net={_ident('/proc/thread-self/ns/net')} "
        f"root={_ident('/')}"
    ).encode()


def encode_frames(*parts: bytes) -> bytes:
    """``MAGIC`` followed by each part as a length-prefixed frame."""
    out = [MAGIC]
    for part in parts:
        out.append(len(part).to_bytes(4, "big"))
        out.append(part)
    return b"".join(out)


def decode_frames(data: bytes, count: int) -> list[bytes]:
    """Inverse of :func:`encode_frames` for exactly ``count`` frames; ValueError otherwise."""
    if not data.startswith(MAGIC):
        raise ValueError("bad magic")
    pos, parts = len(MAGIC), []
    for _ in range(count):
        if pos + 4 > len(data):
            raise ValueError("truncated frame header")
        size = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        if pos + size > len(data):
            raise ValueError("truncated frame")
        parts.append(data[pos : pos + size])
        pos += size
    if pos != len(data):
        raise ValueError("trailing bytes")
    return parts


def _socket_is_ours(path: str) -> bool:
    """The socket file is a socket owned by our euid in a directory only we may write."""
    try:
        st = os.lstat(path)
        dst = os.stat(os.path.dirname(path) or ".")
    except OSError:
        return False
    euid = os.geteuid()
    return (
        (st.st_mode & 0o170000) == 0o140000
        and st.st_uid == euid
        and dst.st_uid == euid
        and not dst.st_mode & 0o022
    )


last_refusal = ""
"""Why the last :func:`ask_agent` call returned None (for the ``require`` error message)."""


def ask_agent(
    environ: dict[bytes, bytes], stdin: bytes, socket_path: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[int, bytes] | None:
    """Send one invocation to the agent at ``socket_path``.

    ``environ``: the plugin's environment (bytes to bytes); ``stdin``: its stdin bytes.
    Returns ``(exit code, stdout bytes)`` when the agent ran it, or None when it did not
    (absent, not ours, declined, no full answer in ``timeout_s`` seconds). Never raises
    for agent trouble: None means "run it in-process".
    """
    import _socket

    global last_refusal
    last_refusal = "no socket we trust there (absent, or not owned by us in a directory only we can write)"
    if not _socket_is_ours(socket_path):
        return None
    try:
        request = encode_frames(
            caller_identity(),
            os.fsencode(os.getcwd()),
            b"\0".join(k + b"=" + v for k, v in environ.items()),
            stdin,
        )
    except OSError as exc:
        last_refusal = f"cannot describe the caller: {exc}"
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(socket_path)
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
        if int.from_bytes(cred[4:8], "little", signed=True) != os.geteuid():
            last_refusal = "the listener runs as another uid"
            return None
        sock.settimeout(timeout_s)
        sock.sendall(request)
        sock.shutdown(_socket.SHUT_WR)
        chunks, size = [], 0
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_MESSAGE_BYTES:
                last_refusal = "answer too large"
                return None
            chunks.append(chunk)
        status, stdout = decode_frames(b"".join(chunks), 2)
    except (OSError, ValueError) as exc:
        last_refusal = f"no whole answer: {exc or type(exc).__name__}"
        return None
    finally:
        sock.close()
    word, _, rest = status.partition(b" ")
    if word != b"ok":
        last_refusal = status.decode(errors="replace")  # "declined <reason>"
        return None
    try:
        return int(rest), stdout
    except ValueError:
        last_refusal = "malformed answer"
        return None


def _read_fd(fd: int, limit: int = (1 << 20) + 1) -> bytes:
    chunks, size = [], 0
    while size < limit:  # past MAX_CONFIG_BYTES the config is refused (code 6): stop reading
        chunk = os.read(fd, min(1 << 16, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_local(stdin: bytes) -> int:
    """Run the invocation in this process (full imports): :func:`cni_dra.cni.main` on ``stdin``.

    Loads ``site`` first (the executable starts without it). If cni-dra itself cannot be
    imported, prints CNI error JSON (code 999) naming the cause and returns 1.
    """
    import site
    import sys

    site.main()
    try:
        from cni_dra.cni import main as cni_main
    except Exception as exc:  # a broken install must still answer a runtime in CNI's error shape
        import json

        try:
            version = json.loads(stdin).get("cniVersion", "1.1.0")
        except Exception:  # noqa: BLE001 - any undecodable input
            version = "1.1.0"
        print(json.dumps({
            "cniVersion": version,
            "code": 999,
            "msg": f"failed to load cni-dra from {sys.executable}: {type(exc).__name__}",
            "details": str(exc),
        }))
        return 1
    return cni_main(stdin=stdin)


def main() -> int | None:
    """Entry of the ``cni-dra`` executable for a CNI invocation; returns the exit code.

    Returns None without ``CNI_COMMAND``: not a plugin invocation (the executable then runs
    the operator CLI). With it: the agent when it answers, else in-process (module docstring).
    """
    environ = os.environb
    command = environ.get(b"CNI_COMMAND")
    if not command:
        return None
    stdin = b"" if command == b"VERSION" and os.isatty(0) else _read_fd(0)
    mode = environ.get(b"CNI_DRA_AGENT", b"")
    if mode != b"off":
        path = os.fsdecode(environ.get(b"CNI_DRA_AGENT_SOCKET", b"") or DEFAULT_SOCKET)
        try:
            timeout_s = float(environ.get(b"CNI_DRA_AGENT_TIMEOUT", b"") or DEFAULT_TIMEOUT_S)
        except ValueError:
            timeout_s = DEFAULT_TIMEOUT_S
        answer = ask_agent(dict(environ), stdin, path, timeout_s)
        if answer is not None:
            code, stdout = answer
            _write_fd(1, stdout)
            return code
        if mode == b"require":
            return _agent_required_error(stdin, path)
    return run_local(stdin)


def _agent_required_error(stdin: bytes, path: str) -> int:
    """``CNI_DRA_AGENT=require`` and the agent did not serve: CNI error code 11, exit 1."""
    import json

    try:
        version = json.loads(stdin).get("cniVersion", "1.1.0")
    except Exception:  # noqa: BLE001 - any undecodable input
        version = "1.1.0"
    _write_fd(1, json.dumps({
        "cniVersion": version,
        "code": 11,
        "msg": f"failed to reach cni-dra agent at {path}: {last_refusal or 'absent, declined or no answer'} "
        "(CNI_DRA_AGENT=require forbids running in-process)",
    }).encode())
    return 1
