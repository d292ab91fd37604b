"""Pydantic v2 models of the resource.k8s.io/v1 objects cni-dra reads and writes: the base
model and ``ObjectMeta``, the ResourceSlice (the node's inventory) and the helpers over
devices; the ResourceClaim's models are in :mod:`cni_dra.dra.claims` (an in-process ADD
or DEL never reads a claim, so it does not define them).

Only the fields cni-dra uses are modelled; every other field of the API objects is
ignored on input (``extra="ignore"``), so real ResourceSlices and ResourceClaims load
as they are. Field names are snake_case in Python and the API's camelCase as aliases;
both spellings are accepted on input. ``model_dump(by_alias=True, exclude_none=True)``
(or :func:`to_api`) gives API-shaped JSON with quantities as canonical strings.

Models are frozen: the allocator treats them as values. Source: the resource.k8s.io/v1
API (k8s.io/api/resource/v1 types.go) and KEP-5075 (consumable capacity).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator
from pydantic.alias_generators import to_camel

from cni_dra.fields import empty_list
from cni_dra.quantity import QuantityField

__all__ = [
    "API_VERSION",
    "ApiModel",
    "ObjectMeta",
    "DeviceAttribute",
    "CapacityRequestPolicyRange",
    "CapacityRequestPolicy",
    "DeviceCapacity",
    "Device",
    "ResourcePool",
    "ResourceSliceSpec",
    "ResourceSlice",
    "AttributeValue",
    "device_attribute",
    "lookup_device_attribute",
    "split_qualified_name",
    "to_api",
]

API_VERSION = "resource.k8s.io/v1"

AttributeValue = str | int | bool


class ApiModel(BaseModel):
    """Base: camelCase aliases, both spellings accepted, unknown fields ignored, frozen.

    Each model's validator is built on its first use (``defer_build``), so a process builds
    only the models it validates: an in-process ADD the ResourceSlice's.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        defer_build=True,
    )


def to_api(model: BaseModel) -> dict[str, Any]:
    """API-shaped JSON-compatible dict of ``model`` (camelCase, no nulls, quantity strings)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class ObjectMeta(ApiModel):
    """The parts of metav1.ObjectMeta cni-dra uses."""

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


# --- ResourceSlice -------------------------------------------------------------------


class DeviceAttribute(ApiModel):
    """One typed attribute value; exactly one of string/int/bool/version is set."""

    string_value: StrictStr | None = Field(default=None, alias="string")
    int_value: StrictInt | None = Field(default=None, alias="int")
    bool_value: StrictBool | None = Field(default=None, alias="bool")
    version_value: StrictStr | None = Field(default=None, alias="version")

    @model_validator(mode="after")
    def _exactly_one(self) -> DeviceAttribute:
        n = sum(
            v is not None for v in (self.string_value, self.int_value, self.bool_value, self.version_value)
        )
        if n != 1:
            raise ValueError("exactly one of string, int, bool, version must be set")
        return self

    @property
    def value(self) -> AttributeValue:
        """The Python value (a version is returned as its string)."""
        for v in (self.string_value, self.int_value, self.bool_value, self.version_value):
            if v is not None:
                return v
        raise AssertionError("unreachable: validated to hold one value")  # pragma: no cover

    @classmethod
    def of(cls, value: AttributeValue) -> DeviceAttribute:
        """Build from a Python str/int/bool (str becomes ``string``)."""
        if isinstance(value, bool):
            return cls(bool_value=value)
        if isinstance(value, int):
            return cls(int_value=value)
        return cls(string_value=value)


class CapacityRequestPolicyRange(ApiModel):
    """``validRange``: ``min`` (required), optional ``max`` and ``step`` (KEP-5075)."""

    min: QuantityField
    max: QuantityField | None = None
    step: QuantityField | None = None


class CapacityRequestPolicy(ApiModel):
    """``requestPolicy`` of a consumable capacity (KEP-5075)."""

    default: QuantityField | None = None
    valid_values: list[QuantityField] | None = None
    valid_range: CapacityRequestPolicyRange | None = None


class DeviceCapacity(ApiModel):
    """``capacity.<name>``: total ``value`` and optional ``requestPolicy``."""

    value: QuantityField
    request_policy: CapacityRequestPolicy | None = None


class Device(ApiModel):
    """One device of a ResourceSlice (here: one host NIC)."""

    name: str
    attributes: dict[str, DeviceAttribute] = Field(default_factory=dict)
    capacity: dict[str, DeviceCapacity] = Field(default_factory=dict)
    allow_multiple_allocations: bool | None = None

    @property
    def shared(self) -> bool:
        """True when ``allowMultipleAllocations`` is set: capacities are consumable."""
        return bool(self.allow_multiple_allocations)


class ResourcePool(ApiModel):
    name: str
    generation: int = 0
    resource_slice_count: int = 1


class ResourceSliceSpec(ApiModel):
    driver: str
    node_name: str | None = None
    all_nodes: bool | None = None
    pool: ResourcePool
    devices: list[Device] = Field(default_factory=empty_list)


class ResourceSlice(ApiModel):
    api_version: str = API_VERSION
    kind: str = "ResourceSlice"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ResourceSliceSpec


# --- helpers -------------------------------------------------------------------------


def split_qualified_name(name: str) -> tuple[str | None, str]:
    """``"dom/id"`` → ``("dom", "id")``; ``"id"`` → ``(None, "id")``."""
    domain, sep, ident = name.partition("/")
    if not sep:
        return None, name
    return domain, ident


def lookup_device_attribute(device: Device, name: str, driver: str) -> DeviceAttribute | None:
    """Like :func:`device_attribute` but returns the typed :class:`DeviceAttribute`.

    Typed values compare by type and value (``int 1`` differs from ``bool true`` and
    a ``version`` from an equal ``string``), as constraints need.
    """
    attrs = device.attributes
    domain, ident = split_qualified_name(name)
    if domain is None or domain == driver:
        for key in (f"{driver}/{ident}", ident):
            if key in attrs:
                return attrs[key]
        return None
    return attrs.get(name)


def device_attribute(device: Device, name: str, driver: str) -> AttributeValue | None:
    """The value of attribute ``name`` of ``device``, or None when it has none.

    ``name`` may be short (``ifName``) or qualified (``<domain>/ifName``). A short
    name, or one qualified with the device's own ``driver`` as domain, matches both
    spellings in the slice, the driver-qualified entry taking precedence (the DRA
    CEL environment and constraints resolve names the same way). A name qualified
    with another domain matches only itself.
    """
    attr = lookup_device_attribute(device, name, driver)
    return None if attr is None else attr.value
