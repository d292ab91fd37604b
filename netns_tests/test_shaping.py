"""Traffic control on a pod interface (cni_dra.netlink.shaping), checked in the kernel and with real traffic.

The bed: a stand-in NIC (host veth end, ``make_parent_nic``) whose peer sits in a "remote"
netns (198.51.100.1/24); a macvlan (bridge) on the NIC, ``eth0`` in a pod netns
(198.51.100.2/24). The kernel view comes from pyroute2 directly; throughput from Debian's
``iperf3`` (:mod:`netns_tests.traffic`: TCP, server in the remote netns, client in the pod:
egress is the client sending, ingress ``-R``), median of 3 runs of 3 s, within ±10 % of the
shaped rate (100M, 300M and 1G; the unshaped baseline must carry more than twice the highest).

What iperf3 reports is TCP goodput; tbf counts whole frames (Ethernet, IP and TCP
headers), so at MTU 1500 goodput is about 4.4 % below the rate (1448 of 1514 bytes).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cni_dra.errors import InvalidConfigError, NetlinkError
from cni_dra.netlink import shaping
from cni_dra.netlink.shaping import (
    ShapeInfo,
    ShapeSpec,
    Tbf,
    apply_shaping,
    delete_shaped_link,
    ifb_name,
    read_shaping,
    remove_shaping,
)
from netns_tests.bed import links_named
from netns_tests.conftest import remove_netns, unique_name
from netns_tests.traffic import IPERF3, TOLERANCE, Client, IperfServer, M, median_bps, remote_end

POD_IP, REMOTE_IP, PREFIX = "198.51.100.2", "198.51.100.1", 24
IFNAME = "eth0"


@dataclass(frozen=True)
class World:
    pod: str  # netns path
    remote: str
    nic: str


@pytest.fixture
def world(make_parent_nic, make_netns) -> World:
    """A pod netns with ``eth0`` (macvlan on a stand-in NIC) and the NIC's peer in a remote netns.

    Everything lives in the two namespaces or is the NIC pair: the fixtures remove them."""
    from pyroute2 import IPRoute

    nic = make_parent_nic()
    pod, remote = make_netns(), make_netns()
    tmp = unique_name()
    remote_end(nic, remote, REMOTE_IP, PREFIX)
    with IPRoute() as ipr:
        (parent,) = ipr.link_lookup(ifname=nic)
        ipr.link("add", ifname=tmp, kind="macvlan", link=parent, macvlan_mode="bridge")
        (mv,) = ipr.link_lookup(ifname=tmp)
        ipr.link("set", index=mv, net_ns_fd=os.path.basename(pod))
    with IPRoute(netns=pod) as ipr:
        (lo,) = ipr.link_lookup(ifname="lo")
        ipr.link("set", index=lo, state="up")
        (idx,) = ipr.link_lookup(ifname=tmp)
        ipr.link("set", index=idx, ifname=IFNAME)
        ipr.addr("add", index=idx, address=POD_IP, prefixlen=PREFIX)
        ipr.link("set", index=idx, state="up")
    return World(pod=pod, remote=remote, nic=nic)


def kernel_view(netns: str) -> dict[str, object]:
    """Independent of cni_dra: links (name -> kind) and each link's qdiscs (kind, parent)."""
    from pyroute2 import IPRoute

    with IPRoute(netns=netns) as ipr:
        names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.link("dump")}
        qdiscs = sorted(
            (names[m["index"]], m.get_attr("TCA_KIND"), m["parent"])
            for m in ipr.get_qdiscs()
            if m["index"] in names and m.get_attr("TCA_KIND") in ("tbf", "ingress")
        )
    return {"links": dict(links_named(netns)), "qdiscs": qdiscs}


