"""What the node's devices already hold: the one ledger every capacity decision reads.

Pure: nothing is read here. Every allocation the node holds (an attachment, a prepared
claim's result, a result the allocator just made) is one :data:`Charge`, and
:meth:`NodeUsage.plus` is the one function that adds charges up: each capacity summed per
device, a share charged by several records (pods sharing one claim's share) counted once,
and the devices held by a dedicated allocation. The node state's charges are made by
:func:`cni_dra.state.ledger.node_usage`, an allocation result's by :func:`result_charge`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cni_dra.quantity import Format, Quantity

if TYPE_CHECKING:
    from cni_dra.dra.claims import DeviceRequestAllocationResult
    from cni_dra.dra.objects import Device

__all__ = ["Charge", "NodeUsage", "result_charge", "whole_capacity"]

Charge = tuple[str, Mapping[str, Quantity], bool, Hashable | None]
"""One allocation as the books count it: ``(device, consumed, dedicated, share)``.
``consumed``: capacity name -> amount it holds (a dedicated allocation, or one whose amount
is unknown, holds the device's whole capacity: :func:`whole_capacity`); ``dedicated``: it
holds the device exclusively (KEP-5075: a device without ``allowMultipleAllocations``);
``share``: charges with the same share (not None) are one allocation, counted once. A plain
tuple: the node state makes one per attachment, 10,000 of them on a large node."""


def whole_capacity(device: Device | None) -> dict[str, Quantity]:
    """Every capacity of ``device`` (a resource.k8s.io/v1 Device, or None: nothing) at its full value."""
    if device is None:
        return {}
    return {k: c.value for k, c in device.capacity.items()}


def is_dedicated(device: Device | None, share_id: str | None) -> bool:
    """Whether an allocation on ``device`` holds it exclusively: the inventory says so (no
    ``allowMultipleAllocations``); for a device the inventory lacks, the allocation's own
    record (no ``shareID``)."""
    return not device.shared if device is not None else share_id is None


def result_charge(result: DeviceRequestAllocationResult, device: Device | None) -> Charge | None:
    """The charge of one allocation result on ``device`` (its inventory entry, or None);
    None for an ``adminAccess`` result, which holds nothing."""
    if result.admin_access:
        return None
    consumed = result.consumed_capacity or whole_capacity(device)
    return (result.device, consumed, is_dedicated(device, result.share_id), None)


@dataclass(frozen=True)
class NodeUsage:
    """What is already allocated on the node's devices.

    ``consumed``: device -> capacity key -> amount held (summed). ``dedicated``: devices
    held by a dedicated allocation. ``shared``: devices holding at least one shared
    allocation. ``shares``: the shares already counted (a later charge of one is not).
    """

    consumed: Mapping[str, Mapping[str, Quantity]] = field(default_factory=dict)
    dedicated: frozenset[str] = frozenset()
    shared: frozenset[str] = frozenset()
    shares: frozenset[Hashable] = frozenset()

    def plus(self, charges: Iterable[Charge | None]) -> NodeUsage:
        """This usage with ``charges`` added (None entries skipped): the one place amounts
        are added up. Sums are exact (integer nano-units); a sum takes the format of its
        first amount, as :meth:`Quantity.__add__ <cni_dra.quantity.Quantity.__add__>` does."""
        sums: dict[str, dict[str, int]] = {}
        formats: dict[tuple[str, str], Format] = {}
        for device, caps in self.consumed.items():
            sums[device] = {name: q.nanos for name, q in caps.items()}
            formats.update(((device, name), q.format) for name, q in caps.items())
        dedicated, shared, shares = set(self.dedicated), set(self.shared), set(self.shares)
        for device, consumed, exclusive, share in filter(None, charges):
            if share is not None:
                if share in shares:  # one share held by several records: counted once
                    continue
                shares.add(share)
            if exclusive:
                dedicated.add(device)
            else:
                shared.add(device)
            if not consumed:
                continue
            slot = sums.get(device)
            if slot is None:
                slot = sums[device] = {}
            for name, amount in consumed.items():
                if type(amount) is not Quantity:  # assigned unvalidated (a string)
                    amount = Quantity.parse(amount)
                n = slot.get(name, 0)
                if n == 0:  # as Quantity.__add__: a zero sum takes the addend's format
                    formats[(device, name)] = amount.format
                slot[name] = n + amount.nanos
        consumed_out = {
            device: {name: Quantity.from_nanos(n, formats[(device, name)]) for name, n in slot.items()}
            for device, slot in sums.items()
        }
        return NodeUsage(consumed_out, frozenset(dedicated), frozenset(shared), frozenset(shares))

    @classmethod
    def from_consumed(
        cls, consumed: Mapping[str, Mapping[str, Quantity]], devices: Iterable[Device]
    ) -> NodeUsage:
        """From the simple ``{device: {capacity: quantity}}`` shape (``--consumed FILE``):
        each entry one charge, dedicated when the inventory's device is."""
        by_name = {d.name: d for d in devices}
        return cls().plus(
            (name, caps, is_dedicated(by_name.get(name), ""), None) for name, caps in consumed.items()
        )

    @classmethod
    def from_results(
        cls, results: Iterable[DeviceRequestAllocationResult], devices: Iterable[Device] = ()
    ) -> NodeUsage:
        """From allocation results on ``devices`` (the inventory): :func:`result_charge` each."""
        return cls().with_results(results, devices)

    def with_results(
        self, results: Iterable[DeviceRequestAllocationResult], devices: Iterable[Device] = ()
    ) -> NodeUsage:
        """This usage plus ``results`` (one claim's ``status.allocation.devices.results``) on
        ``devices`` (the inventory; a device it lacks is judged by the result's shareID)."""
        by_name = {d.name: d for d in devices}
        return self.plus(result_charge(r, by_name.get(r.device)) for r in results)

    def consumed_on(self, device: str) -> Mapping[str, Quantity]:
        """Capacity key -> amount the node's allocations hold on ``device``."""
        return self.consumed.get(device, {})
