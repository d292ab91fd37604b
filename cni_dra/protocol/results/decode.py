"""Parse a CNI result of any supported spec version into the 1.1.0 model.

Sources: CNI spec 0.3.0-0.4.0 (per-IP ``version``, "4" or "6"), spec 0.1.0/0.2.0
(``ip4``/``ip6`` objects with ``ip``, ``gateway`` and their own ``routes``), 1.0.0 and
1.1.0 (:mod:`.model`). Lenient about unknown keys (newer writers add fields) and strict
about the types and syntax of the keys it knows; every failure is a
:class:`~cni_dra.errors.DecodeError` naming the path of the bad key.

Stdlib only: imported on every CNI call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from cni_dra.errors import DecodeError
from cni_dra.protocol.results.cni_result import DNS, U32_MAX, V030, V100, Interface, IPConfig, Result, Route
from cni_dra.protocol.versions import LATEST_VERSION, check_supported, parse_version

__all__ = ["parse_result"]


class _Reader:
    """Typed access to one JSON object, naming the path in errors."""

    def __init__(self, obj: object, where: str) -> None:
        if not isinstance(obj, Mapping):
            raise DecodeError("failed to decode CNI result", f"{where} must be a JSON object")
        self.obj: Mapping[str, object] = obj
        self.where = where

    def fail(self, key: str, expected: str) -> DecodeError:
        return DecodeError("failed to decode CNI result", f"{self.where}.{key} must be {expected}")

    def get_str(self, key: str, required: bool = False) -> str | None:
        value = self.obj.get(key)
        if value is None:
            if required:
                raise DecodeError("failed to decode CNI result", f"{self.where}.{key} is required")
            return None
        if not isinstance(value, str):
            raise self.fail(key, "a string")
        return value

    def get_int(self, key: str) -> int | None:
        value = self.obj.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32_MAX:
            raise self.fail(key, f"an integer from 0 to {U32_MAX}")
        return value

    def get_list(self, key: str) -> list[object]:
        value = self.obj.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, "a list")
        return value

    def get_strs(self, key: str) -> list[str]:
        values = self.get_list(key)
        strs = [v for v in values if isinstance(v, str)]
        if len(strs) != len(values):
            raise self.fail(key, "a list of strings")
        return strs


_T = TypeVar("_T")


def _build(kind: type[_T], where: str, **kwargs: object) -> _T:
    try:
        return kind(**kwargs)
    except ValueError as exc:
        raise DecodeError("failed to decode CNI result", f"{where}: {exc}") from exc


def _parse_dns(obj: object) -> DNS:
    if obj is None:
        return DNS()
    r = _Reader(obj, "dns")
    return _build(
        DNS,
        "dns",
        nameservers=r.get_strs("nameservers"),
        domain=r.get_str("domain") or "",
        search=r.get_strs("search"),
        options=r.get_strs("options"),
    )


def _parse_route(obj: object, where: str) -> Route:
    r = _Reader(obj, where)
    return _build(
        Route,
        where,
        dst=r.get_str("dst", required=True),
        gw=r.get_str("gw"),
        mtu=r.get_int("mtu"),
        advmss=r.get_int("advmss"),
        priority=r.get_int("priority"),
        table=r.get_int("table"),
        scope=r.get_int("scope"),
    )


def _parse_020(obj: Mapping[str, object]) -> Result:
    ips: list[IPConfig] = []
    routes: list[Route] = []
    for key, family in (("ip4", 4), ("ip6", 6)):
        if obj.get(key) is None:
            continue
        r = _Reader(obj[key], key)
        ip = _build(IPConfig, key, address=r.get_str("ip", required=True), gateway=r.get_str("gateway"))
        if ip.version != family:
            raise DecodeError(
                "failed to decode CNI result", f"{key}.ip {ip.address} is not an IPv{family} address"
            )
        ips.append(ip)
        for i, route in enumerate(r.get_list("routes")):
            rr = _Reader(route, f"{key}.routes[{i}]")
            routes.append(_build(Route, rr.where, dst=rr.get_str("dst", required=True), gw=rr.get_str("gw")))
    return Result(LATEST_VERSION, (), ips, routes, _parse_dns(obj.get("dns")))


def _parse_rich(obj: Mapping[str, object], version: tuple[int, int, int]) -> Result:
    r = _Reader(obj, "result")
    interfaces = []
    for i, item in enumerate(r.get_list("interfaces")):
        ir = _Reader(item, f"interfaces[{i}]")
        interfaces.append(
            _build(
                Interface,
                ir.where,
                name=ir.get_str("name") or "",
                mac=ir.get_str("mac") or "",
                mtu=ir.get_int("mtu"),
                sandbox=ir.get_str("sandbox") or "",
                socket_path=ir.get_str("socketPath"),
                pci_id=ir.get_str("pciID"),
            )
        )
    ips = []
    for i, item in enumerate(r.get_list("ips")):
        ir = _Reader(item, f"ips[{i}]")
        ip = _build(
            IPConfig,
            ir.where,
            address=ir.get_str("address", required=True),
            gateway=ir.get_str("gateway"),
            interface=ir.get_int("interface"),
        )
        family = ir.obj.get("version")
        if family is not None and family != str(ip.version):
            raise DecodeError(
                "failed to decode CNI result",
                f"ips[{i}].version is {family!r} but {ip.address} is IPv{ip.version}",
            )
        if family is None and V030 <= version < V100:
            raise DecodeError("failed to decode CNI result", f"ips[{i}].version is required before CNI 1.0.0")
        ips.append(ip)
    routes = [_parse_route(item, f"routes[{i}]") for i, item in enumerate(r.get_list("routes"))]
    return Result(LATEST_VERSION, interfaces, ips, routes, _parse_dns(obj.get("dns")))


def parse_result(obj: object, version: str | None = None) -> Result:
    """Parse a result of any supported spec version into the 1.1.0 model.

    Used for the IPAM plugin's ADD output and for ``prevResult`` (CNI spec 1.1.0
    "Success", "Delegated plugins (IPAM)", "prevResult"). The schema is chosen by the
    object's own ``cniVersion``; when it has none, by ``version``; when neither is
    given, ``ip4``/``ip6`` keys mean 0.2.0 and anything else 1.1.0. Shapes:

    * 0.1.0/0.2.0: ``{"ip4": {"ip", "gateway"?, "routes"?}, "ip6": {...}, "dns"?}``;
    * 0.3.0/0.3.1/0.4.0: ``interfaces``, ``ips`` (each with ``version`` "4"/"6"),
      ``routes``, ``dns``;
    * 1.0.0/1.1.0: the same without ``version`` (accepted and checked if present).

    Fields of newer versions are kept whatever the version (nothing is dropped on the
    way in). Unknown keys are ignored.

    Raises:
        DecodeError: (code 6) not an object, a known key of the wrong type, a missing
            ``address``/``ip``/``dst``, an address not in CIDR notation, a ``version``
            that disagrees with the address, or a 0.2.0-shaped object labelled 0.3.0+.
        IncompatibleVersionError: (code 1) a well-formed but unsupported cniVersion.
    """
    if not isinstance(obj, Mapping):
        raise DecodeError("failed to decode CNI result", "result must be a JSON object")
    declared = obj.get("cniVersion")
    if declared is not None and not isinstance(declared, str):
        raise DecodeError("failed to decode CNI result", "result.cniVersion must be a string")
    chosen = declared or version
    if not chosen:
        chosen = "0.2.0" if ("ip4" in obj or "ip6" in obj) else LATEST_VERSION
    check_supported(chosen)
    parsed = parse_version(chosen)
    if parsed < V030:
        return _parse_020(obj)
    if ("ip4" in obj or "ip6" in obj) and "ips" not in obj:
        raise DecodeError(
            "failed to decode CNI result", f"result has ip4/ip6 (CNI 0.2.0 shape) but cniVersion {chosen}"
        )
    return _parse_rich(obj, parsed)
