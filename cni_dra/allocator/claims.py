"""Allocate whole ResourceClaims on this node, as the Kubernetes DRA allocator would.

Pure: inventory, claims, the node's current usage and the shareID generator are
passed in; nothing is read, written, timed or randomised here.

Semantics (k8s.io/dynamic-resource-allocation ``structured`` allocator; KEP-4381
structured parameters, KEP-4816 prioritized list, KEP-5075 consumable capacity):

* Requests are allocated in claim order. ``exactly`` with ``allocationMode:
  ExactCount`` (the default) takes ``count`` devices (default 1); ``allocationMode:
  All`` takes every device matching the request's selectors, needs at least one, and
  fails when any of them cannot be allocated. ``firstAvailable`` tries its
  subrequests in order; the result names ``<request>/<subrequest>``.
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
    ) -> None:
        self.driver = slice_.spec.driver
        self.devices = sorted(slice_.spec.devices, key=lambda d: d.name)
        self.usage = usage
        self.policy = policy
        self.max_steps = max_steps
        self.steps = 0
        self.constraints = claim.spec.devices.constraints
        self.constraint_values: list[list[DeviceAttribute]] = [[] for _ in self.constraints]
        self.alloc_consumed: dict[str, dict[str, Quantity]] = {}
        self.alloc_dedicated: set[str] = set()
        self.picks: list[_Pick] = []
        self._selectable: dict[tuple[str, str], bool] = {}

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
            if not ok:
                for j in added:
                    self.constraint_values[j].pop()
                return False, []
            values.append(attr)  # type: ignore[arg-type]
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
                matching = [d for d in self.devices if self.selectable(req, d)]
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

    # -- diagnostics ------------------------------------------------------------------

    def explain(self, requests: list[list[_Req]]) -> dict[str, str]:
        """Per request, why no device serves it on its own; else a combination message."""
        self.picks.clear()
        self.alloc_consumed.clear()
        self.alloc_dedicated.clear()
        self.constraint_values = [[] for _ in self.constraints]
        out: dict[str, str] = {}
        for alts in requests:
            parts: list[str] = []
            served = False
            for req in alts:
                per_device: dict[str, str] = {}
                for d in self.devices:
                    if not self.selectable(req, d):
                        per_device[d.name] = "does not match selectors"
                        continue
                    why = self.in_use(d, req) or self.consumption(req, d)[1]
                    if why is not None:
                        per_device[d.name] = why
                fitting = [d for d in self.devices if d.name not in per_device]
                matching = [d for d in self.devices if self.selectable(req, d)]
                if req.all_mode:
                    ok = bool(matching) and len(fitting) == len(matching)
                else:
                    ok = any(d.shared for d in fitting) or len(fitting) >= req.count
                if ok:
                    served = True
                    break
                detail = "; ".join(f"{n}: {w}" for n, w in sorted(per_device.items()))
                if not req.all_mode and req.count > 1 and len(fitting) < req.count:
                    shortfall = f"needs {req.count} devices, {len(fitting)} available"
                    detail = f"{detail}; {shortfall}" if detail else shortfall
                detail = detail or "no devices"
                prefix = f"{req.name}: " if len(alts) > 1 else ""
                parts.append(prefix + detail)
            if not served and alts:
                out[alts[0].base] = " | ".join(parts)
        if not out:
            out["claim"] = "no combination of devices satisfies all requests and constraints together"
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
    claims: those return :class:`ClaimNoFit` with a reason per request.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown selection policy {policy!r}")
    cid = _claim_id(claim)
    try:
        requests = _expand(claim, classes)
        search = _Search(claim, slice_, usage, policy, max_steps)
        if not search.solve(requests, 0):
            return ClaimNoFit(cid, search.explain(requests))
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
