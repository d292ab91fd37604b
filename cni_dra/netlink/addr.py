"""Addresses, routes and IPv6 duplicate address detection on a link in a pod netns.

:func:`configure_interface` applies an IPAM result (CNI spec 1.1.0 "Success": ``ips``,
``routes``) to a link: every input is parsed first, so a bad CIDR or gateway fails
before the namespace is entered; then one socket opened inside the netns adds the
addresses, sets the link up, waits for DAD when asked and adds the routes. An address
or route that already exists counts as done.

Errors (cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.InvalidConfigError` (7): an unparsable CIDR or gateway, or
  address families that differ;
* :class:`~cni_dra.errors.NetlinkError` (102): the link is missing, a request failed
  (the message names the address or route), a duplicate IPv6 address
  (IFA_F_DADFAILED), DAD still running at the timeout;
* :class:`~cni_dra.errors.ContainerUnknownError` (3) /
  :class:`~cni_dra.errors.InvalidEnvironmentError` (4): the netns is missing / invalid.
"""

from __future__ import annotations

import errno
import ipaddress
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cni_dra.errors import InvalidConfigError, NetlinkError
from cni_dra.netlink import _pyroute2, info, sockets
from cni_dra.netlink.info import LinkInfo

__all__ = ["configure_interface"]

_IFF_UP = 0x1
_IFA_F_NODAD = 0x02
_IFA_F_DADFAILED = 0x08
_IFA_F_TENTATIVE = 0x40
_RT_SCOPE_LINK = 253
_AF_INET, _AF_INET6 = 2, 10

_Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class _Plan:
    """The parsed IPAM result: addresses, routes (destination, gateway or None), any IPv6 gateway."""

    addresses: list[_Interface]
    routes: list[tuple[_Network, _Address | None]]
    v6_gateway: bool


def configure_interface(
    netns: str,
    ifname: str,
    *,
    addresses: Sequence[tuple[str, str | None]],
    routes: Sequence[tuple[str, str | None]],
    up: bool = True,
    settle_timeout_s: float = 10.0,
    wait_ipv6: bool | None = None,
    nodad: bool = False,
    describe: bool = True,
) -> LinkInfo | None:
    """Apply an IPAM result to ``ifname`` in ``netns``: addresses, link up, IPv6 DAD, routes.

    ``addresses``: ``(CIDR, gateway)`` pairs from the result's ``ips`` (CNI spec
    1.1.0 "Success": ips[].address, ips[].gateway); the gateway is not turned
    into a route. ``routes``: ``(destination CIDR, gateway or None)`` from the
    result's ``routes``; None adds a link-scoped route via ``ifname``. Nothing
    else is added. An address or route that already exists counts as done.

    Like the reference macvlan plugin, when an IPv6 address has a gateway and
    the link is brought up, waits up to ``settle_timeout_s`` seconds for
    duplicate address detection on the given IPv6 addresses to finish
    (IFA_F_TENTATIVE cleared) before adding routes. ``wait_ipv6=True`` waits
    for every IPv6 address, gateway or not (cni-dra's ADD: addresses are
    usable when ADD returns); ``False`` never waits; ``None`` is the reference
    behaviour above. ``nodad=True`` adds IPv6 addresses with IFA_F_NODAD (no
    DAD at all, nothing to wait for).

    Returns the link with its addresses (read back), or None with ``describe=False``
    (saves two requests when the caller does not use it). A link that is already up
    is not set up again. Raises as the module docstring says.
    """
    plan = _parse(addresses, routes)
    with sockets.netns_iproute(netns) as ipr:
        with _pyroute2.translated(f"get link {ifname} in netns {netns}"):
            msg = info.get_link(ipr, ifname=ifname)
        if msg is None:
            raise NetlinkError(f"failed to configure link {ifname} in netns {netns}: no such link")
        index = msg["index"]
        _add_addresses(ipr, index, ifname, plan.addresses, nodad)
        if up:
            if not msg["flags"] & _IFF_UP:
                with _pyroute2.translated(f"set link {ifname} up"):
                    ipr.link("set", index=index, state="up")
            v6 = {str(i) for i in plan.addresses if i.version == 6}
            wait = plan.v6_gateway if wait_ipv6 is None else wait_ipv6
            if wait and v6 and not nodad:
                with _pyroute2.translated(f"wait for IPv6 DAD on {ifname}"):
                    _settle_ipv6(ipr, index, ifname, v6, settle_timeout_s)
        _add_routes(ipr, index, ifname, plan.routes)
        if not describe:
            return None
        with _pyroute2.translated(f"get link {ifname} in netns {netns}"):
            got = info.get_link(ipr, index=index)
            if got is None:
                raise NetlinkError(f"failed to configure link {ifname} in netns {netns}: link vanished")
            return info.decode_link(got, info.link_addresses(ipr, index))


