"""Schema of the node-local state file (``<stateDir>/state.json``).

Shape (schemaVersion 3)::

    {
      "schemaVersion": 3,
      "bootID": "<kernel boot id when the state was last reconciled>",
      "claims": {"<pod UID>": [<resource.k8s.io/v1 ResourceClaim as the API server returns it>, ...]},
      "attachments": [<Attachment>, ...],
      "journal": {"id": "<hex>", "seq": N},  # added by the store: changes since are journaled
      "checksum": "sha256:<hex>"          # added by the store, see cni_dra.state.codec
    }

An attachment is one CNI attachment (network name, container ID, ifname: CNI spec 1.1.0
"attachment") holding a share of one device: ``consumedCapacity`` (KEP-5075 allocation
result; bandwidth in bits per second as Kubernetes quantities) and ``shareID``. A record
that names no amount (a schema-1 file could leave ``consumedCapacity`` out) holds its
device's whole capacity, see :meth:`Attachment.charged`; so does a prepared claim result
without ``consumedCapacity``.
``phase`` is ``adding`` from the capacity reservation until the link and IPAM are done,
then ``ready``; an ``adding`` attachment is charged too, so capacity is never over-committed
while an ADD is in flight. DEL sets ``deleting`` before its first side effect.

Intent records (crash safety): while ``phase`` is ``adding`` or ``deleting`` the attachment
names its ``owner`` (the process doing the work, :class:`Owner`) and lists in ``steps`` the
side effects already done (:data:`STEP_LINK`, :data:`STEP_IPAM`). When the owner is dead
the intent is stale and recovery (:mod:`cni_dra.verbs.recover`) undoes it step by step.

``readyAt`` (optional; absent in attachments written before it existed) is when ADD made
the attachment ``ready``: GC leaves an attachment alone for a grace period after that
(:mod:`cni_dra.verbs.gc`), since a runtime's list of valid attachments may predate it.

``shaping`` (optional; absent when the attachment is not shaped, or was written before the
field existed) is the traffic control ADD installed on the pod interface: ``{"egress": {"rateBps", "burstBytes", "limitBytes"}, "ingress": {...}, "ifb":
"<ifb device>"}``, an unshaped direction left out (:mod:`cni_dra.verbs.shaping`); CHECK
compares the kernel with it.

Older schemas are migrated on read by :func:`migrate` (one function per version step in
:data:`MIGRATIONS`). Models ignore unknown keys, so adding a field is a backwards-compatible
change that needs no new schema version; a change of meaning does.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Self, SupportsIndex

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, model_validator
from pydantic_core import CoreSchema, core_schema

from cni_dra.quantity import Quantity, QuantityField

__all__ = [
    "SCHEMA_VERSION",
    "STEP_LINK",
    "TOUCHED",
    "STEP_IPAM",
    "MIGRATIONS",
    "ClaimRef",
    "Owner",
    "Attachment",
    "NodeState",
    "migrate",
    "whole_capacity",
    "ready_at",
]

SCHEMA_VERSION = 3

STEP_LINK = "link"
"""Intent step: the pod's link was created in its netns."""
STEP_IPAM = "ipam"
"""Intent step: IPAM ADD returned addresses for the attachment."""


