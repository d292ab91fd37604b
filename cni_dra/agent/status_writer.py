"""Claim status writer: ADD's records in the node state → ResourceClaim ``status.devices[]``.

The CNI plugin leaves records in ``NodeState.statusUpdates``
(:mod:`cni_dra.state.claim_status`); this writer applies them asynchronously, so ADD
never waits on the API server. For a claim it applies (server-side apply of the status
subresource, field manager = the driver name, forced) one ``status.devices[]`` entry per
share this node holds for it, keyed by (driver, pool, device, shareID) (KEP-4817):

* every ``ready`` attachment of the claim: ``networkData`` {interfaceName, ips (CIDR),
  hardwareAddress}, ``data`` (:func:`cni_dra.state.claim_status.interface_data`: the link
  kind, the host NIC and the device profile ADD applied) and condition ``Ready=True``
  (reason ``InterfaceReady``, dated when the interface became ready: its ``readyAt``,
  else its record's time); for a claim
  shared by pods, whose one share is used by several interfaces, the first ready one
  (the entry follows the next when that one is deleted);
* every failed ADD recorded for a share with no ready attachment: ``Ready=False`` with
  the error class as reason and the CNI code and message.

NIC health (:mod:`cni_dra.agent.nichealth`, debounced): while the host NIC of a ready
share is down (``admin-down``, ``carrier-lost``) its entry says ``Ready=False`` with reason
``LinkDown``, while it is missing ``LinkMissing``, dated when the NIC turned unhealthy;
``networkData`` stays. When the NIC is healthy again the entry is ``Ready=True``
(``InterfaceReady``) again, dated then, except for an interface made before the NIC last
vanished: it went with the NIC, so it stays ``LinkMissing`` (as long as this agent runs:
a restarted agent no longer knows the NIC vanished). A health change re-applies every
claim with a ready share on that NIC.

When a share this writer applied goes away (DEL), the claim is applied again without it,
so its entry is removed (server-side apply drops fields its manager no longer sets).
The apply body names ``metadata.uid``, so a claim deleted and re-created under the same
name is never written. Records are removed from the state once applied, or when the
claim is gone (404) or replaced (409). Other failures are retried with exponential
backoff (0.5 s doubling, at most 30 s) per claim; records survive agent restarts
because they live in the state file.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from cni_dra.agent.nichealth import NicStatus, describe, rfc3339
from cni_dra.errors import CniError, TryAgainLaterError
from cni_dra.state.claim_status import interface_data, network_data

__all__ = ["StatusWriter", "claim_status_body"]

log = logging.getLogger("cni_dra.agent.status_writer")

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


def _entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
    return (e.get("driver"), e.get("pool"), e.get("device"), e.get("shareID") or None)


Health = Mapping[tuple[str, str, str], NicStatus]
"""NIC health by (driver, pool, device)."""


def _ready_keys(state: Any, uid: str, health: Health | None = None) -> frozenset[tuple[Any, ...]]:
    """The ready shares of claim ``uid`` with the interface each entry reports (a claim
    shared by pods: the first ready attachment's) and its NIC's health, so that a change
    of any is applied."""
    seen: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for a in state.attachments:
        if a.claim is not None and a.claim.uid == uid and a.phase == "ready" and a.result:
            st = (health or {}).get((a.driver, a.pool, a.device))
            seen.setdefault(
                (a.driver, a.pool, a.device, a.shareID or None),
                a.key + (_link_reason(a, st), st and st.problem),
            )
    return frozenset(k + v for k, v in seen.items())


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _wall(text: str | None) -> float | None:
    """RFC 3339 (``Z``, optional fraction) as Unix seconds, None if absent or unreadable."""
    try:
        return datetime.datetime.fromisoformat((text or "").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _link_reason(att: Any, st: NicStatus | None) -> str | None:
    """``LinkDown`` / ``LinkMissing`` when the attachment's NIC keeps it from being ready."""
    if st is None:
        return None
    if st.problem == "missing":
        return "LinkMissing"
    if st.problem is not None:
        return "LinkDown"
    ready = _wall(att.readyAt)
    if st.missing_since_wall_s is not None and (ready is None or ready < st.missing_since_wall_s):
        return "LinkMissing"  # made before the NIC vanished: the link went with it
    return None


def _ready_condition(att: Any, st: NicStatus | None, recorded: str | None) -> dict[str, Any]:
    """The ``Ready`` condition of a ready attachment's entry, with its NIC's health ``st``."""
    where = f"interface {att.ifname} of pod {att.podUID or '?'}"
    reason = _link_reason(att, st)
    if st is not None and reason is not None:
        if st.problem is None:  # back, but this interface went with the vanished NIC
            assert st.missing_since_wall_s is not None
            return {
                "type": "Ready",
                "status": "False",
                "reason": reason,
                "lastTransitionTime": rfc3339(st.missing_since_wall_s),
                "message": f"{where} went with host NIC {att.parent}, which vanished at {rfc3339(st.missing_since_wall_s)}",
            }
        return {
            "type": "Ready",
            "status": "False",
            "reason": reason,
            "message": f"{where}: {describe(st)}",
            "lastTransitionTime": rfc3339(st.unhealthy_since_wall_s or st.since_wall_s),
        }
    ready = _wall(att.readyAt)
    # when the interface became ready: the same however often the claim is applied (an
    # agent restart, another pod's interface on a shared claim's share)
    when = rfc3339(ready) if ready is not None else recorded or _now()
    if st is not None and st.recovered_wall_s is not None and (ready or 0) < st.recovered_wall_s:
        when = rfc3339(st.recovered_wall_s)  # ready again since its NIC recovered
    return {
        "type": "Ready",
        "status": "True",
        "reason": "InterfaceReady",
        "message": f"{where} on host NIC {att.parent}",
        "lastTransitionTime": when,
    }


def claim_status_body(
    claim: dict[str, str], state: Any, records: list[dict[str, Any]], health: Health | None = None
) -> dict[str, Any]:
    """The apply body for ``claim`` ({namespace, name, uid}) from the node ``state``, its
    pending ``records`` and the NICs' ``health`` (see module docstring). Entries are sorted
    by key."""
    entries: dict[tuple[Any, ...], dict[str, Any]] = {}
    times = {_entry_key(r): r.get("time") for r in records}
    for att in state.attachments:
        if att.claim is None or att.claim.uid != claim["uid"] or att.phase != "ready" or not att.result:
            continue
        entry: dict[str, Any] = {"driver": att.driver, "pool": att.pool, "device": att.device}
        if att.shareID:
            entry["shareID"] = att.shareID
        key = _entry_key(entry)
        if key in entries:  # a claim shared by pods: the first ready interface reports the share
            continue
        st = (health or {}).get((att.driver, att.pool, att.device))
        entry["conditions"] = [_ready_condition(att, st, times.get(key))]
        entry["networkData"] = network_data(att.result, att.ifname)
        entry["data"] = interface_data(att)
        entries[key] = entry
    for rec in sorted(records, key=lambda r: r.get("time") or ""):
        if rec.get("ready"):
            continue
        entry = {"driver": rec["driver"], "pool": rec["pool"], "device": rec["device"]}
        if rec.get("shareID"):
            entry["shareID"] = rec["shareID"]
        key = _entry_key(entry)
        if key in entries and "networkData" in entries[key]:  # a ready share: its ADD failed before
            continue
        entry["conditions"] = [
            {
                "type": "Ready",
                "status": "False",
                "reason": rec.get("reason") or "AddFailed",
                "message": rec.get("message") or "CNI ADD failed",
                "lastTransitionTime": rec.get("time") or _now(),
            }
        ]
        entries[key] = entry
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim["name"], "namespace": claim["namespace"], "uid": claim["uid"]},
        "status": {"devices": [entries[k] for k in sorted(entries, key=lambda k: tuple(str(x) for x in k))]},
    }


