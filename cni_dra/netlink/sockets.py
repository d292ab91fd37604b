"""rtnetlink sockets: per call, kept per host thread, inside a netns, subscribed to events.

Every rtnetlink socket cni-dra opens comes from here:

* :func:`iproute`: an :class:`~cni_dra.netlink._rtnl.Rtnl` (a blocking rtnetlink socket
  speaking pyroute2's messages, with ``IPRoute``'s calls) in the calling thread's current
  namespace, closed when the block ends (:func:`open_rtnl`: the same, closed by whoever
  it is handed to);
* :func:`host_iproute`: the same, but kept across calls by the main thread and by threads
  inside :func:`keep_host_socket` (the fast-path workers) while they are in the host
  namespace; the agent serves every ADD/DEL from the same few threads;
* :func:`netns_iproute`: enter a container's namespace and open a socket there, for one
  call only, so cni-dra never keeps a pod's namespace alive;
* :func:`subscribe`: a raw ``AF_NETLINK`` socket bound to multicast groups (the link
  watch); standard library only, it does not load pyroute2.

pyroute2's messages are imported on the first request (:mod:`cni_dra.netlink._rtnl`).

Errors: :class:`~cni_dra.errors.NetlinkError` (102) when a socket cannot be opened;
:func:`netns_iproute` raises :class:`~cni_dra.errors.ContainerUnknownError` (3) or
:class:`~cni_dra.errors.InvalidEnvironmentError` (4) for a missing or invalid netns.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cni_dra.errors import NetlinkError
from cni_dra.netlink import _pyroute2, _rtnl
from cni_dra.netlink.netns import current_netns_identity, host_netns_identity, in_netns_fd, open_netns

__all__ = [
    "iproute",
    "open_rtnl",
    "host_iproute",
    "keep_host_socket",
    "netns_iproute",
    "drop_held",
    "subscribe",
    "load_tc",
]

_NETLINK_ROUTE = 0


def load_tc() -> None:
    """Import traffic control's messages now (a plugin run loads them on its first tc
    request only): a long-lived process calls this once so its first shaped ADD does not."""
    with _pyroute2.translated("load traffic control messages"):
        _rtnl.load_tc()


def open_rtnl() -> Any:
    """An rtnetlink socket (:class:`~cni_dra.netlink._rtnl.Rtnl`) of the calling thread's
    current netns, for the caller (or the thread it hands it to) to close. Raises
    NetlinkError (102) when it cannot be opened."""
    with _pyroute2.translated("open rtnetlink socket"):
        return _rtnl.Rtnl()


@contextmanager
def iproute() -> Iterator[Any]:
    """An rtnetlink socket (:class:`~cni_dra.netlink._rtnl.Rtnl`) of the calling thread's current netns."""
    ipr = open_rtnl()
    try:
        yield ipr
    finally:
        ipr.close()


# One host-namespace socket kept per long-lived thread (the main thread, the fast-path
# workers inside keep_host_socket()). A socket serves one request at a time, so it is kept
# per thread; other threads (short-lived ones) open one per call.
_held = threading.local()
_orphans: list[Any] = []  # what a forked child inherited: kept, never used nor closed there


class _HeldSocket:
    __slots__ = ("ipr", "netns", "pid")

    def __init__(self, ipr: Any, netns: tuple[int, int]) -> None:
        self.ipr, self.netns, self.pid = ipr, netns, os.getpid()


def drop_held() -> None:
    """Forget (and close, in the process that opened it) the calling thread's kept socket."""
    held = getattr(_held, "socket", None)
    _held.socket = None
    if held is not None and held.pid == os.getpid():
        try:
            held.ipr.close()
        except Exception:  # noqa: BLE001 - a broken socket is being discarded anyway
            pass


def _forget_after_fork() -> None:
    global _held
    _orphans.append(_held)  # the parent still uses its socket; closing it here would tear down shared state
    _held = threading.local()


os.register_at_fork(after_in_child=_forget_after_fork)


@contextmanager
def keep_host_socket() -> Iterator[None]:
    """Let the calling thread keep one host-namespace rtnetlink socket for the block.

    For long-lived worker threads (the fast-path server wraps its worker loop in it):
    host-side requests made by this thread in the block reuse one socket, opened on
    first use and closed when the block ends (or after any error, then reopened). The
    main thread keeps one without this (closed at interpreter exit). Nestable; raises
    nothing itself.
    """
    depth = getattr(_held, "keep", 0)
    _held.keep = depth + 1
    try:
        yield
    finally:
        _held.keep = depth
        if depth == 0 and threading.current_thread() is not threading.main_thread():
            drop_held()


def _close_main_socket() -> None:
    if threading.current_thread() is threading.main_thread():
        drop_held()


atexit.register(_close_main_socket)


@contextmanager
def host_iproute() -> Iterator[Any]:
    """An rtnetlink socket in the calling thread's current netns, reused across calls when allowed.

    The kept socket is used only by the thread that opened it, in the process that opened
    it, and only while the thread is in the host namespace it was opened in (compared by
    nsfs identity): a thread inside :func:`~cni_dra.netlink.netns.in_netns` gets a fresh
    socket of that namespace. Any exception raised in the block discards it.
    """
    if getattr(_held, "keep", 0) == 0 and threading.current_thread() is not threading.main_thread():
        with iproute() as ipr:
            yield ipr
        return
    here = current_netns_identity()
    if here != host_netns_identity():
        with iproute() as ipr:  # inside another netns: a socket of that one, for this call
            yield ipr
        return
    held = getattr(_held, "socket", None)
    if held is None or held.netns != here or held.pid != os.getpid():
        with _pyroute2.translated("open rtnetlink socket"):
            held = _HeldSocket(_rtnl.Rtnl(), here)
        _held.socket = held
    try:
        yield held.ipr
    except BaseException:
        drop_held()
        raise


@contextmanager
def netns_iproute(netns: str) -> Iterator[Any]:
    """Enter ``netns`` (codes 3/4 when it is missing/invalid) and open a socket there."""
    fd = open_netns(netns)
    try:
        with in_netns_fd(fd, netns), iproute() as ipr:
            yield ipr
    finally:
        os.close(fd)


def subscribe(groups: int, what: str) -> socket.socket:
    """A raw rtnetlink socket of the calling thread's namespace, bound to multicast ``groups``.

    ``groups``: the ``RTMGRP_*`` bit mask. Raises NetlinkError (102) ``failed to <what>:
    <cause>`` (``__cause__`` the OSError) when it cannot be opened or bound.
    """
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE)
    except OSError as exc:
        raise NetlinkError(f"failed to {what}: {exc}") from exc
    try:
        sock.bind((0, groups))
    except OSError as exc:
        sock.close()
        raise NetlinkError(f"failed to {what}: {exc}") from exc
    return sock
