"""The models' list fields default to a new list per instance from a Python function, whose
signature pydantic reads without parsing a builtin's text signature (cni_dra.fields)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

import pydantic
import pytest

import cni_dra.dra
import cni_dra.protocol
import cni_dra.state
from cni_dra.dra.claims import DeviceClaim
from cni_dra.fields import empty_list
from cni_dra.protocol.config import DNSConfig
from cni_dra.state.frozen import FrozenList, empty_frozen_list
from cni_dra.state.schema import NodeState

# the packages that define pydantic models
MODEL_PACKAGES = (cni_dra.protocol, cni_dra.dra, cni_dra.state)


def _models() -> Iterator[type[pydantic.BaseModel]]:
    for package in MODEL_PACKAGES:
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if (
                    isinstance(obj, type)
                    and issubclass(obj, pydantic.BaseModel)
                    and obj.__module__ == info.name
                ):
                    yield obj


def test_no_model_field_defaults_through_a_list_type():
    """``list`` (or a subclass) as a default factory has pydantic tokenize its text signature."""
    models = list(_models())
    assert DNSConfig in models and NodeState in models and DeviceClaim in models  # not vacuous
    listy = [
        f"{model.__module__}.{model.__qualname__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if isinstance(field.default_factory, type) and issubclass(field.default_factory, list)
    ]
    assert listy == []


def test_pydantic_calls_the_factories_without_the_validated_data():
    for factory in (empty_list, empty_frozen_list):
        assert pydantic.Field(default_factory=factory).default_factory_takes_validated_data is False


def test_each_instance_gets_its_own_list():
    a, b = DNSConfig(), DNSConfig.model_validate({})
    assert a.nameservers == a.search == a.options == [] and type(a.nameservers) is list
    assert len({id(a.nameservers), id(a.search), id(a.options), id(b.nameservers)}) == 4
    assert DeviceClaim().requests == [] and DeviceClaim().requests is not DeviceClaim().requests


def test_the_states_default_status_records_are_a_new_read_only_list():
    one, two = NodeState(), NodeState()
    assert type(one.statusUpdates) is FrozenList and one.statusUpdates == []
    assert one.statusUpdates is not two.statusUpdates
    with pytest.raises(TypeError, match="read-only"):
        one.statusUpdates.append({})
    assert type(empty_frozen_list()) is FrozenList and empty_frozen_list() is not empty_frozen_list()
