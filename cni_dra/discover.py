"""Build the node's ResourceSlice from its NICs (``cni-dra inventory discover``).

Shape (resource.k8s.io/v1 ResourceSlice): one device per chosen host interface, named
after it (lowercased, DNS-label safe) unless told otherwise, with attributes ``ifName``,
``mac`` and ``mtu`` and capacity ``bandwidth`` = link speed from sysfs in bits per second
(Kubernetes quantity), else the given default; ``allowMultipleAllocations: true`` (KEP-5075
shared devices) and a requestPolicy: the given one, else ``{default: 1G or the whole value
when smaller, validRange: {min: 1M}}``. Pool and node: the node's name.

Which interfaces:

* ``devices`` (a list of :class:`NicSpec`, e.g. from the Helm chart's values): exactly
  those, in that order, each with its own ``bandwidth`` and ``requestPolicy`` when it names
  them. One the host lacks is kept (``ifName`` only, no ``mac``/``mtu``): the operator named
  it, and the agent publishes it once it exists;
* else ``interfaces``: those of the host's interfaces, in name order;
* else every eligible one: physical-like links (no kind, or veth/bond/team), not loopback,
  not our own macvlan/ipvlan children.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from cni_dra.quantity import Quantity

if TYPE_CHECKING:
    from cni_dra.netlink.info import LinkInfo

__all__ = ["NicSpec", "build_slice", "discover_slice", "device_name_for"]

_ELIGIBLE_KINDS = {None, "", "veth", "bond", "team"}
_ONE_G = Quantity.parse("1G")


class NicSpec(BaseModel):
    """One NIC the operator names: its host interface, and optionally its device name, its
    bandwidth (bits per second, a quantity) and its requestPolicy (KEP-5075, as in a
    ResourceSlice)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    if_name: str = Field(alias="ifName", min_length=1)
    name: str | None = None
    bandwidth: str | None = None
    request_policy: dict[str, Any] | None = Field(default=None, alias="requestPolicy")


def device_name_for(ifname: str) -> str:
    """A DRA device name (DNS label) for a host interface name."""
    name = re.sub(r"[^a-z0-9-]", "-", ifname.lower()).strip("-")
    return (name or "nic")[:63]


def _device(
    name: str, ifname: str, link: LinkInfo | None, value: Quantity, policy: Mapping[str, Any] | None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {"ifName": {"string": ifname}}
    if link is not None:
        if link.mac:
            attributes["mac"] = {"string": link.mac}
        attributes["mtu"] = {"int": link.mtu}
    if policy is None:
        policy = {"default": str(_ONE_G if _ONE_G <= value else value), "validRange": {"min": "1M"}}
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {"bandwidth": {"value": str(value), "requestPolicy": dict(policy)}},
    }


def build_slice(
    links: Iterable[LinkInfo],
    speed_bps: Callable[[str], int | None],
    *,
    interfaces: list[str],
    default_bandwidth: str,
    driver: str,
    node: str,
    request_policy: Mapping[str, Any] | None = None,
    devices: list[NicSpec] | None = None,
) -> dict[str, Any]:
    """The ResourceSlice document for ``links`` (the host's), ``speed_bps`` giving a link's
    speed (None: unknown): module docstring. Raises ValueError for a bad quantity."""
    default_bps = Quantity.parse(default_bandwidth)
    by_name = {link.name: link for link in links}

    def value(ifname: str, given: str | None) -> Quantity:
        if given is not None:
            return Quantity.parse(given)
        speed = speed_bps(ifname) if ifname in by_name else None
        return Quantity.parse(speed) if speed else default_bps

    if devices:
        out = [
            _device(
                d.name or device_name_for(d.if_name),
                d.if_name,
                by_name.get(d.if_name),
                value(d.if_name, d.bandwidth),
                d.request_policy if d.request_policy is not None else request_policy,
            )
            for d in devices
        ]
    else:

        def wanted(link: LinkInfo) -> bool:
            if interfaces:
                return link.name in interfaces
            return link.name != "lo" and link.kind in _ELIGIBLE_KINDS

        chosen = [link for _, link in sorted(by_name.items()) if wanted(link)]
        out = [
            _device(device_name_for(link.name), link.name, link, value(link.name, None), request_policy)
            for link in chosen
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{device_name_for(driver)}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": out,
        },
    }


def discover_slice(
    *,
    interfaces: list[str],
    default_bandwidth: str,
    driver: str,
    node_name: str | None,
    request_policy: Mapping[str, Any] | None = None,
    devices: list[NicSpec] | None = None,
) -> dict[str, Any]:
    """Return the ResourceSlice document (a dict) for this host's NICs (:func:`build_slice`
    over the host's links; ``node_name`` default: the host name)."""
    from cni_dra.netlink.info import link_speed_bps, list_host_links

    return build_slice(
        list_host_links(),
        link_speed_bps,
        interfaces=interfaces,
        default_bandwidth=default_bandwidth,
        driver=driver,
        node=node_name or socket.gethostname(),
        request_policy=request_policy,
        devices=devices,
    )
