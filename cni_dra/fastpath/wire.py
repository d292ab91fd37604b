"""The fast path's wire format and client interface: the one definition both clients follow.

Two programs speak it: the Python client (:mod:`cni_dra.fastpath.client`) and the compiled
client ``scripts/cni-dra-client.c``, whose ``#define`` s repeat the constants below;
``tests/test_client_wire.py`` compiles that file and checks every one of them against this
module, so the two cannot drift apart silently. Change a value here and there together,
and bump :data:`VERSION` when the framing changes.

Framing (one request per connection, both directions; the sender half-closes after it)::

    request  = MAGIC frame(identity) frame(cwd) frame(environment) frame(stdin)   then EOF
    response = MAGIC frame(status) frame(stdout)                                   then EOF
    frame(x) = FRAME_HEADER_BYTES-byte big-endian length of x, then x

* ``identity``: ASCII ``mnt=DEV:INO net=DEV:INO root=DEV:INO``, the caller's mount and
  network namespaces and root directory (:func:`caller_identity`);
* ``cwd``: the caller's working directory (bytes);
* ``environment``: the caller's ``KEY=VALUE`` entries joined by NUL; of duplicate keys the
  first wins, entries without ``=`` are left out (as ``os.environb`` and ``getenv``);
* ``stdin``: what the caller read from stdin, at most :data:`STDIN_LIMIT_BYTES`;
* ``status``: ``ok <exit code>`` (:data:`STATUS_OK`; the agent ran the invocation, print
  ``stdout`` and exit with that code) or ``declined <reason>`` (:data:`STATUS_DECLINED`;
  run it in-process).

Neither side accepts a message above :data:`MAX_MESSAGE_BYTES`. Anything else (a closed
connection, bad magic, a short or padded message, a status that is neither) counts as "not
served": the client runs the invocation in-process.

The client's environment (read by both clients): :data:`ENV_MODE` (``off``: never ask the
agent; ``require``: never run in-process), :data:`ENV_SOCKET` (default
:data:`DEFAULT_SOCKET`), :data:`ENV_TIMEOUT` (seconds, default :data:`DEFAULT_TIMEOUT_S`).
The handoff from the compiled client to the Python executable: when the compiled client
asked the agent and was not served, it execs the Python executable with
:data:`ENV_ASKED` set to why (the same argv, environment otherwise, and stdin); the Python
entry removes the variable and works in-process without asking again
(:func:`cni_dra.main.main`).

Standard library only, C-level modules only: the thin client imports it before anything.
"""

from __future__ import annotations

import os

__all__ = [
    "VERSION",
    "MAGIC",
    "FRAME_HEADER_BYTES",
    "REQUEST_FRAMES",
    "RESPONSE_FRAMES",
    "MAX_MESSAGE_BYTES",
    "STDIN_LIMIT_BYTES",
    "STATUS_OK",
    "STATUS_DECLINED",
    "DEFAULT_SOCKET",
    "DEFAULT_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "ENV_MODE",
    "ENV_SOCKET",
    "ENV_TIMEOUT",
    "ENV_ASKED",
    "caller_identity",
    "encode_frames",
    "decode_frames",
    "encode_environment",
    "decode_environment",
]

VERSION = 1
"""Protocol version; part of :data:`MAGIC`."""

MAGIC = b"CNIDRA-FP%d\n" % VERSION
"""First bytes of every request and response."""

FRAME_HEADER_BYTES = 4
"""Size of a frame's length prefix (big-endian, unsigned)."""

REQUEST_FRAMES = 4
"""Frames of a request: identity, cwd, environment, stdin."""

RESPONSE_FRAMES = 2
"""Frames of a response: status, stdout."""

MAX_MESSAGE_BYTES = 16 << 20
"""Largest request or response either side accepts (bytes)."""

STDIN_LIMIT_BYTES = (1 << 20) + 1
"""Most stdin bytes a client reads: ``MAX_CONFIG_BYTES + 1`` (:mod:`cni_dra.protocol.config`),
enough to refuse a larger config (code 6) without reading it all."""

STATUS_OK = b"ok"
"""Status word: the agent ran the invocation; ``ok <exit code>``."""

STATUS_DECLINED = b"declined"
"""Status word: the agent did not run it; ``declined <reason>``."""

DEFAULT_SOCKET = "/run/cni-dra/agent.sock"
"""Where ``cni-dra agent`` listens and the clients look unless :data:`ENV_SOCKET` says otherwise."""

DEFAULT_TIMEOUT_S = 60.0
"""Longest wait (seconds) for the agent's whole answer before running in-process."""

CONNECT_TIMEOUT_S = 2.0
"""Longest wait (seconds) to connect to the agent socket."""

ENV_MODE = "CNI_DRA_AGENT"
"""``off``: always in-process; ``require``: never in-process (code 11 when not served)."""

ENV_SOCKET = "CNI_DRA_AGENT_SOCKET"
"""The agent socket's path."""

ENV_TIMEOUT = "CNI_DRA_AGENT_TIMEOUT"
"""Seconds to wait for the agent's whole answer."""

ENV_ASKED = "CNI_DRA_AGENT_ASKED"
"""Set by the compiled client on the Python executable it execs after the agent did not
serve: why not (for the ``require`` error). Its presence means "do not ask again"."""


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
    """:data:`MAGIC` followed by each part as a length-prefixed frame.

    Raises ValueError for a part too large for its length prefix.
    """
    out = [MAGIC]
    for part in parts:
        out.append(len(part).to_bytes(FRAME_HEADER_BYTES, "big"))
        out.append(part)
    return b"".join(out)


def decode_frames(data: bytes, count: int) -> list[bytes]:
    """Inverse of :func:`encode_frames` for exactly ``count`` frames.

    Raises ValueError (``bad magic``, ``truncated frame header``, ``truncated frame``,
    ``trailing bytes``) for anything else.
    """
    if not data.startswith(MAGIC):
        raise ValueError("bad magic")
    pos, parts = len(MAGIC), []
    for _ in range(count):
        if pos + FRAME_HEADER_BYTES > len(data):
            raise ValueError("truncated frame header")
        size = int.from_bytes(data[pos : pos + FRAME_HEADER_BYTES], "big")
        pos += FRAME_HEADER_BYTES
        if pos + size > len(data):
            raise ValueError("truncated frame")
        parts.append(data[pos : pos + size])
        pos += size
    if pos != len(data):
        raise ValueError("trailing bytes")
    return parts


def encode_environment(environ: dict[bytes, bytes]) -> bytes:
    """The ``environment`` frame: ``KEY=VALUE`` entries joined by NUL."""
    return b"\0".join(k + b"=" + v for k, v in environ.items())


def decode_environment(block: bytes) -> dict[str, str]:
    """Inverse of :func:`encode_environment`, decoded as ``os.environ`` decodes.

    Raises ValueError for an entry without ``=``.
    """
    environ = {}
    for item in block.split(b"\0") if block else []:
        key, sep, value = item.partition(b"=")
        if not sep:
            raise ValueError("environment entry without '='")
        environ[os.fsdecode(key)] = os.fsdecode(value)
    return environ
