"""CHECK fails, naming the cause, when the attachment cannot pass traffic: the pod's link or
its parent NIC administratively down, or without carrier (``ip link``'s NO-CARRIER).

The links are :class:`~cni_dra.netlink.info.LinkInfo` values on the in-memory host
(tests/fake_host.py); netns_tests/test_fastpath.py makes the same cases with real links.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from cni_dra.errors import CheckFailedError
from cni_dra.netlink.info import LinkInfo
from cni_dra.verbs import check
from tests.fake_host import FakeHost, nic, pod_link

NETNS = "/var/run/netns/pod-1"
MAC = "02:00:00:00:00:07"


def _inv(pod: LinkInfo, parent: LinkInfo) -> Any:
    prev = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "mac": MAC, "sandbox": NETNS}],
        "ips": [{"address": "10.0.0.7/24", "interface": 0}],
    }
    att = SimpleNamespace(
        phase="ready",
        linkType="macvlan",
        parent="nic0",
        device="nic-a",
        netns=NETNS,
        shaping=None,
        netnsIdentity=None,
        profile=None,
    )
    store = SimpleNamespace(peek=lambda: SimpleNamespace(find=lambda *key: att))
    return SimpleNamespace(
        env=SimpleNamespace(ifname="eth0", container_id="c1", netns=NETNS, path=["/opt/cni/bin"]),
        conf=SimpleNamespace(
            prevResult=prev, cniVersion="1.1.0", name="net1", ipam_type=None, mode="bridge", ipvlanFlag=None
        ),
        raw=b"{}",
        environ={},
        store=store,
        host=_host(pod, parent),
    )


def _host(pod: LinkInfo, parent: LinkInfo) -> FakeHost:
    host = FakeHost()
    host.host_links[parent.name] = parent
    host.put_link(NETNS, pod, parent.name)
    return host


def _pod_link(**changes: Any) -> LinkInfo:
    return pod_link(**{"mac": MAC, "addresses": ("10.0.0.7/24",), **changes})


def _parent(**changes: Any) -> LinkInfo:
    return replace(nic("nic0", 5), kind="veth", mac="02:00:00:00:00:01", **changes)


@pytest.mark.parametrize(
    ("pod", "parent", "says"),
    [
        (
            {"admin_up": False, "carrier": False, "operstate": "DOWN", "addresses": ()},
            {},
            "the link is administratively down in netns /var/run/netns/pod-1",
        ),
        (
            {"carrier": False, "operstate": "LOWERLAYERDOWN"},
            {"admin_up": False, "carrier": False, "operstate": "DOWN"},
            "its parent NIC nic0 (device nic-a) is administratively down",
        ),
        (
            {"carrier": False, "operstate": "DOWN"},
            {"carrier": False, "operstate": "LOWERLAYERDOWN"},
            "its parent NIC nic0 (device nic-a) has no carrier (NO-CARRIER)",
        ),
        ({"carrier": False, "operstate": "DOWN"}, {}, "the link has no carrier (NO-CARRIER)"),
    ],
    ids=["pod-link-admin-down", "parent-admin-down", "parent-no-carrier", "pod-link-no-carrier"],
)
def test_check_names_why_the_link_cannot_pass_traffic(pod, parent, says) -> None:
    with pytest.raises(CheckFailedError) as ei:
        check.cmd_check(_inv(_pod_link(**pod), _parent(**parent)))
    assert ei.value.code == 105
    assert ei.value.msg == f"failed to check interface eth0 of container c1: {says}"


def test_check_passes_when_both_links_are_up_with_carrier() -> None:
    check.cmd_check(_inv(_pod_link(), _parent()))


def test_operstate_unknown_with_carrier_passes() -> None:
    """Drivers that do not track operstate report UNKNOWN: the carrier bit decides."""
    check.cmd_check(_inv(_pod_link(operstate="UNKNOWN"), _parent(operstate="UNKNOWN")))