class StatusWriter:
    """Apply pending records. ``api``: :class:`cni_dra.k8s.api.KubeApi`; ``store``:
    :class:`cni_dra.state.StateStore`; ``count(outcome)``: metrics (applied, gone, error);
    ``health()``: the NICs' health by (driver, pool, device); ``clock``: monotonic seconds
    (tests)."""

    def __init__(
        self,
        api: Any,
        store: Any,
        *,
        field_manager: str,
        count: Callable[[str], None] = lambda outcome: None,
        health: Callable[[], Health] = dict,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.store = store
        self.field_manager = field_manager
        self.count = count
        self.health = health
        self.clock = clock
        self._attempts: dict[str, int] = {}
        self._due: dict[str, float] = {}
        # claim UID -> (claim ref, keys of its ready shares when last applied)
        # (None: unknown since a restart, so the claim is applied once to converge)
        self._applied: dict[str, tuple[dict[str, str], frozenset[tuple[Any, ...]] | None]] = {}
        self._seeded = False

    def pending(self) -> int:
        """How many records wait in the state."""
        return len(self.store.read().statusUpdates)

    def sync(self) -> float | None:
        """Apply every claim whose backoff is over: claims with pending records, and claims
        this writer applied before whose set of ready shares changed since (a DEL: its
        entry must go). Returns the seconds until the next retry is due, or None when
        nothing waits. Raises StateError (5) / TryAgainLaterError (11) only for the state."""
        state = self.store.read()
        health = self.health()
        if not self._seeded:
            self._seed(state)
        claims: dict[str, dict[str, str]] = {}
        groups: dict[str, list[dict[str, Any]]] = {}
        for rec in state.statusUpdates:
            uid = (rec.get("claim") or {}).get("uid", "")
            groups.setdefault(uid, []).append(rec)
            claims.setdefault(uid, rec.get("claim") or {})
        for uid, (claim, keys) in list(self._applied.items()):
            if uid not in groups and _ready_keys(state, uid, health) != keys:
                groups[uid] = []
                claims[uid] = claim
        if not groups:
            self._attempts.clear()
            self._due.clear()
            return None
        now = self.clock()
        done: set[str] = set()
        waits: list[float] = []
        for uid, records in groups.items():
            due = self._due.get(uid, 0.0)
            if due > now:
                waits.append(due - now)
                continue
            claim = claims[uid]
            if not (uid and claim.get("name") and claim.get("namespace")):
                done.update(r["id"] for r in records)  # malformed: nothing to write to
                continue
            outcome = self._apply(claim, state, records, health)
            self.count(outcome)
            if outcome == "error":
                n = self._attempts[uid] = self._attempts.get(uid, 0) + 1
                delay = min(BACKOFF_START_S * 2 ** (n - 1), BACKOFF_MAX_S)
                self._due[uid] = now + delay
                waits.append(delay)
                continue
            self._attempts.pop(uid, None)
            self._due.pop(uid, None)
            done.update(r["id"] for r in records)
            keys = _ready_keys(state, uid, health)
            if outcome == "applied" and keys:
                self._applied[uid] = (claim, keys)
            else:
                self._applied.pop(uid, None)
        if done:
            with self.store.transaction() as txn:
                txn.set_status_updates([r for r in txn.statusUpdates if r.get("id") not in done])
        return min(waits) if waits else None

    def _seed(self, state: Any) -> None:
        """After a (re)start, what this writer applied before is unknown: a share DEL'd while
        the agent was down, or after it restarted, would stay in the claim's status. So every
        claim this node holds (claim-mode attachments and prepared claims of this driver) is
        applied once with its current set of ready shares."""
        for att in state.attachments:
            if att.claim is not None and att.claim.uid and att.driver == self.field_manager:
                ref = {"namespace": att.claim.namespace, "name": att.claim.name, "uid": att.claim.uid}
                self._applied.setdefault(att.claim.uid, (ref, None))
        for _pod, claim in state.prepared_items():
            if claim.uid and any(r.driver == self.field_manager for r in claim.results):
                self._applied.setdefault(claim.uid, (claim.ref(), None))
        self._seeded = True

    def _apply(self, claim: dict[str, str], state: Any, records: list[dict[str, Any]], health: Health) -> str:
        body = claim_status_body(claim, state, records, health)
        where = f"{claim['namespace']}/{claim['name']}"
        try:
            out = self.api.apply_resource_claim_status(
                claim["namespace"], claim["name"], body, field_manager=self.field_manager
            )
        except TryAgainLaterError as exc:
            log.warning(
                "claim %s was replaced (UID %s no longer matches); dropping its status: %s",
                where,
                claim["uid"],
                exc.msg,
            )
            return "gone"
        except CniError as exc:
            log.warning("failed to write status of claim %s (will retry): %s %s", where, exc.msg, exc.details)
            return "error"
        if out is None:
            log.info("claim %s is gone; dropping its status records", where)
            return "gone"
        log.info("wrote status of claim %s (%d device entries)", where, len(body["status"]["devices"]))
        return "applied"
