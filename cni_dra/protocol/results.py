"""CNI results: one model in the newest schema (1.1.0), converted at print time.

Sources: CNI spec 1.1.0 section "Success" (ADD result: ``interfaces``, ``ips``,
``routes``, ``dns``; the 1.1 additions ``mtu``/``socketPath``/``pciID`` on interfaces and
``mtu``/``advmss``/``priority``/``table``/``scope`` on routes); spec 0.3.0-0.4.0 (per-IP
``version``, "4" or "6"); spec 0.1.0/0.2.0 (``ip4``/``ip6`` objects with ``ip``,
``gateway`` and their own ``routes``). Conversion facts follow libcni's
``pkg/types/{020,040,100}`` converters: going down to 0.2.0 keeps only the first IP of
each family and the routes of a family that kept an IP, and fails when no IP is left;
coming up from 0.2.0 lists ip4 before ip6 and ip4's routes before ip6's.

Parsing is lenient about unknown keys (newer writers add fields) and strict about the
types and syntax of the keys it knows. Output omits empty and unset fields, as the
reference plugins do (``name`` of an interface and ``address`` of an IP are always
written).

Stdlib only: imported on every CNI call.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from cni_dra.errors import DecodeError, IncompatibleVersionError
from cni_dra.protocol.versions import LATEST_VERSION, check_supported, parse_version

__all__ = [
    "Interface",
    "IPConfig",
    "Route",
    "DNS",
    "Result",
    "parse_result",
    "result_to_dict",
    "merge_prev_result",
]

_V030 = (0, 3, 0)
_V100 = (1, 0, 0)
_V110 = (1, 1, 0)


def _cidr(value: str, what: str) -> str:
    """Normalise ``ADDR/PREFIXLEN`` (host bits kept); ValueError if it is not one."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string in CIDR notation, got {type(value).__name__}")
    _addr, slash, prefix = value.partition("/")
    if not slash or not prefix.isascii() or not prefix.isdigit():
        raise ValueError(f"{what} {value!r} is not in CIDR notation (ADDRESS/PREFIXLEN)")
    return str(ipaddress.ip_interface(value))


def _ip(value: str | None, what: str) -> str | None:
    """Normalise an IP address; ``""`` means unset (Go's net.IP reads it as nil)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return str(ipaddress.ip_address(value))


_U32_MAX = 2**32 - 1  # netlink carries MTU, advmss, priority, table as u32


def _opt_int(value: int | None, what: str) -> int | None:
    """An int in [0, 2**32-1] or None (route ``table``/``scope``, IP ``interface``: 0 is real)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U32_MAX:
        raise ValueError(f"{what} must be an integer from 0 to {_U32_MAX}, got {value!r}")
    return value


