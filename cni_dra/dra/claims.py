"""Pydantic v2 models of the resource.k8s.io/v1 ResourceClaim, as cni-dra reads and writes it
(the same conventions as :mod:`cni_dra.dra.objects`: the fields cni-dra uses, camelCase
aliases, unknown fields ignored, frozen, built on first use).

A module of their own: the agent, its allocator and the CLI read claims; an in-process ADD
or DEL never does, and does not pay for defining these models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cni_dra.dra.objects import API_VERSION, ApiModel, ObjectMeta
from cni_dra.fields import empty_list
from cni_dra.quantity import QuantityField

__all__ = [
    "CELDeviceSelector",
    "DeviceSelector",
    "CapacityRequirements",
    "ExactDeviceRequest",
    "DeviceSubRequest",
    "DeviceRequest",
    "DeviceConstraint",
    "DeviceClaim",
    "ResourceClaimSpec",
    "DeviceRequestAllocationResult",
    "DeviceAllocationResult",
    "AllocationResult",
    "ResourceClaimConsumerReference",
    "NetworkDeviceData",
    "AllocatedDeviceStatus",
    "ResourceClaimStatus",
    "ResourceClaim",
]


class CELDeviceSelector(ApiModel):
    expression: str


class DeviceSelector(ApiModel):
    cel: CELDeviceSelector | None = None


class CapacityRequirements(ApiModel):
    """``capacity.requests``: capacity name (short or ``<driver>/name``) → quantity."""

    requests: dict[str, QuantityField] = Field(default_factory=dict)


AllocationMode = Literal["ExactCount", "All"]


class ExactDeviceRequest(ApiModel):
    device_class_name: str = ""
    selectors: list[DeviceSelector] | None = None
    allocation_mode: AllocationMode | None = None
    count: int | None = None
    admin_access: bool | None = None
    capacity: CapacityRequirements | None = None


class DeviceSubRequest(ApiModel):
    name: str
    device_class_name: str = ""
    selectors: list[DeviceSelector] | None = None
    allocation_mode: AllocationMode | None = None
    count: int | None = None
    capacity: CapacityRequirements | None = None


class DeviceRequest(ApiModel):
    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: list[DeviceSubRequest] | None = None


class DeviceConstraint(ApiModel):
    requests: list[str] | None = None
    match_attribute: str | None = None
    distinct_attribute: str | None = None


class DeviceClaim(ApiModel):
    requests: list[DeviceRequest] = Field(default_factory=empty_list)
    constraints: list[DeviceConstraint] = Field(default_factory=empty_list)


class ResourceClaimSpec(ApiModel):
    devices: DeviceClaim = Field(default_factory=DeviceClaim)


class DeviceRequestAllocationResult(ApiModel):
    """One entry of ``status.allocation.devices.results``.

    ``request`` is ``<request>`` or ``<request>/<subrequest>``; ``consumedCapacity``
    and ``shareID`` are set only for devices with ``allowMultipleAllocations``.
    """

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    consumed_capacity: dict[str, QuantityField] | None = None
    share_id: str | None = Field(default=None, alias="shareID")


class DeviceAllocationResult(ApiModel):
    results: list[DeviceRequestAllocationResult] = Field(default_factory=empty_list)
    config: list[dict[str, Any]] | None = None


class AllocationResult(ApiModel):
    """``status.allocation`` (``nodeSelector`` kept as opaque JSON)."""

    devices: DeviceAllocationResult = Field(default_factory=DeviceAllocationResult)
    node_selector: dict[str, Any] | None = None
    allocation_timestamp: str | None = None


class ResourceClaimConsumerReference(ApiModel):
    api_group: str | None = None
    resource: str
    name: str
    uid: str


class NetworkDeviceData(ApiModel):
    """KEP-4817 ``networkData`` of an allocated device."""

    interface_name: str | None = None
    ips: list[str] | None = None
    hardware_address: str | None = None


class AllocatedDeviceStatus(ApiModel):
    """``status.devices[]``: keyed by (driver, pool, device, shareID)."""

    driver: str
    pool: str
    device: str
    share_id: str | None = Field(default=None, alias="shareID")
    conditions: list[dict[str, Any]] | None = None
    data: Any = None
    network_data: NetworkDeviceData | None = None


class ResourceClaimStatus(ApiModel):
    allocation: AllocationResult | None = None
    reserved_for: list[ResourceClaimConsumerReference] | None = None
    devices: list[AllocatedDeviceStatus] | None = None


class ResourceClaim(ApiModel):
    api_version: str = API_VERSION
    kind: str = "ResourceClaim"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ResourceClaimSpec = Field(default_factory=ResourceClaimSpec)
    status: ResourceClaimStatus | None = None
