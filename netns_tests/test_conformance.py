"""CNI 1.1 conformance of the installed cni-dra, run as a runtime runs it.

Every spec version cni-dra accepts: ADD, CHECK, DEL, STATUS and GC for macvlan with
L2-only, host-local (IPv4, IPv6, dual stack) and static IPAM; the version gates; the
result shapes; the named cases (DEL without ADD, CNI_IFNAME already present, MAC from
CNI_ARGS, mtu above the parent, GC with an empty list, STATUS on 0.4.0); macvlan options;
chaining with prevResult; CHECK after changes later plugins make. ipvlan: test_ipvlan.py.
"""

from __future__ import annotations

import ipaddress
import subprocess

import pytest

from netns_tests.bed import (
    CHECK_VERSIONS,
    IPAM_KINDS,
    RICH_VERSIONS,
    SPEC_NODE,
    V4_SUBNET,
    V6_SUBNET,
    VERSIONS,
    NodeBed,
    addr_flags,
    links_named,
    sysctl_in_netns,
)
from netns_tests.runner import host_ifindex, link_in_netns

IFA_F_TENTATIVE = 0x40
IFA_F_NODAD = 0x02


@pytest.fixture
def bed(make_node) -> NodeBed:
    return make_node(nics=1, **SPEC_NODE)


@pytest.fixture
def bed2(make_node) -> NodeBed:
    return make_node(nics=2, **SPEC_NODE)


def _expected_ips(ipam: str, link: dict) -> list[str]:
    if ipam == "l2":
        return []
    if ipam == "static":
        return ["198.51.100.77/24"]
    return sorted(link["ipv4"] + link["ipv6"])


def _routes(netns: str, family: int) -> list[tuple[str, str | None]]:
    from pyroute2 import IPRoute

    with IPRoute(netns=netns) as ipr:
        out = []
        for r in ipr.route("dump", family=family, table=254):
            dst = r.get_attr("RTA_DST")
            if dst is None:
                continue
            out.append((f"{dst}/{r['dst_len']}", r.get_attr("RTA_GATEWAY")))
    return out


# --------------------------------------------------------------------------- lifecycle per version


@pytest.mark.parametrize("ipam", IPAM_KINDS)
@pytest.mark.parametrize("version", RICH_VERSIONS)
def test_add_check_status_del(bed: NodeBed, version: str, ipam: str) -> None:
    netns = bed.make_netns()
    conf = bed.spec_conf(version, ipam)
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    assert res["cniVersion"] == version

    link = link_in_netns(netns, "eth0")
    assert link is not None and link["kind"] == "macvlan"
    assert link["parent_ifindex"] == host_ifindex(bed.nics[0])
    want_iface = {"name": "eth0", "mac": link["mac"], "sandbox": netns}
    if version == "1.1.0":
        want_iface["mtu"] = link["mtu"]  # interface mtu exists from 1.1.0 on
    assert res["interfaces"] == [want_iface]

    addresses = [ip["address"] for ip in res.get("ips", [])]
    assert sorted(addresses) == _expected_ips(ipam, link)
    assert sorted(link["ipv4"] + link["ipv6"]) == sorted(addresses)
    for ip in res.get("ips", []):
        assert ip["interface"] == 0
        family = str(ipaddress.ip_interface(ip["address"]).version)
        if version in ("1.0.0", "1.1.0"):
            assert "version" not in ip
        else:
            assert ip["version"] == family
    if ipam == "l2":
        assert "ips" not in res and "routes" not in res
    if ipam == "static":
        # routes and gateway come from the IPAM result, never invented
        assert res["routes"] == [{"dst": "203.0.113.0/24", "gw": "198.51.100.1"}]
        assert ("203.0.113.0/24", "198.51.100.1") in _routes(netns, 2)
    if ipam in ("host-local-v6", "host-local-dual"):
        flags = addr_flags(netns, "eth0")
        v6 = [a for a in addresses if ":" in a]
        assert v6 and all(not flags[a] & IFA_F_TENTATIVE for a in v6), flags  # ready when ADD returns
    if ipam.startswith("host-local"):
        assert len(bed.ipam_reservations()) == len(addresses)

    with_prev = {**conf, "prevResult": res}
    code, out, err = bed.run("CHECK", with_prev, netns, cid="c1")
    if version in CHECK_VERSIONS:
        assert code == 0, (out, err)
    else:
        assert code == 1 and out["code"] == 1, (out, err)

    code, out, err = bed.run("STATUS", conf)
    assert (code, out) == ((0, None) if version == "1.1.0" else (1, out)), (out, err)
    if version != "1.1.0":
        assert out["code"] == 1

    for _ in range(2):  # DEL, then DEL again: both succeed
        code, out, err = bed.run("DEL", with_prev, netns, cid="c1")
        assert code == 0, (out, err)
    assert link_in_netns(netns, "eth0") is None
    assert bed.attachments() == []
    assert bed.ipam_reservations() == []


