"""Bandwidth that is enforced: the installed cni-dra shapes each pod interface to the share
it consumed, run exactly as a runtime runs it.

The kernel view comes from :func:`cni_dra.netlink.shaping.read_shaping` and pyroute2 link
dumps; the operator's from ``cni-dra status``; the traffic from Debian's ``iperf3``
(:mod:`netns_tests.traffic`) with the stand-in NIC's peer in a "remote" netns, so that a
pod that sends or receives more than its share is caught (rate within ±10 % of the
allocation, median of 3 runs of 3 s, while the NIC carries several Gbit/s unshaped:
``test_shaping.py`` measures that baseline).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cni_dra.netlink.shaping import Tbf, ifb_name, read_shaping
from netns_tests.bed import NodeBed, links_named, pod_args, repair
from netns_tests.runner import cni_dra_cli, run_plugin
from netns_tests.traffic import (
    IPERF3,
    TOLERANCE,
    Client,
    IperfServer,
    M,
    concurrent_median_bps,
    median_bps,
    remote_end,
)

NET = "shapenet"
REMOTE_IP = "198.51.100.254"  # the NIC's peer; host-local hands pods .2, .3, ... of the same /24
MAX_U32 = 2**32 - 1  # what containerd sends as the burst when a pod names only a rate


@pytest.fixture
def node(make_node) -> NodeBed:
    """One 10G stand-in NIC (``nic-a``) on network ``shapenet``."""
    return make_node(nics=1, network=NET, version="1.1.0")


def _add(node: NodeBed, netns: str, cid: str, bandwidth: str = "300M", **conf: object) -> dict:
    code, out, err = node.add(netns, cid, conf=node.conf(bandwidth, **conf))
    assert code == 0, (out, err)
    assert out is not None
    return out


def _ifbs(netns: str) -> list[str]:
    return [name for name, kind in links_named(netns) if kind == "ifb"]


def _near(got: Tbf | None, rate_bps: int) -> bool:
    """The kernel holds ``rate_bps`` with the default bucket (burst within tick rounding)."""
    want = Tbf.for_rate(rate_bps)
    return (
        got is not None
        and got.rate_bps == want.rate_bps
        and got.limit_bytes == want.limit_bytes
        and abs(got.burst_bytes - want.burst_bytes) <= max(16, want.burst_bytes // 1000)
    )


# -- ADD -------------------------------------------------------------------------------------


def test_add_shapes_the_pod_interface_to_its_share(node, make_netns) -> None:
    ns = make_netns()
    _add(node, ns, "pod-a", "300M")
    info = read_shaping(ns, "eth0")
    assert info is not None and info.ifb == ifb_name("eth0") == "ifb-eth0"
    assert _near(info.egress, 300 * M) and _near(info.ingress, 300 * M)
    assert _ifbs(ns) == ["ifb-eth0"]
    (att,) = node.status()["attachments"]
    assert att["shaping"]["egress"]["rate"] == att["shaping"]["ingress"]["rate"] == "300M"
    assert att["shaping"]["ifb"] == "ifb-eth0" and att["shaping"]["egress"]["rateBps"] == 300 * M
    table = cni_dra_cli("status", "--state-dir", str(node.state_dir), "--inventory", str(node.inventory))
    assert table.returncode == 0 and "egress=300M,ingress=300M" in table.stdout, table.stdout + table.stderr


def test_one_capacity_per_direction(node, make_netns) -> None:
    """``ingressCapacity`` alone: the pod's ingress follows it, its egress is not shaped."""
    ns = make_netns()
    _add(node, ns, "pod-a", "200M", shaping={"ingressCapacity": "bandwidth"})
    info = read_shaping(ns, "eth0")
    assert info is not None and info.egress is None and _near(info.ingress, 200 * M)
    assert list(node.status()["attachments"][0]["shaping"]) == ["ingress", "ifb"]


def test_shaping_false_installs_nothing(node, make_netns) -> None:
    ns = make_netns()
    _add(node, ns, "pod-a", "300M", shaping=False)
    assert read_shaping(ns, "eth0") is None
    assert sorted(name for name, _ in links_named(ns)) == ["eth0", "lo"]
    assert node.status()["attachments"][0]["shaping"] is None


def test_runtime_bandwidth_lowers_the_rate_never_raises_it(node, make_netns) -> None:
    """What containerd sends for ``kubernetes.io/ingress-bandwidth: 100M`` and
    ``egress-bandwidth: 2G`` on a pod that holds 300M: ingress 100M, egress stays 300M;
    the runtime's 2**32-1 bit bursts ("no preference") leave the default buckets."""
    ns = make_netns()
    rc = {
        "bandwidth": {
            "ingressRate": 100 * M,
            "ingressBurst": MAX_U32,
            "egressRate": 2000 * M,
            "egressBurst": MAX_U32,
        }
    }
    _add(node, ns, "pod-a", "300M", capabilities={"bandwidth": True}, runtimeConfig=rc)
    info = read_shaping(ns, "eth0")
    assert info is not None and _near(info.ingress, 100 * M) and _near(info.egress, 300 * M)


