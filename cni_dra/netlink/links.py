"""Links, addresses, routes and per-netns sysctls, over rtnetlink (pyroute2).

This is the only module of cni-dra that imports pyroute2. It does so lazily
(:func:`_pr`, on the first netlink call), importing ``pyroute2.iproute.linux``
and ``pyroute2.netlink.exceptions`` rather than the package's public names.
(Any ``pyroute2.*`` import still runs the package ``__init__``, ~100-280 ms.)

Namespaces: "host" functions act in the namespace of the calling thread, which
must be the host (node) namespace; container-side work always happens inside
:func:`cni_dra.netlink.netns.in_netns_fd`, with a netlink socket opened there.

Sockets: host-side calls of the main thread, and of threads inside
:func:`keep_host_socket` (the fast-path workers), reuse one IPRoute per thread
instead of opening one per call (see :func:`_host_iproute` for when it is not
reused); a container-side socket lives only for the call that opened it, so
cni-dra never keeps a pod's namespace alive.

Errors (CNI spec 1.1.0 "Error"; cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.NetlinkError` (102): a netlink request failed; the
  message reads ``failed to <verb> <object> <name>: <cause>`` and ``__cause__``
  is the pyroute2 error (its ``code`` is the errno);
* :class:`~cni_dra.errors.ContainerUnknownError` (3): the netns path does not exist;
* :class:`~cni_dra.errors.InvalidEnvironmentError` (4): the netns path is not a
  network namespace or is the host one; ``ifname`` is not a valid interface
  name (CNI spec "Parameters": CNI_IFNAME) or already exists in the netns;
* :class:`~cni_dra.errors.InvalidConfigError` (7): bad mode, MAC or MTU;

Interface names, MACs and the macvlan/ipvlan mode tables are :mod:`cni_dra.iface`'s, the
rules the CNI protocol layer applies too.
* :class:`~cni_dra.errors.IOFailureError` (5): a sysctl file cannot be written.
"""

from __future__ import annotations

import atexit
import errno
import functools
import ipaddress
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from cni_dra.errors import (
    CniError,
    ContainerUnknownError,
    InvalidConfigError,
    InvalidEnvironmentError,
    IOFailureError,
    NetlinkError,
)
from cni_dra.iface import IPVLAN_FLAGS, IPVLAN_MODES, MACVLAN_MODES, validate_ifname, validate_mac
from cni_dra.netlink.netns import (
    current_netns_identity,
    host_netns_identity,
    in_netns_fd,
    netns_exists,
    open_netns,
)

__all__ = [
    "LinkInfo",
    "MACVLAN_MODES",
    "IPVLAN_MODES",
    "IPVLAN_FLAGS",
    "TEMP_NAME_PREFIX",
    "validate_ifname",
    "host_link",
    "host_link_by_index",
    "list_host_links",
    "link_speed_bps",
    "link_kind_supported",
    "keep_host_socket",
    "create_macvlan",
    "create_ipvlan",
    "delete_link",
    "link_in_netns",
    "host_parent_of",
    "configure_interface",
    "set_sysctl_in_netns",
]

TEMP_NAME_PREFIX = "cdra"
"""Links are created as ``cdra<10 hex>`` in the target netns and then renamed."""

_TEMP_NAME_ATTEMPTS = 8
_MIN_MTU = 68  # RFC 791 minimum for IPv4
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


# --------------------------------------------------------------------------- pyroute2


