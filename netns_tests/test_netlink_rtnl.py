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


def test_a_kept_request_naming_a_namespace_by_descriptor_acts_on_what_the_descriptor_names_when_sent(
    make_netns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept request carries the descriptor's number, which the kernel resolves when it gets
    the request: the same number naming another namespace by then sends the link there. The
    kernel's refusals of a kept request are raised as for a fresh one."""
    home, first, second = make_netns(), make_netns(), make_netns()
    monkeypatch.setattr(_rtnl, "_ENCODED", {})
    monkeypatch.setattr(_rtnl, "_NAMED", {})
    encoded: list[str] = []
    real = _rtnl.Rtnl._encode

    def counting(*args):  # type: ignore[no-untyped-def]
        encoded.append(args[2])
        return real(*args)

    monkeypatch.setattr(_rtnl.Rtnl, "_encode", staticmethod(counting))
    one, two, missing = unique_name(), unique_name(), unique_name()
    error = _pyroute2.load().NetlinkError
    fd = os.open(first, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with _socket_in(home) as sock:
            sock.link("add", ifname=one, kind="ifb", net_ns_fd=fd)
            other = os.open(second, os.O_RDONLY | os.O_CLOEXEC)
            os.dup2(other, fd, inheritable=False)  # the same number now names the second namespace
            os.close(other)
            sock.link("add", ifname=two, kind="ifb", net_ns_fd=fd)
            with pytest.raises(error) as got:
                sock.link("add", ifname=two, kind="ifb", net_ns_fd=fd)
            assert got.value.code == errno.EEXIST
            for _ in range(2):
                with pytest.raises(error) as got:
                    sock.link("del", ifname=missing)
                assert got.value.code == errno.ENODEV
            assert sock.link_lookup(ifname=one) == sock.link_lookup(ifname=two) == []
    finally:
        os.close(fd)
    assert encoded == ["add", "del", "get"]  # the second add, del and get: kept requests
    for path, want in ((first, one), (second, two)):
        with _iproute(path) as ipr:
            assert [n for n in (one, two) if ipr.link_lookup(ifname=n)] == [want]


def test_a_link_read_lean_decodes_to_what_pyroute2s_full_message_does(make_netns) -> None:
    """Every link kind cni-dra makes or reads, through the layer's socket (replies decoded
    with the read set of attributes only) and through pyroute2's IPRoute (every attribute):
    the same LinkInfo and netdev group, from a dump and from a get."""
    from cni_dra.netlink import sublink
    from cni_dra.netlink.info import decode_link

    def _read(msg):  # type: ignore[no-untyped-def]
        return decode_link(msg), msg.get_attr("IFLA_GROUP")  # the group: the ifb mark (shaping)

    path, remote = make_netns(), make_netns()
    parent, peer, parent2, peer2, mac, ipv, ifb = (unique_name() for _ in range(7))
    with _socket_in(path) as sock:
        fd = os.open(remote, os.O_RDONLY | os.O_CLOEXEC)
        try:  # its peer elsewhere: the veth carries IFLA_LINK_NETNSID
            sock.link("add", ifname=parent, kind="veth", peer={"ifname": peer, "net_ns_fd": fd})
        finally:
            os.close(fd)
        sock.link("add", ifname=parent2, kind="veth", peer=peer2)
        (pidx,) = sock.link_lookup(ifname=parent)
        (pidx2,) = sock.link_lookup(ifname=parent2)
        sock.link("set", index=pidx, state="up")
        sock.link("add", ifname=mac, kind="macvlan", link=pidx, macvlan_mode="bridge", state="up")
        if sublink.link_kind_supported("ipvlan"):
            sock.link("add", ifname=ipv, kind="ipvlan", link=pidx2, ipvlan_mode=1)  # not beside a macvlan
        sock.link("add", ifname=ifb, kind="ifb", group=0x7CD31FB0, mtu=9000)
        lean = {m["index"]: _read(m) for m in sock.link("dump")}
        got = {i: _read(sock.link("get", index=i)[0]) for i in lean}
    with _iproute(path) as ipr:
        _pyroute2.load()  # the ipvlan and macvlan attribute sets cni-dra adds
        full = {m["index"]: _read(m) for m in ipr.link("dump")}
    assert len(full) >= 6 and {li.kind for li, _ in full.values()} >= {"macvlan", "ifb", "veth"}
    assert any(li.parent_netnsid is not None for li, _ in full.values())
    assert 0x7CD31FB0 in {group for _, group in full.values()}
    assert lean == full
    assert got == full
