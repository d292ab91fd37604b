"""The Python client: hand one CNI invocation to the resident agent.

The compiled client (``scripts/cni-dra-client.c``) is what ``/opt/cni/bin/cni-dra`` runs;
this module is the same client for an install without a C compiler, where the Python
executable itself is the plugin (:func:`cni_dra.main.main` calls :func:`ask_agent` unless
the compiled client already asked). Both speak :mod:`cni_dra.fastpath.wire` and make the
same checks:

1. the socket file is a socket owned by our effective uid, in a directory only we may
   write (else: not served, nothing sent);
2. the listening process runs as our effective uid (``SO_PEERCRED``);
3. the request goes out whole, then our half of the connection is closed; the answer must
   arrive whole (at most :data:`~cni_dra.fastpath.wire.MAX_MESSAGE_BYTES`) within the
   timeout, and be ``ok <int>``.

Anything else (no socket, refused, wrong owner, ``declined`` (the agent sees another mount
or network namespace, root or working directory than we do), no whole answer in time, a
broken connection) means "not served": the caller runs the invocation in-process, the same
:func:`cni_dra.cni.run` on the same input under the same state lock. Correctness never
depends on the agent; an ADD the agent had started is seen in the state by the in-process
run (it answers the recorded result or "try again later", code 11).

It imports only C-level standard modules (``_socket``, ``os``), so an invocation served by
the agent costs about one bare interpreter start-up instead of ~350 ms of pyroute2/pydantic
imports.
"""

from __future__ import annotations

import os

from cni_dra.fastpath.wire import (
    CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    MAX_MESSAGE_BYTES,
    RESPONSE_FRAMES,
    STATUS_OK,
    caller_identity,
    decode_frames,
    encode_environment,
    encode_frames,
)

__all__ = ["ask_agent", "last_refusal"]


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
            caller_identity(), os.fsencode(os.getcwd()), encode_environment(environ), stdin
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
        status, stdout = decode_frames(b"".join(chunks), RESPONSE_FRAMES)
    except (OSError, ValueError) as exc:
        last_refusal = f"no whole answer: {exc or type(exc).__name__}"
        return None
    finally:
        sock.close()
    word, _, rest = status.partition(b" ")
    if word != STATUS_OK:
        last_refusal = status.decode(errors="replace")  # "declined <reason>"
        return None
    try:
        return int(rest), stdout
    except ValueError:
        last_refusal = "malformed answer"
        return None
