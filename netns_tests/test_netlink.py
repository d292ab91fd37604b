"""Root tests for cni_dra.netlink in real namespaces, with veth pairs as parent NICs.

Expected values come from the kernel as pyroute2 (used directly here) or
nsenter report it, never from cni_dra itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cni_dra import iface
from cni_dra.errors import (
    ContainerUnknownError,
    InvalidConfigError,
    InvalidEnvironmentError,
    NetlinkError,
)
from cni_dra.netlink import addr, netns, sublink, sysctl
from cni_dra.netlink import info as linkinfo
from netns_tests.conftest import delete_host_link, remove_netns

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------- independent views


@contextmanager
def ns_ipr(path: str) -> Iterator[Any]:
    """pyroute2 IPRoute with its socket in the netns ``path`` (pyroute2 forks to create it)."""
    from pyroute2.iproute.linux import IPRoute

    with IPRoute(netns=path) as ipr:
        yield ipr


def ns_links(path: str) -> dict[str, Any]:
    with ns_ipr(path) as ipr:
        return {m.get_attr("IFLA_IFNAME"): m for m in ipr.link("dump")}


def host_links() -> dict[str, Any]:
    from pyroute2.iproute.linux import IPRoute

    with IPRoute() as ipr:
        return {m.get_attr("IFLA_IFNAME"): m for m in ipr.link("dump")}


def kind_of(msg: Any) -> str | None:
    return msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")


def stat_identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def nsenter_cat(path: str, file: str) -> str:
    out = subprocess.run(
        ["nsenter", f"--net={path}", "cat", file], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def host_sublinks(parent: str) -> list[str]:
    """Host macvlan/ipvlan links on ``parent`` (other processes' links elsewhere are ignored)."""
    seen = host_links()
    pidx = seen[parent]["index"]
    return sorted(
        name
        for name, m in seen.items()
        if m.get_attr("IFLA_LINK") == pidx and kind_of(m) in ("macvlan", "ipvlan")
    )


def no_temp_links(path: str | None) -> None:
    names = ns_links(path) if path else host_links()
    assert not [n for n in names if n.startswith(sublink.TEMP_NAME_PREFIX)]


# --------------------------------------------------------------------------- namespaces


def test_host_netns_identity_is_the_process_netns() -> None:
    assert netns.host_netns_identity() == stat_identity("/proc/self/ns/net")
    assert netns.is_host_netns("/proc/self/ns/net")
    assert netns.is_host_netns("/proc/thread-self/ns/net")


def test_fresh_netns_is_not_host_and_identity_is_its_inode(make_netns) -> None:
    path = make_netns()
    assert netns.netns_identity(path) == stat_identity(path)
    assert not netns.is_host_netns(path)


def test_two_paths_of_one_netns_have_one_identity(make_netns) -> None:
    path = make_netns()
    # A process started in the namespace shows it as /proc/PID/ns/net: another path, same namespace.
    proc = subprocess.Popen(["nsenter", f"--net={path}", "sleep", "30"])
    try:
        proc_path = f"/proc/{proc.pid}/ns/net"
        for _ in range(200):
            if stat_identity(proc_path) == stat_identity(path):
                break
            threading.Event().wait(0.01)
        assert netns.netns_identity(proc_path) == netns.netns_identity(path)
        assert not netns.is_host_netns(proc_path)
    finally:
        proc.kill()
        proc.wait()


def test_missing_netns_path_is_code_3(tmp_path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(ContainerUnknownError) as exc:
        netns.netns_identity(missing)
    assert exc.value.code == 3
    with pytest.raises(ContainerUnknownError):
        netns.is_host_netns(missing)
    assert netns.netns_exists(missing) is False


@pytest.mark.parametrize("what", ["empty file", "text file", "directory", "mount namespace"])
def test_path_that_is_not_a_netns_is_code_4(tmp_path, what: str) -> None:
    if what == "empty file":
        path = tmp_path / "ns"
        path.touch()
    elif what == "text file":
        path = tmp_path / "ns"
        path.write_text("hello")
    elif what == "directory":
        path = tmp_path
    else:
        path = "/proc/self/ns/mnt"
    with pytest.raises(InvalidEnvironmentError) as exc:
        netns.netns_identity(str(path))
    assert exc.value.code == 4
    assert "not a network namespace" in exc.value.msg


def test_unmounted_netns_file_counts_as_gone_but_other_files_do_not(tmp_path) -> None:
    empty = tmp_path / "unmounted"
    empty.touch()
    assert netns.netns_exists(str(empty)) is False
    text = tmp_path / "text"
    text.write_text("x")
    with pytest.raises(InvalidEnvironmentError):
        netns.netns_exists(str(text))


def test_in_netns_switches_only_this_thread_and_restores(make_netns) -> None:
    path = make_netns()
    host = stat_identity("/proc/thread-self/ns/net")
    seen_by_other: list[tuple[int, int]] = []
    go = threading.Event()

    def other() -> None:  # started before the switch: must stay in the host netns
        go.wait(30)
        seen_by_other.append(stat_identity("/proc/thread-self/ns/net"))

    t = threading.Thread(target=other)
    t.start()
    try:
        with netns.in_netns(path):
            assert stat_identity("/proc/thread-self/ns/net") == stat_identity(path)
            go.set()
            t.join()
            # The host netns is still "host" while inside.
            assert netns.host_netns_identity() == host
    finally:
        go.set()
        t.join()
    assert seen_by_other == [host]
    assert stat_identity("/proc/thread-self/ns/net") == host


def test_in_netns_restores_after_exception_and_nests(make_netns) -> None:
    a, b = make_netns(), make_netns()
    host = stat_identity("/proc/thread-self/ns/net")
    with pytest.raises(KeyError):
        with netns.in_netns(a):
            with netns.in_netns(b):
                assert stat_identity("/proc/thread-self/ns/net") == stat_identity(b)
            assert stat_identity("/proc/thread-self/ns/net") == stat_identity(a)
            raise KeyError("boom")
    assert stat_identity("/proc/thread-self/ns/net") == host


def test_in_netns_missing_path_does_not_move(tmp_path) -> None:
    host = stat_identity("/proc/thread-self/ns/net")
    with pytest.raises(ContainerUnknownError):
        with netns.in_netns(str(tmp_path / "gone")):
            pytest.fail("body must not run")
    assert stat_identity("/proc/thread-self/ns/net") == host


def test_in_netns_exits_the_process_when_it_cannot_return(make_netns) -> None:
    path = make_netns()
    script = textwrap.dedent(
        f"""
        import os
        from cni_dra.netlink import netns
        real = netns._setns
        calls = []
        def flaky(fd):
            calls.append(fd)
            if len(calls) == 2:
                raise OSError(1, "injected restore failure")
            real(fd)
        netns._setns = flaky
        with netns.in_netns({path!r}):
            pass
        print("CONTINUED IN WRONG NETNS")
        """
    )
    out = subprocess.run([PY, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == netns.EXIT_WRONG_NETNS
    assert "CONTINUED" not in out.stdout
    assert "failed to leave netns" in out.stderr


# --------------------------------------------------------------------------- host links


def test_host_link_queries_match_the_kernel(make_parent_nic) -> None:
    parent = make_parent_nic(mtu=1400)
    seen = host_links()[parent]
    info = linkinfo.host_link(parent)
    assert info is not None
    assert (info.name, info.index, info.kind, info.mtu, info.mac) == (
        parent,
        seen["index"],
        "veth",
        1400,
        seen.get_attr("IFLA_ADDRESS"),
    )
    assert info.admin_up
    assert linkinfo.host_link_by_index(seen["index"]) == info
    assert parent in {li.name for li in linkinfo.list_host_links()}
    assert linkinfo.host_link("cdt-nonexist0") is None


def test_link_speed_of_missing_link_is_none() -> None:
    assert linkinfo.link_speed_bps("cdt-nonexist0") is None


def test_link_kind_probe() -> None:
    assert sublink.link_kind_supported("macvlan") is True
    no_temp_links(None)


# --------------------------------------------------------------------------- macvlan create


@pytest.mark.parametrize("mode", sorted(iface.MACVLAN_MODES))
def test_create_macvlan_in_fresh_netns(make_netns, make_parent_nic, mode: str) -> None:
    parent = make_parent_nic()
    path = make_netns()
    info = sublink.create_macvlan(parent=parent, netns=path, ifname="eth0", mode=mode)

    seen = ns_links(path)
    assert set(seen) == {"lo", "eth0"}  # no temporary link left in the netns
    eth0 = seen["eth0"]
    assert kind_of(eth0) == "macvlan"
    assert eth0.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA").get_attr("IFLA_MACVLAN_MODE") == mode
    assert eth0["flags"] & 1  # IFF_UP
    parent_msg = host_links()[parent]
    assert eth0.get_attr("IFLA_MTU") == parent_msg.get_attr("IFLA_MTU")
    assert eth0.get_attr("IFLA_LINK") == parent_msg["index"]
    assert host_sublinks(parent) == []  # nothing created on the host
    no_temp_links(None)

    assert (info.name, info.index, info.kind, info.mode) == ("eth0", eth0["index"], "macvlan", mode)
    assert info.mac == eth0.get_attr("IFLA_ADDRESS")
    assert info.mtu == eth0.get_attr("IFLA_MTU")
    assert info.admin_up
    assert info.parent_index == parent_msg["index"]
    assert info.parent_netnsid == eth0.get_attr("IFLA_LINK_NETNSID") is not None

    resolved = linkinfo.host_parent_of(path, "eth0")
    assert resolved is not None and resolved.name == parent


def test_create_macvlan_with_mtu_and_mac(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic(mtu=9000)
    path = make_netns()
    info = sublink.create_macvlan(parent=parent, netns=path, ifname="net1", mtu=1400, mac="02:AA:bb:01:02:03")
    eth = ns_links(path)["net1"]
    assert eth.get_attr("IFLA_MTU") == 1400
    assert eth.get_attr("IFLA_ADDRESS") == "02:aa:bb:01:02:03"
    assert (info.mtu, info.mac) == (1400, "02:aa:bb:01:02:03")


def test_create_macvlan_mtu_above_parent_is_code_7_and_creates_nothing(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic(mtu=1500)
    path = make_netns()
    with pytest.raises(InvalidConfigError) as exc:
        sublink.create_macvlan(parent=parent, netns=path, ifname="eth0", mtu=9000)
    assert exc.value.code == 7
    assert set(ns_links(path)) == {"lo"}


def test_create_macvlan_ifname_collision_leaves_nothing(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    with ns_ipr(path) as ipr:
        ipr.link("add", ifname="eth0", kind="veth", peer="eth0p")
    before_ns = {name: m["index"] for name, m in ns_links(path).items()}

    with pytest.raises(InvalidEnvironmentError) as exc:
        sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    assert exc.value.code == 4
    assert "eth0 already exists" in exc.value.msg

    after_ns = ns_links(path)
    assert {name: m["index"] for name, m in after_ns.items()} == before_ns
    assert kind_of(after_ns["eth0"]) == "veth"
    assert host_sublinks(parent) == []
    no_temp_links(None)


def test_create_macvlan_missing_parent_names_it(make_netns) -> None:
    path = make_netns()
    with pytest.raises(NetlinkError) as exc:
        sublink.create_macvlan(parent="cdt-noparent0", netns=path, ifname="eth0")
    assert exc.value.code == 102
    assert "cdt-noparent0" in exc.value.msg
    assert set(ns_links(path)) == {"lo"}


def test_create_macvlan_into_host_netns_is_refused(make_parent_nic) -> None:
    parent = make_parent_nic()
    with pytest.raises(InvalidEnvironmentError) as exc:
        sublink.create_macvlan(parent=parent, netns="/proc/self/ns/net", ifname="cdt-mv0")
    assert "host network namespace" in exc.value.msg
    assert host_sublinks(parent) == []
    assert "cdt-mv0" not in host_links()


def test_create_macvlan_missing_netns_is_code_3(make_parent_nic, tmp_path) -> None:
    parent = make_parent_nic()
    with pytest.raises(ContainerUnknownError):
        sublink.create_macvlan(parent=parent, netns=str(tmp_path / "gone"), ifname="eth0")
    assert host_sublinks(parent) == []


def test_failure_after_create_deletes_the_link(make_netns, make_parent_nic, monkeypatch) -> None:
    parent = make_parent_nic()
    path = make_netns()
    real = linkinfo.decode_link
    calls = []

    def broken(msg, addresses=None):  # fails on the final read-back, after rename and up
        calls.append(1)
        raise OSError(5, "injected")

    monkeypatch.setattr(linkinfo, "decode_link", broken)
    with pytest.raises(NetlinkError) as exc:
        sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    monkeypatch.setattr(linkinfo, "decode_link", real)
    assert calls
    assert "injected" in exc.value.msg or "Input/output error" in exc.value.msg
    assert set(ns_links(path)) == {"lo"}


def test_two_macvlans_on_one_parent_in_two_netns(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    a, b = make_netns(), make_netns()
    ia = sublink.create_macvlan(parent=parent, netns=a, ifname="eth0")
    ib = sublink.create_macvlan(parent=parent, netns=b, ifname="eth0")
    assert ia.mac != ib.mac
    assert ns_links(a)["eth0"].get_attr("IFLA_ADDRESS") == ia.mac
    assert ns_links(b)["eth0"].get_attr("IFLA_ADDRESS") == ib.mac


# --------------------------------------------------------------------------- delete


def test_delete_twice(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    assert sublink.delete_link(path, "eth0") is True
    assert set(ns_links(path)) == {"lo"}
    assert sublink.delete_link(path, "eth0") is False
    assert parent in host_links()


def test_delete_after_netns_removed(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    remove_netns(path)
    assert not os.path.exists(path)
    assert sublink.delete_link(path, "eth0") is False


def test_delete_with_unmounted_netns_file(tmp_path) -> None:
    leftover = tmp_path / "cni-1234"
    leftover.touch()
    assert sublink.delete_link(str(leftover), "eth0") is False


def test_delete_after_parent_removed(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    delete_host_link(parent)
    assert "eth0" not in ns_links(path)  # the kernel removed the macvlan with its parent
    assert sublink.delete_link(path, "eth0") is False


def test_delete_host_link(make_parent_nic) -> None:
    parent = make_parent_nic()
    assert sublink.delete_link(None, parent) is True
    assert parent not in host_links()
    assert sublink.delete_link(None, parent) is False


# --------------------------------------------------------------------------- configure


def test_configure_interface_adds_exactly_what_is_given(make_netns, make_parent_nic) -> None:
    import socket

    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    addresses = [("10.22.0.5/24", "10.22.0.1"), ("fd00:22::5/64", "fd00:22::1")]
    routes = [("0.0.0.0/0", "10.22.0.1"), ("192.168.50.0/24", None)]
    info = addr.configure_interface(path, "eth0", addresses=addresses, routes=routes)
    # Applying the same result again is not an error (a retried ADD).
    addr.configure_interface(path, "eth0", addresses=addresses, routes=routes)

    with ns_ipr(path) as ipr:
        (idx,) = ipr.link_lookup(ifname="eth0")
        addrs = {
            f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}"
            for m in ipr.addr("dump", index=idx)
            if not m.get_attr("IFA_ADDRESS").startswith("fe80")
        }
        v4 = {
            (m.get_attr("RTA_DST") or "default", m["dst_len"], m.get_attr("RTA_GATEWAY"), m["scope"])
            for m in ipr.route("dump", family=socket.AF_INET, table=254)
        }
        v6_defaults = [m for m in ipr.route("dump", family=socket.AF_INET6, table=254) if m["dst_len"] == 0]
        up = ipr.link("get", index=idx)[0]["flags"] & 1
    assert addrs == {"10.22.0.5/24", "fd00:22::5/64"}
    assert v4 == {
        ("default", 0, "10.22.0.1", 0),
        ("10.22.0.0", 24, None, 253),  # kernel's connected route
        ("192.168.50.0", 24, None, 253),
    }
    assert v6_defaults == []  # no route invented from the v6 gateway
    assert up
    assert info.addresses is not None
    assert {"10.22.0.5/24", "fd00:22::5/64"} <= set(info.addresses)


def ipv6_flags(path: str, ifname: str, cidr: str) -> int:
    addr, plen = cidr.split("/")
    with ns_ipr(path) as ipr:
        (idx,) = ipr.link_lookup(ifname=ifname)
        for m in ipr.addr("dump", index=idx, family=10):
            if m.get_attr("IFA_ADDRESS") == addr and m["prefixlen"] == int(plen):
                return m.get_attr("IFA_FLAGS") or m["flags"]
    raise AssertionError(f"{cidr} not on {ifname}")


IFA_F_TENTATIVE = 0x40  # <linux/if_addr.h>
IFA_F_DADFAILED = 0x08


def test_configure_waits_for_dad_when_there_is_a_v6_gateway(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    addr.configure_interface(path, "eth0", addresses=[("fd00:44::5/64", "fd00:44::1")], routes=[])
    assert not ipv6_flags(path, "eth0", "fd00:44::5/64") & IFA_F_TENTATIVE


def test_configure_does_not_wait_without_a_v6_gateway(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    addr.configure_interface(path, "eth0", addresses=[("fd00:45::5/64", None)], routes=[])
    assert ipv6_flags(path, "eth0", "fd00:45::5/64") & IFA_F_TENTATIVE  # DAD takes ~1 s


def test_configure_reports_duplicate_ipv6_address(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    a, b = make_netns(), make_netns()
    sublink.create_macvlan(parent=parent, netns=a, ifname="eth0")
    sublink.create_macvlan(parent=parent, netns=b, ifname="eth0")
    result = [("fd00:46::5/64", "fd00:46::1")]
    addr.configure_interface(a, "eth0", addresses=result, routes=[])
    with pytest.raises(NetlinkError) as exc:  # a's macvlan answers b's DAD probe (bridge mode)
        addr.configure_interface(b, "eth0", addresses=result, routes=[])
    assert "fd00:46::5/64" in exc.value.msg and "duplicate" in exc.value.msg
    assert ipv6_flags(b, "eth0", "fd00:46::5/64") & IFA_F_DADFAILED


def test_configure_interface_bad_gateway_is_netlink_error(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    with pytest.raises(NetlinkError) as exc:
        addr.configure_interface(path, "eth0", addresses=[], routes=[("0.0.0.0/0", "10.99.0.1")])
    assert "add route 0.0.0.0/0 via 10.99.0.1 dev eth0" in exc.value.msg


def test_configure_missing_link_is_netlink_error(make_netns) -> None:
    path = make_netns()
    with pytest.raises(NetlinkError):
        addr.configure_interface(path, "eth0", addresses=[("10.0.0.1/24", None)], routes=[])


def test_link_in_netns_reports_addresses(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    with ns_ipr(path) as ipr:
        (idx,) = ipr.link_lookup(ifname="eth0")
        ipr.addr("add", index=idx, address="10.7.0.9", prefixlen=16)
    info = linkinfo.link_in_netns(path, "eth0")
    assert info is not None and "10.7.0.9/16" in (info.addresses or ())
    assert linkinfo.link_in_netns(path, "eth9") is None


# --------------------------------------------------------------------------- sysctl


@pytest.mark.parametrize("key", ["net/ipv4/conf/{if}/arp_notify", "net/ipv6/conf/{if}/ndisc_notify"])
def test_sysctl_written_in_the_netns_not_the_host(make_netns, key: str) -> None:
    path = make_netns()
    k = key.format(**{"if": "lo"})
    host_before = Path(f"/proc/sys/{k}").read_text().strip()
    target = "0" if host_before == "1" else "1"
    sysctl.set_sysctl_in_netns(path, k, target)
    assert nsenter_cat(path, f"/proc/sys/{k}") == target
    assert Path(f"/proc/sys/{k}").read_text().strip() == host_before


def test_sysctl_for_interface_only_in_netns(make_netns, make_parent_nic) -> None:
    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="cdtonly0")
    sysctl.set_sysctl_in_netns(path, "net/ipv4/conf/cdtonly0/arp_notify", 1)
    assert nsenter_cat(path, "/proc/sys/net/ipv4/conf/cdtonly0/arp_notify") == "1"
    assert not os.path.exists("/proc/sys/net/ipv4/conf/cdtonly0")


# --------------------------------------------------------------------------- ipvlan


def test_create_ipvlan(make_netns, make_parent_nic) -> None:
    if not sublink.link_kind_supported("ipvlan"):
        pytest.skip("kernel has no ipvlan (RTM_NEWLINK kind ipvlan answers EOPNOTSUPP)")
    parent = make_parent_nic()
    path = make_netns()
    info = sublink.create_ipvlan(parent=parent, netns=path, ifname="eth0", mode="l3", flag="private")
    eth0 = ns_links(path)["eth0"]
    assert kind_of(eth0) == "ipvlan"
    data = eth0.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
    assert data.get_attr("IFLA_IPVLAN_MODE") == 1
    assert (info.kind, info.mode, info.ipvlan_flag) == ("ipvlan", "l3", "private")
    assert sublink.delete_link(path, "eth0") is True


def test_create_ipvlan_unsupported_cleans_up(make_netns, make_parent_nic) -> None:
    if sublink.link_kind_supported("ipvlan"):
        pytest.skip("kernel supports ipvlan; this checks the unsupported path")
    parent = make_parent_nic()
    path = make_netns()
    with pytest.raises(NetlinkError) as exc:
        sublink.create_ipvlan(parent=parent, netns=path, ifname="eth0")
    assert "does not support link kind ipvlan" in exc.value.msg
    assert set(ns_links(path)) == {"lo"}


# --------------------------------------------------------------------------- property: names


NAME_ALPHABET = st.one_of(
    st.characters(codec="ascii"),
    st.sampled_from(
        ["%", "d", "à", "é", "\xa0", "\x85", "\u2003", "ü", "€", "/", ":", ".", "-", "\x00", "\x1f"]
    ),
)


def test_ifname_validation_matches_the_kernel(make_netns, make_parent_nic) -> None:
    """validate_ifname accepts the printable ASCII names the kernel keeps as sent; accepted ones work end to end."""
    from pyroute2.netlink.exceptions import NetlinkError as PrNetlinkError

    parent, path = make_parent_nic(), make_netns()

    @settings(max_examples=40, deadline=None)
    @given(name=st.text(NAME_ALPHABET, min_size=1, max_size=16))
    def check(name: str) -> None:
        assume(name not in ("lo", "cdtpeer0"))
        try:
            iface.validate_ifname(name)
            ours = True
        except InvalidEnvironmentError:
            ours = False
        # Oracle: the kernel, asked directly through pyroute2 (a veth pair inside the netns).
        # A name the kernel stores differently (cut at a NUL, %d expanded) counts as refused.
        with ns_ipr(path) as ipr:
            try:
                ipr.link("add", ifname=name, kind="veth", peer="cdtpeer0")
                kernel = name in ns_links(path)
            except PrNetlinkError:
                kernel = False
            except (UnicodeError, ValueError):
                kernel = False  # pyroute2 cannot even encode it
            finally:
                for idx in ipr.link_lookup(ifname="cdtpeer0"):
                    ipr.link("del", index=idx)  # removes both ends
        # cni-dra is stricter than the kernel only outside printable ASCII (non-ASCII Unicode
        # whitespace, which the CNI spec refuses, and every other byte it refuses itself).
        cni_stricter = any(not 0x21 <= ord(c) <= 0x7E for c in name)
        assert ours == kernel or (cni_stricter and not ours)
        if ours:
            info = sublink.create_macvlan(parent=parent, netns=path, ifname=name)
            assert info.name == name
            assert kind_of(ns_links(path)[name]) == "macvlan"
            assert sublink.delete_link(path, name) is True
        else:
            with pytest.raises(InvalidEnvironmentError):
                sublink.create_macvlan(parent=parent, netns=path, ifname=name)
        assert set(ns_links(path)) == {"lo"}

    check()