@functools.cache
def _pr() -> SimpleNamespace:
    """Import pyroute2 on first use (narrowest modules) and register the ipvlan decoder."""
    from pyroute2.iproute.linux import IPRoute
    from pyroute2.netlink import nla
    from pyroute2.netlink.exceptions import NetlinkError as PrNetlinkError
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg, macvx_data

    class ipvlan_data(nla):  # noqa: N801 - pyroute2 naming
        # pyroute2 0.9.7 knows IFLA_IPVLAN_MODE only; add IFLA_IPVLAN_FLAGS (<linux/if_link.h>).
        prefix = "IFLA_"
        nla_map = (
            ("IFLA_IPVLAN_UNSPEC", "none"),
            ("IFLA_IPVLAN_MODE", "uint16"),
            ("IFLA_IPVLAN_FLAGS", "uint16"),
        )

    class macvlan_data(macvx_data):  # noqa: N801 - pyroute2 naming
        # pyroute2 0.9.7 stops at IFLA_MACVLAN_MACADDR_COUNT; the kernel (5.11+) also has
        # the broadcast queue length (<linux/if_link.h> IFLA_MACVLAN_BC_QUEUE_LEN = 7, _USED = 8).
        nla_map = (
            *macvx_data.nla_map,
            ("IFLA_MACVLAN_BC_QUEUE_LEN", "uint32"),
            ("IFLA_MACVLAN_BC_QUEUE_LEN_USED", "uint32"),
        )

    ifinfmsg.ifinfo.register_link_kind(module={"ipvlan": ipvlan_data, "macvlan": macvlan_data})
    return SimpleNamespace(IPRoute=IPRoute, NetlinkError=PrNetlinkError)


def _errno(exc: BaseException) -> int | None:
    """errno carried by a pyroute2 NetlinkError or an OSError, else None."""
    if isinstance(exc, OSError):
        return exc.errno
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def _cause(exc: BaseException) -> str:
    code = _errno(exc)
    if code is not None and code > 0:
        return os.strerror(code)
    return str(exc) or type(exc).__name__


def _nl_error(what: str, exc: BaseException) -> NetlinkError:
    """NetlinkError "failed to <what>: <strerror>" keeping the pyroute2 error as details."""
    return NetlinkError(f"failed to {what}: {_cause(exc)}", details=repr(exc))


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn pyroute2/OS errors raised in the block into NetlinkError; CniError passes."""
    try:
        yield
    except CniError:
        raise
    except (OSError, _pr().NetlinkError) as exc:
        raise _nl_error(what, exc) from exc


@contextmanager
def _iproute() -> Iterator[Any]:
    """A pyroute2 IPRoute whose socket lives in the calling thread's current netns."""
    with _translated("open rtnetlink socket"):
        ipr = _pr().IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


# One host-namespace socket kept per long-lived thread (the main thread, the fast-path
# workers inside keep_host_socket()): opening an IPRoute costs an event loop and a socket
# (~0.25-1 ms) and the agent serves every ADD/DEL from the same few threads. pyroute2 keeps
# the socket's event loop in a threading.local, so it can only be closed by its own thread:
# other threads (short-lived ones) open one per call as before.
_held = threading.local()
_orphans: list[Any] = []  # what a forked child inherited: kept, never used nor closed there


class _HeldSocket:
    __slots__ = ("ipr", "netns", "pid")

    def __init__(self, ipr: Any, netns: tuple[int, int]) -> None:
        self.ipr, self.netns, self.pid = ipr, netns, os.getpid()


def _drop_held() -> None:
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
            _drop_held()


def _close_main_socket() -> None:
    if threading.current_thread() is threading.main_thread():
        _drop_held()


atexit.register(_close_main_socket)


@contextmanager
def _host_iproute() -> Iterator[Any]:
    """An IPRoute in the calling thread's current netns, reused across calls when allowed.

    The kept socket is used only by the thread that opened it, in the process that opened
    it, and only while the thread is in the host namespace it was opened in (compared by
    nsfs identity): a thread inside :func:`~cni_dra.netlink.netns.in_netns` gets a fresh
    socket of that namespace, as before. Any exception raised in the block discards it.
    """
    if getattr(_held, "keep", 0) == 0 and threading.current_thread() is not threading.main_thread():
        with _iproute() as ipr:
            yield ipr
        return
    here = current_netns_identity()
    if here != host_netns_identity():
        with _iproute() as ipr:  # inside another netns: a socket of that one, for this call
            yield ipr
        return
    held = getattr(_held, "socket", None)
    if held is None or held.netns != here or held.pid != os.getpid():
        with _translated("open rtnetlink socket"):
            held = _HeldSocket(_pr().IPRoute(), here)
        _held.socket = held
    try:
        yield held.ipr
    except BaseException:
        _drop_held()
        raise


