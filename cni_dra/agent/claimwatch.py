"""Follow the pods of shared ResourceClaims: ``status.reservedFor`` → prepared claims.

A ResourceClaim may be used by several pods (``spec.resourceClaims[].resourceClaimName``).
The kubelet prepares a claim once (NodePrepareResources names the claim, not the pod) and
later pods that reference it start without another call; the scheduler adds each of them
to the claim's ``status.reservedFor`` before it binds the pod. The CNI plugin finds a
pod's allocation by pod UID in the node state, so the agent keeps that map complete: a
daemon thread lists the ResourceClaims, then watches them, and for every claim prepared on
this node gives each pod of ``reservedFor`` the prepared copy
(:func:`cni_dra.state.preparing.share_prepared_claim`). Claims that are not prepared here are
ignored; pods that leave ``reservedFor`` keep their copy until the kubelet unprepares the
claim (their DEL still finds it).

An event can come while the kubelet's prepare of its claim is under way: the prepare read
the claim before the scheduler reserved it for another pod, and has not stored it yet, so
the watch finds it not prepared here and shares it with no one. The watch therefore keeps
the pods each claim was last seen reserved for, and the prepare, once it has stored the
claim, shares it with them (:meth:`ClaimWatch.catch_up`): whichever of the two comes last
sees the other's work. When that sharing fails (the state lock held past its timeout),
the prepare fails: no later event may come for the claim, and the kubelet's retry of the
prepare reads the claim again and stores it for those pods too.

A watch that ends is resumed from the last resourceVersion; one that expired (410) or
failed is followed by a fresh list after a backoff (0.5 s doubling, at most 30 s).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cni_dra.errors import CniError, TryAgainLaterError

if TYPE_CHECKING:
    from cni_dra.k8s.api import KubeApi

__all__ = ["ClaimWatch", "reserved_pods"]

log = logging.getLogger("cni_dra.agent.claimwatch")

WATCH_TIMEOUT_S = 300
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


def reserved_pods(claim: dict[str, Any]) -> set[str]:
    """The UIDs of the pods in a ResourceClaim's ``status.reservedFor`` (core/v1 pods only)."""
    return {
        c["uid"]
        for c in (claim.get("status") or {}).get("reservedFor") or []
        if c.get("resource") == "pods" and not c.get("apiGroup") and c.get("uid")
    }


class ClaimWatch:
    """The service (``start()``/``stop()``). ``api``: :class:`cni_dra.k8s.api.KubeApi`;
    ``share(claim_uid, pod_uids) -> added pods``: :func:`share_prepared_claim` bound to the
    state dir (a seam for tests)."""

    def __init__(self, api: KubeApi, share: Callable[[str, set[str]], list[str]]) -> None:
        self.api = api
        self.share = share
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()  # set after the first list was reconciled
        # claim UID -> the pods it was last seen reserved for (module docstring); under _lock
        self._reserved: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="claimwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)  # a watch blocked in a read ends with the process (daemon)

    def reconcile(self, claim: dict[str, Any]) -> list[str]:
        """Give the pods reserved for ``claim`` its prepared copy; returns the pods added.
        The pods are kept first, for a prepare that stores the claim meanwhile (:meth:`catch_up`)."""
        meta = claim.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return []
        pods = reserved_pods(claim)
        with self._lock:
            if pods:
                self._reserved[uid] = frozenset(pods)
            else:
                self._reserved.pop(uid, None)
        if not pods:
            return []
        return self._share(uid, pods, f"claim {meta.get('namespace')}/{meta.get('name')} ({uid})")

    def forget(self, claim: dict[str, Any]) -> None:
        """A deleted claim: its pods are no longer kept."""
        uid = (claim.get("metadata") or {}).get("uid")
        with self._lock:
            self._reserved.pop(str(uid), None)

    def catch_up(self, claim_uid: str) -> list[str]:
        """After a prepare stored claim ``claim_uid``: give its prepared copy to the pods the
        watch last saw it reserved for (an event handled while the prepare was under way
        found the claim not prepared yet). Returns the pods added. Raises what ``share``
        raises: the watch has handled that event and may see no other for the claim, so
        the prepare fails instead and the kubelet's retry stores the claim for them (its
        fresh read of the claim names them)."""
        with self._lock:
            pods = self._reserved.get(claim_uid)
        if not pods:
            return []
        return self._share(claim_uid, set(pods), f"claim {claim_uid}")

    def _share(self, uid: str, pods: set[str], what: str) -> list[str]:
        added = self.share(uid, pods)
        if added:
            log.info("%s shared with pod(s) %s", what, ", ".join(added))
        return added

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._list_and_watch()
                failures = 0
            except TryAgainLaterError as exc:
                log.info("claim watch: %s; listing again", exc.msg)
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any one failure
                failures += 1
                delay = min(BACKOFF_START_S * 2 ** (failures - 1), BACKOFF_MAX_S)
                what = (
                    f"{exc.msg} {exc.details}"
                    if isinstance(exc, CniError)
                    else f"{type(exc).__name__}: {exc}"
                )
                log.warning("claim watch failed (retry in %.1fs): %s", delay, what)
                self._stop.wait(delay)

    def _list_and_watch(self) -> None:
        claims, version = self.api.list_resource_claims()
        with self._lock:  # what was deleted while no watch ran is gone from the list
            listed = {(c.get("metadata") or {}).get("uid") for c in claims}
            for uid in [u for u in self._reserved if u not in listed]:
                del self._reserved[uid]
        for claim in claims:
            self.reconcile(claim)
        self.synced.set()
        while not self._stop.is_set():
            for kind, claim in self.api.watch_resource_claims(version, timeout_s=WATCH_TIMEOUT_S):
                version = str((claim.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED"):
                    self.reconcile(claim)
                elif kind == "DELETED":
                    self.forget(claim)
                if self._stop.is_set():
                    return
