"""Placement: which NIC an ADD's attachment goes on, and what it is charged.

Pure functions over the node state, the inventory and the host link facts (no lock, no
netlink, no I/O: the ADD calls them inside its reserving transaction, tests call them
with plain objects):

* :func:`place_claim`, claim mode: the pod's prepared allocation result for CNI_IFNAME is
  honoured as the scheduler made it (device, consumedCapacity, shareID), after checking
  that it is this node's, that its NIC exists, that the NIC takes this link type and that
  the share still fits. The pods of a ResourceClaim shared by several pods use its one
  share, charged once (:meth:`~cni_dra.state.schema.Attachment.share_key`);
* :func:`place_standalone`: no claim, so cni-dra allocates on the node as the scheduler
  would (KEP-5075 rules, :func:`cni_dra.allocator.select_device`) over the NICs that
  exist, are up and take the configured MTU.

Source: KEP-5075 (consumable capacity). Errors: ClaimError (101), NoCapacityError (100),
InvalidConfigError (7), InventoryError (7).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from cni_dra.attach.invocation import claim_results_for
from cni_dra.errors import ClaimError, InvalidConfigError, InventoryError, NoCapacityError
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, ClaimRef, NodeState
from cni_dra.state.ledger import node_usage
from cni_dra.state.schema import Attachments, PreparedClaim, PreparedResult, whole_capacity

if TYPE_CHECKING:
    from cni_dra.dra.objects import Device, ResourceSlice
    from cni_dra.netlink.info import LinkInfo
    from cni_dra.protocol.config import NetConf

__all__ = [
    "Placement",
    "pick_result",
    "place",
    "place_claim",
    "place_standalone",
    "link_type_conflicts",
    "device_if_name",
]

_DOWN = frozenset({"DOWN", "LOWERLAYERDOWN", "NOTPRESENT"})  # RFC 2863 operstates that carry no traffic


@dataclass(frozen=True)
class Placement:
    """Where an attachment goes: inventory ``device``, its host NIC ``parent`` (the
    attachment's ``ifName``), the amounts charged, the shareID and (claim mode) the claim."""

    device: str
    parent: str
    consumedCapacity: dict[str, Quantity]
    shareID: str | None
    claim: ClaimRef | None = None

    def fields(self) -> dict[str, Any]:
        """The :class:`~cni_dra.state.schema.Attachment` fields this placement sets."""
        return {
            "device": self.device,
            "parent": self.parent,
            "consumedCapacity": dict(self.consumedCapacity),
            "shareID": self.shareID,
            "claim": self.claim,
        }


@dataclass(frozen=True)
class Asker:
    """Who asks: the invocation's pod and interface (CNI_ARGS and CNI_IFNAME)."""

    pod_uid: str | None
    pod_namespace: str | None
    pod_name: str | None
    container_id: str
    ifname: str

    def __str__(self) -> str:
        who = (
            f"pod {self.pod_namespace}/{self.pod_name}" if self.pod_name else f"container {self.container_id}"
        )
        return f"{who} interface {self.ifname}"


def link_type_conflicts(
    attachments: Iterable[Attachment], link_type: str, driver: str, pool: str
) -> dict[str, str]:
    """Devices of (``driver``, ``pool``) that cannot take a link of ``link_type`` now.

    A parent NIC that carries macvlan children cannot take an ipvlan and the reverse
    (the kernel gives a NIC one receive handler: EBUSY). ``attachments`` are the node
    state's; each records its ``linkType``. Returns device name -> reason, e.g.
    ``"carries macvlan links, so it cannot take ipvlan (macvlan and ipvlan cannot share a
    parent NIC)"``. Used as ``exclude`` of :func:`cni_dra.allocator.select_device`.
    Pure; raises nothing.
    """
    out: dict[str, str] = {}
    if isinstance(attachments, Attachments):  # the node state's: its index, not every attachment
        for device, kinds in attachments.kinds_by_device(driver, pool).items():
            other = [k for k in kinds if k != link_type]
            if len(other) == 1:
                out[device] = (
                    f"carries {other[0]} links, so it cannot take {link_type} "
                    "(macvlan and ipvlan cannot share a parent NIC)"
                )
            elif other:  # named after the last one recorded: ask the attachments below
                return link_type_conflicts(list(attachments), link_type, driver, pool)
        return out
    for att in attachments:
        if att.driver == driver and att.pool == pool and att.linkType != link_type:
            out[att.device] = (
                f"carries {att.linkType} links, so it cannot take {link_type} "
                "(macvlan and ipvlan cannot share a parent NIC)"
            )
    return out


def device_if_name(device: Device, driver: str) -> str:
    """The host interface name (``ifName`` attribute) of an inventory device.
    Raises InventoryError (7) when it has none."""
    from cni_dra.dra.objects import device_attribute

    value = device_attribute(device, "ifName", driver)
    if not isinstance(value, str) or not value:
        raise InventoryError(f"invalid inventory: device {device.name}: attributes.ifName.string is missing")
    return value


def pick_result(state: NodeState, conf: NetConf, asker: Asker) -> tuple[PreparedClaim, PreparedResult] | None:
    """The pod's prepared allocation result of ``conf.driver`` for this interface
    (:func:`cni_dra.attach.invocation.claim_results_for`), None in standalone mode."""
    if not asker.pod_uid:
        return None
    return claim_results_for(state.prepared(asker.pod_uid), conf.driver, asker.ifname)


def place(
    state: NodeState,
    slice_: ResourceSlice,
    host_links: Mapping[str, LinkInfo],
    conf: NetConf,
    asker: Asker,
    picked: tuple[PreparedClaim, PreparedResult] | None | EllipsisType = ...,
    *,
    fractional_capacity_range: bool = False,
) -> Placement:
    """Claim mode when the pod has a prepared allocation result of ``conf.driver`` for
    this interface (``picked``, :func:`pick_result`'s when not given), else standalone.
    ``slice_``: the inventory (ResourceSlice); ``host_links``: host interface name → link
    facts (``mtu``, ``admin_up``, ``operstate``); ``conf``: the network config, the
    result's device profile already applied (its ``linkType`` is the link's);
    ``fractional_capacity_range``: the cluster's ``DRAFractionalCapacityRange`` gate, for a
    standalone allocation. Raises as the module docstring says."""
    if picked is ...:
        picked = pick_result(state, conf, asker)
    if picked is not None:
        return place_claim(state, slice_, host_links, picked, conf.linkType, asker)
    return place_standalone(
        state, slice_, host_links, conf, asker, fractional_capacity_range=fractional_capacity_range
    )


def place_claim(
    state: NodeState,
    slice_: ResourceSlice,
    host_links: Mapping[str, LinkInfo],
    picked: tuple[PreparedClaim, PreparedResult],
    link_type: str,
    asker: Asker,
) -> Placement:
    """Honour the prepared allocation result ``picked`` = (claim, result). Raises ClaimError (101)."""
    from cni_dra.allocator import check_fits

    driver, pool = slice_.spec.driver, slice_.spec.pool.name
    devices = {d.name: d for d in slice_.spec.devices}
    claim, res = picked
    name = res.device
    where = f"claim {claim.namespace}/{claim.name} request {res.request!r}"
    if res.pool != pool or name not in devices:
        raise ClaimError(
            f"failed to honour {where}: device {res.pool}/{name} is not in this node's inventory "
            f"(pool {pool}: {', '.join(sorted(devices))})"
        )
    ref = ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid, request=res.request)
    share = (driver, pool, name, ref.uid, ref.request, res.shareID)
    sharing = state.attachments.sharing(share)
    for other in sharing:
        if not asker.pod_uid or other.podUID == asker.pod_uid:
            raise ClaimError(
                f"failed to honour {where} for interface {asker.ifname}: that allocation result is already used "
                f"by interface {other.ifname} of container {other.containerID}"
            )
    device = devices[name]
    parent = device_if_name(device, driver)
    if parent not in host_links:
        raise ClaimError(f"failed to honour {where}: device {name}'s interface {parent} does not exist")
    consumption = dict(res.consumedCapacity)
    if not device.shared or not consumption:
        # A dedicated device (KEP-5075: no allowMultipleAllocations) is held whole; so is a
        # shared one by a result that records no amount (its share is unknown).
        consumption = whole_capacity(device)
    mixed = link_type_conflicts(state.attachments, link_type, driver, pool).get(name)
    if mixed:
        raise ClaimError(f"failed to honour {where} on device {name}: the NIC {mixed}")
    if not sharing:  # another pod of a shared claim already holds (and is charged) this share
        held = node_usage(state, driver, pool, devices, prepared=False).consumed_on(name)
        reason = check_fits(device, held, consumption)
        if reason:
            raise ClaimError(
                f"failed to honour {where} on device {name}: allocation no longer fits: {reason}"
            )
    return Placement(device=name, parent=parent, consumedCapacity=consumption, shareID=res.shareID, claim=ref)