@contextmanager
def _netns_iproute(netns: str) -> Iterator[Any]:
    """Enter ``netns`` (codes 3/4 when it is missing/invalid) and open a socket there."""
    fd = open_netns(netns)
    try:
        with in_netns_fd(fd, netns), _iproute() as ipr:
            yield ipr
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- decoding


def _link_info(msg: Any, addresses: tuple[str, ...] | None = None) -> LinkInfo:
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


def _name_of(table: dict[str, int], value: int | None) -> str | None:
    if value is None:
        return None
    for name, number in table.items():
        if number == value:
            return name
    return str(value)


def _addresses(ipr: Any, index: int) -> tuple[str, ...]:
    out = []
    for msg in ipr.addr("dump", index=index):
        addr = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
        if addr is None:
            continue
        out.append(str(ipaddress.ip_interface(f"{addr}/{msg['prefixlen']}")))
    return tuple(out)


def _get_link(ipr: Any, *, ifname: str | None = None, index: int | None = None) -> Any | None:
    """The RTM_NEWLINK message for one link, or None if it does not exist (ENODEV)."""
    key: dict[str, Any] = {"ifname": ifname} if ifname is not None else {"index": index}
    try:
        msgs = ipr.link("get", **key)
    except _pr().NetlinkError as exc:
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
    with _host_iproute() as ipr, _translated(f"get link {name}"):
        msg = _get_link(ipr, ifname=name)
        return None if msg is None else _link_info(msg)


def host_link_by_index(index: int) -> LinkInfo | None:
    """The host link with ifindex ``index``, or None. Raises NetlinkError (102)."""
    with _host_iproute() as ipr, _translated(f"get link index {index}"):
        msg = _get_link(ipr, index=index)
        return None if msg is None else _link_info(msg)


def list_host_links() -> list[LinkInfo]:
    """Every link of the host namespace, in ifindex order (without addresses)."""
    with _host_iproute() as ipr, _translated("dump links"):
        return sorted((_link_info(m) for m in ipr.link("dump")), key=lambda li: li.index)


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


def link_kind_supported(kind: str) -> bool:
    """Whether the kernel can create links of ``kind`` ("macvlan", "ipvlan", "macvtap", "ipvtap").

    Probes with an RTM_NEWLINK that has no parent (IFLA_LINK): a kernel without
    the driver answers EOPNOTSUPP (no rtnl_link_ops after request_module), one
    with it EINVAL (parent missing); nothing is created. Raises ValueError for
    kinds that could be created without a parent, NetlinkError (102) for other
    failures.
    """
    if kind not in ("macvlan", "ipvlan", "macvtap", "ipvtap"):
        raise ValueError(f"cannot probe link kind {kind!r} without side effects")
    name = _temp_name()
    with _host_iproute() as ipr:
        try:
            ipr.link("add", ifname=name, kind=kind)
        except _pr().NetlinkError as exc:
            if exc.code == errno.EOPNOTSUPP:
                return False
            if exc.code == errno.EINVAL:
                return True
            raise _nl_error(f"probe link kind {kind}", exc) from exc
        # A kernel that accepted a parent-less link: remove it again.
        with _translated(f"delete probe link {name}"):
            ipr.link("del", ifname=name)
        return True


# --------------------------------------------------------------------------- create


def _temp_name() -> str:
    return f"{TEMP_NAME_PREFIX}{os.urandom(5).hex()}"


