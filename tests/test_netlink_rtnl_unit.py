"""The netlink layer's own rtnetlink transport (cni_dra.netlink._rtnl) against a scripted socket.

No kernel: the socket replays datagrams built here, so the reading loop's rules are checked
one by one (the acknowledgement ends a request, a negative one raises pyroute2's error with
the errno, a dump ends at NLMSG_DONE, replies of another sequence number are skipped, a
truncated datagram fails). netns_tests/test_netlink_rtnl.py runs the same socket against the
kernel.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest

from cni_dra.netlink import _pyroute2, _rtnl

_NLMSG_ERROR, _NLMSG_DONE, _RTM_NEWLINK = 2, 3, 16


def _nlmsg(kind: int, seq: int, payload: bytes, flags: int = 0) -> bytes:
    return struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, 0) + payload


def _ack(seq: int, code: int = 0) -> bytes:
    # struct nlmsgerr with NETLINK_CAP_ACK: the error, then the request's header only
    return _nlmsg(_NLMSG_ERROR, seq, struct.pack("=i", code) + struct.pack("=IHHII", 32, 18, 5, seq, 0))


def _link(seq: int, index: int, name: str, flags: int = 0) -> bytes:
    raw = name.encode() + b"\0"
    pad = b"\0" * (-len(raw) % 4)
    attr = struct.pack("=HH", 4 + len(raw), 3) + raw + pad  # IFLA_IFNAME
    return _nlmsg(_RTM_NEWLINK, seq, struct.pack("=BxHiII", 0, 1, index, 0, 0) + attr, flags)


class _Scripted:
    """A socket whose replies are a script: each entry is ``(datagram, msg_flags)`` or a
    function of the sequence number of the last request sent."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.sent = list(script), []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)

    def recvmsg(self, size: int) -> tuple[bytes, list[Any], int, Any]:
        entry = self.script.pop(0)
        seq = struct.unpack_from("=I", self.sent[-1], 8)[0]
        data, flags = entry(seq) if callable(entry) else entry
        return data, [], flags, None

    def close(self) -> None:
        pass


def _rtnl_with(script: list[Any]) -> tuple[_rtnl.Rtnl, _Scripted]:
    sock = _rtnl.Rtnl.__new__(_rtnl.Rtnl)
    fake = _Scripted(script)
    sock._sock, sock._seq = fake, 0  # type: ignore[assignment]
    return sock, fake


def test_a_get_returns_the_reply_then_stops_at_the_ack() -> None:
    sock, fake = _rtnl_with([lambda seq: (_link(seq, 7, "eth9") + _ack(seq), 0)])
    (msg,) = sock.link("get", ifname="eth9")
    assert (msg["index"], msg.get_attr("IFLA_IFNAME")) == (7, "eth9")
    assert fake.script == []


def test_a_negative_ack_raises_pyroute2s_error_with_the_errno() -> None:
    sock, _ = _rtnl_with([lambda seq: (_ack(seq, -errno.ENODEV), 0)])
    with pytest.raises(_pyroute2.load().NetlinkError) as got:
        sock.link("get", ifname="nosuch0")
    assert got.value.code == errno.ENODEV


def test_a_dump_reads_every_datagram_until_done_and_filters_on_the_client() -> None:
    multi = 0x2
    sock, fake = _rtnl_with(
        [
            lambda seq: (_link(seq, 1, "lo", multi) + _link(seq, 2, "eth0", multi), 0),
            lambda seq: (
                _link(seq, 3, "eth1", multi) + _nlmsg(_NLMSG_DONE, seq, struct.pack("=i", 0), multi),
                0,
            ),
        ]
    )
    assert [m.get_attr("IFLA_IFNAME") for m in sock.link("dump")] == ["lo", "eth0", "eth1"]
    assert fake.script == []
    sock, _ = _rtnl_with(
        [
            lambda seq: (
                _link(seq, 1, "lo", multi)
                + _link(seq, 2, "eth0", multi)
                + _nlmsg(_NLMSG_DONE, seq, b"\0" * 4),
                0,
            )
        ]
    )
    assert [m["index"] for m in sock.link("dump", index=2)] == [2]


def test_replies_to_another_sequence_number_are_skipped() -> None:
    sock, _ = _rtnl_with(
        [
            lambda seq: (_link(seq + 100, 9, "stale0") + _ack(seq + 100, -errno.EEXIST), 0),
            lambda seq: (_link(seq, 7, "eth9") + _ack(seq), 0),
        ]
    )
    assert [m.get_attr("IFLA_IFNAME") for m in sock.link("get", ifname="eth9")] == ["eth9"]


