"""An in-memory :class:`cni_dra.host.port.Host` for the verbs' unit tests.

:class:`FakeHost` holds what the kernel would: host links, network namespaces (by path, each
with an identity), the links in them (macvlan/ipvlan on a host parent, their addresses and
routes), the shaping installed on each, the sysctls written, the IPAM plugin's leases and a
clock. Each operation checks what the kernel checks and raises the error the production host
raises (a namespace path that names nothing: code 3; a name taken: code 4; a parent that is
not there: code 102; an MTU above the parent's or a MAC taken on it: code 7; deleting what is
gone: False). ``calls`` records every operation (name, arguments); ``fail[name]`` makes the
next calls of that operation raise (set it to None to heal); ``hooks[name]`` runs with the
arguments first (to order concurrent work or raise mid-way); ``ipam_result`` is what IPAM ADD
hands out. Nothing here touches the machine.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from cni_dra.errors import (
    ContainerUnknownError,
    InvalidConfigError,
    InvalidEnvironmentError,
    IOFailureError,
    IpamError,
    NetlinkError,
)
from cni_dra.iface import IPVLAN_FLAGS, IPVLAN_MODES, MACVLAN_MODES
from cni_dra.netlink.info import LinkInfo
from cni_dra.netlink.netns import NetnsIdentity
from cni_dra.netlink.shaping import ShapeInfo, ifb_name
from cni_dra.netlink.sublink import SubLinkSpec, temp_name, temp_names
from cni_dra.netlink.tbf import ShapeSpec
from cni_dra.protocol.results import IPConfig, Result

__all__ = ["FakeHost", "HOST_NETNS", "nic"]

HOST_NETNS: NetnsIdentity = (0xFA0E, 1)
"""The host namespace's identity in a :class:`FakeHost`."""


def nic(name: str, index: int, *, mtu: int = 1500, up: bool = True, carrier: bool = True) -> LinkInfo:
    """A host NIC as :meth:`FakeHost.host_link` answers it."""
    return LinkInfo(
        name=name,
        index=index,
        kind=None,
        mac=f"02:00:00:00:{index // 256:02x}:{index % 256:02x}",
        mtu=mtu,
        operstate="UP" if up and carrier else "DOWN",
        admin_up=up,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
        carrier=carrier and up,
    )


def pod_link(**changes: Any) -> LinkInfo:
    """A pod's macvlan (bridge mode) as :meth:`FakeHost.link` answers it: ``eth0``,
    index 2, on the host link with index 5 (``parent_netnsid`` 0), up with carrier and no
    addresses read; ``changes`` replace any field."""
    base: dict[str, Any] = dict(
        name="eth0",
        index=2,
        kind="macvlan",
        mac="02:00:00:00:00:01",
        mtu=1500,
        operstate="UP",
        admin_up=True,
        parent_index=5,
        parent_netnsid=0,
        mode="bridge",
        carrier=True,
    )
    base.update(changes)
    return LinkInfo(**base)


@dataclass
class _PodLink:
    info: LinkInfo
    parent: str | None  # host link name (None: not on a host NIC)
    routes: list[tuple[str, str | None]] = field(default_factory=list)


