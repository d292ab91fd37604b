"""The cni-dra plugin's network configuration: parse, fill defaults, validate, apply precedence.

Source: CNI spec 1.1.0, section "Section 1: Network configuration format" (well-known
keys ``cniVersion``, ``name``, ``type``, ``capabilities``, ``ipam``, ``dns``, ``args``) and
"Section 3" (``runtimeConfig``, ``prevResult`` injected by the runtime). Plugin keys are
documented in README "Config reference".

Precedence (one place, :func:`load_conf`): file < ``CNI_ARGS`` < ``runtimeConfig`` (a
runtimeConfig key is honoured only when its capability is declared in ``capabilities``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cni_dra.errors import (
    DecodeError,
    InvalidConfigError,
    UnsupportedFieldError,
)
from cni_dra.fields import empty_list
from cni_dra.iface import CONFIG_MACVLAN_MODES, IPVLAN_FLAGS, IPVLAN_MODES, mac_field
from cni_dra.protocol.env import CniEnv
from cni_dra.protocol.profile.limits import ProfileLimits
from cni_dra.protocol.versions import check_supported
from cni_dra.quantity import QuantityField

__all__ = [
    "MAX_CONFIG_BYTES",
    "DEFAULT_DRIVER",
    "DEFAULT_STATE_DIR",
    "DEFAULT_INVENTORY",
    "LINK_TYPES",
    "CapacityRequest",
    "DeviceSelector",
    "DEFAULT_SHAPING_CAPACITY",
    "DEFAULT_SHAPING_LATENCY_S",
    "ShapingConfig",
    "RuntimeBandwidth",
    "runtime_bandwidth_keys",
    "GC_ATTACHMENT_KEYS",
    "gc_attachments",
    "NetConf",
    "load_conf",
    "peek_cni_version",
]

log = logging.getLogger("cni_dra.protocol.config")

MAX_CONFIG_BYTES = 1 << 20
"""Largest network configuration accepted on stdin (bytes)."""

DEFAULT_DRIVER = "net.cni-dra.dev"
DEFAULT_STATE_DIR = "/var/lib/cni-dra"
DEFAULT_INVENTORY = "/etc/cni-dra/resourceslice.yaml"

LINK_TYPES: tuple[str, ...] = ("macvlan", "ipvlan")
"""``linkType`` values: the kind of link created in the pod netns."""


class CapacityRequest(BaseModel):
    """Same shape as a resource.k8s.io/v1 claim request's ``capacity`` (KEP-5075):
    ``{"requests": {"bandwidth": "4G"}}``; bandwidth in bits per second."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: dict[str, QuantityField] = Field(default_factory=dict)

    @field_validator("requests")
    @classmethod
    def _not_negative(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name, q in v.items():
            if q.sign() < 0:
                raise ValueError(f"capacity request {name} {q} is negative")
        return v


class DNSConfig(BaseModel):
    """CNI ``dns`` (spec 1.1.0 "Network configuration"): nameservers, domain, search, options."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    nameservers: list[str] = Field(default_factory=empty_list)
    domain: str = ""
    search: list[str] = Field(default_factory=empty_list)
    options: list[str] = Field(default_factory=empty_list)


class IpamConfig(BaseModel):
    """``ipam``: ``type`` names the IPAM plugin on CNI_PATH; the rest is that plugin's own."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str | None = Field(default=None, strict=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class CELSelector(BaseModel):
    """``{"expression": "<CEL>"}`` evaluated against each device (resource.k8s.io/v1 CELDeviceSelector)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    expression: str = Field(min_length=1, max_length=10240)


class DeviceSelector(BaseModel):
    """``{"cel": {...}}``, as in a v1 claim request's ``selectors[]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cel: CELSelector


DEFAULT_SHAPING_CAPACITY = "bandwidth"
"""The capacity that shapes both directions when ``shaping`` names none."""
DEFAULT_SHAPING_LATENCY_S = 0.025
"""Default ``shaping.latencySeconds``: the longest a packet waits in a shaping queue (25 ms,
the reference bandwidth plugin's)."""
_MAX_U32 = 2**32 - 1
_MAX_U64 = 2**64 - 1
# A resource.k8s.io/v1 capacity name: [<DNS subdomain>/]<C identifier>, identifier <= 32,
# domain <= 63 characters (the inventory checks the same rule on the device side).
_CAPACITY_NAME = re.compile(
    r"(?:(?=[^/]{1,63}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]{0,31}",
    re.ASCII,
)


class ShapingConfig(BaseModel):
    """``shaping`` as an object: which consumed capacity sets which direction's rate, and the
    token bucket overrides. ``"shaping": true`` is this with every default, ``false`` no
    shaping at all.

    * ``capacity`` (default :data:`DEFAULT_SHAPING_CAPACITY`): one capacity whose consumed
      amount (bits per second) is the rate of both directions; or
    * ``ingressCapacity`` / ``egressCapacity``: one capacity per direction (what the pod
      receives / sends), exclusive with ``capacity``; a direction without one is not shaped.
    * ``ingressBurstBytes`` / ``egressBurstBytes``: the token bucket of that direction in
      bytes (default: 2 ms of the rate, at least 128 KiB); ADD checks it against the rate
      and the link's MTU (:mod:`cni_dra.netlink.tbf`), and the names against the device's
      capacities (:mod:`cni_dra.attach.shaping_plan`);
    * ``latencySeconds``: the longest a packet waits in the queue behind a full bucket (the
      queue limit; default :data:`DEFAULT_SHAPING_LATENCY_S`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    capacity: str | None = Field(default=None, strict=True)
    ingressCapacity: str | None = Field(default=None, strict=True)
    egressCapacity: str | None = Field(default=None, strict=True)
    ingressBurstBytes: int | None = Field(default=None, ge=1, le=_MAX_U32, strict=True)
    egressBurstBytes: int | None = Field(default=None, ge=1, le=_MAX_U32, strict=True)
    latencySeconds: float = Field(default=DEFAULT_SHAPING_LATENCY_S, gt=0, le=10, allow_inf_nan=False)

    @field_validator("capacity", "ingressCapacity", "egressCapacity")
    @classmethod
    def _capacity_name(cls, v: str | None) -> str | None:
        if v is not None and not _CAPACITY_NAME.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a capacity name ([<DNS subdomain>/]<C identifier of at most 32 characters>)"
            )
        return v

    @model_validator(mode="after")
    def _one_way_to_name_capacities(self) -> ShapingConfig:
        if self.capacity is not None and (
            self.ingressCapacity is not None or self.egressCapacity is not None
        ):
            raise ValueError(
                "capacity (both directions) and ingressCapacity/egressCapacity (one each) are exclusive"
            )
        return self

    @property
    def capacities(self) -> tuple[str | None, str | None]:
        """(egress capacity name, ingress capacity name); None: that direction is not shaped."""
        if self.ingressCapacity is None and self.egressCapacity is None:
            name = self.capacity or DEFAULT_SHAPING_CAPACITY
            return name, name
        return self.egressCapacity, self.ingressCapacity


def runtime_bandwidth_keys(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``runtimeConfig.bandwidth`` with its keys matched to :class:`RuntimeBandwidth`'s fields
    as Go's JSON decoding (and so the reference bandwidth plugin) matches them: the exact
    name, else the same name in another case (ASCII), a later key winning over an earlier
    one for the same field. containerd sends Go's field names (``IngressRate``,
    ``EgressBurst``...), CRI-O the conventions' (``ingressRate``...). Returns (the value
    by field name, the keys that match no field)."""
    fields = {name.lower(): name for name in RuntimeBandwidth.model_fields}
    out: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in raw.items():
        name = fields.get(key.lower()) if isinstance(key, str) and key.isascii() else None
        if name is None:
            unknown.append(str(key))
        else:
            out[name] = value
    return out, unknown


GC_ATTACHMENT_KEYS = ("containerID", "ifname")
"""The keys of an entry of GC's ``cni.dev/valid-attachments`` (CNI spec 1.1.0 "GC"; libcni's
``GCAttachment``)."""


def gc_attachments(raw: Any) -> list[dict[str, str]]:
    """GC's list of valid attachments (``cni.dev/valid-attachments`` or ``cni.dev/attachments``)
    as ``[{"containerID", "ifname"}]``, its keys matched as libcni's Go decoding matches
    them: the exact name, else the same name in another (ASCII) case (``ContainerId``,
    ``IfName``...), a later key winning over an earlier one, a ``null`` value left unset,
    other keys ignored whatever their value. An entry that is not an object, or whose
    ``containerID`` or ``ifname`` is missing, empty or not a string, is refused, naming
    the entry: GC collects everything its list fails to name, so a list it cannot read
    whole is no list (the spec: each entry holds both, the values of CNI_CONTAINERID and
    CNI_IFNAME at ADD). Raises ``ValueError``."""
    if not isinstance(raw, list):
        raise ValueError(
            f"must be a list of {{{', '.join(map(repr, GC_ATTACHMENT_KEYS))}}} objects, "
            f"not {json.dumps(raw)[:80]}"
        )
    fields = {name.lower(): name for name in GC_ATTACHMENT_KEYS}
    out: list[dict[str, str]] = []
    for i, entry in enumerate(raw):
        shown = json.dumps(entry)[:120]
        if not isinstance(entry, dict):
            raise ValueError(f"entry {i} {shown} is not an object")
        got: dict[str, str] = {}
        for key, value in entry.items():
            name = fields.get(key.lower()) if key.isascii() else None
            if name is None or value is None:
                continue
            if not isinstance(value, str):
                raise ValueError(f"entry {i} {shown}: {key!r} must be a string")
            got[name] = value
        missing = [name for name in GC_ATTACHMENT_KEYS if not got.get(name)]
        if missing:
            raise ValueError(
                f"entry {i} {shown} has no {' and no '.join(map(repr, missing))} (an entry names an "
                f"attachment by both {' and '.join(map(repr, GC_ATTACHMENT_KEYS))})"
            )
        out.append(got)
    return out


class RuntimeBandwidth(BaseModel):
    """``runtimeConfig.bandwidth`` (CNI conventions, capability ``bandwidth``): what the runtime
    asks from a pod's ``kubernetes.io/ingress-bandwidth`` / ``egress-bandwidth`` annotations.
    Rates in bits per second, bursts in bits (the reference bandwidth plugin's units); 0 or
    absent: not asked. Keys are matched in any case (:func:`runtime_bandwidth_keys`); keys
    this plugin does not know are ignored, as the conventions say (the config loader logs
    them)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _any_case(cls, v: Any) -> Any:
        return runtime_bandwidth_keys(v)[0] if isinstance(v, Mapping) else v

    ingressRate: int = Field(default=0, ge=0, le=_MAX_U64, strict=True)
    ingressBurst: int = Field(default=0, ge=0, le=_MAX_U64, strict=True)
    egressRate: int = Field(default=0, ge=0, le=_MAX_U64, strict=True)
    egressBurst: int = Field(default=0, ge=0, le=_MAX_U64, strict=True)


class NetConf(BaseModel):
    """A cni-dra network configuration (one plugin entry of a conflist, as the runtime sends it).

    Shape: see README "Config reference". Unknown top-level keys are refused (code 2).

    Link options (validated together): ``linkType`` macvlan (``mode`` bridge, private,
    vepa, passthru; default bridge; ``mac``; ``bcqueuelen`` in packets) or ipvlan
    (``mode`` l2, l3, l3s, default l2; ``ipvlanFlag`` bridge, private, vepa, default
    bridge; no ``mac``: an ipvlan has its parent's MAC; no ``bcqueuelen``).
    ``nodad``: add IPv6 addresses without duplicate address detection; otherwise ADD
    waits (at most ``dadTimeoutSeconds``) until they are no longer tentative.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    cniVersion: str
    name: str
    type: str
    driver: str = DEFAULT_DRIVER
    stateDir: str = Field(default=DEFAULT_STATE_DIR, pattern=r"^/")
    inventory: str = Field(default=DEFAULT_INVENTORY, pattern=r"^/")
    linkType: str = "macvlan"
    mode: str = ""
    ipvlanFlag: str | None = None
    mtu: int | None = Field(default=None, ge=68, le=65535, strict=True)
    mac: str | None = None
    bcqueuelen: int | None = Field(default=None, ge=0, le=2**32 - 1)
    nodad: bool = False
    dadTimeoutSeconds: float = Field(default=10.0, gt=0, le=120, allow_inf_nan=False)
    capacity: CapacityRequest = Field(default_factory=CapacityRequest)
    selectionPolicy: Literal["best-fit", "least-allocated"] = "best-fit"
    selectors: list[DeviceSelector] = Field(default_factory=empty_list, max_length=32)
    distinctFrom: Literal["pod"] | None = None
    lockTimeoutSeconds: float = Field(default=10.0, gt=0, le=600, allow_inf_nan=False)
    ipam: IpamConfig = Field(default_factory=IpamConfig)
    dns: DNSConfig | None = None
    capabilities: dict[str, bool] = Field(default_factory=dict)
    runtimeConfig: dict[str, Any] = Field(default_factory=dict)
    prevResult: dict[str, Any] | None = None
    args: dict[str, Any] | None = None
    disableGC: bool = False
    shaping: ShapingConfig | None = Field(default_factory=ShapingConfig)
    # What DRA device profiles may ask on this network (README "Device profiles"): read by
    # the agent at prepare; accepted here so that one conflist serves both.
    profiles: ProfileLimits = Field(default_factory=ProfileLimits)
    validAttachments: list[dict[str, str]] | None = Field(default=None, alias="cni.dev/valid-attachments")
    legacyAttachments: list[dict[str, str]] | None = Field(default=None, alias="cni.dev/attachments")

    @field_validator("validAttachments", "legacyAttachments", mode="before")
    @classmethod
    def _gc_attachments(cls, v: Any) -> Any:
        return None if v is None else gc_attachments(v)

    @field_validator("linkType")
    @classmethod
    def _link_type(cls, v: str) -> str:
        if v not in LINK_TYPES:
            raise ValueError(f"linkType {v!r} is not supported (supported: {', '.join(LINK_TYPES)})")
        return v

    @model_validator(mode="after")
    def _link_options(self) -> NetConf:
        # Defaults depend on linkType, so they are filled here (the model is frozen).
        if self.linkType == "macvlan":
            mode = self.mode or "bridge"
            if mode not in CONFIG_MACVLAN_MODES:
                raise ValueError(
                    f"mode {mode!r} is not a macvlan mode (one of {', '.join(CONFIG_MACVLAN_MODES)})"
                )
            if self.ipvlanFlag is not None:
                raise ValueError("ipvlanFlag applies to linkType ipvlan only")
            object.__setattr__(self, "mode", mode)
        else:
            mode = self.mode or "l2"
            if mode not in IPVLAN_MODES:
                raise ValueError(f"mode {mode!r} is not an ipvlan mode (one of {', '.join(IPVLAN_MODES)})")
            flag = self.ipvlanFlag or "bridge"
            if flag not in IPVLAN_FLAGS:
                raise ValueError(f"ipvlanFlag {flag!r} is not one of {', '.join(IPVLAN_FLAGS)}")
            if self.mac is not None:
                raise ValueError("mac cannot be set for linkType ipvlan (an ipvlan has its parent's MAC)")
            if self.bcqueuelen is not None:
                raise ValueError("bcqueuelen applies to linkType macvlan only")
            object.__setattr__(self, "mode", mode)
            object.__setattr__(self, "ipvlanFlag", flag)
        return self

    @field_validator("shaping", mode="before")
    @classmethod
    def _shaping(cls, v: Any) -> Any:
        # true: every default; false: off; an object: ShapingConfig. Nothing else (not null).
        if v is True:
            return {}
        if v is False:
            return None
        if not isinstance(v, dict):
            raise ValueError(f"must be true, false or an object, not {json.dumps(v)}")
        return v

    @model_validator(mode="after")
    def _runtime_bandwidth(self) -> NetConf:
        if self.capabilities.get("bandwidth") and self.runtimeConfig.get("bandwidth") is not None:
            raw = self.runtimeConfig["bandwidth"]
            try:
                RuntimeBandwidth.model_validate(raw)
            except ValidationError as exc:
                raise ValueError(f"runtimeConfig.bandwidth: {_format_validation_error(exc)[1]}") from exc
            unknown = runtime_bandwidth_keys(raw)[1]
            if unknown:
                log.warning(
                    "network %r: runtimeConfig.bandwidth: ignoring unknown key(s) %s (known: %s, in any case)",
                    self.name,
                    ", ".join(map(repr, unknown)),
                    ", ".join(RuntimeBandwidth.model_fields),
                )
        return self

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str | None) -> str | None:
        return mac_field(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty")
        return v

    @property
    def valid_attachments(self) -> list[dict[str, str]] | None:
        """GC's list of ``{"containerID", "ifname"}`` still in use (CNI 1.1.0 "GC"), from
        ``cni.dev/valid-attachments`` or else the older ``cni.dev/attachments``; None when
        the config carries neither (then nothing is known to be stale, unlike ``[]``)."""
        chosen = self.validAttachments if self.validAttachments is not None else self.legacyAttachments
        return None if chosen is None else list(chosen)

    @property
    def runtime_bandwidth(self) -> RuntimeBandwidth | None:
        """``runtimeConfig.bandwidth`` when the ``bandwidth`` capability is declared (validated
        at load), else None."""
        if not self.capabilities.get("bandwidth"):
            return None
        raw = self.runtimeConfig.get("bandwidth")
        return None if raw is None else RuntimeBandwidth.model_validate(raw)

    @property
    def ipam_type(self) -> str | None:
        """``ipam.type`` or None for L2-only (no IPAM)."""
        return self.ipam.type or None


def peek_cni_version(raw: bytes) -> str:
    """Best-effort ``cniVersion`` of raw stdin for error replies (never raises)."""
    try:
        v = json.loads(raw).get("cniVersion")
        return v if isinstance(v, str) and v else "1.1.0"
    except Exception:  # noqa: BLE001 - only for formatting an error reply
        return "1.1.0"


def _format_validation_error(exc: ValidationError) -> tuple[type, str]:
    parts = []
    err_cls: type = InvalidConfigError
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            err_cls = UnsupportedFieldError
            parts.append(f"unknown field {loc!r}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if err["loc"] else msg)
    return err_cls, "; ".join(parts)


def load_conf(raw: bytes, env: CniEnv | None = None) -> NetConf:
    """Parse stdin bytes into a :class:`NetConf`, applying CNI_ARGS and runtimeConfig.

    Raises: DecodeError (6) for non-JSON, oversize or too deeply nested input; IncompatibleVersionError (1)
    for an unsupported ``cniVersion``; UnsupportedFieldError (2) for unknown keys;
    InvalidConfigError (7) for invalid values (names the field).
    """
    if len(raw) > MAX_CONFIG_BYTES:
        raise DecodeError(f"failed to decode network config: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError("failed to decode network config: not valid JSON", str(exc)) from exc
    except RecursionError as exc:  # arrays/objects nested deeper than the interpreter recurses
        raise DecodeError("failed to decode network config: JSON nested too deeply", str(exc)) from exc
    if not isinstance(obj, dict):
        raise DecodeError("failed to decode network config: top level must be a JSON object")
    version = obj.get("cniVersion")
    if not isinstance(version, str):
        raise InvalidConfigError("invalid network config: cniVersion must be a string")
    check_supported(version)
    if obj.get("type") not in (None, "cni-dra"):
        # Runtimes pick the binary by type; anything else here is a misrouted config.
        raise InvalidConfigError(f"invalid network config: type {obj.get('type')!r} is not 'cni-dra'")
    # Precedence: file < CNI_ARGS < runtimeConfig (capability "mac").
    caps = obj.get("capabilities") or {}
    rc = obj.get("runtimeConfig") or {}
    if env is not None and env.args.mac:
        obj["mac"] = env.args.mac
    if isinstance(caps, dict) and caps.get("mac") and isinstance(rc, dict) and rc.get("mac"):
        obj["mac"] = rc["mac"]
    try:
        return NetConf.model_validate(obj)
    except ValidationError as exc:
        cls, msg = _format_validation_error(exc)
        raise cls(f"invalid network config {obj.get('name', '')!r}: {msg}") from exc
