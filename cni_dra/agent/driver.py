"""The DRA driver behind the kubelet plugin: NodePrepareResources / NodeUnprepareResources.

Prepare (KEP-4381 kubelet plugin; KEP-5075 results): the kubelet names a claim by
namespace, name and UID only, so the driver reads the ResourceClaim from the API server,
checks that it is the same object (UID), that it is allocated, and that every allocation
result of this driver names this node's pool and one of its inventory devices; then it
stores the claim in the node state for every pod in ``status.reservedFor``, through
:func:`cni_dra.state.preparing.prepare_claim` (the path of ``cni-dra claims prepare``), which
first validates the device profiles the claim's config asks against the node's limits
(read at each prepare from the agent's ``--conflist`` files); a claim that fails is
refused with nothing stored, and the kubelet shows the message as a pod event. The
kubelet sends a pod's claims of this driver in one call (:meth:`ClaimDriver.prepare_claims`):
when they, with what the node already holds for the pod, would give one of its interfaces
several allocation results to choose from, all of that pod's claims in the call are refused
and nothing is stored (ADD could not attach that interface, and the pod would hold its
capacity while the kubelet retried its sandbox). The state, not memory, holds prepared claims, so an agent restart loses nothing; a repeated
prepare replaces the stored copy (idempotent), and the state lock serialises it with the
CNI plugin. A call checks and stores every claim in one state transaction, and an unprepare
removes a claim from all its pods in one: a single wait for the state lock, which a burst
of ADDs holds in turn, and one journal record.

Unprepare removes the claim (by UID) from every pod that holds it; unknown claims are a
success (the kubelet retries after restarts).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cni_dra.errors import ClaimError

if TYPE_CHECKING:
    from cni_dra.dra.objects import ResourceSlice
    from cni_dra.k8s.api import KubeApi
    from cni_dra.protocol.profile import ProfileLimits
    from cni_dra.state.prepared import PreparedClaim

__all__ = ["PreparedDevice", "ClaimDriver", "ClaimName"]

log = logging.getLogger("cni_dra.agent.driver")


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as the kubelet plugin API returns it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    share_id: str
    cdi_device_ids: tuple[str, ...] = ()


ClaimName = tuple[str, str, str]
"""A claim as the kubelet names it: (namespace, UID, name)."""


@dataclass(frozen=True)
class _Fetched:
    """A claim read and checked for prepare: its object as stored, its typed view, the pods
    it is reserved for (UID -> ``namespace/name``) and its devices of this driver."""

    where: str
    obj: dict[str, Any]
    claim: PreparedClaim
    pods: dict[str, str]
    devices: list[PreparedDevice]


def _fetched(f: _Fetched | Exception) -> _Fetched:
    assert isinstance(f, _Fetched)
    return f


class ClaimDriver:
    """Prepare/unprepare claims into the node state.

    ``api``: :class:`cni_dra.k8s.api.KubeApi`; ``inventory()``: the node's ResourceSlice
    (a :class:`cni_dra.dra.objects.ResourceSlice`); ``limits()``: the node's limits on device
    profiles (default: :class:`~cni_dra.protocol.profile.ProfileLimits`' defaults);
    ``observe(verb, ok, seconds)``: metrics; ``stored(claim_uid)``: called for each claim
    a prepare stored (:meth:`cni_dra.agent.claimwatch.ClaimWatch.catch_up`: the pods the
    scheduler reserved it for while the prepare was under way); a claim for which it raises
    is refused with that error though stored, so that the kubelet prepares it again.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        state_dir: str,
        driver_name: str,
        inventory: Callable[[], ResourceSlice],
        limits: Callable[[], ProfileLimits] | None = None,
        observe: Callable[[str, bool, float], None] = lambda verb, ok, seconds: None,
        stored: Callable[[str], object] = lambda claim_uid: None,
    ) -> None:
        self.api = api
        self.state_dir = state_dir
        self.driver_name = driver_name
        self.inventory = inventory
        self.limits = limits
        self.observe = observe
        self.stored = stored

    def prepare(self, namespace: str, uid: str, name: str) -> list[PreparedDevice]:
        """Prepare one claim (:meth:`prepare_claims`); returns its devices of this driver or
        raises what :meth:`prepare_claims` gives it."""
        (out,) = self.prepare_claims([(namespace, uid, name)])
        if isinstance(out, Exception):
            raise out
        return out

    def prepare_claims(self, claims: Sequence[ClaimName]) -> list[list[PreparedDevice] | Exception]:
        """Prepare the claims of one NodePrepareResources call (the kubelet sends a pod's
        claims of this driver together); returns, per claim, its devices of this driver or
        why it was refused.

        A claim is refused with ClaimError (101) when it is missing, replaced (other UID),
        not allocated, allocated on another node's devices or reserved for no pod;
        InvalidConfigError (7) when its device profiles do not validate or break the node's
        limits; IOFailureError (5) / TryAgainLaterError (11) from the API server, the state
        or an unreadable conflist. A pod's claims are refused together, with ClaimError
        (101) and nothing stored for any pod, when they (with those the node already holds
        for it) would give one of its interfaces several results to choose from
        (:func:`cni_dra.state.preparing.check_pod_interfaces`).
        """
        start = time.monotonic()
        try:
            out = self._prepare_claims(claims)
        except Exception as exc:  # noqa: BLE001 - the inventory, limits or state: every claim fails with it
            out = [exc for _ in claims]
        seconds = time.monotonic() - start
        for one in out:
            self.observe("prepare", not isinstance(one, Exception), seconds)
        return out

    def _prepare_claims(self, claims: Sequence[ClaimName]) -> list[list[PreparedDevice] | Exception]:
        from cni_dra.protocol.profile import ProfileLimits

        slice_ = self.inventory()
        limits = self.limits() if self.limits is not None else ProfileLimits()
        found: list[_Fetched | Exception] = []
        for namespace, uid, name in claims:
            try:
                found.append(self._fetch(namespace, uid, name, slice_, limits))
            except Exception as exc:  # noqa: BLE001 - reported for this claim only
                found.append(exc)
        by_pod: dict[str, list[int]] = {}
        pod_names: dict[str, str] = {}
        for i, f in enumerate(found):
            if isinstance(f, _Fetched):
                for pod_uid, pod_name in f.pods.items():
                    by_pod.setdefault(pod_uid, []).append(i)
                    pod_names[pod_uid] = pod_name
        if by_pod:
            self._store(found, by_pod, pod_names)
        return [f.devices if isinstance(f, _Fetched) else f for f in found]

    def _store(
        self, found: list[_Fetched | Exception], by_pod: dict[str, list[int]], pod_names: dict[str, str]
    ) -> None:
        """Check and store the fetched claims of every pod in one state transaction (one wait
        for the state lock, which the node's ADDs take too, and one journal record): each
        pod's claims with those it holds are checked first, so that a refusal stores nothing
        of that claim for any pod; the rest are stored. A claim refused replaces its entry in
        ``found`` with the error; a failed transaction fails every claim it would have stored."""
        from cni_dra.state import StateStore
        from cni_dra.state.preparing import check_pod_interfaces, put_claims

        changed: list[tuple[int, str]] = []
        try:
            with StateStore(self.state_dir).transaction() as txn:
                for pod_uid, idxs in by_pod.items():  # first check every pod
                    adding = [f.claim for i in idxs if isinstance(f := found[i], _Fetched)]
                    try:
                        check_pod_interfaces(
                            txn.state.prepared(pod_uid),
                            adding,
                            driver=self.driver_name,
                            pod=pod_names[pod_uid],
                        )
                    except ClaimError as exc:
                        for i in idxs:
                            found[i] = exc
                for pod_uid, idxs in by_pod.items():
                    keep = [i for i in idxs if isinstance(found[i], _Fetched)]
                    if keep:
                        did = put_claims(
                            txn,
                            pod_uid,
                            [_fetched(found[i]).claim for i in keep],
                            [_fetched(found[i]).obj for i in keep],
                        )
                        changed.extend((i, pod_uid) for i, d in zip(keep, did, strict=True) if d)
        except Exception as exc:  # noqa: BLE001 - the state: every claim it would have stored fails
            for idxs in by_pod.values():
                for i in idxs:
                    if isinstance(found[i], _Fetched):
                        found[i] = exc
            return
        for i, pod_uid in changed:
            log.info("prepared %s for pod %s", _fetched(found[i]).where, pod_uid)
        for uid in dict.fromkeys(f.claim.uid for f in found if isinstance(f, _Fetched)):
            try:
                self.stored(uid)
            except Exception as exc:  # noqa: BLE001 - that claim fails: the kubelet prepares it again
                log.warning("claim %s: giving the pods reserved meanwhile their copy failed: %s", uid, exc)
                for i, f in enumerate(found):
                    if isinstance(f, _Fetched) and f.claim.uid == uid:
                        found[i] = exc

    def _fetch(
        self, namespace: str, uid: str, name: str, slice_: ResourceSlice, limits: ProfileLimits
    ) -> _Fetched:
        """Read and check claim ``namespace/name`` (UID ``uid``) for :meth:`prepare_claims`."""
        from cni_dra.state.preparing import validate_claim

        where = f"claim {namespace}/{name} ({uid})"
        claim = self.api.get_resource_claim(namespace, name)
        if claim is None:
            raise ClaimError(f"failed to prepare {where}: it does not exist")
        claim = copy.deepcopy(claim)
        meta = claim.get("metadata") or {}
        if meta.get("uid") != uid:
            raise ClaimError(
                f"failed to prepare {where}: the API server has UID {meta.get('uid')} under that name"
            )
        meta.pop("managedFields", None)
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not status.get("allocation"):
            raise ClaimError(f"failed to prepare {where}: it is not allocated")
        pool = slice_.spec.pool.name
        devices = {d.name for d in slice_.spec.devices}
        mine = [r for r in results if r.get("driver") == self.driver_name]
        for r in mine:
            if r.get("pool") != pool or r.get("device") not in devices:
                raise ClaimError(
                    f"failed to prepare {where}: request {r.get('request')!r} is allocated on "
                    f"{r.get('pool')}/{r.get('device')}, not on this node (pool {pool}: {', '.join(sorted(devices))})"
                )
        pods = {
            c["uid"]: f"{namespace}/{c.get('name') or c['uid']}"
            for c in status.get("reservedFor") or []
            if c.get("resource") == "pods" and not c.get("apiGroup") and c.get("uid")
        }
        if not pods:
            raise ClaimError(f"failed to prepare {where}: status.reservedFor names no pod")
        prepared = validate_claim(claim, driver=self.driver_name, limits=limits)
        return _Fetched(
            where=where,
            obj=claim,
            claim=prepared,
            pods=pods,
            devices=[
                PreparedDevice(
                    request_names=(r.get("request", ""),),
                    pool_name=r.get("pool", ""),
                    device_name=r.get("device", ""),
                    share_id=r.get("shareID") or "",
                )
                for r in mine
            ],
        )

    def unprepare(self, namespace: str, uid: str, name: str) -> int:
        """Remove claim ``uid`` from every pod in the node state; returns how many copies.

        Idempotent (0 for an unknown claim). Raises StateError (5), TryAgainLaterError (11).
        """
        from cni_dra.state.preparing import unprepare_claim_everywhere

        start = time.monotonic()
        ok = False
        try:
            n = sum(unprepare_claim_everywhere(self.state_dir, uid).values())
            if n:
                log.info("unprepared claim %s/%s (%s) for %d pod(s)", namespace, name, uid, n)
            ok = True
            return n
        finally:
            self.observe("unprepare", ok, time.monotonic() - start)
