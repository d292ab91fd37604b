"""Which profile each allocation result gets: DRA configuration entries of cni-dra's driver,
their precedence and request targeting, the whole-claim check done at prepare, the
never-raising read the node state uses, and the node's layer laid under it at ADD.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from cni_dra.errors import InvalidConfigError
from cni_dra.protocol.profile.limits import ProfileLimits, check_limits
from cni_dra.protocol.profile.params import (
    LINK_FIELDS,
    InterfaceProfile,
    parse_interface_config,
    validation_errors,
)

__all__ = [
    "SOURCES",
    "ProfileEntry",
    "driver_entries",
    "applies_to",
    "overlay",
    "result_profile",
    "claim_profiles",
    "decode_result_profile",
    "apply_to_netconf",
]

SOURCES: tuple[str, ...] = ("FromClass", "FromClaim")
"""Allocation config ``source`` values, lowest precedence first."""


@dataclass(frozen=True)
class ProfileEntry:
    """One allocation config entry of cni-dra's driver: its place in ``config[]``, its
    ``source``, the requests it targets (none: all) and its profile."""

    index: int
    source: str
    requests: tuple[str, ...]
    profile: InterfaceProfile

    def where(self) -> str:
        """``config[1] (FromClaim, requests net1)``: the entry, for messages."""
        return _entry_where(self.index, self.source, self.requests)


def _entry_where(index: int, source: object, requests: Sequence[str] = ()) -> str:
    targets = f", requests {', '.join(requests)}" if requests else ""
    return f"config[{index}] ({source}{targets})"


def driver_entries(config: Sequence[Mapping[str, Any]] | None, driver: str) -> list[ProfileEntry]:
    """The entries of ``config`` (``status.allocation.devices.config``) whose ``opaque.driver``
    is ``driver``, parsed, in precedence order (FromClass, then FromClaim; each group as listed).

    Raises:
        InvalidConfigError: (7) an entry of ``driver`` with an unknown ``source``, a bad
            ``requests`` list or parameters that do not parse; the message names the entry.
    """
    out = []
    for i, entry in enumerate(config or ()):
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        source, requests = entry.get("source"), entry.get("requests") or []
        where = _entry_where(i, source)
        if source not in SOURCES:
            raise InvalidConfigError(f"{where}: source {source!r} is not one of {', '.join(SOURCES)}")
        if (
            not isinstance(requests, Sequence)
            or isinstance(requests, str)
            or not all(isinstance(r, str) and r for r in requests)
        ):
            raise InvalidConfigError(f"{where}: requests must be a list of request names")
        try:
            profile = parse_interface_config(opaque.get("parameters")).profile()
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"{_entry_where(i, source, requests)}: {exc.msg}", exc.details) from exc
        out.append(ProfileEntry(i, source, tuple(requests), profile))
    return sorted(out, key=lambda e: SOURCES.index(e.source))  # stable: listed order within a source


def applies_to(requests: Sequence[str], request: str) -> bool:
    """Whether an entry naming ``requests`` (empty: all) applies to allocation result
    ``request`` (``<request>`` or ``<request>/<subrequest>``): a main request's name covers its
    subrequests, ``<request>/<subrequest>`` that one only."""
    return not requests or request in requests or request.partition("/")[0] in requests


def overlay(lower: InterfaceProfile, upper: InterfaceProfile) -> InterfaceProfile:
    """``upper`` laid over ``lower``, field by field (module docstring): a field ``upper``
    sets wins, ``shaping`` merges by its own fields, and an ``upper.linkType`` other than
    ``lower.linkType`` drops ``lower``'s mode, ipvlanFlag and mac.

    Raises:
        InvalidConfigError: (7) the merge does not fit one link type (an ipvlan with a MAC,
            a mode of the other type); the message names the field.
    """
    fields = lower.set_fields()
    if upper.linkType is not None and lower.linkType not in (None, upper.linkType):
        for name in LINK_FIELDS:
            fields.pop(name, None)
    for name, value in upper.set_fields().items():
        if name == "shaping":
            value = {**fields.get("shaping", {}), **value}
            if value.get("enabled") is False:  # off: the lower layers' overrides do not apply
                value = {"enabled": False}
        fields[name] = value
    try:
        return InterfaceProfile.model_validate(fields)
    except ValidationError as exc:
        raise InvalidConfigError(validation_errors(exc)) from exc  # the message names every field


def _field_paths(profile: InterfaceProfile) -> list[str]:
    """The fields ``profile`` sets, ``shaping``'s as ``shaping.<field>``."""
    return [
        f"{name}.{sub}" if isinstance(value, dict) else name
        for name, value in profile.set_fields().items()
        for sub in (value if isinstance(value, dict) else [None])
    ]


def _resolve(
    entries: Sequence[ProfileEntry], request: str
) -> tuple[InterfaceProfile | None, dict[str, ProfileEntry]]:
    """The entries of ``request`` laid over each other, and which entry set each field."""
    profile: InterfaceProfile | None = None
    origin: dict[str, ProfileEntry] = {}
    for entry in entries:
        if not applies_to(entry.requests, request):
            continue
        try:
            profile = entry.profile if profile is None else overlay(profile, entry.profile)
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"{exc.msg} (after {entry.where()})", exc.details) from exc
        origin = {path: e for path, e in origin.items() if path.partition(".")[0] in profile.set_fields()}
        origin.update(dict.fromkeys(_field_paths(entry.profile), entry))
    return profile, origin


