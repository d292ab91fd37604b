"""What a node lets profiles ask: :class:`ProfileLimits`, the ``profiles`` object of a
cni-dra conflist entry, and the check of a profile against it.

The agent reads the limits at prepare from the conflists it is given (``--conflist``,
:func:`load_limits`: the strictest of them when there are several networks); ADD checks
again against its own conflist entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cni_dra.errors import InvalidConfigError, IOFailureError
from cni_dra.protocol.profile.params import LINK_TYPES, MAX_BURST_BYTES, InterfaceProfile, validation_errors

__all__ = ["ProfileLimits", "check_limits", "strictest", "limits_from_conflist", "load_limits"]


class ProfileLimits(BaseModel):
    """What a node lets profiles ask (the ``profiles`` object of a cni-dra conflist entry).

    ``allowedLinkTypes``: the link types a profile may name (default both); ``maxMtu``: the
    largest MTU (default none beyond the parent's, which ADD checks); ``allowMac``: whether
    a profile may fix the MAC (default no: a fixed address can take another's); and
    ``allowShapingOff``: whether it may turn shaping off (default no: shaping holds a pod to
    its share); ``maxBurstBytes``: the largest burst override (default none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowedLinkTypes: tuple[str, ...] = LINK_TYPES
    maxMtu: int | None = Field(default=None, ge=68, le=65535, strict=True)
    allowMac: bool = Field(default=False, strict=True)
    allowShapingOff: bool = Field(default=False, strict=True)
    maxBurstBytes: int | None = Field(default=None, ge=1, le=MAX_BURST_BYTES, strict=True)

    @field_validator("allowedLinkTypes")
    @classmethod
    def _link_types(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for kind in v:
            if kind not in LINK_TYPES:
                raise ValueError(f"{kind!r} is not a link type (supported: {', '.join(LINK_TYPES)})")
        return v


def check_limits(
    profile: InterfaceProfile, limits: ProfileLimits, origin: Mapping[str, str] | None = None
) -> None:
    """Refuse what ``profile`` asks beyond ``limits`` (every breach, in one message; with
    ``origin``, field -> where it was set, each breach says where).

    Raises:
        InvalidConfigError: (7) ``linkType ipvlan is not allowed on this node
            (profiles.allowedLinkTypes: macvlan)``, and alike for ``maxMtu``, ``allowMac``,
            ``allowShapingOff`` and ``maxBurstBytes``.
    """
    breaches: list[tuple[str, str]] = []
    if profile.linkType is not None and profile.linkType not in limits.allowedLinkTypes:
        allowed = ", ".join(limits.allowedLinkTypes) or "none"
        breaches.append(
            (
                "linkType",
                f"linkType {profile.linkType} is not allowed on this node "
                f"(profiles.allowedLinkTypes: {allowed})",
            )
        )
    if profile.mtu is not None and limits.maxMtu is not None and profile.mtu > limits.maxMtu:
        breaches.append(
            ("mtu", f"mtu {profile.mtu} is above this node's limit (profiles.maxMtu: {limits.maxMtu})")
        )
    if profile.mac is not None and not limits.allowMac:
        breaches.append(
            ("mac", f"mac {profile.mac} is fixed, which this node does not allow (profiles.allowMac: false)")
        )
    shaping = profile.shaping
    if shaping is not None and shaping.enabled is False and not limits.allowShapingOff:
        breaches.append(
            (
                "shaping.enabled",
                "shaping.enabled false is not allowed on this node (profiles.allowShapingOff: false)",
            )
        )
    for name in ("ingressBurstBytes", "egressBurstBytes"):
        burst = getattr(shaping, name) if shaping is not None else None
        if burst is not None and limits.maxBurstBytes is not None and burst > limits.maxBurstBytes:
            breaches.append(
                (
                    f"shaping.{name}",
                    f"shaping.{name} {burst} is above this node's limit "
                    f"(profiles.maxBurstBytes: {limits.maxBurstBytes})",
                )
            )
    if breaches:
        origin = origin or {}
        raise InvalidConfigError(
            "; ".join(f"{msg}, asked by {origin[path]}" if path in origin else msg for path, msg in breaches)
        )


def strictest(limits: Iterable[ProfileLimits]) -> ProfileLimits:
    """The limits that every one of ``limits`` allows (none given: the defaults): the link
    types all allow, the lowest maxMtu and maxBurstBytes, allowMac and allowShapingOff only
    when all allow them."""
    items = list(limits)
    if not items:
        return ProfileLimits()
    kinds = [k for k in LINK_TYPES if all(k in lim.allowedLinkTypes for lim in items)]
    mtus = [lim.maxMtu for lim in items if lim.maxMtu is not None]
    bursts = [lim.maxBurstBytes for lim in items if lim.maxBurstBytes is not None]
    return ProfileLimits(
        allowedLinkTypes=tuple(kinds),
        maxMtu=min(mtus) if mtus else None,
        allowMac=all(lim.allowMac for lim in items),
        allowShapingOff=all(lim.allowShapingOff for lim in items),
        maxBurstBytes=min(bursts) if bursts else None,
    )


def limits_from_conflist(obj: Mapping[str, Any], source: str = "<conflist>") -> ProfileLimits:
    """The ``profiles`` limits of the cni-dra entries of a conflist (``plugins[]``) or of a
    single network config object; an entry without ``profiles`` has the defaults.

    Raises:
        InvalidConfigError: (7) no ``type: cni-dra`` entry, or a ``profiles`` object that
            does not validate (unknown keys refused).
    """
    plugins = obj.get("plugins") if "plugins" in obj else [obj]
    entries = [p for p in plugins or () if isinstance(p, Mapping) and p.get("type") == "cni-dra"]
    if not entries:
        raise InvalidConfigError(f"invalid network config {source}: it has no cni-dra plugin entry")
    out = []
    for entry in entries:
        try:
            out.append(ProfileLimits.model_validate(entry.get("profiles", {})))
        except ValidationError as exc:
            raise InvalidConfigError(
                f"invalid network config {source}: profiles: {validation_errors(exc)}"
            ) from exc
    return strictest(out)


def load_limits(paths: Iterable[str]) -> ProfileLimits:
    """The limits every conflist of ``paths`` allows (:func:`limits_from_conflist`,
    :func:`strictest`); no path: the defaults.

    Raises:
        IOFailureError: (5) a file cannot be read.
        InvalidConfigError: (7) a file is not a JSON object or its limits do not validate.
    """
    found = []
    for path in paths:
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise IOFailureError(
                f"failed to read network config {path}: {exc.strerror or exc}", str(exc)
            ) from exc
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise InvalidConfigError(f"invalid network config {path}: not valid JSON", str(exc)) from exc
        if not isinstance(obj, dict):
            raise InvalidConfigError(f"invalid network config {path}: top level must be a JSON object")
        found.append(limits_from_conflist(obj, path))
    return strictest(found)
