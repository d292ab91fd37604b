"""Tests for cni_dra.protocol.results: parsing any spec version, converting at print time.

Expected dicts are written by hand from the spec versions' "Result" sections, not
produced by the code under test.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.errors import DecodeError, IncompatibleVersionError
from cni_dra.protocol.results import (
    DNS,
    Interface,
    IPConfig,
    Result,
    Route,
    merge_prev_result,
    parse_result,
    result_to_dict,
)
from cni_dra.protocol.versions import SUPPORTED_VERSIONS

SAMPLE = Result(
    interfaces=[
        Interface(
            "eth0",
            mac="02:42:ac:11:00:02",
            mtu=1500,
            sandbox="/var/run/netns/c1",
            socket_path="/run/vhu.sock",
            pci_id="0000:03:00.1",
        ),
    ],
    ips=[
        IPConfig("10.1.0.5/24", gateway="10.1.0.1", interface=0),
        IPConfig("fd00::5/64", gateway="fd00::1", interface=0),
        IPConfig("10.2.0.5/16", interface=0),
    ],
    routes=[
        Route("0.0.0.0/0", gw="10.1.0.1", mtu=1400, advmss=1360, priority=100, table=200, scope=0),
        Route("::/0", gw="fd00::1"),
        Route("192.168.0.0/16"),
    ],
    dns=DNS(
        nameservers=["10.1.0.53"], domain="cluster.local", search=["svc.cluster.local"], options=["ndots:5"]
    ),
)

DNS_DICT = {
    "nameservers": ["10.1.0.53"],
    "domain": "cluster.local",
    "search": ["svc.cluster.local"],
    "options": ["ndots:5"],
}

EXPECTED_110 = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {
            "name": "eth0",
            "mac": "02:42:ac:11:00:02",
            "mtu": 1500,
            "sandbox": "/var/run/netns/c1",
            "socketPath": "/run/vhu.sock",
            "pciID": "0000:03:00.1",
        }
    ],
    "ips": [
        {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0},
        {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 0},
        {"address": "10.2.0.5/16", "interface": 0},
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0",
            "gw": "10.1.0.1",
            "mtu": 1400,
            "advmss": 1360,
            "priority": 100,
            "table": 200,
            "scope": 0,
        },
        {"dst": "::/0", "gw": "fd00::1"},
        {"dst": "192.168.0.0/16"},
    ],
    "dns": DNS_DICT,
}

EXPECTED_100 = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "mac": "02:42:ac:11:00:02", "sandbox": "/var/run/netns/c1"}],
    "ips": [
        {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0},
        {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 0},
        {"address": "10.2.0.5/16", "interface": 0},
    ],
    "routes": [
        {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
        {"dst": "::/0", "gw": "fd00::1"},
        {"dst": "192.168.0.0/16"},
    ],
    "dns": DNS_DICT,
}


def expected_04x(version: str) -> dict[str, object]:
    return {
        "cniVersion": version,
        "interfaces": [{"name": "eth0", "mac": "02:42:ac:11:00:02", "sandbox": "/var/run/netns/c1"}],
        "ips": [
            {"version": "4", "address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0},
            {"version": "6", "address": "fd00::5/64", "gateway": "fd00::1", "interface": 0},
            {"version": "4", "address": "10.2.0.5/16", "interface": 0},
        ],
        "routes": [
            {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
            {"dst": "::/0", "gw": "fd00::1"},
            {"dst": "192.168.0.0/16"},
        ],
        "dns": DNS_DICT,
    }


def expected_02x(version: str) -> dict[str, object]:
    return {
        "cniVersion": version,
        "ip4": {
            "ip": "10.1.0.5/24",
            "gateway": "10.1.0.1",
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, {"dst": "192.168.0.0/16"}],
        },
        "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1", "routes": [{"dst": "::/0", "gw": "fd00::1"}]},
        "dns": DNS_DICT,
    }


EXPECTED = {
    "1.1.0": EXPECTED_110,
    "1.0.0": EXPECTED_100,
    "0.4.0": expected_04x("0.4.0"),
    "0.3.1": expected_04x("0.3.1"),
    "0.3.0": expected_04x("0.3.0"),
    "0.2.0": expected_02x("0.2.0"),
    "0.1.0": expected_02x("0.1.0"),
}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_to_dict_matches_the_spec_shape(version: str) -> None:
    assert result_to_dict(SAMPLE, version) == EXPECTED[version]


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_to_dict_is_json_serialisable(version: str) -> None:
    assert json.loads(json.dumps(result_to_dict(SAMPLE, version))) == EXPECTED[version]


# What each version can express, written independently of the converters.
def restrict(result: Result, version: str) -> Result:
    if version == "1.1.0":
        return result
    if version in ("0.1.0", "0.2.0"):
        ip4 = next(i for i in result.ips if ipaddress.ip_interface(i.address).version == 4)
        ip6 = next(i for i in result.ips if ipaddress.ip_interface(i.address).version == 6)
        routes4 = [Route(r.dst, r.gw) for r in result.routes if ":" not in r.dst]
        routes6 = [Route(r.dst, r.gw) for r in result.routes if ":" in r.dst]
        return Result(
            ips=[IPConfig(ip4.address, ip4.gateway), IPConfig(ip6.address, ip6.gateway)],
            routes=routes4 + routes6,
            dns=result.dns,
        )
    return Result(
        interfaces=[Interface(i.name, i.mac, sandbox=i.sandbox) for i in result.interfaces],
        ips=result.ips,
        routes=[Route(r.dst, r.gw) for r in result.routes],
        dns=result.dns,
    )


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_parse_of_expected_dict_gives_what_the_version_can_express(version: str) -> None:
    assert parse_result(EXPECTED[version]) == restrict(SAMPLE, version)
    assert parse_result(EXPECTED[version], version) == restrict(SAMPLE, version)


# --- parsing foreign output ----------------------------------------------------


def test_parse_host_local_020_output() -> None:
    # what Debian's host-local 1.1.1 prints for a 0.2.0 config
    obj = {
        "cniVersion": "0.2.0",
        "ip4": {"ip": "10.9.0.3/24", "gateway": "10.9.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
        "dns": {},
    }
    assert parse_result(obj) == Result(ips=[IPConfig("10.9.0.3/24", "10.9.0.1")], routes=[Route("0.0.0.0/0")])


def test_parse_020_lists_ip4_before_ip6() -> None:
    obj = {"ip6": {"ip": "fd00::2/64"}, "ip4": {"ip": "10.0.0.2/8"}}
    assert [i.address for i in parse_result(obj).ips] == ["10.0.0.2/8", "fd00::2/64"]


def test_parse_without_version_and_rich_shape_is_latest() -> None:
    r = parse_result({"ips": [{"address": "10.0.0.2/8"}]})
    assert r.ips == (IPConfig("10.0.0.2/8"),)


def test_version_argument_used_when_object_has_none() -> None:
    # 0.4.0 requires per-IP "version"; the argument decides the schema here
    with pytest.raises(DecodeError):
        parse_result({"ips": [{"address": "10.0.0.2/8"}]}, "0.4.0")
    assert parse_result({"ips": [{"address": "10.0.0.2/8"}]}, "1.0.0").ips == (IPConfig("10.0.0.2/8"),)


def test_object_cniversion_wins_over_argument() -> None:
    obj = {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/8"}}
    assert parse_result(obj, "1.0.0").ips == (IPConfig("10.0.0.2/8"),)


def test_parse_ignores_unknown_keys() -> None:
    obj = {
        "cniVersion": "1.1.0",
        "ips": [{"address": "10.0.0.2/8", "future": 1}],
        "metadata": {},
        "interfaces": [{"name": "a", "x": 1}],
    }
    assert parse_result(obj) == Result(interfaces=[Interface("a")], ips=[IPConfig("10.0.0.2/8")])


def test_parse_normalises_addresses() -> None:
    r = parse_result(
        {"ips": [{"address": "FD00:0::0005/64", "gateway": "FD00::1"}], "routes": [{"dst": "::/0", "gw": ""}]}
    )
    assert r.ips[0] == IPConfig("fd00::5/64", "fd00::1")
    assert r.routes[0].gw is None


def test_parse_zero_counts_are_unset_but_zero_table_scope_kept() -> None:
    r = parse_result(
        {
            "interfaces": [{"name": "a", "mtu": 0}],
            "routes": [{"dst": "10.0.0.0/8", "mtu": 0, "table": 0, "scope": 0}],
        }
    )
    assert r.interfaces[0].mtu is None
    assert r.routes[0].mtu is None
    assert r.routes[0].table == 0 and r.routes[0].scope == 0


@pytest.mark.parametrize(
    "obj",
    [
        [],
        "x",
        {"cniVersion": 1},
        {"ips": {"address": "10.0.0.1/8"}},
        {"ips": [{"gateway": "10.0.0.1"}]},
        {"ips": [{"address": "10.0.0.1"}]},
        {"ips": [{"address": "10.0.0.1/255.0.0.0"}]},
        {"ips": [{"address": "10.0.0.300/8"}]},
        {"ips": [{"address": "10.0.0.1/33"}]},
        {"ips": [{"address": 167772161}]},
        {"ips": [{"address": "10.0.0.1/8", "gateway": "nope"}]},
        {"ips": [{"address": "10.0.0.1/8", "interface": -1}]},
        {"ips": [{"address": "10.0.0.1/8", "interface": True}]},
        {"ips": [{"address": "10.0.0.1/8", "interface": "0"}]},
        {"cniVersion": "0.4.0", "ips": [{"version": "6", "address": "10.0.0.1/8"}]},
        {"cniVersion": "1.0.0", "ips": [{"version": 4, "address": "10.0.0.1/8"}]},
        {"interfaces": [{"name": 3}]},
        {"interfaces": ["eth0"]},
        {"interfaces": [{"name": "a", "mtu": -1}]},
        {"interfaces": [{"name": "a", "mtu": 1500.0}]},
        {"interfaces": [{"name": "a", "mtu": 2**32}]},
        {"routes": [{"dst": "0.0.0.0/0", "table": 2**32}]},
        {"routes": [{"gw": "10.0.0.1"}]},
        {"routes": [{"dst": "default"}]},
        {"routes": [{"dst": "0.0.0.0/0", "table": "main"}]},
        {"dns": []},
        {"dns": {"nameservers": "10.0.0.53"}},
        {"dns": {"nameservers": [53]}},
        {"dns": {"domain": ["a"]}},
        {"cniVersion": "1.0.0", "ip4": {"ip": "10.0.0.1/8"}},
        {"cniVersion": "0.2.0", "ip4": {"ip": "fd00::1/64"}},
        {"cniVersion": "0.2.0", "ip6": {"ip": "10.0.0.1/8"}},
        {"cniVersion": "0.2.0", "ip4": {"gateway": "10.0.0.1"}},
        {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.1/8", "routes": [{"gw": "10.0.0.1"}]}},
        {"cniVersion": "0.2.0", "ip4": "10.0.0.1/8"},
        {"cniVersion": "junk"},
    ],
)
def test_malformed_results_are_code_6(obj: object) -> None:
    with pytest.raises(DecodeError) as info:
        parse_result(obj)
    assert info.value.code == 6


def test_unsupported_result_version_is_code_1() -> None:
    with pytest.raises(IncompatibleVersionError):
        parse_result({"cniVersion": "2.0.0", "ips": []})


# --- conversion failures -----------------------------------------------------


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_old_versions_need_an_ip(version: str) -> None:
    r = Result(interfaces=[Interface("eth0")])
    with pytest.raises(IncompatibleVersionError) as info:
        result_to_dict(r, version)
    assert info.value.code == 1
    assert version in info.value.msg


def test_to_dict_unsupported_version() -> None:
    with pytest.raises(IncompatibleVersionError):
        result_to_dict(SAMPLE, "1.2.0")


def test_to_dict_omits_empty_fields() -> None:
    assert result_to_dict(Result(), "1.1.0") == {"cniVersion": "1.1.0"}
    assert result_to_dict(Result(interfaces=[Interface("eth0")]), "1.0.0") == {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0"}],
    }


def test_020_only_v6_and_routes_of_missing_family_dropped() -> None:
    r = Result(ips=[IPConfig("fd00::2/64")], routes=[Route("0.0.0.0/0", "10.0.0.1"), Route("::/0")])
    assert result_to_dict(r, "0.2.0") == {
        "cniVersion": "0.2.0",
        "ip6": {"ip": "fd00::2/64", "routes": [{"dst": "::/0"}]},
    }


# --- model invariants --------------------------------------------------------


def test_model_is_immutable_and_hashable() -> None:
    with pytest.raises(AttributeError):
        SAMPLE.ips = ()  # type: ignore[misc]
    assert hash(SAMPLE) == hash(replace(SAMPLE))
    assert isinstance(SAMPLE.ips, tuple)


@pytest.mark.parametrize(
    "make",
    [
        lambda: IPConfig("10.0.0.1"),
        lambda: Route("10.0.0.0/8", gw="x"),
        lambda: Interface("a", mtu=-5),
        lambda: DNS(nameservers="10.0.0.53"),
        lambda: Result(ips=["10.0.0.1/8"]),
    ],
)
def test_invalid_models_raise_value_error(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


# --- merge for chaining --------------------------------------------------------


def test_merge_without_prev() -> None:
    ours = Interface("net1", mac="02:00:00:00:00:01", sandbox="/ns")
    m = merge_prev_result(None, ours, [IPConfig("10.0.0.2/24", "10.0.0.1")], [Route("0.0.0.0/0", "10.0.0.1")])
    assert m == Result(
        interfaces=[ours],
        ips=[IPConfig("10.0.0.2/24", "10.0.0.1", interface=0)],
        routes=[Route("0.0.0.0/0", "10.0.0.1")],
    )


def test_merge_keeps_earlier_plugins_and_points_at_ours() -> None:
    prev = Result(
        interfaces=[Interface("cni0"), Interface("eth0", sandbox="/ns")],
        ips=[IPConfig("10.244.0.5/24", interface=1)],
        routes=[Route("0.0.0.0/0", "10.244.0.1")],
        dns=DNS(nameservers=["10.96.0.10"]),
    )
    ours = Interface("net1", sandbox="/ns")
    m = merge_prev_result(prev, ours, [IPConfig("192.168.5.2/24", interface=7)], [Route("192.168.0.0/16")])
    assert [i.name for i in m.interfaces] == ["cni0", "eth0", "net1"]
    assert m.ips == (IPConfig("10.244.0.5/24", interface=1), IPConfig("192.168.5.2/24", interface=2))
    assert m.routes == (Route("0.0.0.0/0", "10.244.0.1"), Route("192.168.0.0/16"))
    assert m.dns == DNS(nameservers=["10.96.0.10"])


def test_merge_dns_ours_replaces_when_set() -> None:
    prev = Result(dns=DNS(nameservers=["10.96.0.10"]))
    ours_dns = DNS(nameservers=["192.168.5.53"])
    assert merge_prev_result(prev, Interface("a"), [], dns=ours_dns).dns == ours_dns
    assert merge_prev_result(prev, Interface("a"), [], dns=DNS()).dns == prev.dns


# --- round-trip properties -----------------------------------------------------

_v4 = st.builds(lambda a, p: f"{a}/{p}", st.ip_addresses(v=4), st.integers(0, 32))
_v6 = st.builds(lambda a, p: f"{a}/{p}", st.ip_addresses(v=6), st.integers(0, 128))
_gw = st.none() | st.ip_addresses().map(str)
_small = st.none() | st.integers(0, 65535)
_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)

_interfaces = st.builds(
    Interface,
    name=_text,
    mac=_text,
    mtu=_small,
    sandbox=_text,
    socket_path=st.none() | _text,
    pci_id=st.none() | _text,
)
_routes = st.builds(
    Route,
    dst=_v4 | _v6,
    gw=_gw,
    mtu=_small,
    advmss=_small,
    priority=_small,
    table=_small,
    scope=st.none() | st.integers(0, 255),
)
_dns = st.builds(
    DNS,
    nameservers=st.lists(_text, max_size=3),
    domain=_text,
    search=st.lists(_text, max_size=3),
    options=st.lists(_text, max_size=3),
)


@st.composite
def results(draw: st.DrawFn, need_both_families: bool = False) -> Result:
    interfaces = draw(st.lists(_interfaces, max_size=3))
    index = st.none() | (st.integers(0, len(interfaces) - 1) if interfaces else st.none())
    ips = draw(st.lists(st.builds(IPConfig, address=_v4 | _v6, gateway=_gw, interface=index), max_size=4))
    if need_both_families:
        ips += [IPConfig(draw(_v4)), IPConfig(draw(_v6))]
    return Result(interfaces=interfaces, ips=ips, routes=draw(st.lists(_routes, max_size=4)), dns=draw(_dns))


@pytest.mark.parametrize("version", [v for v in SUPPORTED_VERSIONS if v >= "0.3.0"])
@given(result=results())
def test_roundtrip_rich_versions(version: str, result: Result) -> None:
    out = result_to_dict(result, version)
    assert json.loads(json.dumps(out)) == out
    assert parse_result(out, version) == restrict(result, version)


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
@given(result=results(need_both_families=True))
def test_roundtrip_020(version: str, result: Result) -> None:
    assert parse_result(result_to_dict(result, version), version) == restrict(result, version)


@given(result=results())
def test_to_dict_at_latest_then_parse_is_identity(result: Result) -> None:
    assert parse_result(result_to_dict(result, "1.1.0")) == result


@given(result=results(), ours=_interfaces, n=st.integers(0, 3))
def test_merge_property(result: Result, ours: Interface, n: int) -> None:
    new_ips = [IPConfig(f"10.0.0.{i + 1}/24") for i in range(n)]
    m = merge_prev_result(result, ours, new_ips)
    assert m.interfaces[: len(result.interfaces)] == result.interfaces
    assert m.interfaces[-1] == ours
    assert m.ips[: len(result.ips)] == result.ips
    assert all(ip.interface == len(result.interfaces) for ip in m.ips[len(result.ips) :])
    assert len(m.ips) == len(result.ips) + n


# --- fuzz: foreign input never escapes as anything but a CNI error -------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "cniVersion",
        "interfaces",
        "ips",
        "routes",
        "dns",
        "ip4",
        "ip6",
        "address",
        "gateway",
        "interface",
        "version",
        "dst",
        "gw",
        "name",
        "mtu",
        "ip",
    ]
)
_result_like = st.recursive(
    st.none()
    | st.integers(-3, 3)
    | st.sampled_from(["10.0.0.1/8", "fd00::1/64", "10.0.0.1", "1.1.0", "0.2.0", "0.4.0", "4", "6", "x"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=16,
)


@given(obj=_json | _result_like, version=st.none() | st.sampled_from(SUPPORTED_VERSIONS))
def test_parse_result_only_raises_cni_errors(obj: object, version: str | None) -> None:
    try:
        parsed = parse_result(obj, version)
    except (DecodeError, IncompatibleVersionError):
        return
    assert isinstance(parsed, Result)
    # whatever parsed can be printed at the latest version and read back unchanged
    assert parse_result(result_to_dict(parsed, "1.1.0")) == parsed