def _parse(addresses: Sequence[tuple[str, str | None]], routes: Sequence[tuple[str, str | None]]) -> _Plan:
    """Parse everything up front; InvalidConfigError (7) names the first bad value."""
    parsed_addrs = [_parse_cidr(cidr, "address") for cidr, _gw in addresses]
    v6_gateway = False
    for (cidr, gw), iface in zip(addresses, parsed_addrs, strict=True):
        if gw is None:
            continue
        gw_ip = _parse_ip(gw, "gateway")
        if gw_ip.version != iface.version:
            raise InvalidConfigError(f"failed to parse address {cidr} gateway {gw}: address families differ")
        v6_gateway = v6_gateway or gw_ip.version == 6
    parsed_routes: list[tuple[_Network, _Address | None]] = []
    for dst, gw in routes:
        net = _parse_net(dst)
        via = _parse_ip(gw, "gateway") if gw is not None else None
        if via is not None and via.version != net.version:
            raise InvalidConfigError(f"failed to add route {dst} via {gw}: address families differ")
        parsed_routes.append((net, via))
    return _Plan(addresses=parsed_addrs, routes=parsed_routes, v6_gateway=v6_gateway)


def _add_addresses(ipr: Any, index: int, ifname: str, addresses: list[_Interface], nodad: bool) -> None:
    for iface in addresses:
        extra: dict[str, Any] = {}
        if nodad and iface.version == 6:
            extra["flags"] = _IFA_F_NODAD
        with _pyroute2.translated(f"add address {iface} to {ifname}"), _exists_ok():
            ipr.addr("add", index=index, address=str(iface.ip), prefixlen=iface.network.prefixlen, **extra)


def _add_routes(ipr: Any, index: int, ifname: str, routes: list[tuple[_Network, _Address | None]]) -> None:
    for net, gw_ip in routes:
        spec: dict[str, Any] = {
            "dst": str(net),
            "oif": index,
            "family": _AF_INET6 if net.version == 6 else _AF_INET,
        }
        if gw_ip is not None:
            spec["gateway"] = str(gw_ip)
        else:
            spec["scope"] = _RT_SCOPE_LINK
        label = f"add route {net}" + (f" via {gw_ip}" if gw_ip else "") + f" dev {ifname}"
        with _pyroute2.translated(label), _exists_ok():
            ipr.route("add", **spec)


def _settle_ipv6(ipr: Any, index: int, ifname: str, wanted: set[str], timeout_s: float) -> None:
    """Poll until none of ``wanted`` (CIDR strings) is tentative; raise on DAD failure or timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        tentative = []
        for msg in ipr.addr("dump", index=index, family=_AF_INET6):
            cidr = str(ipaddress.ip_interface(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}"))
            if cidr not in wanted:
                continue
            flags = msg.get_attr("IFA_FLAGS") or msg["flags"]
            if flags & _IFA_F_DADFAILED:
                raise NetlinkError(
                    f"failed to add address {cidr} to {ifname}: duplicate address detected (DAD failed)"
                )
            if flags & _IFA_F_TENTATIVE:
                tentative.append(cidr)
        if not tentative:
            return
        if time.monotonic() >= deadline:
            raise NetlinkError(
                f"failed to settle addresses of {ifname}: {', '.join(sorted(tentative))} still tentative after {timeout_s} s"
            )
        time.sleep(0.05)


@contextmanager
def _exists_ok() -> Iterator[None]:
    try:
        yield
    except _pyroute2.load().NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def _parse_cidr(text: str, what: str) -> _Interface:
    if "/" not in str(text):
        raise InvalidConfigError(f"failed to parse {what} {text!r}: not CIDR notation")
    try:
        return ipaddress.ip_interface(text)
    except ValueError as exc:
        raise InvalidConfigError(f"failed to parse {what} {text!r}: {exc}") from exc


def _parse_net(text: str) -> _Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise InvalidConfigError(f"failed to parse route destination {text!r}: {exc}") from exc


def _parse_ip(text: str, what: str) -> _Address:
    try:
        return ipaddress.ip_address(text)
    except ValueError as exc:
        raise InvalidConfigError(f"failed to parse {what} {text!r}: {exc}") from exc
