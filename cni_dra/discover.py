"""Build the node's ResourceSlice from its NICs (``cni-dra inventory discover``).

Shape (resource.k8s.io/v1 ResourceSlice): one device per eligible host interface, named
after it (lowercased, DNS-label safe), with attributes ``ifName``, ``mac``, ``mtu`` and
capacity ``bandwidth`` = link speed from sysfs in bits per second (Kubernetes quantity),
else the given default; ``allowMultipleAllocations: true`` (KEP-5075 shared devices) and a
requestPolicy ``{default: 1G or the whole value when smaller, validRange: {min: 1M}}``.
Eligible: physical-like links (no kind, or veth/bond/team), not loopback, not our own
macvlan/ipvlan children.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from cni_dra.quantity import Quantity

__all__ = ["discover_slice", "device_name_for"]

_ELIGIBLE_KINDS = {None, "", "veth", "bond", "team"}


def device_name_for(ifname: str) -> str:
    """A DRA device name (DNS label) for a host interface name."""
    name = re.sub(r"[^a-z0-9-]", "-", ifname.lower()).strip("-")
    return (name or "nic")[:63]


def discover_slice(*, interfaces: list[str], default_bandwidth: str, driver: str, node_name: str | None) -> dict[str, Any]:
    """Return the ResourceSlice document (a dict) for the host's NICs."""
    from cni_dra.netlink.info import link_speed_bps, list_host_links

    default_bps = Quantity.parse(default_bandwidth)
    node = node_name or socket.gethostname()
    devices = []
    for link in sorted(list_host_links(), key=lambda link: link.name):
        if interfaces and link.name not in interfaces:
            continue
        if not interfaces and (link.name == "lo" or link.kind not in _ELIGIBLE_KINDS):
            continue
        speed = link_speed_bps(link.name)
        value = Quantity.parse(speed) if speed else default_bps
        one_g = Quantity.parse("1G")
        default = one_g if one_g <= value else value
        devices.append(
            {
                "name": device_name_for(link.name),
                "allowMultipleAllocations": True,
                "attributes": {
                    "ifName": {"string": link.name},
                    "mac": {"string": link.mac},
                    "mtu": {"int": link.mtu},
                },
                "capacity": {
                    "bandwidth": {
                        "value": str(value),
                        "requestPolicy": {"default": str(default), "validRange": {"min": "1M"}},
                    }
                },
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{device_name_for(driver)}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