class FakeHost:
    """The machine in memory (see the module docstring). ``netns_paths``: the namespaces
    that exist (path → identity); with ``every_path_a_netns`` any path names one (its
    identity derived from the path) unless it is in ``gone``."""

    def __init__(self, *, every_path_a_netns: bool = True) -> None:
        self.every_path_a_netns = every_path_a_netns
        self.host_links: dict[str, LinkInfo] = {}
        self.netns_paths: dict[str, NetnsIdentity] = {}
        self.gone: set[str] = set()
        self.links: dict[tuple[NetnsIdentity, str], _PodLink] = {}
        self.shaping: dict[tuple[NetnsIdentity, str], ShapeInfo] = {}
        self.sysctls: dict[tuple[NetnsIdentity, str], str] = {}
        self.leases: dict[tuple[str, str], Result] = {}  # (CNI_CONTAINERID, CNI_IFNAME) → result
        self.ipam_result: Result = Result(ips=[IPConfig(address="192.0.2.5/24")])
        self.kernel_lacks: str | None = None  # what probe_shaping answers (and apply_shaping refuses)
        self.manual_clock = False  # True: time passes only by sleep() (now_s); else the real clock
        self.now_s = 1000.0
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail: dict[str, BaseException | None] = {}
        self.hooks: dict[str, Callable[..., None]] = {}
        self.pod_entries = 0
        self._next_index = 100

    # ------------------------------------------------------------------ set-up
    def add_nic(self, name: str, index: int, **kw: Any) -> LinkInfo:
        self.host_links[name] = nic(name, index, **kw)
        return self.host_links[name]

    def put_link(self, netns: str, link: LinkInfo, parent: str | None = None) -> None:
        """Place ``link`` in ``netns`` as it is (on host link ``parent``), as a test's premise."""
        self.links[(self._ident(netns), link.name)] = _PodLink(link, parent)

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        hook = self.hooks.get(name)
        if hook is not None:
            hook(*args)
        failure = self.fail.get(name)
        if failure is not None:
            raise failure

    def called(self, name: str) -> list[tuple[Any, ...]]:
        """The arguments of each call of operation ``name``, in order."""
        return [args for op, args in self.calls if op == name]

    def _ident(self, path: str) -> NetnsIdentity:
        if path in self.gone or not path:
            raise ContainerUnknownError(f"failed to open netns {path}: no such file")
        if path in self.netns_paths:
            return self.netns_paths[path]
        if self.every_path_a_netns:
            return (0xFA0E, zlib.crc32(path.encode()) | 0x10000)
        raise ContainerUnknownError(f"failed to open netns {path}: no such file")

    def link(self, netns: str, ifname: str) -> LinkInfo | None:
        """The link ``ifname`` in ``netns`` as the fake holds it (for assertions)."""
        found = self.links.get((self._ident(netns), ifname))
        return found.info if found else None

    # ----------------------------------------------------------- namespaces, identity
    @contextmanager
    def in_pod(self) -> Iterator[None]:
        self.calls.append(("in_pod", ()))
        self.pod_entries += 1
        yield

    def netns_identity(self, path: str) -> NetnsIdentity:
        self._call("netns_identity", path)
        return self._ident(path)

    def netns_identity_or_none(self, path: str) -> NetnsIdentity | None:
        try:
            return self._ident(path)
        except ContainerUnknownError:
            return None

    def netns_lookup(self, path: str) -> NetnsIdentity | None:
        self._call("netns_lookup", path)
        return self.netns_identity_or_none(path)

    def host_netns_identity(self) -> NetnsIdentity:
        return HOST_NETNS

    def find_netns(self, ident: NetnsIdentity) -> str | None:
        for path, known in self.netns_paths.items():
            if known == ident and path not in self.gone:
                return path
        return None

    def netns_dir_paths(self) -> list[str]:
        return sorted(p for p in self.netns_paths if p.startswith("/var/run/netns/") and p not in self.gone)

    # ----------------------------------------------------------------------- links
    def host_link(self, name: str) -> LinkInfo | None:
        self._call("host_link", name)
        return self.host_links.get(name)

    def link_in_netns(self, netns: str, ifname: str) -> LinkInfo | None:
        self._call("link_in_netns", netns, ifname)
        return self.link(netns, ifname)

    def host_parent_of(self, netns: str, ifname: str) -> LinkInfo | None:
        self._call("host_parent_of", netns, ifname)
        found = self.links.get((self._ident(netns), ifname))
        if found is None or found.parent is None:
            return None
        return self.host_links.get(found.parent)

    def add_sublink(self, spec: SubLinkSpec, *, parent_link: LinkInfo | None, temp: str | None) -> str:
        self._call("add_sublink", spec, temp)
        ident = self._ident(spec.netns)
        if ident == HOST_NETNS:
            raise InvalidEnvironmentError(
                f"failed to create {spec.kind} {spec.ifname}: netns {spec.netns} is the host network namespace"
            )
        what = f"create {spec.kind} {spec.ifname} on {spec.parent}"
        parent = self.host_links.get(spec.parent)
        if parent is None:
            raise NetlinkError(f"failed to {what}: parent link {spec.parent} not found")
        if spec.mtu is not None and spec.mtu > parent.mtu:
            raise InvalidConfigError(
                f"failed to {what}: mtu {spec.mtu} exceeds parent {spec.parent} mtu {parent.mtu}"
            )
        for name in temp_names(temp or temp_name()):
            if (ident, name) in self.links:
                continue
            self._next_index += 1
            mac = spec.mac if spec.kind == "macvlan" and spec.mac else None
            if spec.kind == "ipvlan":
                mac = parent.mac
            self.links[(ident, name)] = _PodLink(
                LinkInfo(
                    name=name,
                    index=self._next_index,
                    kind=spec.kind,
                    mac=mac or f"02:42:00:00:{self._next_index // 256:02x}:{self._next_index % 256:02x}",
                    mtu=spec.mtu or parent.mtu,
                    operstate="DOWN",
                    admin_up=False,
                    parent_index=parent.index,
                    parent_netnsid=0,
                    mode=_mode(spec),
                    ipvlan_flag=_flag(spec),
                    addresses=(),
                    carrier=False,
                ),
                spec.parent,
            )
            return name
        raise NetlinkError(f"failed to {what}: no free temporary name")

    def links_in_netns(self, netns: str) -> list[LinkInfo]:
        self._call("links_in_netns", netns)
        ident = self._ident(netns)
        found = [link.info for (where, _name), link in self.links.items() if where == ident]
        return sorted((replace(i, addresses=None) for i in found), key=lambda i: i.index)

    def rename_and_up(self, spec: SubLinkSpec, temp: str) -> LinkInfo:
        self._call("rename_and_up", spec, temp)
        ident = self._ident(spec.netns)
        what = f"create {spec.kind} {spec.ifname} in netns {spec.netns}"
        made = self.links.pop((ident, temp), None)
        if made is None:
            raise NetlinkError(f"failed to {what}: temporary link {temp} vanished")
        if (ident, spec.ifname) in self.links:  # the kernel refuses; the link is deleted
            raise InvalidEnvironmentError(f"failed to {what}: interface {spec.ifname} already exists")
        if spec.kind == "macvlan" and spec.mac and self._mac_taken(spec.parent, spec.mac):
            raise InvalidConfigError(
                f"failed to {what}: MAC {spec.mac} is already in use on parent {spec.parent}"
            )
        parent = self.host_links.get(spec.parent)
        carrier = parent is not None and parent.carrier
        made.info = replace(
            made.info,
            name=spec.ifname,
            admin_up=True,
            operstate="UP" if carrier else "LOWERLAYERDOWN",
            carrier=carrier,
        )
        self.links[(ident, spec.ifname)] = made
        return replace(made.info, addresses=None)

    def _mac_taken(self, parent: str, mac: str) -> bool:
        owner = self.host_links.get(parent)
        if owner is not None and (owner.mac or "").lower() == mac.lower():
            return True
        return any(
            k.parent == parent and (k.info.mac or "").lower() == mac.lower() for k in self.links.values()
        )

    def delete_link(self, netns: str | None, ifname: str) -> bool:
        self._call("delete_link", netns, ifname)
        if netns is None:
            return self.host_links.pop(ifname, None) is not None
        try:
            ident = self._ident(netns)
        except ContainerUnknownError:
            return False
        self.shaping.pop((ident, ifname), None)  # the qdiscs go with the link (not the ifb device)
        return self.links.pop((ident, ifname), None) is not None

    def delete_temp_links(self, netns: str, first: str, parent: str) -> list[str]:
        self._call("delete_temp_links", netns, first, parent)
        try:
            ident = self._ident(netns)
        except ContainerUnknownError:
            return []
        gone = []
        for name in temp_names(first):
            found = self.links.get((ident, name))
            if found is not None and found.parent == parent and found.info.kind in ("macvlan", "ipvlan"):
                del self.links[(ident, name)]
                gone.append(name)
        return gone

    def set_sysctl(self, netns: str, key: str, value: str | int) -> None:
        self._call("set_sysctl", netns, key, value)
        ident = self._ident(netns)
        parts = key.split("/")
        if len(parts) == 5 and parts[2] == "conf" and (ident, parts[3]) not in self.links:
            raise IOFailureError(f"failed to set sysctl {key} in netns {netns}: No such file or directory")
        self.sysctls[(ident, key)] = str(value)

    def configure_interface(
        self,
        netns: str,
        ifname: str,
        *,
        addresses: Sequence[tuple[str, str | None]],
        routes: Sequence[tuple[str, str | None]],
        nodad: bool,
        settle_timeout_s: float,
    ) -> None:
        self._call("configure_interface", netns, ifname, tuple(addresses), tuple(routes))
        found = self.links.get((self._ident(netns), ifname))
        if found is None:
            raise NetlinkError(f"failed to configure link {ifname} in netns {netns}: no such link")
        have = tuple(found.info.addresses or ())
        found.info = replace(found.info, addresses=have + tuple(a for a, _ in addresses if a not in have))
        found.routes += [r for r in routes if r not in found.routes]

    # ------------------------------------------------------------- traffic control
    def apply_shaping(self, netns: str, ifname: str, spec: ShapeSpec, *, new_link: bool = False) -> ShapeInfo:
        self._call("apply_shaping", netns, ifname, spec, new_link)
        ident = self._ident(netns)
        found = self.links.get((ident, ifname))
        if found is None:
            raise NetlinkError(f"failed to shape {ifname} in netns {netns}: no such link")
        if self.kernel_lacks is not None:
            raise NetlinkError(
                f"failed to shape {ifname} in netns {netns}: kernel lacks {self.kernel_lacks}",
                lacks=self.kernel_lacks,
            )
        spec = spec.at_mtu(found.info.mtu)  # code 7 for a bucket tbf cannot hold, before any change
        installed = ShapeInfo(
            ifname,
            spec.egress,
            spec.ingress,
            ifb_name(ifname) if spec.ingress else None,
            True if spec.ingress else None,
        )
        self.shaping[(ident, ifname)] = installed
        return installed

    def remove_shaping(self, netns: str, ifname: str) -> bool:
        self._call("remove_shaping", netns, ifname)
        try:
            ident = self._ident(netns)
        except ContainerUnknownError:
            return False
        return self.shaping.pop((ident, ifname), None) is not None

    def read_shaping(self, netns: str, ifname: str) -> ShapeInfo | None:
        self._call("read_shaping", netns, ifname)
        return self.shaping.get((self._ident(netns), ifname))

    def delete_shaped_link(self, netns: str, ifname: str) -> tuple[bool, bool]:
        self._call("delete_shaped_link", netns, ifname)
        try:
            ident = self._ident(netns)
        except ContainerUnknownError:
            return False, False
        shaped = self.shaping.pop((ident, ifname), None)
        link_gone = self.links.pop((ident, ifname), None) is not None
        return link_gone, shaped is not None and shaped.ifb is not None

    def remove_leaked_ifbs(self, netns: str) -> list[str]:
        self._call("remove_leaked_ifbs", netns)
        return []  # the fake keeps no ifb device apart from the shaping of its link

    def probe_shaping(self) -> str | None:
        self._call("probe_shaping")
        return self.kernel_lacks

    # --------------------------------------------------------------------- IPAM
    def ipam_add(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> Result:
        self._call("ipam_add", plugin, environ.get("CNI_CONTAINERID"), environ.get("CNI_IFNAME"))
        key = (environ.get("CNI_CONTAINERID", ""), environ.get("CNI_IFNAME", ""))
        if key in self.leases:  # host-local: one allocation per (container, ifname)
            raise IpamError(f"failed to add IPAM {plugin}: duplicate allocation for {key}")
        self.leases[key] = self.ipam_result
        return self.ipam_result

    def ipam_del(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> None:
        self._call("ipam_del", plugin, environ.get("CNI_CONTAINERID"), environ.get("CNI_IFNAME"))
        self.leases.pop((environ.get("CNI_CONTAINERID", ""), environ.get("CNI_IFNAME", "")), None)

    def ipam_check(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> None:
        self._call("ipam_check", plugin, environ.get("CNI_CONTAINERID"), environ.get("CNI_IFNAME"))
        if (environ.get("CNI_CONTAINERID", ""), environ.get("CNI_IFNAME", "")) not in self.leases:
            raise IpamError(f"failed to check IPAM {plugin}: no IP allocated", code=999)

    def ipam_status(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> bool:
        self._call("ipam_status", plugin)
        return True

    def ipam_gc(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> bool:
        self._call("ipam_gc", plugin)
        return True

    # ------------------------------------------------------------------- clock
    def monotonic(self) -> float:
        return self.now_s if self.manual_clock else time.monotonic()

    def sleep(self, seconds: float) -> None:
        if self.manual_clock:
            self.now_s += seconds
        else:
            time.sleep(seconds)


def _mode(spec: SubLinkSpec) -> str | None:
    table = MACVLAN_MODES if spec.kind == "macvlan" else IPVLAN_MODES
    value = spec.data.get("macvlan_mode" if spec.kind == "macvlan" else "ipvlan_mode")
    return next((name for name, v in table.items() if v == value), None)


def _flag(spec: SubLinkSpec) -> str | None:
    if spec.kind != "ipvlan":
        return None
    return next((name for name, v in IPVLAN_FLAGS.items() if v == spec.data.get("ipvlan_flags")), None)
