"""KEP-5075 consumable-capacity arithmetic for one device (pure functions).

Source: KEP-5075 "DRA: Consumable Capacity", sections "Capacity request policy" and
"Allocation"; the upstream allocator (k8s.io/dynamic-resource-allocation
``structured``, consumable capacity: ``calculateConsumedCapacity``,
``violatesPolicy``, ``cmpRequestOverCapacity``). Rules, per capacity of a device:

* not named in the request → consumes ``requestPolicy.default``, or the whole
  ``value`` when there is no default;
* named, no policy → consumes the requested amount as is;
* ``validRange`` → a request below ``min`` consumes ``min``; with ``step`` it rounds
  up to ``min + k·step`` (the result takes the step's format, as upstream's
  ``NewQuantity(…, step.Format)``); a result above ``max`` does not fit;
* ``validValues`` → rounds up to the smallest listed value ≥ the request; a request
  above all of them does not fit;
* whatever the rule produced must satisfy the policy (equal to ``default``, or
  within ``max`` and on the step grid, or one of ``validValues``), else no fit;
* fits when already consumed + this amount ≤ ``value`` (equality fits);
* a request naming a capacity the device lacks → that device does not fit.

Capacity names in requests may be short (``bandwidth``) or qualified with the
device's driver (``<driver>/bandwidth``); both match either spelling on the device.
All arithmetic is exact (:class:`~cni_dra.quantity.Quantity`, integer nano-units).

Dedicated devices (no ``allowMultipleAllocations``) take one allocation at a time: a
capacity request only filters (``value ≥ request``) and the allocation is recorded as
consuming every capacity's whole ``value``; the API result for them carries neither
``consumedCapacity`` nor ``shareID``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from cni_dra.dra.models import CapacityRequestPolicy, Device, DeviceCapacity, split_qualified_name
from cni_dra.quantity import Quantity

__all__ = [
    "NoFit",
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


def _on_grid(amount: Quantity, minimum: Quantity, step: Quantity) -> bool:
    return (amount.nanos - minimum.nanos) % step.nanos == 0


def _policy_violation(name: str, amount: Quantity, policy: CapacityRequestPolicy | None) -> str | None:
    """Why ``amount`` breaks ``policy`` (upstream ``violatesPolicy``), or None."""
    if amount.sign() < 0:
        return f"{name} amount {amount} is negative"
    if policy is None:
        return None
    if policy.default is not None and amount == policy.default:
        return None
    rng = policy.valid_range
    if rng is not None:
        if rng.max is not None and amount > rng.max:
            return f"{name} {amount} above validRange max {rng.max}"
        if rng.step is not None and rng.step.sign() > 0 and not _on_grid(amount, rng.min, rng.step):
            return f"{name} {amount} not on validRange grid min {rng.min} + k·{rng.step}"
        return None
    if policy.valid_values:
        if amount not in policy.valid_values:
            largest = max(policy.valid_values)
            if amount > largest:
                return f"{name} {amount} above the largest validValue {largest}"
            return f"{name} {amount} not one of validValues [{', '.join(map(str, policy.valid_values))}]"
    return None


def _consumed_amount_and_why(
    capacity: DeviceCapacity, requested: Quantity | None, name: str = "capacity"
) -> tuple[Quantity | None, str]:
    """Like :func:`consumed_amount`, also returning why it is None (``""`` otherwise)."""
    policy = capacity.request_policy
    amount: Quantity
    if requested is None:
        amount = policy.default if policy is not None and policy.default is not None else capacity.value
    elif policy is None:
        amount = requested
    elif policy.valid_range is not None:
        rng = policy.valid_range
        if requested < rng.min:
            amount = rng.min
        elif rng.step is None or rng.step.sign() <= 0:
            amount = requested
        else:
            step = rng.step.nanos
            k = -(-(requested.nanos - rng.min.nanos) // step)
            amount = Quantity.from_nanos(rng.min.nanos + k * step, rng.step.format)
    elif policy.valid_values:
        amount = next((v for v in policy.valid_values if requested <= v), requested)
    else:
        amount = requested
    why = _policy_violation(name, amount, policy)
    if why is not None:
        return None, why
    return amount, ""


def consumed_amount(capacity: DeviceCapacity, requested: Quantity | None) -> Quantity | None:
    """The amount of ``capacity`` one allocation consumes for ``requested`` (KEP-5075).

    ``requested`` is None when the request does not name this capacity. Returns None
    when the policy forbids the request (above ``validRange.max``, above every
    ``validValues`` entry, off the grid). Does not look at what is already consumed.
    """
    return _consumed_amount_and_why(capacity, requested)[0]


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
    device: Device, requests: Mapping[str, Quantity], driver: str = ""
) -> dict[str, Quantity] | NoFit:
    """What one allocation of ``requests`` consumes on ``device``: every capacity.

    ``requests`` maps capacity name (short or ``<driver>/name``) → requested quantity.
    Returns ``{device capacity key: consumed quantity}`` for EVERY capacity of the
    device, or :class:`NoFit` (keyed by the device name) when a requested capacity is
    missing or a policy forbids the amount. Dedicated devices consume every capacity's
    whole value, provided each requested capacity is ≥ the request.
    """
    resolved: dict[str, Quantity] = {}
    for req_name, qty in requests.items():
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
    for key, cap in device.capacity.items():
        amount, why = _consumed_amount_and_why(cap, resolved.get(key), key)
        if amount is None:
            return NoFit({device.name: why})
        out[key] = amount
    return out


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
