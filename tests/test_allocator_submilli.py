"""Capacity requests finer than one milli-unit, with the DRAFractionalCapacityRange gate off and on.

The rule, as upstream states it (k8s.io/dynamic-resource-allocation v0.37.2,
``structured/internal/incubating/consumable_capacity.go``; ``experimental`` is the same):

* ``roundUpRange`` is the only place that refuses. With the gate on and ``useMilli`` true
  (every bound of the ``validRange`` has an exact milli value and ``step`` ≥ 1m, whole
  bounds included), a request at or above ``min`` of a range **with a step** is read with
  ``safeMilliValue``; a request with no exact milli value returns
  ``errCapacityRequestNotRepresentable`` ("request X is not a representable milli value").
  It is the request that is tested, before any rounding or ``max`` check.
* ``CmpRequestOverCapacity`` computes every capacity's amount first and turns that error
  into a fatal one: the allocation fails (pod condition ``SchedulerError``), no other
  device is tried, nothing is rounded.
* Everywhere else a sub-milli request passes: no requestPolicy (consumed as is), a
  ``validRange`` without ``step`` (as is, only ``max`` checked), a request below ``min``
  (consumes ``min``), ``validValues`` (exact comparison), a range that does not use milli
  arithmetic, and the gate off (``Value()`` rounds up to a whole unit).
* Where the refusal happens in a claim: an ``allocationMode: All`` request (exactly or a
  ``firstAvailable`` subrequest) meets it while the claim is set up
  (``validateDeviceRequest``, against empty books), before any request is placed; an
  exact-count request only when the search reaches that device for it.

Found by the differential test against kube-scheduler v1.37.2 (seed 637691648, gate on,
batch 6, claim 5): the scheduler failed with "request 850000500n is not a representable
milli value" while a cni-dra without the set-up of All requests reported the claim as
not fitting (unschedulable) instead of aborted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.allocator import ClaimNoFit, NodeUsage, RequestNotRepresentable, allocate_claim, consumed_amount
from cni_dra.cli import cli
from cni_dra.dra.claims import AllocationResult, ResourceClaim
from cni_dra.dra.objects import DeviceCapacity, ResourceSlice
from cni_dra.quantity import Quantity
from tests.builders import share_ids

Q = Quantity.parse
ABORT = "abort"  # errCapacityRequestNotRepresentable: the allocation fails
NOFIT = "nofit"  # violatesPolicy: this device does not fit, others are tried

SLOTS = {
    "default": "250m",
    "validRange": {"min": "250m", "step": "100m", "max": "1250m"},
}  # the differential's
BANDWIDTH = {"default": "1G", "validRange": {"min": "1G", "step": "250M", "max": "19750M"}}  # whole bounds
NO_STEP = {"default": "250m", "validRange": {"min": "250m", "max": "1250m"}}
VALUES = {"default": "250m", "validValues": ["250m", "1", "1500m"]}
# bounds with no exact milli value: useMilli is false, whole units even with the gate on (the API
# server refuses such a slice with the gate on; one stored before is still read this way)
MICRO_STEP = {"default": "1", "validRange": {"min": "1", "step": "1500u"}}


def outcome(value: str, policy: dict[str, Any] | None, requested: str | None, gate: bool) -> str:
    raw: dict[str, Any] = {"value": value}
    if policy is not None:
        raw["requestPolicy"] = policy
    try:
        got = consumed_amount(
            DeviceCapacity.model_validate(raw),
            None if requested is None else Q(requested),
            fractional_capacity_range=gate,
        )
    except RequestNotRepresentable:
        return ABORT
    return NOFIT if got is None else str(got)


# (id, capacity value, policy, request, consumed with the gate off, with it on)
CASES: list[tuple[str, str, dict[str, Any] | None, str | None, str, str]] = [
    ("stepped-range-refuses-the-request", "2", SLOTS, "850000500n", "1", ABORT),
    ("at-min-plus-a-nano", "2", SLOTS, "250000001n", "1", ABORT),
    # the request is tested, not the rounded value: the abort comes before the max check
    ("above-max-aborts-before-max-is-checked", "2", SLOTS, "1250000500n", NOFIT, ABORT),
    ("whole-bounds-use-milli-too", "25G", BANDWIDTH, "2250000000000000500n", "2500M", ABORT),
    ("below-min-consumes-min", "2", SLOTS, "200000500n", "250m", "250m"),
    ("unnamed-takes-the-default", "2", SLOTS, None, "250m", "250m"),
    ("no-policy-as-is", "2", None, "850000500n", "850000500n", "850000500n"),
    ("range-without-step-as-is", "2", NO_STEP, "850000500n", "850000500n", "850000500n"),
    ("range-without-step-above-max", "2", NO_STEP, "1250000500n", NOFIT, NOFIT),
    ("valid-values-round-up-exactly", "2", VALUES, "850000500n", "1", "1"),
    ("valid-values-above-all", "2", VALUES, "1500000500n", NOFIT, NOFIT),
    ("range-not-in-milli-uses-whole-units", "8", MICRO_STEP, "1000000500n", "2", "2"),
]


@pytest.mark.parametrize(
    ("value", "policy", "requested", "off", "on"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_where_upstream_refuses_a_sub_milli_request(
    value: str, policy: dict[str, Any] | None, requested: str | None, off: str, on: str
) -> None:
    for gate, expected in ((False, off), (True, on)):
        got = outcome(value, policy, requested, gate)
        same = (
            got == expected
            if expected in (ABORT, NOFIT)
            else got not in (ABORT, NOFIT) and Q(got) == Q(expected)
        )
        assert same, f"gate {'on' if gate else 'off'}: {got}, expected {expected}"


def test_the_refusal_names_the_request_the_range_and_the_gate() -> None:
    raw = {"value": "2", "requestPolicy": SLOTS}
    with pytest.raises(RequestNotRepresentable) as info:
        consumed_amount(DeviceCapacity.model_validate(raw), Q("850000500n"), fractional_capacity_range=True)
    msg = info.value.msg
    assert info.value.code == 7
    for part in (
        "850000500n",
        "finer than 1m",
        "DRAFractionalCapacityRange on",
        "min 250m",
        "step 100m",
        "nothing is rounded",
    ):
        assert part in msg, msg


# -- property: only a stepped range depends on the gate ----------------------------------------------

UNSTEPPED = st.sampled_from([None, NO_STEP, VALUES, {"default": "1", "validRange": {"min": "0"}}])


@settings(max_examples=300)
@given(UNSTEPPED, st.integers(min_value=0, max_value=3 * 10**9), st.booleans())
def test_without_a_step_the_gate_changes_nothing_and_nothing_aborts(
    policy: dict[str, Any] | None, nanos: int, named: bool
) -> None:
    requested = str(Quantity.from_nanos(nanos)) if named else None
    off, on = outcome("2", policy, requested, False), outcome("2", policy, requested, True)
    assert off != ABORT and on == off


@settings(max_examples=300)
@given(st.integers(min_value=0, max_value=2000), st.integers(min_value=1, max_value=999_999), st.booleans())
def test_a_stepped_milli_range_aborts_exactly_when_the_request_reaches_min(
    milli: int, sub: int, gate: bool
) -> None:
    requested = Quantity.from_nanos(milli * 10**6 + sub)  # finer than 1m
    got = outcome("2", SLOTS, str(requested), gate)
    assert (got == ABORT) is (gate and requested >= Q("250m"))


# -- whole claims: the differential's claim -----------------------------------------------------------

DRV = "diff.cni-dra.dev"
SLICE = ResourceSlice.model_validate(
    {
        "spec": {
            "driver": DRV,
            "nodeName": "diff-on-6",
            "pool": {"name": "diff-on-6"},
            "devices": [
                {
                    "name": "nic-0",
                    "capacity": {"bandwidth": {"value": "10000000000"}},
                    "attributes": {"index": {"int": 0}, "zone": {"string": "a"}, "speed": {"int": 10}},
                },
                {
                    "name": "nic-1",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "bandwidth": {"value": "25000000000", "requestPolicy": BANDWIDTH},
                        "slots": {"value": "2", "requestPolicy": SLOTS},
                    },
                    "attributes": {"index": {"int": 1}, "zone": {"string": "b"}, "speed": {"int": 25}},
                },
            ],
        }
    }
)


def _claim(r1: dict[str, Any]) -> ResourceClaim:
    return ResourceClaim.model_validate(
        {
            "metadata": {"name": "diff-on-6-c5", "namespace": "cni-dra-diff"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "r0",
                            "exactly": {
                                "deviceClassName": "cni-dra-diff",
                                "count": 2,
                                "capacity": {"requests": {"bandwidth": "2250000000", "slots": "1250m"}},
                            },
                        },
                        {
                            "name": "r1",
                            "firstAvailable": [
                                {
                                    "name": "s0",
                                    "deviceClassName": "cni-dra-diff",
                                    **r1,
                                    "capacity": {
                                        "requests": {"bandwidth": "409731509252m", "slots": "850000500n"}
                                    },
                                },
                                {
                                    "name": "s1",
                                    "deviceClassName": "cni-dra-diff",
                                    "selectors": [
                                        {"cel": {"expression": f'device.attributes["{DRV}"].zone == "a"'}}
                                    ],
                                },
                            ],
                        },
                    ]
                }
            },
        }
    )


CLAIM_5 = _claim({"allocationMode": "All"})
BEFORE = NodeUsage.from_consumed(
    {"nic-1": {"bandwidth": Q("5500M"), "slots": Q("1300m")}}, SLICE.spec.devices
)


@pytest.mark.parametrize("usage", [NodeUsage(), BEFORE], ids=["empty-node", "as-the-scheduler-had-it"])
def test_the_differentials_claim_aborts_with_the_gate_on(usage: NodeUsage) -> None:
    # r0 never fits (nic-0 has no slots; one request takes a device once), yet the scheduler
    # fails with an error: the All subrequest r1/s0 is set up first and its slots request is
    # not a milli value on nic-1's stepped range
    got = allocate_claim(CLAIM_5, SLICE, usage, share_ids(), fractional_capacity_range=True)
    assert isinstance(got, ClaimNoFit) and got.aborted, got
    assert "request r1/s0: device nic-1: capacity slots: request 850000500n" in got.reasons["claim"]


def test_the_differentials_claim_is_only_unschedulable_with_the_gate_off() -> None:
    got = allocate_claim(CLAIM_5, SLICE, BEFORE, share_ids())
    assert isinstance(got, ClaimNoFit) and not got.aborted, got
    assert "r0" in got.reasons


def test_an_exact_count_subrequest_after_a_request_that_never_fits_is_never_reached() -> None:
    # the same claim with r1/s0 an exact-count request: upstream tries r0 first, finds
    # nothing, and never computes r1/s0's capacity: unschedulable, not an error
    got = allocate_claim(_claim({}), SLICE, BEFORE, share_ids(), fractional_capacity_range=True)
    assert isinstance(got, ClaimNoFit) and not got.aborted, got


def test_an_exact_count_request_that_is_reached_aborts() -> None:
    c = ResourceClaim.model_validate(
        {
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "r0",
                            "exactly": {
                                "deviceClassName": "x",
                                "capacity": {"requests": {"slots": "850000500n"}},
                            },
                        }
                    ]
                }
            },
        }
    )
    assert isinstance(
        allocate_claim(c, SLICE, NodeUsage(), share_ids()), AllocationResult
    )  # off: rounds to 1
    got = allocate_claim(c, SLICE, NodeUsage(), share_ids(), fractional_capacity_range=True)
    assert isinstance(got, ClaimNoFit) and got.aborted, got


def test_allocate_explains_the_refusal(tmp_path: Path) -> None:
    inv, cl = tmp_path / "slice.json", tmp_path / "claim.json"
    inv.write_text(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": "s"},
                **SLICE.model_dump(by_alias=True, exclude_none=True),
            }
        )
    )
    cl.write_text(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                **CLAIM_5.model_dump(by_alias=True, exclude_none=True),
            }
        )
    )
    res = CliRunner().invoke(
        cli, ["allocate", "--inventory", str(inv), "--claim", str(cl), "--fractional-capacity-range", "on"]
    )
    assert res.exit_code == 1, res.output
    (entry,) = json.loads(res.stdout)
    assert entry["aborted"] is True
    assert (
        "claim cni-dra-diff/diff-on-6-c5 cannot be allocated "
        "(the scheduler's allocation stops with an error, SchedulerError):" in res.stderr
    )
    assert (
        "request 850000500n has no exact milli value (finer than 1m): with DRAFractionalCapacityRange on"
        in res.stderr
    )
    off = CliRunner().invoke(
        cli, ["allocate", "--inventory", str(inv), "--claim", str(cl), "--fractional-capacity-range", "off"]
    )
    assert off.exit_code == 1 and "aborted" not in json.loads(off.stdout)[0]
    assert "SchedulerError" not in off.stderr
