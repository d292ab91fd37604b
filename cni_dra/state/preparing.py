"""Prepared ResourceClaims in the node state: the one code path for ``cni-dra claims
prepare|unprepare`` and the DRA kubelet plugin's NodePrepareResources/NodeUnprepareResources.

Claims are stored as the API server returns them (resource.k8s.io/v1 ResourceClaim with
``status.allocation``), keyed by pod UID (KEP-4381 kubelet prepare; KEP-5075 results carry
``consumedCapacity`` and ``shareID``). Before anything is stored, the device profiles the
claim's configuration gives the results of cni-dra's driver are validated and checked
against the node's limits (:func:`cni_dra.protocol.profile.claim_profiles`): a claim that
fails is refused whole, with the state unchanged, so a bad profile never reaches ADD. The
state decodes the same profiles from the stored object (:mod:`cni_dra.state.prepared`).
A pod's claims are refused too, all of them and with nothing stored, when they would give
one of its interfaces several results to choose from (:func:`check_pod_interfaces`): ADD
could not attach it, and the pod would hold its capacity while the kubelet retried.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cni_dra.protocol.config import DEFAULT_DRIVER

if TYPE_CHECKING:
    from cni_dra.dra.objects import ResourceSlice
    from cni_dra.protocol.profile import ProfileLimits
    from cni_dra.state.prepared import PreparedClaim
    from cni_dra.state.txn import Txn

__all__ = [
    "validate_claim",
    "check_pod_interfaces",
    "prepare_claims",
    "prepare_claim",
    "put_claims",
    "unprepare_claims",
    "unprepare_claim_everywhere",
    "check_claim_against_inventory",
    "share_prepared_claim",
]


_SHARE_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def check_claim_against_inventory(claim_obj: dict[str, Any], slice_: ResourceSlice) -> None:
    """Refuse results of ``slice_``'s driver that name another pool or an unknown device,
    or carry a malformed shareID (KEP-5075: a lowercase UUID). Raises InvalidConfigError (7)."""
    from cni_dra.errors import InvalidConfigError

    driver, pool = slice_.spec.driver, slice_.spec.pool.name
    names = {d.name for d in slice_.spec.devices}
    meta = claim_obj.get("metadata") or {}
    alloc = ((claim_obj.get("status") or {}).get("allocation") or {}).get("devices") or {}
    for res in alloc.get("results") or []:
        if res.get("driver") != driver:
            continue
        where = f"failed to prepare claim {meta.get('namespace')}/{meta.get('name')} request {res.get('request')!r}"
        if res.get("pool") != pool or res.get("device") not in names:
            raise InvalidConfigError(
                f"{where}: device {res.get('pool')}/{res.get('device')} is not in this node's inventory "
                f"(pool {pool}: {', '.join(sorted(names))})"
            )
        share = res.get("shareID")
        if share is not None and not _SHARE_ID_RE.match(str(share)):
            raise InvalidConfigError(f"{where}: shareID {share!r} is not a lowercase UUID")


def validate_claim(
    claim_obj: dict[str, Any], *, driver: str = DEFAULT_DRIVER, limits: ProfileLimits | None = None
) -> PreparedClaim:
    """Check a resource.k8s.io/v1 ResourceClaim before it is stored: it validates, it is
    allocated, and the device profiles its config gives the results of ``driver`` validate
    and keep within ``limits`` (the node's, default
    :class:`~cni_dra.protocol.profile.ProfileLimits`). Returns its typed view.

    Raises:
        InvalidConfigError: (7) a claim that does not validate, is not allocated, or whose
            profiles do not validate or break a limit (``failed to prepare claim <ns>/<name>
            request 'net1': <field and limit>``).
    """
    from pydantic import ValidationError

    from cni_dra.dra.claims import ResourceClaim
    from cni_dra.errors import InvalidConfigError
    from cni_dra.protocol.profile import ProfileLimits, claim_profiles
    from cni_dra.state.prepared import PreparedClaim

    try:
        claim = ResourceClaim.model_validate(claim_obj)
    except (ValidationError, ValueError) as exc:
        raise InvalidConfigError(
            f"failed to prepare claim: not a valid resource.k8s.io/v1 ResourceClaim: {exc}"
        ) from exc
    if claim.status is None or claim.status.allocation is None:
        raise InvalidConfigError(
            f"failed to prepare claim {claim.metadata.name}: it has no status.allocation"
        )
    claim_profiles(claim_obj, driver, limits if limits is not None else ProfileLimits())
    try:
        return PreparedClaim.decode(claim_obj)
    except (ValidationError, ValueError) as exc:
        raise InvalidConfigError(f"failed to prepare claim {claim.metadata.name}: {exc}") from exc


def check_pod_interfaces(
    held: Sequence[PreparedClaim], adding: Sequence[PreparedClaim], *, driver: str, pod: str
) -> None:
    """Refuse to give a pod that holds ``held`` the claims ``adding`` (a held claim of the
    same identity is replaced) when one of its interfaces would then have several
    allocation results of ``driver`` to choose from
    (:func:`~cni_dra.state.prepared.interface_conflicts`): ADD could attach none of them,
    so the pod would only hold its capacity while the kubelet retries its sandbox. ``pod``
    names the pod in the message.

    Raises:
        ClaimError: (101) ``failed to prepare claim(s) <ns>/<name>, ... for pod <pod>:
            interface 'net1' would have 2 allocation results of <driver> to choose from
            (claim <ns>/<a> request 'net1', claim <ns>/<b> request 'net1') ...``.
    """
    from cni_dra.errors import ClaimError
    from cni_dra.state.prepared import interface_conflicts

    ids = {c.identity for c in adding}
    conflicts = interface_conflicts([*(c for c in held if c.identity not in ids), *adding], driver)
    if not conflicts:
        return
    names = ", ".join(f"{c.namespace}/{c.name}" for c in adding)
    why = "; ".join(
        f"interface {name!r} would have {len(found)} allocation results of {driver} to choose from ("
        + ", ".join(f"claim {c.namespace}/{c.name} request {r.request!r}" for c, r in found)
        + ")"
        for name, found in sorted(conflicts.items())
    )
    raise ClaimError(
        f"failed to prepare claim{'s' if len(adding) > 1 else ''} {names} for pod {pod}: {why}; an interface takes "
        "the one result whose request is named after it (or the pod's only result): give the requests of a pod's "
        "claims distinct names, one per interface"
    )


def prepare_claims(
    state_dir: str,
    pod_uid: str,
    claim_objs: Sequence[dict[str, Any]],
    *,
    driver: str = DEFAULT_DRIVER,
    limits: ProfileLimits | None = None,
    pod: str | None = None,
) -> list[bool]:
    """Store resource.k8s.io/v1 ResourceClaims (with ``status.allocation``) for ``pod_uid``,
    all or none, in one transaction.

    Each is checked first (:func:`validate_claim`); then, under the state lock, the pod's
    claims with these added must give each interface at most one result
    (:func:`check_pod_interfaces`; ``pod`` names the pod in that message, default its
    UID). Idempotent: a claim with the same ``metadata.uid`` is replaced. Returns, per
    claim, whether it changed the state.

    Raises:
        InvalidConfigError: (7) as :func:`validate_claim`; nothing is written.
        ClaimError: (101) as :func:`check_pod_interfaces`; nothing is written.
    """
    from cni_dra.state.store import StateStore

    adding = [validate_claim(obj, driver=driver, limits=limits) for obj in claim_objs]
    with StateStore(state_dir).transaction() as txn:  # the state keeps a read-only copy
        check_pod_interfaces(txn.state.prepared(pod_uid), adding, driver=driver, pod=pod or pod_uid)
        return put_claims(txn, pod_uid, adding, claim_objs)


def put_claims(
    txn: Txn, pod_uid: str, adding: Sequence[PreparedClaim], claim_objs: Sequence[dict[str, Any]]
) -> list[bool]:
    """In transaction ``txn``, give pod ``pod_uid`` the claims ``claim_objs`` (``adding``: each
    one's :func:`validate_claim`, checked with :func:`check_pod_interfaces` by the caller); a
    claim of the same identity is replaced. Returns, per claim, whether it changed the state.
    Raises nothing of its own."""
    held = txn.state.prepared(pod_uid)
    existing = list(txn.claims.get(pod_uid, ()))
    identities = [c.identity for c in held]
    changed = []
    for claim, obj in zip(adding, claim_objs, strict=True):
        if claim.identity in identities:
            i = identities.index(claim.identity)
            changed.append(existing[i] != obj)
            existing[i] = obj
        else:
            changed.append(True)
            existing.append(obj)
            identities.append(claim.identity)
    if any(changed):
        txn.set_claims(pod_uid, existing)
    return changed


def prepare_claim(
    state_dir: str,
    pod_uid: str,
    claim_obj: dict[str, Any],
    *,
    driver: str = DEFAULT_DRIVER,
    limits: ProfileLimits | None = None,
) -> bool:
    """Store one claim for ``pod_uid`` (:func:`prepare_claims`). Returns True when the state
    changed. Raises as :func:`prepare_claims`."""
    return prepare_claims(state_dir, pod_uid, [claim_obj], driver=driver, limits=limits)[0]


def unprepare_claims(state_dir: str, pod_uid: str, claim_uid: str | None = None) -> int:
    """Remove the prepared claims of ``pod_uid`` (only ``claim_uid`` when given). Returns how many."""
    from cni_dra.state.store import StateStore

    with StateStore(state_dir).transaction() as txn:
        existing = txn.claims.get(pod_uid, ())
        keep = [
            raw
            for raw, c in zip(existing, txn.state.prepared(pod_uid), strict=True)
            if claim_uid and c.uid != claim_uid
        ]
        removed = len(existing) - len(keep)
        if removed:
            txn.set_claims(pod_uid, keep)
        return removed


def unprepare_claim_everywhere(state_dir: str, claim_uid: str) -> dict[str, int]:
    """Remove claim ``claim_uid`` from every pod that holds it, in one transaction (one wait
    for the state lock, one journal record). Returns pod UID -> copies removed (empty: the
    claim was not prepared here, nothing is written). Raises StateError (5),
    TryAgainLaterError (11)."""
    from cni_dra.state.store import StateStore

    removed: dict[str, int] = {}
    with StateStore(state_dir).transaction() as txn:
        for pod_uid in sorted(txn.state.claim_pods(claim_uid)):
            existing = txn.claims.get(pod_uid, ())
            keep = [
                raw
                for raw, c in zip(existing, txn.state.prepared(pod_uid), strict=True)
                if c.uid != claim_uid
            ]
            if len(keep) < len(existing):
                removed[pod_uid] = len(existing) - len(keep)
                txn.set_claims(pod_uid, keep)
    return removed


def share_prepared_claim(state_dir: str, claim_uid: str, pod_uids: set[str]) -> list[str]:
    """Let more pods use a prepared claim: each pod of ``pod_uids`` that does not hold claim
    ``claim_uid`` gets the prepared copy (a ResourceClaim shared by pods; the kubelet
    prepares a claim once, for the pods reserved at that moment, and the agent learns the
    later ones from ``status.reservedFor``). A claim that is not prepared here is left
    alone. Returns the pods added (none: nothing is written)."""
    from cni_dra.state.store import StateStore

    store = StateStore(state_dir)
    # The claim watch calls this for every event of every claim; most need nothing, so that
    # is seen without the state's file lock (a burst's ADDs hold it in turn), and the
    # transaction below looks again under it.
    holders = store.peek().claim_pods(claim_uid)
    if not holders or not pod_uids - holders:
        return []
    with store.transaction() as txn:
        holders = txn.state.claim_pods(claim_uid)
        if not holders:  # unprepared meanwhile
            return []
        holder = min(holders)
        prepared = next(
            raw
            for raw, c in zip(txn.claims[holder], txn.state.prepared(holder), strict=True)
            if c.uid == claim_uid
        )
        added = sorted(pod_uids - holders)
        for pod in added:
            txn.set_claims(pod, [*txn.claims.get(pod, ()), prepared])
        return added