def _in(cidr: str, subnet: str) -> bool:
    return ipaddress.ip_interface(cidr).network == ipaddress.ip_network(subnet)


@pytest.mark.parametrize("ipam", ["host-local-v4", "host-local-v6", "host-local-dual", "static"])
@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_old_versions_use_the_ip4_ip6_shape(bed: NodeBed, version: str, ipam: str) -> None:
    """CNI 0.1.0/0.2.0 "Result": ``{"cniVersion", "ip4"?: {"ip", "gateway"?, "routes"?},
    "ip6"?: {...}, "dns"?}`` -- one object per family, no ``interfaces``/``ips``. The
    gateways below are host-local's documented default (the subnet's first address) and
    the configured static ones; the routes are the configured ones of that family."""
    netns = bed.make_netns()
    conf = bed.spec_conf(version, ipam)
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    link = link_in_netns(netns, "eth0")
    assert link is not None and link["kind"] == "macvlan"
    assert res.pop("dns", {}) == {}  # optional; nothing configured
    families = {
        "host-local-v4": {"ip4"},
        "host-local-v6": {"ip6"},
        "host-local-dual": {"ip4", "ip6"},
        "static": {"ip4"},
    }[ipam]
    assert set(res) == {"cniVersion"} | families
    assert res["cniVersion"] == version
    if ipam == "static":
        assert res["ip4"] == {
            "ip": "198.51.100.77/24",
            "gateway": "198.51.100.1",
            "routes": [{"dst": "203.0.113.0/24", "gw": "198.51.100.1"}],
        }
    elif ipam == "host-local-v4":
        assert set(res["ip4"]) == {"ip", "gateway", "routes"} and _in(res["ip4"]["ip"], V4_SUBNET)
        assert res["ip4"]["gateway"] == "198.51.100.1"
        assert res["ip4"]["routes"] == [{"dst": "203.0.113.0/24"}]
    else:
        if "ip4" in families:
            assert set(res["ip4"]) == {"ip", "gateway"} and _in(res["ip4"]["ip"], V4_SUBNET)
            assert res["ip4"]["gateway"] == "198.51.100.1"
        assert set(res["ip6"]) == {"ip", "gateway"} and _in(res["ip6"]["ip"], V6_SUBNET)
        assert res["ip6"]["gateway"] == "2001:db8:4::1"
        assert not addr_flags(netns, "eth0")[res["ip6"]["ip"]] & IFA_F_TENTATIVE
    # the addresses are on the link, and nothing else is
    assert link["ipv4"] == ([res["ip4"]["ip"]] if "ip4" in res else [])
    assert link["ipv6"] == ([res["ip6"]["ip"]] if "ip6" in res else [])
    if ipam.startswith("host-local"):
        assert len(bed.ipam_reservations()) == len(families)
    assert bed.attachments() == [("c1", "eth0")]

    for _ in range(2):  # DEL, then DEL again: both succeed, nothing is printed
        code, out, err = bed.run("DEL", conf, netns, cid="c1")
        assert (code, out) == (0, None), (out, err)
    assert [n for n, _ in links_named(netns)] == ["lo"]
    assert not [n for n, _ in links_named() if n.startswith("cdra")]
    assert bed.attachments() == [] and bed.ipam_reservations() == []
    assert bed.status()["devices"][0]["consumed"]["bandwidth"] == "0"


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_old_versions_refuse_l2_only_before_any_effect(bed: NodeBed, version: str) -> None:
    netns = bed.make_netns()
    code, out, err = bed.run("ADD", bed.spec_conf(version, "l2"), netns, cid="c1")
    assert code == 1 and out["code"] == 1, (out, err)
    assert "ip4/ip6" in out["msg"]
    assert link_in_netns(netns, "eth0") is None
    assert [n for n, _ in links_named(netns)] == ["lo"]
    assert bed.attachments() == []


