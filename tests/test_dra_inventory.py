"""Inventory loading and validation: errors name device, field and rule."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_dra.dra.inventory import load_inventory, parse_inventory, slice_to_dict, validate_slice
from cni_dra.dra.objects import ResourceSlice
from cni_dra.errors import InventoryError, IOFailureError

BASE: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "n1"},
    "spec": {
        "driver": "nic.cni-dra.io",
        "nodeName": "n1",
        "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "eth-a",
                "allowMultipleAllocations": True,
                "attributes": {"ifName": {"string": "eth0"}},
                "capacity": {
                    "bandwidth": {
                        "value": "10G",
                        "requestPolicy": {"default": "1G", "validRange": {"min": "1M"}},
                    }
                },
            },
            {
                "name": "eth-b",
                "attributes": {"nic.cni-dra.io/ifName": {"string": "eth1"}},
                "capacity": {"bandwidth": {"value": "25G"}},
            },
        ],
    },
}

YAML_TEXT = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1}
spec:
  driver: nic.cni-dra.io
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  devices:
  - name: eth-a
    allowMultipleAllocations: true
    attributes:
      ifName: {string: eth0}
    capacity:
      bandwidth:
        value: 10G
        requestPolicy: {default: 1G, validRange: {min: 1M}}
  - name: eth-b
    attributes:
      nic.cni-dra.io/ifName: {string: eth1}
    capacity:
      bandwidth: {value: 25G}
"""


def test_load_json_and_yaml_agree(tmp_path: Path) -> None:
    j = tmp_path / "slice.json"
    j.write_text(json.dumps(BASE))
    y = tmp_path / "slice.yaml"
    y.write_text(YAML_TEXT)
    a, b = load_inventory(str(j)), load_inventory(str(y))
    assert a == b
    assert slice_to_dict(a) == BASE


def test_unreadable_file_is_io_error(tmp_path: Path) -> None:
    with pytest.raises(IOFailureError) as ei:
        load_inventory(str(tmp_path / "missing.yaml"))
    assert ei.value.code == 5
    assert "missing.yaml" in ei.value.msg


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_unreadable_permissions(tmp_path: Path) -> None:  # pragma: no cover - CI runs as root
    p = tmp_path / "s.json"
    p.write_text("{}")
    p.chmod(0)
    with pytest.raises(IOFailureError):
        load_inventory(str(p))


def _mutated(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        node: Any = data
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node[k]
        last = keys[-1]
        if value is None:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value
    return data


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        (
            _mutated(spec__devices__0__capacity__bandwidth__value="10 G"),
            ["device eth-a", "capacity.bandwidth.value", "invalid quantity"],
        ),
        (
            _mutated(spec__devices__0__allowMultipleAllocations=None),
            ["device eth-a", "requestPolicy: allowed only when allowMultipleAllocations"],
        ),
        (_mutated(spec__devices__1__name="eth-a"), ["device eth-a", "duplicate device name"]),
        (_mutated(spec__devices__1__attributes={}), ["device eth-b", "ifName", "missing"]),
        (
            _mutated(spec__devices__1__attributes={"ifName": {"string": "eth0"}}),
            ["device eth-b", "eth0", "already used by device eth-a"],
        ),
        (
            _mutated(spec__devices__1__attributes={"ifName": {"int": 3}}),
            ["device eth-b", "ifName", "non-empty string"],
        ),
        (
            _mutated(spec__devices__0__attributes={"ifName": {"string": "eth0", "int": 1}}),
            ["device eth-a", "attributes.ifName", "exactly one"],
        ),
        (_mutated(spec__driver=None), ["spec.driver"]),
        (_mutated(kind="ResourceClaim"), ["kind"]),
    ],
)
def test_invalid_inventory_names_device_and_field(data: dict[str, Any], needles: list[str]) -> None:
    with pytest.raises(InventoryError) as ei:
        parse_inventory(json.dumps(data), source="s.json")
    assert ei.value.code == 7
    for n in needles:
        assert n in ei.value.msg, (n, ei.value.msg)


