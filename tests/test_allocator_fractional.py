"""Fractional requestPolicy ranges: rounding and fit with the DRAFractionalCapacityRange gate off and on.

The expected values are the rules as upstream states them, not cni-dra's output:

* the cases of k8s.io/dynamic-resource-allocation v0.37.2
  ``structured/internal/incubating/consumable_capacity_test.go`` (``testCalculateConsumedCapacity``,
  ``testViolateCapacityRequestPolicy``, ``testUseMilli``, ``testSafeMilliValue``,
  ``testCmpRequestOverCapacityFatalBeatsSoft``), named after them;
* cases worked by hand from ``consumable_capacity.go`` (same directory): gate off, every
  bound is read with ``Quantity.Value()`` (rounded up to an integer) and the result is
  ``NewQuantity(min + n·step)``; gate on, milli-units, and a request without an exact milli
  value aborts the allocation (``errCapacityRequestNotRepresentable``).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.allocator import (
    ClaimNoFit,
    NodeUsage,
    RequestNotRepresentable,
    Selection,
    allocate_claim,
    allocate_claims,
    consumed_amount,
    device_consumption,
    select_device,
)
from cni_dra.allocator.capacity import uses_milli
from cni_dra.cli import cli
from cni_dra.dra.claims import AllocationResult, ResourceClaim
from cni_dra.dra.objects import CapacityRequestPolicyRange, Device, DeviceCapacity, ResourceSlice
from cni_dra.quantity import Quantity
from tests.builders import share_ids

Q = Quantity.parse
MAX64 = str(2**63 - 1)
ABORT = "abort"  # the request cannot be computed: the allocation stops
NOFIT = None  # the policy refuses the amount: this device does not fit


def cap(value: str | int, policy: dict[str, Any] | None = None) -> DeviceCapacity:
    raw: dict[str, Any] = {"value": value}
    if policy is not None:
        raw["requestPolicy"] = policy
    return DeviceCapacity.model_validate(raw)


def rng(
    mn: str, step: str | None = None, mx: str | None = None, default: str | None = None
) -> dict[str, Any]:
    r: dict[str, Any] = {"min": mn}
    if step is not None:
        r["step"] = step
    if mx is not None:
        r["max"] = mx
    return {"default": default or mn, "validRange": r}


def outcome(value: str | int, policy: dict[str, Any] | None, requested: str | None, gate: bool) -> str | None:
    try:
        got = consumed_amount(
            cap(value, policy), None if requested is None else Q(requested), fractional_capacity_range=gate
        )
    except RequestNotRepresentable:
        return ABORT
    return None if got is None else str(got)


# -- upstream's own cases ----------------------------------------------------------------------------

# (upstream case name, capacity value, policy, request, gate, expected)
UPSTREAM_CALCULATE: list[tuple[str, str, dict[str, Any] | None, str | None, bool, str | None]] = [
    ("empty", "1", {}, None, False, "1"),
    (
        "request-above-maxint64-is-rejected",
        "18446744073709551619",
        rng("0", "3", default="0"),
        "18446744073709551619",
        False,
        ABORT,
    ),
    (
        "rounded-value-above-maxint64-is-rejected",
        "9223372036854775808",
        rng("0", "2", default="0"),
        MAX64,
        False,
        ABORT,
    ),
    ("max-safe-boundary-rounds-to-maxint64", MAX64, rng("1", "2"), "9223372036854775806", False, MAX64),
    ("min in range", "2", rng("1"), None, False, "1"),
    ("default in set", "2", {"default": "1", "validValues": ["1"]}, None, False, "1"),
    ("more than min in range", "2", rng("1"), "2", False, "2"),
    ("less than min in range", "2", rng("2", default="2"), "1", False, "2"),
    ("with step (round up)", "3", rng("1", "2"), "2", False, "3"),
    ("with step (no remaining)", "2", rng("1", "1"), "2", False, "2"),
    ("fractional step round up (0.25 to 0.3)", "1", rng("200m", "100m", "1"), "250m", True, "300m"),
    (
        "fractional step already aligned (0.4 = min+2*step)",
        "1",
        rng("200m", "100m", "1"),
        "400m",
        True,
        "400m",
    ),
    ("valid value in set", "3", {"default": "1", "validValues": ["1", "2", "3"]}, "2", False, "2"),
    ("set (round up)", "3", {"default": "1", "validValues": ["1", "3"]}, "2", False, "3"),
    # upstream returns 3 from calculateConsumedCapacity; violatesPolicy then refuses it
    ("larger than set", "3", {"default": "1", "validValues": ["1", "2"]}, "3", False, NOFIT),
    (
        "fractional-step-request-not-milli-representable-is-rejected",
        "9224372036854776E3",
        rng("100m", "100m", default="1"),
        "9224372036854776E3",
        True,
        ABORT,
    ),
    (
        "fractional-step-rounded-value-passes-milli-range-is-rejected",
        f"{2**63 - 1}m",
        rng("100m", "100m"),
        f"{2**63 - 2}m",
        True,
        ABORT,
    ),
]


@pytest.mark.parametrize(
    ("value", "policy", "requested", "gate", "expected"),
    [c[1:] for c in UPSTREAM_CALCULATE],
    ids=[c[0] for c in UPSTREAM_CALCULATE],
)
def test_upstream_calculate_consumed_capacity(
    value: str, policy: dict[str, Any] | None, requested: str | None, gate: bool, expected: str | None
) -> None:
    got = outcome(value, policy, requested, gate)
    assert got == expected if expected in (ABORT, None) else got is not None and Q(got) == Q(expected)


# (upstream case name, policy, amount already consumed-to-be, gate, violates)
UPSTREAM_VIOLATES: list[tuple[str, dict[str, Any] | None, str, bool, bool]] = [
    ("no constraint", None, "1", False, False),
    ("less than maximum", rng("1", mx="2"), "1", False, False),
    ("more than maximum", rng("1", mx="1"), "2", False, True),
    ("in set", {"default": "1", "validValues": ["1"]}, "1", False, False),
    ("not in set", {"default": "1", "validValues": ["1"]}, "2", False, True),
    ("fractional step aligned (0.3 = min+1*step)", rng("200m", "100m", "1"), "300m", True, False),
    (
        "fractional step not aligned (0.25 is not a multiple of 0.1 from 0.2)",
        rng("200m", "100m", "1"),
        "250m",
        True,
        True,
    ),
    ("requested value overflows milli representation", rng("1", "1"), "9224372036854776E3", True, True),
]


@pytest.mark.parametrize(
    ("policy", "amount", "gate", "violates"),
    [c[1:] for c in UPSTREAM_VIOLATES],
    ids=[c[0] for c in UPSTREAM_VIOLATES],
)
def test_upstream_violates_policy(
    policy: dict[str, Any] | None, amount: str, gate: bool, violates: bool
) -> None:
    from cni_dra.allocator.capacity import _policy_violation
    from cni_dra.dra.objects import CapacityRequestPolicy

    pol = None if policy is None else CapacityRequestPolicy.model_validate(policy)
    assert (_policy_violation("c", Q(amount), pol, gate) is not None) is violates


# (upstream case name, min, max, step, gate, uses milli)
UPSTREAM_USE_MILLI = [
    ("fractional disabled", "200m", "1", "100m", False, False),
    ("all fractional, fits in milli", "200m", "1", "100m", True, True),
    ("all integer, fits in milli (no hasFractional gate any more)", "1", "3", "1", True, True),
    ("min overflows milli, falls back to integer", "9224372036854776E3", None, "1", True, False),
    ("step too small (sub-milli)", "1", None, "0", True, False),
    # not upstream's: a step with no exact milli value (1.5u) is not usable in milli-units either
    ("step without an exact milli value", "1", None, "1500u", True, False),
]


@pytest.mark.parametrize(
    ("mn", "mx", "step", "gate", "expected"),
    [c[1:] for c in UPSTREAM_USE_MILLI],
    ids=[c[0] for c in UPSTREAM_USE_MILLI],
)
def test_upstream_use_milli(mn: str, mx: str | None, step: str, gate: bool, expected: bool) -> None:
    r = CapacityRequestPolicyRange(min=Q(mn), max=None if mx is None else Q(mx), step=Q(step))
    assert uses_milli(r, gate) is expected


def test_upstream_fatal_beats_soft() -> None:
    # testCmpRequestOverCapacityFatalBeatsSoft: a request over one capacity's value (soft)
    # and an unrepresentable one on another: the allocation aborts, whatever the order
    for names in itertools.permutations(["capacity-0", "capacity-1"]):
        caps = {
            "capacity-0": {"value": "1"},
            "capacity-1": {
                "value": "9223372036854775808",
                "requestPolicy": {"validRange": {"min": "0", "step": "2"}},
            },
        }
        device = Device.model_validate(
            {"name": "d", "allowMultipleAllocations": True, "capacity": {n: caps[n] for n in names}}
        )
        with pytest.raises(RequestNotRepresentable, match="capacity-1"):
            device_consumption(device, {"capacity-0": Q("2"), "capacity-1": Q(MAX64)})


# -- the gate off and on, worked by hand from consumable_capacity.go ------------------------------

QUARTER = rng("500m", "250m", "4")  # min 0.5, step 0.25, max 4; off: min 1, step 1 (Value() rounds up)
ONE_AND_HALF = rng("1", "1500m", "7")  # off: step 2
MIN_100M = rng("100M", "100M")  # whole bounds, the e2e NICs' policy

# (id, value, policy, request, expected with the gate off, expected with it on)
GATED: list[tuple[str, str, dict[str, Any], str | None, str | None, str | None]] = [
    ("below-min-is-min-exactly", "8", QUARTER, "300m", "500m", "500m"),
    ("far-below-min-is-min-even-sub-milli", "8", QUARTER, "500u", "500m", "500m"),
    ("at-fractional-min", "8", QUARTER, "500m", "1", "500m"),
    ("between-steps", "8", QUARTER, "600m", "1", "750m"),
    ("above-one", "8", QUARTER, "1200m", "2", "1250m"),
    ("on-both-grids", "8", QUARTER, "2", "2", "2"),
    ("rounds-to-max", "8", QUARTER, "3900m", "4", "4"),
    ("above-max-after-rounding", "8", QUARTER, "4100m", NOFIT, NOFIT),
    ("sub-milli-request", "8", QUARTER, "1000500u", "2", ABORT),
    ("default-when-unnamed", "8", QUARTER, None, "500m", "500m"),
    ("step-1.5-off-is-step-2", "10", ONE_AND_HALF, "2", "3", "2500m"),
    ("step-1.5-five", "10", ONE_AND_HALF, "5", "5", "5500m"),
    ("step-1.5-at-max", "10", ONE_AND_HALF, "7", "7", "7"),
    ("step-1.5-six", "10", ONE_AND_HALF, "6", "7", "7"),
    ("no-step-fraction-as-is", "8", rng("500m"), "333m", "500m", "500m"),
    ("no-step-above-min-as-is", "8", rng("500m"), "1333m", "1333m", "1333m"),
    ("whole-range-fractional-request", "10G", MIN_100M, "150000000500m", "200M", "200M"),
    ("whole-range-sub-milli-request", "10G", MIN_100M, "150000000000500u", "200M", ABORT),
    (
        "fractional-values-round-up",
        "2",
        {"default": "500m", "validValues": ["500m", "1500m", "2"]},
        "700m",
        "1500m",
        "1500m",
    ),
    (
        "fractional-values-above-all",
        "2",
        {"default": "500m", "validValues": ["500m", "1500m"]},
        "1600m",
        NOFIT,
        NOFIT,
    ),
    # a default off the milli grid (min 0.5 step 0.5): an unnamed capacity still takes it
    ("off-grid-default", "8", rng("500m", "500m", default="700m"), None, "700m", "700m"),
]


@pytest.mark.parametrize(
    ("value", "policy", "requested", "off", "on"), [c[1:] for c in GATED], ids=[c[0] for c in GATED]
)
def test_rounding_with_the_gate_off_and_on(
    value: str, policy: dict[str, Any], requested: str | None, off: str | None, on: str | None
) -> None:
    for gate, expected in ((False, off), (True, on)):
        got = outcome(value, policy, requested, gate)
        if expected in (ABORT, NOFIT):
            assert got == expected, f"gate {'on' if gate else 'off'}"
        else:
            assert got is not None and got != ABORT and Q(got) == Q(expected), (
                f"gate {'on' if gate else 'off'}: {got}"
            )


def test_result_formats_follow_the_step() -> None:
    # NewQuantity / NewMilliQuantity in the step's format: canonical strings as the API prints them
    assert outcome("4Gi", rng("1Gi", "512Mi"), "1.2Gi", True) == "1536Mi"
    assert outcome("8", QUARTER, "600m", True) == "750m"
    assert outcome("8", QUARTER, "600m", False) == "1"


# -- properties --------------------------------------------------------------------------------------


@st.composite
def fractional_ranges(draw: st.DrawFn) -> tuple[Quantity, dict[str, Any]]:
    """(capacity value, a stepped validRange policy) with bounds in milli-units."""
    mn = draw(st.integers(min_value=0, max_value=5000))
    step = draw(st.integers(min_value=1, max_value=3000))
    k = draw(st.integers(min_value=0, max_value=20))
    mx = mn + k * step
    value = draw(st.integers(min_value=max(mx, mn + step), max_value=mx + 10_000))
    with_max = draw(st.booleans())
    return Q(f"{value}m"), rng(f"{mn}m", f"{step}m", f"{mx}m" if with_max else None)


def _grid(q: Quantity, gate: bool) -> int:
    return q.milli_value() if gate else q.value()


@settings(max_examples=400)
@given(fractional_ranges(), st.integers(min_value=0, max_value=40_000), st.booleans())
def test_rounded_request_is_on_the_grid_never_below_never_above_max(
    r: tuple[Quantity, dict[str, Any]], req_milli: int, gate: bool
) -> None:
    value, policy = r
    requested = Q(f"{req_milli}m")
    got = consumed_amount(cap(str(value), policy), requested, fractional_capacity_range=gate)
    mn, step = Q(policy["validRange"]["min"]), Q(policy["validRange"]["step"])
    mx = Q(policy["validRange"]["max"]) if "max" in policy["validRange"] else None
    base, unit = _grid(mn, gate), _grid(step, gate)
    if got is None:  # refused only when the first grid point at or above the request passes max
        assert mx is not None and requested >= mn
        first = base + -(-(_grid(requested, gate) - base) // unit) * unit
        assert Quantity.from_nanos(first * (10**6 if gate else 10**9)) > mx
        return
    assert got >= requested
    if mx is not None:
        assert got <= mx
    if requested < mn:
        assert got == mn
        return
    # on the grid of the arithmetic in use, and the first grid point at or above the request
    assert (_grid(got, gate) - base) % unit == 0
    assert _grid(got, gate) - unit < max(_grid(requested, gate), base)


@settings(max_examples=200)
@given(st.integers(0, 50), st.integers(1, 20), st.integers(0, 2000), st.booleans())
def test_whole_bounds_and_requests_round_alike_with_either_gate(
    mn: int, step: int, req: int, gate: bool
) -> None:
    policy = rng(str(mn), str(step))
    assert outcome("10000", policy, str(req), gate) == outcome("10000", policy, str(req), not gate)


@settings(max_examples=200)
@given(fractional_ranges(), st.integers(min_value=1, max_value=999), st.integers(min_value=0, max_value=40))
def test_only_the_gate_on_refuses_a_request_finer_than_a_milli(
    r: tuple[Quantity, dict[str, Any]], micro: int, whole: int
) -> None:
    value, policy = r
    requested = Quantity.from_nanos(whole * 10**9 + micro * 1000)  # finer than 1m
    mn = Q(policy["validRange"]["min"])
    on = outcome(str(value), policy, str(requested), True)
    assert (on == ABORT) is (requested >= mn)
    assert outcome(str(value), policy, str(requested), False) != ABORT


# -- whole claims, selection and the CLI -------------------------------------------------------------

DRV = "drv"


def slice_of(*devices: dict[str, Any]) -> ResourceSlice:
    return ResourceSlice.model_validate(
        {"spec": {"driver": DRV, "nodeName": "n", "pool": {"name": "n"}, "devices": list(devices)}}
    )


def shared(name: str, value: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {"ifName": {"string": f"if-{name}"}},
        "capacity": {"c": {"value": value, "requestPolicy": policy}},
    }


def claim(name: str, *amounts: str) -> ResourceClaim:
    reqs = [
        {"name": f"r{i}", "exactly": {"deviceClassName": "x", "capacity": {"requests": {"c": a}}}}
        for i, a in enumerate(amounts)
    ]
    return ResourceClaim.model_validate(
        {"metadata": {"name": name, "namespace": "ns"}, "spec": {"devices": {"requests": reqs}}}
    )


def consumed_of(res: AllocationResult | ClaimNoFit) -> list[tuple[str, str]]:
    assert isinstance(res, AllocationResult), res
    return [(r.device, str((r.consumed_capacity or {})["c"])) for r in res.devices.results]


def test_two_half_shares_fit_one_unit_only_with_the_gate_on() -> None:
    sl = slice_of(shared("a", "1", rng("250m", "250m")))
    on = allocate_claims(
        [claim("x", "500m"), claim("y", "500m")], sl, NodeUsage(), share_ids(), fractional_capacity_range=True
    )
    assert [consumed_of(r) for r in on] == [[("a", "500m")], [("a", "500m")]]
    off = allocate_claims([claim("x", "500m"), claim("y", "500m")], sl, NodeUsage(), share_ids())
    assert consumed_of(off[0]) == [("a", "1")]  # 0.5 read as 1 on a step of 1
    assert isinstance(off[1], ClaimNoFit) and not off[1].aborted


def test_a_sub_milli_request_aborts_the_claim_with_the_gate_on_only() -> None:
    sl = slice_of(shared("a", "8", QUARTER), shared("b", "8", rng("1", "1")))
    on = allocate_claim(claim("x", "1000500u"), sl, NodeUsage(), share_ids(), fractional_capacity_range=True)
    assert isinstance(on, ClaimNoFit) and on.aborted
    assert "device a" in on.reasons["claim"] and "no exact milli value" in on.reasons["claim"]
    off = allocate_claim(claim("x", "1000500u"), sl, NodeUsage(), share_ids())
    assert consumed_of(off) == [("a", "2")]


def test_the_abort_stops_the_search_where_upstream_meets_it() -> None:
    # device a takes the request first (name order), so b's range is never reached
    sl = slice_of(shared("a", "8", rng("1")), shared("b", "8", QUARTER))
    res = allocate_claim(claim("x", "1000500u"), sl, NodeUsage(), share_ids(), fractional_capacity_range=True)
    assert consumed_of(res) == [("a", "1000500u")]
    # a is full: b is reached and the allocation aborts instead of finding nothing
    full = NodeUsage.from_consumed({"a": {"c": Q("8")}}, sl.spec.devices)
    res = allocate_claim(claim("x", "1000500u"), sl, full, share_ids(), fractional_capacity_range=True)
    assert isinstance(res, ClaimNoFit) and res.aborted


def test_an_all_mode_request_the_range_cannot_compute_aborts_before_the_search() -> None:
    # upstream picks an allocationMode All request's devices (selectors, then the capacity
    # request against each device's totals) while it sets the claim up, before placing any
    # request: a request there that no device's range can compute stops the allocation
    # even when an earlier request never fits (found by the differential test, seed
    # 228357734, gate on, batch 9)
    sl = slice_of(shared("a", "8", QUARTER))
    c = ResourceClaim.model_validate(
        {
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "big",
                            "exactly": {"deviceClassName": "x", "capacity": {"requests": {"c": "9"}}},
                        },
                        {
                            "name": "every",
                            "exactly": {
                                "deviceClassName": "x",
                                "allocationMode": "All",
                                "capacity": {"requests": {"c": "1000500u"}},
                            },
                        },
                    ]
                }
            },
        }
    )
    on = allocate_claim(c, sl, NodeUsage(), share_ids(), fractional_capacity_range=True)
    assert isinstance(on, ClaimNoFit) and on.aborted, on
    assert "request every: device a" in on.reasons["claim"] and "no exact milli value" in on.reasons["claim"]
    off = allocate_claim(c, sl, NodeUsage(), share_ids())  # whole units: computable, and big never fits
    assert isinstance(off, ClaimNoFit) and not off.aborted


def test_an_all_mode_selector_that_fails_to_evaluate_aborts_before_the_search() -> None:
    # the same set-up evaluates an All request's selectors on every device: a CEL error
    # there is the allocation's error, whatever the requests before it
    sl = slice_of(shared("a", "8", QUARTER))
    c = ResourceClaim.model_validate(
        {
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "big",
                            "exactly": {"deviceClassName": "x", "capacity": {"requests": {"c": "9"}}},
                        },
                        {
                            "name": "every",
                            "exactly": {
                                "deviceClassName": "x",
                                "allocationMode": "All",
                                "selectors": [
                                    {"cel": {"expression": 'device.attributes["drv"].nope == "x"'}}
                                ],
                            },
                        },
                    ]
                }
            },
        }
    )
    got = allocate_claim(c, sl, NodeUsage(), share_ids(), fractional_capacity_range=True)
    assert isinstance(got, ClaimNoFit) and got.aborted, got
    assert "request every" in got.reasons["claim"]


def test_select_device_rounds_by_the_gate_and_raises_for_an_unrepresentable_request() -> None:
    devices = [Device.model_validate(shared("a", "8", QUARTER))]
    sel = select_device(devices, {}, {"c": Q("600m")}, fractional_capacity_range=True)
    assert isinstance(sel, Selection) and sel.consumed_capacity == {"c": Q("750m")}
    sel = select_device(devices, {}, {"c": Q("600m")})
    assert isinstance(sel, Selection) and sel.consumed_capacity == {"c": Q("1")}
    with pytest.raises(
        RequestNotRepresentable, match="capacity c: request 1000500u has no exact milli value"
    ):
        select_device(devices, {}, {"c": Q("1000500u")}, fractional_capacity_range=True)


def _cli_files(tmp_path: Path) -> tuple[str, str]:
    inv = tmp_path / "slice.json"
    inv.write_text(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": "s"},
                **slice_of(shared("a", "8", QUARTER)).model_dump(by_alias=True, exclude_none=True),
            }
        )
    )
    cl = tmp_path / "claim.json"
    cl.write_text(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                **claim("x", "600m").model_dump(by_alias=True, exclude_none=True),
            }
        )
    )
    return str(inv), str(cl)


@pytest.mark.parametrize(
    ("flag", "record", "expected"),
    [
        ("on", None, "750m"),
        ("off", None, "1"),
        ("auto", None, "1"),
        ("auto", True, "750m"),
        ("auto", False, "1"),
        ("off", True, "1"),
    ],
)
def test_allocate_cli_follows_the_flag_or_the_agents_record(
    tmp_path: Path, flag: str, record: bool | None, expected: str
) -> None:
    inv, cl = _cli_files(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    if record is not None:
        (state / "cluster-features.json").write_text(
            json.dumps({"fractionalCapacityRange": record, "source": "t"})
        )
    res = CliRunner().invoke(
        cli,
        [
            "allocate",
            "--inventory",
            inv,
            "--claim",
            cl,
            "--state-dir",
            str(state),
            "--fractional-capacity-range",
            flag,
        ],
    )
    assert res.exit_code == 0, res.output
    (entry,) = json.loads(res.stdout)
    assert entry["allocation"]["devices"]["results"][0]["consumedCapacity"] == {"c": expected}


def test_allocate_cli_marks_an_aborted_claim(tmp_path: Path) -> None:
    inv, _ = _cli_files(tmp_path)
    cl = tmp_path / "sub.json"
    cl.write_text(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                **claim("x", "1000500u").model_dump(by_alias=True, exclude_none=True),
            }
        )
    )
    res = CliRunner().invoke(
        cli,
        ["allocate", "--inventory", inv, "--claim", str(cl)],
        env={"CNI_DRA_FRACTIONAL_CAPACITY_RANGE": "on"},
    )
    assert res.exit_code == 1
    (entry,) = json.loads(res.stdout)
    assert entry["aborted"] is True and "no exact milli value" in entry["reasons"]["claim"]
