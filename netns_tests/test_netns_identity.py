"""A network namespace is its device and inode, not its path: the installed plugin and
``cni-dra state repair`` in real namespaces, with the pod's namespace named
``/run/netns/NAME`` (as podman and others spell it; ``/var/run`` is a symlink to ``/run``)
where repair finds it as ``/var/run/netns/NAME``; and what DEL may delete: not a link another
attachment's record names, and with an empty CNI_NETNS the link in the recorded namespace.

Judged independently of the plugin's report: the state files (:meth:`NodeBed.consumed`,
``phases``), the kernel's links (pyroute2) and host-local's reservations.
"""

from __future__ import annotations

import json
import os

import pytest

from cni_dra.quantity import Quantity
from netns_tests.bed import NodeBed, links_named, repair

NET = "idnet"
SHAPED_POD = {"lo": None, "eth0": "macvlan", "ifb-eth0": "ifb"}
"""The links of a pod the node's network attached (shaped: the ifb device beside eth0)."""


@pytest.fixture
def node(make_node) -> NodeBed:
    """One 10G stand-in NIC (``nic-a``) on network ``idnet``."""
    return make_node(nics=1, network=NET)


def _run_path(netns: str) -> str:
    """The same namespace as ``netns`` (``/var/run/netns/NAME``) under ``/run/netns/NAME``."""
    path = "/run/netns/" + os.path.basename(netns)
    assert os.path.realpath(netns) == path  # this node's /var/run is /run
    return path


def _links(netns: str) -> dict[str, str | None]:
    return dict(links_named(netns))


def test_repair_finds_a_pod_added_under_run_netns_tracked(node, make_netns):
    """Repair lists /var/run/netns; the pod was added as /run/netns/NAME. The same namespace:
    its link is tracked, nothing is charged again, however often repair runs; the pod's DEL
    frees the NIC for a 9G pod."""
    ns = make_netns()
    assert node.add(_run_path(ns), "pod-a", conf=node.conf("2G"))[0] == 0
    for _ in range(2):
        code, out, err = repair(node, "--json")
        assert code == 0, (out, err)
        changes = json.loads(out)["changes"]
        assert not any(c.startswith("untracked link") for c in changes), changes
        assert node.consumed() == {"nic-a": {"bandwidth": Quantity.parse("2G")}}
    assert node.phases() == {"pod-a": "ready"}
    code, out, err = node.delete(_run_path(ns), "pod-a", conf=node.conf("2G"))
    assert code == 0, (out, err)
    assert node.consumed() == {}
    assert _links(ns) == {"lo": None}
    code, out, err = node.add(make_netns(), "pod-b", conf=node.conf("9G"))
    assert code == 0, (out, err)


def test_del_releases_a_repair_placeholder_under_another_path(node, make_netns):
    """Repair charges an untracked link found as /var/run/netns/NAME; the pod's DEL says
    /run/netns/NAME: its placeholder is released and the NIC freed."""
    from pyroute2 import IPRoute

    ns = make_netns()
    with IPRoute() as ipr:
        (parent,) = ipr.link_lookup(ifname=node.parents["nic-a"])
        fd = os.open(ns, os.O_RDONLY)
        try:
            ipr.link("add", ifname="stray0", kind="macvlan", link=parent, macvlan_mode="bridge", net_ns_fd=fd)
        finally:
            os.close(fd)
    code, out, err = repair(node, "--json")
    assert code == 0, (out, err)
    assert node.consumed() == {"nic-a": {"bandwidth": Quantity.parse("10G")}}, out
    code, out, err = node.delete(_run_path(ns), "pod-x", ifname="stray0")
    assert code == 0, (out, err)
    assert node.consumed() == {}
    assert _links(ns) == {"lo": None}


@pytest.mark.parametrize("spelling", ["same path", "/run path"])
def test_del_of_an_unknown_container_leaves_another_attachments_link(node, make_netns, spelling):
    """A DEL whose container has no record, with the netns and ifname of another
    container's live attachment, deletes neither that attachment's link nor its ifb device."""
    ns = make_netns()
    code, out, err = node.add(ns, "pod-a")
    assert code == 0, (out, err)
    ip_a = out["ips"][0]["address"].split("/")[0]
    code, out, err = node.delete(ns if spelling == "same path" else _run_path(ns), "intruder")
    assert code == 0, (out, err)
    assert _links(ns) == SHAPED_POD
    assert node.phases() == {"pod-a": "ready"}
    assert node.consumed() == {"nic-a": {"bandwidth": Quantity.parse("1G")}}
    assert node.ip_holders() == {ip_a: "pod-a"}
    code, out, err = node.delete(ns, "pod-a")  # the owner's DEL removes both
    assert code == 0, (out, err)
    assert _links(ns) == {"lo": None} and node.consumed() == {} and node.ip_holders() == {}


def test_del_with_empty_netns_removes_the_link_in_the_recorded_namespace(node, make_netns):
    """CNI_NETNS may be empty on DEL: the link (holding the address being released) and its
    ifb device go from the namespace the attachment recorded, which still exists."""
    ns = make_netns()
    code, out, err = node.add(ns, "pod-a")
    assert code == 0, (out, err)
    assert _links(ns) == SHAPED_POD
    code, out, err = node.delete("", "pod-a")
    assert code == 0, (out, err)
    assert _links(ns) == {"lo": None}
    assert node.phases() == {} and node.consumed() == {} and node.ip_holders() == {}
    code, out, err = node.delete("", "pod-a")  # repeated: nothing left to do
    assert code == 0, (out, err)