@pytest.mark.parametrize("version", VERSIONS)
def test_del_without_prior_add_succeeds(bed: NodeBed, version: str) -> None:
    netns = bed.make_netns()
    code, out, err = bed.run("DEL", bed.spec_conf(version, "host-local-v4"), netns, cid="never-added")
    assert (code, out) == (0, None), err
    code, out, err = bed.run("DEL", bed.spec_conf(version, "host-local-v4"), "", cid="never-added")
    assert (code, out) == (0, None), err


@pytest.mark.parametrize(
    "command,version",
    [
        ("STATUS", "0.4.0"),
        ("STATUS", "1.0.0"),
        ("GC", "0.4.0"),
        ("GC", "1.0.0"),
        ("CHECK", "0.3.1"),
        ("CHECK", "0.2.0"),
    ],
)
def test_verbs_gated_by_version_give_code_1(bed: NodeBed, command: str, version: str) -> None:
    netns = bed.make_netns()
    code, out, err = bed.run(command, bed.spec_conf(version, "host-local-v4"), netns)
    assert code == 1 and out["code"] == 1, (out, err)
    assert out["cniVersion"] == version
    assert command in out["msg"]


def test_version_lists_every_version(bed: NodeBed) -> None:
    code, out, err = bed.run("VERSION", {"cniVersion": "1.1.0"})
    assert code == 0, err
    assert out["supportedVersions"] == VERSIONS


# --------------------------------------------------------------------------- GC


@pytest.mark.parametrize("key", ["cni.dev/valid-attachments", "cni.dev/attachments"])
def test_gc_releases_what_the_list_does_not_name(bed: NodeBed, key: str) -> None:
    ns1, ns2, ns3 = bed.make_netns(), bed.make_netns(), bed.make_netns()
    conf = bed.spec_conf("1.1.0", "host-local-dual")
    for cid, ns in (("c1", ns1), ("c2", ns2), ("c3", ns3)):
        code, out, err = bed.run("ADD", conf, ns, cid=cid)
        assert code == 0, (out, err)
    assert len(bed.ipam_reservations()) == 6
    bed.age_attachments()  # the runtime's list postdates these ADDs

    code, out, err = bed.run("GC", {**conf, key: [{"containerID": "c2", "ifname": "eth0"}]})
    assert (code, out) == (0, None), err
    assert bed.attachments() == [("c2", "eth0")]
    assert link_in_netns(ns1, "eth0") is None and link_in_netns(ns3, "eth0") is None
    assert link_in_netns(ns2, "eth0") is not None
    assert len(bed.ipam_reservations()) == 2

    code, out, err = bed.run("GC", {**conf, key: []})
    assert (code, out) == (0, None), err
    assert bed.attachments() == []
    assert link_in_netns(ns2, "eth0") is None
    assert bed.ipam_reservations() == []
    assert bed.status()["devices"][0]["consumed"]["bandwidth"] == "0"


def test_gc_leaves_other_networks_alone(bed: NodeBed) -> None:
    ns1, ns2 = bed.make_netns(), bed.make_netns()
    a, b = bed.spec_conf("1.1.0", "l2", name="net-a"), bed.spec_conf("1.1.0", "l2", name="net-b")
    assert bed.run("ADD", a, ns1, cid="c1")[0] == 0
    assert bed.run("ADD", b, ns2, cid="c2")[0] == 0
    bed.age_attachments()
    code, out, err = bed.run("GC", {**a, "cni.dev/valid-attachments": []})
    assert code == 0, (out, err)
    assert bed.attachments() == [("c2", "eth0")]
    assert link_in_netns(ns2, "eth0") is not None
    assert bed.run("DEL", b, ns2, cid="c2")[0] == 0


def test_gc_with_netns_gone_still_releases(bed: NodeBed) -> None:
    from netns_tests.conftest import remove_netns

    ns = bed.make_netns()
    conf = bed.spec_conf("1.1.0", "host-local-v4")
    assert bed.run("ADD", conf, ns, cid="c1")[0] == 0
    remove_netns(ns)
    bed.age_attachments()
    code, out, err = bed.run("GC", {**conf, "cni.dev/valid-attachments": []})
    assert code == 0, (out, err)
    assert bed.attachments() == [] and bed.ipam_reservations() == []


