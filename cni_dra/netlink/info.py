"""What a link looks like: :class:`LinkInfo`, decoded from RTM_NEWLINK, and the queries for it.

Host queries (:func:`host_link`, :func:`host_link_by_index`, :func:`list_host_links`) act
in the calling thread's namespace, which must be the host's, on its kept socket
(:func:`cni_dra.netlink.sockets.host_iproute`); :func:`link_in_netns` and
:func:`host_parent_of` read a container's link from inside its namespace. :func:`get_link`
and :func:`decode_link` are the one-message helpers the other netlink modules use, called
through this module (``info.get_link``): those attributes are the seams tests replace.

Errors (cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.NetlinkError` (102): a netlink request failed (``failed to get
  link <name>: <cause>``, ``__cause__`` the pyroute2 error);
* :class:`~cni_dra.errors.ContainerUnknownError` (3) /
  :class:`~cni_dra.errors.InvalidEnvironmentError` (4): the netns is missing / invalid;
* :class:`~cni_dra.errors.IOFailureError` (5): the host namespace cannot be opened.
"""

from __future__ import annotations

import errno
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni_dra.errors import InvalidEnvironmentError, IOFailureError
from cni_dra.iface import IPVLAN_FLAGS, IPVLAN_MODES, MACVLAN_MODES, validate_ifname
from cni_dra.netlink import _pyroute2, sockets

__all__ = [
    "LinkInfo",
    "decode_link",
    "get_link",
    "link_addresses",
    "host_link",
    "host_link_by_index",
    "list_host_links",
    "link_speed_bps",
    "link_in_netns",
    "host_parent_of",
]

_IFF_UP = 0x1
_IFF_LOWER_UP = 0x10000  # <linux/if.h>: the driver signals carrier (L1 up)


@dataclass(frozen=True)
class LinkInfo:
    """One network interface as rtnetlink reports it (RTM_NEWLINK).

    * ``name``: IFLA_IFNAME; ``index``: ifindex in the namespace it was read from;
    * ``kind``: IFLA_INFO_KIND ("macvlan", "ipvlan", "veth", ...) or None for
      devices without one (physical NICs, loopback);
    * ``mac``: IFLA_ADDRESS as lower-case ``aa:bb:cc:dd:ee:ff`` (None if absent);
    * ``mtu``: bytes; ``operstate``: RFC 2863 state as the kernel names it
      ("UP", "DOWN", "LOWERLAYERDOWN", "UNKNOWN", ...); ``admin_up``: IFF_UP set;
    * ``parent_index``: IFLA_LINK (None when absent). For a macvlan/ipvlan moved
      into a container this is the parent's ifindex *in the parent's namespace*,
      which ``parent_netnsid`` (IFLA_LINK_NETNSID, an id local to the namespace
      the link was read from) names; see :func:`host_parent_of`;
    * ``mode``: macvlan mode ("bridge", "private", "vepa", "passthru", "source")
      or ipvlan mode ("l2", "l3", "l3s"); ``ipvlan_flag``: "bridge", "private"
      or "vepa" for ipvlan; None otherwise;
    * ``addresses``: the link's addresses as CIDR strings (``10.1.2.3/24``,
      IPv6 link-local included) when asked for, else None;
    * ``bcqueuelen``: a macvlan's broadcast queue length (IFLA_MACVLAN_BC_QUEUE_LEN,
      packets), None for other kinds or kernels without it;
    * ``carrier``: IFF_LOWER_UP, the device's carrier bit (``ip link`` shows ``NO-CARRIER``
      for a link that is up without it; a macvlan or ipvlan loses it with its parent's).
      False for a link that is down.
    """

    name: str
    index: int
    kind: str | None
    mac: str | None
    mtu: int
    operstate: str
    admin_up: bool
    parent_index: int | None
    parent_netnsid: int | None
    mode: str | None
    ipvlan_flag: str | None = None
    addresses: tuple[str, ...] | None = None
    bcqueuelen: int | None = None
    carrier: bool = True


def decode_link(msg: Any, addresses: tuple[str, ...] | None = None) -> LinkInfo:
    """A :class:`LinkInfo` from one pyroute2 RTM_NEWLINK message (and the addresses, if read)."""
    kind = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
    data = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
    mode: str | None = None
    ipvlan_flag: str | None = None
    bcqueuelen: int | None = None
    if kind in ("macvlan", "macvtap") and data is not None:
        raw = data.get_attr(f"IFLA_{kind.upper()}_MODE")
        mode = raw if isinstance(raw, str) else _name_of(MACVLAN_MODES, raw)
        if kind == "macvlan":
            bcqueuelen = data.get_attr("IFLA_MACVLAN_BC_QUEUE_LEN")
    elif kind in ("ipvlan", "ipvtap") and data is not None:
        mode = _name_of(IPVLAN_MODES, data.get_attr("IFLA_IPVLAN_MODE"))
        ipvlan_flag = _name_of(IPVLAN_FLAGS, data.get_attr("IFLA_IPVLAN_FLAGS") or 0)
    mac = msg.get_attr("IFLA_ADDRESS")
    return LinkInfo(
        name=msg.get_attr("IFLA_IFNAME"),
        index=msg["index"],
        kind=kind,
        mac=mac.lower() if isinstance(mac, str) else None,
        mtu=msg.get_attr("IFLA_MTU"),
        operstate=str(msg.get_attr("IFLA_OPERSTATE") or "UNKNOWN"),
        admin_up=bool(msg["flags"] & _IFF_UP),
        carrier=bool(msg["flags"] & _IFF_LOWER_UP),
        parent_index=msg.get_attr("IFLA_LINK"),
        parent_netnsid=msg.get_attr("IFLA_LINK_NETNSID"),
        mode=mode,
        ipvlan_flag=ipvlan_flag,
        addresses=addresses,
        bcqueuelen=bcqueuelen,
    )