def _opt_count(value: int | None, what: str) -> int | None:
    """As :func:`_opt_int`, but 0 means unset (``omitempty`` ints in the reference code)."""
    return _opt_int(value, what) or None


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class Interface:
    """One interface of a result (spec 1.1.0 "Success", ``interfaces[]``).

    ``sandbox`` is the netns path for container interfaces, empty for host ones;
    ``mtu`` in bytes. ``mtu``, ``socket_path`` and ``pci_id`` exist from spec 1.1.0 on.
    ``mtu=0`` and empty ``socket_path``/``pci_id`` are normalised to ``None``.
    """

    name: str
    mac: str = ""
    mtu: int | None = None
    sandbox: str = ""
    socket_path: str | None = None
    pci_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("name", "mac", "sandbox"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"interface {name} must be a string")
        for name in ("socket_path", "pci_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"interface {name} must be a string")
            _set(self, name, value or None)
        _set(self, "mtu", _opt_count(self.mtu, "interface mtu"))


@dataclass(frozen=True)
class IPConfig:
    """One address of a result (``ips[]``): ``address`` in CIDR notation with host bits
    (``"10.1.0.5/24"``), optional ``gateway`` address, optional ``interface`` index into
    :attr:`Result.interfaces`. Addresses are normalised (``ipaddress`` text form)."""

    address: str
    gateway: str | None = None
    interface: int | None = None

    def __post_init__(self) -> None:
        _set(self, "address", _cidr(self.address, "ip address"))
        _set(self, "gateway", _ip(self.gateway, "ip gateway"))
        _set(self, "interface", _opt_int(self.interface, "ip interface index"))

    @property
    def version(self) -> int:
        """4 or 6, from the address."""
        return ipaddress.ip_interface(self.address).version


@dataclass(frozen=True)
class Route:
    """One route of a result (``routes[]``): ``dst`` in CIDR notation, optional ``gw``.

    From spec 1.1.0 on also ``mtu`` (bytes), ``advmss`` (bytes), ``priority`` (metric),
    ``table`` and ``scope`` (kernel numbers). ``mtu``/``advmss``/``priority`` of 0 are
    normalised to ``None``; ``table``/``scope`` of 0 are real values.
    """

    dst: str
    gw: str | None = None
    mtu: int | None = None
    advmss: int | None = None
    priority: int | None = None
    table: int | None = None
    scope: int | None = None

    def __post_init__(self) -> None:
        _set(self, "dst", _cidr(self.dst, "route dst"))
        _set(self, "gw", _ip(self.gw, "route gw"))
        for name in ("mtu", "advmss", "priority"):
            _set(self, name, _opt_count(getattr(self, name), f"route {name}"))
        for name in ("table", "scope"):
            _set(self, name, _opt_int(getattr(self, name), f"route {name}"))

    @property
    def version(self) -> int:
        """4 or 6, from the destination."""
        return ipaddress.ip_interface(self.dst).version


def _str_tuple(value: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"{what} must be a list of strings")
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


@dataclass(frozen=True)
class DNS:
    """DNS settings of a result (``dns``): nameserver addresses, domain, search domains,
    resolver options. Lists are stored as tuples."""

    nameservers: Sequence[str] = ()
    domain: str = ""
    search: Sequence[str] = ()
    options: Sequence[str] = ()

    def __post_init__(self) -> None:
        for name in ("nameservers", "search", "options"):
            _set(self, name, _str_tuple(getattr(self, name), f"dns {name}"))
        if not isinstance(self.domain, str):
            raise ValueError("dns domain must be a string")

    def is_empty(self) -> bool:
        """True when no field is set (then ``dns`` is left out of the output)."""
        return not (self.nameservers or self.domain or self.search or self.options)


@dataclass(frozen=True)
class Result:
    """A CNI ADD result in the spec 1.1.0 schema; lists are stored as tuples.

    ``cni_version`` records the schema of this object (always :data:`LATEST_VERSION`
    after :func:`parse_result`); the version printed is chosen by
    :func:`result_to_dict`.
    """

    cni_version: str = LATEST_VERSION
    interfaces: Sequence[Interface] = ()
    ips: Sequence[IPConfig] = ()
    routes: Sequence[Route] = ()
    dns: DNS = field(default_factory=DNS)

    def __post_init__(self) -> None:
        for name, kind in (("interfaces", Interface), ("ips", IPConfig), ("routes", Route)):
            items = getattr(self, name)
            if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
                raise ValueError(f"result {name} must be a sequence")
            if not all(isinstance(i, kind) for i in items):
                raise ValueError(f"result {name} must hold {kind.__name__} objects")
            _set(self, name, tuple(items))
        if not isinstance(self.dns, DNS):
            raise ValueError("result dns must be a DNS object")


# ---------------------------------------------------------------------------
# parsing


class _Reader:
    """Typed access to one JSON object, naming the path in errors."""

    def __init__(self, obj: object, where: str) -> None:
        if not isinstance(obj, Mapping):
            raise DecodeError("failed to decode CNI result", f"{where} must be a JSON object")
        self.obj = obj
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
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U32_MAX:
            raise self.fail(key, f"an integer from 0 to {_U32_MAX}")
        return value

    def get_list(self, key: str) -> list[Any]:
        value = self.obj.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, "a list")
        return value

    def get_strs(self, key: str) -> list[str]:
        values = self.get_list(key)
        if not all(isinstance(v, str) for v in values):
            raise self.fail(key, "a list of strings")
        return values


