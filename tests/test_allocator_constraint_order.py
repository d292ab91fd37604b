"""A device an ``allocationMode: All`` request needs is checked against the claim's
constraints before its capacity, as upstream's ``allocateDevice`` does
(k8s.io/dynamic-resource-allocation v0.37.2, structured/internal/incubating: in use,
counters, taints, then "It's available. Now check constraints.", and only then
``CmpRequestOverCapacity``). With ``must`` (an All request) a broken constraint is an error:
"cannot add device X because a claim constraint would not be satisfied", and the whole
allocation fails, even when the device would not have fit anyway.

Both claims below are the differential test's (netns_tests/e2e/test_differential.py, seed
80340855) where the real kube-scheduler v1.37.2 failed with that error and cni-dra called
the claim merely unschedulable: the slice, the claim and the node's consumption verbatim.
"""

from __future__ import annotations

from typing import Any

from cni_dra.allocator import ClaimNoFit, NodeUsage, allocate_claim
from cni_dra.dra.claims import ResourceClaim
from cni_dra.dra.objects import ResourceSlice
from cni_dra.quantity import Quantity
from tests.builders import resource_slice, share_ids

DRV = "diff.cni-dra.dev"
Q = Quantity.parse


def _slice(name: str, devices: list[dict[str, Any]]) -> ResourceSlice:
    return ResourceSlice.model_validate(resource_slice(devices, driver=DRV, pool=name, node="n"))


def _claim(name: str, devices: dict[str, Any]) -> ResourceClaim:
    return ResourceClaim.model_validate(
        {"metadata": {"name": name, "namespace": "cni-dra-diff"}, "spec": {"devices": devices}}
    )


def _usage(consumed: dict[str, dict[str, str]], slice_: ResourceSlice) -> NodeUsage:
    return NodeUsage.from_consumed(
        {d: {k: Q(v) for k, v in caps.items()} for d, caps in consumed.items()}, slice_.spec.devices
    )


def _dev(name: str, index: int, zone: str, speed: int, capacity: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {"index": {"int": index}, "zone": {"string": zone}, "speed": {"int": speed}},
        "capacity": capacity,
    }


# gate off, batch 9, claim 10: r0 (All, slots 3) takes nic-1 (zone a), then needs nic-2 (zone b),
# which breaks matchAttribute zone; nic-2 is also full (its bandwidth, unrequested and without a
# default, is consumed whole: 10G, with 9G left). Upstream checks the constraint first: an error.
OFF_SLICE = _slice(
    "diff-off-9",
    [
        _dev(
            "nic-0",
            0,
            "b",
            10,
            {
                "bandwidth": {
                    "value": "10G",
                    "requestPolicy": {"default": "500M", "validRange": {"min": "500M"}},
                }
            },
        ),
        _dev(
            "nic-1",
            1,
            "a",
            100,
            {
                "bandwidth": {
                    "value": "100G",
                    "requestPolicy": {
                        "default": "100M",
                        "validRange": {"min": "100M", "step": "100M", "max": "27800M"},
                    },
                },
                "slots": {"value": "16"},
            },
        ),
        _dev(
            "nic-2",
            2,
            "b",
            10,
            {
                "bandwidth": {"value": "10G"},
                "slots": {
                    "value": "16",
                    "requestPolicy": {
                        "default": "1961m",
                        "validRange": {"min": "1", "step": "1", "max": "3"},
                    },
                },
            },
        ),
        _dev(
            "nic-3",
            3,
            "b",
            10,
            {
                "bandwidth": {
                    "value": "10G",
                    "requestPolicy": {"default": "1G", "validValues": ["1G", "2500M"]},
                },
                "slots": {"value": "16"},
            },
        ),
    ],
)
OFF_CLAIM = _claim(
    "diff-off-9-c10",
    {
        "requests": [
            {
                "name": "r0",
                "exactly": {
                    "deviceClassName": "cni-dra-diff",
                    "allocationMode": "All",
                    "capacity": {"requests": {"slots": "3"}},
                },
            },
            {
                "name": "r1",
                "firstAvailable": [
                    {
                        "name": "s0",
                        "deviceClassName": "cni-dra-diff",
                        "count": 2,
                        "capacity": {"requests": {f"{DRV}/slots": "3503m"}},
                        "selectors": [{"cel": {"expression": f'device.attributes["{DRV}"].zone == "a"'}}],
                    },
                    {
                        "name": "s1",
                        "deviceClassName": "cni-dra-diff",
                        "capacity": {"requests": {"bandwidth": "10G", "slots": "2"}},
                    },
                ],
            },
        ],
        "constraints": [{"matchAttribute": f"{DRV}/zone"}],
    },
)
OFF_USAGE = {"nic-1": {"bandwidth": "6700M", "slots": "3982m"}, "nic-2": {"bandwidth": "1G", "slots": "1"}}