def _name_of(table: Mapping[str, int], value: int | None) -> str | None:
    if value is None:
        return None
    for name, number in table.items():
        if number == value:
            return name
    return str(value)


def link_addresses(ipr: Any, index: int) -> tuple[str, ...]:
    """The addresses of link ``index`` on socket ``ipr``, as CIDR strings (one RTM_GETADDR dump)."""
    out = []
    for msg in ipr.addr("dump", index=index):
        addr = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
        if addr is None:
            continue
        out.append(str(ipaddress.ip_interface(f"{addr}/{msg['prefixlen']}")))
    return tuple(out)


def get_link(ipr: Any, *, ifname: str | None = None, index: int | None = None) -> Any | None:
    """The RTM_NEWLINK message for one link, or None if it does not exist (ENODEV)."""
    key: dict[str, Any] = {"ifname": ifname} if ifname is not None else {"index": index}
    try:
        msgs = ipr.link("get", **key)
    except _pyroute2.load().NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return None
        raise
    return msgs[0] if msgs else None


# --------------------------------------------------------------------------- host links


def host_link(name: str) -> LinkInfo | None:
    """The host link called ``name`` (without addresses), or None if there is none.

    Acts in the calling thread's namespace (the host). Raises NetlinkError (102)
    on other netlink failures.
    """
    with sockets.host_iproute() as ipr, _pyroute2.translated(f"get link {name}"):
        msg = get_link(ipr, ifname=name)
        return None if msg is None else decode_link(msg)


def host_link_by_index(index: int) -> LinkInfo | None:
    """The host link with ifindex ``index``, or None. Raises NetlinkError (102)."""
    with sockets.host_iproute() as ipr, _pyroute2.translated(f"get link index {index}"):
        msg = get_link(ipr, index=index)
        return None if msg is None else decode_link(msg)


def list_host_links() -> list[LinkInfo]:
    """Every link of the host namespace, in ifindex order (without addresses)."""
    with sockets.host_iproute() as ipr, _pyroute2.translated("dump links"):
        return sorted((decode_link(m) for m in ipr.link("dump")), key=lambda li: li.index)


def link_speed_bps(name: str, *, sysfs_net: str = "/sys/class/net") -> int | None:
    """Link speed in bits per second from ``<sysfs_net>/<name>/speed`` (Mb/s there).

    None when the file is unreadable (no such link, link down: EINVAL), not an
    integer, or not positive (-1 = unknown). Never raises for those. ``name``
    must be a valid interface name (else None: no path outside ``sysfs_net``).
    """
    try:
        validate_ifname(name)
    except InvalidEnvironmentError:
        return None
    try:
        with open(os.path.join(sysfs_net, name, "speed"), encoding="ascii") as fh:
            mbps = int(fh.read().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if mbps <= 0:
        return None
    return mbps * 1_000_000


# --------------------------------------------------------------------------- container side


def link_in_netns(netns: str, ifname: str) -> LinkInfo | None:
    """``ifname`` as seen in ``netns``, with ``addresses``; None if there is no such link.

    Raises ContainerUnknownError (3) if ``netns`` does not exist,
    InvalidEnvironmentError (4) if it is not a network namespace, NetlinkError (102).
    """
    with sockets.netns_iproute(netns) as ipr, _pyroute2.translated(f"get link {ifname} in netns {netns}"):
        msg = get_link(ipr, ifname=ifname)
        if msg is None:
            return None
        return decode_link(msg, link_addresses(ipr, msg["index"]))


def host_parent_of(netns: str, ifname: str) -> LinkInfo | None:
    """The host link that ``ifname`` in ``netns`` sits on (macvlan/ipvlan parent), or None.

    A macvlan moved into a container reports IFLA_LINK = the parent's ifindex in
    the parent's namespace and IFLA_LINK_NETNSID = that namespace's id as the
    container knows it. This asks the container's kernel view which id the
    calling thread's (host) namespace has (RTM_GETNSID with NETNSA_FD) and
    resolves the index on the host only when the ids match. None when the link
    is missing, has no parent, or its parent is not in the host namespace.
    Raises as :func:`link_in_netns`.
    """
    try:
        host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise IOFailureError(f"failed to open host netns: {exc.strerror}", details=str(exc)) from exc
    try:
        with (
            sockets.netns_iproute(netns) as ipr,
            _pyroute2.translated(f"resolve parent of {ifname} in netns {netns}"),
        ):
            msg = get_link(ipr, ifname=ifname)
            if msg is None:
                return None
            link = decode_link(msg)
            if link.parent_index is None or link.parent_netnsid is None:
                return None
            reply = ipr.get_netnsid(fd=host_fd)
            host_nsid = reply.get("nsid") if reply else None
            if host_nsid is None or host_nsid != link.parent_netnsid:
                return None
            parent_index = link.parent_index
    finally:
        os.close(host_fd)
    return host_link_by_index(parent_index)
