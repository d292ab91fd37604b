"""cni_dra.netlink.dellink: a link deletion is done at the kernel's announcement or its
acknowledgement, whichever comes first; and cni_dra.netlink._nlmsg.deleted_links reads the
announcements.

The request's socket and the announcement socket are fakes here (:class:`Request`,
:class:`Announcements`); the kernel's side is in netns_tests/test_dellink_kernel.py.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import time

import pytest

from cni_dra.netlink import _pyroute2, dellink
from cni_dra.netlink._nlmsg import deleted_links

RTM_NEWLINK, RTM_DELLINK = 16, 17
AF_UNSPEC, AF_BRIDGE = 0, 7


def link_message(kind: int, index: int, name: str | None, family: int = AF_UNSPEC) -> bytes:
    """One rtnetlink link message as the kernel sends it: header, ifinfomsg, IFLA_IFNAME."""
    attrs = b""
    if name is not None:
        payload = name.encode() + b"\0"
        attrs = struct.pack("=HH", 4 + len(payload), 3) + payload
        attrs += b"\0" * (-len(attrs) % 4)
    body = struct.pack("=BxHiII", family, 1, index, 0, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def test_deleted_links_reads_each_unregistration_of_a_datagram() -> None:
    data = (
        link_message(RTM_NEWLINK, 3, "eth0")  # a change, not a deletion
        + link_message(RTM_DELLINK, 4, "ifb-eth0")
        + link_message(RTM_DELLINK, 3, "eth0", family=AF_BRIDGE)  # left a bridge, still there
        + link_message(RTM_DELLINK, 3, "eth0")
        + link_message(RTM_DELLINK, 9, None)
    )
    assert deleted_links(data) == [(4, "ifb-eth0"), (3, "eth0"), (9, None)]


def test_deleted_links_stops_at_a_truncated_message() -> None:
    whole = link_message(RTM_DELLINK, 4, "eth0")
    assert deleted_links(whole + whole[:20]) == [(4, "eth0")]
    assert deleted_links(b"") == []


class Request:
    """The request's socket: ``link("del")`` returns (the acknowledgement) when ``ack`` is
    set, raising ``error`` if one is given."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.ack = threading.Event()
        self.sent = threading.Event()
        self.error = error
        self.requests: list[tuple[str, dict[str, object]]] = []
        self.closed = threading.Event()

    def link(self, command: str, **request: object) -> list[object]:
        self.requests.append((command, request))
        self.sent.set()
        assert self.ack.wait(10), "the test never acknowledged the request"
        if self.error is not None:
            raise self.error
        return []

    def close(self) -> None:
        self.closed.set()


class Announcements:
    """The socket subscribed to RTMGRP_LINK: :meth:`announce` queues a datagram (or an
    OSError its ``recv`` raises) and makes the descriptor readable."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        self._queue: list[bytes | OSError] = []
        self.closed = False

    def announce(self, item: bytes | OSError) -> None:
        self._queue.append(item)
        os.write(self._w, b"\0")

    def fileno(self) -> int:
        return self._r

    def recv(self, size: int) -> bytes:
        os.read(self._r, 1)
        item = self._queue.pop(0)
        if isinstance(item, OSError):
            raise item
        return item

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._r)
            os.close(self._w)


class Deleting:
    """A :class:`~cni_dra.netlink.dellink.Deletion` waited for in a thread of its own."""

    def __init__(self, request: Request, events: Announcements, **awaited: object) -> None:
        self.released = threading.Event()
        self.error: BaseException | None = None
        self.done = threading.Event()

        def wait() -> None:
            try:
                deletion = dellink.Deletion(
                    request, events, {"group": 7}, release=self.released.set, **awaited
                )
                deletion.wait()
            except BaseException as exc:  # noqa: BLE001 - checked by the test
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=wait, daemon=True)
        self.thread.start()
        assert request.sent.wait(5)


def test_done_when_every_awaited_link_is_announced_before_the_acknowledgement() -> None:
    request, events = Request(), Announcements()
    deleting = Deleting(request, events, names=(), indexes=(3, 4))
    events.announce(link_message(RTM_DELLINK, 8, "other"))  # another link of the namespace
    events.announce(link_message(RTM_DELLINK, 3, "eth0"))
    assert not deleting.done.wait(0.3)  # index 4 not yet
    events.announce(link_message(RTM_DELLINK, 4, "ifb-eth0"))
    assert deleting.done.wait(5) and deleting.error is None
    assert events.closed  # the waiting side's socket is closed at once
    assert not request.closed.is_set() and not deleting.released.is_set()  # the helper still waits
    request.ack.set()
    assert request.closed.wait(5) and deleting.released.wait(5)
    assert request.requests == [("del", {"group": 7})]


def test_a_name_is_awaited_as_well_as_an_index() -> None:
    request, events = Request(), Announcements()
    deleting = Deleting(request, events, names=("eth0",), indexes=())
    events.announce(link_message(RTM_DELLINK, 5, "eth1"))
    assert not deleting.done.wait(0.3)
    events.announce(link_message(RTM_DELLINK, 5, "eth0"))
    assert deleting.done.wait(5) and deleting.error is None
    request.ack.set()
    assert deleting.released.wait(5)


def test_without_announcements_the_acknowledgement_decides() -> None:
    request, events = Request(), Announcements()
    deleting = Deleting(request, events, names=("eth0",), indexes=())
    events.announce(OSError(errno.ENOBUFS, "No buffer space available"))  # announcements dropped
    assert not deleting.done.wait(0.3)
    request.ack.set()
    assert deleting.done.wait(5) and deleting.error is None
    assert request.closed.is_set() and deleting.released.is_set() and events.closed


def test_the_acknowledgements_error_is_raised_to_the_caller() -> None:
    enodev = _pyroute2.load().NetlinkError(errno.ENODEV, "No such device")
    request, events = Request(error=enodev), Announcements()
    deleting = Deleting(request, events, names=("eth0",), indexes=())
    request.ack.set()
    assert deleting.done.wait(5)
    assert deleting.error is enodev
    assert deleting.released.wait(5) and events.closed


def test_nothing_awaited_is_refused() -> None:
    with pytest.raises(ValueError):
        dellink.delete({"ifname": "eth0"})


def test_a_forked_child_starts_with_every_slot() -> None:
    """Helpers in flight in the parent do not exist in a forked child (the agent forks its
    worker processes, and replaces those that exit, while it serves)."""
    taken = dellink._slots
    for _ in range(dellink.MAX_IN_FLIGHT):
        assert taken.acquire(blocking=False)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            free = sum(dellink._slots.acquire(blocking=False) for _ in range(dellink.MAX_IN_FLIGHT))
            os.write(w, str(free).encode())
            os._exit(0)
        os.close(w)
        deadline = time.monotonic() + 10
        out = b""
        while time.monotonic() < deadline and not out:
            out = os.read(r, 16)
        os.close(r)
        os.waitpid(pid, 0)
        assert int(out) == dellink.MAX_IN_FLIGHT
    finally:
        for _ in range(dellink.MAX_IN_FLIGHT):
            taken.release()
