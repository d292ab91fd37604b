"""The CNI result model: one schema, the newest (1.1.0), with its values checked.

Sources: CNI spec 1.1.0 section "Success" (ADD result: ``interfaces``, ``ips``,
``routes``, ``dns``; the 1.1 additions ``mtu``/``socketPath``/``pciID`` on interfaces and
``mtu``/``advmss``/``priority``/``table``/``scope`` on routes). Each object checks and
normalises its values when built (addresses in ``ipaddress`` text form, 0 and empty
strings of ``omitempty`` fields read as unset) and raises ValueError for a value of the
wrong type or syntax; :mod:`.decode` turns that into the CNI error. The schema versions
at which the shape changes are named here for :mod:`.decode` and :mod:`.encode`.

Stdlib only: imported on every CNI call.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from cni_dra.protocol.versions import LATEST_VERSION

__all__ = [
    "Interface",
    "IPConfig",
    "Route",
    "DNS",
    "Result",
    "merge_prev_result",
    "U32_MAX",
    "V030",
    "V100",
    "V110",
]

# Where the result schema changes: 0.3.0 replaces ip4/ip6 by interfaces/ips/routes (each
# IP with its "version"), 1.0.0 drops "version", 1.1.0 adds the interface and route fields.
V030 = (0, 3, 0)
V100 = (1, 0, 0)
V110 = (1, 1, 0)


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


U32_MAX = 2**32 - 1  # netlink carries MTU, advmss, priority, table as u32


def _opt_int(value: int | None, what: str) -> int | None:
    """An int in [0, 2**32-1] or None (route ``table``/``scope``, IP ``interface``: 0 is real)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32_MAX:
        raise ValueError(f"{what} must be an integer from 0 to {U32_MAX}, got {value!r}")
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