def create_macvlan(
    *,
    parent: str,
    netns: str,
    ifname: str,
    mode: str = "bridge",
    mtu: int | None = None,
    mac: str | None = None,
    bcqueuelen: int | None = None,
    parent_link: LinkInfo | None = None,
) -> LinkInfo:
    """Create a macvlan on host link ``parent`` as ``ifname`` in the netns ``netns``; set it up.

    Like the reference macvlan plugin: the link is created under a random
    temporary name (:data:`TEMP_NAME_PREFIX`) directly in the target namespace
    (IFLA_NET_NS_FD; a name collision there retries with a new name), renamed
    to ``ifname`` inside it and brought up. ``mtu`` is in bytes (default: the
    parent's), ``mac`` ``aa:bb:cc:dd:ee:ff`` (default: random from the kernel),
    ``bcqueuelen`` the broadcast queue length in packets (IFLA_MACVLAN_BC_QUEUE_LEN;
    default: the kernel's, 1000). ``parent_link``: the host link ``parent`` as the
    caller already read it (:func:`host_link`); its index and MTU are used instead of
    looking the parent up again. Returns the link as seen in ``netns``
    (``addresses`` None).

    On any failure after creation the link is deleted again, so nothing is
    left behind. Raises:

    * InvalidEnvironmentError (4): bad ``ifname``; ``netns`` is not a network
      namespace or is the host's; ``ifname`` already exists in ``netns``;
    * ContainerUnknownError (3): ``netns`` does not exist;
    * InvalidConfigError (7): unknown ``mode``, bad ``mac``, ``mtu`` outside
      [68, parent mtu], ``bcqueuelen`` not in [0, 2**32-1]; ``mac`` already used on
      ``parent`` (by the parent itself or another macvlan: EADDRINUSE when the link
      comes up; the link is removed again);
    * NetlinkError (102): ``parent`` does not exist (the message names it) or a
      netlink request failed.
    """
    if mode not in MACVLAN_MODES:
        raise InvalidConfigError(f"failed to create macvlan {ifname}: unknown mode {mode!r} (one of {sorted(MACVLAN_MODES)})")
    data = {"macvlan_mode": MACVLAN_MODES[mode]}
    if bcqueuelen is not None:
        if isinstance(bcqueuelen, bool) or not isinstance(bcqueuelen, int) or not 0 <= bcqueuelen <= 2**32 - 1:
            raise InvalidConfigError(f"failed to create macvlan {ifname}: bcqueuelen {bcqueuelen!r} is not in [0, 2**32-1]")
        data["macvlan_bc_queue_len"] = bcqueuelen
    return _create_sublink(
        kind="macvlan",
        parent=parent,
        netns=netns,
        ifname=ifname,
        mtu=mtu,
        mac=mac,
        data=data,
        parent_link=parent_link,
    )


def create_ipvlan(
    *,
    parent: str,
    netns: str,
    ifname: str,
    mode: str = "l2",
    flag: str = "bridge",
    mtu: int | None = None,
    parent_link: LinkInfo | None = None,
) -> LinkInfo:
    """Create an ipvlan (``mode`` l2/l3/l3s, ``flag`` bridge/private/vepa) like :func:`create_macvlan`.

    An ipvlan shares the parent's MAC, so there is no ``mac`` option. A kernel
    without ipvlan makes this raise NetlinkError (102) saying so (errno
    EOPNOTSUPP in ``__cause__.code``); :func:`link_kind_supported` asks up front.
    Other errors as :func:`create_macvlan`.
    """
    if mode not in IPVLAN_MODES:
        raise InvalidConfigError(f"failed to create ipvlan {ifname}: unknown mode {mode!r} (one of {sorted(IPVLAN_MODES)})")
    if flag not in IPVLAN_FLAGS:
        raise InvalidConfigError(f"failed to create ipvlan {ifname}: unknown flag {flag!r} (one of {sorted(IPVLAN_FLAGS)})")
    return _create_sublink(
        kind="ipvlan",
        parent=parent,
        netns=netns,
        ifname=ifname,
        mtu=mtu,
        mac=None,
        data={"ipvlan_mode": IPVLAN_MODES[mode], "ipvlan_flags": IPVLAN_FLAGS[flag]},
        parent_link=parent_link,
    )


