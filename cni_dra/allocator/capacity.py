"""KEP-5075 consumable-capacity arithmetic for one device (pure functions).

Source: KEP-5075 "DRA: Consumable Capacity", sections "Capacity request policy" and
"Allocation"; the scheduler's allocator, k8s.io/dynamic-resource-allocation v0.37.x
``structured/internal/incubating/consumable_capacity.go`` (``CmpRequestOverCapacity``,
``calculateConsumedCapacity``, ``roundUpRange``, ``violatesPolicy``, ``useMilli``,
``safeMilliValue``; the ``experimental`` variant is the same, the ``stable`` one has no
consumable capacity). Rules, per capacity of a device:

* not named in the request → consumes ``requestPolicy.default``, or the whole
  ``value`` when there is no default;
* named, no policy → consumes the requested amount as is;
* ``validRange`` → a request below ``min`` consumes ``min`` (exactly); without ``step``
  it consumes the request; with ``step`` it rounds up to ``min + k·step`` in one of two
  arithmetics (below), the result in the step's format;
* ``validValues`` → rounds up to the smallest listed value ≥ the request (exact
  comparison, whatever the gate); a request above all of them stays as is and then
  breaks the policy;
* whatever the rule produced must satisfy the policy: equal to ``default``, or within
  ``max`` and on the step grid (in the same arithmetic), or one of ``validValues``;
* fits when already consumed + this amount ≤ ``value`` (equality fits);
* a request naming a capacity the device lacks → that device does not fit.

**The two arithmetics of a stepped ``validRange``** depend on the cluster's
``DRAFractionalCapacityRange`` feature gate (k8s.io/kubernetes v1.37
``pkg/features/kube_features.go``: beta in 1.37, off by default, on by default only
when the control plane runs with ``--min-compatibility-version`` 1.37 or later), which
the callers pass in as ``fractional_capacity_range``:

* gate off (and on, when any of ``min``/``max``/``step`` has no exact milli value or
  ``step`` is below ``1m``): whole units, every value read with apimachinery's
  ``Quantity.Value()``, which rounds *up* to an integer: ``min`` 0.5 step 0.25 is read
  as min 1 step 1, so a request of 1.2 consumes 2 while a request of 0.3 (below ``min``)
  consumes 0.5. A request above 2⁶³−1, or a rounded value past it, cannot be computed;
* gate on: milli-units: every value must have an exact milli value (``1.0005`` has none),
  else the request cannot be computed; min 0.5 step 0.25 takes 0.75, 1, 1.25, ...

A request that cannot be computed (:class:`RequestNotRepresentable`, code 7) is not a
device that does not fit: upstream aborts the whole allocation there, so nothing else
is tried. A negative consumed amount (a negative default or value stored before
stricter validation) aborts the same way. Both are raised by :func:`device_consumption`
for the first device that meets them; the whole-claim search turns that into a failed
claim.

Capacity names in a claim's requests are looked up as they are, as the scheduler does
(a request for ``<driver>/bandwidth`` does not name a device's ``bandwidth``); the
plugin's own standalone requests (the conflist's ``capacity``) may be short
(``bandwidth``) or qualified with the device's driver, and match either spelling.
All arithmetic is exact (:class:`~cni_dra.quantity.Quantity`, integer nano-units).

Dedicated devices (no ``allowMultipleAllocations``) take one allocation at a time: a
capacity request only filters (``value ≥ request``) and the allocation is recorded as
consuming every capacity's whole ``value``; the API result for them carries neither
``consumedCapacity`` nor ``shareID``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from cni_dra.dra.objects import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    Device,
    DeviceCapacity,
    split_qualified_name,
)
from cni_dra.errors import InvalidConfigError
from cni_dra.quantity import Quantity

__all__ = [
    "NoFit",
    "RequestNotRepresentable",
    "uses_milli",
    "consumed_amount",
    "resolve_capacity_name",
    "resolve_capacity_key",
    "device_consumption",
    "remaining",
    "check_fits",
    "dedicated_in_use",
]

_ZERO = Quantity.ZERO


@dataclass(frozen=True)
class NoFit:
    """No device fits. ``reasons`` maps device name → human-readable reason.

    ``str(nofit)`` reads ``eth-a: remaining bandwidth 3G < 8G; eth-b: ...``.
    """

    reasons: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.reasons:
            return "no devices"
        return "; ".join(f"{name}: {why}" for name, why in sorted(self.reasons.items()))


class RequestNotRepresentable(InvalidConfigError):
    """A capacity request the device's range arithmetic cannot compute (see the module
    docstring): the scheduler aborts the allocation instead of trying another device.
    Code 7."""


_MAX_INT64 = 2**63 - 1
_NANOS_PER_MILLI = 10**6


def _milli(q: Quantity) -> int | None:
    """``q`` in milli-units when that is exact and fits an int64 (upstream
    ``safeMilliValue``), else None."""
    if q.nanos % _NANOS_PER_MILLI:
        return None
    milli = q.nanos // _NANOS_PER_MILLI
    return milli if -_MAX_INT64 - 1 <= milli <= _MAX_INT64 else None


def _whole(q: Quantity) -> int:
    """apimachinery ``Quantity.Value()``: the value rounded up (away from zero) to an integer."""
    return q.value()


def uses_milli(rng: CapacityRequestPolicyRange, fractional_capacity_range: bool) -> bool:
    """Whether a stepped ``validRange`` is computed in milli-units (upstream ``useMilli``):
    the gate is on, every bound present has an exact milli value, and ``step`` is at least
    ``1m``. Otherwise whole units (:meth:`Quantity.value`, rounded up) are used."""
    if not fractional_capacity_range:
        return False
    for q in (rng.min, rng.max, rng.step):
        if q is not None and _milli(q) is None:
            return False
    return rng.step is None or (_milli(rng.step) or 0) >= 1


def _round_up_range(
    requested: Quantity, rng: CapacityRequestPolicyRange, fractional_capacity_range: bool
) -> Quantity:
    """Upstream ``roundUpRange``. Raises :class:`RequestNotRepresentable`."""
    if requested < rng.min:
        return rng.min
    step = rng.step
    if step is None:
        return requested
    if uses_milli(rng, fractional_capacity_range):
        req = _milli(requested)
        if req is None:
            raise RequestNotRepresentable(
                f"request {requested} has no exact milli value (finer than 1m): with DRAFractionalCapacityRange on, "
                f"validRange min {rng.min} step {step} is computed in milli-units and the scheduler refuses such a "
                "request (the whole allocation fails, nothing is rounded)"
            )
        base, unit = _milli(rng.min) or 0, _milli(step) or 1
        k = -(-(req - base) // unit)
        if k > (_MAX_INT64 - base) // unit:
            raise RequestNotRepresentable(
                f"rounding request {requested} up to the next step passes the milli-value range"
            )
        milli = base + k * unit
        if milli % 1000 == 0:
            return Quantity.from_int(milli // 1000, step.format)
        return Quantity.from_nanos(milli * _NANOS_PER_MILLI, step.format)
    if requested.nanos > _MAX_INT64 * 10**9:
        raise RequestNotRepresentable(f"request {requested} exceeds 2^63-1")
    base, unit = _whole(rng.min), _whole(step)
    k = -(-(_whole(requested) - base) // unit)
    if base >= 0 and k > (_MAX_INT64 - base) // unit:
        raise RequestNotRepresentable(f"rounding request {requested} up to the next step passes 2^63-1")
    return Quantity.from_int(base + k * unit, step.format)


def _calculate_consumed(
    capacity: DeviceCapacity, requested: Quantity | None, fractional_capacity_range: bool
) -> Quantity:
    """Upstream ``calculateConsumedCapacity``: what one allocation consumes, before the
    policy check. Raises :class:`RequestNotRepresentable`."""
    policy = capacity.request_policy
    if requested is None:
        return policy.default if policy is not None and policy.default is not None else capacity.value
    if policy is None:
        return requested
    if policy.valid_range is not None:
        return _round_up_range(requested, policy.valid_range, fractional_capacity_range)
    if policy.valid_values is not None:
        return next((v for v in policy.valid_values if requested <= v), requested)
    return requested


def _policy_violation(
    name: str, amount: Quantity, policy: CapacityRequestPolicy | None, fractional_capacity_range: bool
) -> str | None:
    """Why ``amount`` breaks ``policy`` (upstream ``violatesPolicy``), or None."""
    if policy is None:
        return None
    if policy.default is not None and amount == policy.default:
        return None
    rng = policy.valid_range
    if rng is not None:
        if rng.max is not None and amount > rng.max:
            return f"{name} {amount} above validRange max {rng.max}"
        if rng.step is not None:
            if uses_milli(rng, fractional_capacity_range):
                got, base, unit = _milli(amount), _milli(rng.min) or 0, _milli(rng.step) or 1
                if got is None:
                    return f"{name} {amount} has no exact milli value"
                arithmetic = "milli-units"
            else:
                got, base, unit = _whole(amount), _whole(rng.min), _whole(rng.step)
                arithmetic = "whole units"
            if (got - base) % unit:
                return f"{name} {amount} not on validRange grid min {rng.min} + k·{rng.step} ({arithmetic})"
        return None
    if policy.valid_values and amount not in policy.valid_values:
        largest = max(policy.valid_values)
        if amount > largest:
            return f"{name} {amount} above the largest validValue {largest}"
        return f"{name} {amount} not one of validValues [{', '.join(map(str, policy.valid_values))}]"
    return None


def consumed_amount(
    capacity: DeviceCapacity, requested: Quantity | None, *, fractional_capacity_range: bool = False
) -> Quantity | None:
    """The amount of ``capacity`` one allocation consumes for ``requested`` (KEP-5075).

    ``requested`` is None when the request does not name this capacity;
    ``fractional_capacity_range`` is the cluster's ``DRAFractionalCapacityRange`` gate
    (see the module docstring; off, the Kubernetes 1.37 default, unless said). Returns
    None when the policy forbids the amount (above ``validRange.max``, above every
    ``validValues`` entry, off the grid). Does not look at what is already consumed.
    Raises :class:`RequestNotRepresentable` (7) when the request cannot be computed or
    the amount is negative.
    """
    amount = _calculate_or_abort(capacity, requested, "capacity", fractional_capacity_range)
    if _policy_violation("capacity", amount, capacity.request_policy, fractional_capacity_range) is not None:
        return None
    return amount


def resolve_capacity_name(device: Device, name: str, driver: str = "") -> str | None:
    """The key in ``device.capacity`` that request name ``name`` refers to, or None.

    An exact key wins; a short name also matches ``<driver>/name`` and a name
    qualified with ``driver`` also matches the short key (upstream
    ``resolveCapacityName``). A name qualified with another domain matches only itself.
    """
    return resolve_capacity_key(device.capacity, name, driver)


def resolve_capacity_key(keys: Collection[str], name: str, driver: str = "") -> str | None:
    """The one of capacity keys ``keys`` (a device's, or an allocation's consumedCapacity)
    that name ``name`` refers to, or None; the rule of :func:`resolve_capacity_name`."""
    if name in keys:
        return name
    domain, ident = split_qualified_name(name)
    if domain is None:
        qualified = f"{driver}/{ident}"
        return qualified if driver and qualified in keys else None
    if domain == driver and ident in keys:
        return ident
    return None


def device_consumption(
    device: Device,
    requests: Mapping[str, Quantity],
    driver: str = "",
    *,
    fractional_capacity_range: bool = False,
    exact_names: bool = False,
) -> dict[str, Quantity] | NoFit:
    """What one allocation of ``requests`` consumes on ``device``: every capacity.

    ``requests`` maps capacity name (short or ``<driver>/name``) → requested quantity;
    ``fractional_capacity_range`` is the cluster's ``DRAFractionalCapacityRange`` gate
    (module docstring). Returns ``{device capacity key: consumed quantity}`` for EVERY
    capacity of the device, or :class:`NoFit` (keyed by the device name) when a
    requested capacity is missing or a policy forbids the amount. Dedicated devices
    consume every capacity's whole value, provided each requested capacity is ≥ the
    request. Raises :class:`RequestNotRepresentable` (7) as upstream aborts: every
    capacity's amount is computed before any policy is checked, so the outcome does
    not depend on the order of the capacities. ``exact_names``: a request's capacity name
    must be the device's key as it is (the scheduler's rule for claims:
    ``requestsContainNonExistCapacity`` looks names up as they are, so
    ``<driver>/bandwidth`` does not name a device's ``bandwidth``); otherwise short and
    qualified names match either spelling (:func:`resolve_capacity_name`).
    """
    resolved: dict[str, Quantity] = {}
    for req_name, qty in requests.items():
        if exact_names:
            key: str | None = req_name if req_name in device.capacity else None
        else:
            key = resolve_capacity_name(device, req_name, driver)
        if key is None:
            return NoFit({device.name: f"no capacity {req_name}"})
        if key in resolved:
            return NoFit({device.name: f"capacity {key} requested twice (as {req_name})"})
        resolved[key] = qty
    out: dict[str, Quantity] = {}
    if not device.shared:
        for key, cap in device.capacity.items():
            if key in resolved and cap.value < resolved[key]:
                return NoFit({device.name: f"capacity {key} {cap.value} < {resolved[key]} requested"})
            out[key] = cap.value
        return out
    amounts = {
        key: _calculate_or_abort(cap, resolved.get(key), key, fractional_capacity_range)
        for key, cap in device.capacity.items()
    }
    for key, cap in device.capacity.items():
        why = _policy_violation(key, amounts[key], cap.request_policy, fractional_capacity_range)
        if why is not None:
            return NoFit({device.name: why})
        out[key] = amounts[key]
    return out


def _calculate_or_abort(
    capacity: DeviceCapacity, requested: Quantity | None, name: str, fractional_capacity_range: bool
) -> Quantity:
    """:func:`_calculate_consumed`, naming the capacity; a negative amount aborts too."""
    try:
        amount = _calculate_consumed(capacity, requested, fractional_capacity_range)
    except RequestNotRepresentable as exc:
        raise RequestNotRepresentable(f"capacity {name}: {exc.msg}") from None
    if amount.sign() < 0:
        raise RequestNotRepresentable(f"capacity {name}: consumed amount {amount} is negative")
    return amount


def remaining(device: Device, consumed: Mapping[str, Quantity]) -> dict[str, Quantity]:
    """``value - consumed`` for every capacity of ``device`` (consumed: key → amount)."""
    return {key: cap.value - consumed.get(key, _ZERO) for key, cap in device.capacity.items()}


def dedicated_in_use(device: Device, consumed_on_node: Mapping[str, Quantity] | None) -> bool:
    """A dedicated device is in use when the node's usage holds any entry for it."""
    return not device.shared and consumed_on_node is not None and len(consumed_on_node) > 0


def check_fits(
    device: Device, consumed_on_node: Mapping[str, Quantity], consumption: Mapping[str, Quantity]
) -> str | None:
    """None when ``consumption`` fits on ``device`` next to ``consumed_on_node``, else why.

    Used to verify a claim's recorded ``consumedCapacity``: each named capacity must
    exist and ``already + amount ≤ value`` (KEP-5075 "Allocation"). A dedicated device
    fits only when nothing is consumed on it yet.
    """
    if dedicated_in_use(device, consumed_on_node):
        return "dedicated device already allocated"
    for key, amount in sorted(consumption.items()):
        cap = device.capacity.get(key)
        if cap is None:
            return f"no capacity {key}"
        already = consumed_on_node.get(key, _ZERO)
        if already + amount > cap.value:
            return f"remaining {key} {cap.value - already} < {amount}"
    return None
