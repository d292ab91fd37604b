"""Write a CNI result as the JSON object of the config's spec version (at print time).

Conversion facts follow libcni's ``pkg/types/{020,040,100}`` converters: going down to
0.2.0 keeps only the first IP of each family and the routes of a family that kept an IP,
and fails when no IP is left; 1.0.0 and older drop the 1.1 fields; 0.3.x/0.4.0 add each
IP's ``version``. Output omits empty and unset fields, as the reference plugins do
(``name`` of an interface and ``address`` of an IP are always written).

Stdlib only: imported on every CNI call.
"""

from __future__ import annotations

from cni_dra.errors import IncompatibleVersionError
from cni_dra.protocol.results.cni_result import DNS, V030, V100, V110, Interface, IPConfig, Result, Route
from cni_dra.protocol.versions import check_supported, parse_version

__all__ = ["JsonObject", "result_to_dict"]

JsonObject = dict[str, object]
"""A JSON object as :func:`json.dumps` takes it."""


def _dns_dict(dns: DNS) -> JsonObject:
    out: JsonObject = {}
    if dns.nameservers:
        out["nameservers"] = list(dns.nameservers)
    if dns.domain:
        out["domain"] = dns.domain
    if dns.search:
        out["search"] = list(dns.search)
    if dns.options:
        out["options"] = list(dns.options)
    return out


def _route_dict(route: Route, v11: bool) -> JsonObject:
    out: JsonObject = {"dst": route.dst}
    if route.gw is not None:
        out["gw"] = route.gw
    if v11:
        for name in ("mtu", "advmss", "priority", "table", "scope"):
            value = getattr(route, name)
            if value is not None:
                out[name] = value
    return out


def _interface_dict(intf: Interface, v11: bool) -> JsonObject:
    out: JsonObject = {"name": intf.name}
    if intf.mac:
        out["mac"] = intf.mac
    if v11 and intf.mtu is not None:
        out["mtu"] = intf.mtu
    if intf.sandbox:
        out["sandbox"] = intf.sandbox
    if v11 and intf.socket_path is not None:
        out["socketPath"] = intf.socket_path
    if v11 and intf.pci_id is not None:
        out["pciID"] = intf.pci_id
    return out


def _ip_dict(ip: IPConfig, with_version: bool) -> JsonObject:
    out: JsonObject = {}
    if with_version:
        out["version"] = str(ip.version)
    if ip.interface is not None:
        out["interface"] = ip.interface
    out["address"] = ip.address
    if ip.gateway is not None:
        out["gateway"] = ip.gateway
    return out


def _to_020(result: Result, cni_version: str) -> JsonObject:
    out: JsonObject = {"cniVersion": cni_version}
    for key, family in (("ip4", 4), ("ip6", 6)):
        ip = next((i for i in result.ips if i.version == family), None)
        if ip is None:
            continue
        block: JsonObject = {"ip": ip.address}
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


def result_to_dict(result: Result, cni_version: str) -> JsonObject:
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
    if parsed < V030:
        return _to_020(result, cni_version)
    v11 = parsed >= V110
    out: JsonObject = {"cniVersion": cni_version}
    interfaces = [_interface_dict(intf, v11) for intf in result.interfaces]
    if interfaces:
        out["interfaces"] = interfaces
    ips = [_ip_dict(ip, with_version=parsed < V100) for ip in result.ips]
    if ips:
        out["ips"] = ips
    routes = [_route_dict(r, v11) for r in result.routes]
    if routes:
        out["routes"] = routes
    dns = _dns_dict(result.dns)
    if dns:
        out["dns"] = dns
    return out