def test_a_truncated_datagram_fails_rather_than_decoding_half_a_message() -> None:
    sock, _ = _rtnl_with([lambda seq: (_link(seq, 7, "eth9")[:20], socket.MSG_TRUNC)])
    with pytest.raises(OSError) as got:
        sock.link("get", ifname="eth9")
    assert got.value.errno == errno.EMSGSIZE


def test_each_request_gets_the_next_sequence_number_and_a_closed_socket_refuses() -> None:
    sock, fake = _rtnl_with([lambda seq: (_ack(seq), 0), lambda seq: (_ack(seq), 0)])
    sock.link("set", index=7, state="up")
    sock.link("del", index=7)
    assert [struct.unpack_from("=I", d, 8)[0] for d in fake.sent] == [1, 2]
    sock.close()
    assert sock.closed
    with pytest.raises(OSError):
        sock.link("del", index=7)


def _attr(kind: int, value: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(value), kind) + value + b"\0" * (-len(value) % 4)


def test_a_link_reply_decodes_the_attributes_cni_dra_reads_and_drops_the_rest() -> None:
    def reply(seq: int) -> tuple[bytes, int]:
        attrs = (
            _attr(3, b"eth9\0")  # IFLA_IFNAME
            + _attr(13, struct.pack("=I", 1000))  # IFLA_TXQLEN: not read
            + _attr(4, struct.pack("=I", 1400))  # IFLA_MTU
            + _attr(23, b"\0" * 200)  # IFLA_STATS64: not read
            + _attr(27, struct.pack("=I", 0x7CD4))  # IFLA_GROUP
            + _attr(5, struct.pack("=i", 3))  # IFLA_LINK
            + _attr(37, struct.pack("=i", 0))  # IFLA_LINK_NETNSID
            + _attr(18, _attr(1, b"macvlan\0"))  # IFLA_LINKINFO / IFLA_INFO_KIND
        )
        body = struct.pack("=BxHiII", 0, 1, 7, 1, 0) + attrs
        return _nlmsg(_RTM_NEWLINK, seq, body) + _ack(seq), 0

    sock, _ = _rtnl_with([reply])
    (msg,) = sock.link("get", ifname="eth9")
    assert (msg["index"], msg["flags"], msg["state"]) == (7, 1, "up")
    assert [name for name, _ in msg["attrs"]] == [
        "IFLA_IFNAME",
        "IFLA_MTU",
        "IFLA_GROUP",
        "IFLA_LINK",
        "IFLA_LINK_NETNSID",
        "IFLA_LINKINFO",
    ]
    mtu, group, parent = (msg.get_attr(name) for name in ("IFLA_MTU", "IFLA_GROUP", "IFLA_LINK"))
    assert (mtu, group, parent) == (1400, 0x7CD4, 3)
    assert msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") == "macvlan"
    assert msg.get_attr("IFLA_TXQLEN") is None and msg.get_attr("IFLA_STATS64") is None


def _empty_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's request caches, empty for this test (restored after it)."""
    monkeypatch.setattr(_rtnl, "_ENCODED", {})
    monkeypatch.setattr(_rtnl, "_NAMED", {})


def _encodes(monkeypatch: pytest.MonkeyPatch, pick: Callable[[tuple[Any, ...]], Any]) -> list[Any]:
    """Empty request caches, and the list of ``pick(args)`` of every request pyroute2 encodes
    (``Rtnl._encode``'s arguments: class, commands, command, filters, arguments)."""
    _empty_caches(monkeypatch)
    encoded: list[Any] = []
    real = _rtnl.Rtnl._encode

    def counting(*args: Any) -> Any:
        encoded.append(pick(args))
        return real(*args)

    monkeypatch.setattr(_rtnl.Rtnl, "_encode", staticmethod(counting))
    return encoded


def test_a_request_is_encoded_once_and_resent_under_its_own_sequence_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoded = _encodes(monkeypatch, lambda args: args[2])
    sock, fake = _rtnl_with([lambda seq: (_ack(seq), 0)] * 4)
    sock.link("set", index=7, ifname="eth9", state="up")
    sock.link("set", index=7, ifname="eth9", state="up")
    sock.link("set", index=8, ifname="eth9", state="up")
    assert encoded == ["set", "set"]  # the second one is the cached request
    first, again, other = fake.sent
    assert [struct.unpack_from("=I", d, 8)[0] for d in fake.sent] == [1, 2, 3]
    assert first[:8] + first[12:] == again[:8] + again[12:]
    assert first != other
    # an argument that is not plain data (its repr may not say all of it) is never cached
    sock.link("set", index=7, ifname=_Name("eth9"), state="up")
    assert encoded == ["set", "set", "set"]
    assert fake.sent[-1][12:] == first[12:]


