"""The API server's rules for a capacity's ``requestPolicy`` (KEP-5075), in both readings of
the ``DRAFractionalCapacityRange`` feature gate.

Source: k8s.io/kubernetes v1.37 ``pkg/apis/resource/validation/validation.go``
(``validateRequestPolicy``, ``validateRequestPolicyValidValues``,
``validateRequestPolicyRange``, ``validateRequestPolicyRangeStep``, ``quantityKeyInt``,
``quantityKeyAsDec``). The gate changes two rules, and the API server refuses a slice
for them (it drops nothing):

* ``validValues`` must be unique: with the gate off compared as whole numbers
  (``Quantity.Value()``, rounded up), so ``[0.5, 1]`` repeats ``1``; with it on, exactly;
* a stepped ``validRange``'s ``default`` and ``max`` must be ``min + k·step``: with the gate
  off in whole numbers (``Value()``), and every bound at most 2⁶³−1 and not negative; with
  it on, in milli-units when a bound or the default is fractional, and then every one of
  them must have an exact milli value.

:func:`policy_problems` gives a policy's problems under one reading of the gate;
:func:`inventory_policy_problems` the ones cni-dra refuses an inventory for: those of
both readings, since a node's inventory must not be refused where the cluster's API
server would take it, whichever way its gate is set (the API server has the last word
when the agent publishes). Other rules (required fields, ordering, bounds against the
capacity's value) do not depend on the gate.
"""

from __future__ import annotations

from cni_dra.dra.objects import CapacityRequestPolicy, CapacityRequestPolicyRange
from cni_dra.quantity import Quantity

__all__ = ["MAX_VALID_VALUES", "policy_problems", "inventory_policy_problems"]

MAX_VALID_VALUES = 10
"""``CapacityRequestPolicyDiscreteMaxOptions``."""

_MAX_INT64 = 2**63 - 1
_NANOS_PER_MILLI = 10**6


def _fractional(q: Quantity) -> bool:
    return q.nanos % 10**9 != 0


def _milli_exact(q: Quantity) -> bool:
    return q.nanos % _NANOS_PER_MILLI == 0 and abs(q.nanos // _NANOS_PER_MILLI) <= _MAX_INT64


def _unit(q: Quantity, milli: bool) -> int:
    """``MilliValue()`` or ``Value()``: the grid's arithmetic (both round up)."""
    return q.milli_value() if milli else q.value()


def _values_problems(
    default: Quantity, value: Quantity, values: list[Quantity], fractional: bool
) -> list[str]:
    out: list[str] = []
    if len(values) > MAX_VALID_VALUES:
        return [f"requestPolicy.validValues: {len(values)} values, at most {MAX_VALID_VALUES} allowed"]
    for a, b in zip(values, values[1:], strict=False):
        if b < a:
            out.append(f"requestPolicy.validValues: {b} after {a}: values must be in ascending order")
    seen: dict[object, Quantity] = {}
    for v in values:
        if v > value:
            out.append(f"requestPolicy.validValues: {v} is larger than the capacity value {value}")
        key: object = v.nanos if fractional else v.value()
        if key in seen:
            how = "" if fractional else f" (as whole numbers {seen[key]} and {v} are both {key})"
            out.append(f"requestPolicy.validValues: {v} is listed twice{how}")
        else:
            seen[key] = v
    if default not in values:
        out.append(f"requestPolicy.default: {default} is not one of validValues")
    return out


def _range_problems(
    default: Quantity, value: Quantity, rng: CapacityRequestPolicyRange, fractional: bool
) -> list[str]:
    mn, mx, step = rng.min, rng.max, rng.step
    out: list[str] = []
    if mn > value:
        out.append(f"requestPolicy.validRange.min: {mn} is larger than the capacity value {value}")
    if default < mn:
        out.append(f"requestPolicy.default: {default} is less than validRange.min {mn}")
    if mx is not None:
        if mn > mx:
            out.append(f"requestPolicy.validRange.max: {mx} is less than min {mn}")
        if mx > value:
            out.append(f"requestPolicy.validRange.max: {mx} is larger than the capacity value {value}")
        if default > mx:
            out.append(f"requestPolicy.default: {default} is more than validRange.max {mx}")
    named = [("default", default), ("validRange.min", mn), ("validRange.max", mx), ("validRange.step", step)]
    milli = fractional and any(q is not None and _fractional(q) for q in (default, mn, mx, step))
    if milli:
        bad = [
            f"requestPolicy.{n}: {q} cannot be represented as a milli value"
            for n, q in named
            if q is not None and not _milli_exact(q)
        ]
        if bad:
            return out + bad
    if step is None:
        return out
    if step.sign() <= 0:
        return out + [f"requestPolicy.validRange.step: {step} must be positive"]
    if mn + step > value:
        out.append(
            f"requestPolicy.validRange.step: one step {mn + step} (min + step) is larger than the capacity value {value}"
        )
    if not milli:
        bad = [
            f"requestPolicy.{n}: {q} must be a whole number from 0 to 2^63-1 here"
            for n, q in named
            if q is not None and (q.sign() < 0 or q.nanos > _MAX_INT64 * 10**9)
        ]
        if bad:
            return out + bad
    arithmetic = "milli-units" if milli else "whole numbers"
    for name, q in (("default", default), ("validRange.max", mx)):
        if q is not None and (_unit(q, milli) - _unit(mn, milli)) % _unit(step, milli):
            out.append(
                f"requestPolicy.{name}: {q} is not min {mn} + a multiple of step {step} (in {arithmetic})"
            )
    return out


def policy_problems(
    value: Quantity, policy: CapacityRequestPolicy, *, fractional_capacity_range: bool
) -> list[str]:
    """What the API server refuses in ``policy`` of a capacity of ``value``, its
    ``DRAFractionalCapacityRange`` gate being ``fractional_capacity_range``; each problem as
    ``"requestPolicy.<field>: <rule>"``."""
    values, rng, default = policy.valid_values, policy.valid_range, policy.default
    if values and rng is not None:
        return ["requestPolicy: validValues and validRange are mutually exclusive"]
    if values:
        if default is None:
            return ["requestPolicy.default: required when validValues is set"]
        return _values_problems(default, value, list(values), fractional_capacity_range)
    if rng is not None:
        if default is None:
            return ["requestPolicy.default: required when validRange is set"]
        return _range_problems(default, value, rng, fractional_capacity_range)
    return []


def inventory_policy_problems(value: Quantity, policy: CapacityRequestPolicy) -> list[str]:
    """The problems cni-dra refuses an inventory for: ``policy`` breaks the API server's rules
    with the gate off and with it on (the messages of the gate-off reading); [] when either
    reading takes it."""
    off = policy_problems(value, policy, fractional_capacity_range=False)
    if not off or not policy_problems(value, policy, fractional_capacity_range=True):
        return []
    return off
