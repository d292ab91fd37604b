"""macvlan and ipvlan sub-links: one spec object, created in a pod netns, deleted idempotently.

:class:`SubLinkSpec` holds everything RTM_NEWLINK carries for one sub-link, validated when
built (:meth:`SubLinkSpec.macvlan`, :meth:`SubLinkSpec.ipvlan`); :func:`create_sublink`
makes it like the reference macvlan plugin: under a random temporary name
(:data:`TEMP_NAME_PREFIX`) directly in the target namespace (IFLA_NET_NS_FD), then renamed
to its ``ifname`` and brought up in one RTM_SETLINK. On any failure after creation the link
is deleted again. The caller may choose the temporary name first (:func:`temp_name`; ADD
records it in its intent before the link exists); a name collision in the namespace retries
with names derived from it (:func:`temp_names`), so whoever knows the first name knows
every name the link can have before its rename, and :func:`delete_temp_links` removes a
link left under one of them by a process killed in between.
:func:`create_macvlan` and :func:`create_ipvlan` are the keyword forms the verbs call.
:func:`delete_link` is DEL's; :func:`link_kind_supported` asks the kernel up front.

The parent is looked up on the calling thread's kept host socket
(:func:`cni_dra.netlink.sockets.host_iproute`); the container side uses a socket opened
inside the pod netns for the call only.

Errors (CNI spec 1.1.0 "Error"; cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.InvalidEnvironmentError` (4): bad ``ifname``; the netns is not a
  network namespace or is the host's; ``ifname`` already exists in it;
* :class:`~cni_dra.errors.ContainerUnknownError` (3): the netns does not exist;
* :class:`~cni_dra.errors.InvalidConfigError` (7): bad mode, flag, MAC, MTU or bcqueuelen;
  the MAC already in use on the parent;
* :class:`~cni_dra.errors.NetlinkError` (102): the parent does not exist, the kernel lacks
  the link kind, the parent is busy, or another netlink request failed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cni_dra.errors import (
    CniError,
    ContainerUnknownError,
    InvalidConfigError,
    InvalidEnvironmentError,
    NetlinkError,
)
from cni_dra.faults import fault_point
from cni_dra.iface import IPVLAN_FLAGS, IPVLAN_MODES, MACVLAN_MODES, validate_ifname, validate_mac
from cni_dra.netlink import _pyroute2, dellink, info, sockets
from cni_dra.netlink.info import LinkInfo
from cni_dra.netlink.netns import current_netns_identity, in_netns_fd, netns_exists, open_netns

__all__ = [
    "TEMP_NAME_PREFIX",
    "SubLinkSpec",
    "create_sublink",
    "add_in_netns",
    "rename_and_up",
    "create_macvlan",
    "create_ipvlan",
    "delete_link",
    "delete_temp_links",
    "is_temp_name",
    "link_kind_supported",
    "temp_name",
    "temp_names",
]

TEMP_NAME_PREFIX = "cdra"
"""Links are created as ``cdra<10 hex>`` in the target netns and then renamed."""

_TEMP_NAME_ATTEMPTS = 8
_TEMP_NAME = re.compile(rf"{TEMP_NAME_PREFIX}[0-9a-f]{{10}}")
_MIN_MTU = 68  # RFC 791 minimum for IPv4
_MAX_U32 = 2**32 - 1


@dataclass(frozen=True)
class SubLinkSpec:
    """One macvlan or ipvlan to create: ``kind`` on host link ``parent``, as ``ifname`` in ``netns``.

    ``data``: IFLA_INFO_DATA as pyroute2 keywords (``macvlan_mode``, ``macvlan_bc_queue_len``,
    ``ipvlan_mode``, ``ipvlan_flags``); ``mtu`` in bytes (None: the parent's); ``mac``
    ``aa:bb:cc:dd:ee:ff``, stored lower case (None: random from the kernel; never for ipvlan,
    which has its parent's). Building one checks ``ifname`` (code 4), ``mac`` and ``mtu``
    (code 7), in that order, before anything touches a namespace.
    """

    kind: str
    parent: str
    netns: str
    ifname: str
    data: Mapping[str, int] = field(default_factory=dict)
    mtu: int | None = None
    mac: str | None = None

    def __post_init__(self) -> None:
        validate_ifname(self.ifname)
        if self.mac is not None:
            object.__setattr__(self, "mac", validate_mac(self.mac))
        mtu = self.mtu
        if mtu is not None and (not isinstance(mtu, int) or isinstance(mtu, bool) or mtu < _MIN_MTU):
            raise InvalidConfigError(
                f"failed to create {self.kind} {self.ifname}: mtu {mtu!r} is not an integer >= {_MIN_MTU}"
            )
        object.__setattr__(self, "data", MappingProxyType(dict(self.data)))

    @classmethod
    def macvlan(
        cls,
        *,
        parent: str,
        netns: str,
        ifname: str,
        mode: str = "bridge",
        mtu: int | None = None,
        mac: str | None = None,
        bcqueuelen: int | None = None,
    ) -> SubLinkSpec:
        """A macvlan (``mode`` one of :data:`cni_dra.iface.MACVLAN_MODES`; ``bcqueuelen`` the
        broadcast queue length in packets, IFLA_MACVLAN_BC_QUEUE_LEN, None: the kernel's 1000).
        Raises InvalidConfigError (7) for an unknown mode or bcqueuelen outside [0, 2**32-1]."""
        if mode not in MACVLAN_MODES:
            raise InvalidConfigError(
                f"failed to create macvlan {ifname}: unknown mode {mode!r} (one of {sorted(MACVLAN_MODES)})"
            )
        data = {"macvlan_mode": MACVLAN_MODES[mode]}
        if bcqueuelen is not None:
            if (
                isinstance(bcqueuelen, bool)
                or not isinstance(bcqueuelen, int)
                or not 0 <= bcqueuelen <= _MAX_U32
            ):
                raise InvalidConfigError(
                    f"failed to create macvlan {ifname}: bcqueuelen {bcqueuelen!r} is not in [0, 2**32-1]"
                )
            data["macvlan_bc_queue_len"] = bcqueuelen
        return cls(kind="macvlan", parent=parent, netns=netns, ifname=ifname, data=data, mtu=mtu, mac=mac)

    @classmethod
    def ipvlan(
        cls,
        *,
        parent: str,
        netns: str,
        ifname: str,
        mode: str = "l2",
        flag: str = "bridge",
        mtu: int | None = None,
    ) -> SubLinkSpec:
        """An ipvlan (``mode`` l2/l3/l3s, ``flag`` bridge/private/vepa). Raises InvalidConfigError (7)."""
        if mode not in IPVLAN_MODES:
            raise InvalidConfigError(
                f"failed to create ipvlan {ifname}: unknown mode {mode!r} (one of {sorted(IPVLAN_MODES)})"
            )
        if flag not in IPVLAN_FLAGS:
            raise InvalidConfigError(
                f"failed to create ipvlan {ifname}: unknown flag {flag!r} (one of {sorted(IPVLAN_FLAGS)})"
            )
        data = {"ipvlan_mode": IPVLAN_MODES[mode], "ipvlan_flags": IPVLAN_FLAGS[flag]}
        return cls(kind="ipvlan", parent=parent, netns=netns, ifname=ifname, data=data, mtu=mtu)

    def newlink(self, *, parent_index: int, netns_fd: int) -> dict[str, Any]:
        """Keyword arguments for pyroute2 ``link("add", ifname=<temporary>, **newlink)`` (RTM_NEWLINK)."""
        spec: dict[str, Any] = {"kind": self.kind, "link": parent_index, "net_ns_fd": netns_fd, **self.data}
        if self.mtu is not None:
            spec["mtu"] = self.mtu
        if self.mac is not None:
            spec["address"] = self.mac
        return spec


def temp_name() -> str:
    """A fresh temporary link name: :data:`TEMP_NAME_PREFIX` and 10 random hex digits (14 bytes)."""
    return f"{TEMP_NAME_PREFIX}{os.urandom(5).hex()}"


def temp_names(first: str) -> tuple[str, ...]:
    """The temporary names a link is tried under, in order: ``first`` (a :func:`temp_name`),
    then names derived from it (SHA-256), :data:`_TEMP_NAME_ATTEMPTS` in all."""
    derived = (
        hashlib.sha256(f"{first}/{i}".encode()).hexdigest()[:10] for i in range(1, _TEMP_NAME_ATTEMPTS)
    )
    return (first, *(f"{TEMP_NAME_PREFIX}{h}" for h in derived))


def is_temp_name(name: str) -> bool:
    """Whether ``name`` has the form of a temporary link name (:func:`temp_name`, :func:`temp_names`)."""
    return _TEMP_NAME.fullmatch(name) is not None


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
    temp: str | None = None,
) -> LinkInfo:
    """Create a macvlan on host link ``parent`` as ``ifname`` in the netns ``netns``; set it up.

    The arguments are :meth:`SubLinkSpec.macvlan`'s; ``parent_link`` and ``temp`` as
    :func:`create_sublink`. Returns the link as seen in ``netns`` (``addresses`` None).
    Raises as the module docstring says (a MAC already used on ``parent``, by the parent
    itself or another macvlan: InvalidConfigError, the link is removed again).
    """
    spec = SubLinkSpec.macvlan(
        parent=parent, netns=netns, ifname=ifname, mode=mode, mtu=mtu, mac=mac, bcqueuelen=bcqueuelen
    )
    return create_sublink(spec, parent_link=parent_link, temp=temp)


def create_ipvlan(
    *,
    parent: str,
    netns: str,
    ifname: str,
    mode: str = "l2",
    flag: str = "bridge",
    mtu: int | None = None,
    parent_link: LinkInfo | None = None,
    temp: str | None = None,
) -> LinkInfo:
    """Create an ipvlan (``mode`` l2/l3/l3s, ``flag`` bridge/private/vepa) like :func:`create_macvlan`.

    An ipvlan shares the parent's MAC, so there is no ``mac`` option. A kernel
    without ipvlan makes this raise NetlinkError (102) saying so (errno
    EOPNOTSUPP in ``__cause__.code``); :func:`link_kind_supported` asks up front.
    """
    spec = SubLinkSpec.ipvlan(parent=parent, netns=netns, ifname=ifname, mode=mode, flag=flag, mtu=mtu)
    return create_sublink(spec, parent_link=parent_link, temp=temp)


def create_sublink(
    spec: SubLinkSpec, *, parent_link: LinkInfo | None = None, temp: str | None = None
) -> LinkInfo:
    """Create ``spec`` in its netns, renamed to its ``ifname`` and up; return it as seen there.

    ``parent_link``: the host link ``spec.parent`` as the caller already read it
    (:func:`cni_dra.netlink.info.host_link`); its index and MTU are used instead of looking
    the parent up again. ``temp``: the first temporary name to try (a :func:`temp_name` the
    caller has recorded; None: a fresh one); a collision tries the others of
    :func:`temp_names`. ``mtu`` above the parent's is InvalidConfigError (7). Nothing is
    left behind on failure. Raises as the module docstring says.
    """
    made = add_in_netns(spec, parent_link=parent_link, temp=temp)
    fault_point("add:link-temp")  # crash tests: the link exists under its temporary name
    return rename_and_up(spec, made)


def add_in_netns(spec: SubLinkSpec, *, parent_link: LinkInfo | None = None, temp: str | None = None) -> str:
    """The host-side half of :func:`create_sublink`: make ``spec`` directly in its netns
    (IFLA_NET_NS_FD, from the host namespace) under a temporary name; return that name."""
    fd = open_netns(spec.netns)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == current_netns_identity():
            raise InvalidEnvironmentError(
                f"failed to create {spec.kind} {spec.ifname}: netns {spec.netns} is the host network namespace"
            )
        return _add_in_netns(spec, fd, parent_link, temp or temp_name())
    finally:
        os.close(fd)


def rename_and_up(spec: SubLinkSpec, temp: str) -> LinkInfo:
    """The pod-side half of :func:`create_sublink`: in ``spec.netns``, rename ``temp`` to
    ``spec.ifname`` and set it up (one RTM_SETLINK); the link is deleted on failure."""
    fd = open_netns(spec.netns)
    try:
        with in_netns_fd(fd, spec.netns), sockets.iproute() as ipr:
            return _rename_and_up(ipr, spec, temp)
    finally:
        os.close(fd)


def _parent_index_and_mtu(
    ipr: Any, spec: SubLinkSpec, what: str, parent_link: LinkInfo | None
) -> tuple[int, int | None]:
    """The parent's ifindex and MTU: from ``parent_link`` when it is the parent, else one RTM_GETLINK."""
    if parent_link is not None and parent_link.name == spec.parent:
        return parent_link.index, parent_link.mtu
    parent_msg = info.get_link(ipr, ifname=spec.parent)
    if parent_msg is None:
        raise NetlinkError(f"failed to {what}: parent link {spec.parent} not found")
    return parent_msg["index"], parent_msg.get_attr("IFLA_MTU")


def _add_in_netns(spec: SubLinkSpec, fd: int, parent_link: LinkInfo | None, first: str) -> str:
    """Create the link directly in the netns ``fd`` under the first free name of
    :func:`temp_names` of ``first``; return the name."""
    what = f"create {spec.kind} {spec.ifname} on {spec.parent}"
    with sockets.host_iproute() as ipr, _pyroute2.translated(what):
        parent_index, parent_mtu = _parent_index_and_mtu(ipr, spec, what, parent_link)
        if spec.mtu is not None and parent_mtu is not None and spec.mtu > parent_mtu:
            raise InvalidConfigError(
                f"failed to {what}: mtu {spec.mtu} exceeds parent {spec.parent} mtu {parent_mtu}"
            )
        newlink = spec.newlink(parent_index=parent_index, netns_fd=fd)
        for temp in temp_names(first):
            try:
                ipr.link("add", ifname=temp, **newlink)
            except _pyroute2.load().NetlinkError as exc:
                if exc.code == errno.EEXIST:
                    continue
                if exc.code == errno.EOPNOTSUPP:
                    raise NetlinkError(
                        f"failed to {what}: the kernel does not support link kind {spec.kind}",
                        details=repr(exc),
                    ) from exc
                if exc.code == errno.EBUSY:
                    other = "ipvlan" if spec.kind == "macvlan" else "macvlan"
                    raise NetlinkError(
                        f"failed to {what}: {spec.parent} is busy (it already carries {other} links or another "
                        f"receive handler; macvlan and ipvlan cannot share a parent)",
                        details=repr(exc),
                    ) from exc
                raise
            return temp
        raise NetlinkError(f"failed to {what}: no free temporary name after {_TEMP_NAME_ATTEMPTS} attempts")


def _rename_and_up(ipr: Any, spec: SubLinkSpec, temp: str) -> LinkInfo:
    """Inside the netns: rename ``temp`` to ``spec.ifname``, set it up, return it; delete it on failure.

    Rename and up are one RTM_SETLINK (the kernel's do_setlink renames first, then
    changes the flags; a failure stops there): EEXIST can only come from the rename,
    EADDRINUSE only from opening the link.
    """
    what = f"create {spec.kind} {spec.ifname} in netns {spec.netns}"
    with _pyroute2.translated(what):
        msg = info.get_link(ipr, ifname=temp)
    if msg is None:
        raise NetlinkError(f"failed to {what}: temporary link {temp} vanished")
    index = msg["index"]
    try:
        try:
            ipr.link("set", index=index, ifname=spec.ifname, state="up")
        except _pyroute2.load().NetlinkError as exc:
            meaning = _setlink_error(exc, spec, what)
            if meaning is None:
                raise
            raise meaning from exc
        got = info.get_link(ipr, index=index)
        if got is None:
            raise NetlinkError(f"failed to {what}: link vanished after rename")
        return info.decode_link(got)
    except BaseException as exc:
        _undo_create(ipr, index, exc)
        if isinstance(exc, (OSError, _pyroute2.load().NetlinkError)):
            raise _pyroute2.nl_error(what, exc) from exc
        raise


def _setlink_error(exc: Any, spec: SubLinkSpec, what: str) -> CniError | None:
    """What a failed rename-and-up means: the name taken (4), the MAC taken (7), else None."""
    if exc.code == errno.EEXIST:
        return InvalidEnvironmentError(
            f"failed to {what}: interface {spec.ifname} already exists", details=repr(exc)
        )
    if exc.code == errno.EADDRINUSE:
        whose = f"MAC {spec.mac}" if spec.mac else "its MAC"
        return InvalidConfigError(
            f"failed to {what}: {whose} is already in use on parent {spec.parent} "
            "(the parent's own address or another macvlan's)",
            details=repr(exc),
        )
    return None


def _undo_create(ipr: Any, index: int, exc: BaseException) -> None:
    try:
        ipr.link("del", index=index)
    except _pyroute2.load().NetlinkError as del_exc:
        if del_exc.code != errno.ENODEV:
            exc.add_note(f"cleanup: failed to delete link index {index}: {_pyroute2.cause(del_exc)}")
    except OSError as del_exc:
        exc.add_note(f"cleanup: failed to delete link index {index}: {_pyroute2.cause(del_exc)}")


# --------------------------------------------------------------------------- delete, probe


def delete_link(netns: str | None, ifname: str) -> bool:
    """Delete ``ifname`` in ``netns`` (None: the host namespace). Idempotent.

    True if a link was deleted; False if the link does not exist or the netns is
    gone (missing path, or the empty file left once it was unmounted) -- DEL
    must succeed then (CNI spec 1.1.0 "DEL"). In a netns, done when the kernel announces
    the link deleted, before it has freed it (:mod:`cni_dra.netlink.dellink`). Raises InvalidEnvironmentError (4)
    if ``netns`` exists but is something else than a network namespace,
    NetlinkError (102) when the kernel refuses.
    """
    what = f"delete link {ifname}" + (f" in netns {netns}" if netns else "")
    if netns is None:
        with sockets.host_iproute() as ipr, _pyroute2.translated(what):
            return _delete(lambda: ipr.link("del", ifname=ifname))
    try:
        fd = open_netns(netns)
    except ContainerUnknownError:
        return False
    except InvalidEnvironmentError:
        if not netns_exists(netns):  # the empty file left once the netns was unmounted
            return False
        raise
    try:
        with in_netns_fd(fd, netns), _pyroute2.translated(what):
            # done when the kernel announces it deleted, not when it has freed it (dellink)
            return _delete(lambda: dellink.delete({"ifname": ifname}, names=(ifname,)))
    finally:
        os.close(fd)


def _delete(request: Callable[[], object]) -> bool:
    # One RTM_DELLINK naming the link (IFLA_IFNAME); ENODEV: there is none.
    try:
        request()
    except _pyroute2.load().NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return False
        raise
    return True


def delete_temp_links(netns: str, first: str, parent: str) -> list[str]:
    """Delete what :func:`create_sublink` leaves in ``netns`` when its process is killed
    between making the link and renaming it: a macvlan/ipvlan on host link ``parent`` named
    as one of :func:`temp_names` of ``first``. Returns the names deleted. A link of such a
    name of another kind or on another parent is left alone; a netns that is gone has none.
    Raises InvalidEnvironmentError (4) for a path that is no netns, NetlinkError (102).
    """
    names = set(temp_names(first))
    try:
        with sockets.netns_iproute(netns) as ipr, _pyroute2.translated(f"list links in netns {netns}"):
            found = [info.decode_link(m) for m in ipr.link("dump") if m.get_attr("IFLA_IFNAME") in names]
    except ContainerUnknownError:
        return []
    deleted = []
    for link in found:
        if link.kind not in ("macvlan", "ipvlan"):
            continue
        on = info.host_parent_of(netns, link.name)
        if on is not None and on.name == parent and delete_link(netns, link.name):
            deleted.append(link.name)
    return deleted


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
    name = temp_name()
    with sockets.host_iproute() as ipr:
        try:
            ipr.link("add", ifname=name, kind=kind)
        except _pyroute2.load().NetlinkError as exc:
            if exc.code == errno.EOPNOTSUPP:
                return False
            if exc.code == errno.EINVAL:
                return True
            raise _pyroute2.nl_error(f"probe link kind {kind}", exc) from exc
        # A kernel that accepted a parent-less link: remove it again.
        with _pyroute2.translated(f"delete probe link {name}"):
            ipr.link("del", ifname=name)
        return True
