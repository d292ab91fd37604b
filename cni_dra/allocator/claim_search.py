"""The depth-first search that places a claim's requests on the node's devices.

Pure and bounded: a :class:`ClaimSearch` tries candidates in the order of the selection
policy, backtracks when a later request or a constraint fails, and stops with
:class:`~cni_dra.allocator.claim_requests.SearchAbort` after ``max_steps`` placements.
The first complete solution is kept in :attr:`ClaimSearch.picks`. The rules it applies
(shared and dedicated devices, consumed capacity, ``matchAttribute``/``distinctAttribute``,
``allocationMode: All``) are described in :mod:`cni_dra.allocator.claim_allocator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cni_dra.allocator.capacity import NoFit, RequestNotRepresentable, device_consumption
from cni_dra.allocator.claim_requests import MAX_RESULTS, ClaimRequest, SearchAbort
from cni_dra.allocator.select import Policy, policy_sort_key, rank_key
from cni_dra.allocator.usage import NodeUsage
from cni_dra.dra.claims import DeviceConstraint, ResourceClaim
from cni_dra.dra.objects import Device, DeviceAttribute, ResourceSlice, lookup_device_attribute
from cni_dra.errors import InvalidConfigError
from cni_dra.quantity import Quantity

__all__ = ["ClaimProblem", "ClaimSearch", "Pick"]

_ZERO = Quantity.ZERO


@dataclass(frozen=True)
class ClaimProblem:
    """What a search (and each probe of a diagnosis) runs against: the claim, the node's
    inventory and usage, the selection policy, the step bound and the cluster's
    ``DRAFractionalCapacityRange`` gate (:mod:`cni_dra.allocator.capacity`)."""

    claim: ResourceClaim
    slice_: ResourceSlice
    usage: NodeUsage
    policy: Policy
    max_steps: int
    fractional_capacity_range: bool = False


@dataclass
class Pick:
    """One placed allocation: ``consumption`` is None for a dedicated device (or admin
    access); ``constraint_idx`` the constraints it added a value to."""

    req: ClaimRequest
    device: Device
    consumption: dict[str, Quantity] | None
    constraint_idx: list[int] = field(default_factory=list)


class ClaimSearch:
    """One bounded search over ``problem`` under ``constraints`` (default: the claim's).

    ``selectable_cache`` (request name, device name) → selectors hold; probes of one
    diagnosis share it, since selectors do not depend on what is placed.
    """

    def __init__(
        self,
        problem: ClaimProblem,
        constraints: Sequence[DeviceConstraint] | None = None,
        selectable_cache: dict[tuple[str, str], bool] | None = None,
    ) -> None:
        self.driver = problem.slice_.spec.driver
        self.devices = sorted(problem.slice_.spec.devices, key=lambda d: d.name)
        self.usage = problem.usage
        self.policy = problem.policy
        self.max_steps = problem.max_steps
        self.fractional = problem.fractional_capacity_range
        self.steps = 0
        self.constraints = list(
            problem.claim.spec.devices.constraints if constraints is None else constraints
        )
        self.constraint_values: list[list[DeviceAttribute]] = [[] for _ in self.constraints]
        self.alloc_consumed: dict[str, dict[str, Quantity]] = {}
        self.alloc_dedicated: set[str] = set()
        self.picks: list[Pick] = []
        self.selectable_cache: dict[tuple[str, str], bool] = (
            {} if selectable_cache is None else selectable_cache
        )
        self._all_devices: dict[str, list[Device]] = {}

    # -- per-device checks ------------------------------------------------------------

    def device_consumption(self, req: ClaimRequest, device: Device) -> dict[str, Quantity] | NoFit:
        """What one allocation of ``req`` consumes on ``device`` (or why it cannot);
        a request the device's range cannot compute stops the search (:class:`SearchAbort`),
        as it aborts the scheduler's allocation."""
        try:
            return device_consumption(
                device, req.capacity, self.driver, fractional_capacity_range=self.fractional, exact_names=True
            )
        except RequestNotRepresentable as exc:
            raise SearchAbort(f"request {req.name}: device {device.name}: {exc.msg}") from exc

    def selectable(self, req: ClaimRequest, device: Device) -> bool:
        key = (req.name, device.name)
        if key not in self.selectable_cache:
            if req.selectors:
                from cni_dra.allocator.cel import device_matches

                try:
                    self.selectable_cache[key] = device_matches(req.selectors, device, self.driver)
                except InvalidConfigError as exc:
                    raise SearchAbort(f"request {req.name}: {exc.msg}") from exc
            else:
                self.selectable_cache[key] = True
        return self.selectable_cache[key]

    def static_misfit(self, req: ClaimRequest, device: Device) -> str | None:
        """Why ``device`` could not serve one allocation of ``req`` even when idle, or None.

        The capacity request read as a filter on the device's totals: a requested
        capacity it lacks, an amount its requestPolicy refuses, or an amount (after
        the policy's rounding) above the capacity's whole value.
        """
        cons = self.device_consumption(req, device)
        if isinstance(cons, NoFit):
            return cons.reasons[device.name]
        for key, amount in sorted(cons.items()):
            value = device.capacity[key].value
            if amount > value:
                return f"capacity {key} {value} < {amount}"
        return None

    def all_devices(self, req: ClaimRequest) -> list[Device]:
        """The devices an ``allocationMode: All`` request must take, in name order.

        Those matching its selectors that pass :meth:`static_misfit`; what is in use
        on them does not matter here (that is checked when each is placed).
        """
        if req.name not in self._all_devices:
            self._all_devices[req.name] = [
                d for d in self.devices if self.selectable(req, d) and self.static_misfit(req, d) is None
            ]
        return self._all_devices[req.name]

    def set_up(self, requests: list[list[ClaimRequest]]) -> None:
        """Pick the devices of every ``allocationMode: All`` request (firstAvailable
        alternatives included), in claim order, before the search: upstream's allocator does
        this while it sets the claim up, so a selector that fails to evaluate or a capacity
        request no device's range can compute there stops the allocation
        (:class:`SearchAbort`) even when an earlier request never fits."""
        for alternatives in requests:
            for req in alternatives:
                if req.all_mode:
                    self.all_devices(req)

    def in_use(self, device: Device, req: ClaimRequest) -> str | None:
        if req.admin_access:
            return None
        if device.name in self.usage.dedicated or device.name in self.alloc_dedicated:
            return "held by a dedicated allocation"
        if not device.shared and (device.name in self.usage.shared or device.name in self.alloc_consumed):
            return "dedicated device holds shared allocations"
        return None

    def consumption(self, req: ClaimRequest, device: Device) -> tuple[dict[str, Quantity] | None, str | None]:
        """(consumption or None for dedicated, reason when it does not fit)."""
        cons = self.device_consumption(req, device)
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

    def constraint_ok(self, req: ClaimRequest, device: Device) -> tuple[bool, list[int]]:
        added: list[int] = []
        for i, c in enumerate(self.constraints):
            if not req.covered_by(c):
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

    def try_place(self, req: ClaimRequest, device: Device, *, must: bool = False) -> bool:
        """Place one allocation of ``req`` on ``device`` if it may go there. ``must`` (a
        device an ``allocationMode: All`` request needs): a constraint it breaks stops the
        search (:class:`SearchAbort`), as upstream's ``allocateDevice(must=true)`` fails the
        allocation with an error; being in use or full only fails the request. The checks
        run in upstream's order: in use, constraints, then capacity."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise SearchAbort(f"search limit of {self.max_steps} steps exceeded")
        if len(self.picks) >= MAX_RESULTS:
            return False
        if self.in_use(device, req) is not None or not self.selectable(req, device):
            return False
        # upstream's allocateDevice order: the constraints before the capacity, so a
        # device an All request needs that breaks a constraint stops the allocation even
        # when it is also full
        ok, added = self.constraint_ok(req, device)
        if not ok:
            if must:
                raise SearchAbort(
                    f"request {req.name}: cannot add device {device.name} because a claim "
                    "constraint would not be satisfied"
                )
            return False
        cons, why = self.consumption(req, device)
        if why is not None:
            for j in added:
                self.constraint_values[j].pop()
            return False
        self.picks.append(Pick(req, device, cons, added))
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

    def ordered(self, req: ClaimRequest) -> list[Device]:
        keyed = []
        for d in self.devices:
            on_node = dict(self.usage.consumed_on(d.name))
            for k, v in self.alloc_consumed.get(d.name, {}).items():
                on_node[k] = on_node.get(k, _ZERO) + v
            key: tuple[int, ...] = ()
            if self.policy != "first-fit":
                try:
                    cons = device_consumption(
                        d,
                        req.capacity,
                        self.driver,
                        fractional_capacity_range=self.fractional,
                        exact_names=True,
                    )
                except RequestNotRepresentable:  # ranking only: placing it will stop the search
                    cons = NoFit()
                key = rank_key(d, on_node, {} if isinstance(cons, NoFit) else cons, req.capacity, self.driver)
            keyed.append((policy_sort_key(self.policy, key, d.name), d))
        keyed.sort(key=lambda kd: kd[0])
        return [d for _, d in keyed]

    def solve(self, requests: list[list[ClaimRequest]], ri: int) -> bool:
        if ri == len(requests):
            return True
        for req in requests[ri]:
            if req.all_mode:
                matching = self.all_devices(req)
                if not matching:
                    continue
                placed = 0
                for d in matching:
                    if not self.try_place(req, d, must=True):
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

    def place_n(
        self,
        requests: list[list[ClaimRequest]],
        ri: int,
        req: ClaimRequest,
        n: int,
        order: list[Device],
        start: int,
    ) -> bool:
        if n == 0:
            return self.solve(requests, ri + 1)
        for idx in range(start, len(order)):
            if self.try_place(req, order[idx]):
                # The request's next device comes after this one: one request never takes a
                # device twice, shared or not (upstream goes on from deviceIndex + 1); other
                # requests may take it again.
                if self.place_n(requests, ri, req, n - 1, order, idx + 1):
                    return True
                self.undo()
        return False