def _create_sublink(
    *,
    kind: str,
    parent: str,
    netns: str,
    ifname: str,
    mtu: int | None,
    mac: str | None,
    data: dict[str, int],
    parent_link: LinkInfo | None = None,
) -> LinkInfo:
    validate_ifname(ifname)
    if mac is not None:
        mac = validate_mac(mac)
    if mtu is not None and (not isinstance(mtu, int) or isinstance(mtu, bool) or mtu < _MIN_MTU):
        raise InvalidConfigError(f"failed to create {kind} {ifname}: mtu {mtu!r} is not an integer >= {_MIN_MTU}")
    fd = open_netns(netns)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == current_netns_identity():
            raise InvalidEnvironmentError(f"failed to create {kind} {ifname}: netns {netns} is the host network namespace")
        temp = _add_in_netns(
            kind=kind, parent=parent, fd=fd, netns=netns, ifname=ifname, mtu=mtu, mac=mac, data=data,
            parent_link=parent_link,
        )
        with in_netns_fd(fd, netns), _iproute() as ipr:
            return _rename_and_up(ipr, kind=kind, temp=temp, ifname=ifname, netns=netns, parent=parent, mac=mac)
    finally:
        os.close(fd)


def _add_in_netns(
    *,
    kind: str,
    parent: str,
    fd: int,
    netns: str,
    ifname: str,
    mtu: int | None,
    mac: str | None,
    data: dict[str, int],
    parent_link: LinkInfo | None = None,
) -> str:
    """Create the link under a fresh temporary name directly in the netns ``fd``; return the name."""
    what = f"create {kind} {ifname} on {parent}"
    with _host_iproute() as ipr, _translated(what):
        if parent_link is not None and parent_link.name == parent:
            parent_index, parent_mtu = parent_link.index, parent_link.mtu
        else:
            parent_msg = _get_link(ipr, ifname=parent)
            if parent_msg is None:
                raise NetlinkError(f"failed to {what}: parent link {parent} not found")
            parent_index, parent_mtu = parent_msg["index"], parent_msg.get_attr("IFLA_MTU")
        if mtu is not None and parent_mtu is not None and mtu > parent_mtu:
            raise InvalidConfigError(f"failed to {what}: mtu {mtu} exceeds parent {parent} mtu {parent_mtu}")
        spec = _link_add_spec(kind=kind, parent_index=parent_index, netns_fd=fd, data=data, mtu=mtu, mac=mac)
        for _ in range(_TEMP_NAME_ATTEMPTS):
            temp = _temp_name()
            try:
                ipr.link("add", ifname=temp, **spec)
            except _pr().NetlinkError as exc:
                if exc.code == errno.EEXIST:
                    continue
                if exc.code == errno.EOPNOTSUPP:
                    raise NetlinkError(
                        f"failed to {what}: the kernel does not support link kind {kind}", details=repr(exc)
                    ) from exc
                if exc.code == errno.EBUSY:
                    other = "ipvlan" if kind == "macvlan" else "macvlan"
                    raise NetlinkError(
                        f"failed to {what}: {parent} is busy (it already carries {other} links or another "
                        f"receive handler; macvlan and ipvlan cannot share a parent)",
                        details=repr(exc),
                    ) from exc
                raise
            return temp
        raise NetlinkError(f"failed to {what}: no free temporary name after {_TEMP_NAME_ATTEMPTS} attempts")


def _link_add_spec(
    *, kind: str, parent_index: int, netns_fd: int, data: dict[str, int], mtu: int | None, mac: str | None
) -> dict[str, Any]:
    """Keyword arguments for pyroute2 ``link("add", ifname=..., **spec)`` (RTM_NEWLINK)."""
    spec: dict[str, Any] = {"kind": kind, "link": parent_index, "net_ns_fd": netns_fd, **data}
    if mtu is not None:
        spec["mtu"] = mtu
    if mac is not None:
        spec["address"] = mac
    return spec


