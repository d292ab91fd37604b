"""The production :class:`~cni_dra.host.port.Host`: the kernel, through :mod:`cni_dra.netlink`
and the IPAM plugins through :mod:`cni_dra.ipam`.

One :class:`KernelHost` serves one plugin invocation. It holds CNI_NETNS as one
:class:`~cni_dra.netlink.handle.NetnsHandle`: the path is opened once (on first use), the
identity read from that descriptor, and while the host is open (``with KernelHost(...)``)
every netlink call of this thread that names CNI_NETNS reuses the descriptor instead of
opening the path again; :meth:`KernelHost.in_pod` is the one ``setns`` into it that a
verb's pod-side work shares, as the reference macvlan plugin's ``ns.GetNS(path)`` handed
to one ``netns.Do``. The netlink and IPAM modules are imported when first used (the
no-agent start-up does not pay for what a verb does not call). Each method raises what
the module it calls documents.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cni_dra.netlink.handle import NetnsHandle
    from cni_dra.netlink.info import LinkInfo
    from cni_dra.netlink.netns import NetnsIdentity
    from cni_dra.netlink.shaping import ShapeInfo
    from cni_dra.netlink.sublink import SubLinkSpec
    from cni_dra.netlink.tbf import ShapeSpec
    from cni_dra.protocol.results import Result

__all__ = ["KernelHost"]


class KernelHost:
    """The kernel as a :class:`~cni_dra.host.port.Host`, for one invocation whose
    CNI_NETNS is ``netns`` (empty: none, e.g. a DEL without a namespace, STATUS, GC).
    Use it as a context manager: on exit the namespace's descriptor is closed."""

    def __init__(self, netns: str = "") -> None:
        self._netns = netns
        self._handle: NetnsHandle | None = None
        self._open = ExitStack()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> KernelHost:
        handle = self._pod_handle()
        if handle is not None:
            self._open.enter_context(handle.pinned())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Unpin and close CNI_NETNS's descriptor (idempotent)."""
        self._open.close()
        if self._handle is not None:
            self._handle.close()

    def _pod_handle(self) -> NetnsHandle | None:
        if not self._netns:
            return None
        if self._handle is None:
            from cni_dra.netlink.handle import NetnsHandle

            self._handle = NetnsHandle(self._netns)
        return self._handle

    # ----------------------------------------------------------- namespaces, identity
    @contextmanager
    def in_pod(self) -> Iterator[None]:
        handle = self._pod_handle()
        if handle is None:
            yield
            return
        with handle.entered():
            yield

    def netns_identity(self, path: str) -> NetnsIdentity:
        handle = self._pod_handle()
        if handle is not None and path == handle.path:
            return handle.identity()
        from cni_dra.netlink import netns

        return netns.netns_identity(path)

    def netns_identity_or_none(self, path: str) -> NetnsIdentity | None:
        from cni_dra.errors import CniError

        try:
            return self.netns_identity(path)
        except CniError:
            return None

    def netns_lookup(self, path: str) -> NetnsIdentity | None:
        from cni_dra.netlink import netns

        return netns.netns_lookup(path)

    def host_netns_identity(self) -> NetnsIdentity:
        from cni_dra.netlink import netns

        return netns.host_netns_identity()

    def find_netns(self, ident: NetnsIdentity) -> str | None:
        from cni_dra.netlink import netns

        return netns.find_netns(ident)

    def netns_dir_paths(self) -> list[str]:
        import os

        from cni_dra.netlink.netns import NETNS_DIR

        try:
            names = sorted(os.listdir(NETNS_DIR))
        except OSError:
            return []
        return [os.path.join(NETNS_DIR, name) for name in names]

    # ----------------------------------------------------------------------- links
    def host_link(self, name: str) -> LinkInfo | None:
        from cni_dra.netlink import info

        return info.host_link(name)

    def link_in_netns(self, netns: str, ifname: str) -> LinkInfo | None:
        from cni_dra.netlink import info

        return info.link_in_netns(netns, ifname)

    def host_parent_of(self, netns: str, ifname: str) -> LinkInfo | None:
        from cni_dra.netlink import info

        return info.host_parent_of(netns, ifname)

    def add_sublink(self, spec: SubLinkSpec, *, parent_link: LinkInfo | None, temp: str | None) -> str:
        from cni_dra.netlink import sublink

        return sublink.add_in_netns(spec, parent_link=parent_link, temp=temp)

    def rename_and_up(self, spec: SubLinkSpec, temp: str) -> LinkInfo:
        from cni_dra.netlink import sublink

        return sublink.rename_and_up(spec, temp)

    def links_in_netns(self, netns: str) -> list[LinkInfo]:
        from cni_dra.netlink import info
        from cni_dra.netlink.netns import in_netns

        with in_netns(netns):
            return info.list_host_links()

    def delete_link(self, netns: str | None, ifname: str) -> bool:
        from cni_dra.netlink import sublink

        return sublink.delete_link(netns, ifname)

    def delete_temp_links(self, netns: str, first: str, parent: str) -> list[str]:
        from cni_dra.netlink import sublink

        return sublink.delete_temp_links(netns, first, parent)

    def set_sysctl(self, netns: str, key: str, value: str | int) -> None:
        from cni_dra.netlink import sysctl

        sysctl.set_sysctl_in_netns(netns, key, value)

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
        from cni_dra.netlink import addr

        addr.configure_interface(
            netns,
            ifname,
            addresses=addresses,
            routes=routes,
            wait_ipv6=True,
            nodad=nodad,
            settle_timeout_s=settle_timeout_s,
            describe=False,
        )

    # ------------------------------------------------------------- traffic control
    def apply_shaping(self, netns: str, ifname: str, spec: ShapeSpec, *, new_link: bool = False) -> ShapeInfo:
        from cni_dra.netlink import shaping

        return shaping.apply_shaping(netns, ifname, spec, new_link=new_link)

    def remove_shaping(self, netns: str, ifname: str) -> bool:
        from cni_dra.netlink import shaping

        return shaping.remove_shaping(netns, ifname)

    def read_shaping(self, netns: str, ifname: str) -> ShapeInfo | None:
        from cni_dra.netlink import shaping

        return shaping.read_shaping(netns, ifname)

    def delete_shaped_link(self, netns: str, ifname: str) -> tuple[bool, bool]:
        from cni_dra.netlink import shaping

        return shaping.delete_shaped_link(netns, ifname)

    def remove_leaked_ifbs(self, netns: str) -> list[str]:
        from cni_dra.netlink import shaping

        return shaping.remove_leaked_ifbs(netns)

    def probe_shaping(self) -> str | None:
        from cni_dra.netlink import shaping

        return shaping.probe_kernel()

    # --------------------------------------------------------------------- IPAM
    def ipam_add(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> Result:
        from cni_dra import ipam

        return ipam.ipam_add(plugin, netconf, environ, cni_path)

    def ipam_del(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> None:
        from cni_dra import ipam

        ipam.ipam_del(plugin, netconf, environ, cni_path)

    def ipam_check(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> None:
        from cni_dra import ipam

        ipam.ipam_check(plugin, netconf, environ, cni_path)

    def ipam_status(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> bool:
        from cni_dra import ipam

        return ipam.ipam_status(plugin, netconf, environ, cni_path)

    def ipam_gc(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> bool:
        from cni_dra import ipam

        return ipam.ipam_gc(plugin, netconf, environ, cni_path)

    # ------------------------------------------------------------------- clock
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
