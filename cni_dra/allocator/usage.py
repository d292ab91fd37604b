"""What the node's devices already hold: the usage a whole-claim allocation starts from.

Pure: built from plain mappings or from allocation results; nothing is read here. Shared
allocations (with a ``shareID``) add their ``consumedCapacity`` per device and capacity;
a dedicated allocation (no ``shareID``) holds its device whole; an ``adminAccess``
allocation holds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cni_dra.dra.models import Device, DeviceRequestAllocationResult
from cni_dra.quantity import Quantity

__all__ = ["NodeUsage"]

_ZERO = Quantity.ZERO


@dataclass(frozen=True)
class NodeUsage:
    """What is already allocated on the node's devices.

    ``consumed``: device → capacity key → amount consumed by shared allocations
    (summed). ``dedicated``: devices held by a dedicated allocation (no shareID).
    ``shared``: devices holding at least one shared allocation (with shareID).
    """

    consumed: Mapping[str, Mapping[str, Quantity]] = field(default_factory=dict)
    dedicated: frozenset[str] = frozenset()
    shared: frozenset[str] = frozenset()

    @classmethod
    def from_consumed(cls, consumed: Mapping[str, Mapping[str, Quantity]], devices: Iterable[Device]) -> NodeUsage:
        """From the simple ``{device: {capacity: quantity}}`` shape (``--consumed FILE``).

        A dedicated device with any entry is held; a shared device with any entry
        holds shared allocations of those amounts.
        """
        by_name = {d.name: d for d in devices}
        dedicated = set()
        shared_consumed: dict[str, Mapping[str, Quantity]] = {}
        for name, caps in consumed.items():
            dev = by_name.get(name)
            if dev is not None and not dev.shared:
                dedicated.add(name)
            else:
                shared_consumed[name] = dict(caps)
        return cls(shared_consumed, frozenset(dedicated), frozenset(n for n, c in shared_consumed.items() if c))

    @classmethod
    def from_results(cls, results: Iterable[DeviceRequestAllocationResult]) -> NodeUsage:
        """From allocation results: with shareID → shared (consumedCapacity summed), else dedicated."""
        return cls().with_results(results)

    def with_results(self, results: Iterable[DeviceRequestAllocationResult]) -> NodeUsage:
        """This usage plus ``results`` (one claim's ``status.allocation.devices.results``)."""
        consumed = {k: dict(v) for k, v in self.consumed.items()}
        dedicated, shared = set(self.dedicated), set(self.shared)
        for r in results:
            if r.admin_access:
                continue
            if r.share_id is None:
                dedicated.add(r.device)
                continue
            shared.add(r.device)
            slot = consumed.setdefault(r.device, {})
            for cap, amount in (r.consumed_capacity or {}).items():
                slot[cap] = slot.get(cap, _ZERO) + amount
        return NodeUsage(consumed, frozenset(dedicated), frozenset(shared))

    def consumed_on(self, device: str) -> Mapping[str, Quantity]:
        """Capacity key → amount the node's shared allocations consume on ``device``."""
        return self.consumed.get(device, {})
