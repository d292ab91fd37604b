"""The API server's requestPolicy rules with the DRAFractionalCapacityRange gate off and on,
and the inventory's rule: refused only when both readings refuse.

Expected values worked by hand from k8s.io/kubernetes v1.37
``pkg/apis/resource/validation/validation.go``: gate off, validValues are unique as
``Quantity.Value()`` (rounded up) and a stepped range's default and max are checked on
the grid of ``Value()``; gate on, validValues unique exactly and, when a bound or the
default is fractional, the grid in milli-units, every one of them with an exact milli value.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.dra.objects import CapacityRequestPolicy
from cni_dra.dra.request_policy import inventory_policy_problems, policy_problems
from cni_dra.quantity import Quantity

OK: list[str] = []


def problems(value: str, policy: dict[str, Any], gate: bool) -> list[str]:
    return policy_problems(
        Quantity.parse(value), CapacityRequestPolicy.model_validate(policy), fractional_capacity_range=gate
    )


def rng(mn: str, default: str, step: str | None = None, mx: str | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"min": mn}
    if step:
        r["step"] = step
    if mx:
        r["max"] = mx
    return {"default": default, "validRange": r}


# (id, value, policy, a needle of the gate-off refusal or None, same with the gate on)
CASES: list[tuple[str, str, dict[str, Any], str | None, str | None]] = [
    (
        "values-equal-as-whole-numbers",
        "4",
        {"default": "1", "validValues": ["500m", "1"]},
        "1 is listed twice (as whole numbers 500m and 1 are both 1)",
        None,
    ),
    (
        "values-repeated",
        "4",
        {"default": "1", "validValues": ["500m", "500m"]},
        "listed twice",
        "listed twice",
    ),
    (
        "values-fractional-distinct",
        "4",
        {"default": "1500m", "validValues": ["500m", "1500m", "3"]},
        None,
        None,
    ),
    (
        "values-round-up-onto-a-listed-one",
        "4",
        {"default": "2", "validValues": ["1500m", "2"]},
        "2 is listed twice (as whole numbers 1500m and 2 are both 2)",
        None,
    ),
    (
        "default-off-the-milli-grid",
        "8",
        rng("500m", "700m", "500m"),
        None,
        "default: 700m is not min 500m + a multiple of step 500m (in milli-units)",
    ),
    (
        "max-off-the-whole-grid",
        "8",
        rng("1", "2500m", "1500m", "4"),
        "validRange.max: 4 is not min 1 + a multiple of step 1500m (in whole numbers)",
        None,
    ),
    (
        "sub-milli-min",
        "8",
        rng("500u", "500u"),
        None,
        "validRange.min: 500u cannot be represented as a milli value",
    ),
    (
        "fractional-default-whole-range",
        "8",
        rng("1", "2500m", "1"),
        None,
        "default: 2500m is not min 1 + a multiple of step 1 (in milli-units)",
    ),
    (
        "fractional-default-step-2",
        "8",
        rng("0", "1500m", "2"),
        None,
        "default: 1500m is not min 0 + a multiple of step 2",
    ),
    (
        "whole-default-off-grid",
        "8",
        rng("1", "2", "2"),
        "default: 2 is not min 1 + a multiple of step 2",
        "default: 2 is not min 1 + a multiple of step 2",
    ),
    ("quarter-steps", "8", rng("500m", "750m", "250m", "4"), None, None),
    ("step-zero", "8", rng("1", "1", "0"), "step: 0 must be positive", "step: 0 must be positive"),
    ("one-step-past-the-value", "2", rng("1500m", "1500m", "1"), "one step 2500m", "one step 2500m"),
    # whole bounds: no milli-units, so the 64-bit bound holds with the gate on too
    (
        "above-int64-whole",
        "10E18",
        rng("0", "0", "2", "10E18"),
        "must be a whole number from 0 to 2^63-1",
        "must be a whole number from 0 to 2^63-1",
    ),
]


@pytest.mark.parametrize(("value", "policy", "off", "on"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_policy_rules_by_the_gate(
    value: str, policy: dict[str, Any], off: str | None, on: str | None
) -> None:
    for gate, needle in ((False, off), (True, on)):
        got = problems(value, policy, gate)
        if needle is None:
            assert got == OK, f"gate {gate}"
        else:
            assert any(needle in p for p in got), f"gate {gate}: {got}"
    inventory = inventory_policy_problems(Quantity.parse(value), CapacityRequestPolicy.model_validate(policy))
    assert (inventory != OK) is (off is not None and on is not None)


@given(st.integers(0, 20), st.integers(1, 10), st.integers(0, 30), st.integers(0, 40), st.booleans())
def test_whole_numbers_read_alike_with_either_gate(
    mn: int, step: int, default: int, mx: int, with_max: bool
) -> None:
    policy = rng(str(mn), str(default), str(step), str(mx) if with_max else None)
    assert problems("100", policy, False) == problems("100", policy, True)
