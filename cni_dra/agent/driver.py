"""The DRA driver behind the kubelet plugin: NodePrepareResources / NodeUnprepareResources.

Prepare (KEP-4381 kubelet plugin; KEP-5075 results): the kubelet names a claim by
namespace, name and UID only, so the driver reads the ResourceClaim from the API server,
checks that it is the same object (UID), that it is allocated, and that every allocation
result of this driver names this node's pool and one of its inventory devices; then it
stores the claim in the node state for every pod in ``status.reservedFor``, through
:func:`cni_dra.state.claims.prepare_claim` (the path of ``cni-dra claims prepare``), which
first validates the device profiles the claim's config asks against the node's limits
(read at each prepare from the agent's ``--conflist`` files); a claim that fails is
refused with nothing stored, and the kubelet shows the message as a pod event. The
state, not memory, holds prepared claims, so an agent restart loses nothing; a repeated
prepare replaces the stored copy (idempotent), and the state lock serialises it with the
CNI plugin.

Unprepare removes the claim (by UID) from every pod that holds it; unknown claims are a
success (the kubelet retries after restarts).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cni_dra.errors import ClaimError

if TYPE_CHECKING:
    from cni_dra.dra.models import ResourceSlice
    from cni_dra.k8s.api import KubeApi
    from cni_dra.protocol.profile import ProfileLimits

__all__ = ["PreparedDevice", "ClaimDriver"]

log = logging.getLogger("cni_dra.agent.driver")


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as the kubelet plugin API returns it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    share_id: str
    cdi_device_ids: tuple[str, ...] = ()


class ClaimDriver:
    """Prepare/unprepare claims into the node state.

    ``api``: :class:`cni_dra.k8s.api.KubeApi`; ``inventory()``: the node's ResourceSlice
    (a :class:`cni_dra.dra.models.ResourceSlice`); ``limits()``: the node's limits on device
    profiles (default: :class:`~cni_dra.protocol.profile.ProfileLimits`' defaults);
    ``observe(verb, ok, seconds)``: metrics.
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
    ) -> None:
        self.api = api
        self.state_dir = state_dir
        self.driver_name = driver_name
        self.inventory = inventory
        self.limits = limits
        self.observe = observe

    def prepare(self, namespace: str, uid: str, name: str) -> list[PreparedDevice]:
        """Prepare claim ``namespace/name`` (UID ``uid``); returns its devices of this driver.

        Raises ClaimError (101) for a claim that is missing, replaced (other UID), not
        allocated, allocated on another node's devices or reserved for no pod;
        InvalidConfigError (7) for device profiles that do not validate or break the node's
        limits (nothing stored); IOFailureError (5) / TryAgainLaterError (11) from the API
        server, the state or an unreadable conflist.
        """
        start = time.monotonic()
        ok = False
        try:
            out = self._prepare(namespace, uid, name)
            ok = True
            return out
        finally:
            self.observe("prepare", ok, time.monotonic() - start)

    def _prepare(self, namespace: str, uid: str, name: str) -> list[PreparedDevice]:
        from cni_dra.protocol.profile import ProfileLimits
        from cni_dra.state.claims import prepare_claim

        where = f"claim {namespace}/{name} ({uid})"
        claim = self.api.get_resource_claim(namespace, name)
        if claim is None:
            raise ClaimError(f"failed to prepare {where}: it does not exist")
        claim = copy.deepcopy(claim)
        meta = claim.get("metadata") or {}
        if meta.get("uid") != uid:
            raise ClaimError(f"failed to prepare {where}: the API server has UID {meta.get('uid')} under that name")
        meta.pop("managedFields", None)
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not status.get("allocation"):
            raise ClaimError(f"failed to prepare {where}: it is not allocated")
        slice_ = self.inventory()
        pool = slice_.spec.pool.name
        devices = {d.name for d in slice_.spec.devices}
        mine = [r for r in results if r.get("driver") == self.driver_name]
        for r in mine:
            if r.get("pool") != pool or r.get("device") not in devices:
                raise ClaimError(
                    f"failed to prepare {where}: request {r.get('request')!r} is allocated on "
                    f"{r.get('pool')}/{r.get('device')}, not on this node (pool {pool}: {', '.join(sorted(devices))})"
                )
        pods = [
            c["uid"]
            for c in status.get("reservedFor") or []
            if c.get("resource") == "pods" and not c.get("apiGroup") and c.get("uid")
        ]
        if not pods:
            raise ClaimError(f"failed to prepare {where}: status.reservedFor names no pod")
        limits = self.limits() if self.limits is not None else ProfileLimits()
        for pod_uid in pods:
            if prepare_claim(self.state_dir, pod_uid, claim, driver=self.driver_name, limits=limits):
                log.info("prepared %s for pod %s", where, pod_uid)
        return [
            PreparedDevice(
                request_names=(r.get("request", ""),),
                pool_name=r.get("pool", ""),
                device_name=r.get("device", ""),
                share_id=r.get("shareID") or "",
            )
            for r in mine
        ]

    def unprepare(self, namespace: str, uid: str, name: str) -> int:
        """Remove claim ``uid`` from every pod in the node state; returns how many copies.

        Idempotent (0 for an unknown claim). Raises StateError (5), TryAgainLaterError (11).
        """
        from cni_dra.state import StateStore
        from cni_dra.state.claims import unprepare_claims

        start = time.monotonic()
        ok = False
        try:
            state = StateStore(self.state_dir).read()
            holders = sorted(state.claim_pods(uid))
            n = sum(unprepare_claims(self.state_dir, pod, uid) for pod in holders)
            if n:
                log.info("unprepared claim %s/%s (%s) for %d pod(s)", namespace, name, uid, n)
            ok = True
            return n
        finally:
            self.observe("unprepare", ok, time.monotonic() - start)
