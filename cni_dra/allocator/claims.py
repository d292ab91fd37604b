"""Allocate whole ResourceClaims on this node, as the Kubernetes DRA allocator would.

Pure: inventory, claims, the node's current usage and the shareID generator are
passed in; nothing is read, written, timed or randomised here.

Semantics (k8s.io/dynamic-resource-allocation ``structured`` allocator; KEP-4381
structured parameters, KEP-4816 prioritized list, KEP-5075 consumable capacity):

* Requests are allocated in claim order. ``exactly`` with ``allocationMode:
  ExactCount`` (the default) takes ``count`` devices (default 1); ``allocationMode:
  All`` takes every device that matches the request's selectors and whose capacity
  could serve the request on an idle device (each requested capacity exists, its
  requestPolicy admits the amount, the amount is within the capacity's value: the
  capacity request filters like a selector on the totals), needs at least one such
  device, and fails when any of them cannot be allocated now (held by a dedicated
  allocation, not enough left after the node's usage and earlier requests, a
  constraint). A device that is merely full is not left out: it fails the request.
  ``firstAvailable`` tries its subrequests in order; the result names
  ``<request>/<subrequest>``.
* Shared devices (``allowMultipleAllocations: true``) can serve several requests and
  claims while their capacity lasts; each allocation consumes per KEP-5075 (see
  :mod:`cni_dra.allocator.capacity`), counting what the node has consumed and what
  earlier requests of the same claim took, and gets a ``shareID`` and a
  ``consumedCapacity`` holding every capacity of the device. Dedicated devices serve
  one allocation at a time, without shareID or consumedCapacity; a capacity request
  only filters them (``value ≥ request``). A shared device held by a dedicated
  allocation, or a dedicated device holding shared allocations, is unavailable.
* ``constraints``: ``matchAttribute`` — every device allocated for the listed
  requests (all requests when the list is empty; ``req`` covers its subrequests) has
  the attribute, all with the same typed value; ``distinctAttribute`` — all values
  differ. A device lacking the attribute violates the constraint.
* The search is depth first with backtracking: when an early choice blocks a later
  request or constraint, the next candidate is tried. The first complete solution is
  taken. Candidates are tried in the order of the selection ``policy`` (see
  :mod:`cni_dra.allocator.select`; default ``first-fit`` = by device name), so the
  result does not depend on the order of the inventory.
* CEL selectors of a request (and of its device class, when ``classes`` maps class
  names to selector expressions) must all hold. A selector that fails at run time
  stops the claim, as upstream.
* ``shareID``s are drawn from ``share_id`` only for the final solution, in result order.
* A claim may hold at most 32 results (``AllocationResultsMaxSize``).
* When a claim does not fit, :class:`ClaimNoFit` gives a reason per request and, when
  each fits alone, what makes the combination fail (see :func:`allocate_claim`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cni_dra.allocator.capacity import NoFit, device_consumption
from cni_dra.allocator.select import POLICIES, Policy, policy_sort_key, rank_key
from cni_dra.dra.models import (
    AllocationResult,
    Device,
    DeviceAllocationResult,
    DeviceAttribute,
    DeviceRequestAllocationResult,
    ResourceClaim,
    ResourceSlice,
    lookup_device_attribute,
)
from cni_dra.errors import InvalidConfigError
from cni_dra.quantity import Quantity

__all__ = [
    "MAX_RESULTS",
    "NodeUsage",
    "ClaimNoFit",
    "allocate_claim",
    "allocate_claims",
]

MAX_RESULTS = 32
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
        return self.consumed.get(device, {})


@dataclass(frozen=True)
class ClaimNoFit:
    """The claim cannot be allocated. ``reasons``: request name (or ``claim``) → why."""

    claim: str
    reasons: dict[str, str]

    def __str__(self) -> str:
        body = "; ".join(f"request {r}: {why}" if r != "claim" else why for r, why in self.reasons.items())
        return f"claim {self.claim} cannot be allocated: {body}"


@dataclass(frozen=True)
class _Req:
    name: str  # "req" or "req/sub"
    base: str
    selectors: tuple[str, ...]
    all_mode: bool
    count: int
    capacity: Mapping[str, Quantity]
    admin_access: bool


@dataclass
class _Pick:
    req: _Req
    device: Device
    consumption: dict[str, Quantity] | None  # None for dedicated devices
    constraint_idx: list[int] = field(default_factory=list)


class _Abort(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _claim_id(claim: ResourceClaim) -> str:
    m = claim.metadata
    return f"{m.namespace}/{m.name}" if m.namespace else (m.name or "<unnamed>")


def _expand(claim: ResourceClaim, classes: Mapping[str, Sequence[str]] | None) -> list[list[_Req]]:
    out: list[list[_Req]] = []
    names: set[str] = set()
    for request in claim.spec.devices.requests:
        if request.name in names:
            raise _Abort(f"request name {request.name} is used twice")
        names.add(request.name)
        if (request.exactly is None) == (not request.first_available):
            raise _Abort(f"request {request.name}: exactly one of exactly or firstAvailable is required")
        alts: list[_Req] = []
        specs: list[tuple[str, Any]] = (
            [(request.name, request.exactly)]
            if request.exactly is not None
            else [(f"{request.name}/{sub.name}", sub) for sub in request.first_available or []]
        )
        for name, spec in specs:
            selectors = [s.cel.expression for s in spec.selectors or [] if s.cel is not None]
            if classes is not None:
                if spec.device_class_name not in classes:
                    raise _Abort(f"request {name}: unknown device class {spec.device_class_name!r}")
                selectors = list(classes[spec.device_class_name]) + selectors
            mode = spec.allocation_mode or "ExactCount"
            if mode == "All":
                if spec.count not in (None, 0):
                    raise _Abort(f"request {name}: count must not be set when allocationMode is All")
                count = 0
            else:
                count = 1 if spec.count is None else spec.count
                if count <= 0:
                    raise _Abort(f"request {name}: count must be greater than zero")
            capacity = dict(spec.capacity.requests) if spec.capacity is not None else {}
            for cap_name, q in capacity.items():
                if q.sign() < 0:
                    raise _Abort(f"request {name}: capacity {cap_name} request {q} is negative")
            alts.append(
                _Req(name, request.name, tuple(selectors), mode == "All", count, capacity,
                     bool(getattr(spec, "admin_access", None)))
            )
        out.append(alts)
    for i, c in enumerate(claim.spec.devices.constraints):
        if (c.match_attribute is None) == (c.distinct_attribute is None):
            raise _Abort(f"constraint #{i}: exactly one of matchAttribute or distinctAttribute is required")
        for ref in c.requests or []:
            base, _, sub = ref.partition("/")
            alts_for = next((a for a in out if a and a[0].base == base), None)
            if alts_for is None or (sub and not any(a.name == ref for a in alts_for)):
                raise _Abort(f"constraint #{i}: unknown request {ref}")
    return out


class _Search:
    def __init__(
        self,
        claim: ResourceClaim,
        slice_: ResourceSlice,
        usage: NodeUsage,
        policy: Policy,
        max_steps: int,
        constraints: Sequence[Any] | None = None,
        selectable_cache: dict[tuple[str, str], bool] | None = None,
    ) -> None:
        self.driver = slice_.spec.driver
        self.devices = sorted(slice_.spec.devices, key=lambda d: d.name)
        self.usage = usage
        self.policy = policy
        self.max_steps = max_steps
        self.steps = 0
        self.constraints = list(claim.spec.devices.constraints if constraints is None else constraints)
        self.constraint_values: list[list[DeviceAttribute]] = [[] for _ in self.constraints]
        self.alloc_consumed: dict[str, dict[str, Quantity]] = {}
        self.alloc_dedicated: set[str] = set()
        self.picks: list[_Pick] = []
        self._selectable: dict[tuple[str, str], bool] = {} if selectable_cache is None else selectable_cache
        self._all_devices: dict[str, list[Device]] = {}

    # -- per-device checks ------------------------------------------------------------

    def selectable(self, req: _Req, device: Device) -> bool:
        key = (req.name, device.name)
        if key not in self._selectable:
            if req.selectors:
                from cni_dra.allocator.cel import device_matches

                try:
                    self._selectable[key] = device_matches(req.selectors, device, self.driver)
                except InvalidConfigError as exc:
                    raise _Abort(f"request {req.name}: {exc.msg}") from exc
            else:
                self._selectable[key] = True
        return self._selectable[key]

    def static_misfit(self, req: _Req, device: Device) -> str | None:
        """Why ``device`` could not serve one allocation of ``req`` even when idle, or None.

        The capacity request read as a filter on the device's totals: a requested
        capacity it lacks, an amount its requestPolicy refuses, or an amount (after
        the policy's rounding) above the capacity's whole value.
        """
        cons = device_consumption(device, req.capacity, self.driver)
        if isinstance(cons, NoFit):
            return cons.reasons[device.name]
        for key, amount in sorted(cons.items()):
            value = device.capacity[key].value
            if amount > value:
                return f"capacity {key} {value} < {amount}"
        return None

    def all_devices(self, req: _Req) -> list[Device]:
        """The devices an ``allocationMode: All`` request must take, in name order.

        Those matching its selectors that pass :meth:`static_misfit`; what is in use
        on them does not matter here (that is checked when each is placed).
        """
        if req.name not in self._all_devices:
            self._all_devices[req.name] = [
                d for d in self.devices if self.selectable(req, d) and self.static_misfit(req, d) is None
            ]
        return self._all_devices[req.name]

    def in_use(self, device: Device, req: _Req) -> str | None:
        if req.admin_access:
            return None
        if device.name in self.usage.dedicated or device.name in self.alloc_dedicated:
            return "held by a dedicated allocation"
        if not device.shared and (device.name in self.usage.shared or device.name in self.alloc_consumed):
            return "dedicated device holds shared allocations"
        return None

    def consumption(self, req: _Req, device: Device) -> tuple[dict[str, Quantity] | None, str | None]:
        """(consumption or None for dedicated, reason when it does not fit)."""
        cons = device_consumption(device, req.capacity, self.driver)
        if isinstance(cons, NoFit):
            return None, cons.reasons[device.name]
        if not device.shared or req.admin_access:
            return None, None
        node = self.usage.consumed_on(device.name)
        mine = self.alloc_consumed.get(device.name, {})
        for key, amount in sorted(cons.items()):
            already = node.get(key, _ZERO) + mine.get(key, _ZERO)
            value = device.capacity[key].value
            if already + amount > value:
                return None, f"remaining {key} {value - already} < {amount}"
        return cons, None

    def constraint_ok(self, req: _Req, device: Device) -> tuple[bool, list[int]]:
        added: list[int] = []
        for i, c in enumerate(self.constraints):
            if c.requests and req.base not in c.requests and req.name not in c.requests:
                continue
            attr_name = c.match_attribute or c.distinct_attribute or ""
            attr = lookup_device_attribute(device, attr_name, self.driver)
            values = self.constraint_values[i]
            ok = attr is not None and (
                all(v == attr for v in values) if c.match_attribute is not None else attr not in values
            )
            if attr is None or not ok:  # ok is False whenever attr is None
                for j in added:
                    self.constraint_values[j].pop()
                return False, []
            values.append(attr)
            added.append(i)
        return True, added

    # -- place / undo -----------------------------------------------------------------

    def try_place(self, req: _Req, device: Device) -> bool:
        self.steps += 1
        if self.steps > self.max_steps:
            raise _Abort(f"search limit of {self.max_steps} steps exceeded")
        if len(self.picks) >= MAX_RESULTS:
            return False
        if self.in_use(device, req) is not None or not self.selectable(req, device):
            return False
        cons, why = self.consumption(req, device)
        if why is not None:
            return False
        ok, added = self.constraint_ok(req, device)
        if not ok:
            return False
        self.picks.append(_Pick(req, device, cons, added))
        if req.admin_access:
            pass
        elif cons is None:
            self.alloc_dedicated.add(device.name)
        else:
            slot = self.alloc_consumed.setdefault(device.name, {})
            for k, v in cons.items():
                slot[k] = slot.get(k, _ZERO) + v
        return True

    def undo(self) -> None:
        pick = self.picks.pop()
        for j in pick.constraint_idx:
            self.constraint_values[j].pop()
        if pick.req.admin_access:
            return
        if pick.consumption is None:
            self.alloc_dedicated.discard(pick.device.name)
            return
        slot = self.alloc_consumed[pick.device.name]
        for k, v in pick.consumption.items():
            slot[k] = slot[k] - v
        if all(v.is_zero() for v in slot.values()):
            del self.alloc_consumed[pick.device.name]

    # -- search -----------------------------------------------------------------------

    def ordered(self, req: _Req) -> list[Device]:
        keyed = []
        for d in self.devices:
            on_node = dict(self.usage.consumed_on(d.name))
            for k, v in self.alloc_consumed.get(d.name, {}).items():
                on_node[k] = on_node.get(k, _ZERO) + v
            key: tuple[int, ...] = ()
            if self.policy != "first-fit":
                cons = device_consumption(d, req.capacity, self.driver)
                key = rank_key(d, on_node, {} if isinstance(cons, NoFit) else cons, req.capacity, self.driver)
            keyed.append((policy_sort_key(self.policy, key, d.name), d))
        keyed.sort(key=lambda kd: kd[0])
        return [d for _, d in keyed]

    def solve(self, requests: list[list[_Req]], ri: int) -> bool:
        if ri == len(requests):
            return True
        for req in requests[ri]:
            if req.all_mode:
                matching = self.all_devices(req)
                if not matching:
                    continue
                placed = 0
                for d in matching:
                    if not self.try_place(req, d):
                        break
                    placed += 1
                if placed == len(matching) and self.solve(requests, ri + 1):
                    return True
                for _ in range(placed):
                    self.undo()
                continue
            if self.place_n(requests, ri, req, req.count, self.ordered(req), 0):
                return True
        return False

    def place_n(self, requests: list[list[_Req]], ri: int, req: _Req, n: int, order: list[Device], start: int) -> bool:
        if n == 0:
            return self.solve(requests, ri + 1)
        for idx in range(start, len(order)):
            if self.try_place(req, order[idx]):
                # Shared devices may serve the same request again; dedicated ones cannot.
                if self.place_n(requests, ri, req, n - 1, order, idx):
                    return True
                self.undo()
        return False

def _names(names: Sequence[str]) -> str:
    """``a`` / ``a and b`` / ``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _attr_text(attr: DeviceAttribute | None) -> str:
    if attr is None:
        return "(none)"
    if attr.string_value is not None:
        return f'"{attr.string_value}"'
    if attr.version_value is not None:
        return f"version {attr.version_value}"
    v = attr.value
    return str(v).lower() if isinstance(v, bool) else str(v)


class _Explain:
    """Why a claim does not fit, request by request (the search failed).

    Each request is first tried on its own against the node's usage (alternatives in
    order): one that does not fit gets each device's rejection (selectors, in use,
    capacity) plus, when every device would take one allocation, what stops the request
    as a whole (count, results limit, a constraint). When every request fits alone, a
    minimal set of requests that fails together is found by deletion, then a minimal set
    of constraints under which that set still fails; the ``claim`` entry names them, or,
    when the set fails without constraints, the shared capacity or dedicated devices they
    compete for. Pure, like the search: each probe is a fresh bounded :class:`_Search`.
    """

    def __init__(
        self,
        claim: ResourceClaim,
        slice_: ResourceSlice,
        usage: NodeUsage,
        policy: Policy,
        max_steps: int,
        requests: list[list[_Req]],
        cache: dict[tuple[str, str], bool],
    ) -> None:
        self.claim, self.slice_, self.usage, self.policy, self.max_steps = claim, slice_, usage, policy, max_steps
        self.requests = [alts for alts in requests if alts]
        self.cache = cache
        self.constraints = list(claim.spec.devices.constraints)
        self.driver = slice_.spec.driver
        self.probe = _Search(claim, slice_, usage, policy, max_steps, selectable_cache=cache)
        self.devices = self.probe.devices

    def fits(self, requests: list[list[_Req]], constraint_idx: Sequence[int]) -> bool:
        search = _Search(self.claim, self.slice_, self.usage, self.policy, self.max_steps,
                         [self.constraints[i] for i in constraint_idx], self.cache)
        return search.solve(requests, 0)

    def device_reasons(self, req: _Req) -> dict[str, str]:
        """Device name → why it cannot take one allocation of ``req`` on the node as it is."""
        out: dict[str, str] = {}
        for d in self.devices:
            if not self.probe.selectable(req, d):
                out[d.name] = "does not match selectors"
                continue
            if req.all_mode:
                static = self.probe.static_misfit(req, d)
                if static is not None:
                    out[d.name] = f"left out of All: {static}"
                    continue
            why = self.probe.in_use(d, req) or self.probe.consumption(req, d)[1]
            if why is not None:
                out[d.name] = why
        return out

    def minimal_constraints(self, requests: list[list[_Req]]) -> list[int]:
        keep = list(range(len(self.constraints)))
        for i in list(keep):
            trial = [k for k in keep if k != i]
            if not self.fits(requests, trial):
                keep = trial
        return keep

    @staticmethod
    def _applies(constraint: Any, req: _Req) -> bool:
        return not constraint.requests or req.base in constraint.requests or req.name in constraint.requests

    def describe_constraints(self, idx: Sequence[int], reqs: Sequence[_Req]) -> str:
        parts = []
        for i in idx:
            c = self.constraints[i]
            kind = "matchAttribute" if c.match_attribute is not None else "distinctAttribute"
            attr = c.match_attribute or c.distinct_attribute or ""
            per_req = []
            for req in reqs:
                if not self._applies(c, req):
                    continue
                rejected = self.device_reasons(req)
                vals = [
                    f"{d.name}={_attr_text(lookup_device_attribute(d, attr, self.driver))}"
                    for d in self.devices
                    if d.name not in rejected
                ]
                per_req.append(f"{req.name} can use {', '.join(vals) or 'no device'}")
            parts.append(f"{kind} {attr} ({'; '.join(per_req)})")
        return " and ".join(parts)

    def _results_needed(self, req: _Req) -> int:
        return len(self.probe.all_devices(req)) if req.all_mode else req.count

    def _room(self, req: _Req, device: Device) -> int | None:
        """How many allocations of ``req`` ``device`` still takes (None: unbounded)."""
        if req.admin_access:
            return None
        if not device.shared:
            return 1
        cons = device_consumption(device, req.capacity, self.driver)
        if isinstance(cons, NoFit):
            return 0
        node = self.usage.consumed_on(device.name)
        room: int | None = None
        for key, amount in cons.items():
            if amount.sign() <= 0:
                continue
            left = (device.capacity[key].value - node.get(key, _ZERO)).nanos // amount.nanos
            room = left if room is None else min(room, left)
        return room

    def sharing_conflicts(self, reqs: Sequence[_Req]) -> list[str]:
        """Results limit, dedicated devices and shared capacities ``reqs`` compete for."""
        msgs = []
        needed = sum(self._results_needed(r) for r in reqs)
        if needed > MAX_RESULTS:
            msgs.append(f"together they need {needed} results, a claim holds at most {MAX_RESULTS}")
        rejected = {r.name: self.device_reasons(r) for r in reqs}
        for d in self.devices:
            users = [r for r in reqs if d.name not in rejected[r.name] and not r.admin_access]
            if len(users) < 2:
                continue
            if not d.shared:
                msgs.append(f"{d.name} is dedicated (one allocation at a time): {_names([u.name for u in users])} compete for it")
                continue
            node = self.usage.consumed_on(d.name)
            cons = [(u, device_consumption(d, u.capacity, self.driver)) for u in users]
            for key in sorted(d.capacity):
                amounts = [(u, c.get(key, _ZERO)) for u, c in cons if isinstance(c, dict)]
                total = node.get(key, _ZERO)
                for _, a in amounts:
                    total = total + a
                value = d.capacity[key].value
                if total > value:
                    terms = ([f"{node[key]} in use"] if not node.get(key, _ZERO).is_zero() else [])
                    terms += [f"{u.name} {a}" for u, a in amounts]
                    msgs.append(f"combined {key} {total} > {value} on {d.name} ({' + '.join(terms)})")
        return msgs

    def describe_sharing(self, reqs: Sequence[_Req]) -> str:
        msgs = self.sharing_conflicts(reqs)
        if not msgs:
            rejected = {r.name: self.device_reasons(r) for r in reqs}
            cands = "; ".join(
                f"{r.name} on {', '.join(d.name for d in self.devices if d.name not in rejected[r.name]) or 'no device'}"
                for r in reqs
            )
            msgs.append(f"the devices cannot serve them all at once ({cands})")
        return " / ".join(msgs)

    def solo_failure(self, req: _Req) -> str:
        per = self.device_reasons(req)
        parts = [f"{n}: {w}" for n, w in sorted(per.items())]
        fitting = [d for d in self.devices if d.name not in per]
        matching = self.probe.all_devices(req) if req.all_mode else []
        if not self.devices:
            parts.append("no devices")
        elif req.all_mode and not matching:
            parts.append("allocationMode All needs at least one matching device"
                         + (" that has the requested capacity" if req.capacity else ""))
        elif fitting and (not req.all_mode or len(fitting) == len(matching)):
            # Every device it needs takes one allocation: the request as a whole fails.
            needed = self._results_needed(req)
            if needed > MAX_RESULTS:
                parts.append(f"needs {needed} results, a claim holds at most {MAX_RESULTS}")
            elif self.fits([[req]], []):
                idx = self.minimal_constraints([[req]])
                parts.append("constraint " + self.describe_constraints(idx, [req]))
            elif not req.all_mode and not any(d.shared for d in fitting):
                parts.append(f"needs {req.count} devices, {len(fitting)} available")
            else:
                rooms = [(d.name, self._room(req, d)) for d in fitting]
                text = ", ".join(f"{n} {'unbounded' if k is None else k}" for n, k in rooms)
                parts.append(f"needs {needed} allocations, room for: {text}")
        return "; ".join(parts) or "no devices"

    def reasons(self) -> dict[str, str]:
        out: dict[str, str] = {}
        everything = list(range(len(self.constraints)))
        try:
            solo: list[_Req | None] = []
            for alts in self.requests:
                alt = next((a for a in alts if self.fits([[a]], everything)), None)
                solo.append(alt)
                if alt is None:
                    out[alts[0].base] = " | ".join(
                        (f"{a.name}: " if len(alts) > 1 else "") + self.solo_failure(a) for a in alts
                    )
                    continue
                per = self.device_reasons(alt)
                fitting = [d.name for d in self.devices if d.name not in per]
                text = f"fits alone{' as ' + alt.name if len(alts) > 1 else ''} on {', '.join(fitting)}"
                if per:
                    text += " (" + "; ".join(f"{n}: {w}" for n, w in sorted(per.items())) + ")"
                out[alts[0].base] = text
            fitted = [a for a in solo if a is not None]
            if len(fitted) < len(solo):
                return out
            chosen = list(range(len(self.requests)))
            for i in list(chosen):
                trial = [k for k in chosen if k != i]
                if trial and not self.fits([self.requests[k] for k in trial], everything):
                    chosen = trial
            cs = self.minimal_constraints([self.requests[k] for k in chosen])
            reqs = [fitted[k] for k in chosen]
            names = _names([self.requests[k][0].base for k in chosen])
            if cs:  # constraints make it fail; name what they compete for too, if anything
                why = " / ".join([self.describe_constraints(cs, reqs), *self.sharing_conflicts(reqs)])
            else:
                why = self.describe_sharing(reqs)
            head = f"requests {names} fit alone but not together" if len(chosen) > 1 else f"request {names} does not fit"
            out["claim"] = f"{head}: {why}"
        except _Abort as exc:
            out["claim"] = (
                "no combination of devices satisfies all requests and constraints together "
                f"(diagnosis stopped: {exc.reason})"
            )
        return out


def allocate_claim(
    claim: ResourceClaim,
    slice_: ResourceSlice,
    usage: NodeUsage,
    share_id: Callable[[], str],
    policy: Policy = "first-fit",
    classes: Mapping[str, Sequence[str]] | None = None,
    max_steps: int = 100_000,
) -> AllocationResult | ClaimNoFit:
    """The ``status.allocation`` ``claim`` gets on this node, or why it cannot.

    ``slice_`` is the node's inventory, ``usage`` what is already allocated there,
    ``share_id`` returns a fresh lowercase UUID string per shared allocation,
    ``policy`` orders candidates (``first-fit``, ``best-fit``, ``least-allocated``),
    ``classes`` optionally maps DeviceClass names to their CEL selectors (None:
    ``deviceClassName`` is not checked). Raises nothing for unsatisfiable or invalid
    claims: those return :class:`ClaimNoFit` with a reason per request (each device's
    rejection when the request is tried alone on the node, or ``fits alone on ...``)
    and, when every request fits alone, a ``claim`` entry naming a minimal set of
    requests that fails together and the constraint, shared capacity or dedicated
    device that makes it fail. The diagnosis re-runs the bounded search a few times
    per request and constraint, only on failure.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown selection policy {policy!r}")
    cid = _claim_id(claim)
    try:
        requests = _expand(claim, classes)
        search = _Search(claim, slice_, usage, policy, max_steps)
        if not search.solve(requests, 0):
            return ClaimNoFit(cid, _Explain(claim, slice_, usage, policy, max_steps, requests, search._selectable).reasons())
    except _Abort as exc:
        return ClaimNoFit(cid, {"claim": exc.reason})
    results = []
    for pick in search.picks:
        shared = pick.consumption is not None
        results.append(
            DeviceRequestAllocationResult(
                request=pick.req.name,
                driver=search.driver,
                pool=slice_.spec.pool.name,
                device=pick.device.name,
                admin_access=True if pick.req.admin_access else None,
                consumed_capacity=pick.consumption if shared else None,
                share_id=share_id() if shared else None,
            )
        )
    node_selector = None
    if slice_.spec.node_name:
        node_selector = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [slice_.spec.node_name]}]}
            ]
        }
    return AllocationResult(devices=DeviceAllocationResult(results=results), node_selector=node_selector)


def allocate_claims(
    claims: Sequence[ResourceClaim],
    slice_: ResourceSlice,
    usage: NodeUsage,
    share_id: Callable[[], str],
    policy: Policy = "first-fit",
    classes: Mapping[str, Sequence[str]] | None = None,
) -> list[AllocationResult | ClaimNoFit]:
    """Allocate ``claims`` in order, each seeing what the earlier ones consumed."""
    out: list[AllocationResult | ClaimNoFit] = []
    for claim in claims:
        res = allocate_claim(claim, slice_, usage, share_id, policy, classes)
        if isinstance(res, AllocationResult):
            usage = usage.with_results(res.devices.results)
        out.append(res)
    return out
