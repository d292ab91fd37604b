"""The node's NIC inventory: one resource.k8s.io/v1 ResourceSlice in a YAML or JSON file.

:func:`load_inventory` reads and validates it; :func:`validate_slice` applies the
rules the API server applies to a ResourceSlice (k8s.io/kubernetes
pkg/apis/resource/validation, KEP-5075 for capacities) plus cni-dra's own: every
device names its host interface in the ``ifName`` attribute, once per node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from cni_dra.dra.models import Device, DeviceCapacity, ResourceSlice, device_attribute, to_api
from cni_dra.errors import InventoryError, IOFailureError
from cni_dra.quantity import Quantity

__all__ = [
    "IFNAME_ATTRIBUTE",
    "load_inventory",
    "parse_inventory",
    "validate_slice",
    "slice_to_dict",
    "device_problems",
]

#: The attribute holding a device's host interface name (short or ``<driver>/ifName``).
IFNAME_ATTRIBUTE = "ifName"

_MAX_VALID_VALUES = 10
_MAX_ATTRIBUTES_AND_CAPACITIES = 32
_MAX_DEVICES = 128
# DNS-1123 label (device and pool names), C identifier (qualified name identifier),
# DNS-1123 subdomain (qualified name domain, driver).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)


def load_inventory(path: str) -> ResourceSlice:
    """Read, parse and validate the ResourceSlice at ``path`` (JSON, or YAML otherwise).

    JSON is recognised by a ``.json`` suffix or a leading ``{``; anything else is
    parsed as YAML (PyYAML is imported only then).

    Raises :class:`~cni_dra.errors.IOFailureError` (code 5) when the file cannot be
    read, :class:`~cni_dra.errors.InventoryError` (code 7) when it is not a valid
    ResourceSlice; the message names the device and the field.
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise IOFailureError(f"failed to read inventory {path}: {exc.strerror or exc}", str(exc)) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"failed to load inventory {path}: not UTF-8 text", str(exc)) from exc
    return parse_inventory(text, source=path)


def parse_inventory(text: str, source: str = "<inventory>") -> ResourceSlice:
    """Parse and validate a ResourceSlice from JSON or YAML ``text``.

    Raises :class:`~cni_dra.errors.InventoryError` (code 7).
    """
    data: Any
    if source.endswith(".json") or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InventoryError(f"failed to load inventory {source}: invalid JSON: {exc}", str(exc)) from exc
    else:
        import yaml  # lazy: only YAML inventories pay for it

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InventoryError(f"failed to load inventory {source}: invalid YAML: {exc}", str(exc)) from exc
    if not isinstance(data, dict):
        raise InventoryError(f"failed to load inventory {source}: expected a ResourceSlice object")
    kind = data.get("kind", "ResourceSlice")
    if kind != "ResourceSlice":
        raise InventoryError(f"failed to load inventory {source}: kind is {kind!r}, expected 'ResourceSlice'")
    try:
        slice_ = ResourceSlice.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(
            f"failed to load inventory {source}: {_describe_validation_error(exc, data)}", str(exc)
        ) from exc
    try:
        validate_slice(slice_)
    except InventoryError as exc:
        raise InventoryError(f"failed to load inventory {source}: {exc.msg}", exc.details) from exc
    return slice_


def _describe_validation_error(exc: ValidationError, data: dict[str, Any]) -> str:
    """'device eth-a: capacity.bandwidth.value: invalid quantity ...' for the first error."""
    err = exc.errors(include_url=False)[0]
    loc = list(err["loc"])
    where = ".".join(str(p) for p in loc)
    if len(loc) >= 3 and loc[0] == "spec" and loc[1] == "devices" and isinstance(loc[2], int):
        devices = data.get("spec", {}).get("devices", [])
        name: Any = None
        if loc[2] < len(devices) and isinstance(devices[loc[2]], dict):
            name = devices[loc[2]].get("name")
        field = ".".join(str(p) for p in loc[3:]) or "(device)"
        who = f"device {name}" if name else f"device #{loc[2]}"
        return f"{who}: {field}: {_clean(err['msg'])}"
    return f"{where}: {_clean(err['msg'])}"


def _clean(msg: str) -> str:
    return msg.removeprefix("Value error, ")


def slice_to_dict(slice_: ResourceSlice) -> dict[str, Any]:
    """API-shaped JSON dict of ``slice_`` (camelCase, no nulls, canonical quantities)."""
    return to_api(slice_)


def validate_slice(slice_: ResourceSlice) -> None:
    """Apply the inventory rules; raise :class:`~cni_dra.errors.InventoryError` (code 7).

    The message lists every problem found, each naming device, field and rule.
    """
    problems = list(_slice_problems(slice_))
    if problems:
        raise InventoryError("invalid ResourceSlice: " + "; ".join(problems))


def _slice_problems(slice_: ResourceSlice) -> Iterable[str]:
    spec = slice_.spec
    driver = spec.driver
    seen_names: set[str] = set()
    seen_ifnames: dict[str, str] = {}
    for device in spec.devices:
        if device.name in seen_names:
            yield f"device {device.name}: name: duplicate device name"
        seen_names.add(device.name)
        yield from (f"device {device.name}: {p}" for p in device_problems(device, driver))
        ifname = device_attribute(device, IFNAME_ATTRIBUTE, driver)
        if ifname is None:
            yield f"device {device.name}: attributes.{IFNAME_ATTRIBUTE}: required attribute missing"
        elif not isinstance(ifname, str) or not ifname:
            yield f"device {device.name}: attributes.{IFNAME_ATTRIBUTE}: must be a non-empty string"
        elif ifname in seen_ifnames:
            yield (
                f"device {device.name}: attributes.{IFNAME_ATTRIBUTE}: interface {ifname} "
                f"already used by device {seen_ifnames[ifname]}"
            )
        else:
            seen_ifnames[ifname] = device.name


def device_problems(device: Device, driver: str) -> list[str]:
    """The API-server rules one device breaks, each as ``"<field>: <rule>"``."""
    problems: list[str] = []
    for name, cap in device.capacity.items():
        problems.extend(f"capacity.{name}: {p}" for p in _capacity_problems(device, cap))
    return problems


def _capacity_problems(device: Device, cap: DeviceCapacity) -> list[str]:
    out: list[str] = []
    if cap.value < Quantity.ZERO:
        out.append(f"value {cap.value} must not be negative")
    policy = cap.request_policy
    if policy is None:
        return out
    if not device.shared:
        out.append("requestPolicy is allowed only when allowMultipleAllocations is true")
    return out
