"""Root tests: the netlink layer's own rtnetlink socket (cni_dra.netlink._rtnl) in a fresh netns.

The requests are pyroute2's messages; what is checked here is the transport around them and
the request defaults it must reproduce from pyroute2's ``IPRoute``. Expected values come
from the kernel through pyroute2's ``IPRoute`` used directly, never from cni_dra.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from cni_dra.netlink import _pyroute2, _rtnl
from cni_dra.netlink.netns import in_netns
from netns_tests.conftest import unique_name


def _iproute(path: str):  # type: ignore[no-untyped-def]
    from pyroute2 import IPRoute

    return IPRoute(netns=path)


@contextmanager
def _socket_in(path: str) -> Iterator[_rtnl.Rtnl]:
    """The layer's own socket, opened in the namespace at ``path`` and closed there."""
    with in_netns(path):
        sock = _rtnl.Rtnl()
        try:
            yield sock
        finally:
            sock.close()


def test_a_refused_request_raises_pyroute2s_error_with_the_errno(make_netns) -> None:
    path = make_netns()
    with in_netns(path):
        sock = _rtnl.Rtnl()
        try:
            with pytest.raises(_pyroute2.load().NetlinkError) as got:
                sock.link("get", ifname="nosuch0")
            assert got.value.code == errno.ENODEV
            with pytest.raises(_pyroute2.load().NetlinkError) as got:
                sock.link("add", ifname="lo", kind="ifb")
            assert got.value.code == errno.EEXIST
            assert sock.link_lookup(ifname="nosuch0") == []
            # the socket stays usable after a refusal
            assert sock.link_lookup(ifname="lo") == [1]
        finally:
            sock.close()
        assert sock.closed


def test_a_reply_to_an_earlier_request_is_skipped(make_netns) -> None:
    """A reply left unread on a kept socket (another sequence number) is not taken for this one's."""
    path = make_netns()
    name = unique_name()
    with _socket_in(path) as sock:
        sock.link("add", ifname=name, kind="ifb")
        # an RTM_GETLINK dump (lo and the ifb) of another sequence number, sent behind the
        # socket's back and never read
        body = struct.pack("=BxHiII", 0, 0, 0, 0, 0)
        raw = sock._sock
        assert raw is not None
        raw.send(struct.pack("=IHHII", 16 + len(body), 18, 0x301, 0x7FFFFFF0, 0) + body)
        (msg,) = sock.link("get", ifname="lo")
        assert msg.get_attr("IFLA_IFNAME") == "lo"
        assert [m.get_attr("IFLA_IFNAME") for m in sock.link("get", ifname=name)] == [name]


def test_route_add_has_iproutes_defaults_and_dumps_filter_on_the_client(make_netns) -> None:
    path = make_netns()
    name = unique_name()
    with _socket_in(path) as sock:
        sock.link("add", ifname=name, kind="ifb")
        (index,) = sock.link_lookup(ifname=name)
        sock.link("set", index=index, state="up")
        sock.addr("add", index=index, address="10.31.0.2", prefixlen=24)
        sock.route("add", dst="10.32.0.0/16", gateway="10.31.0.1", oif=index, family=2)
        got = sock.addr("dump", index=index, family=2)
        assert [(m.get_attr("IFA_ADDRESS"), m["index"]) for m in got] == [("10.31.0.2", index)]
        assert [m.get_attr("IFLA_IFNAME") for m in sock.get_links(index)] == [name]
    with _iproute(path) as ipr:
        routes = [m for m in ipr.route("dump", family=2) if m.get_attr("RTA_DST") == "10.32.0.0"]
        addrs = {m.get_attr("IFA_ADDRESS") for m in ipr.addr("dump", family=2)}
    assert len(routes) == 1
    assert (routes[0]["proto"], routes[0]["type"], routes[0]["dst_len"]) == (4, 1, 16)  # static, unicast
    assert routes[0].get_attr("RTA_GATEWAY") == "10.31.0.1"
    assert "10.31.0.2" in addrs


def test_tc_requests_and_their_dumps(make_netns) -> None:
    path = make_netns()
    name = unique_name()
    with _socket_in(path) as sock:
        sock.link("add", ifname=name, kind="ifb", state="up")
        (index,) = sock.link_lookup(ifname=name)
        sock.tc("replace", "tbf", index, 0x10000, parent=0xFFFFFFFF, rate=125000, burst=20000, latency=25000)
        mine = [(q.get_attr("TCA_KIND"), q["handle"]) for q in sock.get_qdiscs(index=index)]
        assert ("tbf", 0x10000) in mine
        assert sock.get_filters(index=index, parent=0xFFFF0000) == []
    with _iproute(path) as ipr:
        (idx,) = ipr.link_lookup(ifname=name)
        kinds = {(q.get_attr("TCA_KIND"), q["handle"]) for q in ipr.get_qdiscs(index=idx)}
    assert ("tbf", 0x10000) in kinds


def test_the_netns_id_of_an_unnamed_namespace(make_netns) -> None:
    """RTM_GETNSID answers once, without an acknowledgement: the call returns that answer."""
    path = make_netns()
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)  # the host, as the pod namespace sees it
    try:
        with _socket_in(path) as sock:
            reply = sock.get_netnsid(fd=fd)
    finally:
        os.close(fd)
    assert reply is not None and set(reply) == {"nsid", "current_nsid"}
    assert isinstance(reply["nsid"], int)
