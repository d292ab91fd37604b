"""Schema of the node-local state file (``<stateDir>/state.json``).

Shape (schemaVersion 4)::

    {
      "schemaVersion": 4,
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
side effects that may have been made (:data:`STEP_IPAM`; :data:`STEP_LINK` in older records). When the owner is dead
the intent is stale and recovery (:mod:`cni_dra.attach.recover`) undoes it step by step.
An ``adding`` attachment also names ``tempName``, the temporary name its link is created
under before the rename to ``ifname`` (:func:`cni_dra.netlink.sublink.temp_names`), chosen
and recorded before the link exists, so that a link left under it is found and deleted;
``ready`` drops it (absent in records written before it existed).

``netnsIdentity`` (optional; absent in attachments written before it existed, and in the
placeholders of a repair that could not read it) is ``[st_dev, st_ino]`` of the network
namespace at ``netns`` when ADD reserved the attachment (:mod:`cni_dra.netlink.netns`): the
namespace the link was made in. A path that names another namespace now (the namespace was
deleted and one made again under its name, a symlink pointed elsewhere) is not it: DEL, GC,
recovery, repair, CHECK and a repeated ADD compare identities
(:func:`cni_dra.attach.release.recorded_netns_path`). Records without it are judged by their
path, as before it existed. The kernel may give a later namespace the inode of a dead one,
so an equal identity is backed by the link check on the recorded parent wherever a link is
deleted without the runtime naming the namespace.

``recovering`` (optional; absent unless true) marks an intent recovery took over from a
dead process (``owner`` is the recovering one): the attachment's own ADD or DEL waits for
it rather than answer "still in progress" (:mod:`cni_dra.attach.intent`).

``readyAt`` (optional; absent in attachments written before it existed) is when ADD made
the attachment ``ready``: GC leaves an attachment alone for a grace period after that
(:mod:`cni_dra.verbs.gc`), since a runtime's list of valid attachments may predate it.

Everything here is immutable: frozen models, read-only containers
(:mod:`cni_dra.state.frozen`), :class:`Attachments`. A transaction changes the state only
through its typed operations (:class:`cni_dra.state.txn.Txn`, :mod:`cni_dra.state.ops`),
which the journal records; a change made in place raises.

``shaping`` (optional; absent when the attachment is not shaped, or was written before the
field existed) is the traffic control ADD installed on the pod interface: ``{"egress": {"rateBps", "burstBytes", "limitBytes"}, "ingress": {...}, "ifb":
"<ifb device>"}``, an unshaped direction left out (:mod:`cni_dra.attach.shaping_plan`); CHECK
compares the kernel with it.

``profile`` (optional; absent when no device profile applied: standalone mode, a result
without DRA configuration for cni-dra, or written before the field existed) is what the
allocation result's device profile made of the link (:func:`cni_dra.attach.device_profile.describe`):
``{"linkType", "mode", "ipvlanFlag" (ipvlan), "mtu" and "mac" (when set), "shaping": bool,
"fromConfig": [fields the DRA configuration set]}``. CHECK verifies the link against it
(the runtime's config alone would expect the conflist's link), ``cni-dra status`` shows it.

Older schemas are migrated on read by :func:`cni_dra.state.migrations.migrate` (one function
per version step in :data:`cni_dra.state.migrations.MIGRATIONS`). Models ignore unknown keys,
so adding a field is a backwards-compatible change that needs no new schema version; a change
of meaning does. A new attachment field: optional (``None`` is not written), set where ADD
builds the record (:func:`cni_dra.attach.plan.plan`) and, if repair can know it, in
:mod:`cni_dra.attach.rebuild`; ``cni-dra status --json`` lists its keys one by one
(:mod:`cni_dra.report`).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, overload

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PrivateAttr,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

from cni_dra.allocator.usage import whole_capacity
from cni_dra.quantity import Quantity, QuantityField
from cni_dra.state.cowmap import CowMap
from cni_dra.state.frozen import FrozenDict, deep_freeze, empty_frozen_list
from cni_dra.state.prepared import PreparedClaim, PreparedResult

if TYPE_CHECKING:
    from cni_dra.dra.objects import Device

__all__ = [
    "SCHEMA_VERSION",
    "STEP_LINK",
    "STEP_IPAM",
    "ClaimRef",
    "Owner",
    "Attachment",
    "Attachments",
    "PreparedClaim",
    "PreparedResult",
    "NodeState",
    "whole_capacity",
    "ready_at",
]

SCHEMA_VERSION = 4

STEP_LINK = "link"
"""Intent step: the pod's link was created in its netns (records of earlier versions; ADD
now records none for the link, see :mod:`cni_dra.attach.intent`)."""
STEP_IPAM = "ipam"
"""Intent step: IPAM may hold addresses for the attachment. ADD records it with the
reservation, before IPAM runs, when the network has IPAM: recovery then runs the IPAM DEL,
a no-op when ADD had not reached IPAM."""


def ready_at(now_s: float) -> str:
    """``Attachment.readyAt`` for Unix time ``now_s``: RFC 3339 UTC to the millisecond
    (``2025-01-02T03:04:05.678Z``), the form Kubernetes timestamps take."""
    when = datetime.datetime.fromtimestamp(now_s, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


class ClaimRef(BaseModel):
    """Which prepared ResourceClaim result an attachment uses (claim mode)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    namespace: str = ""
    name: str = ""
    uid: str = ""
    request: str = ""


