"""STATUS: can this plugin serve ADD now?

Source: CNI spec 1.1.0 "STATUS: Check plugin status". Exit 0 when the inventory is
readable and at least one of its NICs exists on the host; otherwise
PluginNotAvailableError (50) naming the reason.
"""

from __future__ import annotations

from cni_dra.errors import CniError, PluginNotAvailableError
from cni_dra.verbs.common import Invocation

__all__ = ["cmd_status"]


def cmd_status(inv: Invocation) -> None:
    """Run STATUS for ``inv``. Raises PluginNotAvailableError (50)."""
    from cni_dra.dra.models import device_attribute
    from cni_dra.netlink.links import host_link

    try:
        slice_ = inv.inventory
    except CniError as exc:
        raise PluginNotAvailableError(f"plugin not available: inventory {inv.conf.inventory}: {exc.msg}") from exc
    names = [device_attribute(d, "ifName", slice_.spec.driver) for d in slice_.spec.devices]
    if not any(isinstance(n, str) and host_link(n) is not None for n in names):
        raise PluginNotAvailableError(
            f"plugin not available: none of the inventory's NICs exists on this host ({', '.join(map(str, names))})"
        )
