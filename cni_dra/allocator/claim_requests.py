"""A claim's requests as the whole-claim search sees them, checked once before it starts.

Each request of ``spec.devices.requests`` becomes its list of alternatives
(:class:`ClaimRequest`): the request itself for ``exactly``, or one per subrequest of
``firstAvailable`` (named ``<request>/<subrequest>``), in order. Device-class selectors
come before the request's own. A claim the API server would refuse (a request name used
twice, both or neither of ``exactly`` and ``firstAvailable``, a count with
``allocationMode: All``, a negative capacity request, a constraint naming an unknown
request) stops with :class:`SearchAbort`, as does anything that stops a search later (a
CEL selector failing at run time, the step limit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cni_dra.dra.claims import DeviceConstraint, DeviceSubRequest, ExactDeviceRequest, ResourceClaim
from cni_dra.quantity import Quantity

__all__ = ["MAX_RESULTS", "ClaimRequest", "SearchAbort", "expand_requests"]

MAX_RESULTS = 32
"""The most results one claim holds (``AllocationResultsMaxSize``)."""


class SearchAbort(Exception):
    """The claim cannot be searched at all; ``reason`` says why (it names the request)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ClaimRequest:
    """One way to serve a request: the request (``exactly``) or one of its subrequests.

    ``name`` is ``req`` or ``req/sub``, ``base`` the request's name; ``selectors`` the CEL
    expressions that must all hold (device class first); ``all_mode`` for
    ``allocationMode: All`` (then ``count`` is 0); ``capacity`` the amounts requested per
    capacity name.
    """

    name: str
    base: str
    selectors: tuple[str, ...]
    all_mode: bool
    count: int
    capacity: Mapping[str, Quantity]
    admin_access: bool

    def covered_by(self, constraint: DeviceConstraint) -> bool:
        """Whether ``constraint`` applies to this request (no list: every request does)."""
        return not constraint.requests or self.base in constraint.requests or self.name in constraint.requests


def _alternative(
    name: str,
    base: str,
    spec: ExactDeviceRequest | DeviceSubRequest,
    classes: Mapping[str, Sequence[str]] | None,
) -> ClaimRequest:
    selectors = [s.cel.expression for s in spec.selectors or [] if s.cel is not None]
    if classes is not None:
        if spec.device_class_name not in classes:
            raise SearchAbort(f"request {name}: unknown device class {spec.device_class_name!r}")
        selectors = list(classes[spec.device_class_name]) + selectors
    mode = spec.allocation_mode or "ExactCount"
    if mode == "All":
        if spec.count not in (None, 0):
            raise SearchAbort(f"request {name}: count must not be set when allocationMode is All")
        count = 0
    else:
        count = 1 if spec.count is None else spec.count
        if count <= 0:
            raise SearchAbort(f"request {name}: count must be greater than zero")
    capacity = dict(spec.capacity.requests) if spec.capacity is not None else {}
    for cap_name, q in capacity.items():
        if q.sign() < 0:
            raise SearchAbort(f"request {name}: capacity {cap_name} request {q} is negative")
    admin_access = isinstance(spec, ExactDeviceRequest) and bool(spec.admin_access)
    return ClaimRequest(name, base, tuple(selectors), mode == "All", count, capacity, admin_access)


def _check_constraints(claim: ResourceClaim, requests: list[list[ClaimRequest]]) -> None:
    for i, c in enumerate(claim.spec.devices.constraints):
        if (c.match_attribute is None) == (c.distinct_attribute is None):
            raise SearchAbort(
                f"constraint #{i}: exactly one of matchAttribute or distinctAttribute is required"
            )
        for ref in c.requests or []:
            base, _, sub = ref.partition("/")
            alts_for = next((a for a in requests if a and a[0].base == base), None)
            if alts_for is None or (sub and not any(a.name == ref for a in alts_for)):
                raise SearchAbort(f"constraint #{i}: unknown request {ref}")


def expand_requests(
    claim: ResourceClaim, classes: Mapping[str, Sequence[str]] | None
) -> list[list[ClaimRequest]]:
    """The alternatives of each request of ``claim``, in claim order.

    ``classes`` maps DeviceClass names to their CEL selectors (None: ``deviceClassName``
    is not checked). Raises :class:`SearchAbort` for a claim the API server would refuse.
    """
    out: list[list[ClaimRequest]] = []
    names: set[str] = set()
    for request in claim.spec.devices.requests:
        if request.name in names:
            raise SearchAbort(f"request name {request.name} is used twice")
        names.add(request.name)
        if (request.exactly is None) == (not request.first_available):
            raise SearchAbort(f"request {request.name}: exactly one of exactly or firstAvailable is required")
        specs: list[tuple[str, ExactDeviceRequest | DeviceSubRequest]] = (
            [(request.name, request.exactly)]
            if request.exactly is not None
            else [(f"{request.name}/{sub.name}", sub) for sub in request.first_available or []]
        )
        out.append([_alternative(name, request.name, spec, classes) for name, spec in specs])
    _check_constraints(claim, out)
    return out