def near(got: Tbf | None, want: Tbf) -> bool:
    """Rate and limit exact; burst within a few bytes (tbf stores it as time in scheduler ticks)."""
    return (
        got is not None
        and got.rate_bps == want.rate_bps
        and got.limit_bytes == want.limit_bytes
        and abs(got.burst_bytes - want.burst_bytes) <= max(16, want.burst_bytes // 1000)
    )


# -- the kernel state -----------------------------------------------------------------------


def test_apply_installs_tbf_and_ifb_and_reads_back_the_rates(world) -> None:
    from pyroute2 import IPRoute

    spec = ShapeSpec(egress_rate_bps=100 * M, ingress_rate_bps=300 * M, ingress_burst_bytes=200_000)
    info = apply_shaping(world.pod, IFNAME, spec)
    assert info == read_shaping(world.pod, IFNAME)
    assert info.ifb == ifb_name(IFNAME) == "ifb-eth0"
    assert near(info.egress, spec.egress) and near(info.ingress, spec.ingress)
    assert info.ingress.burst_bytes == pytest.approx(200_000, abs=200)
    view = kernel_view(world.pod)
    assert view["links"]["ifb-eth0"] == "ifb"
    with IPRoute(netns=world.pod) as ipr:  # made up, with the interface's MTU
        (ifb,) = ipr.link("get", ifname="ifb-eth0")
        (eth0,) = ipr.link("get", ifname=IFNAME)
    assert ifb["flags"] & 1 and ifb.get_attr("IFLA_MTU") == eth0.get_attr("IFLA_MTU")
    assert ("eth0", "ingress", 0xFFFFFFF1) in view["qdiscs"]
    assert ("eth0", "tbf", 0xFFFFFFFF) in view["qdiscs"] and ("ifb-eth0", "tbf", 0xFFFFFFFF) in view["qdiscs"]


def test_on_a_new_link_it_reports_what_it_installed(world) -> None:
    spec = ShapeSpec(egress_rate_bps=300 * M, ingress_rate_bps=100 * M)
    info = apply_shaping(world.pod, IFNAME, spec, new_link=True)
    assert info == ShapeInfo(IFNAME, spec.egress, spec.ingress, "ifb-eth0", ifb_up=True)
    got = read_shaping(world.pod, IFNAME)
    assert got is not None and got.ifb == "ifb-eth0"
    assert near(got.egress, spec.egress) and near(got.ingress, spec.ingress)


def test_reapply_replaces_and_a_direction_left_out_is_removed(world) -> None:
    apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M))
    again = ShapeSpec.symmetric(300 * M)
    info = apply_shaping(world.pod, IFNAME, again)
    assert near(info.egress, again.egress) and near(info.ingress, again.ingress)
    assert [n for n, k in links_named(world.pod) if k == "ifb"] == ["ifb-eth0"]
    assert apply_shaping(world.pod, IFNAME, again) == info  # the same spec again: nothing changes
    egress_only = apply_shaping(world.pod, IFNAME, ShapeSpec(egress_rate_bps=50 * M))
    assert egress_only.ingress is None and egress_only.ifb is None
    assert "ifb-eth0" not in dict(links_named(world.pod))
    ingress_only = apply_shaping(world.pod, IFNAME, ShapeSpec(ingress_rate_bps=50 * M))
    assert ingress_only.egress is None and ingress_only.ifb == "ifb-eth0"
    assert kernel_view(world.pod)["qdiscs"] == [
        ("eth0", "ingress", 0xFFFFFFF1),
        ("ifb-eth0", "tbf", 0xFFFFFFFF),
    ]


def test_remove_leaves_nothing_and_is_idempotent(world, make_netns) -> None:
    apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M))
    remove_shaping(world.pod, IFNAME)
    assert read_shaping(world.pod, IFNAME) is None
    assert kernel_view(world.pod) == {"links": {"lo": None, "eth0": "macvlan"}, "qdiscs": []}
    remove_shaping(world.pod, IFNAME)  # again
    remove_shaping(world.pod, "gone0")  # no such interface
    gone = make_netns()
    remove_netns(gone)
    remove_shaping(gone, IFNAME)  # no such netns


def test_remove_finds_a_leaked_ifb_without_its_interface(world) -> None:
    apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M))
    from pyroute2 import IPRoute

    with IPRoute(netns=world.pod) as ipr:
        ipr.link("del", index=ipr.link_lookup(ifname=IFNAME)[0])
    remove_shaping(world.pod, IFNAME)
    assert dict(links_named(world.pod)) == {"lo": None}


def test_delete_shaped_link_takes_both_at_once_and_nothing_else(world, make_netns) -> None:
    from pyroute2 import IPRoute

    apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M))
    with IPRoute(netns=world.pod) as ipr:  # another pair, in the netdev group tried first
        ipr.link("add", ifname="other0", kind="veth", peer="other1")
        for name in ("other0", "other1"):
            ipr.link("set", index=ipr.link_lookup(ifname=name)[0], group=shaping._BATCH_GROUP_BASE)
    assert delete_shaped_link(world.pod, IFNAME) == (True, True)
    assert sorted(links_named(world.pod)) == [("lo", None), ("other0", "veth"), ("other1", "veth")]
    assert delete_shaped_link(world.pod, IFNAME) == (False, False)  # again
    gone = make_netns()
    remove_netns(gone)
    assert delete_shaped_link(gone, IFNAME) == (False, False)


