"""ipvlan through the installed cni-dra (issue 4, item 5), per spec version and mode.

Needs a kernel with ipvlan. Where the host kernel lacks it, these tests skip here and
``make test`` runs this file again under ``scripts/uml-run`` (a user-mode-linux 7.x
kernel that has ipvlan), in one pytest process.
"""

from __future__ import annotations

import pytest

from netns_tests.runner import host_ifindex, link_in_netns
from netns_tests.test_conformance_bed import CHECK_VERSIONS, RICH_VERSIONS, Bed, addr_flags

SKIP_REASON = (
    "this kernel has no ipvlan (RTM_NEWLINK kind ipvlan answers EOPNOTSUPP); "
    "`make test` runs this file under scripts/uml-run, whose kernel has it"
)


@pytest.fixture(autouse=True)
def _needs_ipvlan() -> None:
    from cni_dra.netlink.links import link_kind_supported

    if not link_kind_supported("ipvlan"):
        pytest.skip(SKIP_REASON)


@pytest.fixture
def bed(tmp_path, make_parent_nic, make_netns) -> Bed:
    return Bed(tmp_path, make_parent_nic, make_netns)


@pytest.fixture
def bed2(tmp_path, make_parent_nic, make_netns) -> Bed:
    return Bed(tmp_path, make_parent_nic, make_netns, nics=2)


def _parent_mac(name: str) -> str:
    with open(f"/sys/class/net/{name}/address") as fh:
        return fh.read().strip()


@pytest.mark.parametrize("mode", ["l2", "l3", "l3s"])
@pytest.mark.parametrize("version", RICH_VERSIONS)
def test_ipvlan_add_check_status_gc_del(bed: Bed, version: str, mode: str) -> None:
    from cni_dra.netlink.links import link_in_netns as nl_link

    netns = bed.make_netns()
    conf = bed.conf(version, "host-local-dual", linkType="ipvlan", mode=mode)
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    link = link_in_netns(netns, "eth0")
    assert link["kind"] == "ipvlan" and link["parent_ifindex"] == host_ifindex(bed.parents[0])
    info = nl_link(netns, "eth0")
    assert (info.mode, info.ipvlan_flag) == (mode, "bridge")
    assert link["mac"] == _parent_mac(bed.parents[0])  # an ipvlan has its parent's MAC
    assert res["interfaces"][0]["mac"] == link["mac"]
    assert sorted(ip["address"] for ip in res["ips"]) == sorted(link["ipv4"] + link["ipv6"])
    v6 = [ip["address"] for ip in res["ips"] if ":" in ip["address"]]
    assert v6 and not addr_flags(netns, "eth0")[v6[0]] & 0x40  # not tentative

    with_prev = {**conf, "prevResult": res}
    if version in CHECK_VERSIONS:
        code, out, err = bed.run("CHECK", with_prev, netns, cid="c1")
        assert code == 0, (out, err)
    if version == "1.1.0":
        assert bed.run("STATUS", conf)[0] == 0
        code, out, err = bed.run("GC", {**conf, "cni.dev/valid-attachments": []})
        assert code == 0, (out, err)
        assert link_in_netns(netns, "eth0") is None and bed.attachments() == [] and bed.ipam_reservations() == []
    code, out, err = bed.run("DEL", with_prev, netns, cid="c1")
    assert code == 0, (out, err)
    assert link_in_netns(netns, "eth0") is None
    assert bed.attachments() == [] and bed.ipam_reservations() == []


@pytest.mark.parametrize("flag", ["bridge", "private", "vepa"])
def test_ipvlan_flags(bed: Bed, flag: str) -> None:
    from cni_dra.netlink.links import link_in_netns as nl_link

    netns = bed.make_netns()
    conf = bed.conf("1.1.0", "l2", linkType="ipvlan", ipvlanFlag=flag)
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    assert (nl_link(netns, "eth0").mode, nl_link(netns, "eth0").ipvlan_flag) == ("l2", flag)
    assert bed.run("CHECK", {**conf, "prevResult": res}, netns, cid="c1")[0] == 0
    assert bed.run("DEL", conf, netns, cid="c1")[0] == 0


def test_ipvlan_static_and_l2_only(bed: Bed) -> None:
    ns1, ns2 = bed.make_netns(), bed.make_netns()
    code, res, err = bed.run("ADD", bed.conf("1.0.0", "static", linkType="ipvlan", mode="l3"), ns1, cid="c1")
    assert code == 0, (res, err)
    assert link_in_netns(ns1, "eth0")["ipv4"] == ["198.51.100.77/24"]
    code, res, err = bed.run("ADD", bed.conf("1.0.0", "l2", linkType="ipvlan"), ns2, cid="c2")
    assert code == 0, (res, err)
    assert "ips" not in res and link_in_netns(ns2, "eth0")["ipv4"] == []


def test_check_notices_a_changed_mode(bed: Bed) -> None:
    netns = bed.make_netns()
    conf = bed.conf("1.1.0", "l2", linkType="ipvlan", mode="l3")
    code, res, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 0, (res, err)
    code, out, err = bed.run("CHECK", {**conf, "mode": "l2", "prevResult": res}, netns, cid="c1")
    assert code == 1 and out["code"] == 105 and "l3" in out["msg"], (out, err)


def test_ipvlan_goes_to_the_nic_without_macvlan_and_the_reverse(bed2: Bed) -> None:
    """best-fit would stack everything on one NIC; link types keep them apart."""
    ns1, ns2, ns3 = bed2.make_netns(), bed2.make_netns(), bed2.make_netns()
    macvlan, ipvlan = bed2.conf("1.1.0", "l2"), bed2.conf("1.1.0", "l2", linkType="ipvlan")
    assert bed2.run("ADD", macvlan, ns1, cid="c1")[0] == 0
    code, res, err = bed2.run("ADD", ipvlan, ns2, cid="c2")
    assert code == 0, (res, err)
    parents = {d["name"]: d for d in bed2.status()["devices"]}
    by_cid = {a["containerID"]: a["device"] for a in bed2.status()["attachments"]}
    assert by_cid["c1"] != by_cid["c2"], parents
    assert link_in_netns(ns2, "eth0")["parent_ifindex"] == host_ifindex(bed2.parents[bed2.devices.index(by_cid["c2"])])
    # both NICs now carry one type each: a third macvlan goes next to the first
    code, res, err = bed2.run("ADD", macvlan, ns3, cid="c3")
    assert code == 0, (res, err)
    by_cid = {a["containerID"]: a["device"] for a in bed2.status()["attachments"]}
    assert by_cid["c3"] == by_cid["c1"]


def test_kernel_refusal_of_mixed_types_is_reported(bed: Bed) -> None:
    """A macvlan made outside cni-dra (not in its state) on the parent: the kernel answers
    EBUSY to the ipvlan; cni-dra reports code 102 saying why, and leaves nothing."""
    import subprocess

    from netns_tests.conftest import delete_host_link, unique_name

    other = unique_name()
    subprocess.run(["ip", "link", "add", other, "link", bed.parents[0], "type", "macvlan"], check=True)
    try:
        netns = bed.make_netns()
        code, out, err = bed.run("ADD", bed.conf("1.1.0", "host-local-v4", linkType="ipvlan"), netns, cid="c1")
        assert code == 1 and out["code"] == 102, (out, err)
        assert "macvlan and ipvlan cannot share a parent" in out["msg"]
        assert link_in_netns(netns, "eth0") is None
        assert bed.attachments() == [] and bed.ipam_reservations() == []
    finally:
        delete_host_link(other)