class Owner(BaseModel):
    """The process carrying out an intent: ``pid`` and its start time (``/proc/PID/stat``
    field 22, clock ticks since boot) under kernel boot ``boot``; together they name one
    process even after the pid is reused."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    pid: int
    start: int
    boot: str = ""


class Attachment(BaseModel):
    """One CNI attachment and the capacity it holds on one device. Immutable: a transaction
    records a changed copy (:meth:`cni_dra.state.txn.Txn.update`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    network: str
    containerID: str
    ifname: str
    netns: str = ""
    netnsIdentity: tuple[int, int] | None = None  # (st_dev, st_ino) of the netns at ADD (see above)
    podUID: str | None = None
    podNamespace: str | None = None
    podName: str | None = None
    driver: str
    pool: str
    device: str
    # The parent NIC's host interface name (the device's ifName attribute); schema 3 and
    # older records, and their journal ops, call it ``ifName``.
    parent: str
    linkType: str = "macvlan"
    consumedCapacity: Annotated[dict[str, QuantityField], AfterValidator(FrozenDict)] = Field(
        default_factory=FrozenDict
    )
    shareID: str | None = None
    claim: ClaimRef | None = None
    phase: Literal["adding", "ready", "deleting"] = "adding"
    owner: Owner | None = None  # set while phase is adding/deleting (intent record)
    steps: tuple[str, ...] = ()  # side effects done so far (STEP_*)
    recovering: bool | None = None  # the intent was taken over by recovery (see above); None: no
    tempName: str | None = None  # while adding: the link's first temporary name (see above)
    ipamType: str | None = None
    ipamConf: str | None = None  # the network config given to IPAM ADD, for release without the runtime
    result: Annotated[dict[str, Any] | None, AfterValidator(deep_freeze)] = (
        None  # CNI result (1.1.0 schema) of the ADD
    )
    readyAt: str | None = None  # when ADD made it ready, RFC 3339 UTC (see ready_at); GC spares young ones
    shaping: Annotated[dict[str, Any] | None, AfterValidator(deep_freeze)] = (
        None  # traffic control ADD installed (see below)
    )
    profile: Annotated[dict[str, Any] | None, AfterValidator(deep_freeze)] = (
        None  # the device profile applied (see below)
    )

    @model_validator(mode="before")
    @classmethod
    def _schema_3_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ifName" in data and "parent" not in data:
            data = {("parent" if k == "ifName" else k): v for k, v in data.items()}
        return data

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

    def charged(self, device: Device | None) -> dict[str, Quantity]:
        """What this attachment holds on ``device`` (the resource.k8s.io/v1 Device it names,
        None when the inventory lacks it), as every sum of consumed capacity counts it.

        Its ``consumedCapacity``; when that names no amount at all (a schema-1 record
        without the key, or a claim result without ``consumedCapacity``) the device's whole
        capacity: the share is unknown, charging less could promise the NIC twice (``cni-dra
        state repair`` charges an untracked link the same way), and the pod's DEL releases
        it. A device unknown to the inventory has nothing to charge.
        """
        if self.consumedCapacity:
            return {
                k: v if type(v) is Quantity else Quantity.parse(v) for k, v in self.consumedCapacity.items()
            }
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


class Attachments(Sequence[Attachment]):
    """``NodeState.attachments``: the attachments in the order they were first recorded,
    indexed by key; read-only. A transaction changes them through its operations
    (:class:`cni_dra.state.txn.Txn`, applied by :func:`cni_dra.state.ops.apply`): recording
    an attachment whose key is listed replaces it in its place, a new key goes last."""

    __slots__ = ("_by_key", "_kinds", "_intents", "_shares")

    def __init__(self, items: Iterable[Attachment] = ()) -> None:
        # copied by every transaction that changes it: a CowMap's copy costs its changes
        self._by_key: CowMap[tuple[str, str, str], Attachment] = CowMap((a.key, a) for a in items)
        # derived, kept by _put/_drop: (driver, pool, device) -> linkType -> how many (each
        # inner mapping replaced, never changed, so that a copy may share it); and the
        # attachments that are not ready (intents), by key
        self._kinds: dict[tuple[str, str, str], dict[str, int]] = {}
        self._intents: dict[tuple[str, str, str], Attachment] = {}
        # share_key -> the attachments holding that share, in their order (inner mappings
        # replaced, never changed, as above)
        self._shares: CowMap[
            tuple[str, str, str, str, str, str | None], dict[tuple[str, str, str], Attachment]
        ] = CowMap()
        for att in self._by_key.values():
            self._index(att, 1)
            sk = att.share_key()
            if sk is not None:
                members = self._shares.get(sk)
                if members is None:
                    self._shares.set(sk, members := {})
                members[att.key] = att

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """Validated and serialised as a ``list[Attachment]``."""
        as_list = handler(list[Attachment])
        return core_schema.no_info_after_validator_function(
            cls,
            as_list,
            serialization=core_schema.plain_serializer_function_ser_schema(list, return_schema=as_list),
        )

    def get(self, key: tuple[str, str, str]) -> Attachment | None:
        """The attachment with ``key`` (network, containerID, ifname), or None."""
        return self._by_key.get(key)

    def link_types(self, driver: str, pool: str, device: str) -> Mapping[str, int]:
        """linkType -> how many attachments of that type the device (``driver``, ``pool``,
        ``device``) carries (an index lookup)."""
        return self._kinds.get((driver, pool, device), {})

    def kinds_by_device(self, driver: str, pool: str) -> dict[str, Mapping[str, int]]:
        """device -> :meth:`link_types`, for every device of (``driver``, ``pool``) that
        carries an attachment; O(devices of the node)."""
        return {dev: kinds for (d, p, dev), kinds in self._kinds.items() if d == driver and p == pool}

    def sharing(self, share_key: tuple[str, str, str, str, str, str | None]) -> list[Attachment]:
        """The attachments whose :meth:`Attachment.share_key` is ``share_key`` (pods using one
        claim's share), in their order; an index lookup."""
        return list((self._shares.get(share_key) or {}).values())

    def intents(self) -> list[Attachment]:
        """The attachments whose phase is not ``ready`` (an ADD or DEL in flight, or left
        by one that died), in no particular order; O(intents), not O(attachments)."""
        return list(self._intents.values())

    def __iter__(self) -> Iterator[Attachment]:
        return iter(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, att: object) -> bool:
        return isinstance(att, Attachment) and self._by_key.get(att.key) == att

    @overload
    def __getitem__(self, i: int) -> Attachment: ...
    @overload
    def __getitem__(self, i: slice) -> list[Attachment]: ...
    def __getitem__(self, i: int | slice) -> Attachment | list[Attachment]:
        return list(self._by_key.values())[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attachments):
            return list(self) == list(other)
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Attachments({list(self)!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Attachments:
        return Attachments(self)  # attachments are immutable: sharing them is a copy

    # -- for cni_dra.state.ops only ------------------------------------------------------
    def _copy(self) -> Attachments:
        new = Attachments()
        new._by_key = self._by_key.copy()  # O(changes since its base), not O(attachments)
        new._kinds = dict(self._kinds)  # inner mappings are replaced, never changed: shared
        new._intents = dict(self._intents)
        new._shares = self._shares.copy()
        return new

    def _index(self, att: Attachment, sign: int) -> None:
        where = (att.driver, att.pool, att.device)
        kinds = dict(self._kinds.get(where, ()))
        n = kinds.get(att.linkType, 0) + sign
        if n:
            kinds[att.linkType] = n
        else:
            del kinds[att.linkType]
        if kinds:
            self._kinds[where] = kinds
        else:
            del self._kinds[where]
        if att.phase != "ready":
            if sign > 0:
                self._intents[att.key] = att
            else:
                del self._intents[att.key]

    def _put(self, att: Attachment) -> None:
        key = att.key
        old = self._by_key.get(key)
        if old is not None:
            self._index(old, -1)
        self._by_key.set(key, att)
        self._index(att, 1)
        sk, was = att.share_key(), None if old is None else old.share_key()
        if was is not None and was != sk:
            self._unshare(was, key)
        if sk is not None:
            members = dict(self._shares.get(sk) or ())
            if old is None or was == sk:  # new (last), or in its place
                members[key] = att
            else:  # an attachment that changed share keeps its place: the members in order
                members = {k: a for k, a in self._by_key.items() if a.share_key() == sk}
            self._shares.set(sk, members)

    def _unshare(self, sk: tuple[str, str, str, str, str, str | None], key: tuple[str, str, str]) -> None:
        members = dict(self._shares[sk])
        del members[key]
        if members:
            self._shares.set(sk, members)
        else:
            self._shares.pop(sk)

    def _drop(self, key: tuple[str, str, str]) -> Attachment | None:
        old = self._by_key.pop(key)
        if old is not None:
            self._index(old, -1)
            sk = old.share_key()
            if sk is not None:
                self._unshare(sk, key)
        return old


class NodeState(BaseModel):
    """The whole state file (module docstring), read-only: a transaction changes it through
    its operations (:class:`cni_dra.state.txn.Txn`); every value in it is immutable (frozen
    models, :mod:`cni_dra.state.frozen` containers), so an in-place change raises."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schemaVersion: int = SCHEMA_VERSION
    bootID: str | None = None
    # prepared ResourceClaims by pod UID (cni_dra.state.preparing)
    claims: Annotated[dict[str, list[dict[str, Any]]], AfterValidator(deep_freeze)] = Field(
        default_factory=FrozenDict
    )
    attachments: Attachments = Field(default_factory=Attachments)
    # ResourceClaim status records left by ADD for the agent (cni_dra.state.claim_status)
    statusUpdates: Annotated[list[dict[str, Any]], AfterValidator(deep_freeze)] = Field(
        default_factory=empty_frozen_list
    )
    # pod UID -> (its claims, decoded): see prepared
    _decoded: dict[str, tuple[list[dict[str, Any]], tuple[PreparedClaim, ...]]] = PrivateAttr(
        default_factory=dict
    )
    # the attachments' books (cni_dra.state.books): (Books, version) or None, kept by ops.apply
    _books: Any = PrivateAttr(default=None)

    def find(self, network: str, container_id: str, ifname: str) -> Attachment | None:
        """The attachment with that key, or None (an index lookup)."""
        return self.attachments.get((network, container_id, ifname))

    def changeable_copy(self) -> NodeState:
        """A copy that :mod:`cni_dra.state.ops` may change while this one stays as it is
        (copy on write: a state another thread reads is never changed under it). O(changes
        since the attachments' index was last folded, :mod:`cni_dra.state.cowmap`), not
        O(attachments); the attachments and every other value are shared, being immutable."""
        return self.model_copy(update={"attachments": self.attachments._copy()})  # noqa: SLF001 - its own copy

    def prepared(self, pod_uid: str) -> tuple[PreparedClaim, ...]:
        """The prepared claims of pod ``pod_uid``, typed, in ``claims`` order; each pod's
        list is decoded once (kept until a transaction sets that pod's claims again)."""
        raw = self.claims.get(pod_uid)
        if not raw:
            return ()
        hit = self._decoded.get(pod_uid)
        if hit is not None and hit[0] is raw:
            return hit[1]
        typed = tuple(PreparedClaim.decode(c) for c in raw)
        self._decoded[pod_uid] = (raw, typed)
        return typed

    def prepared_items(self) -> Iterator[tuple[str, PreparedClaim]]:
        """(pod UID, prepared claim) for every claim prepared on this node."""
        for pod in self.claims:
            for claim in self.prepared(pod):
                yield pod, claim

    def claim_pods(self, claim_uid: str) -> set[str]:
        """The pod UIDs that hold a prepared copy of claim ``claim_uid``."""
        return {pod for pod, c in self.prepared_items() if c.uid == claim_uid}