_T = TypeVar("_T")


def _build(kind: type[_T], where: str, **kwargs: Any) -> _T:
    try:
        return kind(**kwargs)
    except ValueError as exc:
        raise DecodeError("failed to decode CNI result", f"{where}: {exc}") from exc


def _parse_dns(obj: object) -> DNS:
    if obj is None:
        return DNS()
    r = _Reader(obj, "dns")
    return _build(
        DNS, "dns", nameservers=r.get_strs("nameservers"), domain=r.get_str("domain") or "", search=r.get_strs("search"), options=r.get_strs("options")
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


def _parse_020(obj: Mapping[str, Any]) -> Result:
    ips: list[IPConfig] = []
    routes: list[Route] = []
    for key, family in (("ip4", 4), ("ip6", 6)):
        if obj.get(key) is None:
            continue
        r = _Reader(obj[key], key)
        ip = _build(IPConfig, key, address=r.get_str("ip", required=True), gateway=r.get_str("gateway"))
        if ip.version != family:
            raise DecodeError("failed to decode CNI result", f"{key}.ip {ip.address} is not an IPv{family} address")
        ips.append(ip)
        for i, route in enumerate(r.get_list("routes")):
            rr = _Reader(route, f"{key}.routes[{i}]")
            routes.append(_build(Route, rr.where, dst=rr.get_str("dst", required=True), gw=rr.get_str("gw")))
    return Result(LATEST_VERSION, (), ips, routes, _parse_dns(obj.get("dns")))


def _parse_rich(obj: Mapping[str, Any], version: tuple[int, int, int]) -> Result:
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
        ip = _build(IPConfig, ir.where, address=ir.get_str("address", required=True), gateway=ir.get_str("gateway"), interface=ir.get_int("interface"))
        family = ir.obj.get("version")
        if family is not None and family != str(ip.version):
            raise DecodeError("failed to decode CNI result", f"ips[{i}].version is {family!r} but {ip.address} is IPv{ip.version}")
        if family is None and _V030 <= version < _V100:
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
    if parsed < _V030:
        return _parse_020(obj)
    if ("ip4" in obj or "ip6" in obj) and "ips" not in obj:
        raise DecodeError("failed to decode CNI result", f"result has ip4/ip6 (CNI 0.2.0 shape) but cniVersion {chosen}")
    return _parse_rich(obj, parsed)


# ---------------------------------------------------------------------------
# output


def _dns_dict(dns: DNS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if dns.nameservers:
        out["nameservers"] = list(dns.nameservers)
    if dns.domain:
        out["domain"] = dns.domain
    if dns.search:
        out["search"] = list(dns.search)
    if dns.options:
        out["options"] = list(dns.options)
    return out


def _route_dict(route: Route, v11: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"dst": route.dst}
    if route.gw is not None:
        out["gw"] = route.gw
    if v11:
        for name in ("mtu", "advmss", "priority", "table", "scope"):
            value = getattr(route, name)
            if value is not None:
                out[name] = value
    return out


def _to_020(result: Result, cni_version: str) -> dict[str, Any]:
    out: dict[str, Any] = {"cniVersion": cni_version}
    for key, family in (("ip4", 4), ("ip6", 6)):
        ip = next((i for i in result.ips if i.version == family), None)
        if ip is None:
            continue
        block: dict[str, Any] = {"ip": ip.address}
        if ip.gateway is not None:
            block["gateway"] = ip.gateway
        routes = [_route_dict(r, False) for r in result.routes if r.version == family]
        if routes:
            block["routes"] = routes
        out[key] = block
    if "ip4" not in out and "ip6" not in out:
        raise IncompatibleVersionError(
            f"cannot express the result in CNI version {cni_version}: it has no IP address",
            "CNI 0.1.0 and 0.2.0 results consist of ip4/ip6 entries; use cniVersion 0.3.0 or newer",
        )
    dns = _dns_dict(result.dns)
    if dns:
        out["dns"] = dns
    return out


def result_to_dict(result: Result, cni_version: str) -> dict[str, Any]:
    """Convert ``result`` to the JSON object of spec version ``cni_version`` (ready for
    ``json.dumps``). ``cniVersion`` of the output is ``cni_version``.

    * 1.1.0: every field;
    * 1.0.0: without interface ``mtu``/``socketPath``/``pciID`` and route
      ``mtu``/``advmss``/``priority``/``table``/``scope``;
    * 0.3.0/0.3.1/0.4.0: as 1.0.0, plus ``"version": "4"|"6"`` on each IP;
    * 0.1.0/0.2.0: ``ip4``/``ip6`` from the first IP of each family, each with the
      routes whose ``dst`` is of that family (``dst``/``gw`` only); interfaces and
      interface indexes are dropped.

    Empty lists, empty ``dns`` and unset fields are omitted.

    Raises:
        DecodeError: (code 6) ``cni_version`` is not a version string.
        IncompatibleVersionError: (code 1) ``cni_version`` is unsupported, or it is
            0.1.0/0.2.0 and the result has no IP address to express.
    """
    check_supported(cni_version)
    parsed = parse_version(cni_version)
    if parsed < _V030:
        return _to_020(result, cni_version)
    v11 = parsed >= _V110
    out: dict[str, Any] = {"cniVersion": cni_version}
    interfaces = []
    for intf in result.interfaces:
        item: dict[str, Any] = {"name": intf.name}
        if intf.mac:
            item["mac"] = intf.mac
        if v11 and intf.mtu is not None:
            item["mtu"] = intf.mtu
        if intf.sandbox:
            item["sandbox"] = intf.sandbox
        if v11 and intf.socket_path is not None:
            item["socketPath"] = intf.socket_path
        if v11 and intf.pci_id is not None:
            item["pciID"] = intf.pci_id
        interfaces.append(item)
    if interfaces:
        out["interfaces"] = interfaces
    ips = []
    for ip in result.ips:
        entry: dict[str, Any] = {}
        if parsed < _V100:
            entry["version"] = str(ip.version)
        if ip.interface is not None:
            entry["interface"] = ip.interface
        entry["address"] = ip.address
        if ip.gateway is not None:
            entry["gateway"] = ip.gateway
        ips.append(entry)
    if ips:
        out["ips"] = ips
    routes = [_route_dict(r, v11) for r in result.routes]
    if routes:
        out["routes"] = routes
    dns = _dns_dict(result.dns)
    if dns:
        out["dns"] = dns
    return out


def merge_prev_result(
    prev: Result | None,
    ours: Interface,
    ips: Sequence[IPConfig],
    routes: Sequence[Route] = (),
    dns: DNS | None = None,
) -> Result:
    """The result of a chained ADD: ``prev`` (earlier plugins' result, or ``None`` when
    we are first) with our interface, addresses and routes appended.

    Our interface goes last in ``interfaces`` and each of our ``ips`` gets its index
    (CNI spec 1.1.0 "Success": plugins fill in ``interface``, which IPAM output lacks).
    Earlier entries keep their order and indexes. ``dns`` replaces the earlier DNS when
    it is given and not empty; otherwise the earlier DNS stays. Raises nothing.
    """
    base = prev if prev is not None else Result()
    index = len(base.interfaces)
    return Result(
        LATEST_VERSION,
        (*base.interfaces, ours),
        (*base.ips, *(replace(ip, interface=index) for ip in ips)),
        (*base.routes, *routes),
        dns if dns is not None and not dns.is_empty() else base.dns,
    )
