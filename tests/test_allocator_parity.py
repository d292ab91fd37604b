"""Parity table for the claim allocator: every KEP-5075 / DRA allocator rule, by example.

Each case lists an inventory (devices of one ResourceSlice of driver ``drv``), the
node's prior usage, one or more claims allocated in order, and per claim the expected
results ``(request, device, consumedCapacity or None)`` in result order, or a
``NoFit`` with a substring its reasons must contain. Expected values are written by
hand from the rules (KEP-5075; k8s.io/dynamic-resource-allocation ``structured``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.allocator import ClaimNoFit, NodeUsage, allocate_claim, allocate_claims
from cni_dra.cli.allocate import make_allocate_command
from cni_dra.dra.claims import AllocationResult, ResourceClaim
from cni_dra.dra.objects import ResourceSlice
from cni_dra.quantity import Quantity
from tests.builders import share_ids

DRV = "drv"


# -- tiny builders ------------------------------------------------------------------------


def D(  # noqa: N802 - one-letter builders (D, R, S, FA, C) keep the cases' tables readable
    name: str,
    value: str | int | None = None,
    policy: dict[str, Any] | None = None,
    shared: bool = True,
    attrs: dict[str, Any] | None = None,
    caps: dict[str, Any] | None = None,
    cap_name: str = "c",
) -> dict[str, Any]:
    """A raw device; ``value``/``policy`` describe capacity ``cap_name``."""
    capacity: dict[str, Any] = dict(caps or {})
    if value is not None:
        capacity[cap_name] = {"value": value} | ({"requestPolicy": policy} if policy else {})
    attributes = {"ifName": {"string": f"if-{name}"}}
    for k, v in (attrs or {}).items():
        kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "string"
        attributes[k] = {kind: v}
    dev: dict[str, Any] = {"name": name, "attributes": attributes, "capacity": capacity}
    if shared:
        dev["allowMultipleAllocations"] = True
    return dev


def _spec(
    cap: dict[str, Any] | None, count: int | None, mode: str | None, sel: list[str] | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": "nic"}
    if cap is not None:
        spec["capacity"] = {"requests": cap}
    if count is not None:
        spec["count"] = count
    if mode is not None:
        spec["allocationMode"] = mode
    if sel:
        spec["selectors"] = [{"cel": {"expression": e}} for e in sel]
    return spec


def R(  # noqa: N802
    name: str,
    cap: dict[str, Any] | None = None,
    count: int | None = None,
    mode: str | None = None,
    sel: list[str] | None = None,
) -> dict[str, Any]:
    return {"name": name, "exactly": _spec(cap, count, mode, sel)}


def S(  # noqa: N802
    name: str,
    cap: dict[str, Any] | None = None,
    count: int | None = None,
    mode: str | None = None,
    sel: list[str] | None = None,
) -> dict[str, Any]:
    return {"name": name} | _spec(cap, count, mode, sel)


def FA(name: str, *subs: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
    return {"name": name, "firstAvailable": list(subs)}


def C(  # noqa: N802
    *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None, name: str = "claim"
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"devices": devices}}


@dataclass(frozen=True)
class NoFitExpect:
    contains: str


@dataclass
class Case:
    id: str
    devices: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    expected: list[list[tuple[str, str, dict[str, str] | None]] | NoFitExpect]
    consumed: dict[str, dict[str, str]] = field(default_factory=dict)
    usage: NodeUsage | None = None


def slice_of(devices: list[dict[str, Any]]) -> ResourceSlice:
    return ResourceSlice.model_validate(
        {"spec": {"driver": DRV, "nodeName": "node1", "pool": {"name": "node1"}, "devices": devices}}
    )


RANGE_MIN1 = {"default": 1, "validRange": {"min": 1}}
RANGE_STEP2 = {"default": 1, "validRange": {"min": 1, "step": 2}}
VALUES_13 = {"default": 1, "validValues": [1, 3]}
R224 = {"default": 2, "validRange": {"min": 2, "step": 2, "max": 4}}
BW8 = {"default": "1M", "validRange": {"min": "1M", "step": "8"}}

CASES: list[Case] = [
    # --- KEP-5075 capacity rules ---------------------------------------------------------
    Case(
        "unnamed-capacity-consumes-default", [D("d", 2, RANGE_MIN1)], [C(R("r"))], [[("r", "d", {"c": "1"})]]
    ),
    Case("step-rounds-up", [D("d", 3, RANGE_STEP2)], [C(R("r", {"c": 2}))], [[("r", "d", {"c": "3"})]]),
    Case("valid-values-round-up", [D("d", 3, VALUES_13)], [C(R("r", {"c": 2}))], [[("r", "d", {"c": "3"})]]),
    Case(
        "above-max-no-fit-although-below-value",
        [D("d", 10, R224)],
        [C(R("r", {"c": 6}))],
        [NoFitExpect("c 6 above validRange max 4")],
    ),
    Case(
        "multi-with-consumed-fits-at-equality",
        [D("d", 4, R224)],
        [C(R("r", {"c": 2}))],
        [[("r", "d", {"c": "2"})]],
        consumed={"d": {"c": "2"}},
    ),
    Case(
        "bandwidth-step-8-exact-1G",
        [D("d", "10G", BW8, cap_name="bandwidth")],
        [C(R("r", {"bandwidth": "1G"}))],
        [[("r", "d", {"bandwidth": "1G"})]],
    ),
    Case("no-policy-as-is", [D("d", "10G")], [C(R("r", {"c": "3G"}))], [[("r", "d", {"c": "3G"})]]),
    Case(
        "no-policy-unnamed-takes-whole-value",
        [D("d", "10G")],
        [C(R("r")), C(R("r"), name="second")],
        [[("r", "d", {"c": "10G"})], NoFitExpect("remaining c 0 < 10G")],
    ),
    Case(
        "below-min-consumes-min",
        [D("d", 10, {"default": 3, "validRange": {"min": 3}})],
        [C(R("r", {"c": 1}))],
        [[("r", "d", {"c": "3"})]],
    ),
    Case(
        "valid-values-above-all-no-fit",
        [D("d", 3, VALUES_13)],
        [C(R("r", {"c": 4}))],
        [NoFitExpect("above the largest validValue 3")],
    ),
    Case("valid-values-exact", [D("d", 3, VALUES_13)], [C(R("r", {"c": 1}))], [[("r", "d", {"c": "1"})]]),
    Case(
        "equality-fits",
        [D("d", "10G")],
        [C(R("r", {"c": "4G"}))],
        [[("r", "d", {"c": "4G"})]],
        consumed={"d": {"c": "6G"}},
    ),
    Case(
        "one-over-does-not-fit",
        [D("d", "10G")],
        [C(R("r", {"c": "4000000001"}))],
        [NoFitExpect("remaining c 4G < 4000000001")],
        consumed={"d": {"c": "6G"}},
    ),
    Case(
        "missing-capacity-no-fit",
        [D("d", "10G")],
        [C(R("r", {"latency": 1}))],
        [NoFitExpect("no capacity latency")],
    ),
    Case(
        "missing-capacity-other-device-fits",
        [D("a", "10G"), D("b", "10G", caps={"latency": {"value": 5}})],
        [C(R("r", {"latency": 1}))],
        [[("r", "b", {"c": "10G", "latency": "1"})]],
    ),
    Case(
        "milli-units-four-of-250m",
        [D("d", 1)],
        [C(R("r", {"c": "250m"}), name=f"c{i}") for i in range(5)],
        [[("r", "d", {"c": "250m"})]] * 4 + [NoFitExpect("remaining c 0 < 250m")],
    ),
    Case(
        "binary-and-decimal",
        [D("d", "1Gi")],
        [C(R("r", {"c": "1G"})), C(R("r", {"c": "100M"}), name="second")],
        [[("r", "d", {"c": "1G"})], NoFitExpect("remaining c 73741824 < 100M")],
    ),
    Case(
        "every-capacity-in-consumed",
        [D("d", caps={"bw": {"value": "10G"}, "queues": {"value": 8, "requestPolicy": RANGE_MIN1}})],
        [C(R("r", {"bw": "1G"}))],
        [[("r", "d", {"bw": "1G", "queues": "1"})]],
    ),
    # a claim's capacity names are looked up as they are (upstream requestsContainNonExistCapacity)
    Case(
        "qualified-key-by-its-qualified-name",
        [D("d", caps={"drv/bandwidth": {"value": "10G"}})],
        [C(R("r", {"drv/bandwidth": "2G"}))],
        [[("r", "d", {"drv/bandwidth": "2G"})]],
    ),
    Case(
        "short-request-misses-a-qualified-key",
        [D("d", caps={"drv/bandwidth": {"value": "10G"}})],
        [C(R("r", {"bandwidth": "2G"}))],
        [NoFitExpect("d: no capacity bandwidth")],
    ),
    Case(
        "qualified-request-misses-a-short-key",
        [D("d", "10G", cap_name="bandwidth")],
        [C(R("r", {"drv/bandwidth": "2G"}))],
        [NoFitExpect("d: no capacity drv/bandwidth")],
    ),
    Case(
        "other-domain-request-no-fit",
        [D("d", "10G", cap_name="bandwidth")],
        [C(R("r", {"other.io/bandwidth": "2G"}))],
        [NoFitExpect("no capacity other.io/bandwidth")],
    ),
    # --- dedicated vs shared devices -------------------------------------------------------
    Case(
        "dedicated-two-claims-second-no-fit",
        [D("d", 2, shared=False)],
        [C(R("r", {"c": 1})), C(R("r", {"c": 1}), name="second")],
        [[("r", "d", None)], NoFitExpect("held by a dedicated allocation")],
    ),
    Case(
        "dedicated-capacity-is-a-filter",
        [D("d", "10G", shared=False)],
        [C(R("r", {"c": "20G"}))],
        [NoFitExpect("capacity c 10G < 20G requested")],
    ),
    Case(
        "dedicated-filter-passes-no-consumed",
        [D("d", "10G", shared=False)],
        [C(R("r", {"c": "3G"}))],
        [[("r", "d", None)]],
    ),
    Case(
        "shared-held-by-dedicated-allocation",
        [D("d", "10G")],
        [C(R("r", {"c": "1G"}))],
        [NoFitExpect("held by a dedicated allocation")],
        usage=NodeUsage(dedicated=frozenset({"d"})),
    ),
    Case(
        "dedicated-holding-shared-allocations",
        [D("d", "10G", shared=False)],
        [C(R("r"))],
        [NoFitExpect("dedicated device holds shared allocations")],
        usage=NodeUsage(shared=frozenset({"d"})),
    ),
    Case(
        "dedicated-in-consumed-file-is-held",
        [D("d", "10G", shared=False)],
        [C(R("r"))],
        [NoFitExpect("held by a dedicated allocation")],
        consumed={"d": {"c": "10G"}},
    ),
    Case(
        "one-claim-two-requests-one-dedicated-device",
        [D("d", 2, shared=False)],
        [C(R("a"), R("b"))],
        [
            NoFitExpect(
                "requests a and b fit alone but not together: d is dedicated (one allocation at a time): a and b compete for it"
            )
        ],
    ),
    Case(
        "one-claim-two-requests-two-dedicated-devices",
        [D("d1", 2, shared=False), D("d2", 2, shared=False)],
        [C(R("a"), R("b"))],
        [[("a", "d1", None), ("b", "d2", None)]],
    ),
    Case(
        "shared-device-serves-two-requests",
        [D("d", 4, R224)],
        [C(R("a", {"c": 2}), R("b", {"c": 2}))],
        [[("a", "d", {"c": "2"}), ("b", "d", {"c": "2"})]],
    ),
    Case(
        "same-claim-requests-accumulate",
        [D("d", 4)],
        [C(R("a", {"c": 2}), R("b", {"c": 3}))],
        [NoFitExpect("requests a and b fit alone but not together: combined c 5 > 4 on d (a 2 + b 3)")],
    ),
    # --- count and All ---------------------------------------------------------------------
    # one request never takes a device twice, shared or not (upstream's next device of a
    # request starts at deviceIndex + 1, allocator_incubating.go); other requests may
    Case(
        "count-3-on-one-shared-device",
        [D("d", 3)],
        [C(R("r", {"c": 1}, count=3))],
        [NoFitExpect("needs 3 devices, 1 available")],
    ),
    Case(
        "count-2-takes-two-shared-devices",
        [D("a", 3), D("b", 3)],
        [C(R("r", {"c": 1}, count=2))],
        [[("r", "a", {"c": "1"}), ("r", "b", {"c": "1"})]],
    ),
    Case(
        "count-2-skips-the-device-it-took",
        [D("a", 3), D("b", 1), D("c", 3)],
        [C(R("r", {"c": 2}, count=2))],
        [[("r", "a", {"c": "2"}), ("r", "c", {"c": "2"})]],
    ),
    Case(
        "count-2-dedicated-distinct",
        [D("d1", 1, shared=False), D("d2", 1, shared=False)],
        [C(R("r", count=2))],
        [[("r", "d1", None), ("r", "d2", None)]],
    ),
    Case(
        "count-3-of-2-dedicated-no-fit",
        [D("d1", 1, shared=False), D("d2", 1, shared=False)],
        [C(R("r", count=3))],
        [NoFitExpect("needs 3 devices, 2 available")],
    ),
    Case(
        "all-mode-takes-every-match",
        [D("a", "10G"), D("b", "10G")],
        [C(R("r", {"c": "1G"}, mode="All"))],
        [[("r", "a", {"c": "1G"}), ("r", "b", {"c": "1G"})]],
    ),
    Case(
        "all-mode-one-match-full",
        [D("a", "10G"), D("b", "10G")],
        [C(R("r", {"c": "1G"}, mode="All"))],
        [NoFitExpect("b: remaining c 500M < 1G")],
        consumed={"b": {"c": "9.5G"}},
    ),
    Case(
        "all-mode-nothing-matches",
        [D("a", "10G")],
        [C(R("r", mode="All", sel=['device.attributes["drv"].ifName == "nope"']))],
        [NoFitExpect("a: does not match selectors")],
    ),
    # --- firstAvailable --------------------------------------------------------------------
    Case(
        "first-available-first-fits",
        [D("d", "10G")],
        [C(FA("r", S("fast", {"c": "8G"}), S("slow", {"c": "1G"})))],
        [[("r/fast", "d", {"c": "8G"})]],
    ),
    Case(
        "first-available-falls-back",
        [D("d", "10G")],
        [C(FA("r", S("fast", {"c": "8G"}), S("slow", {"c": "1G"})))],
        [[("r/slow", "d", {"c": "1G"})]],
        consumed={"d": {"c": "5G"}},
    ),
    Case(
        "first-available-none-fits",
        [D("d", "10G")],
        [C(FA("r", S("fast", {"c": "8G"}), S("slow", {"c": "6G"})))],
        [NoFitExpect("r/slow: d: remaining c 5G < 6G")],
        consumed={"d": {"c": "5G"}},
    ),
    # --- constraints and backtracking --------------------------------------------------------
    Case(
        "distinct-attribute-forces-second-device",
        [D("d1", 4, R224, attrs={"grp": "value1"}), D("d2", 4, R224, attrs={"grp": "value2"})],
        [
            C(
                R("a", {"c": 2}),
                R("b", {"c": 2}),
                constraints=[{"requests": ["a", "b"], "distinctAttribute": "drv/grp"}],
            )
        ],
        [[("a", "d1", {"c": "2"}), ("b", "d2", {"c": "2"})]],
    ),
    Case(
        "match-attribute-backtracks",
        [D("d1", 4, attrs={"grp": "g1"}), D("d2", 10, attrs={"grp": "g2"}), D("d4", 4, attrs={"grp": "g2"})],
        [C(R("a", {"c": 2}), R("b", {"c": 8}), constraints=[{"matchAttribute": "drv/grp"}])],
        [[("a", "d2", {"c": "2"}), ("b", "d2", {"c": "8"})]],
    ),
    Case(
        "distinct-backtracks-early-choice",
        [D("d1", 10), D("d2", 2)],
        [C(R("a", {"c": 1}), R("b", {"c": 8}), constraints=[{"distinctAttribute": "drv/ifName"}])],
        [[("a", "d2", {"c": "1"}), ("b", "d1", {"c": "8"})]],
    ),
    # a device allocationMode All needs breaking a constraint fails the allocation with an
    # error (upstream allocateDevice(must=true)), it does not backtrack or fall back
    Case(
        "all-mode-device-breaking-a-constraint-aborts",
        [D("d1", 10, attrs={"grp": "g1"}), D("d2", 10, attrs={"grp": "g2"})],
        [C(R("a", {"c": 1}), R("every", {"c": 1}, mode="All"), constraints=[{"matchAttribute": "drv/grp"}])],
        [
            NoFitExpect(
                "request every: cannot add device d2 because a claim constraint would not be satisfied"
            )
        ],
    ),
    Case(
        "match-attribute-missing-excludes-device",
        [D("d1", 10), D("d2", 10, attrs={"numa": 1})],
        [C(R("a", {"c": 1}), R("b", {"c": 1}), constraints=[{"matchAttribute": "drv/numa"}])],
        [[("a", "d2", {"c": "1"}), ("b", "d2", {"c": "1"})]],
    ),
    Case(
        "match-attribute-typed-values-differ",
        [D("d1", 10, attrs={"numa": 1}), D("d2", 10, attrs={"numa": "1"}, shared=False)],
        [
            C(
                R("a", sel=["device.allowMultipleAllocations"]),
                R("b", sel=["!device.allowMultipleAllocations"]),
                constraints=[{"matchAttribute": "drv/numa"}],
            )
        ],
        [NoFitExpect('matchAttribute drv/numa (a can use d1=1; b can use d2="1")')],
    ),
    Case(
        "constraint-only-for-listed-requests",
        [D("d1", 10, attrs={"grp": "x"}), D("d2", 10, attrs={"grp": "y"})],
        [
            C(
                R("a", {"c": 1}),
                R("b", {"c": 1}),
                R("c", {"c": 1}),
                constraints=[{"requests": ["a", "b"], "distinctAttribute": "drv/grp"}],
            )
        ],
        [[("a", "d1", {"c": "1"}), ("b", "d2", {"c": "1"}), ("c", "d1", {"c": "1"})]],
    ),
    Case(
        "constraint-on-subrequest",
        [D("d1", 10, attrs={"grp": "x"}), D("d2", 10, attrs={"grp": "y"})],
        [
            C(
                R("a", {"c": 1}),
                FA("b", S("s", {"c": 1})),
                constraints=[{"requests": ["a", "b/s"], "distinctAttribute": "drv/grp"}],
            )
        ],
        [[("a", "d1", {"c": "1"}), ("b/s", "d2", {"c": "1"})]],
    ),
    Case(
        "distinct-no-second-device",
        [D("d1", 10)],
        [C(R("a", {"c": 1}), R("b", {"c": 1}), constraints=[{"distinctAttribute": "drv/ifName"}])],
        [
            NoFitExpect(
                'fit alone but not together: distinctAttribute drv/ifName (a can use d1="if-d1"; b can use d1="if-d1")'
            )
        ],
    ),
    # --- CEL selectors ---------------------------------------------------------------------
    Case(
        "cel-attribute-selects",
        [D("a", "10G", attrs={"speed": 10}), D("b", "10G", attrs={"speed": 25})],
        [C(R("r", {"c": "1G"}, sel=['device.attributes["drv"].speed >= 25']))],
        [[("r", "b", {"c": "1G"})]],
    ),
    Case(
        "cel-capacity-total-quantity",
        [D("a", "10G"), D("b", "25G")],
        [C(R("r", {"c": "1G"}, sel=['device.capacity["drv"].c.isGreaterThan(quantity("10G"))']))],
        [[("r", "b", {"c": "1G"})]],
    ),
    Case(
        "cel-capacity-is-total-not-remaining",
        [D("a", "10G")],
        [C(R("r", {"c": "1G"}, sel=['device.capacity["drv"].c.compareTo(quantity("10G")) == 0']))],
        [[("r", "a", {"c": "1G"})]],
        consumed={"a": {"c": "8G"}},
    ),
    Case(
        "cel-allow-multiple-allocations",
        [D("a", "10G"), D("b", "10G", shared=False)],
        [C(R("r", sel=["!device.allowMultipleAllocations"]))],
        [[("r", "b", None)]],
    ),
    Case(
        "cel-driver",
        [D("a", "10G")],
        [C(R("r", {"c": "1G"}, sel=['device.driver == "other"']))],
        [NoFitExpect("a: does not match selectors")],
    ),
    Case(
        "cel-missing-attribute-is-runtime-error",
        [D("a", "10G")],
        [C(R("r", sel=['device.attributes["drv"].nope == 1']))],
        [NoFitExpect("no such key")],
    ),
    Case(
        "cel-in-guard",
        [D("a", "10G"), D("b", "10G", attrs={"sriov": True})],
        [
            C(
                R(
                    "r",
                    {"c": "1G"},
                    sel=['"sriov" in device.attributes["drv"] && device.attributes["drv"].sriov'],
                )
            )
        ],
        [[("r", "b", {"c": "1G"})]],
    ),
    # --- several claims, invalid claims ------------------------------------------------------
    Case(
        "claims-see-earlier-claims",
        [D("d", "10G")],
        [C(R("r", {"c": "6G"})), C(R("r", {"c": "6G"}), name="second")],
        [[("r", "d", {"c": "6G"})], NoFitExpect("remaining c 4G < 6G")],
    ),
    Case(
        "failed-claim-consumes-nothing",
        [D("d", "10G")],
        [C(R("r", {"c": "12G"})), C(R("r", {"c": "10G"}), name="second")],
        [NoFitExpect("remaining c 10G < 12G"), [("r", "d", {"c": "10G"})]],
    ),
    Case(
        "count-zero-invalid",
        [D("d", "10G")],
        [C(R("r", count=0))],
        [NoFitExpect("count must be greater than zero")],
    ),
    Case(
        "all-with-count-invalid",
        [D("d", "10G")],
        [C(R("r", count=2, mode="All"))],
        [NoFitExpect("count must not be set")],
    ),
    Case(
        "unknown-constraint-request",
        [D("d", "10G")],
        [C(R("r"), constraints=[{"requests": ["x"], "matchAttribute": "drv/ifName"}])],
        [NoFitExpect("unknown request x")],
    ),
    Case(
        "too-many-results",
        [D("d", "100")],
        [C(R("r", {"c": 1}, count=33))],
        [NoFitExpect("request r: needs 33 results, a claim holds at most 32")],
    ),
]


# allocationMode All with capacity requests. Expected values by hand from upstream's rules
# (see test_all_mode_with_capacity_requests).
ALL_CAPACITY_CASES: list[Case] = [
    # a device is left out of All when its capacity could not serve the request even idle
    Case(
        "all-skips-device-without-the-capacity",
        [D("a", 10), D("b", 10, cap_name="other")],
        [C(R("r", {"c": 2}, mode="All"))],
        [[("r", "a", {"c": "2"})]],
    ),
    Case(
        "all-skips-device-whose-total-is-too-small",
        [D("a", 10), D("b", 1)],
        [C(R("r", {"c": 2}, mode="All"))],
        [[("r", "a", {"c": "2"})]],
    ),
    Case(
        "all-skips-device-whose-policy-refuses",
        [D("a", 10), D("b", 10, R224)],
        [C(R("r", {"c": 6}, mode="All"))],
        [[("r", "a", {"c": "6"})]],
    ),
    Case(
        "all-skips-device-whose-rounded-amount-exceeds-total",
        [D("a", 10), D("b", 3, RANGE_STEP2)],
        [C(R("r", {"c": 4}, mode="All"))],
        [[("r", "a", {"c": "4"})]],
    ),
    Case(
        "all-skips-small-dedicated-device",
        [D("a", 10), D("d", 1, shared=False)],
        [C(R("r", {"c": 2}, mode="All"))],
        [[("r", "a", {"c": "2"})]],
    ),
    Case(
        "all-keeps-large-dedicated-device",
        [D("a", 10), D("d", 10, shared=False)],
        [C(R("r", {"c": 2}, mode="All"))],
        [[("r", "a", {"c": "2"}), ("r", "d", None)]],
    ),
    Case(
        "all-skips-by-capacity-counts-results-after-filter",
        [D(f"d{i:02d}", 10) for i in range(32)] + [D("zz", 10, cap_name="other")],
        [C(R("r", {"c": 1}, mode="All"))],
        [[("r", f"d{i:02d}", {"c": "1"}) for i in range(32)]],
    ),
    # ... but a device that could serve it and has not enough left fails the request
    Case(
        "all-fails-when-a-matching-device-has-too-little-left",
        [D("a", 10), D("b", 10)],
        [C(R("r", {"c": 2}, mode="All"))],
        [NoFitExpect("request r: b: remaining c 1 < 2")],
        consumed={"b": {"c": "9"}},
    ),
    Case(
        "all-skips-one-device-and-fails-on-another",
        [D("a", 10), D("b", 10, cap_name="other"), D("c", 10)],
        [C(R("r", {"c": 2}, mode="All"))],
        [NoFitExpect("request r: b: left out of All: no capacity c; c: remaining c 1 < 2")],
        consumed={"c": {"c": "9"}},
    ),
    Case(
        "all-fails-on-a-device-an-earlier-claim-filled",
        [D("a", 10), D("b", 10)],
        [C(R("r", {"c": 9})), C(R("every", {"c": 2}, mode="All"), name="second")],
        [[("r", "a", {"c": "9"})], NoFitExpect("request every: a: remaining c 1 < 2")],
    ),
    Case(
        "all-fails-on-a-held-dedicated-device",
        [D("a", 10), D("d", 10, shared=False)],
        [C(R("r", {"c": 2}, mode="All"))],
        [NoFitExpect("request r: d: held by a dedicated allocation")],
        consumed={"d": {"c": "10"}},
    ),
    # no device left after the capacity filter: the request does not fit (not an error)
    Case(
        "all-matches-no-device-after-capacity-filter",
        [D("a", 1), D("b", 10, cap_name="other")],
        [C(R("r", {"c": 2}, mode="All"))],
        [
            NoFitExpect(
                "a: left out of All: capacity c 1 < 2; b: left out of All: no capacity c; "
                "allocationMode All needs at least one matching device that has the requested capacity"
            )
        ],
    ),
    Case(
        "all-matching-no-device-falls-through-first-available",
        [D("a", 1)],
        [C(FA("r", S("every", {"c": 2}, mode="All"), S("one", {"c": 1})))],
        [[("r/one", "a", {"c": "1"})]],
    ),
    # with a count request in the same claim
    Case(
        "count-then-all-share-devices",
        [D("a", 10), D("b", 10), D("x", 10, cap_name="other")],
        [C(R("one", {"c": 4}), R("every", {"c": 4}, mode="All"))],
        [[("one", "a", {"c": "4"}), ("every", "a", {"c": "4"}), ("every", "b", {"c": "4"})]],
    ),
    Case(
        "count-leaves-too-little-for-all",
        [D("a", 10), D("b", 10)],
        [C(R("one", {"c": 8}), R("every", {"c": 4}, mode="All"))],
        [
            NoFitExpect(
                "requests one and every fit alone but not together: combined c 12 > 10 on a (one 8 + every 4)"
            )
        ],
    ),
    Case(
        "count-backtracks-to-a-device-all-skips",
        [D("a", 10), D("b", 5)],
        [C(R("one", {"c": 5}), R("every", {"c": 6}, mode="All"))],
        [[("one", "b", {"c": "5"}), ("every", "a", {"c": "6"})]],
    ),
    Case(
        "all-then-count-on-the-skipped-device",
        [D("a", 4), D("b", 3)],
        [C(R("every", {"c": 4}, mode="All"), R("one", {"c": 3}))],
        [[("every", "a", {"c": "4"}), ("one", "b", {"c": "3"})]],
    ),
    Case(
        "all-then-count-of-a-capacity-all-lacks",
        [D("a", 10), D("s", 10, cap_name="other")],
        [C(R("every", {"c": 4}, mode="All"), R("one", {"other": 4}))],
        [[("every", "a", {"c": "4"}), ("one", "s", {"other": "4"})]],
    ),
    Case(
        "all-then-count-on-the-same-devices",
        [D("a", 10), D("b", 10)],
        [C(R("every", {"c": 8}, mode="All"), R("one", {"c": 4}, count=2))],
        [NoFitExpect("requests every and one fit alone but not together")],
    ),
    Case(
        "count-2-needs-two-devices-next-to-all",
        [D("a", 10), D("b", 3)],
        [C(R("every", {"c": 8}, mode="All"), R("one", {"c": 4}, count=2))],
        [NoFitExpect("request one: b: remaining c 3 < 4; needs 2 devices, 1 available")],
    ),
]


def test_an_all_mode_constraint_break_is_an_abort_not_a_misfit() -> None:
    sl = slice_of([D("d1", 10, attrs={"grp": "g1"}), D("d2", 10, attrs={"grp": "g2"})])
    claim = ResourceClaim.model_validate(
        C(R("a", {"c": 1}), R("every", {"c": 1}, mode="All"), constraints=[{"matchAttribute": "drv/grp"}])
    )
    got = allocate_claim(claim, sl, NodeUsage(), share_ids())
    assert isinstance(got, ClaimNoFit) and got.aborted
    # a device that is merely full fails the request without an error
    full = NodeUsage.from_consumed({"d2": {"c": Quantity.parse("10")}}, sl.spec.devices)
    got = allocate_claim(
        ResourceClaim.model_validate(C(R("every", {"c": 1}, mode="All"))), sl, full, share_ids()
    )
    assert isinstance(got, ClaimNoFit) and not got.aborted


def _usage(case: Case, sl: ResourceSlice) -> NodeUsage:
    if case.usage is not None:
        return case.usage
    consumed = {d: {c: Quantity.parse(v) for c, v in caps.items()} for d, caps in case.consumed.items()}
    return NodeUsage.from_consumed(consumed, sl.spec.devices)


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_parity(case: Case) -> None:
    _check(case)


@pytest.mark.parametrize("case", ALL_CAPACITY_CASES, ids=[c.id for c in ALL_CAPACITY_CASES])
def test_all_mode_with_capacity_requests(case: Case) -> None:
    """``allocationMode: All`` with capacity requests, as upstream's structured allocator.

    Matched: k8s.io/dynamic-resource-allocation ``structured`` (the experimental and
    incubating allocators, v0.37.0 and later, i.e. Kubernetes 1.37+). When a request asks
    for All devices, ``validateDeviceRequest`` collects the devices that match its
    selectors and passes each through ``CmpRequestOverCapacity`` against an EMPTY consumed
    state: a device that lacks a requested capacity, whose requestPolicy refuses the
    amount, or whose capacity value is below the (rounded) amount is skipped, i.e. the
    capacity request filters like a selector on the device's totals (as the
    ``CapacityRequirements`` API documentation says). What is in use is checked only when
    ``allocateOne`` places each device of that set (``allocateDevice`` with must=true): a
    device that could serve the request but has not enough left, after the node's
    allocations and the earlier requests of the claim, fails the request, and the search
    backtracks into the earlier requests. When the set is empty, ``allocateOne`` reports
    the request unsatisfiable (no error; a ``firstAvailable`` moves on to its next
    subrequest). The results limit (32) counts the set after the filter.

    Kubernetes 1.35 and 1.36 measured the filter against the node's existing allocations
    instead of an empty state, so a full device was silently left out of All; upstream
    changed that in 1.37 to fail the request, and cni-dra follows the newer rule.
    """
    _check(case)


def _check(case: Case) -> None:
    sl = slice_of(case.devices)
    claims = [ResourceClaim.model_validate(c) for c in case.claims]
    got = allocate_claims(claims, sl, _usage(case, sl), share_ids())
    assert len(got) == len(case.expected)
    for res, exp in zip(got, case.expected, strict=True):
        if isinstance(exp, NoFitExpect):
            assert isinstance(res, ClaimNoFit), res
            assert exp.contains in str(res), str(res)
            continue
        assert isinstance(res, AllocationResult), str(res)
        triples = [
            (
                r.request,
                r.device,
                None if r.consumed_capacity is None else {k: str(v) for k, v in r.consumed_capacity.items()},
            )
            for r in res.devices.results
        ]
        assert triples == exp
        for r in res.devices.results:
            assert r.driver == DRV and r.pool == "node1"
            assert (r.share_id is None) == (r.consumed_capacity is None)


def test_share_ids_drawn_in_result_order_for_shared_only() -> None:
    sl = slice_of([D("s", "10G", {"default": "1G", "validRange": {"min": "1M"}}), D("x", 1, shared=False)])
    claim = ResourceClaim.model_validate(
        C(R("a", {"c": "1G"}), R("b", sel=["!device.allowMultipleAllocations"]), R("c"))
    )
    res = allocate_claim(claim, sl, NodeUsage(), share_ids())
    assert isinstance(res, AllocationResult)
    assert [r.share_id for r in res.devices.results] == [
        "00000000-0000-4000-8000-000000000001",
        None,
        "00000000-0000-4000-8000-000000000002",
    ]


@pytest.mark.parametrize(
    ("policy", "expected"), [("first-fit", "a"), ("best-fit", "b"), ("least-allocated", "c")]
)
def test_claim_policies(policy: str, expected: str) -> None:
    sl = slice_of([D("a", "10G"), D("b", "5G"), D("c", "40G")])
    claim = ResourceClaim.model_validate(C(R("r", {"c": "1G"})))
    res = allocate_claim(claim, sl, NodeUsage(), share_ids(), policy=policy)  # type: ignore[arg-type]
    assert isinstance(res, AllocationResult)
    assert res.devices.results[0].device == expected


def test_device_classes_add_selectors() -> None:
    sl = slice_of([D("a", "10G", attrs={"kind": "slow"}), D("b", "10G", attrs={"kind": "fast"})])
    claim = ResourceClaim.model_validate(C(R("r", {"c": "1G"})))
    classes = {"nic": ['device.attributes["drv"].kind == "fast"']}
    res = allocate_claim(claim, sl, NodeUsage(), share_ids(), classes=classes)
    assert isinstance(res, AllocationResult) and res.devices.results[0].device == "b"
    unknown = allocate_claim(claim, sl, NodeUsage(), share_ids(), classes={})
    assert isinstance(unknown, ClaimNoFit) and "unknown device class 'nic'" in str(unknown)


def test_node_usage_from_results_round_trip() -> None:
    sl = slice_of([D("s", "10G"), D("x", 1, shared=False)])
    claim = ResourceClaim.model_validate(
        C(R("a", {"c": "4G"}), R("b", sel=["!device.allowMultipleAllocations"]))
    )
    res = allocate_claim(claim, sl, NodeUsage(), share_ids())
    assert isinstance(res, AllocationResult)
    usage = NodeUsage.from_results(res.devices.results)
    assert usage.consumed == {"s": {"c": Quantity.parse("4G")}}
    assert usage.dedicated == frozenset({"x"}) and usage.shared == frozenset({"s"})


def test_search_limit() -> None:
    sl = slice_of([D(f"d{i}", 1, shared=False) for i in range(8)])
    claim = ResourceClaim.model_validate(C(R("r", count=8), R("z")))
    res = allocate_claim(claim, sl, NodeUsage(), share_ids(), max_steps=50)
    assert isinstance(res, ClaimNoFit) and "search limit of 50 steps exceeded" in str(res)


# -- properties -------------------------------------------------------------------------


@st.composite
def inventories(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(min_value=1, max_value=4))
    devs = []
    for i in range(n):
        value = draw(st.integers(min_value=1, max_value=20))
        policy = draw(
            st.sampled_from(
                [
                    None,
                    {"default": 1, "validRange": {"min": 1, "step": 2}},
                    {"default": 1, "validValues": [1, 4, 8]},
                ]
            )
        )
        if policy and "validValues" in policy:
            policy = {"default": 1, "validValues": [v for v in [1, 4, 8] if v <= value]}
        if policy and "validRange" in policy and value < 3:
            policy = None
        devs.append(
            D(
                f"nic-{i}",
                value,
                policy,
                shared=draw(st.booleans()),
                attrs={"grp": draw(st.sampled_from(["x", "y"]))},
            )
        )
    return devs


claim_specs = st.lists(
    st.tuples(st.integers(min_value=1, max_value=2), st.integers(min_value=0, max_value=9), st.booleans()),
    min_size=1,
    max_size=8,
)


def _claims_from(spec: list[tuple[int, int, bool]]) -> list[ResourceClaim]:
    out = []
    for i, (nreq, amount, distinct) in enumerate(spec):
        reqs = [R(f"r{j}", {"c": amount + j}) for j in range(nreq)]
        cons = [{"distinctAttribute": "drv/grp"}] if distinct and nreq > 1 else None
        out.append(ResourceClaim.model_validate(C(*reqs, constraints=cons, name=f"c{i}")))
    return out


@settings(max_examples=150, deadline=None)
@given(inventories(), claim_specs, st.randoms(use_true_random=False))
def test_no_allocate_release_sequence_over_commits(
    devs: list[dict[str, Any]], spec: list[tuple[int, int, bool]], rnd: random.Random
) -> None:
    sl = slice_of(devs)
    by_name = {d.name: d for d in sl.spec.devices}
    live: list[AllocationResult] = []
    ids = share_ids()
    for claim in _claims_from(spec):
        if live and rnd.random() < 0.3:
            live.pop(rnd.randrange(len(live)))  # release a claim
        usage = NodeUsage()
        for res in live:
            usage = usage.with_results(res.devices.results)
        got = allocate_claim(claim, sl, usage, ids)
        if isinstance(got, AllocationResult):
            live.append(got)
        totals: dict[str, Quantity] = {}
        holders: dict[str, int] = {}
        for res in live:
            for r in res.devices.results:
                holders[r.device] = holders.get(r.device, 0) + 1
                for k, v in (r.consumed_capacity or {}).items():
                    totals[r.device] = totals.get(r.device, Quantity.ZERO) + v
                    # consumed ≥ requested and on the policy grid/values
                    cap = by_name[r.device].capacity[k]
                    pol = cap.request_policy
                    if pol is not None and pol.valid_values:
                        assert v in pol.valid_values
                    if pol is not None and pol.valid_range is not None and pol.valid_range.step is not None:
                        assert (v.nanos - pol.valid_range.min.nanos) % pol.valid_range.step.nanos == 0
        for name, total in totals.items():
            assert total <= by_name[name].capacity["c"].value
        for name, count in holders.items():
            if not by_name[name].shared:
                assert count == 1


@settings(max_examples=100, deadline=None)
@given(inventories(), claim_specs, st.randoms(use_true_random=False))
def test_result_independent_of_inventory_order(
    devs: list[dict[str, Any]], spec: list[tuple[int, int, bool]], rnd: random.Random
) -> None:
    shuffled = list(devs)
    rnd.shuffle(shuffled)
    claims = _claims_from(spec)
    a = allocate_claims(claims, slice_of(devs), NodeUsage(), share_ids())
    b = allocate_claims(claims, slice_of(shuffled), NodeUsage(), share_ids())
    assert [str(x) if isinstance(x, ClaimNoFit) else x for x in a] == [
        str(x) if isinstance(x, ClaimNoFit) else x for x in b
    ]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=1, max_value=50),
    st.integers(min_value=1, max_value=10),
    st.integers(min_value=0, max_value=60),
)
def test_consumed_at_least_requested(value: int, step: int, request: int) -> None:
    policy = {"default": 1, "validRange": {"min": 1, "step": step}} if 1 + step <= value else None
    sl = slice_of([D("d", value, policy)])
    res = allocate_claim(
        ResourceClaim.model_validate(C(R("r", {"c": request}))), sl, NodeUsage(), share_ids()
    )
    if isinstance(res, AllocationResult):
        consumed = res.devices.results[0].consumed_capacity
        assert consumed is not None
        assert consumed["c"] >= Quantity.parse(request)
        assert consumed["c"] <= Quantity.parse(value)


# -- the CLI --------------------------------------------------------------------------------


def _write(tmp: Path, name: str, data: Any) -> str:
    p = tmp / name
    p.write_text(json.dumps(data))
    return str(p)


def test_cli_allocate_output_parses_as_v1_allocation_result(tmp_path: Path) -> None:
    from kubernetes.client import ApiClient

    inv = _write(
        tmp_path,
        "slice.json",
        json.loads(
            slice_of([D("eth-a", "10G", BW8), D("eth-b", "25G", BW8)]).model_dump_json(
                by_alias=True, exclude_none=True
            )
        ),
    )
    c1 = _write(tmp_path, "c1.json", C(R("nic", {"c": "1G"}), name="pod-a"))
    c2 = _write(tmp_path, "c2.json", C(R("nic", {"c": "20G"}), name="pod-b"))
    consumed = _write(tmp_path, "consumed.json", {"eth-a": {"c": "2G"}})
    cmd = make_allocate_command(share_id=share_ids())
    result = CliRunner().invoke(
        cmd, ["--inventory", inv, "--claim", c1, "--claim", c2, "--consumed", consumed]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [e["claim"] for e in out] == ["ns/pod-a", "ns/pod-b"]
    client = ApiClient()
    first = client._ApiClient__deserialize(out[0]["allocation"], "V1AllocationResult")  # type: ignore[attr-defined]
    r = first.devices.results[0]
    assert (r.request, r.driver, r.pool, r.device) == ("nic", DRV, "node1", "eth-a")
    assert r.consumed_capacity == {"c": "1G"}
    assert r.share_id == "00000000-0000-4000-8000-000000000001"
    assert first.node_selector.node_selector_terms[0].match_fields[0].values == ["node1"]
    second = client._ApiClient__deserialize(out[1]["allocation"], "V1AllocationResult")  # type: ignore[attr-defined]
    assert second.devices.results[0].device == "eth-b"
    assert second.devices.results[0].consumed_capacity == {"c": "20G"}


def test_cli_no_fit_exits_1_with_reasons(tmp_path: Path) -> None:
    inv = _write(
        tmp_path,
        "slice.json",
        {
            "spec": {
                "driver": DRV,
                "nodeName": "node1",
                "pool": {"name": "node1"},
                "devices": [D("eth-a", "10G")],
            }
        },
    )
    c1 = _write(tmp_path, "c1.json", C(R("nic", {"c": "8G"})))
    consumed = _write(tmp_path, "consumed.json", {"eth-a": {"c": "7G"}})
    result = CliRunner().invoke(
        make_allocate_command(share_id=share_ids()),
        ["--inventory", inv, "--claim", c1, "--consumed", consumed, "-o", "yaml"],
    )
    assert result.exit_code == 1
    import yaml

    out = yaml.safe_load(result.stdout)
    assert out[0]["reasons"] == {"nic": "eth-a: remaining c 3G < 8G"}
    assert "NoCapacityError: claim ns/claim cannot be allocated" in result.stderr


def test_cli_all_mode_leaves_out_a_nic_without_room_even_when_idle(tmp_path: Path) -> None:
    devices = [D("eth-a", "10G"), D("eth-b", "1G"), D("eth-c", "10G", cap_name="other")]
    inv = _write(
        tmp_path,
        "slice.json",
        {"spec": {"driver": DRV, "nodeName": "node1", "pool": {"name": "node1"}, "devices": devices}},
    )
    c1 = _write(tmp_path, "c1.json", C(R("nic", {"c": "2G"}, mode="All")))
    result = CliRunner().invoke(
        make_allocate_command(share_id=share_ids()), ["--inventory", inv, "--claim", c1]
    )
    assert result.exit_code == 0, result.output
    results = json.loads(result.stdout)[0]["allocation"]["devices"]["results"]
    assert [(r["device"], r["consumedCapacity"]) for r in results] == [("eth-a", {"c": "2G"})]


def test_cli_state_reader_is_used(tmp_path: Path) -> None:
    inv = _write(
        tmp_path,
        "slice.json",
        {
            "spec": {
                "driver": DRV,
                "nodeName": "node1",
                "pool": {"name": "node1"},
                "devices": [D("eth-a", "10G")],
            }
        },
    )
    c1 = _write(tmp_path, "c1.json", C(R("nic", {"c": "8G"})))
    seen: list[tuple[str, str]] = []

    def reader(path: str, slice_: Any) -> dict[str, dict[str, Quantity]]:
        seen.append((path, slice_.spec.pool.name))
        return {"eth-a": {"c": Quantity.parse("3G")}}

    cmd = make_allocate_command(state_reader=reader, share_id=share_ids())
    result = CliRunner().invoke(cmd, ["--inventory", inv, "--claim", c1, "--state-dir", str(tmp_path)])
    assert result.exit_code == 1 and seen == [(str(tmp_path), "node1")]
    assert "remaining c 7G < 8G" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--state-dir", "x", "--consumed", "y"], "mutually exclusive"),
        (["--state", "x", "--consumed", "y"], "mutually exclusive"),
        (["--state-dir", "x", "--state", "y"], "give one of them"),
    ],
)
def test_cli_usage_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    inv = _write(
        tmp_path,
        "slice.json",
        {
            "spec": {
                "driver": DRV,
                "nodeName": "node1",
                "pool": {"name": "node1"},
                "devices": [D("eth-a", "10G")],
            }
        },
    )
    c1 = _write(tmp_path, "c1.json", C(R("nic")))
    result = CliRunner().invoke(make_allocate_command(), ["--inventory", inv, "--claim", c1, *args])
    assert result.exit_code == 2 and needle in result.output


def test_cli_bad_input_prints_type_and_message(tmp_path: Path) -> None:
    c1 = _write(tmp_path, "c1.json", C(R("nic")))
    result = CliRunner().invoke(
        make_allocate_command(), ["--inventory", str(tmp_path / "missing.yaml"), "--claim", c1]
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("IOFailureError: failed to read inventory")
    bad = _write(tmp_path, "bad.json", {"eth-a": {"c": "10 G"}})
    inv = _write(
        tmp_path,
        "slice.json",
        {
            "spec": {
                "driver": DRV,
                "nodeName": "node1",
                "pool": {"name": "node1"},
                "devices": [D("eth-a", "10G")],
            }
        },
    )
    result = CliRunner().invoke(
        make_allocate_command(), ["--inventory", inv, "--claim", c1, "--consumed", bad]
    )
    assert result.exit_code == 2 and "InvalidConfigError" in result.stderr and "eth-a.c" in result.stderr


@settings(max_examples=100, deadline=None)
@given(
    inventories(),
    st.integers(min_value=0, max_value=12),
    st.sampled_from(["best-fit", "least-allocated", "first-fit"]),
)
def test_single_request_claim_agrees_with_select_device(
    devs: list[dict[str, Any]], amount: int, policy: str
) -> None:
    from cni_dra.allocator import Selection, select_device

    sl = slice_of(devs)
    sel = select_device(sl.spec.devices, {}, {"c": Quantity.parse(amount)}, policy, driver=DRV)  # type: ignore[arg-type]
    res = allocate_claim(
        ResourceClaim.model_validate(C(R("r", {"c": amount}))), sl, NodeUsage(), share_ids(), policy=policy
    )  # type: ignore[arg-type]
    assert isinstance(sel, Selection) == isinstance(res, AllocationResult)
    if isinstance(sel, Selection) and isinstance(res, AllocationResult):
        assert res.devices.results[0].device == sel.device.name
        if sel.shared:
            assert res.devices.results[0].consumed_capacity == sel.consumed_capacity


@settings(max_examples=200, deadline=None)
@given(
    devs=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(min_value=1, max_value=12)),  # capacity c (None: lacks it)
            st.booleans(),  # shared
            st.integers(min_value=0, max_value=12),  # already consumed (shared) / held (dedicated, when > 0)
        ),
        min_size=1,
        max_size=5,
    ),
    amount=st.integers(min_value=1, max_value=12),
)
def test_all_mode_takes_exactly_the_devices_that_could_serve_it(
    devs: list[tuple[int | None, bool, int]], amount: int
) -> None:
    """All = every device with capacity ``c`` ≥ the request (by total, whatever is in use);
    it fits only when that set is non-empty and each of them can take its share now."""
    raw, consumed = [], {}
    for i, (value, shared, used) in enumerate(devs):
        name = f"d{i}"
        raw.append(
            D(name, value, shared=shared)
            if value is not None
            else D(name, shared=shared, caps={"other": {"value": 1}})
        )
        if value is not None and used:
            consumed[name] = {"c": str(min(used, value))}
    sl = slice_of(raw)
    usage = NodeUsage.from_consumed(
        {d: {k: Quantity.parse(v) for k, v in c.items()} for d, c in consumed.items()}, sl.spec.devices
    )
    res = allocate_claim(
        ResourceClaim.model_validate(C(R("r", {"c": amount}, mode="All"))), sl, usage, share_ids()
    )
    wanted, placeable = [], True
    for i, (value, shared, used) in enumerate(devs):
        if value is None or value < amount:
            continue
        wanted.append(f"d{i}")
        placeable = placeable and ((min(used, value) + amount <= value) if shared else used == 0)
    if wanted and placeable:
        assert isinstance(res, AllocationResult), str(res)
        assert [r.device for r in res.devices.results] == wanted
    else:
        assert isinstance(res, ClaimNoFit)
