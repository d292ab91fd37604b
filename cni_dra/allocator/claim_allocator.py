"""Allocate whole ResourceClaims on this node, as the Kubernetes DRA allocator would.

Pure: inventory, claims, the node's current usage and the shareID generator are
passed in; nothing is read, written, timed or randomised here.

Semantics (k8s.io/dynamic-resource-allocation ``structured`` allocator; KEP-4381
structured parameters, KEP-4816 prioritized list, KEP-5075 consumable capacity):

* Requests are allocated in claim order. ``exactly`` with ``allocationMode:
  ExactCount`` (the default) takes ``count`` distinct devices (default 1: one request
  never takes a device twice, shared or not; upstream goes on from the next device,
  k8s.io/dynamic-resource-allocation ``structured/internal/incubating/allocator_incubating.go``
  ``allocateOne``); ``allocationMode:
  All`` takes every device that matches the request's selectors and whose capacity
  could serve the request on an idle device (each requested capacity exists, its
  requestPolicy admits the amount, the amount is within the capacity's value: the
  capacity request filters like a selector on the totals), needs at least one such
  device, and fails when any of them cannot be allocated now (held by a dedicated
  allocation, not enough left after the node's usage and earlier requests, a
  constraint). A device that is merely full is not left out: it fails the request; one
  that breaks a constraint stops the search with an error, as upstream's
  ``allocateDevice(must=true)`` does. These devices are picked before any request is
  placed (upstream's ``validateDeviceRequest``), so a selector that fails to evaluate or
  a capacity request the device's range cannot compute there is the claim's error even
  when an earlier request never fits.
  ``firstAvailable`` tries its subrequests in order; the result names
  ``<request>/<subrequest>``.
* Shared devices (``allowMultipleAllocations: true``) can serve several requests and
  claims while their capacity lasts; each allocation consumes per KEP-5075 (see
  :mod:`cni_dra.allocator.capacity`, in the arithmetic of the cluster's
  ``DRAFractionalCapacityRange`` gate), counting what the node has consumed and what
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

This module is the public face; one module per job below it: :mod:`.claim_requests`
(the requests checked and expanded into alternatives, the results limit),
:mod:`.usage` (:class:`NodeUsage`, what the node already holds), :mod:`.claim_search`
(the backtracking search) and :mod:`.claim_explain` (the diagnosis when it fails).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cni_dra.allocator.claim_explain import explain_no_fit
from cni_dra.allocator.claim_requests import MAX_RESULTS, SearchAbort, expand_requests
from cni_dra.allocator.claim_search import ClaimProblem, ClaimSearch
from cni_dra.allocator.select import POLICIES, Policy
from cni_dra.allocator.usage import NodeUsage
from cni_dra.dra.claims import (
    AllocationResult,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    ResourceClaim,
)
from cni_dra.dra.objects import ResourceSlice

__all__ = [
    "MAX_RESULTS",
    "NodeUsage",
    "ClaimNoFit",
    "allocate_claim",
    "allocate_claims",
    "claim_id",
]


@dataclass(frozen=True)
class ClaimNoFit:
    """The claim cannot be allocated. ``reasons``: request name (or ``claim``) → why.

    ``aborted``: the search stopped (a claim the API server would refuse, a request a
    device's range cannot compute, a CEL selector failing at run time, the step limit)
    instead of finding that nothing fits; the scheduler reports such a claim as an
    error (condition reason ``SchedulerError``), not as ``Unschedulable``.
    """

    claim: str
    reasons: dict[str, str]
    aborted: bool = False

    def __str__(self) -> str:
        body = "; ".join(f"request {r}: {why}" if r != "claim" else why for r, why in self.reasons.items())
        return f"claim {self.claim} cannot be allocated: {body}"


def claim_id(claim: ResourceClaim) -> str:
    """``namespace/name`` of ``claim`` (its name alone when it has no namespace), as
    :class:`ClaimNoFit` and the ``allocate`` command name it."""
    m = claim.metadata
    return f"{m.namespace}/{m.name}" if m.namespace else (m.name or "<unnamed>")


def allocate_claim(
    claim: ResourceClaim,
    slice_: ResourceSlice,
    usage: NodeUsage,
    share_id: Callable[[], str],
    policy: Policy = "first-fit",
    classes: Mapping[str, Sequence[str]] | None = None,
    max_steps: int = 100_000,
    *,
    fractional_capacity_range: bool = False,
) -> AllocationResult | ClaimNoFit:
    """The ``status.allocation`` ``claim`` gets on this node, or why it cannot.

    ``slice_`` is the node's inventory, ``usage`` what is already allocated there,
    ``share_id`` returns a fresh lowercase UUID string per shared allocation,
    ``policy`` orders candidates (``first-fit``, ``best-fit``, ``least-allocated``),
    ``classes`` optionally maps DeviceClass names to their CEL selectors (None:
    ``deviceClassName`` is not checked), ``fractional_capacity_range`` the cluster's
    ``DRAFractionalCapacityRange`` gate (:mod:`cni_dra.allocator.capacity`; off unless
    said, the Kubernetes 1.37 default). Raises nothing for unsatisfiable or invalid
    claims: those return :class:`ClaimNoFit` with a reason per request (each device's
    rejection when the request is tried alone on the node, or ``fits alone on ...``)
    and, when every request fits alone, a ``claim`` entry naming a minimal set of
    requests that fails together and the constraint, shared capacity or dedicated
    device that makes it fail. The diagnosis re-runs the bounded search a few times
    per request and constraint, only on failure.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown selection policy {policy!r}")
    cid = claim_id(claim)
    try:
        requests = expand_requests(claim, classes)
        problem = ClaimProblem(claim, slice_, usage, policy, max_steps, fractional_capacity_range)
        search = ClaimSearch(problem)
        search.set_up(requests)
        if not search.solve(requests, 0):
            return ClaimNoFit(cid, explain_no_fit(problem, requests, search.selectable_cache))
    except SearchAbort as exc:
        return ClaimNoFit(cid, {"claim": exc.reason}, aborted=True)
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
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [slice_.spec.node_name]}
                    ]
                }
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
    *,
    fractional_capacity_range: bool = False,
) -> list[AllocationResult | ClaimNoFit]:
    """Allocate ``claims`` in order, each seeing what the earlier ones consumed
    (``fractional_capacity_range``: as for :func:`allocate_claim`)."""
    out: list[AllocationResult | ClaimNoFit] = []
    for claim in claims:
        res = allocate_claim(
            claim,
            slice_,
            usage,
            share_id,
            policy,
            classes,
            fractional_capacity_range=fractional_capacity_range,
        )
        if isinstance(res, AllocationResult):
            usage = usage.with_results(res.devices.results, slice_.spec.devices)
        out.append(res)
    return out
