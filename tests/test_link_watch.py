"""The agent's link watch and the netlink subscription it waits on (unprivileged)."""

from __future__ import annotations

import logging
import queue
import threading

import pytest

from cni_dra.agent.linkwatch import LinkWatch
from cni_dra.errors import NetlinkError
from cni_dra.netlink import sockets, watch


def test_link_events_subscribe_wait_and_close() -> None:
    with watch.LinkEvents() as events:
        assert events.fileno() >= 0
        assert events.wait(0) in (True, False)  # another process may change links meanwhile
    events.close()  # idempotent


def test_link_events_that_cannot_open_raise_netlink_error(monkeypatch: pytest.MonkeyPatch) -> None:
    cause = OSError(97, "Address family not supported by protocol")

    def refuse(*args: object) -> None:
        raise cause

    monkeypatch.setattr(sockets.socket, "socket", refuse)
    with pytest.raises(NetlinkError, match="^failed to subscribe to link events: ") as err:
        watch.LinkEvents()
    assert err.value.__cause__ is cause
    assert err.value.code == 102


class FakeEvents:
    """Stands in for LinkEvents: ``wait`` answers from a queue the test fills."""

    def __init__(self) -> None:
        self.arrivals: queue.Queue[bool] = queue.Queue()
        self.closed = False

    def wait(self, timeout_s: float) -> bool:
        try:
            return self.arrivals.get(timeout=timeout_s)
        except queue.Empty:
            return False

    def close(self) -> None:
        self.closed = True


def test_link_watch_calls_on_change_per_notification_and_closes_on_stop() -> None:
    events = FakeEvents()
    changes = threading.Semaphore(0)
    lw = LinkWatch(changes.release, subscribe=lambda: events)  # type: ignore[arg-type,return-value]
    lw.start()
    try:
        events.arrivals.put(True)
        events.arrivals.put(True)
        assert changes.acquire(timeout=5) and changes.acquire(timeout=5)
    finally:
        lw.stop()
    assert events.closed
    assert not changes.acquire(timeout=0)


def test_link_watch_without_netlink_logs_and_keeps_the_agent_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def refuse() -> watch.LinkEvents:
        raise NetlinkError("failed to subscribe to link events: no netlink here")

    lw = LinkWatch(lambda: None, subscribe=refuse)
    with caplog.at_level(logging.WARNING, logger="cni_dra.agent.linkwatch"):
        lw.start()
    lw.stop()
    assert "link events unavailable" in caplog.text
    assert "relying on the periodic resync" in caplog.text