def test_delete_shaped_link_finds_a_leaked_ifb_and_spares_a_stranger(world) -> None:
    from pyroute2 import IPRoute

    apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M))
    with IPRoute(netns=world.pod) as ipr:
        ipr.link("del", index=ipr.link_lookup(ifname=IFNAME)[0])
    assert delete_shaped_link(world.pod, IFNAME) == (False, True)
    with IPRoute(netns=world.pod) as ipr:
        ipr.link("add", ifname="ifb-eth1", kind="veth", peer="eth1")
    assert delete_shaped_link(world.pod, "eth1") == (True, False)  # the veth holding the ifb name is not ours
    assert sorted(n for n, _ in links_named(world.pod)) == ["lo"]  # (deleting eth1 took its peer)


def test_failure_when_the_ifb_name_is_taken_leaves_the_interface_unshaped(world) -> None:
    from pyroute2 import IPRoute

    with IPRoute(netns=world.pod) as ipr:
        ipr.link("add", ifname="ifb-eth0", kind="macvlan", link=ipr.link_lookup(ifname=IFNAME)[0])
    with pytest.raises(NetlinkError, match="ifb-eth0 exists and is not an ifb device") as err:
        apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M))
    assert err.value.code == 102
    assert kernel_view(world.pod)["qdiscs"] == []  # the egress tbf made before is gone
    assert dict(links_named(world.pod))["ifb-eth0"] == "macvlan"  # not ours: left alone
    remove_shaping(world.pod, IFNAME)
    assert dict(links_named(world.pod))["ifb-eth0"] == "macvlan"


def test_failure_after_the_ifb_is_made_removes_it(world, monkeypatch) -> None:
    from pyroute2.netlink.exceptions import NetlinkError as PrNetlinkError

    def refuse(*_args: object) -> None:
        raise PrNetlinkError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(shaping, "_add_redirect", refuse)
    with pytest.raises(NetlinkError, match="failed to redirect ingress of eth0 .* kernel lacks") as err:
        apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M))
    assert err.value.code == 102 and isinstance(err.value.__cause__, PrNetlinkError)
    assert kernel_view(world.pod) == {"links": {"lo": None, "eth0": "macvlan"}, "qdiscs": []}


def _set_group(netns: str, name: str, group: int) -> None:
    from pyroute2 import IPRoute

    with IPRoute(netns=netns) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=name)[0], group=group)


def test_the_ifb_device_is_made_with_the_mark(world) -> None:
    from pyroute2 import IPRoute

    apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M), new_link=True)
    with IPRoute(netns=world.pod) as ipr:
        (ifb,) = ipr.link("get", ifname="ifb-eth0")
    assert ifb.get_attr("IFLA_GROUP") == shaping.IFB_GROUP == 0x7CD31FB0


def test_an_ifb_device_someone_else_made_is_never_taken_nor_deleted(world) -> None:
    """An ifb device named ``ifb-eth0`` without cni-dra's mark: applying refuses it (code 102
    naming it, the interface left unshaped), and removing or deleting leaves it."""
    from pyroute2 import IPRoute

    with IPRoute(netns=world.pod) as ipr:
        ipr.link("add", ifname="ifb-eth0", kind="ifb")
    for new_link in (True, False):
        with pytest.raises(NetlinkError, match="ifb-eth0 exists and cni-dra did not make it") as err:
            apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M), new_link=new_link)
        assert err.value.code == 102
        assert kernel_view(world.pod) == {
            "links": {"lo": None, "eth0": "macvlan", "ifb-eth0": "ifb"},
            "qdiscs": [],
        }
    apply_shaping(world.pod, IFNAME, ShapeSpec(egress_rate_bps=100 * M))  # needs no ifb device
    assert remove_shaping(world.pod, IFNAME) is True  # (the egress tbf)
    assert delete_shaped_link(world.pod, IFNAME) == (True, False)
    assert dict(links_named(world.pod)) == {"lo": None, "ifb-eth0": "ifb"}
    assert delete_shaped_link(world.pod, IFNAME) == (False, False)  # nor when the link is gone
    assert remove_shaping(world.pod, IFNAME) is False
    assert dict(links_named(world.pod)) == {"lo": None, "ifb-eth0": "ifb"}


@pytest.mark.parametrize("how", ["remove", "delete", "reapply"])
def test_an_ifb_device_made_before_the_mark_is_known_by_the_redirect(world, how) -> None:
    """An ifb device an older cni-dra made (no mark) that the link's ingress redirects to is
    cni-dra's: removed, deleted, or taken again (and marked) as before."""
    from pyroute2 import IPRoute

    apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(100 * M))
    _set_group(world.pod, "ifb-eth0", 0)
    if how == "remove":
        assert remove_shaping(world.pod, IFNAME) is True
        assert dict(links_named(world.pod)) == {"lo": None, "eth0": "macvlan"}
    elif how == "delete":
        assert delete_shaped_link(world.pod, IFNAME) == (True, True)
        assert dict(links_named(world.pod)) == {"lo": None}
    else:
        info = apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(300 * M))
        assert info.ifb == "ifb-eth0" and near(info.ingress, Tbf.for_rate(300 * M))
        with IPRoute(netns=world.pod) as ipr:
            assert ipr.link("get", ifname="ifb-eth0")[0].get_attr("IFLA_GROUP") == shaping.IFB_GROUP


