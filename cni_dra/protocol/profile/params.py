"""The parameters type of cni-dra's DRA configuration (``net.cni-dra.dev/v1alpha1``
``InterfaceConfig``) and the interface profile it carries: strict (unknown fields refused),
each field checked on its own and against the profile's own ``linkType``. The mode tables
and the MAC rule are :mod:`cni_dra.iface`'s, as for the plugin config.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cni_dra.errors import InvalidConfigError
from cni_dra.iface import CONFIG_MACVLAN_MODES, IPVLAN_FLAGS, IPVLAN_MODES, mac_field

__all__ = [
    "API_VERSION",
    "KIND",
    "LINK_TYPES",
    "LINK_FIELDS",
    "MAX_BURST_BYTES",
    "ShapingProfile",
    "InterfaceProfile",
    "InterfaceConfig",
    "parse_interface_config",
    "validation_errors",
]

API_VERSION = "net.cni-dra.dev/v1alpha1"
"""The ``apiVersion`` of the parameters type (the only one so far)."""
KIND = "InterfaceConfig"

_MODES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"macvlan": CONFIG_MACVLAN_MODES, "ipvlan": tuple(IPVLAN_MODES)}
)
LINK_TYPES: tuple[str, ...] = tuple(_MODES)
"""Link types a profile may name (those the plugin config's ``linkType`` takes)."""
LINK_FIELDS: tuple[str, ...] = ("mode", "ipvlanFlag", "mac")
"""The fields that mean something for one link type only."""
MAX_BURST_BYTES = 2**32 - 1
"""The largest burst override (tbf keeps it in 32 bits)."""
_ANY_MODE = frozenset(m for modes in _MODES.values() for m in modes)
_PARENT_KEYS = frozenset({"master", "parent", "device", "pool", "ifName", "interface", "nic"})


class ShapingProfile(BaseModel):
    """``shaping``: on or off, and the token-bucket overrides of the plugin config's ``shaping``
    (bursts in bytes, the queue's ``latencySeconds``); None: the lower layer's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool | None = Field(default=None, strict=True)
    ingressBurstBytes: int | None = Field(default=None, ge=1, le=MAX_BURST_BYTES, strict=True)
    egressBurstBytes: int | None = Field(default=None, ge=1, le=MAX_BURST_BYTES, strict=True)
    latencySeconds: float | None = Field(default=None, gt=0, le=10, allow_inf_nan=False, strict=True)

    @model_validator(mode="after")
    def _off_is_off(self) -> ShapingProfile:
        if self.enabled is False and self.overrides():
            raise ValueError("burst and latency overrides cannot go with enabled: false")
        return self

    def overrides(self) -> dict[str, Any]:
        """The bursts and latency this sets, by config key."""
        return {k: v for k, v in self.model_dump(exclude={"enabled"}).items() if v is not None}


class InterfaceProfile(BaseModel):
    """The interface a profile asks for; a field left None is the lower layer's (package
    docstring). Checked against its own ``linkType`` when it names one (a mode of the other
    type, an ipvlan flag on a macvlan, a MAC on an ipvlan are refused); without one, each
    value must fit some link type, and the layers it is laid over complete it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    linkType: str | None = Field(default=None, strict=True)
    mode: str | None = Field(default=None, strict=True)
    ipvlanFlag: str | None = Field(default=None, strict=True)
    mtu: int | None = Field(default=None, ge=68, le=65535, strict=True)
    mac: str | None = Field(default=None, strict=True)
    shaping: ShapingProfile | None = None

    @field_validator("linkType")
    @classmethod
    def _link_type(cls, v: str | None) -> str | None:
        if v is not None and v not in LINK_TYPES:
            raise ValueError(f"{v!r} is not supported (supported: {', '.join(LINK_TYPES)})")
        return v

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str | None) -> str | None:
        return mac_field(v)

    @model_validator(mode="after")
    def _fits_link_type(self) -> InterfaceProfile:
        kind = self.linkType
        if self.mode is not None and self.mode not in _MODES.get(kind or "", _ANY_MODE):
            modes = _MODES[kind] if kind else sorted(_ANY_MODE)
            what = {"macvlan": "a macvlan mode", "ipvlan": "an ipvlan mode"}.get(kind or "", "a mode")
            raise ValueError(f"mode {self.mode!r} is not {what} (one of {', '.join(modes)})")
        if self.ipvlanFlag is not None and self.ipvlanFlag not in IPVLAN_FLAGS:
            raise ValueError(f"ipvlanFlag {self.ipvlanFlag!r} is not one of {', '.join(IPVLAN_FLAGS)}")
        if kind == "macvlan" and self.ipvlanFlag is not None:
            raise ValueError("ipvlanFlag applies to linkType ipvlan only")
        if kind == "ipvlan" and self.mac is not None:
            raise ValueError("mac cannot be set for linkType ipvlan (an ipvlan has its parent's MAC)")
        return self

    def set_fields(self) -> dict[str, Any]:
        """The fields this sets (not None), ``shaping`` as its own set fields."""
        return self.model_dump(exclude_none=True)


class InterfaceConfig(InterfaceProfile):
    """The parameters type: an :class:`InterfaceProfile` with its ``apiVersion`` and ``kind``."""

    apiVersion: str = Field(strict=True)
    kind: str = Field(strict=True)

    @field_validator("apiVersion")
    @classmethod
    def _api_version(cls, v: str) -> str:
        if v != API_VERSION:
            raise ValueError(f"{v!r} is not supported (supported: {API_VERSION})")
        return v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v != KIND:
            raise ValueError(f"{v!r} is not {KIND}")
        return v

    def profile(self) -> InterfaceProfile:
        """The interface fields, without ``apiVersion`` and ``kind``."""
        return InterfaceProfile.model_validate(self.model_dump(exclude={"apiVersion", "kind"}))


def validation_errors(exc: ValidationError) -> str:
    """pydantic's errors as ``field: problem; ...``, unknown fields named as such (and a
    field that tries to name the parent NIC told why it cannot)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            hint = (
                " (the parent NIC is the allocated device: a profile cannot name it)"
                if loc in _PARENT_KEYS
                else ""
            )
            parts.append(f"unknown field {loc!r}{hint}")
        elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):  # an object was expected
            what = f"must be an object, not {json.dumps(err['input'], default=str)[:80]}"
            parts.append(f"{loc}: {what}" if loc else what)
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"].endswith("_type") or err["type"].endswith("_parsing"):  # say what was given
                msg += f", not {json.dumps(err['input'], default=str)[:80]}"
            parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def parse_interface_config(parameters: Any) -> InterfaceConfig:
    """``parameters`` (opaque JSON of a config entry) as an :class:`InterfaceConfig`.

    Raises:
        InvalidConfigError: (7) not an object, unknown fields, or a bad value; the message
            names each field.
    """
    if not isinstance(parameters, Mapping):
        raise InvalidConfigError(
            f"parameters must be an {KIND} object, not {json.dumps(parameters, default=str)[:80]}"
        )
    try:
        return InterfaceConfig.model_validate(dict(parameters))
    except ValidationError as exc:
        raise InvalidConfigError(validation_errors(exc)) from exc  # the message names every field
