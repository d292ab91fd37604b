"""Wake the publisher when host links change (rtnetlink RTMGRP_LINK notifications).

A raw ``AF_NETLINK`` socket from the standard library, subscribed to the link group of
the agent's network namespace (the host's: the DaemonSet uses hostNetwork). The message
contents are not parsed: any RTM_NEWLINK/RTM_DELLINK means "publish again", and the
publisher compares what it would publish with what is published. pyroute2 stays owned by
:mod:`cni_dra.netlink`; this needs nothing from it.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable

__all__ = ["LinkWatch"]

log = logging.getLogger("cni_dra.agent.linkwatch")

_NETLINK_ROUTE = 0
_RTMGRP_LINK = 0x1


class LinkWatch:
    """Call ``on_change()`` (from a daemon thread) after link notifications."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.on_change = on_change
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Subscribe and start the thread. An OSError (no netlink) is logged, not raised:
        the periodic resync still catches changes."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE)
            sock.bind((0, _RTMGRP_LINK))
        except OSError as exc:
            log.warning("link events unavailable (%s); relying on the periodic resync", exc)
            return
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name="linkwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.5)
            if not ready:
                continue
            try:
                self._sock.recv(65536)
            except OSError as exc:  # ENOBUFS: events lost; a change happened anyway
                log.debug("netlink recv: %s", exc)
            self.on_change()

    def stop(self) -> None:
        """Stop the thread and close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self._sock is not None:
            self._sock.close()