@pytest.mark.parametrize("version", ["resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2", "v1", ""])
def test_other_api_versions_are_refused_not_read_as_v1(version: str) -> None:
    """A v1beta1 slice keeps attributes and capacity under ``devices[].basic``; read as v1 it
    would have lost them silently. Only v1 is read (absent counts as v1)."""
    data = copy.deepcopy(BASE)
    data["apiVersion"] = version
    for text, source in (
        (json.dumps(data), "s.json"),
        (YAML_TEXT.replace("resource.k8s.io/v1", version or "''", 1), "s.yaml"),
    ):
        with pytest.raises(InventoryError) as ei:
            parse_inventory(text, source)
        assert ei.value.code == 7
        assert f"apiVersion is {version!r}, expected 'resource.k8s.io/v1'" in ei.value.msg


def test_absent_api_version_reads_as_v1() -> None:
    data = copy.deepcopy(BASE)
    del data["apiVersion"]
    assert [d.name for d in parse_inventory(json.dumps(data), "s.json").spec.devices] == ["eth-a", "eth-b"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "spec: [unclosed", "42"])
def test_undecodable_is_inventory_error(text: str) -> None:
    with pytest.raises(InventoryError):
        parse_inventory(text, source="s.yaml")


def test_validate_slice_accepts_base() -> None:
    validate_slice(ResourceSlice.model_validate(BASE))


# -- API-server rules (pkg/apis/resource/validation, KEP-5075 requestPolicy) ------------------


def _one_device(**device: Any) -> dict[str, Any]:
    dev = {"name": "eth-a", "attributes": {"ifName": {"string": "eth0"}}, "capacity": {}} | device
    data = copy.deepcopy(BASE)
    data["spec"]["devices"] = [dev]
    return data


