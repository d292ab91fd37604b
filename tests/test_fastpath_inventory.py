"""The ADD path parses a YAML inventory with libyaml's safe loader when PyYAML has it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cni_dra.dra import inventory
from cni_dra.errors import InventoryError

EXAMPLE = Path(__file__).resolve().parent.parent / "conf" / "resourceslice.yaml"


def test_yaml_inventory_uses_the_c_safe_loader(monkeypatch):
    used = []

    class Spy(yaml.SafeLoader):
        def __init__(self, stream):
            used.append(type(self))
            super().__init__(stream)

    monkeypatch.setattr(yaml, "CSafeLoader", Spy)
    inventory.parse_inventory(EXAMPLE.read_text(), source=str(EXAMPLE))
    assert used == [Spy]


def test_c_and_python_safe_loaders_agree_on_the_example():
    text = EXAMPLE.read_text()
    assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.load(text, Loader=yaml.SafeLoader)


def test_yaml_tags_beyond_safe_are_still_refused():
    with pytest.raises(InventoryError):
        inventory.parse_inventory("!!python/object/apply:os.system ['true']\n", source="x.yaml")
