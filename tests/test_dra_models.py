"""resource.k8s.io/v1 models: API-shaped round trips, extra fields ignored, attributes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cni_dra.dra.claims import DeviceRequestAllocationResult, ResourceClaim
from cni_dra.dra.objects import Device, DeviceAttribute, ResourceSlice, device_attribute, to_api
from cni_dra.quantity import Quantity

SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "node1-nics", "creationTimestamp": "2025-01-01T00:00:00Z"},
    "spec": {
        "driver": "nic.cni-dra.io",
        "nodeName": "node1",
        "pool": {"name": "node1", "generation": 3, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "eth-a",
                "allowMultipleAllocations": True,
                "attributes": {
                    "ifName": {"string": "eth0"},
                    "nic.cni-dra.io/speedGbps": {"int": 10},
                    "sriov": {"bool": False},
                    "fw": {"version": "1.2.3"},
                },
                "capacity": {
                    "bandwidth": {
                        "value": "10G",
                        "requestPolicy": {"default": "1M", "validRange": {"min": "1M", "step": "8"}},
                    }
                },
                "taints": [],
            }
        ],
    },
}


def test_slice_round_trip_is_api_shaped() -> None:
    s = ResourceSlice.model_validate(SLICE)
    out = to_api(s)
    expected = {k: v for k, v in SLICE.items()}
    expected["metadata"] = {"name": "node1-nics"}
    dev = dict(SLICE["spec"]["devices"][0])  # type: ignore[index]
    del dev["taints"]
    expected["spec"] = dict(SLICE["spec"], devices=[dev])  # type: ignore[arg-type]
    assert out == expected
    assert s.model_dump(by_alias=True, exclude_none=True) == expected


def test_quantities_are_parsed() -> None:
    cap = ResourceSlice.model_validate(SLICE).spec.devices[0].capacity["bandwidth"]
    assert cap.value == Quantity.parse("10G")
    assert cap.request_policy is not None and cap.request_policy.valid_range is not None
    assert cap.request_policy.valid_range.step == Quantity.parse("8")


def test_snake_case_names_accepted() -> None:
    d = Device(name="x", allow_multiple_allocations=True)
    assert d.shared
    assert to_api(d) == {"name": "x", "attributes": {}, "capacity": {}, "allowMultipleAllocations": True}


def test_models_are_frozen() -> None:
    d = Device(name="x")
    with pytest.raises(ValidationError):
        d.name = "y"  # type: ignore[misc]


@pytest.mark.parametrize("raw", [{}, {"string": "a", "int": 1}, {"int": "1"}, {"bool": 1}])
def test_attribute_needs_exactly_one_typed_value(raw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DeviceAttribute.model_validate(raw)


def test_attribute_of() -> None:
    assert to_api(DeviceAttribute.of(True)) == {"bool": True}
    assert to_api(DeviceAttribute.of(3)) == {"int": 3}
    assert to_api(DeviceAttribute.of("eth0")) == {"string": "eth0"}


def test_device_attribute_short_and_qualified() -> None:
    d = ResourceSlice.model_validate(SLICE).spec.devices[0]
    drv = "nic.cni-dra.io"
    assert device_attribute(d, "ifName", drv) == "eth0"
    assert device_attribute(d, f"{drv}/ifName", drv) == "eth0"
    assert device_attribute(d, "speedGbps", drv) == 10
    assert device_attribute(d, f"{drv}/speedGbps", drv) == 10
    assert device_attribute(d, "sriov", drv) is False
    assert device_attribute(d, "fw", drv) == "1.2.3"
    assert device_attribute(d, "other.io/ifName", drv) is None
    assert device_attribute(d, "missing", drv) is None


def test_driver_qualified_attribute_wins() -> None:
    d = Device.model_validate(
        {"name": "x", "attributes": {"ifName": {"string": "short"}, "drv/ifName": {"string": "qualified"}}}
    )
    assert device_attribute(d, "ifName", "drv") == "qualified"


CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "net", "namespace": "default", "uid": "u-1"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "nic",
                    "exactly": {
                        "deviceClassName": "nic.cni-dra.io",
                        "selectors": [{"cel": {"expression": "device.driver == 'nic.cni-dra.io'"}}],
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "capacity": {"requests": {"bandwidth": "1G"}},
                    },
                },
                {
                    "name": "alt",
                    "firstAvailable": [
                        {
                            "name": "fast",
                            "deviceClassName": "c",
                            "capacity": {"requests": {"bandwidth": "10G"}},
                        },
                        {"name": "slow", "deviceClassName": "c"},
                    ],
                },
            ],
            "constraints": [{"requests": ["nic", "alt"], "distinctAttribute": "nic.cni-dra.io/ifName"}],
        }
    },
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "nic",
                        "driver": "nic.cni-dra.io",
                        "pool": "node1",
                        "device": "eth-a",
                        "consumedCapacity": {"bandwidth": "1G"},
                        "shareID": "0b6c1c8e-9d7a-4b8e-8a0e-6f4b9b7a2c11",
                    }
                ]
            },
            "nodeSelector": {"nodeSelectorTerms": []},
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
    },
}


def test_claim_round_trip() -> None:
    c = ResourceClaim.model_validate(CLAIM)
    assert to_api(c) == CLAIM
    req = c.spec.devices.requests[0]
    assert req.exactly is not None and req.exactly.capacity is not None
    assert req.exactly.capacity.requests["bandwidth"] == Quantity.parse("1G")
    assert c.status is not None and c.status.allocation is not None
    result = c.status.allocation.devices.results[0]
    assert result.share_id == "0b6c1c8e-9d7a-4b8e-8a0e-6f4b9b7a2c11"


def test_result_without_share_omits_fields() -> None:
    r = DeviceRequestAllocationResult(request="r", driver="d", pool="p", device="x")
    assert to_api(r) == {"request": "r", "driver": "d", "pool": "p", "device": "x"}
