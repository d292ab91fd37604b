"""The fast path's listening socket: bound by the agent (:func:`bind_listener`), or handed
over by systemd (socket activation, ``sd_listen_fds(3)``; :func:`take_listener`).

A ``.socket`` unit (``conf/systemd/cni-dra-agent.socket``) owns ``/run/cni-dra/agent.sock``:
systemd creates it at boot with its mode and directory, queues the connections that
arrive before the agent runs, and starts ``cni-dra-agent.service`` on the first one. The
service receives the listening socket as an inherited file descriptor, described by three
environment variables (the protocol ``sd_listen_fds`` implements; ``systemd-socket-activate``
speaks it too):

* ``LISTEN_PID``: the process the descriptors are meant for; any other process (a child
  that inherited the environment) ignores them;
* ``LISTEN_FDS``: how many, numbered from :data:`SD_LISTEN_FDS_START` (3) on;
* ``LISTEN_FDNAMES``: optional, their names separated by ``:`` (``FileDescriptorName=``).

:func:`listen_fds` reads them once, marks the descriptors close-on-exec and removes the
variables (so neither the fast path's worker processes nor the IPAM plugins the agent runs
see them); :func:`take_listener` picks the fast-path socket among them: the one named
:data:`FDNAME` if any is, else the one bound to the configured path. The socket file
belongs to systemd: the agent checks that it is a socket group and others cannot connect
to (not writable by them) in a directory closed to them, serves on it, and leaves it
in place when it stops, so the next connection starts the agent again.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass

__all__ = ["FDNAME", "SD_LISTEN_FDS_START", "InheritedFd", "bind_listener", "listen_fds", "take_listener"]

SD_LISTEN_FDS_START = 3
"""The first inherited descriptor (``SD_LISTEN_FDS_START`` in ``sd-daemon.h``)."""

FDNAME = "fastpath"
"""``FileDescriptorName=`` of the fast-path socket in ``cni-dra-agent.socket``."""

_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


@dataclass(frozen=True)
class InheritedFd:
    """One descriptor passed by systemd: its number and its name (``unknown`` when unnamed,
    as ``sd_listen_fds_with_names`` says)."""

    fd: int
    name: str


def listen_fds(
    environ: MutableMapping[str, str] | None = None, *, pid: int | None = None, unset_environment: bool = True
) -> list[InheritedFd]:
    """The descriptors passed to this process (``pid``, default ``os.getpid()``) by the
    socket-activation protocol, in order; empty when none were, or when they were meant for
    another process.

    Each is made close-on-exec. With ``unset_environment`` the three variables are removed
    from ``environ`` (default ``os.environ``) whatever their content. Raises ``ValueError``
    when ``LISTEN_PID`` or ``LISTEN_FDS`` is not a number, or ``LISTEN_FDNAMES`` names
    another count of descriptors; ``OSError`` when a descriptor is not open.
    """
    env = os.environ if environ is None else environ
    try:
        return _listen_fds(env, os.getpid() if pid is None else pid)
    finally:
        if unset_environment:
            for name in _VARIABLES:
                env.pop(name, None)


def _listen_fds(env: MutableMapping[str, str], pid: int) -> list[InheritedFd]:
    listen_pid, count = env.get("LISTEN_PID", ""), env.get("LISTEN_FDS", "")
    if not listen_pid or not count:
        return []
    try:
        target, n = int(listen_pid), int(count)
    except ValueError:
        raise ValueError(
            f"failed to read the socket-activation environment: LISTEN_PID={listen_pid!r} "
            f"LISTEN_FDS={count!r} are not numbers"
        ) from None
    if target != pid or n <= 0:
        return []
    names_var = env.get("LISTEN_FDNAMES")
    names = names_var.split(":") if names_var is not None else ["unknown"] * n
    if len(names) != n:
        raise ValueError(
            f"failed to read the socket-activation environment: LISTEN_FDNAMES={names_var!r} "
            f"names {len(names)} descriptors, LISTEN_FDS={n}"
        )
    fds = []
    for i, name in enumerate(names):
        fd = SD_LISTEN_FDS_START + i
        flags = fcntl.fcntl(fd, fcntl.F_GETFD)  # OSError (EBADF) when it is not open
        fcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)
        fds.append(InheritedFd(fd, name or "unknown"))
    return fds


def take_listener(socket_path: str, fds: list[InheritedFd] | None = None) -> socket.socket | None:
    """The fast-path listening socket among the inherited descriptors (``fds``, default
    :func:`listen_fds`), or None when none were passed (then the agent binds its own).

    The one named :data:`FDNAME` when a descriptor has that name, else the unix stream
    socket bound to ``socket_path``; either must be a listening unix stream socket bound to
    ``socket_path``. Raises ``OSError`` when descriptors were passed but none is that
    socket (the unit and ``--fastpath-socket`` disagree: binding our own would replace
    systemd's socket file), ``PermissionError`` when the socket file or its directory is
    open to group or others or owned by another user.
    """
    inherited = listen_fds() if fds is None else fds
    if not inherited:
        return None
    want = os.path.abspath(socket_path)
    named = [f for f in inherited if f.name == FDNAME]
    seen: list[str] = []
    for f in named or inherited:
        sock = socket.socket(fileno=os.dup(f.fd))  # ours to close; systemd keeps the original
        bound = _describe(sock)
        if bound == want:
            try:
                _check_file(want)
            except OSError:
                sock.close()
                raise
            sock.set_inheritable(False)
            return sock
        sock.close()
        seen.append(f"fd {f.fd} ({f.name}): {bound}")
    raise OSError(
        f"failed to take the fast-path socket from systemd: none of the sockets passed is a listening "
        f"unix stream socket bound to {want} ({'; '.join(seen)})"
    )


def _describe(sock: socket.socket) -> str:
    """The path a listening unix stream socket is bound to, else what it is instead."""
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        return f"not a unix stream socket (family {sock.family!r}, type {sock.type!r})"
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return "not listening"
    name = sock.getsockname()
    if not isinstance(name, str) or not name:
        return f"bound to {name!r}"
    return name


def _check_file(path: str) -> None:
    """The socket file ours and nobody else's to connect to (connecting needs write
    permission: 0600 or 0644 both do), its directory ours and closed to others."""
    uid = os.geteuid()
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        raise PermissionError(
            f"failed to take the fast-path socket from systemd: {path} must be a socket owned by "
            f"uid {uid} that group and others cannot write (mode {stat.S_IMODE(st.st_mode):o}, "
            f"uid {st.st_uid}; SocketMode=0600 in the .socket unit)"
        )
    directory = os.path.dirname(path)
    dst = os.stat(directory)
    if dst.st_uid != uid or dst.st_mode & 0o077:
        raise PermissionError(
            f"failed to take the fast-path socket from systemd: directory {directory} must be owned "
            f"by uid {uid} and closed to group and others (mode {stat.S_IMODE(dst.st_mode):o}; "
            f"DirectoryMode=0700 in the .socket unit)"
        )


def bind_listener(socket_path: str) -> socket.socket:
    """A listening unix socket at ``socket_path`` (absolute), 0600, in a directory created
    0700; a stale socket file there is replaced. Raises ``PermissionError`` when an existing
    directory is not ours or is open to group or others, ``OSError`` when binding fails."""
    _prepare_dir(os.path.dirname(socket_path))
    try:
        if stat.S_ISSOCK(os.lstat(socket_path).st_mode):
            os.unlink(socket_path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(socket_path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    os.chmod(socket_path, 0o600)
    sock.listen(1024)
    return sock


def _prepare_dir(directory: str) -> None:
    """Create ``directory`` 0700, or check an existing one: ours and not open to others."""
    try:
        os.mkdir(directory, 0o700)
        return
    except FileExistsError:
        pass
    st = os.stat(directory)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"failed to start fastpath: directory {directory} must be owned by uid {os.geteuid()} "
            f"and closed to group and others (mode {stat.S_IMODE(st.st_mode):o})"
        )