def ready_at(now_s: float) -> str:
    """``Attachment.readyAt`` for Unix time ``now_s``: RFC 3339 UTC to the millisecond
    (``2025-01-02T03:04:05.678Z``), the form Kubernetes timestamps take."""
    when = datetime.datetime.fromtimestamp(now_s, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


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
    readyAt: str | None = None  # when ADD made it ready, RFC 3339 UTC (see ready_at); GC spares young ones
    shaping: dict[str, Any] | None = None  # traffic control ADD installed (see below)

    @property
    def key(self) -> tuple[str, str, str]:
        """(network name, container ID, ifname): the CNI attachment key."""
        return (self.network, self.containerID, self.ifname)

    def share_key(self) -> tuple[str, str, str, str, str, str | None] | None:
        """(driver, pool, device, claim UID, request, shareID) of a claim-mode attachment,
        None in standalone mode. Attachments of several pods that use one ResourceClaim
        (a claim shared by pods) have the same key: they hold one share, charged once."""
        if self.claim is None:
            return None
        return (self.driver, self.pool, self.device, self.claim.uid, self.claim.request, self.shareID)

    def charged(self, device: Any | None) -> dict[str, Quantity]:
        """What this attachment holds on ``device`` (the resource.k8s.io/v1 Device it names,
        None when the inventory lacks it), as every sum of consumed capacity counts it.

        Its ``consumedCapacity``; when that names no amount at all (a schema-1 record
        without the key, or a claim result without ``consumedCapacity``) the device's whole
        capacity: the share is unknown, charging less could promise the NIC twice (``cni-dra
        state repair`` charges an untracked link the same way), and the pod's DEL releases
        it. A device unknown to the inventory has nothing to charge.
        """
        if self.consumedCapacity:
            return {k: v if type(v) is Quantity else Quantity.parse(v) for k, v in self.consumedCapacity.items()}
        return whole_capacity(device)

    def ready_age_s(self, now_s: float) -> float | None:
        """Seconds from ``readyAt`` to ``now_s`` (Unix time); None when ``readyAt`` is unset
        (an attachment written before the field existed) or unreadable. Negative when the
        wall clock went back since."""
        if not self.readyAt:
            return None
        try:
            when = datetime.datetime.fromisoformat(self.readyAt.replace("Z", "+00:00"))
        except ValueError:
            return None
        if when.tzinfo is None:
            return None
        return now_s - when.timestamp()

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        TOUCHED[id(self)] = self  # the store journals what a transaction assigned


def whole_capacity(device: Any | None) -> dict[str, Quantity]:
    """Every capacity of ``device`` (a resource.k8s.io/v1 Device, or None: nothing) at its full value."""
    if device is None:
        return {}
    return {k: c.value for k, c in device.capacity.items()}


TOUCHED: dict[int, Attachment] = {}
"""Attachments whose fields were assigned since the store last looked (id → object).

The store (:mod:`cni_dra.state.txn`) journals a transaction's changes instead of
rewriting the whole file, so it must know which attachments changed: assigning a field
registers the attachment here. Change an attachment by assigning its fields
(``att.steps = [*att.steps, step]``), never by mutating a field's value in place."""


class AttachmentList(list[Attachment]):
    """``NodeState.attachments``: a list that indexes its attachments by key and logs, since
    :meth:`begin`, what was appended and removed (``events``) and whether anything else
    changed its order (``reordered``: insert, item assignment, slice deletion, sort,
    reverse). The store turns the log into journal ops in O(change) instead of comparing
    the whole list. An attachment's key fields must not be reassigned while it is listed.
    """

    def __init__(self, items: Iterable[Attachment] = ()) -> None:
        super().__init__(items)
        self.events: list[tuple[bool, Attachment]] = []  # (added?, attachment), in order
        self.reordered = False
        self._index: dict[tuple[str, str, str], Attachment] | None = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """Validated and serialised as a ``list[Attachment]``, then wrapped in this class."""
        return core_schema.no_info_after_validator_function(cls, handler(list[Attachment]))

    def __reduce__(self) -> tuple[Any, ...]:  # copies start with a fresh log and index
        return (AttachmentList, (list(self),))

    def begin(self) -> None:
        """Start a new log (the store calls this when a transaction starts)."""
        self.events = []
        self.reordered = False

    def by_key(self) -> dict[tuple[str, str, str], Attachment]:
        """Key → attachment (built on first use, then kept up to date)."""
        if self._index is None:
            self._index = {a.key: a for a in self}
        return self._index

    def _added(self, att: Attachment) -> None:
        self.events.append((True, att))
        if self._index is not None:
            self._index[att.key] = att

    def _dropped(self, att: Attachment) -> None:
        self.events.append((False, att))
        if self._index is not None and self._index.get(att.key) is att:
            del self._index[att.key]

    def _messed(self) -> None:
        self.reordered = True
        self._index = None

    def append(self, att: Attachment) -> None:
        super().append(att)
        self._added(att)

    def extend(self, items: Iterable[Attachment]) -> None:
        for att in list(items):
            self.append(att)

    # list.__iadd__ takes any iterable, while typeshed's list.__add__ takes only a list.
    def __iadd__(self, items: Iterable[Attachment], /) -> Self:  # type: ignore[override,misc]
        self.extend(items)
        return self

    def pop(self, i: SupportsIndex = -1) -> Attachment:
        att = super().pop(i)
        self._dropped(att)
        return att

    def remove(self, att: Attachment) -> None:
        ids = list(map(id, self))  # by identity first (C speed; == on models is slow)
        try:
            self.pop(ids.index(id(att)))
        except ValueError:
            self.pop(super().index(att))

    def clear(self) -> None:
        for att in list(self):
            self._dropped(att)
        super().clear()

    def insert(self, i: SupportsIndex, att: Attachment) -> None:
        super().insert(i, att)
        self._messed()

    def __setitem__(self, i: Any, value: Any) -> None:
        super().__setitem__(i, value)
        self._messed()

    def __delitem__(self, i: Any) -> None:
        super().__delitem__(i)
        self._messed()

    def __imul__(self, n: SupportsIndex) -> Self:
        super().__imul__(n)
        self._messed()
        return self

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        self._messed()

    def reverse(self) -> None:
        super().reverse()
        self._messed()


class NodeState(BaseModel):
    """The whole state file. See module docstring for the shape."""

    model_config = ConfigDict(extra="ignore")

    schemaVersion: int = SCHEMA_VERSION
    bootID: str | None = None
    claims: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    attachments: AttachmentList = Field(default_factory=AttachmentList)
    # ResourceClaim status records left by ADD for the agent (cni_dra.state.claim_status)
    statusUpdates: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _track_attachments(self) -> NodeState:
        if type(self.attachments) is not AttachmentList:
            self.__dict__["attachments"] = AttachmentList(self.attachments)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "attachments" and type(value) is not AttachmentList:
            value = AttachmentList(value)
        super().__setattr__(name, value)

    def find(self, network: str, container_id: str, ifname: str) -> Attachment | None:
        """The attachment with that key, or None (an index lookup)."""
        return self.attachments.by_key().get((network, container_id, ifname))

    def remove(self, network: str, container_id: str, ifname: str) -> Attachment | None:
        """Remove and return the attachment with that key (None when absent)."""
        att = self.find(network, container_id, ifname)
        if att is not None:
            self.attachments.remove(att)
        return att

    def consumed_by_device(
        self, driver: str, pool: str, devices: Mapping[str, Any] | None = None
    ) -> dict[str, dict[str, Quantity]]:
        """Capacity charged per device of (driver, pool): device name → capacity name → amount.

        Counts every attachment (``adding`` and ``ready``) plus every prepared claim result of
        that driver and pool that no attachment uses yet (the scheduler already granted it),
        each exactly once; the attachments of several pods sharing one claim's share
        (:meth:`Attachment.share_key`) count as one. ``devices`` (name → resource.k8s.io/v1 Device; the ADD path, the
        status report and ``allocate --state-dir`` pass the inventory's) lets a record that names
        no amount hold its device's whole capacity (:meth:`Attachment.charged`): an
        attachment without ``consumedCapacity``, which then also covers the prepared results
        of its claim on that device, and a claim result without ``consumedCapacity`` (on a
        dedicated device, KEP-5075 records none). Without ``devices`` such records count
        nothing.
        """
        out: dict[str, dict[str, Quantity]] = {}

        def charge(device: str, consumed: dict[str, Quantity]) -> None:
            slot = out.setdefault(device, {})
            for name, amount in consumed.items():
                slot[name] = slot[name] + amount if name in slot else amount

        # Attachments: summed as integers (nano-units), one Quantity per device and name at the end.
        sums: dict[str, dict[str, int]] = {}
        formats: dict[tuple[str, str], Any] = {}
        used_shares: set[tuple[str, str, str | None]] = set()
        whole: set[tuple[str, str]] = set()  # (device, claim uid) held whole by an unrecorded attachment
        with_claims = bool(self.claims)  # shares in use matter only against prepared claims
        counted: set[tuple[str, str, str, str, str, str | None]] = set()
        for att in self.attachments:
            if att.driver == driver and att.pool == pool:
                key = att.share_key()
                if key is not None:
                    if key in counted:  # a claim shared by pods: its share counts once
                        continue
                    counted.add(key)
                slot_n = sums.get(att.device)
                if slot_n is None:
                    slot_n = sums[att.device] = {}
                consumed = att.consumedCapacity
                if not consumed:  # no amount recorded: the whole device (Attachment.charged)
                    consumed = att.charged((devices or {}).get(att.device))
                    if att.claim is not None:
                        whole.add((att.device, att.claim.uid))
                for name, amount in consumed.items():
                    if type(amount) is not Quantity:  # assigned unvalidated (a string)
                        amount = Quantity.parse(amount)
                    n = slot_n.get(name, 0)
                    if n == 0:  # as Quantity.__add__: a zero sum takes the addend's format
                        formats[(att.device, name)] = amount.format
                    slot_n[name] = n + amount.nanos
                if with_claims:
                    used_shares.add((att.device, att.claim.uid if att.claim else "", att.shareID))
        for device, slot_n in sums.items():
            out[device] = {name: Quantity.from_nanos(n, formats[(device, name)]) for name, n in slot_n.items()}
        for claims in self.claims.values():
            for claim in claims:
                uid = (claim.get("metadata") or {}).get("uid", "")
                for res in _claim_results(claim):
                    if res.get("driver") != driver or res.get("pool") != pool:
                        continue
                    share = (res.get("device", ""), uid, res.get("shareID"))
                    if share in used_shares or share[:2] in whole:
                        continue
                    used_shares.add(share)  # the same claim prepared for two pods counts once
                    cc = res.get("consumedCapacity") or {}
                    dev = (devices or {}).get(res.get("device", ""))
                    if not cc and dev is not None:  # dedicated (none recorded), or unknown: whole
                        charge(dev.name, whole_capacity(dev))
                        continue
                    charge(res.get("device", ""), {k: Quantity.parse(v) for k, v in cc.items()})
        return out


def _claim_results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    status = claim.get("status") or {}
    alloc = status.get("allocation") or {}
    devices = alloc.get("devices") or {}
    return list(devices.get("results") or [])


def _v1_to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 → 2: adds ``bootID`` (unknown: None) and per-attachment intents (none).

    Schema 1 had no checksum and allowed an attachment without ``consumedCapacity`` (or
    with ``null``): such a record keeps naming no amount, which every capacity sum reads
    as the whole device (:meth:`Attachment.charged`), never as zero.
    """
    out = dict(obj)
    out["schemaVersion"] = 2
    out.setdefault("bootID", None)
    atts = out.get("attachments")
    if isinstance(atts, list):
        out["attachments"] = [
            {k: v for k, v in a.items() if k != "consumedCapacity"}
            if isinstance(a, dict) and a.get("consumedCapacity", {}) is None else a
            for a in atts
        ]
    return out


def _v2_to_v3(obj: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 → 3: the state may continue in a journal (``state.journal``, named by the
    file's ``journal`` key, see :mod:`cni_dra.state.journal`); a schema-2 file has none."""
    out = dict(obj)
    out["schemaVersion"] = 3
    return out


MIGRATIONS: dict[int, Any] = {1: _v1_to_v2, 2: _v2_to_v3}
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