def _describe(requests: Mapping[str, Quantity]) -> str:
    if not requests:
        return "the default capacity"
    return ", ".join(f"{k} {v}" for k, v in sorted(requests.items()))


def _usable(
    slice_: ResourceSlice, host_links: Mapping[str, LinkInfo], mtu: int | None
) -> tuple[list[Device], list[str]]:
    """The inventory devices whose NIC exists, is up and takes ``mtu``; and why the others not."""
    usable: list[Device] = []
    skipped: list[str] = []
    for d in slice_.spec.devices:
        parent = device_if_name(d, slice_.spec.driver)
        link = host_links.get(parent)
        if link is None:
            skipped.append(f"{d.name}: interface {parent} does not exist")
        elif not getattr(link, "admin_up", True) or getattr(link, "operstate", "UP") in _DOWN:  # no traffic
            skipped.append(f"{d.name}: interface {parent} is down")
        elif mtu is not None and mtu > link.mtu:
            skipped.append(f"{d.name}: MTU {link.mtu} of {parent} is below the configured mtu {mtu}")
        else:
            usable.append(d)
    return usable, skipped


def place_standalone(
    state: NodeState,
    slice_: ResourceSlice,
    host_links: Mapping[str, LinkInfo],
    conf: NetConf,
    asker: Asker,
    *,
    fractional_capacity_range: bool = False,
) -> Placement:
    """Allocate ``conf.capacity.requests`` on a usable NIC by ``conf.selectionPolicy``,
    ``conf.selectors`` and ``conf.distinctFrom``, rounding as a scheduler whose
    ``DRAFractionalCapacityRange`` gate is ``fractional_capacity_range`` would. Raises
    NoCapacityError (100) when nothing fits, InvalidConfigError (7) when the configured
    mtu is above every usable NIC's or a device's range cannot compute the request
    (:class:`~cni_dra.allocator.capacity.RequestNotRepresentable`: the scheduler, too,
    refuses such a request outright)."""
    from cni_dra.allocator import NoFit, select_device

    driver, pool = slice_.spec.driver, slice_.spec.pool.name
    devices = {d.name: d for d in slice_.spec.devices}
    requests = dict(conf.capacity.requests)
    usable, skipped = _usable(slice_, host_links, conf.mtu)
    if conf.mtu is not None and not usable and skipped:
        raise InvalidConfigError(
            f"invalid network config {conf.name!r}: mtu {conf.mtu} is above the MTU of every usable parent NIC "
            f"({'; '.join(skipped)})"
        )
    consumed = node_usage(state, driver, pool, devices).consumed
    # A NIC carrying links of the other type cannot take this one (the kernel allows one per parent).
    exclude: dict[str, str] = link_type_conflicts(state.attachments, conf.linkType, driver, pool)
    if conf.distinctFrom == "pod" and asker.pod_uid:
        # Each of a pod's attachments on a different NIC (redundant links), across CNI calls.
        for a in state.attachments:
            if a.podUID == asker.pod_uid and a.driver == driver:
                exclude.setdefault(a.device, "already used by this pod (distinctFrom: pod)")
    choice = select_device(
        usable,
        consumed,
        requests,
        conf.selectionPolicy,
        exclude=exclude,
        driver=driver,
        selectors=[s.cel.expression for s in conf.selectors],
        fractional_capacity_range=fractional_capacity_range,
    )
    if isinstance(choice, NoFit):
        reasons = [f"{dev}: {exclude.get(dev, why)}" for dev, why in sorted(choice.reasons.items())] + skipped
        raise NoCapacityError(
            f"failed to allocate {_describe(requests)} for {asker}: "
            f"no NIC has room ({'; '.join(reasons) or 'the inventory has no devices'})"
        )
    return Placement(
        device=choice.device.name,
        parent=device_if_name(choice.device, driver),
        consumedCapacity=dict(choice.consumed_capacity),
        shareID=str(uuid.uuid4()) if choice.shared else None,
    )
