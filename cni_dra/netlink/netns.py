"""Network namespace identity and the scoped "do this in that netns" switch.

Identity: a network namespace is its nsfs inode, ``(st_dev, st_ino)`` from
``stat(2)`` of a path that refers to it (``/var/run/netns/NAME``,
``/proc/PID/ns/net``, a bind mount made by a container runtime). Two paths name
the same namespace exactly when their identities are equal (:func:`same_netns`,
which every verb and repair use: ``/run/netns/x`` and ``/var/run/netns/x`` are one
namespace); different path strings are never taken for different namespaces.

Switching: :func:`in_netns` moves *the calling thread* into a namespace with
``setns(2)`` and always moves it back. If it cannot move back it writes a
message to stderr and ends the process with ``os._exit`` (status
:data:`EXIT_WRONG_NETNS`): continuing in the wrong namespace could create or
delete host links in a container or the other way round. This mirrors the
reference plugins' ``ns.Do`` (containernetworking/plugins ``pkg/ns``).

This module uses only the standard library (``ctypes`` for ``setns`` on Python
< 3.12), so asking about namespaces does not pay for importing pyroute2.

Errors (CNI spec 1.1.0 "Error", well-known codes):

* a path that does not exist (missing, or a component of it is not a directory):
  :class:`~cni_dra.errors.ContainerUnknownError` (code 3, "container unknown or does
  not exist");
* a path that exists but is not a network namespace (a plain file left after
  the namespace was unmounted, a directory, a mount namespace...):
  :class:`~cni_dra.errors.InvalidEnvironmentError` (code 4, CNI_NETNS invalid);
* any other ``OSError`` (permissions, ``setns`` refused):
  :class:`~cni_dra.errors.InvalidEnvironmentError` when entering,
  :class:`~cni_dra.errors.IOFailureError` (code 5) when only reading.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from cni_dra.errors import CniError, ContainerUnknownError, InvalidEnvironmentError, IOFailureError

if TYPE_CHECKING:
    import ctypes  # imported at run time only where os.setns is missing

__all__ = [
    "EXIT_WRONG_NETNS",
    "NetnsIdentity",
    "netns_identity",
    "netns_identity_or_none",
    "netns_lookup",
    "find_netns",
    "NETNS_DIR",
    "same_netns",
    "host_netns_identity",
    "current_netns_identity",
    "is_host_netns",
    "netns_exists",
    "open_netns",
    "in_netns",
    "in_netns_fd",
    "new_netns",
    "pin_table",
    "entered_handle",
    "set_entered_handle",
]

NetnsIdentity = tuple[int, int]
"""``(st_dev, st_ino)`` of a network namespace's nsfs inode."""

EXIT_WRONG_NETNS = 70
"""Process exit status when a thread cannot be moved back to its namespace (EX_SOFTWARE)."""

CLONE_NEWNET = 0x40000000
# ioctl(2) on an nsfs file descriptor: returns the CLONE_NEW* type of the namespace.
# _IO(0xb7, 0x3) from <linux/nsfs.h>.
_NS_GET_NSTYPE = 0xB703
_THREAD_SELF_NET = "/proc/thread-self/ns/net"

_local = threading.local()
_host_identity: NetnsIdentity | None = None
_host_lock = threading.Lock()