# gate on, batch 4, claim 7: r0 lands on nic-1 (index 1); r1 (All) needs nic-1 too, which breaks
# distinctAttribute index (and nic-1 has too little bandwidth left for r1): an error upstream.
ON_SLICE = _slice(
    "diff-on-4",
    [
        _dev(
            "nic-0",
            0,
            "a",
            40,
            {
                "bandwidth": {
                    "value": "40G",
                    "requestPolicy": {
                        "default": "1G",
                        "validRange": {"min": "1G", "step": "1G", "max": "20G"},
                    },
                }
            },
        ),
        _dev(
            "nic-1",
            1,
            "a",
            40,
            {
                "bandwidth": {
                    "value": "40G",
                    "requestPolicy": {"default": "500M", "validRange": {"min": "500M"}},
                },
                "slots": {
                    "value": "8",
                    "requestPolicy": {"default": "1500m", "validRange": {"min": "1500m", "step": "250m"}},
                },
            },
        ),
        _dev(
            "nic-2",
            2,
            "b",
            25,
            {
                "bandwidth": {
                    "value": "25G",
                    "requestPolicy": {"default": "600M", "validRange": {"min": "500M", "step": "100M"}},
                },
                "slots": {"value": "4", "requestPolicy": {"default": "2500m", "validValues": ["1", "2500m"]}},
            },
        ),
    ],
)
ON_CLAIM = _claim(
    "diff-on-4-c7",
    {
        "requests": [
            {
                "name": "r0",
                "exactly": {
                    "deviceClassName": "cni-dra-diff",
                    "capacity": {"requests": {"bandwidth": "250000000", "slots": "1001000500n"}},
                    "selectors": [{"cel": {"expression": f'device.attributes["{DRV}"].speed >= 25'}}],
                },
            },
            {
                "name": "r1",
                "exactly": {
                    "deviceClassName": "cni-dra-diff",
                    "allocationMode": "All",
                    "capacity": {"requests": {"bandwidth": "6214285714285m", "slots": "2501m"}},
                },
            },
        ],
        "constraints": [{"distinctAttribute": f"{DRV}/index"}],
    },
)
ON_USAGE = {
    "nic-1": {"bandwidth": "35822346351921m", "slots": "6500m"},
    "nic-2": {"bandwidth": "600M", "slots": "1"},
    "nic-0": {"bandwidth": "1G"},
}


def test_an_all_request_whose_device_breaks_a_match_constraint_fails_the_allocation_even_when_full() -> None:
    got = allocate_claim(OFF_CLAIM, OFF_SLICE, _usage(OFF_USAGE, OFF_SLICE), share_ids())
    assert isinstance(got, ClaimNoFit) and got.aborted, got
    assert "cannot add device nic-2 because a claim constraint would not be satisfied" in str(got.reasons), (
        got
    )


def test_an_all_request_whose_device_breaks_a_distinct_constraint_fails_the_allocation_even_when_full() -> (
    None
):
    got = allocate_claim(
        ON_CLAIM, ON_SLICE, _usage(ON_USAGE, ON_SLICE), share_ids(), fractional_capacity_range=True
    )
    assert isinstance(got, ClaimNoFit) and got.aborted, got
    assert "cannot add device nic-1 because a claim constraint would not be satisfied" in str(got.reasons), (
        got
    )


def test_a_full_device_of_an_exact_count_request_is_only_unschedulable() -> None:
    """Without ``must`` (an exact count), a constraint that would break is just no fit."""
    devices = dict(OFF_CLAIM.model_dump(by_alias=True, exclude_none=True)["spec"]["devices"])
    devices["requests"] = [
        {
            "name": "r0",
            "exactly": {
                "deviceClassName": "cni-dra-diff",
                "count": 2,
                "capacity": {"requests": {"slots": "3"}},
            },
        }
    ]
    got = allocate_claim(_claim("exact", devices), OFF_SLICE, _usage(OFF_USAGE, OFF_SLICE), share_ids())
    assert isinstance(got, ClaimNoFit) and not got.aborted, got
