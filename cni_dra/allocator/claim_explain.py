"""Why a claim does not fit: the diagnosis behind :class:`~cni_dra.allocator.claim_allocator.ClaimNoFit`.

Run only when the search failed. Each request is first tried on its own against the
node's usage (alternatives in order): one that does not fit gets each device's rejection
(selectors, in use, capacity) plus, when every device would take one allocation, what
stops the request as a whole (count, results limit, a constraint). When every request
fits alone, a minimal set of requests that fails together is found by deletion, then a
minimal set of constraints under which that set still fails; the ``claim`` entry names
them, or, when the set fails without constraints, the shared capacity or dedicated
devices they compete for. Pure, like the search: each probe is a fresh bounded
:class:`~cni_dra.allocator.claim_search.ClaimSearch`.
"""

from __future__ import annotations

from collections.abc import Sequence

from cni_dra.allocator.claim_requests import MAX_RESULTS, ClaimRequest, SearchAbort
from cni_dra.allocator.claim_search import ClaimProblem, ClaimSearch
from cni_dra.dra.objects import Device, DeviceAttribute, lookup_device_attribute
from cni_dra.quantity import Quantity

__all__ = ["explain_no_fit"]

_ZERO = Quantity.ZERO


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
    """The probes of one diagnosis over ``problem`` (see the module's docstring)."""

    def __init__(
        self, problem: ClaimProblem, requests: list[list[ClaimRequest]], cache: dict[tuple[str, str], bool]
    ) -> None:
        self.problem = problem
        self.usage = problem.usage
        self.requests = [alts for alts in requests if alts]
        self.cache = cache
        self.constraints = list(problem.claim.spec.devices.constraints)
        self.driver = problem.slice_.spec.driver
        self.probe = ClaimSearch(problem, selectable_cache=cache)
        self.devices = self.probe.devices

    def fits(self, requests: list[list[ClaimRequest]], constraint_idx: Sequence[int]) -> bool:
        search = ClaimSearch(self.problem, [self.constraints[i] for i in constraint_idx], self.cache)
        return search.solve(requests, 0)

    def device_reasons(self, req: ClaimRequest) -> dict[str, str]:
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

    def minimal_constraints(self, requests: list[list[ClaimRequest]]) -> list[int]:
        keep = list(range(len(self.constraints)))
        for i in list(keep):
            trial = [k for k in keep if k != i]
            if not self.fits(requests, trial):
                keep = trial
        return keep

    def describe_constraints(self, idx: Sequence[int], reqs: Sequence[ClaimRequest]) -> str:
        parts = []
        for i in idx:
            c = self.constraints[i]
            kind = "matchAttribute" if c.match_attribute is not None else "distinctAttribute"
            attr = c.match_attribute or c.distinct_attribute or ""
            per_req = []
            for req in reqs:
                if not req.covered_by(c):
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

    def _results_needed(self, req: ClaimRequest) -> int:
        return len(self.probe.all_devices(req)) if req.all_mode else req.count

    def sharing_conflicts(self, reqs: Sequence[ClaimRequest]) -> list[str]:
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
                msgs.append(
                    f"{d.name} is dedicated (one allocation at a time): {_names([u.name for u in users])} compete for it"
                )
                continue
            msgs.extend(self._capacity_conflicts(d, users))
        return msgs

    def _capacity_conflicts(self, d: Device, users: Sequence[ClaimRequest]) -> list[str]:
        """The capacities of shared device ``d`` that ``users`` together overrun."""
        msgs = []
        node = self.usage.consumed_on(d.name)
        cons = [(u, self.probe.device_consumption(u, d)) for u in users]
        for key in sorted(d.capacity):
            amounts = [(u, c.get(key, _ZERO)) for u, c in cons if isinstance(c, dict)]
            total = node.get(key, _ZERO)
            for _, a in amounts:
                total = total + a
            value = d.capacity[key].value
            if total > value:
                terms = [f"{node[key]} in use"] if not node.get(key, _ZERO).is_zero() else []
                terms += [f"{u.name} {a}" for u, a in amounts]
                msgs.append(f"combined {key} {total} > {value} on {d.name} ({' + '.join(terms)})")
        return msgs

    def describe_sharing(self, reqs: Sequence[ClaimRequest]) -> str:
        msgs = self.sharing_conflicts(reqs)
        if not msgs:
            rejected = {r.name: self.device_reasons(r) for r in reqs}
            cands = "; ".join(
                f"{r.name} on {', '.join(d.name for d in self.devices if d.name not in rejected[r.name]) or 'no device'}"
                for r in reqs
            )
            msgs.append(f"the devices cannot serve them all at once ({cands})")
        return " / ".join(msgs)

    def solo_failure(self, req: ClaimRequest) -> str:
        per = self.device_reasons(req)
        parts = [f"{n}: {w}" for n, w in sorted(per.items())]
        fitting = [d for d in self.devices if d.name not in per]
        matching = self.probe.all_devices(req) if req.all_mode else []
        if not self.devices:
            parts.append("no devices")
        elif req.all_mode and not matching:
            parts.append(
                "allocationMode All needs at least one matching device"
                + (" that has the requested capacity" if req.capacity else "")
            )
        elif fitting and (not req.all_mode or len(fitting) == len(matching)):
            # Every device it needs takes one allocation: the request as a whole fails.
            parts.append(self._whole_request_failure(req, fitting))
        return "; ".join(parts) or "no devices"

    def _whole_request_failure(self, req: ClaimRequest, fitting: Sequence[Device]) -> str:
        """Why ``req`` fails although each device it needs takes one allocation of it."""
        needed = self._results_needed(req)
        if needed > MAX_RESULTS:
            return f"needs {needed} results, a claim holds at most {MAX_RESULTS}"
        if self.fits([[req]], []):
            idx = self.minimal_constraints([[req]])
            return "constraint " + self.describe_constraints(idx, [req])
        # One request takes a device once, shared or not: it needs as many devices as results.
        return f"needs {needed} devices, {len(fitting)} available"

    def solo_reasons(self, out: dict[str, str]) -> list[ClaimRequest | None]:
        """Try each request alone (alternatives in order) and write why into ``out``;
        returns the alternative that fits alone per request (None: none does)."""
        everything = list(range(len(self.constraints)))
        solo: list[ClaimRequest | None] = []
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
        return solo

    def combination_reason(self, fitted: Sequence[ClaimRequest]) -> str:
        """Every request fits alone (``fitted``, one per request): which ones fail together, and why."""
        everything = list(range(len(self.constraints)))
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
        head = (
            f"requests {names} fit alone but not together"
            if len(chosen) > 1
            else f"request {names} does not fit"
        )
        return f"{head}: {why}"

    def reasons(self) -> dict[str, str]:
        out: dict[str, str] = {}
        try:
            solo = self.solo_reasons(out)
            fitted = [a for a in solo if a is not None]
            if len(fitted) == len(solo):
                out["claim"] = self.combination_reason(fitted)
        except SearchAbort as exc:
            out["claim"] = (
                "no combination of devices satisfies all requests and constraints together "
                f"(diagnosis stopped: {exc.reason})"
            )
        return out


def explain_no_fit(
    problem: ClaimProblem, requests: list[list[ClaimRequest]], cache: dict[tuple[str, str], bool]
) -> dict[str, str]:
    """Request name (or ``claim``) → why, for a claim whose search over ``problem`` failed.

    ``requests`` are the claim's expanded requests, ``cache`` the failed search's
    selector results (shared by every probe). Raises nothing: a probe that aborts ends
    the diagnosis with a ``claim`` entry saying so.
    """
    return _Explain(problem, requests, cache).reasons()
