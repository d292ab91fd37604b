"""STATUS: can this plugin serve ADD now?

Source: CNI spec 1.1.0 "STATUS: Check plugin status" (config version >= 1.1.0, gated by
the entry point with code 1). Exit 0 when the inventory is readable, at least one of its
NICs exists on the host, and the IPAM plugin (``ipam.type``) is ready. Otherwise:

* PluginNotAvailableError (50): the inventory cannot be read or validated, none of its
  NICs exists, or the dhcp IPAM daemon's socket is absent (the reference dhcp plugin
  1.1.1 has no STATUS verb, so cni-dra checks the socket itself);
* the IPAM plugin's own code (50 or 51 when it reports itself unavailable; its STATUS
  is forwarded when it speaks spec 1.1.0, skipped when it is older).
"""

from __future__ import annotations

import os

from cni_dra.errors import CniError, PluginNotAvailableError
from cni_dra.verbs.common import Invocation, ipam_codes

__all__ = ["cmd_status", "DHCP_DEFAULT_SOCKET", "dhcp_socket_missing"]

DHCP_DEFAULT_SOCKET = "/run/cni/dhcp.sock"
"""Where the reference dhcp daemon listens unless ``ipam.daemonSocketPath`` says otherwise."""


def cmd_status(inv: Invocation) -> None:
    """Run STATUS for ``inv``. Raises PluginNotAvailableError (50) or the IPAM plugin's error."""
    from cni_dra import ipam
    from cni_dra.dra.models import device_attribute
    from cni_dra.netlink import info  # called as info.host_link: the seam tests patch

    conf = inv.conf
    try:
        slice_ = inv.inventory
    except CniError as exc:
        raise PluginNotAvailableError(f"plugin not available: inventory {conf.inventory}: {exc.msg}") from exc
    names = [device_attribute(d, "ifName", slice_.spec.driver) for d in slice_.spec.devices]
    if not any(isinstance(n, str) and info.host_link(n) is not None for n in names):
        raise PluginNotAvailableError(
            f"plugin not available: none of the inventory's NICs exists on this host ({', '.join(map(str, names))})"
        )
    if not conf.ipam_type:
        return
    with ipam_codes():
        forwarded = ipam.ipam_status(conf.ipam_type, inv.raw, inv.environ, inv.env.path)
    sock = None if forwarded else dhcp_socket_missing(conf.ipam.model_dump())
    if sock:
        raise PluginNotAvailableError(
            f"plugin not available: the dhcp IPAM daemon socket {sock} is absent "
            "(start the reference dhcp daemon: dhcp daemon)"
        )


def dhcp_socket_missing(ipam_conf: dict[str, object]) -> str | None:
    """For ``ipam.type`` dhcp: the daemon socket path (``ipam.daemonSocketPath``, default
    :data:`DHCP_DEFAULT_SOCKET`) when no socket is there; None otherwise or for other types."""
    if ipam_conf.get("type") != "dhcp":
        return None
    sock = str(ipam_conf.get("daemonSocketPath") or DHCP_DEFAULT_SOCKET)
    return None if _is_socket(sock) else sock


def _is_socket(path: str) -> bool:
    import stat

    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