def result_profile(
    entries: Sequence[ProfileEntry], request: str, share_id: str | None = None
) -> InterfaceProfile | None:
    """The profile of allocation result ``request`` (``share_id``: its shareID) from
    ``entries`` (:func:`driver_entries`): the entries that apply to it laid over each other
    in order; None when none applies. The profile is complete: a ``mode``, ``ipvlanFlag``
    or ``mac`` comes with the ``linkType`` it belongs to, and ``passthru`` (which takes the
    whole NIC) is refused on a shared device.

    Raises:
        InvalidConfigError: (7) what does not fit; the message names the field and, where one
            entry alone decides it, that entry.
    """
    return _complete(*_resolve(entries, request), share_id)[0]


def _complete(
    profile: InterfaceProfile | None, origin: dict[str, ProfileEntry], share_id: str | None
) -> tuple[InterfaceProfile | None, dict[str, ProfileEntry]]:
    if profile is None:
        return None, origin
    loose = [name for name in LINK_FIELDS if getattr(profile, name) is not None]
    if loose and profile.linkType is None:
        raise InvalidConfigError(
            f"{', '.join(loose)} set without linkType (they depend on it: name linkType "
            f"in this config entry or in one below it, e.g. the DeviceClass's), in "
            f"{origin[loose[0]].where()}"
        )
    if profile.mode == "passthru" and share_id is not None:
        raise InvalidConfigError(
            "mode 'passthru' takes the whole NIC: it needs a device allocated whole, "
            f"not a share, in {origin['mode'].where()}"
        )
    return profile, origin


def _claim_where(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"failed to prepare claim {meta.get('namespace') or ''}/{meta.get('name') or ''}"


def claim_profiles(
    claim: Mapping[str, Any], driver: str, limits: ProfileLimits
) -> dict[str, InterfaceProfile | None]:
    """Validate the profiles of a ResourceClaim (with ``status.allocation``) for ``driver``:
    every config entry of ``driver`` parses, each of its results gets a complete profile
    (:func:`result_profile`) within ``limits``, and no two results get the same fixed MAC.
    Returns ``{request: profile or None}`` for the results of ``driver``.

    Raises:
        InvalidConfigError: (7) ``failed to prepare claim <ns>/<name> request 'net1': <field
            and limit>`` (without the request when a config entry itself is bad).
    """
    where = _claim_where(claim)
    devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    try:
        entries = driver_entries(devices.get("config"), driver)
    except InvalidConfigError as exc:
        raise InvalidConfigError(f"{where}: {exc.msg}", exc.details) from exc
    out: dict[str, InterfaceProfile | None] = {}
    macs: dict[str, str] = {}
    for res in devices.get("results") or ():
        if res.get("driver") != driver:
            continue
        request = str(res.get("request") or "")
        try:
            profile, origin = _complete(*_resolve(entries, request), res.get("shareID"))
            if profile is not None:
                check_limits(profile, limits, {path: e.where() for path, e in origin.items()})
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"{where} request {request!r}: {exc.msg}", exc.details) from exc
        if profile is not None and profile.mac is not None:
            if profile.mac in macs:
                raise InvalidConfigError(
                    f"{where} request {request!r}: mac {profile.mac} would go to two interfaces "
                    f"(requests {macs[profile.mac]!r} and {request!r}; one MAC per interface)"
                )
            macs[profile.mac] = request
        out[request] = profile
    return out


def decode_result_profile(
    config: Sequence[Mapping[str, Any]] | None, driver: str, request: str, share_id: str | None = None
) -> tuple[InterfaceProfile | None, str | None]:
    """(profile, None) or (None, why not) of one allocation result, never raising: how the
    node state reads a prepared claim (the limits were checked when it was prepared, and
    ADD checks its own). The profile is :func:`result_profile`'s."""
    try:
        return result_profile(driver_entries(config, driver), request, share_id), None
    except InvalidConfigError as exc:
        return None, exc.msg


def apply_to_netconf(netconf: Mapping[str, Any], profile: InterfaceProfile | None) -> dict[str, Any]:
    """A cni-dra conflist entry (JSON object) with ``profile`` laid over it: the node's
    layer, lowest in the precedence. A ``linkType`` other than the entry's (default
    macvlan) drops its ``mode``, ``ipvlanFlag``, ``mac`` and ``bcqueuelen``; ``shaping``
    ``enabled`` false turns shaping off, true (or a burst or latency, when the entry
    shapes) gives the entry's ``shaping`` object with the profile's overrides. The caller
    validates the outcome as any config (``cni_dra.protocol.config``)."""
    out = dict(netconf)
    if profile is None:
        return out
    if profile.linkType is not None and profile.linkType != (out.get("linkType") or "macvlan"):
        for key in (*LINK_FIELDS, "bcqueuelen"):
            out.pop(key, None)
    for name, value in profile.set_fields().items():
        if name != "shaping":
            out[name] = value
    shaping = profile.shaping
    if shaping is not None:
        base = out.get("shaping", True)
        on = shaping.enabled if shaping.enabled is not None else base is not False
        out["shaping"] = (
            {**(base if isinstance(base, Mapping) else {}), **shaping.overrides()} if on else False
        )
    return out