def test_gc_without_a_list_collects_nothing(bed: NodeBed) -> None:
    """A GC config with neither cni.dev/valid-attachments nor cni.dev/attachments (a hand-run,
    a runtime bug): exit 0 and every pod keeps its link, IP and capacity."""
    nss = {cid: bed.make_netns() for cid in ("c1", "c2")}
    conf = bed.spec_conf("1.1.0", "host-local-v4")
    for cid, ns in nss.items():
        assert bed.run("ADD", conf, ns, cid=cid)[0] == 0
    bed.age_attachments()
    before = (bed.attachments(), bed.ipam_reservations(), bed.status()["devices"][0]["consumed"])
    code, out, err = bed.run("GC", conf)
    assert (code, out) == (0, None), err
    assert (bed.attachments(), bed.ipam_reservations(), bed.status()["devices"][0]["consumed"]) == before
    assert all(link_in_netns(ns, "eth0") is not None for ns in nss.values())
    for cid, ns in nss.items():
        assert bed.run("DEL", conf, ns, cid=cid)[0] == 0


def test_gc_spares_an_attachment_that_became_ready_after_the_list_was_built(bed: NodeBed) -> None:
    """The runtime built its list, an ADD finished, then GC arrived: the new attachment keeps
    its link, IP and capacity (ready moments ago: within the grace period), and GC exits 0.
    Once it is older than the grace period, a GC that does not list it collects it."""
    ns = bed.make_netns()
    conf = bed.spec_conf("1.1.0", "host-local-v4")
    stale_list: list[dict[str, str]] = []  # built before the ADD
    code, out, err = bed.run("ADD", conf, ns, cid="c1")
    assert code == 0, (out, err)
    code, out, err = bed.run("GC", {**conf, "cni.dev/valid-attachments": stale_list})
    assert (code, out) == (0, None), err
    assert bed.attachments() == [("c1", "eth0")] and link_in_netns(ns, "eth0") is not None
    assert len(bed.ipam_reservations()) == 1  # the IPAM plugin's GC was told to keep it too
    assert bed.status()["devices"][0]["consumed"]["bandwidth"] == "1G"
    bed.age_attachments()
    code, out, err = bed.run("GC", {**conf, "cni.dev/valid-attachments": stale_list})
    assert (code, out) == (0, None), err
    assert bed.attachments() == [] and link_in_netns(ns, "eth0") is None and bed.ipam_reservations() == []


def test_disable_gc_in_the_plugin_config_is_accepted_and_gc_does_nothing(bed: NodeBed) -> None:
    ns = bed.make_netns()
    conf = bed.spec_conf("1.1.0", "host-local-v4", disableGC=True)
    code, out, err = bed.run("ADD", conf, ns, cid="c1")
    assert code == 0, (out, err)
    bed.age_attachments()
    code, out, err = bed.run("GC", {**conf, "cni.dev/valid-attachments": []})
    assert (code, out) == (0, None), err
    assert bed.attachments() == [("c1", "eth0")] and link_in_netns(ns, "eth0") is not None
    assert len(bed.ipam_reservations()) == 1
    assert bed.run("DEL", conf, ns, cid="c1")[0] == 0


# --------------------------------------------------------------------------- named cases