def _rename_and_up(
    ipr: Any, *, kind: str, temp: str, ifname: str, netns: str, parent: str = "", mac: str | None = None
) -> LinkInfo:
    """Inside the netns: rename ``temp`` to ``ifname``, set it up, return it; delete it on failure.

    Rename and up are one RTM_SETLINK (the kernel's do_setlink renames first, then
    changes the flags; a failure stops there): EEXIST can only come from the rename,
    EADDRINUSE only from opening the link.
    """
    what = f"create {kind} {ifname} in netns {netns}"
    with _translated(what):
        msg = _get_link(ipr, ifname=temp)
    if msg is None:
        raise NetlinkError(f"failed to {what}: temporary link {temp} vanished")
    index = msg["index"]
    try:
        try:
            ipr.link("set", index=index, ifname=ifname, state="up")
        except _pr().NetlinkError as exc:
            if exc.code == errno.EEXIST:
                raise InvalidEnvironmentError(
                    f"failed to {what}: interface {ifname} already exists", details=repr(exc)
                ) from exc
            if exc.code == errno.EADDRINUSE:
                whose = f"MAC {mac}" if mac else "its MAC"
                raise InvalidConfigError(
                    f"failed to {what}: {whose} is already in use on parent {parent} "
                    "(the parent's own address or another macvlan's)",
                    details=repr(exc),
                ) from exc
            raise
        got = _get_link(ipr, index=index)
        if got is None:
            raise NetlinkError(f"failed to {what}: link vanished after rename")
        return _link_info(got)
    except BaseException as exc:
        _undo_create(ipr, index, exc)
        if isinstance(exc, (OSError, _pr().NetlinkError)):
            raise _nl_error(what, exc) from exc
        raise


def _undo_create(ipr: Any, index: int, exc: BaseException) -> None:
    try:
        ipr.link("del", index=index)
    except _pr().NetlinkError as del_exc:
        if del_exc.code != errno.ENODEV:
            exc.add_note(f"cleanup: failed to delete link index {index}: {_cause(del_exc)}")
    except OSError as del_exc:
        exc.add_note(f"cleanup: failed to delete link index {index}: {_cause(del_exc)}")


# --------------------------------------------------------------------------- container side


def delete_link(netns: str | None, ifname: str) -> bool:
    """Delete ``ifname`` in ``netns`` (None: the host namespace). Idempotent.

    True if a link was deleted; False if the link does not exist or the netns is
    gone (missing path, or the empty file left once it was unmounted) -- DEL
    must succeed then (CNI spec 1.1.0 "DEL"). Raises InvalidEnvironmentError (4)
    if ``netns`` exists but is something else than a network namespace,
    NetlinkError (102) when the kernel refuses.
    """
    what = f"delete link {ifname}" + (f" in netns {netns}" if netns else "")
    if netns is None:
        with _host_iproute() as ipr, _translated(what):
            return _delete(ipr, ifname)
    try:
        fd = open_netns(netns)
    except ContainerUnknownError:
        return False
    except InvalidEnvironmentError:
        if not netns_exists(netns):  # the empty file left once the netns was unmounted
            return False
        raise
    try:
        with in_netns_fd(fd, netns), _iproute() as ipr, _translated(what):
            return _delete(ipr, ifname)
    finally:
        os.close(fd)


def _delete(ipr: Any, ifname: str) -> bool:
    # One RTM_DELLINK naming the link (IFLA_IFNAME); ENODEV: there is none.
    try:
        ipr.link("del", ifname=ifname)
    except _pr().NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return False
        raise
    return True


def link_in_netns(netns: str, ifname: str) -> LinkInfo | None:
    """``ifname`` as seen in ``netns``, with ``addresses``; None if there is no such link.

    Raises ContainerUnknownError (3) if ``netns`` does not exist,
    InvalidEnvironmentError (4) if it is not a network namespace, NetlinkError (102).
    """
    with _netns_iproute(netns) as ipr, _translated(f"get link {ifname} in netns {netns}"):
        msg = _get_link(ipr, ifname=ifname)
        if msg is None:
            return None
        return _link_info(msg, _addresses(ipr, msg["index"]))


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
        with _netns_iproute(netns) as ipr, _translated(f"resolve parent of {ifname} in netns {netns}"):
            msg = _get_link(ipr, ifname=ifname)
            if msg is None:
                return None
            info = _link_info(msg)
            if info.parent_index is None or info.parent_netnsid is None:
                return None
            reply = ipr.get_netnsid(fd=host_fd)
            host_nsid = reply.get("nsid") if reply else None
            if host_nsid is None or host_nsid != info.parent_netnsid:
                return None
            parent_index = info.parent_index
    finally:
        os.close(host_fd)
    return host_link_by_index(parent_index)


