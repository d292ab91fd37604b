"""ResourceSlice publisher: the node's NICs as one resource.k8s.io/v1 ResourceSlice.

The slice is built from the inventory (the same file the CNI plugin reads) plus what the
host says about each NIC now: attributes ``ifName`` (from the inventory), ``mac`` and
``mtu`` (netlink), ``pciAddress`` and the standard ``resource.kubernetes.io/pcieRoot``
(sysfs, when the NIC is a PCI device). Capacity ``bandwidth`` (bits per second) and its
KEP-5075 requestPolicy, and ``allowMultipleAllocations``, come from the inventory
unchanged.

NIC health (:mod:`cni_dra.agent.nichealth`, debounced): a device whose NIC is unhealthy
carries one device taint (KEP-5055), key ``<driver>/unhealthy``, value the reason
(``carrier-lost``, ``admin-down``, ``missing``), the configured effect (``NoSchedule`` by
default) and ``timeAdded`` the time it turned unhealthy (an earlier one already published
for it stays); the taint goes when the NIC is healthy again. A NIC that vanished keeps its last published attributes and stays in the
slice, tainted ``missing``, until the tracker drops it (``keep_missing_s``); then it is
left out, so the scheduler never allocates it. Without health (``health`` None) a device
whose interface does not exist is left out at once.

One slice per node and pool, named ``<node>-<pool>-<driver>`` (DNS subdomain), with an
owner reference to the Node when it can be read (so it goes away with the Node).
``spec.pool.generation`` starts at the inventory's value and goes up by one each time the
published content changes (KEP-4381: consumers use the highest generation of a pool).
"""

from __future__ import annotations

import copy
import datetime
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from cni_dra.agent.nichealth import rfc3339
from cni_dra.errors import CniError

if TYPE_CHECKING:
    from cni_dra.agent.nichealth import NicStatus
    from cni_dra.k8s.api import KubeApi
    from cni_dra.netlink.info import LinkInfo

__all__ = [
    "slice_name",
    "desired_slice",
    "pci_info",
    "Publisher",
    "PCIE_ROOT_ATTRIBUTE",
    "TAINT_EFFECTS",
    "taint_key",
    "device_taints",
]

log = logging.getLogger("cni_dra.agent.publisher")

PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_PCI_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
"""Device taint effects (resource.k8s.io/v1): no new allocations; that and evict the pods
using it (kube-controller-manager); informational only."""


def taint_key(driver: str) -> str:
    """The key of the NIC health taint: ``<driver>/unhealthy`` (a label name: the driver
    name is a DNS subdomain)."""
    return f"{driver}/unhealthy"