def test_add_when_ifname_exists_fails_and_leaves_nothing(bed: NodeBed) -> None:
    netns = bed.make_netns()
    subprocess.run(
        ["ip", "-n", netns.rsplit("/", 1)[1], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"],
        check=True,
    )
    before_ns = sorted(links_named(netns))
    code, out, err = bed.run("ADD", bed.spec_conf("1.1.0", "host-local-v4"), netns, cid="c1")
    assert code == 1 and out["code"] == 4, (out, err)
    assert "already exists" in out["msg"]
    assert sorted(links_named(netns)) == before_ns  # no temporary link left in the pod
    assert not [n for n, _ in links_named() if n.startswith("cdra")]  # nor on the host (temporary names)
    assert link_in_netns(netns, "eth0")["kind"] == "veth"  # the existing one is untouched
    assert bed.attachments() == [] and bed.ipam_reservations() == []
    assert bed.status()["devices"][0]["consumed"]["bandwidth"] == "0"


def test_mac_from_cni_args_with_ignore_unknown_true(bed: NodeBed) -> None:
    netns = bed.make_netns()
    args = "IgnoreUnknown=true;MAC=c2:11:22:33:44:55;K8S_POD_NAME=p;SOMETHING_ELSE=x"
    code, res, err = bed.run("ADD", bed.spec_conf("1.1.0", "host-local-v4"), netns, cid="c1", cni_args=args)
    assert code == 0, (res, err)
    assert link_in_netns(netns, "eth0")["mac"] == "c2:11:22:33:44:55"
    assert res["interfaces"][0]["mac"] == "c2:11:22:33:44:55"


def test_unknown_cni_args_key_without_ignore_unknown_is_refused(bed: NodeBed) -> None:
    netns = bed.make_netns()
    code, out, err = bed.run(
        "ADD", bed.spec_conf("1.1.0", "l2"), netns, cid="c1", cni_args="MAC=c2:11:22:33:44:55;FOO=1"
    )
    assert code == 1 and out["code"] == 2 and "FOO" in out["msg"], (out, err)
    assert link_in_netns(netns, "eth0") is None


def test_mtu_above_parent_is_code_7_and_no_link(bed: NodeBed) -> None:
    netns = bed.make_netns()
    code, out, err = bed.run("ADD", bed.spec_conf("1.1.0", "host-local-v4", mtu=9000), netns, cid="c1")
    assert code == 1 and out["code"] == 7, (out, err)
    assert "9000" in out["msg"] and "1500" in out["msg"]
    assert link_in_netns(netns, "eth0") is None
    assert [n for n, _ in links_named(netns)] == ["lo"]
    assert bed.attachments() == [] and bed.ipam_reservations() == []


# --------------------------------------------------------------------------- macvlan options


@pytest.mark.parametrize(
    "conf_mac,args_mac,rc_mac,capability,want",
    [
        ("c2:00:00:00:00:01", None, None, False, "c2:00:00:00:00:01"),
        ("c2:00:00:00:00:01", "c2:00:00:00:00:02", None, False, "c2:00:00:00:00:02"),
        ("c2:00:00:00:00:01", "c2:00:00:00:00:02", "c2:00:00:00:00:03", True, "c2:00:00:00:00:03"),
        ("c2:00:00:00:00:01", "c2:00:00:00:00:02", "c2:00:00:00:00:03", False, "c2:00:00:00:00:02"),
        (None, None, "C2:00:00:00:00:04", True, "c2:00:00:00:00:04"),
    ],
)
def test_mac_precedence(bed: NodeBed, conf_mac, args_mac, rc_mac, capability, want) -> None:
    netns = bed.make_netns()
    extra: dict = {}
    if conf_mac:
        extra["mac"] = conf_mac
    if rc_mac:
        extra["runtimeConfig"] = {"mac": rc_mac}
    if capability:
        extra["capabilities"] = {"mac": True}
    args = "IgnoreUnknown=1" + (f";MAC={args_mac}" if args_mac else "")
    code, res, err = bed.run("ADD", bed.spec_conf("1.1.0", "l2", **extra), netns, cid="c1", cni_args=args)
    assert code == 0, (res, err)
    assert link_in_netns(netns, "eth0")["mac"] == want


@pytest.mark.parametrize(
    "where,mac",
    [
        ("conf", "01:00:5e:00:00:01"),
        ("conf", "c2:11:22:33:44"),
        ("args", "33:33:00:00:00:01"),
        ("args", "zz:11:22:33:44:55"),
        ("runtime", "ff:ff:ff:ff:ff:ff"),
    ],
)
def test_bad_mac_is_code_7_before_ipam(bed: NodeBed, where: str, mac: str) -> None:
    netns = bed.make_netns()
    extra: dict = {}
    args = "IgnoreUnknown=1"
    if where == "conf":
        extra["mac"] = mac
    elif where == "args":
        args += f";MAC={mac}"
    else:
        extra.update(runtimeConfig={"mac": mac}, capabilities={"mac": True})
    code, out, err = bed.run(
        "ADD", bed.spec_conf("1.1.0", "host-local-v4", **extra), netns, cid="c1", cni_args=args
    )
    assert code == 1 and out["code"] == 7, (out, err)
    assert mac in out["msg"]
    assert link_in_netns(netns, "eth0") is None
    assert bed.ipam_reservations() == [] and bed.attachments() == []


def test_duplicate_mac_on_the_parent_is_refused(bed: NodeBed) -> None:
    ns1, ns2 = bed.make_netns(), bed.make_netns()
    conf = bed.spec_conf("1.1.0", "host-local-v4", mac="c2:11:22:33:44:66")
    assert bed.run("ADD", conf, ns1, cid="c1")[0] == 0
    code, out, err = bed.run("ADD", conf, ns2, cid="c2")
    assert code == 1 and out["code"] == 7, (out, err)
    assert "c2:11:22:33:44:66" in out["msg"] and "already used" in out["msg"] and "c1" in out["msg"]
    assert link_in_netns(ns2, "eth0") is None
    assert bed.attachments() == [("c1", "eth0")] and len(bed.ipam_reservations()) == 1


def test_parent_own_mac_is_refused(bed: NodeBed) -> None:
    netns = bed.make_netns()
    with open(f"/sys/class/net/{bed.nics[0]}/address") as fh:
        parent_mac = fh.read().strip()
    code, out, err = bed.run("ADD", bed.spec_conf("1.1.0", "l2", mac=parent_mac), netns, cid="c1")
    assert code == 1 and out["code"] == 7 and "parent" in out["msg"], (out, err)
    assert link_in_netns(netns, "eth0") is None


def test_duplicate_mac_outside_our_state_is_refused_by_the_kernel(bed: NodeBed) -> None:
    """A macvlan that cni-dra did not create holds the MAC: the kernel's EADDRINUSE is
    reported as code 7 naming the MAC, and the new link is gone again."""
    from netns_tests.conftest import delete_host_link, unique_name

    other = unique_name()
    subprocess.run(
        [
            "ip",
            "link",
            "add",
            other,
            "link",
            bed.nics[0],
            "address",
            "c2:11:22:33:44:77",
            "type",
            "macvlan",
            "mode",
            "bridge",
        ],
        check=True,
    )
    try:
        subprocess.run(["ip", "link", "set", other, "up"], check=True)
        netns = bed.make_netns()
        code, out, err = bed.run(
            "ADD", bed.spec_conf("1.1.0", "l2", mac="c2:11:22:33:44:77"), netns, cid="c1"
        )
        assert code == 1 and out["code"] == 7, (out, err)
        assert "c2:11:22:33:44:77" in out["msg"] and "already in use" in out["msg"]
        assert [n for n, _ in links_named(netns)] == ["lo"]
        assert bed.attachments() == []
    finally:
        delete_host_link(other)


def test_bcqueuelen_and_notify_sysctls(bed: NodeBed) -> None:
    from cni_dra.netlink.info import link_in_netns as nl_link

    netns = bed.make_netns()
    code, res, err = bed.run("ADD", bed.spec_conf("1.1.0", "l2", bcqueuelen=321), netns, cid="c1")
    assert code == 0, (res, err)
    assert nl_link(netns, "eth0").bcqueuelen == 321
    assert sysctl_in_netns(netns, "net/ipv4/conf/eth0/arp_notify") == "1"
    assert sysctl_in_netns(netns, "net/ipv6/conf/eth0/ndisc_notify") == "1"


@pytest.mark.parametrize("mode", ["bridge", "private", "vepa", "passthru"])
def test_macvlan_modes(bed: NodeBed, mode: str) -> None:
    from cni_dra.netlink.info import link_in_netns as nl_link

    netns = bed.make_netns()
    conf = bed.spec_conf("1.1.0", "l2", mode=mode)
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    assert nl_link(netns, "eth0").mode == mode
    assert bed.run("CHECK", {**conf, "prevResult": res}, netns, cid="c1")[0] == 0
    assert bed.run("DEL", conf, netns, cid="c1")[0] == 0


def test_l2_only_link_is_up_without_addresses(bed: NodeBed) -> None:
    netns = bed.make_netns()
    code, res, err = bed.run("ADD", bed.spec_conf("1.0.0", "l2"), netns, cid="c1")
    assert code == 0, (res, err)
    link = link_in_netns(netns, "eth0")
    assert link["ipv4"] == [] and link["ipv6"] == []
    from cni_dra.netlink.info import link_in_netns as nl_link

    assert nl_link(netns, "eth0").admin_up


def test_nodad_adds_ipv6_without_dad(bed: NodeBed) -> None:
    netns = bed.make_netns()
    code, res, err = bed.run("ADD", bed.spec_conf("1.1.0", "host-local-v6", nodad=True), netns, cid="c1")
    assert code == 0, (res, err)
    flags = addr_flags(netns, "eth0")
    (v6,) = [ip["address"] for ip in res["ips"]]
    assert flags[v6] & IFA_F_NODAD and not flags[v6] & IFA_F_TENTATIVE


# --------------------------------------------------------------------------- static IPAM


def test_static_ips_from_runtime_config_with_capability(bed: NodeBed) -> None:
    netns = bed.make_netns()
    conf = bed.spec_conf(
        "1.1.0",
        "static-rc",
        capabilities={"ips": True},
        runtimeConfig={"ips": ["198.51.100.88/24", "2001:db8:4::88/64"]},
    )
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    assert sorted(ip["address"] for ip in res["ips"]) == ["198.51.100.88/24", "2001:db8:4::88/64"]
    link = link_in_netns(netns, "eth0")
    assert link["ipv4"] == ["198.51.100.88/24"] and link["ipv6"] == ["2001:db8:4::88/64"]
    assert bed.run("DEL", conf, netns, cid="c1")[0] == 0


# --------------------------------------------------------------------------- dhcp IPAM


def test_dhcp_without_daemon_fails_cleanly_and_status_says_why(bed: NodeBed, tmp_path) -> None:
    netns = bed.make_netns()
    sock = str(tmp_path / "no-dhcp.sock")
    conf = bed.spec_conf("1.1.0", {"type": "dhcp", "daemonSocketPath": sock})
    code, out, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 1 and out["code"] == 11, (out, err)
    assert "dhcp" in out["msg"] and sock in out["msg"]
    assert link_in_netns(netns, "eth0") is None and bed.attachments() == []
    code, out, err = bed.run("STATUS", conf)
    assert code == 1 and out["code"] == 50, (out, err)
    assert sock in out["msg"]


# --------------------------------------------------------------------------- chaining


@pytest.mark.parametrize("version", RICH_VERSIONS)
def test_chained_add_keeps_earlier_results(bed: NodeBed, version: str) -> None:
    netns = bed.make_netns()
    old_ip = {"address": "192.0.2.9/24", "interface": 1}
    if version not in ("1.0.0", "1.1.0"):
        old_ip["version"] = "4"
    prev = {
        "cniVersion": version,
        "interfaces": [{"name": "host-side"}, {"name": "eth9", "sandbox": netns}],
        "ips": [old_ip],
        "routes": [{"dst": "192.0.2.0/24"}],
    }
    conf = bed.spec_conf(version, "host-local-v4", prevResult=prev)
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    assert [i["name"] for i in res["interfaces"]] == ["host-side", "eth9", "eth0"]
    assert res["ips"][0] == old_ip
    assert [ip["interface"] for ip in res["ips"]] == [1, 2]
    assert res["routes"][0] == {"dst": "192.0.2.0/24"}
    code, out, err = bed.run(
        "CHECK" if version in CHECK_VERSIONS else "DEL", {**conf, "prevResult": res}, netns, cid="c1"
    )
    assert code == 0, (out, err)
    assert bed.run("DEL", {**conf, "prevResult": res}, netns, cid="c1")[0] == 0


def test_check_tolerates_later_plugins_and_compares_netns_by_identity(bed: NodeBed) -> None:
    netns = bed.make_netns()
    conf = bed.spec_conf("1.1.0", "host-local-v4")
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    name = netns.rsplit("/", 1)[1]
    # what tuning would do: another MTU and a sysctl
    subprocess.run(["ip", "-n", name, "link", "set", "eth0", "mtu", "1400"], check=True)
    subprocess.run(
        ["ip", "netns", "exec", name, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/eth0/arp_ignore"],
        check=True,
    )
    assert netns.startswith("/var/run/netns/")
    same_ns_other_path = "/run/netns/" + name
    code, out, err = bed.run("CHECK", {**conf, "prevResult": res}, same_ns_other_path, cid="c1")
    assert code == 0, (out, err)
    # a different namespace is a mismatch
    other = bed.make_netns()
    code, out, err = bed.run("CHECK", {**conf, "prevResult": res}, other, cid="c1")
    assert code == 1 and out["code"] == 105, (out, err)
    assert bed.run("DEL", {**conf, "prevResult": res}, netns, cid="c1")[0] == 0


def test_check_detects_removed_address(bed: NodeBed) -> None:
    netns = bed.make_netns()
    conf = bed.spec_conf("1.0.0", "host-local-v4")
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    name = netns.rsplit("/", 1)[1]
    subprocess.run(["ip", "-n", name, "addr", "del", res["ips"][0]["address"], "dev", "eth0"], check=True)
    code, out, err = bed.run("CHECK", {**conf, "prevResult": res}, netns, cid="c1")
    assert code == 1 and out["code"] == 105 and res["ips"][0]["address"] in out["msg"], (out, err)
    assert bed.run("DEL", conf, netns, cid="c1")[0] == 0


# --------------------------------------------------------------------------- mixed link types


def test_ipvlan_refused_on_a_nic_that_carries_macvlan(bed: NodeBed) -> None:
    """The only NIC carries a macvlan: an ipvlan ADD is refused by the allocator with the
    reason, before any link is made (so this runs on kernels without ipvlan too)."""
    ns1, ns2 = bed.make_netns(), bed.make_netns()
    assert bed.run("ADD", bed.spec_conf("1.1.0", "l2"), ns1, cid="c1")[0] == 0
    code, out, err = bed.run("ADD", bed.spec_conf("1.1.0", "l2", linkType="ipvlan"), ns2, cid="c2")
    assert code == 1 and out["code"] == 100, (out, err)
    assert "carries macvlan links" in out["msg"] and "nic-0" in out["msg"]
    assert link_in_netns(ns2, "eth0") is None
    assert bed.attachments() == [("c1", "eth0")]


# --------------------------------------------------------------------------- error codes


def test_error_codes_each_path(bed: NodeBed, tmp_path) -> None:
    """One invocation per code cni-dra uses that the paths above do not already cover."""
    netns = bed.make_netns()
    conf = bed.spec_conf("1.1.0", "host-local-v4")
    # 2: unknown config field
    assert bed.run("ADD", {**conf, "bogus": 1}, netns)[1]["code"] == 2
    # 3: CHECK of an attachment cni-dra does not know
    code, out, _ = bed.run("CHECK", {**conf, "prevResult": {"cniVersion": "1.1.0"}}, netns, cid="nope")
    assert out["code"] == 3
    # 4: missing CNI_NETNS on ADD
    assert bed.run("ADD", conf, "", cid="c1")[1]["code"] == 4
    # 6: not JSON
    from netns_tests.runner import CNI_EXE, CNI_PATH

    proc = subprocess.run(
        [CNI_EXE],
        input=b"{not json",
        capture_output=True,
        check=False,
        env={
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": CNI_PATH,
        },
    )
    assert b'"code": 6' in proc.stdout
    # 7: unsupported linkType
    assert bed.run("ADD", {**conf, "linkType": "vlan"}, netns)[1]["code"] == 7
    # 50: STATUS with an unreadable inventory
    code, out, _ = bed.run("STATUS", {**conf, "inventory": str(tmp_path / "missing.yaml")})
    assert out["code"] == 50
    # 100: no NIC has room
    code, out, _ = bed.run("ADD", {**conf, "capacity": {"requests": {"bandwidth": "11G"}}}, netns)
    assert out["code"] == 100
    # 102: the NIC an attachment needs has no ipvlan support / vanished -> netlink; here: a
    # kernel refusal is covered in test_ipvlan; 104: same attachment in another netns
    code, res, err = bed.run("ADD", conf, netns, cid="c9")
    assert code == 0, (res, err)
    other = bed.make_netns()
    assert bed.run("ADD", conf, other, cid="c9")[1]["code"] == 104
    assert bed.run("DEL", conf, netns, cid="c9")[0] == 0
    # 5: state file that does not decode
    (bed.state_dir / "state.json").write_text("{broken")
    assert bed.run("ADD", conf, netns, cid="c10")[1]["code"] == 5
