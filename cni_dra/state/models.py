"""Schema of the node-local state file (``<stateDir>/state.json``).

Shape (schemaVersion 1)::

    {
      "schemaVersion": 1,
      "claims": {"<pod UID>": [<resource.k8s.io/v1 ResourceClaim as the API server returns it>, ...]},
      "attachments": [<Attachment>, ...]
    }

An attachment is one CNI attachment (network name, container ID, ifname: CNI spec 1.1.0
"attachment") holding a share of one device: ``consumedCapacity`` (KEP-5075 allocation
result; bandwidth in bits per second as Kubernetes quantities) and ``shareID``.
``phase`` is ``adding`` from the capacity reservation until the link and IPAM are done,
then ``ready``; an ``adding`` attachment is charged too, so capacity is never over-committed
while an ADD is in flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cni_dra.quantity import Quantity, QuantityField

__all__ = ["SCHEMA_VERSION", "ClaimRef", "Attachment", "NodeState"]

SCHEMA_VERSION = 1


class ClaimRef(BaseModel):
    """Which prepared ResourceClaim result an attachment uses (claim mode)."""

    model_config = ConfigDict(extra="ignore")

    namespace: str = ""
    name: str = ""
    uid: str = ""
    request: str = ""


class Attachment(BaseModel):
    """One CNI attachment and the capacity it holds on one device."""

    model_config = ConfigDict(extra="ignore")

    network: str
    containerID: str
    ifname: str
    netns: str = ""
    podUID: str | None = None
    podNamespace: str | None = None
    podName: str | None = None
    driver: str
    pool: str
    device: str
    ifName: str  # the parent NIC's host interface name
    linkType: str = "macvlan"
    consumedCapacity: dict[str, QuantityField] = Field(default_factory=dict)
    shareID: str | None = None
    claim: ClaimRef | None = None
    phase: Literal["adding", "ready"] = "adding"
    ipamType: str | None = None
    ipamConf: str | None = None  # the network config given to IPAM ADD, for release without the runtime
    result: dict[str, Any] | None = None  # CNI result (1.1.0 schema) of the ADD

    @property
    def key(self) -> tuple[str, str, str]:
        """(network name, container ID, ifname): the CNI attachment key."""
        return (self.network, self.containerID, self.ifname)


class NodeState(BaseModel):
    """The whole state file. See module docstring for the shape."""

    model_config = ConfigDict(extra="ignore")

    schemaVersion: int = SCHEMA_VERSION
    claims: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    attachments: list[Attachment] = Field(default_factory=list)
    # ResourceClaim status records left by ADD for the agent (cni_dra.state.claim_status)
    statusUpdates: list[dict[str, Any]] = Field(default_factory=list)

    def find(self, network: str, container_id: str, ifname: str) -> Attachment | None:
        """The attachment with that key, or None."""
        for att in self.attachments:
            if att.network == network and att.containerID == container_id and att.ifname == ifname:
                return att
        return None

    def remove(self, network: str, container_id: str, ifname: str) -> Attachment | None:
        """Remove and return the attachment with that key (None when absent)."""
        for i, att in enumerate(self.attachments):
            if att.key == (network, container_id, ifname):
                return self.attachments.pop(i)
        return None

    def consumed_by_device(
        self, driver: str, pool: str, devices: Mapping[str, Any] | None = None
    ) -> dict[str, dict[str, Quantity]]:
        """Capacity charged per device of (driver, pool): device name → capacity name → amount.

        Counts every attachment (``adding`` and ``ready``) plus every prepared claim result of
        that driver and pool that no attachment uses yet (the scheduler already granted it).
        ``devices`` (name → resource.k8s.io/v1 Device) lets a result without
        ``consumedCapacity`` on a dedicated device (KEP-5075: no allowMultipleAllocations)
        hold that device's whole capacity.
        """
        out: dict[str, dict[str, Quantity]] = {}

        def charge(device: str, consumed: dict[str, Quantity]) -> None:
            slot = out.setdefault(device, {})
            for name, amount in consumed.items():
                slot[name] = slot[name] + amount if name in slot else amount

        used_shares: set[tuple[str, str, str | None]] = set()
        for att in self.attachments:
            if att.driver == driver and att.pool == pool:
                charge(att.device, att.consumedCapacity)
                used_shares.add((att.device, att.claim.uid if att.claim else "", att.shareID))
        for claims in self.claims.values():
            for claim in claims:
                uid = (claim.get("metadata") or {}).get("uid", "")
                for res in _claim_results(claim):
                    if res.get("driver") != driver or res.get("pool") != pool:
                        continue
                    key = (res.get("device", ""), uid, res.get("shareID"))
                    if key in used_shares:
                        continue
                    used_shares.add(key)  # the same claim prepared for two pods counts once
                    cc = res.get("consumedCapacity") or {}
                    device = (devices or {}).get(res.get("device", ""))
                    if not cc and device is not None and not device.shared:
                        charge(device.name, {k: c.value for k, c in device.capacity.items()})
                        continue
                    charge(res.get("device", ""), {k: Quantity.parse(v) for k, v in cc.items()})
        return out


def _claim_results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    status = claim.get("status") or {}
    alloc = status.get("allocation") or {}
    devices = alloc.get("devices") or {}
    return list(devices.get("results") or [])