def device_taints(driver: str, status: NicStatus | None, effect: str = "NoSchedule") -> list[dict[str, Any]]:
    """The device taints for a NIC in ``status`` (none when healthy or unknown)."""
    if status is None or status.problem is None:
        return []
    since = (
        status.unhealthy_since_wall_s if status.unhealthy_since_wall_s is not None else status.since_wall_s
    )
    return [
        {"key": taint_key(driver), "value": status.problem, "effect": effect, "timeAdded": rfc3339(since)}
    ]


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
    health: Mapping[str, NicStatus] | None = None,
    taint_effect: str = "NoSchedule",
    known: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ResourceSlice to publish (API dict) from ``inventory`` (API dict of the file).

    ``node``: the Node object (for the owner reference) or None; ``link(ifName)``: host
    link info with ``mac`` and ``mtu`` (bytes), or None when absent; ``pci(ifName)``:
    (PCI address, PCIe root); ``health``: device -> its :class:`NicStatus` (None: no
    health, a device without its interface is left out); ``taint_effect``: the effect of
    health taints; ``known``: device -> attributes published before, for a NIC that is
    absent but still published. ``spec.pool.generation`` is the inventory's; the
    publisher raises it.
    """
    spec = copy.deepcopy(inventory["spec"])
    driver, pool = spec["driver"], spec["pool"]["name"]
    devices = []
    for dev in spec.get("devices") or []:
        attrs = dict(dev.get("attributes") or {})
        if_name = (attrs.get("ifName") or {}).get("string") or dev["name"]
        status = None if health is None else health.get(dev["name"])
        info = link(if_name)
        if (status is not None and status.dropped) or (info is None and status is None):
            continue  # gone (for long enough): the scheduler must not allocate it
        if info is not None:
            if info.mac:
                attrs["mac"] = {"string": info.mac}
            attrs["mtu"] = {"int": int(info.mtu)}
            address, root = pci(if_name)
            if address:
                attrs["pciAddress"] = {"string": address}
            if root:
                attrs[PCIE_ROOT_ATTRIBUTE] = {"string": root}
        else:
            attrs = dict((known or {}).get(dev["name"]) or attrs)  # absent now: as last published
        dev = dict(dev, attributes=attrs)
        taints = device_taints(driver, status, taint_effect)
        if taints:
            dev["taints"] = taints
        devices.append(dev)
    spec["devices"] = devices
    spec["nodeName"] = node_name
    spec["pool"] = {
        "name": pool,
        "generation": int(spec["pool"].get("generation") or 1),
        "resourceSliceCount": 1,
    }
    meta: dict[str, Any] = {"name": slice_name(node_name, pool, driver)}
    if node is not None and (node.get("metadata") or {}).get("uid"):
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": node["metadata"]["uid"],
                "controller": True,
            }
        ]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta, "spec": spec}


def _content(obj: dict[str, Any]) -> tuple[Any, Any]:
    """What a change of makes a new generation: the spec without the generation, and owners.
    Taint times compare as instants (the client reads ``Z`` back as ``+00:00``)."""
    spec = copy.deepcopy(obj.get("spec") or {})
    spec.get("pool", {}).pop("generation", None)
    for dev in spec.get("devices") or []:
        for taint in dev.get("taints") or []:
            if isinstance(taint.get("timeAdded"), str):
                taint["timeAdded"] = _instant(taint["timeAdded"])
    return spec, (obj.get("metadata") or {}).get("ownerReferences")


def _keep_taint_times(want: dict[str, Any], cur: dict[str, Any] | None) -> None:
    """A taint the published slice already has (same device and key) keeps its earlier
    ``timeAdded``: the slice has said "unhealthy since then" all along (an agent restarted
    under a NIC that is down only knows when it first read it)."""
    published = {d["name"]: d.get("taints") or [] for d in (cur or {}).get("spec", {}).get("devices") or []}
    for dev in want["spec"]["devices"]:
        for taint in dev.get("taints") or []:
            for old in published.get(dev["name"], []):
                was, now = _when(old.get("timeAdded")), _when(taint.get("timeAdded"))
                if old.get("key") == taint["key"] and was is not None and now is not None and was < now:
                    taint["timeAdded"] = old["timeAdded"]


def _when(text: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _taints_note(obj: dict[str, Any]) -> str:
    """``; tainted: eth-b=carrier-lost`` for the log, or ``""``."""
    tainted = [
        f"{d['name']}={t.get('value', '')}" for d in obj["spec"]["devices"] for t in d.get("taints") or []
    ]
    return f"; tainted: {', '.join(tainted)}" if tainted else ""


def _instant(text: str) -> str:
    when = _when(text)
    return text if when is None else when.isoformat()


class Publisher:
    """Create, update and delete the node's slice. ``api``: :class:`cni_dra.k8s.api.KubeApi`.

    ``inventory()`` returns the inventory as an API dict (re-read at every sync, so
    ``cni-dra inventory discover`` refreshes it); ``link`` and ``pci`` as for
    :func:`desired_slice`; ``health()``: the NICs' debounced health (None: no taints, an
    absent NIC is left out); ``taint_effect``: the effect of health taints.
    ``on_result(ok)`` is told each publish outcome (metrics).
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        node_name: str,
        inventory: Callable[[], dict[str, Any]],
        link: Callable[[str], LinkInfo | None],
        pci: Callable[[str], tuple[str | None, str | None]] = pci_info,
        health: Callable[[], Mapping[str, NicStatus]] | None = None,
        taint_effect: str = "NoSchedule",
        on_result: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        if taint_effect not in TAINT_EFFECTS:
            raise ValueError(f"taint effect {taint_effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
        self.api = api
        self.node_name = node_name
        self.inventory = inventory
        self.link = link
        self.pci = pci
        self.health = health
        self.taint_effect = taint_effect
        self.on_result = on_result
        self.name: str | None = None
        self._known: dict[str, dict[str, Any]] = {}  # device -> attributes last published

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
        driver = inv["spec"]["driver"]
        name = self.name = slice_name(self.node_name, inv["spec"]["pool"]["name"], driver)
        for other in self.api.list_resource_slices(driver=driver, node_name=self.node_name):
            other_name = other["metadata"]["name"]
            if other_name != name:
                log.info("deleting stale slice %s of this node", other_name)
                self.api.delete_resource_slice(other_name)
        cur = self.api.get_resource_slice(name)
        for dev in (cur or {}).get("spec", {}).get("devices") or []:  # after a restart: what was published
            self._known.setdefault(dev["name"], dev.get("attributes") or {})
        want = desired_slice(
            inv,
            node_name=self.node_name,
            node=node,
            link=self.link,
            pci=self.pci,
            health=None if self.health is None else self.health(),
            taint_effect=self.taint_effect,
            known=self._known,
        )
        self._known.update({dev["name"]: dev["attributes"] for dev in want["spec"]["devices"]})
        _keep_taint_times(want, cur)
        if cur is None:
            self.api.create_resource_slice(want)
            log.info(
                "published slice %s (generation %d%s)",
                name,
                want["spec"]["pool"]["generation"],
                _taints_note(want),
            )
            return "created"
        if _content(cur) == _content(want):
            return "unchanged"
        want["spec"]["pool"]["generation"] = max(
            int(cur["spec"]["pool"].get("generation") or 0) + 1, want["spec"]["pool"]["generation"]
        )
        want["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        self.api.replace_resource_slice(name, want)
        log.info(
            "updated slice %s (generation %d%s)", name, want["spec"]["pool"]["generation"], _taints_note(want)
        )
        return "updated"

    def cleanup(self) -> bool:
        """Delete the node's slice (``--cleanup`` on exit). True when one was deleted."""
        if self.name is None:
            inv = self.inventory()
            self.name = slice_name(self.node_name, inv["spec"]["pool"]["name"], inv["spec"]["driver"])
        return self.api.delete_resource_slice(self.name)