def _cap(value: str, policy: dict[str, Any] | None, shared: bool = True) -> dict[str, Any]:
    c: dict[str, Any] = {"value": value}
    if policy is not None:
        c["requestPolicy"] = policy
    return _one_device(capacity={"bandwidth": c}, **({"allowMultipleAllocations": True} if shared else {}))


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (
            _cap("10", {"default": "2", "validValues": ["2"], "validRange": {"min": "1"}}),
            "mutually exclusive",
        ),
        (_cap("10", {"validValues": ["2", "4"]}), "default: required when validValues"),
        (_cap("10", {"validRange": {"min": "2"}}), "default: required when validRange"),
        (_cap("10", {"default": "2", "validValues": ["4", "2"]}), "ascending order"),
        (_cap("10", {"default": "2", "validValues": ["2", "2"]}), "listed twice"),
        (
            _cap("100", {"default": "1", "validValues": [str(i) for i in range(1, 12)]}),
            "11 values, at most 10",
        ),
        (_cap("10", {"default": "2", "validValues": ["2", "12"]}), "12 is larger than the capacity value 10"),
        (_cap("10", {"default": "3", "validValues": ["2", "4"]}), "default: 3 is not one of validValues"),
        (
            _cap("10", {"default": "1", "validRange": {"min": "2"}}),
            "default: 1 is less than validRange.min 2",
        ),
        (
            _cap("10", {"default": "2", "validRange": {"min": "12"}}),
            "min: 12 is larger than the capacity value",
        ),
        (
            _cap("10", {"default": "5", "validRange": {"min": "2", "max": "4"}}),
            "default: 5 is more than validRange.max 4",
        ),
        (_cap("10", {"default": "4", "validRange": {"min": "4", "max": "2"}}), "max: 2 is less than min 4"),
        (
            _cap("10", {"default": "2", "validRange": {"min": "2", "max": "12"}}),
            "max: 12 is larger than the capacity value",
        ),
        (_cap("10", {"default": "2", "validRange": {"min": "2", "step": "9"}}), "one step 11 (min + step)"),
        (
            _cap("10", {"default": "3", "validRange": {"min": "2", "step": "2"}}),
            "default: 3 is not min 2 + a multiple of step 2",
        ),
        (
            _cap("10", {"default": "2", "validRange": {"min": "2", "step": "2", "max": "5"}}),
            "max: 5 is not min 2 + a multiple of step 2",
        ),
        (_cap("10", {"default": "2", "validRange": {"min": "2", "step": "0"}}), "step: 0 must be positive"),
        (_cap("-1", None), "value: -1 must not be negative"),
        (_cap("10", {"default": "1"}, shared=False), "allowed only when allowMultipleAllocations"),
        (_one_device(name="Eth_A"), "must be a DNS label"),
        (
            _one_device(attributes={"ifName": {"string": "eth0"}, "bad-name": {"int": 1}}),
            "must be a C identifier",
        ),
        (
            _one_device(attributes={"ifName": {"string": "eth0"}, "Bad_Domain/x": {"int": 1}}),
            "must be a DNS subdomain",
        ),
        (
            _one_device(attributes={"ifName": {"string": "eth0"}, "/x": {"int": 1}}),
            "domain must not be empty",
        ),
        (
            _one_device(attributes={"ifName": {"string": "eth0"}, "x" * 33: {"int": 1}}),
            "C identifier of at most 32",
        ),
        (_one_device(attributes={"ifName": {"string": "e" * 65}}), "longer than 64 characters"),
        (
            _one_device(attributes={"ifName": {"string": "eth0"}, "fw": {"version": "1.2"}}),
            "is not semver 2.0.0",
        ),
        (
            _one_device(attributes={"ifName": {"string": "eth0"}} | {f"a{i}": {"int": i} for i in range(32)}),
            "33 entries, at most 32",
        ),
        (_one_device(capacity={"bad-cap": {"value": "1"}}), "capacity.bad-cap: invalid name"),
    ],
)
def test_api_server_rules(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(InventoryError) as ei:
        parse_inventory(json.dumps(data), source="s.json")
    assert needle in ei.value.msg, ei.value.msg
    assert "device eth-a" in ei.value.msg or "Eth_A" in ei.value.msg


@pytest.mark.parametrize(
    "policy",
    [
        {"default": "1M", "validRange": {"min": "1M", "step": "8"}},
        {"default": "2", "validRange": {"min": "2", "step": "2", "max": "4"}},
        {"default": "1", "validValues": ["1", "3"]},
        {"default": "500m", "validRange": {"min": "250m", "step": "250m", "max": "1"}},
        {"default": "1"},
    ],
)
def test_valid_policies_accepted(policy: dict[str, Any]) -> None:
    data = _cap("10G" if "M" in json.dumps(policy) else "10", policy)
    parse_inventory(json.dumps(data), source="s.json")


@pytest.mark.parametrize(
    ("spec_change", "needle"),
    [
        ({"driver": "Bad_Driver"}, "spec.driver"),
        ({"pool": {"name": "n1", "resourceSliceCount": 0}}, "resourceSliceCount"),
        ({"pool": {"name": "n1", "generation": -1}}, "generation"),
        ({"pool": {"name": "Bad Pool"}}, "spec.pool.name"),
        ({"nodeName": ""}, "spec.nodeName"),
    ],
)
def test_slice_level_rules(spec_change: dict[str, Any], needle: str) -> None:
    data = copy.deepcopy(BASE)
    data["spec"].update(spec_change)
    with pytest.raises(InventoryError) as ei:
        parse_inventory(json.dumps(data), source="s.json")
    assert needle in ei.value.msg


def test_too_many_devices() -> None:
    data = copy.deepcopy(BASE)
    data["spec"]["devices"] = [
        {"name": f"d{i}", "attributes": {"ifName": {"string": f"e{i}"}}} for i in range(129)
    ]
    with pytest.raises(InventoryError, match="129 devices, at most 128"):
        parse_inventory(json.dumps(data), source="s.json")