def configure_interface(
    netns: str,
    ifname: str,
    *,
    addresses: Sequence[tuple[str, str | None]],
    routes: Sequence[tuple[str, str | None]],
    up: bool = True,
    settle_timeout_s: float = 10.0,
    wait_ipv6: bool | None = None,
    nodad: bool = False,
    describe: bool = True,
) -> LinkInfo | None:
    """Apply an IPAM result to ``ifname`` in ``netns``: addresses, link up, IPv6 DAD, routes.

    ``addresses``: ``(CIDR, gateway)`` pairs from the result's ``ips`` (CNI spec
    1.1.0 "Success": ips[].address, ips[].gateway); the gateway is not turned
    into a route. ``routes``: ``(destination CIDR, gateway or None)`` from the
    result's ``routes``; None adds a link-scoped route via ``ifname``. Nothing
    else is added. An address or route that already exists counts as done.

    Like the reference macvlan plugin, when an IPv6 address has a gateway and
    the link is brought up, waits up to ``settle_timeout_s`` seconds for
    duplicate address detection on the given IPv6 addresses to finish
    (IFA_F_TENTATIVE cleared) before adding routes. ``wait_ipv6=True`` waits
    for every IPv6 address, gateway or not (cni-dra's ADD: addresses are
    usable when ADD returns); ``False`` never waits; ``None`` is the reference
    behaviour above. ``nodad=True`` adds IPv6 addresses with IFA_F_NODAD (no
    DAD at all, nothing to wait for).

    Returns the link with its addresses (read back), or None with ``describe=False``
    (saves two requests when the caller does not use it). A link that is already up
    is not set up again. Raises NetlinkError (102) naming the
    address or route that failed, a duplicate IPv6 address (IFA_F_DADFAILED),
    DAD still running at the timeout, or a missing ``ifname``;
    InvalidConfigError (7) for unparsable CIDRs/gateways; codes 3/4 for the netns.
    """
    parsed_addrs = [_parse_cidr(cidr, "address") for cidr, _gw in addresses]
    v6_gateway = False
    for (cidr, gw), iface in zip(addresses, parsed_addrs):
        if gw is None:
            continue
        gw_ip = _parse_ip(gw, "gateway")
        if gw_ip.version != iface.version:
            raise InvalidConfigError(f"failed to parse address {cidr} gateway {gw}: address families differ")
        v6_gateway = v6_gateway or gw_ip.version == 6
    parsed_routes = []
    for dst, gw in routes:
        net = _parse_net(dst)
        gw_ip = _parse_ip(gw, "gateway") if gw is not None else None
        if gw_ip is not None and gw_ip.version != net.version:
            raise InvalidConfigError(f"failed to add route {dst} via {gw}: address families differ")
        parsed_routes.append((net, gw_ip))
    with _netns_iproute(netns) as ipr:
        with _translated(f"get link {ifname} in netns {netns}"):
            msg = _get_link(ipr, ifname=ifname)
        if msg is None:
            raise NetlinkError(f"failed to configure link {ifname} in netns {netns}: no such link")
        index = msg["index"]
        for iface in parsed_addrs:
            extra: dict[str, Any] = {}
            if nodad and iface.version == 6:
                extra["flags"] = _IFA_F_NODAD
            with _translated(f"add address {iface} to {ifname}"), _exists_ok():
                ipr.addr("add", index=index, address=str(iface.ip), prefixlen=iface.network.prefixlen, **extra)
        if up:
            if not msg["flags"] & _IFF_UP:
                with _translated(f"set link {ifname} up"):
                    ipr.link("set", index=index, state="up")
            v6 = {str(i) for i in parsed_addrs if i.version == 6}
            wait = v6_gateway if wait_ipv6 is None else wait_ipv6
            if wait and v6 and not nodad:
                with _translated(f"wait for IPv6 DAD on {ifname}"):
                    _settle_ipv6(ipr, index, ifname, v6, settle_timeout_s)
        for net, gw_ip in parsed_routes:
            spec: dict[str, Any] = {"dst": str(net), "oif": index, "family": 10 if net.version == 6 else 2}
            if gw_ip is not None:
                spec["gateway"] = str(gw_ip)
            else:
                spec["scope"] = 253  # RT_SCOPE_LINK
            label = f"add route {net}" + (f" via {gw_ip}" if gw_ip else "") + f" dev {ifname}"
            with _translated(label), _exists_ok():
                ipr.route("add", **spec)
        if not describe:
            return None
        with _translated(f"get link {ifname} in netns {netns}"):
            got = _get_link(ipr, index=index)
            if got is None:
                raise NetlinkError(f"failed to configure link {ifname} in netns {netns}: link vanished")
            return _link_info(got, _addresses(ipr, index))


