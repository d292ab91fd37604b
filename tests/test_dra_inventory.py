"""Inventory loading and validation: errors name device, field and rule."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_dra.dra.inventory import load_inventory, parse_inventory, slice_to_dict, validate_slice
from cni_dra.dra.models import ResourceSlice
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
                "capacity": {"bandwidth": {"value": "10G", "requestPolicy": {"default": "1G", "validRange": {"min": "1M"}}}},
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
        (_mutated(spec__devices__0__capacity__bandwidth__value="10 G"), ["device eth-a", "capacity.bandwidth.value", "invalid quantity"]),
        (_mutated(spec__devices__0__allowMultipleAllocations=None), ["device eth-a", "requestPolicy: allowed only when allowMultipleAllocations"]),
        (_mutated(spec__devices__1__name="eth-a"), ["device eth-a", "duplicate device name"]),
        (_mutated(spec__devices__1__attributes={}), ["device eth-b", "ifName", "missing"]),
        (_mutated(spec__devices__1__attributes={"ifName": {"string": "eth0"}}), ["device eth-b", "eth0", "already used by device eth-a"]),
        (_mutated(spec__devices__1__attributes={"ifName": {"int": 3}}), ["device eth-b", "ifName", "non-empty string"]),
        (_mutated(spec__devices__0__attributes={"ifName": {"string": "eth0", "int": 1}}), ["device eth-a", "attributes.ifName", "exactly one"]),
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


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "spec: [unclosed", "42"])
def test_undecodable_is_inventory_error(text: str) -> None:
    with pytest.raises(InventoryError):
        parse_inventory(text, source="s.yaml")


def test_validate_slice_accepts_base() -> None:
    validate_slice(ResourceSlice.model_validate(BASE))