def test_a_failed_add_leaves_no_qdisc_and_no_ifb(node, make_netns) -> None:
    """IPAM fails after the link was made and shaped (it runs meanwhile): every step is undone."""
    ns = make_netns()
    bad_ipam = {"type": "static", "addresses": [{"address": "not-an-address"}]}
    code, out, err = node.add(ns, "pod-a", conf=node.conf("300M", ipam=bad_ipam))
    assert code == 1 and out is not None and out["code"] != 0, (out, err)
    assert [name for name, _ in links_named(ns)] == ["lo"]
    assert node.status()["attachments"] == [] and node.reported_consumed() == {"nic-a": "0"}


def test_a_shaping_failure_fails_the_add_with_code_102_and_undoes_it(node, make_netns) -> None:
    """A link of another kind holds the ifb device's name: ADD says so (as it would say
    ``kernel lacks ifb``) and leaves the pod as it found it, that link included."""
    from pyroute2 import IPRoute

    ns = make_netns()
    with IPRoute(netns=ns) as ipr:
        ipr.link("add", ifname="ifb-eth0", kind="veth", peer="ifb-eth0p")
    code, out, err = node.add(ns, "pod-a", conf=node.conf("300M"))
    assert code == 1 and out is not None and out["code"] == 102, (out, err)
    assert (
        out["msg"]
        == f"failed to create ifb device ifb-eth0 in netns {ns}: ifb-eth0 exists and is not an ifb device"
    )
    assert sorted(links_named(ns)) == [("ifb-eth0", "veth"), ("ifb-eth0p", "veth"), ("lo", None)]
    assert node.status()["attachments"] == [] and node.reported_consumed() == {"nic-a": "0"}
    # shaping off: the same pod comes up (unshaped)
    _add(node, ns, "pod-a", "300M", shaping=False)


def _leaves_the_pod_as_it_was(node: NodeBed, ns: str, err: str) -> bool:
    return (
        "Traceback" not in err
        and [name for name, _ in links_named(ns)] == ["lo"]
        and node.status()["attachments"] == []
        and node.reported_consumed() == {"nic-a": "0"}
    )


@pytest.mark.parametrize(
    ("conf", "says"),
    [
        # what containerd sends for kubernetes.io/ingress-bandwidth: 1k (an ADD that crashed with 999 before)
        (
            {
                "capabilities": {"bandwidth": True},
                "runtimeConfig": {"bandwidth": {"ingressRate": 1000, "ingressBurst": MAX_U32}},
            },
            "invalid shaping: ingress rate 1kbit/s (runtimeConfig.bandwidth.ingressRate) is below 2824bit/s, the lowest at "
            "which tbf passes a full frame on an interface of MTU 1500 (1514 bytes in 4.29 s of the rate)",
        ),
        # a tiny burst (the kernel's 'Invalid argument', code 102, before)
        (
            {
                "capabilities": {"bandwidth": True},
                "runtimeConfig": {"bandwidth": {"ingressRate": 100 * M, "ingressBurst": 80}},
            },
            "invalid shaping: runtimeConfig.bandwidth.ingressBurst 80 bits (10 bytes) is below 1539 bytes, the smallest "
            "bucket at 100Mbit/s on an interface of MTU 1500",
        ),
        # a capacity no device has (silently unshaped before)
        (
            {"shaping": {"capacity": "egressBW"}},
            "invalid shaping: shaping.capacity names capacity 'egressBW', which device nic-a does not have (its "
            "capacities: bandwidth)",
        ),
    ],
)
def test_shaping_the_kernel_cannot_hold_fails_the_add_with_code_7(node, make_netns, conf, says) -> None:
    ns = make_netns()
    code, out, err = node.add(ns, "pod-a", conf=node.conf("300M", **conf))
    assert code == 1 and out is not None and out["code"] == 7, (out, err)
    assert out["msg"].startswith(says), out
    assert _leaves_the_pod_as_it_was(node, ns, err), err


