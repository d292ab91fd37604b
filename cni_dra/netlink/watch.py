"""Link-change notifications: an rtnetlink socket subscribed to ``RTMGRP_LINK``.

The subscription lives in the namespace of the thread that opens it (the agent's: the
host's, the DaemonSet uses hostNetwork). Messages are drained, not parsed: any
RTM_NEWLINK/RTM_DELLINK only means "something changed", and the caller decides what to
look at again. The socket is a raw ``AF_NETLINK`` one from
:func:`cni_dra.netlink.sockets.subscribe`, where every rtnetlink socket of cni-dra is
opened; pyroute2 is not needed and not loaded.

Errors (cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.NetlinkError` (102): the socket cannot be opened or
  subscribed (``failed to subscribe to link events: <cause>``, ``__cause__`` the
  OSError).
"""

from __future__ import annotations

import select

from cni_dra.netlink import sockets

__all__ = ["LinkEvents"]

_RTMGRP_LINK = 0x1  # <linux/rtnetlink.h>
_RECV_BYTES = 65536


class LinkEvents:
    """An open subscription to the calling namespace's link notifications.

    ``wait(timeout_s)`` blocks until notifications arrive (drains one read of them and
    returns True) or the timeout passes (returns False). ``close()`` ends it; the
    object is also a context manager. Raises NetlinkError when it cannot subscribe.
    """

    def __init__(self) -> None:
        self._sock = sockets.subscribe(_RTMGRP_LINK, "subscribe to link events")

    def fileno(self) -> int:
        """The socket's descriptor (for ``select``)."""
        return self._sock.fileno()

    def wait(self, timeout_s: float) -> bool:
        """True once notifications arrived (read and discarded), False after ``timeout_s``.

        A failed read (ENOBUFS: the kernel dropped notifications because the reader was
        slow) still means links changed, so it returns True as well.
        """
        ready, _, _ = select.select([self._sock], [], [], timeout_s)
        if not ready:
            return False
        try:
            self._sock.recv(_RECV_BYTES)
        except OSError:
            pass
        return True

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self._sock.close()

    def __enter__(self) -> LinkEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