def test_a_bucket_the_kernel_cannot_hold_is_refused_before_any_change(world) -> None:
    """The spec is checked against the interface's own MTU (here 1500) before anything is
    installed: code 7 naming the bound, not the kernel's 'Invalid argument'."""
    spec = ShapeSpec(egress_rate_bps=300 * M, egress_burst_bytes=1500, mtu=1000)  # fits MTU 1000, not 1500
    with pytest.raises(
        InvalidConfigError, match=r"burst 1500 bytes is below 1589 bytes, .* MTU 1500 .* in netns"
    ) as err:
        apply_shaping(world.pod, IFNAME, spec, new_link=True)
    assert err.value.code == 7
    assert kernel_view(world.pod) == {"links": {"lo": None, "eth0": "macvlan"}, "qdiscs": []}


def test_every_bucket_it_takes_the_kernel_holds_as_asked(world) -> None:
    """Rates and bursts over their whole range on a real interface: the spec is refused
    (code 7) or the kernel holds what was asked, and CHECK's comparison finds it so."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cni_dra.attach.shaping_plan import mismatch, record

    @settings(max_examples=40, deadline=None)
    @given(
        rate=st.integers(min_value=1, max_value=2**36) | st.integers(min_value=2000, max_value=5000),
        burst=st.none()
        | st.integers(min_value=1, max_value=2**32 - 1)
        | st.integers(min_value=1000, max_value=9000),
    )
    def check(rate: int, burst: int | None) -> None:
        try:
            spec = ShapeSpec(
                egress_rate_bps=rate,
                egress_burst_bytes=burst,
                ingress_rate_bps=rate,
                ingress_burst_bytes=burst,
            )
        except InvalidConfigError as exc:
            assert exc.code == 7
            return
        added = apply_shaping(world.pod, IFNAME, spec, new_link=True)
        try:
            assert mismatch(record(added), read_shaping(world.pod, IFNAME)) is None
        finally:
            remove_shaping(world.pod, IFNAME)

    check()


def test_missing_interface_is_a_netlink_error(world) -> None:
    with pytest.raises(NetlinkError, match="failed to shape eth9 in netns .*: no such interface"):
        apply_shaping(world.pod, "eth9", ShapeSpec.symmetric(100 * M))
    assert "ifb-eth9" not in dict(links_named(world.pod))


# -- real traffic ---------------------------------------------------------------------------

needs_iperf3 = pytest.mark.skipif(IPERF3 is None, reason="iperf3 not installed (make deps installs it)")


@pytest.fixture
def iperf_server(world, tmp_path) -> Iterator[None]:
    """An iperf3 server in the remote netns for the test (log in a file); killed and reaped afterwards."""
    with IperfServer(world.remote, REMOTE_IP, tmp_path):
        yield


@needs_iperf3
@pytest.mark.parametrize(
    "rate_bps", [None, 100 * M, 300 * M, 1000 * M], ids=["unshaped", "100M", "300M", "1G"]
)
def test_tcp_throughput_follows_the_rate_both_ways(world, iperf_server, rate_bps, capsys) -> None:
    if rate_bps is not None:
        apply_shaping(world.pod, IFNAME, ShapeSpec.symmetric(rate_bps))
    measured = {
        d: median_bps(Client(world.pod, REMOTE_IP, reverse=d == "ingress")) for d in ("egress", "ingress")
    }
    with capsys.disabled():
        for d, bps in measured.items():
            dev = f"{(bps / rate_bps - 1) * 100:+.1f} %" if rate_bps else "-"
            label = f"{rate_bps // M}M" if rate_bps else "unshaped"
            print(f"\nshaping throughput: rate {label} {d}: median {bps / M:.1f} Mbit/s, deviation {dev}")
    for d, bps in measured.items():
        if rate_bps is None:  # the NIC must carry well above every shaped rate, or the test proves nothing
            assert bps > 2 * 1000 * M, f"{d}: unshaped only {bps / M:.0f} Mbit/s"
        else:
            assert abs(bps / rate_bps - 1) <= TOLERANCE, (
                f"{d}: {bps / M:.1f} Mbit/s for a {rate_bps // M}M rate"
            )