def test_a_burst_at_its_documented_maximum_is_installed(node, make_netns) -> None:
    """``egressBurstBytes`` 2**32-1 at 300M: tbf holds it (the queue limit stops at 2**32-1
    bytes), CHECK finds it as added."""
    ns = make_netns()
    conf = node.conf("300M", shaping={"egressBurstBytes": MAX_U32})
    res = _add(node, ns, "pod-a", "300M", shaping={"egressBurstBytes": MAX_U32})
    info = read_shaping(ns, "eth0")
    assert info is not None and info.egress is not None
    assert info.egress.limit_bytes == MAX_U32 and abs(info.egress.burst_bytes - MAX_U32) <= 100
    code, out, err = run_plugin(
        "CHECK",
        dict(conf, prevResult=res),
        container_id="pod-a",
        netns=ns,
        ifname="eth0",
        cni_args=pod_args("pod-a"),
    )
    assert (code, out) == (0, None), (out, err)


def test_a_foreign_ifb_device_of_the_same_name_is_refused_and_never_deleted(node, make_netns) -> None:
    """Someone made ``ifb-net1`` in the pod's netns before ADD: ADD does not take it over
    (code 102 naming it), and neither ADD's undo, nor DEL, nor an ADD that needs no ifb
    device and its DEL, delete it."""
    from pyroute2 import IPRoute

    ns = make_netns()
    with IPRoute(netns=ns) as ipr:
        ipr.link("add", ifname="ifb-net1", kind="ifb")
    code, out, err = node.add(ns, "pod-a", conf=node.conf("300M"), ifname="net1")
    assert code == 1 and out is not None and out["code"] == 102, (out, err)
    assert out["msg"] == (
        f"failed to create ifb device ifb-net1 in netns {ns}: ifb-net1 exists and cni-dra did not "
        "make it (not in cni-dra's netdev group 0x7cd31fb0); it is left alone: remove it, or use "
        "another interface name"
    )
    assert sorted(links_named(ns)) == [("ifb-net1", "ifb"), ("lo", None)]
    assert node.delete(ns, "pod-a", ifname="net1")[:2] == (0, None)  # a DEL without a record
    assert sorted(links_named(ns)) == [("ifb-net1", "ifb"), ("lo", None)]
    egress_only = node.conf("300M", shaping={"egressCapacity": "bandwidth"})
    code, out, err = node.add(ns, "pod-a", conf=egress_only, ifname="net1")
    assert code == 0, (out, err)
    assert node.delete(ns, "pod-a", conf=egress_only, ifname="net1")[:2] == (0, None)
    assert sorted(links_named(ns)) == [("ifb-net1", "ifb"), ("lo", None)]


# -- DEL, CHECK, GC, repair ------------------------------------------------------------------


def test_del_removes_the_ifb_when_the_netns_outlives_the_pod(node, make_netns) -> None:
    ns = make_netns()
    _add(node, ns, "pod-a")
    for _ in range(2):  # DEL, then DEL again
        code, out, err = node.delete(ns, "pod-a")
        assert (code, out) == (0, None), err
        assert [name for name, _ in links_named(ns)] == ["lo"]


def _tamper(ns: str, how: str) -> None:
    from pyroute2 import IPRoute

    with IPRoute(netns=ns) as ipr:
        (eth0,) = ipr.link_lookup(ifname="eth0")
        if how == "egress tbf deleted":
            ipr.tc("del", index=eth0, handle=0x10000, parent=0xFFFFFFFF)
        elif how == "ingress qdisc deleted":
            ipr.tc("del", index=eth0, handle=0xFFFF0000, parent=0xFFFFFFF1)
        elif how == "ifb deleted":
            ipr.link("del", index=ipr.link_lookup(ifname="ifb-eth0")[0])
        elif how == "ifb down":  # mirred to a device that is down drops every packet
            ipr.link("set", index=ipr.link_lookup(ifname="ifb-eth0")[0], state="down")
        elif how == "egress rate changed":
            ipr.tc(
                "replace",
                "tbf",
                eth0,
                0x10000,
                parent=0xFFFFFFFF,
                rate=100 * M // 8,
                burst=131072,
                limit=443572,
            )
        else:
            raise ValueError(how)


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("egress tbf deleted", "egress is not shaped (the root tbf qdisc is missing), expected 300Mbit/s"),
        (
            "ingress qdisc deleted",
            "ingress is not shaped (the ingress redirect to ifb-eth0 and its tbf is missing)",
        ),
        ("ifb deleted", "ingress is not shaped"),
        ("egress rate changed", "egress rate is 100Mbit/s, expected 300Mbit/s"),
        (
            "ifb down",
            "ingress goes through ifb device ifb-eth0, which is down (it drops every packet the pod receives)",
        ),
    ],
)
def test_check_fails_when_the_shaping_is_not_as_added(node, make_netns, how, says) -> None:
    ns = make_netns()
    conf = node.conf("300M")
    res = _add(node, ns, "pod-a")
    checked = dict(conf, prevResult=res)
    code, out, err = run_plugin(
        "CHECK", checked, container_id="pod-a", netns=ns, ifname="eth0", cni_args=pod_args("pod-a")
    )
    assert (code, out) == (0, None), (out, err)
    _tamper(ns, how)
    code, out, err = run_plugin(
        "CHECK", checked, container_id="pod-a", netns=ns, ifname="eth0", cni_args=pod_args("pod-a")
    )
    assert code == 1 and out is not None and out["code"] == 105, (out, err)
    assert (
        out["msg"].startswith("failed to check interface eth0 of container pod-a: ") and says in out["msg"]
    ), out