def _setns(fd: int) -> None:
    """``setns(fd, CLONE_NEWNET)`` for the calling thread; raises ``OSError``."""
    if hasattr(os, "setns"):  # Python >= 3.12
        os.setns(fd, CLONE_NEWNET)
        return
    libc = _libc()
    if libc.setns(fd, CLONE_NEWNET) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _unshare_net() -> None:
    """``unshare(CLONE_NEWNET)`` for the calling thread; raises ``OSError``."""
    if hasattr(os, "unshare"):  # Python >= 3.12
        os.unshare(CLONE_NEWNET)
        return
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def new_netns() -> int:
    """A new, empty network namespace (only ``lo``, down), as an ``O_CLOEXEC`` file
    descriptor the caller must ``os.close``: the namespace and what was made in it go
    with its last reference (this descriptor, sockets opened inside), nothing is mounted.

    A helper thread unshares and ends there; the calling thread stays where it is. Enter
    the namespace with :func:`in_netns_fd`, or name it ``/proc/self/fd/<fd>``.
    Raises :class:`IOFailureError` (code 5) when the kernel refuses (no privilege).
    """
    made: list[int] = []
    failed: list[OSError] = []

    def unshare() -> None:
        try:
            _unshare_net()
            made.append(os.open(_THREAD_SELF_NET, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=unshare, name="cni-dra-new-netns", daemon=True)
    thread.start()
    thread.join()
    if failed or not made:
        exc = failed[0] if failed else OSError("no namespace")
        raise IOFailureError(
            f"failed to create a network namespace: {exc.strerror or exc}", details=str(exc)
        ) from exc
    return made[0]


def _check_is_netns(fd: int, path: str) -> None:
    """Raise InvalidEnvironmentError unless ``fd`` refers to a network namespace."""
    import fcntl

    try:
        nstype = fcntl.ioctl(fd, _NS_GET_NSTYPE)
    except OSError as exc:
        # ENOTTY: not an nsfs file (plain file, directory, unmounted mountpoint).
        raise InvalidEnvironmentError(
            f"failed to open netns {path}: not a network namespace",
            details=str(exc),
        ) from exc
    if nstype != CLONE_NEWNET:
        raise InvalidEnvironmentError(
            f"failed to open netns {path}: namespace type {nstype:#x} is not a network namespace",
        )


def open_netns(path: str) -> int:
    """Open ``path`` read-only and check that it is a network namespace.

    Returns an ``O_CLOEXEC`` file descriptor the caller must ``os.close``; it keeps
    the namespace alive while open and can be passed as ``IFLA_NET_NS_FD``.

    Raises :class:`ContainerUnknownError` (code 3) if ``path`` does not exist (also when
    a component of it is not a directory: ``/etc/passwd/x`` names nothing),
    :class:`InvalidEnvironmentError` (code 4) if it is not a network namespace or
    cannot be opened (permission, a symlink loop, a name too long...).

    While a handle of ``path`` is pinned by the calling thread
    (:class:`cni_dra.netlink.handle.NetnsHandle`), the answer is a duplicate of its
    descriptor: the path is not opened again.
    """
    pinned = _pinned_handle(path)
    if pinned is not None:
        return os.dup(pinned.fd())
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise ContainerUnknownError(f"failed to open netns {path}: no such file", details=str(exc)) from exc
    except NotADirectoryError as exc:
        raise ContainerUnknownError(
            f"failed to open netns {path}: no such file (a component of the path is not a directory)",
            details=str(exc),
        ) from exc
    except OSError as exc:
        raise InvalidEnvironmentError(
            f"failed to open netns {path}: {exc.strerror}", details=str(exc)
        ) from exc
    try:
        _check_is_netns(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def netns_identity(path: str) -> NetnsIdentity:
    """Identity ``(st_dev, st_ino)`` of the network namespace at ``path``.

    Raises :class:`ContainerUnknownError` (code 3) when ``path`` does not exist and
    :class:`InvalidEnvironmentError` (code 4) when it exists but is not a network
    namespace.
    """
    fd = open_netns(path)
    try:
        st = os.fstat(fd)
    except OSError as exc:  # pragma: no cover - fstat on an open fd does not fail in practice
        raise IOFailureError(f"failed to stat netns {path}: {exc.strerror}", details=str(exc)) from exc
    finally:
        os.close(fd)
    return (st.st_dev, st.st_ino)


def netns_identity_or_none(path: str) -> NetnsIdentity | None:
    """:func:`netns_identity` of ``path``, or None when it names no network namespace now
    (gone, not a namespace, unreadable): for comparisons, where such a path matches nothing."""
    try:
        return netns_identity(path)
    except CniError:
        return None


def same_netns(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name the same network namespace, by identity:
    ``/run/netns/x``, ``/var/run/netns/x`` (``/var/run`` is a symlink to ``/run``) and a
    runtime's bind mount of it are one namespace. Equal strings are the same without a look
    (so a path that no longer resolves still matches itself); otherwise a path that names
    no namespace matches nothing. Costs one open and ``fstat`` per path, no netlink."""
    if a == b:
        return True
    if not a or not b:
        return False
    ident = netns_identity_or_none(a)
    return ident is not None and ident == netns_identity_or_none(b)


def netns_lookup(path: str) -> NetnsIdentity | None:
    """Identity of the network namespace at ``path``, or None when the path names nothing
    now: it does not exist (a component of it is not a directory included), or it is the
    plain empty file left once the namespace was unmounted from ``/var/run/netns/NAME``
    (DEL must succeed then, CNI spec 1.1.0 "DEL"). Costs an open, an ioctl and an ``fstat``.

    Raises :class:`InvalidEnvironmentError` (code 4) when ``path`` names something that is
    not a network namespace (a directory, a file with content, another kind of namespace)
    or cannot be looked at (permission denied, a symlink loop, a name too long): no
    verb can tell whether a namespace lives there, so none acts on it. Never raises
    another exception for any path.
    """
    try:
        return netns_identity(path)
    except ContainerUnknownError:
        return None
    except InvalidEnvironmentError as invalid:
        if _unmounted(path):
            return None
        raise invalid


def _unmounted(path: str) -> bool:
    """Whether ``path``, which is no network namespace, is what an unmounted one leaves: a
    plain empty file, not an nsfs inode (those look alike to ``stat``: a namespace of another
    kind is not "gone"), or nothing any more."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != 0:
            return False
        try:
            fcntl.ioctl(fd, _NS_GET_NSTYPE)
        except OSError:
            return True  # not nsfs: the file the namespace was mounted on
        return False
    finally:
        os.close(fd)


NETNS_DIR = "/var/run/netns"
"""Where ``ip netns`` and the container runtimes (containerd, CRI-O) name pod namespaces."""


def find_netns(ident: NetnsIdentity, directory: str = NETNS_DIR) -> str | None:
    """A path under ``directory`` that names the network namespace ``ident`` now, or None.

    For a namespace whose recorded path names another one now (the runtime moved its bind
    mount, a symlink was pointed elsewhere): one ``stat(2)`` per entry, and the match checked
    as a namespace (:func:`netns_identity`). Never raises."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == ident and netns_identity_or_none(path) == ident:
            return path
    return None


def netns_exists(path: str) -> bool:
    """True if ``path`` is a network namespace, False if it names nothing now
    (:func:`netns_lookup`: missing, or the empty file left once the namespace was
    unmounted). Raises :class:`InvalidEnvironmentError` (code 4) as :func:`netns_lookup`."""
    return netns_lookup(path) is not None


def current_netns_identity() -> NetnsIdentity:
    """Identity of the network namespace the calling thread is in now."""
    try:
        st = os.stat(_THREAD_SELF_NET)
    except OSError as exc:
        raise IOFailureError(
            f"failed to stat netns {_THREAD_SELF_NET}: {exc.strerror}", details=str(exc)
        ) from exc
    return (st.st_dev, st.st_ino)


def host_netns_identity() -> NetnsIdentity:
    """Identity of the host network namespace.

    "Host" is the namespace the process was in before any :func:`in_netns`
    switch: for a CNI plugin exec'd by the container runtime, the node's
    namespace. It is captured on first use (from the calling thread, or from the
    namespace an active :func:`in_netns` left) and cached for the process.
    ``/proc/1/ns/net`` is not used: it may be unreadable (hidepid, user
    namespaces) and belongs to another process.
    """
    global _host_identity
    if _host_identity is None:
        with _host_lock:
            if _host_identity is None:
                outer = getattr(_local, "outermost", None)
                _host_identity = outer if outer is not None else current_netns_identity()
    return _host_identity


def is_host_netns(path: str) -> bool:
    """True if ``path`` is the host network namespace (compared by identity).

    Raises :class:`ContainerUnknownError` (code 3) when ``path`` does not exist and
    :class:`InvalidEnvironmentError` (code 4) when it is not a network namespace.
    """
    return netns_identity(path) == host_netns_identity()


def _abort_wrong_netns(message: str) -> None:
    """Last resort when a thread cannot return to its namespace: end the process."""
    try:
        os.write(2, f"cni-dra: fatal: {message}; exiting\n".encode(errors="replace"))
    finally:
        os._exit(EXIT_WRONG_NETNS)


@contextmanager
def in_netns_fd(fd: int, label: str = "") -> Iterator[None]:
    """Like :func:`in_netns` for an already open namespace file descriptor.

    The caller keeps ownership of ``fd``. ``label`` names the namespace in
    messages.
    """
    name = label or f"fd {fd}"
    inside = getattr(_local, "inside", None)
    if inside is not None and inside.refers_to(fd):  # already there (a handle's entered block)
        yield
        return
    try:
        orig_fd = os.open(_THREAD_SELF_NET, os.O_RDONLY | os.O_CLOEXEC)
        orig_st = os.fstat(orig_fd)
    except OSError as exc:
        raise InvalidEnvironmentError(
            f"failed to enter netns {name}: cannot open current netns: {exc.strerror}", details=str(exc)
        ) from exc
    orig_identity = (orig_st.st_dev, orig_st.st_ino)
    depth = getattr(_local, "depth", 0)
    try:
        try:
            _setns(fd)
        except OSError as exc:
            raise InvalidEnvironmentError(
                f"failed to enter netns {name}: {exc.strerror}", details=str(exc)
            ) from exc
        if depth == 0:
            _local.outermost = orig_identity
        _local.depth = depth + 1
        _local.inside = None  # in another namespace now (a handle's entered block marks its own)
        try:
            yield
        finally:
            _local.inside = inside
            _local.depth = depth
            if depth == 0:
                _local.outermost = None
            _restore(orig_fd, orig_identity, name)
    finally:
        os.close(orig_fd)


def _restore(orig_fd: int, orig_identity: NetnsIdentity, name: str) -> None:
    try:
        _setns(orig_fd)
        back = current_netns_identity()
    except BaseException as exc:  # any failure here is fatal
        _abort_wrong_netns(f"failed to leave netns {name}: {exc}")
        raise  # only reached when _abort_wrong_netns is replaced (tests)
    if back != orig_identity:
        _abort_wrong_netns(
            f"failed to leave netns {name}: thread is in netns {back}, expected {orig_identity}"
        )
        raise InvalidEnvironmentError(f"failed to leave netns {name}")  # only when abort is replaced


@contextmanager
def in_netns(path: str) -> Iterator[None]:
    """Run the ``with`` body with the calling thread in the network namespace ``path``.

    Only the calling thread moves (``setns(2)``); sockets it opens inside (netlink,
    ``/proc/sys/net`` files) belong to that namespace and keep it after the
    block. On exit (normal or exception) the thread always returns to the
    namespace it was in; if that fails the process ends (``os._exit`` with
    :data:`EXIT_WRONG_NETNS`) rather than continue in the wrong namespace.
    Nesting is allowed. Threads started inside the block inherit the namespace
    (``clone(2)`` copies it); threads that already run are not affected.

    Raises :class:`ContainerUnknownError` (code 3) when ``path`` does not exist,
    :class:`InvalidEnvironmentError` (code 4) when it is not a network namespace
    or cannot be entered. Exceptions from the body propagate unchanged.
    """
    fd = open_netns(path)
    try:
        with in_netns_fd(fd, path):
            yield
    finally:
        os.close(fd)


class _Pinned(Protocol):
    """What :mod:`cni_dra.netlink.handle` pins for a path (its ``NetnsHandle``)."""

    def fd(self) -> int: ...

    def refers_to(self, fd: int) -> bool: ...


def _pinned_handle(path: str) -> _Pinned | None:
    pinned: dict[str, _Pinned] | None = getattr(_local, "pinned", None)
    return pinned.get(path) if pinned else None


def pin_table() -> dict[str, _Pinned]:
    """The calling thread's pinned namespace handles, path → handle
    (:meth:`cni_dra.netlink.handle.NetnsHandle.pinned` fills it)."""
    table: dict[str, _Pinned] | None = getattr(_local, "pinned", None)
    if table is None:
        table = _local.pinned = {}
    return table


def entered_handle() -> _Pinned | None:
    """The handle whose namespace the calling thread is in by its ``entered`` block, if any."""
    return getattr(_local, "inside", None)


def set_entered_handle(handle: _Pinned | None) -> None:
    _local.inside = handle
