"""Per-netns sysctls: write ``/proc/sys/net/...`` as a pod's namespace sees it.

``/proc/sys/net`` resolves against the network namespace of the thread that opens the
file, so the file is opened after the calling thread entered the pod netns
(:func:`cni_dra.netlink.netns.in_netns_fd`): the write lands in the container, never on
the host. Standard library only.

Errors (cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.InvalidConfigError` (7): a key outside ``net/`` or with ``..``;
* :class:`~cni_dra.errors.IOFailureError` (5): the file cannot be written;
* :class:`~cni_dra.errors.ContainerUnknownError` (3) /
  :class:`~cni_dra.errors.InvalidEnvironmentError` (4): the netns is missing / invalid.
"""

from __future__ import annotations

import os
import re

from cni_dra.errors import InvalidConfigError, IOFailureError
from cni_dra.netlink.netns import in_netns_fd, open_netns

__all__ = ["set_sysctl_in_netns"]

# Printable ASCII but "/" in each part: the keys name interfaces (cni_dra.iface's rule).
_SYSCTL_KEY_RE = re.compile(r"^net(/[!-.0-~]+)+$")


def set_sysctl_in_netns(netns: str, key: str, value: str | int) -> None:
    """Write ``value`` to ``/proc/sys/<key>`` as seen from ``netns``.

    ``key`` is a slash-separated ``net/...`` path, e.g.
    ``net/ipv4/conf/eth0/arp_notify`` or ``net/ipv6/conf/eth0/ndisc_notify``
    (interface names may contain dots, so dots are not separators; each part is printable
    ASCII, any an interface name may hold). Raises
    InvalidConfigError (7) for a key outside ``net/``, with ``..`` or another byte; IOFailureError (5)
    when the file cannot be written (e.g. no such interface); codes 3/4 for the netns.
    """
    parts = key.split("/")
    if not _SYSCTL_KEY_RE.match(key) or any(p in (".", "..") for p in parts):
        raise InvalidConfigError(f"failed to set sysctl {key!r}: not a net/ sysctl path")
    path = "/proc/sys/" + key
    fd = open_netns(netns)
    try:
        with in_netns_fd(fd, netns):
            try:
                with open(path, "w", encoding="ascii") as fh:
                    fh.write(str(value))
            except OSError as exc:
                raise IOFailureError(
                    f"failed to set sysctl {key} in netns {netns}: {exc.strerror}", details=str(exc)
                ) from exc
    finally:
        os.close(fd)
