"""Schema of the node-local state file (``<stateDir>/state.json``).

Shape (schemaVersion 2)::

    {
      "schemaVersion": 2,
      "bootID": "<kernel boot id when the state was last reconciled>",
      "claims": {"<pod UID>": [<resource.k8s.io/v1 ResourceClaim as the API server returns it>, ...]},
      "attachments": [<Attachment>, ...],
      "checksum": "sha256:<hex>"          # added by the store, see cni_dra.state.store
    }

An attachment is one CNI attachment (network name, container ID, ifname: CNI spec 1.1.0
"attachment") holding a share of one device: ``consumedCapacity`` (KEP-5075 allocation
result; bandwidth in bits per second as Kubernetes quantities) and ``shareID``.
``phase`` is ``adding`` from the capacity reservation until the link and IPAM are done,
then ``ready``; an ``adding`` attachment is charged too, so capacity is never over-committed
while an ADD is in flight. DEL sets ``deleting`` before its first side effect.

Intent records (crash safety): while ``phase`` is ``adding`` or ``deleting`` the attachment
names its ``owner`` (the process doing the work, :class:`Owner`) and lists in ``steps`` the
side effects already done (:data:`STEP_LINK`, :data:`STEP_IPAM`). When the owner is dead
the intent is stale and recovery (:mod:`cni_dra.verbs.recover`) undoes it step by step.

Older schemas are migrated on read by :func:`migrate` (one function per version step in
:data:`MIGRATIONS`). Models ignore unknown keys, so adding a field is a backwards-compatible
change that needs no new schema version; a change of meaning does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cni_dra.quantity import Quantity, QuantityField

__all__ = [
    "SCHEMA_VERSION",
    "STEP_LINK",
    "STEP_IPAM",
    "MIGRATIONS",
    "ClaimRef",
    "Owner",
    "Attachment",
    "NodeState",
    "migrate",
]

SCHEMA_VERSION = 2

STEP_LINK = "link"
"""Intent step: the pod's link was created in its netns."""
STEP_IPAM = "ipam"
"""Intent step: IPAM ADD returned addresses for the attachment."""


class ClaimRef(BaseModel):
    """Which prepared ResourceClaim result an attachment uses (claim mode)."""

    model_config = ConfigDict(extra="ignore")

    namespace: str = ""
    name: str = ""
    uid: str = ""
    request: str = ""


class Owner(BaseModel):
    """The process carrying out an intent: ``pid`` and its start time (``/proc/PID/stat``
    field 22, clock ticks since boot) under kernel boot ``boot``; together they name one
    process even after the pid is reused."""

    model_config = ConfigDict(extra="ignore")

    pid: int
    start: int
    boot: str = ""


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
    phase: Literal["adding", "ready", "deleting"] = "adding"
    owner: Owner | None = None  # set while phase is adding/deleting (intent record)
    steps: list[str] = Field(default_factory=list)  # side effects done so far (STEP_*)
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
    bootID: str | None = None
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


def _v1_to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 → 2: adds ``bootID`` (unknown: None) and per-attachment intents (none)."""
    out = dict(obj)
    out["schemaVersion"] = 2
    out.setdefault("bootID", None)
    return out


MIGRATIONS: dict[int, Any] = {1: _v1_to_v2}
"""``{from version: function(raw dict) -> raw dict of version + 1}``."""


def migrate(obj: dict[str, Any]) -> dict[str, Any]:
    """Bring a decoded state object of an older ``schemaVersion`` up to :data:`SCHEMA_VERSION`.

    A missing ``schemaVersion`` counts as 1. Raises ``ValueError`` for a version newer than
    this code or without a migration path.
    """
    version = obj.get("schemaVersion", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"schemaVersion {version!r} is not a positive integer")
    if version > SCHEMA_VERSION:
        raise ValueError(f"schemaVersion {version} is newer than this cni-dra ({SCHEMA_VERSION})")
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:  # pragma: no cover - every version has a step
            raise ValueError(f"no migration from schemaVersion {version}")
        obj = step(obj)
        version = obj["schemaVersion"]
    return obj