_IFA_F_NODAD = 0x02
_IFA_F_DADFAILED = 0x08
_IFA_F_TENTATIVE = 0x40


def _settle_ipv6(ipr: Any, index: int, ifname: str, wanted: set[str], timeout_s: float) -> None:
    """Poll until none of ``wanted`` (CIDR strings) is tentative; raise on DAD failure or timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        tentative = []
        for msg in ipr.addr("dump", index=index, family=10):
            cidr = str(ipaddress.ip_interface(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}"))
            if cidr not in wanted:
                continue
            flags = msg.get_attr("IFA_FLAGS") or msg["flags"]
            if flags & _IFA_F_DADFAILED:
                raise NetlinkError(f"failed to add address {cidr} to {ifname}: duplicate address detected (DAD failed)")
            if flags & _IFA_F_TENTATIVE:
                tentative.append(cidr)
        if not tentative:
            return
        if time.monotonic() >= deadline:
            raise NetlinkError(
                f"failed to settle addresses of {ifname}: {', '.join(sorted(tentative))} still tentative after {timeout_s} s"
            )
        time.sleep(0.05)


@contextmanager
def _exists_ok() -> Iterator[None]:
    try:
        yield
    except _pr().NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def _parse_cidr(text: str, what: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    if "/" not in str(text):
        raise InvalidConfigError(f"failed to parse {what} {text!r}: not CIDR notation")
    try:
        return ipaddress.ip_interface(text)
    except ValueError as exc:
        raise InvalidConfigError(f"failed to parse {what} {text!r}: {exc}") from exc


def _parse_net(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise InvalidConfigError(f"failed to parse route destination {text!r}: {exc}") from exc


def _parse_ip(text: str, what: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(text)
    except ValueError as exc:
        raise InvalidConfigError(f"failed to parse {what} {text!r}: {exc}") from exc


_SYSCTL_KEY_RE = re.compile(r"^net(/[A-Za-z0-9_.\-]+)+$")


def set_sysctl_in_netns(netns: str, key: str, value: str | int) -> None:
    """Write ``value`` to ``/proc/sys/<key>`` as seen from ``netns``.

    ``key`` is a slash-separated ``net/...`` path, e.g.
    ``net/ipv4/conf/eth0/arp_notify`` or ``net/ipv6/conf/eth0/ndisc_notify``
    (interface names may contain dots, so dots are not separators). The file is
    opened after the calling thread entered ``netns``: ``/proc/sys/net`` resolves
    against the opening thread's network namespace, so the write lands in the
    container, never on the host. Raises InvalidConfigError (7) for a key
    outside ``net/`` or with ``..``; IOFailureError (5) when the file cannot be
    written (e.g. no such interface); codes 3/4 for the netns.
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
