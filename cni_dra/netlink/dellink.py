"""RTM_DELLINK done when the kernel announces the links deleted, not when it has freed them.

A link deletion answers its sender only after the kernel's ``netdev_run_todo``: an
``rcu_barrier()`` (every RCU callback queued so far has run: a normal grace period, whole
scheduler ticks) and the wait for the device's last references, before it is freed. Seen
with ``perf`` (``sched:sched_switch`` with kernel stacks) of a macvlan deleted in a pod
namespace: 14-16 ms asleep in that barrier, under 1 ms for the rest (three expedited RCU
waits). When the pod's ADD ran shortly before, the barrier also waits behind
the grace period the ADD's own changes started, so the deletion ends on the same tick
whichever moment within the ADD's next 2-9 ms it is asked for; the reference plugin
waits for it too.

The link is deleted before that wait: unlisted (its name and index are free at once),
closed, its addresses, routes and neighbours flushed by the unregistration's notifiers,
the macvlan/ipvlan port of its parent released (its ``ndo_uninit``), and then announced
as RTM_DELLINK to ``RTMGRP_LINK`` (what ``ip monitor`` shows as "Deleted"); its sysfs
entry goes right after. :func:`delete` sends the request from a helper thread and returns
at whichever comes first: the announcement of every link it waits for (on a socket
subscribed before the request is sent), or the request's acknowledgement (an error, such
as ENODEV: nothing to delete; or success, when announcements were lost). The helper
thread keeps waiting for the acknowledgement and closes the request's socket (which holds
the namespace until then); once the kernel has announced the deletion, ``rtnl_dellink``
answers 0. At most :data:`MAX_IN_FLIGHT` helpers per process; past that, the calling
thread waits for the acknowledgement itself, as before.

The pod-side deletions of DEL, GC and recovery use it
(:func:`cni_dra.netlink.sublink.delete_link`, :func:`cni_dra.netlink.shaping.delete_shaped_link`).

Errors are the request's (pyroute2's NetlinkError, OSError, raised in the calling thread
as if it had sent the request itself); :class:`~cni_dra.errors.NetlinkError` (102) when
the announcement socket cannot be opened.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Collection
from typing import Any

from cni_dra.netlink import sockets
from cni_dra.netlink._nlmsg import deleted_links

__all__ = ["MAX_IN_FLIGHT", "Deletion", "delete"]

MAX_IN_FLIGHT = 32
"""Deletions per process whose acknowledgement a helper thread may still be waiting for."""

_RTMGRP_LINK = 0x1  # <linux/rtnetlink.h>
_RECV_BYTES = 65536
_slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)


def _fresh_slots() -> None:
    global _slots
    _slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)  # a forked child has none of the helpers


os.register_at_fork(after_in_child=_fresh_slots)


def delete(request: dict[str, Any], *, names: Collection[str] = (), indexes: Collection[int] = ()) -> None:
    """``Rtnl.link("del", **request)`` (``ifname=``, ``index=`` or ``group=``) in the calling
    thread's current namespace, done once the kernel has announced the deletion of every
    link named in ``names`` and of every index in ``indexes`` (at least one of them given),
    or has acknowledged the request. Raises what the request raises (ENODEV: no such link),
    as the module docstring says."""
    if not names and not indexes:
        raise ValueError("delete: no link to wait for")
    slots = _slots
    if not slots.acquire(blocking=False):
        with sockets.iproute() as ipr:
            ipr.link("del", **request)
            return
    try:
        events = sockets.subscribe(_RTMGRP_LINK, "subscribe to link deletions")
        try:
            ipr = sockets.open_rtnl()
        except BaseException:
            events.close()
            raise
    except BaseException:
        slots.release()
        raise
    Deletion(ipr, events, request, names=names, indexes=indexes, release=slots.release).wait()


class Deletion:
    """One RTM_DELLINK in flight: ``request`` sent on ``ipr`` by a helper thread started
    now, the announcements read from ``events`` (a socket of the same namespace subscribed
    to ``RTMGRP_LINK`` before the request is sent: an object with ``recv`` and ``fileno``).
    The helper closes ``ipr`` and calls ``release`` when the acknowledgement is in;
    :meth:`wait` closes ``events``."""

    def __init__(
        self,
        ipr: Any,
        events: Any,
        request: dict[str, Any],
        *,
        names: Collection[str],
        indexes: Collection[int],
        release: Callable[[], None],
    ) -> None:
        self._events = events
        self._names, self._indexes = set(names), set(indexes)
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._waiting = True  # the caller's end of the pipe is open (under _lock)
        try:
            self._done_r, done_w = os.pipe2(os.O_CLOEXEC)
        except BaseException:
            ipr.close()
            events.close()
            release()
            raise

        def acknowledge() -> None:
            try:
                ipr.link("del", **request)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                self._error = exc
            finally:
                try:
                    ipr.close()
                finally:
                    with self._lock:
                        if self._waiting:  # never into a pipe whose reader is gone
                            os.write(done_w, b"\0")
                    os.close(done_w)
                    release()

        try:
            threading.Thread(target=acknowledge, name="cni-dra-dellink", daemon=True).start()
        except BaseException:
            for fd in (self._done_r, done_w):
                os.close(fd)
            ipr.close()
            events.close()
            release()
            raise

    def wait(self) -> None:
        """Return once every awaited link is announced deleted, or the acknowledgement is in
        (its error raised here)."""
        poller = select.poll()
        poller.register(self._done_r, select.POLLIN)
        poller.register(self._events, select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._done_r in ready:
                    if self._error is not None:
                        raise self._error
                    return
                try:
                    data = self._events.recv(_RECV_BYTES)
                except OSError:  # ENOBUFS: announcements were dropped; the acknowledgement decides
                    poller.unregister(self._events)
                    continue
                for index, name in deleted_links(data):
                    self._indexes.discard(index)
                    self._names.discard(name)
                if not self._names and not self._indexes:
                    return
        finally:
            self._events.close()
            with self._lock:
                self._waiting = False
                os.close(self._done_r)
