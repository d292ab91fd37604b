"""Root tests: the host rtnetlink socket kept per thread, and the request-saving options.

Expected values come from the kernel through pyroute2 used directly, never from cni_dra.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from cni_dra.netlink import _pyroute2, addr, netns, sockets, sublink
from cni_dra.netlink import info as linkinfo
from netns_tests.conftest import unique_name


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every IPRoute cni_dra opens (the real ones), in order; the kept socket starts and ends empty."""
    real = _pyroute2.load()
    made: list[Any] = []

    def counting_iproute(*a: Any, **kw: Any) -> Any:
        ipr = real.IPRoute(*a, **kw)
        made.append(ipr)
        return ipr

    sockets.drop_held()
    fake = SimpleNamespace(IPRoute=counting_iproute, NetlinkError=real.NetlinkError)
    monkeypatch.setattr(_pyroute2, "load", lambda: fake)
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
    assert all(ipr.asyncore.status.get("closed") for ipr in opened)  # each closed after its call


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
    assert opened[0].asyncore.status.get("closed")


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
    assert kept.ipr.asyncore.status.get("closed")
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


def test_create_with_parent_link_does_not_look_the_parent_up(make_netns, make_parent_nic, monkeypatch) -> None:
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
        addrs = {f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}" for m in ipr.addr("dump", index=idx, family=2)}
        dsts = {f"{m.get_attr('RTA_DST')}/{m['dst_len']}" for m in ipr.route("dump", family=2, oif=idx)}
    assert addrs == {"10.23.0.5/24"}
    assert "192.168.51.0/24" in dsts