def test_gc_removes_the_ifb_of_a_stale_attachment(node, make_netns) -> None:
    ns = make_netns()
    _add(node, ns, "pod-a")
    node.age_attachments()
    code, out, err = node.run("GC", {**node.conf("300M"), "cni.dev/valid-attachments": []})
    assert (code, out) == (0, None), (out, err)
    assert [name for name, _ in links_named(ns)] == ["lo"] and node.status()["attachments"] == []


def test_state_repair_removes_a_leaked_ifb(node, make_netns) -> None:
    """The pod's interface went behind cni-dra's back, its ifb device stayed: ``state repair``
    drops the attachment and removes the device."""
    from pyroute2 import IPRoute

    ns = make_netns()
    _add(node, ns, "pod-a")
    with IPRoute(netns=ns) as ipr:
        ipr.link("del", index=ipr.link_lookup(ifname="eth0")[0])
    assert _ifbs(ns) == ["ifb-eth0"]
    code, out, err = repair(node, "--json")
    assert code == 0, err
    changes = json.loads(out)["changes"]
    assert any(
        "link not live" in c and f"shaping of eth0 (ifb-eth0) removed in {ns}" in c for c in changes
    ), changes
    assert [name for name, _ in links_named(ns)] == ["lo"] and node.status()["attachments"] == []


# -- real traffic ----------------------------------------------------------------------------

needs_iperf3 = pytest.mark.skipif(IPERF3 is None, reason="iperf3 not installed (make deps installs it)")


@pytest.fixture
def remote(node, make_netns) -> str:
    """A netns holding the NIC's peer end at :data:`REMOTE_IP`: what the pods talk to."""
    ns = make_netns()
    remote_end(node.nics[0], ns, REMOTE_IP)
    return ns


@pytest.fixture
def servers(remote, tmp_path) -> Iterator[list[int]]:
    """Two iperf3 servers in the remote netns; their ports."""
    with (
        IperfServer(remote, REMOTE_IP, tmp_path, port=5201),
        IperfServer(remote, REMOTE_IP, tmp_path, port=5202),
    ):
        yield [5201, 5202]


def _report(capsys, label: str, rate_bps: int, direction: str, bps: float) -> None:
    with capsys.disabled():
        print(
            f"\nshaping throughput (plugin): {label} allocated {rate_bps // M}M {direction}: "
            f"median {bps / M:.1f} Mbit/s, deviation {(bps / rate_bps - 1) * 100:+.1f} %"
        )


@needs_iperf3
def test_a_pod_sending_or_receiving_more_than_its_share_is_held_to_it(
    node, make_netns, servers, capsys
) -> None:
    ns = make_netns()
    _add(node, ns, "pod-a", "300M")
    for direction in ("egress", "ingress"):
        bps = median_bps(Client(ns, REMOTE_IP, reverse=direction == "ingress"))
        _report(capsys, "one pod", 300 * M, direction, bps)
        assert abs(bps / (300 * M) - 1) <= TOLERANCE, f"{direction}: {bps / M:.1f} Mbit/s for a 300M share"


@needs_iperf3
def test_two_pods_sharing_a_nic_each_get_their_own_rate_at_once(node, make_netns, servers, capsys) -> None:
    shares = {"pod-a": 300 * M, "pod-b": 700 * M}
    netns = {cid: make_netns() for cid in shares}
    for cid, rate in shares.items():
        _add(node, netns[cid], cid, f"{rate // M}M")
    assert node.reported_consumed() == {"nic-a": "1G"}
    for direction in ("egress", "ingress"):
        clients = [
            Client(netns[cid], REMOTE_IP, reverse=direction == "ingress", port=port)
            for cid, port in zip(shares, servers, strict=True)
        ]
        measured = concurrent_median_bps(clients)
        for (cid, rate), bps in zip(shares.items(), measured, strict=True):
            _report(capsys, f"two pods at once, {cid}", rate, direction, bps)
        for (cid, rate), bps in zip(shares.items(), measured, strict=True):
            assert abs(bps / rate - 1) <= TOLERANCE, (
                f"{cid} {direction}: {bps / M:.1f} Mbit/s for {rate // M}M"
            )
