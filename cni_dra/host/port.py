"""The :class:`Host` port: everything a verb asks of the machine.

The verbs (:mod:`cni_dra.verbs`) and the attachment helpers (:mod:`cni_dra.attach`)
receive a ``Host`` (on the :class:`~cni_dra.attach.invocation.Invocation`) instead of
importing the kernel-facing modules. Production: :class:`cni_dra.host.kernel.KernelHost`;
unit tests: an in-memory fake that keeps the kernel's invariants.

Pod-side operations name the namespace by path (``netns``): a verb may act in the
namespace recorded at ADD rather than CNI_NETNS. :meth:`Host.in_pod` is the one scoped
entry into CNI_NETNS: pod-side operations on CNI_NETNS inside it switch no namespace
again. Errors are cni-dra's (:mod:`cni_dra.errors`), as each method of the kernel
modules documents (the production Host raises what they raise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cni_dra.netlink.info import LinkInfo
    from cni_dra.netlink.netns import NetnsIdentity
    from cni_dra.netlink.shaping import ShapeInfo
    from cni_dra.netlink.sublink import SubLinkSpec
    from cni_dra.netlink.tbf import ShapeSpec
    from cni_dra.protocol.results import Result

__all__ = ["Host"]


class Host(Protocol):
    """What a verb needs from the machine (see the module docstring)."""

    # ----------------------------------------------------------- namespaces, identity
    def in_pod(self) -> AbstractContextManager[None]:
        """The calling thread in CNI_NETNS for the block (entered once; nestable).
        Codes 3/4 when CNI_NETNS names no network namespace."""
        ...

    def netns_identity(self, path: str) -> NetnsIdentity:
        """Identity of the namespace at ``path``; ContainerUnknownError (3), InvalidEnvironmentError (4)."""
        ...

    def netns_identity_or_none(self, path: str) -> NetnsIdentity | None:
        """:meth:`netns_identity`, None when ``path`` names no namespace now."""
        ...

    def netns_lookup(self, path: str) -> NetnsIdentity | None:
        """Identity at ``path``, None when gone (missing, or the file left once unmounted);
        InvalidEnvironmentError (4) for something else."""
        ...

    def host_netns_identity(self) -> NetnsIdentity:
        """Identity of the host namespace."""
        ...

    def find_netns(self, ident: NetnsIdentity) -> str | None:
        """A path of the runtimes' netns directory naming ``ident`` now, or None."""
        ...

    def netns_dir_paths(self) -> list[str]:
        """Every path in the runtimes' netns directory (``/var/run/netns``), sorted; none
        when it cannot be read."""
        ...

    # ----------------------------------------------------------------------- links
    def host_link(self, name: str) -> LinkInfo | None:
        """Host link ``name``, None when there is none."""
        ...

    def link_in_netns(self, netns: str, ifname: str) -> LinkInfo | None:
        """Link ``ifname`` in ``netns`` with its addresses, None when absent."""
        ...

    def host_parent_of(self, netns: str, ifname: str) -> LinkInfo | None:
        """The host link that pod link ``ifname`` in ``netns`` sits on, None when none."""
        ...

    def add_sublink(self, spec: SubLinkSpec, *, parent_link: LinkInfo | None, temp: str | None) -> str:
        """Host side: make ``spec`` directly in its netns under a temporary name (returned)."""
        ...

    def rename_and_up(self, spec: SubLinkSpec, temp: str) -> LinkInfo:
        """Pod side: rename ``temp`` to ``spec.ifname`` and set it up; deleted on failure."""
        ...

    def links_in_netns(self, netns: str) -> list[LinkInfo]:
        """Every link of ``netns`` (without addresses). Codes 3/4 for the netns."""
        ...

    def delete_link(self, netns: str | None, ifname: str) -> bool:
        """Delete ``ifname`` in ``netns`` (None: the host's); False when absent or the netns is gone."""
        ...

    def delete_temp_links(self, netns: str, first: str, parent: str) -> list[str]:
        """Delete sub-links on ``parent`` left under the temporary names of ``first``."""
        ...

    def set_sysctl(self, netns: str, key: str, value: str | int) -> None:
        """Write ``/proc/sys/<key>`` as seen from ``netns``; IOFailureError (5)."""
        ...

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
        """Addresses (waiting for IPv6 DAD unless ``nodad``), link up, routes on ``ifname``."""
        ...

    # ------------------------------------------------------------- traffic control
    def apply_shaping(self, netns: str, ifname: str, spec: ShapeSpec, *, new_link: bool = False) -> ShapeInfo:
        """Shape ``ifname`` as ``spec`` says (tbf egress, ifb ingress); NetlinkError (102)."""
        ...

    def remove_shaping(self, netns: str, ifname: str) -> bool:
        """Remove the shaping of ``ifname`` (True when there was some)."""
        ...

    def read_shaping(self, netns: str, ifname: str) -> ShapeInfo | None:
        """The shaping of ``ifname`` as the kernel holds it, None when none."""
        ...

    def delete_shaped_link(self, netns: str, ifname: str) -> tuple[bool, bool]:
        """Delete ``ifname`` and its ifb device: (link deleted, ifb deleted)."""
        ...

    def remove_leaked_ifbs(self, netns: str) -> list[str]:
        """Delete cni-dra's ifb devices of ``netns`` that shape no link any more; their names."""
        ...

    def probe_shaping(self) -> str | None:
        """The piece of shaping the kernel lacks, or None."""
        ...

    # --------------------------------------------------------------------- IPAM
    def ipam_add(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> Result:
        """The IPAM plugin's ADD result; IpamError (its code) or TryAgainLaterError (11)."""
        ...

    def ipam_del(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> None:
        """The IPAM plugin's DEL."""
        ...

    def ipam_check(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> None:
        """The IPAM plugin's CHECK."""
        ...

    def ipam_status(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> bool:
        """The IPAM plugin's STATUS (False: it predates STATUS, nothing was asked)."""
        ...

    def ipam_gc(
        self, plugin: str, netconf: bytes, environ: Mapping[str, str], cni_path: Sequence[str] | None
    ) -> bool:
        """The IPAM plugin's GC (False: it predates GC, nothing was asked)."""
        ...

    # ------------------------------------------------------------------- clock
    def monotonic(self) -> float:
        """Seconds of a monotonic clock."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of :meth:`monotonic` pass."""
        ...
