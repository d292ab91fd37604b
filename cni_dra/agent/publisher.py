"""ResourceSlice publisher: the node's NICs as one resource.k8s.io/v1 ResourceSlice.

The slice is built from the inventory (the same file the CNI plugin reads) plus what the
host says about each NIC now: attributes ``ifName`` (from the inventory), ``mac`` and
``mtu`` (netlink), ``pciAddress`` and the standard ``resource.kubernetes.io/pcieRoot``
(sysfs, when the NIC is a PCI device). Capacity ``bandwidth`` (bits per second) and its
KEP-5075 requestPolicy, and ``allowMultipleAllocations``, come from the inventory
unchanged. A device whose interface does not exist on the host is left out, so the
scheduler never allocates it.

One slice per node and pool, named ``<node>-<pool>-<driver>`` (DNS subdomain), with an
owner reference to the Node when it can be read (so it goes away with the Node).
``spec.pool.generation`` starts at the inventory's value and goes up by one each time the
published content changes (KEP-4381: consumers use the highest generation of a pool).
"""

from __future__ import annotations

import copy
import logging
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cni_dra.errors import CniError

if TYPE_CHECKING:
    from cni_dra.k8s.api import KubeApi
    from cni_dra.netlink.info import LinkInfo

__all__ = ["slice_name", "desired_slice", "pci_info", "Publisher", "PCIE_ROOT_ATTRIBUTE"]

log = logging.getLogger("cni_dra.agent.publisher")

PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_PCI_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def slice_name(node_name: str, pool: str, driver: str) -> str:
    """``<node>-<pool>-<driver>`` as a DNS subdomain (lower case, at most 253 chars)."""
    parts = [node_name] if pool == node_name else [node_name, pool]
    raw = "-".join(parts + [driver]).lower()
    name = re.sub(r"[^a-z0-9.-]", "-", raw).strip("-.")
    return name[:253].rstrip("-.") or "cni-dra"


def pci_info(ifname: str, sysfs_net: str = "/sys/class/net") -> tuple[str | None, str | None]:
    """(PCI address, PCIe root) of a host interface from sysfs, or (None, None).

    ``/sys/class/net/IF/device`` links to ``/sys/devices/pci0000:00/.../0000:3b:00.0``;
    the address is the last component, the root the ``pciDDDD:BB`` component.
    """
    try:
        real = os.path.realpath(os.path.join(sysfs_net, ifname, "device"), strict=True)
    except OSError:
        return None, None
    parts = real.split(os.sep)
    address = parts[-1] if _PCI_ADDRESS.fullmatch(parts[-1]) else None
    root = next((p for p in parts if _PCI_ROOT.fullmatch(p)), None)
    return address, (root if address else None)


def desired_slice(
    inventory: dict[str, Any],
    *,
    node_name: str,
    node: dict[str, Any] | None,
    link: Callable[[str], LinkInfo | None],
    pci: Callable[[str], tuple[str | None, str | None]] = pci_info,
) -> dict[str, Any]:
    """The ResourceSlice to publish (API dict) from ``inventory`` (API dict of the file).

    ``node``: the Node object (for the owner reference) or None; ``link(ifName)``: host
    link info with ``mac`` and ``mtu`` (bytes), or None when absent; ``pci(ifName)``:
    (PCI address, PCIe root). ``spec.pool.generation`` is the inventory's; the publisher
    raises it.
    """
    spec = copy.deepcopy(inventory["spec"])
    driver, pool = spec["driver"], spec["pool"]["name"]
    devices = []
    for dev in spec.get("devices") or []:
        attrs = dict(dev.get("attributes") or {})
        if_name = (attrs.get("ifName") or {}).get("string") or dev["name"]
        info = link(if_name)
        if info is None:
            log.warning("device %s: interface %s does not exist; not published", dev["name"], if_name)
            continue
        if info.mac:
            attrs["mac"] = {"string": info.mac}
        attrs["mtu"] = {"int": int(info.mtu)}
        address, root = pci(if_name)
        if address:
            attrs["pciAddress"] = {"string": address}
        if root:
            attrs[PCIE_ROOT_ATTRIBUTE] = {"string": root}
        dev = dict(dev, attributes=attrs)
        devices.append(dev)
    spec["devices"] = devices
    spec["nodeName"] = node_name
    spec["pool"] = {"name": pool, "generation": int(spec["pool"].get("generation") or 1), "resourceSliceCount": 1}
    meta: dict[str, Any] = {"name": slice_name(node_name, pool, driver)}
    if node is not None and (node.get("metadata") or {}).get("uid"):
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node["metadata"]["uid"], "controller": True}
        ]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta, "spec": spec}


def _content(obj: dict[str, Any]) -> tuple[Any, Any]:
    """What a change of makes a new generation: the spec without the generation, and owners."""
    spec = copy.deepcopy(obj.get("spec") or {})
    spec.get("pool", {}).pop("generation", None)
    return spec, (obj.get("metadata") or {}).get("ownerReferences")


class Publisher:
    """Create, update and delete the node's slice. ``api``: :class:`cni_dra.k8s.api.KubeApi`.

    ``inventory()`` returns the inventory as an API dict (re-read at every sync, so
    ``cni-dra inventory discover`` refreshes it); ``link`` and ``pci`` as for
    :func:`desired_slice`. ``on_result(ok)`` is told each publish outcome (metrics).
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        node_name: str,
        inventory: Callable[[], dict[str, Any]],
        link: Callable[[str], LinkInfo | None],
        pci: Callable[[str], tuple[str | None, str | None]] = pci_info,
        on_result: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.inventory = inventory
        self.link = link
        self.pci = pci
        self.on_result = on_result
        self.name: str | None = None

    def sync(self) -> str:
        """Make the API server hold the desired slice. Returns ``created``, ``updated`` or
        ``unchanged``. Also deletes other slices of this driver on this node (an old pool
        name). Raises CniError subclasses (IOFailureError 5, TryAgainLaterError 11 on a
        concurrent change, InventoryError 7): the caller retries at the next sync.
        """
        try:
            outcome = self._sync()
        except CniError:
            self.on_result("error")
            raise
        self.on_result(outcome)
        return outcome

    def _sync(self) -> str:
        inv = self.inventory()
        node = self.api.get_node(self.node_name)
        want = desired_slice(inv, node_name=self.node_name, node=node, link=self.link, pci=self.pci)
        name = self.name = want["metadata"]["name"]
        for other in self.api.list_resource_slices(driver=want["spec"]["driver"], node_name=self.node_name):
            other_name = other["metadata"]["name"]
            if other_name != name:
                log.info("deleting stale slice %s of this node", other_name)
                self.api.delete_resource_slice(other_name)
        cur = self.api.get_resource_slice(name)
        if cur is None:
            self.api.create_resource_slice(want)
            log.info("published slice %s (generation %d)", name, want["spec"]["pool"]["generation"])
            return "created"
        if _content(cur) == _content(want):
            return "unchanged"
        want["spec"]["pool"]["generation"] = max(
            int(cur["spec"]["pool"].get("generation") or 0) + 1, want["spec"]["pool"]["generation"]
        )
        want["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        self.api.replace_resource_slice(name, want)
        log.info("updated slice %s (generation %d)", name, want["spec"]["pool"]["generation"])
        return "updated"

    def cleanup(self) -> bool:
        """Delete the node's slice (``--cleanup`` on exit). True when one was deleted."""
        if self.name is None:
            inv = self.inventory()
            self.name = slice_name(self.node_name, inv["spec"]["pool"]["name"], inv["spec"]["driver"])
        return self.api.delete_resource_slice(self.name)
