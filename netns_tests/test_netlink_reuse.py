"""Root tests: the host rtnetlink socket kept per thread, and the request-saving options.

Expected values come from the kernel through pyroute2 used directly, never from cni_dra.
"""

from __future__ import annotations

import io
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from cni_dra.netlink import _rtnl, addr, netns, sockets, sublink
from cni_dra.netlink import info as linkinfo
from netns_tests.conftest import unique_name
from netns_tests.runner import CNI_PATH


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every rtnetlink socket cni_dra opens (the real ones), in order; the kept socket starts and ends empty."""
    real = _rtnl.Rtnl
    made: list[Any] = []

    def counting_rtnl() -> Any:
        ipr = real()
        made.append(ipr)
        return ipr

    sockets.drop_held()
    monkeypatch.setattr(_rtnl, "Rtnl", counting_rtnl)
    try:
        yield made
    finally:
        sockets.drop_held()


def _ns_link_index(path: str, name: str) -> int:
    from pyroute2.iproute.linux import IPRoute

    with IPRoute(netns=path) as ipr:
        (idx,) = ipr.link_lookup(ifname=name)
        return idx


def test_main_thread_keeps_one_host_socket(make_parent_nic, opened) -> None:
    parent = make_parent_nic()
    first = linkinfo.host_link(parent)
    again = linkinfo.host_link(parent)
    linkinfo.list_host_links()
    assert first is not None and again is not None and first.index == again.index
    assert len(opened) == 1


def test_short_lived_threads_open_one_per_call(make_parent_nic, opened) -> None:
    parent = make_parent_nic()
    seen: list[Any] = []
    t = threading.Thread(target=lambda: seen.extend([linkinfo.host_link(parent), linkinfo.host_link(parent)]))
    t.start()
    t.join()
    assert all(li is not None for li in seen) and len(seen) == 2
    assert len(opened) == 2
    assert all(ipr.closed for ipr in opened)  # each closed after its call


def test_a_kept_worker_thread_reuses_one_socket_and_closes_it_at_the_end(make_parent_nic, opened) -> None:
    parent = make_parent_nic()
    seen: list[Any] = []

    def worker() -> None:
        with sockets.keep_host_socket():
            seen.extend([linkinfo.host_link(parent), linkinfo.host_link(parent)])
            seen.append(getattr(sockets._held, "socket", None))
        seen.append(getattr(sockets._held, "socket", None))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen[0] is not None and seen[1] is not None
    assert len(opened) == 1
    assert seen[2] is not None and seen[3] is None
    assert opened[0].closed


def test_inside_another_netns_host_calls_act_there(make_netns, make_parent_nic, opened) -> None:
    parent = make_parent_nic()
    path = make_netns()
    name = unique_name()
    sublink.create_macvlan(parent=parent, netns=path, ifname=name)
    assert linkinfo.host_link(parent) is not None  # the main thread now keeps a host socket
    with netns.in_netns(path):
        inside = linkinfo.host_link(name)
        parent_inside = linkinfo.host_link(parent)
    assert inside is not None and inside.index == _ns_link_index(path, name)
    assert parent_inside is None
    assert linkinfo.host_link(name) is None  # back on the host: the kept socket again
    assert linkinfo.host_link(parent) is not None


def test_an_error_discards_the_kept_socket(make_parent_nic, opened) -> None:
    parent = make_parent_nic()
    linkinfo.host_link(parent)
    kept = sockets._held.socket
    with pytest.raises(RuntimeError):
        with sockets.host_iproute():
            raise RuntimeError("injected")
    assert sockets._held.socket is None
    assert kept.ipr.closed
    assert linkinfo.host_link(parent) is not None
    assert len(opened) == 2


def test_a_forked_child_does_not_use_the_parents_socket(make_parent_nic, opened) -> None:
    parent = make_parent_nic()
    linkinfo.host_link(parent)
    kept = sockets._held.socket
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        ok = False
        try:
            ok = linkinfo.host_link(parent) is not None and sockets._held.socket is not kept
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sockets._held.socket is kept  # the parent keeps using its own


def test_create_with_parent_link_does_not_look_the_parent_up(
    make_netns, make_parent_nic, monkeypatch
) -> None:
    parent = make_parent_nic()
    path = make_netns()
    known = linkinfo.host_link(parent)
    asked: list[Any] = []
    real = linkinfo.get_link

    def spy(ipr: Any, *, ifname: str | None = None, index: int | None = None) -> Any:
        asked.append(ifname if ifname is not None else index)
        return real(ipr, ifname=ifname, index=index)

    monkeypatch.setattr(linkinfo, "get_link", spy)
    info = sublink.create_macvlan(parent=parent, netns=path, ifname="eth0", parent_link=known)
    assert parent not in asked
    assert info.admin_up and info.index == _ns_link_index(path, "eth0")


def test_configure_interface_without_describe_applies_and_returns_none(make_netns, make_parent_nic) -> None:
    from pyroute2.iproute.linux import IPRoute

    parent = make_parent_nic()
    path = make_netns()
    sublink.create_macvlan(parent=parent, netns=path, ifname="eth0")
    got = addr.configure_interface(
        path, "eth0", addresses=[("10.23.0.5/24", None)], routes=[("192.168.51.0/24", None)], describe=False
    )
    assert got is None
    with IPRoute(netns=path) as ipr:
        (idx,) = ipr.link_lookup(ifname="eth0")
        addrs = {
            f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}" for m in ipr.addr("dump", index=idx, family=2)
        }
        dsts = {f"{m.get_attr('RTA_DST')}/{m['dst_len']}" for m in ipr.route("dump", family=2, oif=idx)}
    assert addrs == {"10.23.0.5/24"}
    assert "192.168.51.0/24" in dsts


class _Counted:
    """A socket whose requests (link/addr/route/get_netnsid/tc calls) are counted by kind and action."""

    def __init__(self, ipr: Any, counts: Counter[str]) -> None:
        self._ipr, self._counts = ipr, counts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ipr, name)
        if name not in ("link", "addr", "route", "get_netnsid", "tc"):
            return attr

        def counted(*a: Any, **kw: Any) -> Any:
            self._counts[f"{name} {a[0]}" if a else name] += 1
            return attr(*a, **kw)

        return counted


# What one ADD (host-local, one address, one route) and one DEL cost today: the parent's
# lookup, the temporary link made in the pod netns, renamed and set up in one request,
# read back, then the address and the route. A change that adds a request shows here.
ADD_REQUESTS = {"socket": 3, "link get": 4, "link add": 1, "link set": 1, "addr add": 1, "route add": 1}
DEL_REQUESTS = {"socket": 1, "link del": 1}
# Shaping on top (the default): a socket in the pod netns, the interface's index and MTU,
# the egress tbf, the ifb device (made up, with its MTU; its index looked up) and its tbf,
# the ingress qdisc and its filter; DEL deletes the link and the ifb device as one batch:
# one link dump, both moved to a free netdev group, one deletion of the group, sent on a
# socket of its own (a helper thread waits there for the kernel's answer while DEL goes on
# at the kernel's announcement: cni_dra.netlink.dellink).
SHAPED_ADD_REQUESTS = {
    **ADD_REQUESTS,
    "socket": 4,
    "link get": 5,
    "link add": 2,
    "tc replace": 2,
    "tc add": 1,
    "tc add-filter": 1,
}
SHAPED_DEL_REQUESTS = {"socket": 2, "link dump": 1, "link set": 2, "link del": 1}


@pytest.mark.parametrize(
    ("shaping", "add", "delete"),
    [
        (False, ADD_REQUESTS, DEL_REQUESTS),
        (True, SHAPED_ADD_REQUESTS, SHAPED_DEL_REQUESTS),
    ],
    ids=["unshaped", "shaped"],
)
def test_add_and_del_send_no_more_netlink_requests_than_before(
    make_node, make_netns, monkeypatch, shaping, add, delete
) -> None:
    from cni_dra.cni import run

    real = _rtnl.Rtnl
    counts: Counter[str] = Counter()

    def counting_rtnl() -> Any:
        counts["socket"] += 1
        return _Counted(real(), counts)

    node, ns = make_node(nics=1), make_netns()
    conf = json.dumps(node.spec_conf(version="1.0.0", ipam="host-local-v4", shaping=shaping)).encode()
    env = {
        "CNI_CONTAINERID": unique_name(),
        "CNI_NETNS": ns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": CNI_PATH,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }
    sockets.drop_held()  # the main thread's kept socket is opened (and counted) by the ADD
    monkeypatch.setattr(_rtnl, "Rtnl", counting_rtnl)
    seen = {}
    try:
        for command in ("ADD", "DEL"):
            counts.clear()
            out = io.StringIO()
            assert run({**env, "CNI_COMMAND": command}, conf, out) == 0, out.getvalue()
            seen[command] = dict(counts)
    finally:
        sockets.drop_held()
    assert seen == {"ADD": add, "DEL": delete}
