"""load_inventory keeps the validated slice per process and re-reads a changed file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_dra.dra import inventory
from cni_dra.dra.inventory import load_inventory
from cni_dra.errors import InventoryError
from tests.builders import device, resource_slice


def _slice(name: str, ifname: str) -> dict[str, Any]:
    return resource_slice([device(name, ifname, None, shared=False)], driver="nic.cni-dra.io", pool="n1")


def _devices(path: Path) -> list[tuple[str, Any]]:
    s = load_inventory(str(path))
    return [(d.name, d.attributes["ifName"].string_value) for d in s.spec.devices]


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Sources parse_inventory was called for (the expensive step the cache skips)."""
    calls: list[str] = []
    real = inventory.parse_inventory

    def spy(text: str, source: str = "<inventory>", **kw: Any) -> Any:
        calls.append(source)
        return real(text, source, **kw)

    monkeypatch.setattr(inventory, "parse_inventory", spy)
    return calls


def test_unchanged_file_is_parsed_once(tmp_path: Path, parses: list[str]) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("eth-a", "eth0")))
    first = load_inventory(str(path))
    second = load_inventory(str(path))
    assert second is first
    assert parses == [str(path)]


def test_rewrite_in_place_with_same_size_and_mtime_is_read_again(tmp_path: Path, parses: list[str]) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("eth-a", "eth0")))
    st = os.stat(path)
    assert _devices(path) == [("eth-a", "eth0")]
    with open(path, "r+b") as fh:  # same inode, same size; mtime put back to the old value
        fh.write(json.dumps(_slice("eth-b", "eth1")).encode())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert _devices(path) == [("eth-b", "eth1")]
    assert len(parses) == 2


def test_replaced_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("eth-a", "eth0")))
    assert _devices(path) == [("eth-a", "eth0")]
    new = tmp_path / "slice.json.new"
    new.write_text(json.dumps(_slice("eth-c", "eth9")))
    os.replace(new, path)
    assert _devices(path) == [("eth-c", "eth9")]


def test_a_file_that_became_invalid_fails_and_is_not_served_from_cache(tmp_path: Path) -> None:
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(_slice("eth-a", "eth0")))
    load_inventory(str(path))
    path.write_text("{not json")
    with pytest.raises(InventoryError):
        load_inventory(str(path))
    with pytest.raises(InventoryError):  # failures are not cached either: still refused
        load_inventory(str(path))


def test_plugin_rules_are_part_of_the_key(tmp_path: Path) -> None:
    data = _slice("eth-a", "eth0")
    del data["spec"]["devices"][0]["attributes"]
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(data))
    assert load_inventory(str(path), plugin_rules=False).spec.devices[0].name == "eth-a"
    with pytest.raises(InventoryError, match="ifName"):
        load_inventory(str(path))