class _Name(str):
    """A str subclass: not plain data for the request cache."""


def _sent_by(request: Any) -> bytes:
    sock, fake = _rtnl_with([lambda seq: (_ack(seq), 0)])
    request(sock)
    return bytes(fake.sent[0])


def test_a_link_request_naming_a_link_is_encoded_once_per_name_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct = {
        name: _sent_by(lambda sock, name=name: sock._call(*_link_call("add", name)))
        for name in ("tmp0a1b2c", "tmp9z8y7x", "eth0")
    }
    encoded = _encodes(monkeypatch, lambda args: args[4]["ifname"])
    for name in ("tmp0a1b2c", "tmp9z8y7x", "eth0"):
        assert (
            _sent_by(lambda sock, name=name: sock.link("add", **_link_call("add", name)[4])) == direct[name]
        )
    assert encoded == ["_________", "____"]  # one per name length, the name patched in


def _link_call(command: str, name: str) -> tuple[Any, ...]:
    base = _rtnl._base()
    kwarg = {"ifname": name, "kind": "macvlan", "link": 3, "macvlan_mode": "bridge", "net_ns_fd": 7}
    return base.ifinfmsg, _rtnl._LINK_COMMANDS, command, base.filters["link"], kwarg


def test_names_pyroute2_reads_from_iproute2s_files_are_resolved_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _encodes(monkeypatch, lambda args: args[2])
    sock, _ = _rtnl_with([lambda seq: (_ack(seq), 0)] * 4)
    for _ in range(2):
        sock.link("set", index=7, group="default")  # /etc/iproute2/group
        sock.link("set", index=7, group=0)
    assert calls == ["set", "set", "set"]


class _EmptiedBetweenLookups(dict):  # type: ignore[type-arg]
    """A request cache another thread empties right after a membership test finds a key."""

    def __contains__(self, key: object) -> bool:
        found = super().__contains__(key)
        self.clear()
        return found


def test_a_named_request_survives_the_cache_being_emptied_by_another_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's worker threads share the cache, and one of them empties it when it is
    full: a request must not depend on an entry still being there after it was seen."""
    _empty_caches(monkeypatch)
    expected = _sent_by(lambda sock: sock.link("add", **_link_call("add", "tmp0a1b2c")[4]))
    raced = _EmptiedBetweenLookups(_rtnl._NAMED)
    monkeypatch.setattr(_rtnl, "_NAMED", raced)
    sent = _sent_by(lambda sock: sock.link("add", **_link_call("add", "tmp9z8y7x")[4]))
    assert sent[:8] + sent[12:] == (expected[:8] + expected[12:]).replace(b"tmp0a1b2c", b"tmp9z8y7x")


@pytest.mark.parametrize(
    "extra",
    [
        {"ifname": "a" * 15},  # IFNAMSIZ - 1: the attribute fills its 4-byte padding exactly
        {"ifname": "b"},
        {"ifname": "é0"},  # non-ASCII: patched as the UTF-8 bytes pyroute2 encodes
        {"ifname": "___"},  # the placeholder's own text
        {"ifname": "mac0", "ifalias": "mac0"},  # the name again in another string attribute
        {"ifname": "mac0", "altname": "mac0"},  # ... and as IFLA_ALT_IFNAME
        {"ifname": "veth0", "kind": "veth", "peer": "veth0"},  # ... and nested (the peer's IFLA_IFNAME)
    ],
)
def test_a_patched_named_request_is_byte_for_byte_pyroute2s(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    """Whatever else the request carries, the name goes in the one top-level IFLA_IFNAME
    attribute and nowhere else: the bytes sent equal pyroute2's own encoding of the same
    arguments, the second time (the name patched into the kept request) too."""
    _empty_caches(monkeypatch)
    base = _rtnl._base()
    for command in ("add", "set", "get", "del"):
        kwarg = {"index": 0 if command == "add" else 9, **extra}
        other = dict(kwarg, ifname="x" * len(kwarg["ifname"].encode()))
        for args in (other, kwarg):  # the first one fills the cache, the second is patched
            direct, _ = _rtnl.Rtnl._encode(
                base.ifinfmsg, _rtnl._LINK_COMMANDS, command, base.filters["link"], dict(args)
            )
            sent = _sent_by(lambda sock, args=args, command=command: sock.link(command, **args))
            assert sent[:8] + sent[12:] == direct[:8] + direct[12:], (command, args)
