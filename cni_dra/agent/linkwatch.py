"""Wake the publisher when host links change.

A daemon thread waits on :class:`cni_dra.netlink.watch.LinkEvents` (rtnetlink link
notifications of the agent's namespace, the host's: the DaemonSet uses hostNetwork). The
notifications are not parsed: any of them means "publish again", and the publisher
compares what it would publish with what is published. The socket itself is
:mod:`cni_dra.netlink`'s, the only layer that speaks rtnetlink.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cni_dra.errors import NetlinkError
from cni_dra.netlink.watch import LinkEvents

__all__ = ["LinkWatch"]

log = logging.getLogger("cni_dra.agent.linkwatch")

_POLL_S = 0.5  # how soon stop() is noticed


class LinkWatch:
    """Call ``on_change()`` (from a daemon thread) after link notifications.

    ``subscribe`` opens the notifications (a seam for tests; :class:`LinkEvents` by
    default).
    """

    def __init__(
        self, on_change: Callable[[], None], subscribe: Callable[[], LinkEvents] = LinkEvents
    ) -> None:
        self.on_change = on_change
        self._subscribe = subscribe
        self._stop = threading.Event()
        self._events: LinkEvents | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Subscribe and start the thread. A NetlinkError (no netlink) is logged, not
        raised: the periodic resync still catches changes."""
        try:
            events = self._subscribe()
        except NetlinkError as exc:
            log.warning("link events unavailable (%s); relying on the periodic resync", exc)
            return
        self._events = events
        self._thread = threading.Thread(target=self._run, name="linkwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._events is not None
        while not self._stop.is_set():
            if self._events.wait(_POLL_S):
                self.on_change()

    def stop(self) -> None:
        """Stop the thread and close the subscription."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self._events is not None:
            self._events.close()
