"""A synchronous rtnetlink socket speaking pyroute2's messages.

:class:`Rtnl` is what :mod:`cni_dra.netlink.sockets` hands out: a blocking ``AF_NETLINK``
socket of the calling thread's namespace, one request at a time, with the subset of
pyroute2's ``IPRoute`` calls cni-dra makes (``link``, ``addr``, ``route``, ``tc``,
``get_links``, ``link_lookup``, ``get_qdiscs``, ``get_filters``, ``get_netnsid``) taking the
same arguments and returning the same pyroute2 messages. The messages stay pyroute2's:
the request is built by pyroute2's request filters (``pyroute2.requests``) into its message
classes (``ifinfmsg``, ``ifaddrmsg``, ``rtmsg``, ``tcmsg``, ``nsidmsg``), which encode it and
decode the replies. What is ours is the transport: ``send``, then ``recv`` until the
kernel's acknowledgement or the end of the dump, on the calling thread; each distinct request
is built and encoded once per process and its bytes resent (:data:`_ENCODED`; a link request
naming a link, once per name length, :data:`_NAMED`), and a link reply is decoded with only
the attributes cni-dra reads (:data:`cni_dra.netlink._nlmsg.LINK_ATTRS`, the bytes' own
module). pyroute2 0.9's
``IPRoute`` runs each request through an asyncio event loop, and importing it imports that
loop and every tc and link-kind module: measured, ≈ 2.5× the per-request cost of this
socket and ≈ 30 ms more imports per process.

The traffic-control modules (``tcmsg`` and its plugins, ``pyroute2.requests.tc``) are
imported on the first ``tc`` call only: a verb that does not shape never loads them.

Errors are pyroute2's: a negative acknowledgement raises ``pyroute2.netlink.exceptions
.NetlinkError`` with the errno as ``code``, socket errors raise ``OSError`` (``EMSGSIZE``
for a reply datagram above 64 KiB, which cni-dra's requests do not ask for); callers
translate both (:func:`cni_dra.netlink._pyroute2.translated`).
"""

from __future__ import annotations

import errno
import functools
import socket
import struct
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from cni_dra.netlink import _pyroute2
from cni_dra.netlink._nlmsg import U32, cacheable, lean_link, name_offset

__all__ = ["Rtnl", "load_tc"]

_NETLINK_ROUTE = 0
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_NLM_F_REQUEST = 0x1
_NLM_F_MULTI = 0x2
_NLM_F_ACK = 0x4
_NLM_F_ROOT = 0x100
_NLM_F_MATCH = 0x200
_NLM_F_ATOMIC = 0x400
_NLM_F_DUMP = _NLM_F_ROOT | _NLM_F_MATCH
_NLM_F_REPLACE = 0x100
_NLM_F_EXCL = 0x200
_NLM_F_CREATE = 0x400
_NLM_F_APPEND = 0x800
_SOL_NETLINK = 270
_NETLINK_CAP_ACK = 10  # the kernel's error acknowledgement does not echo the request

# pyroute2's NetlinkRequest.flags: one per request mode.
_FLAGS = {
    "dump": _NLM_F_REQUEST | _NLM_F_DUMP,
    "get": _NLM_F_REQUEST | _NLM_F_ACK,
    "req": _NLM_F_REQUEST | _NLM_F_ACK,
    "create": _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL,
    "append": _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_APPEND,
    "change": _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_REPLACE,
    "replace": _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_REPLACE | _NLM_F_CREATE,
}

# <linux/rtnetlink.h> message types
_RTM_NEWLINK, _RTM_DELLINK, _RTM_GETLINK = 16, 17, 18
_RTM_NEWADDR, _RTM_DELADDR, _RTM_GETADDR = 20, 21, 22
_RTM_NEWROUTE, _RTM_DELROUTE, _RTM_GETROUTE = 24, 25, 26
_RTM_NEWQDISC, _RTM_DELQDISC, _RTM_GETQDISC = 36, 37, 38
_RTM_NEWTFILTER, _RTM_DELTFILTER, _RTM_GETTFILTER = 44, 45, 46
_RTM_NEWNSID, _RTM_GETNSID = 88, 90

_LINK_COMMANDS = {
    "set": (_RTM_NEWLINK, "req"),
    "add": (_RTM_NEWLINK, "create"),
    "del": (_RTM_DELLINK, "req"),
    "dump": (_RTM_GETLINK, "dump"),
    "get": (_RTM_GETLINK, "get"),
}
_ADDR_COMMANDS = {
    "add": (_RTM_NEWADDR, "create"),
    "del": (_RTM_DELADDR, "req"),
    "replace": (_RTM_NEWADDR, "replace"),
    "dump": (_RTM_GETADDR, "dump"),
}
_ROUTE_COMMANDS = {
    "add": (_RTM_NEWROUTE, "create"),
    "replace": (_RTM_NEWROUTE, "replace"),
    "del": (_RTM_DELROUTE, "req"),
    "get": (_RTM_GETROUTE, "get"),
    "dump": (_RTM_GETROUTE, "dump"),
}
_TC_COMMANDS = {
    "dump": (_RTM_GETQDISC, "dump"),
    "add": (_RTM_NEWQDISC, "create"),
    "del": (_RTM_DELQDISC, "req"),
    "replace": (_RTM_NEWQDISC, "replace"),
    "add-filter": (_RTM_NEWTFILTER, "create"),
    "del-filter": (_RTM_DELTFILTER, "req"),
    "replace-filter": (_RTM_NEWTFILTER, "replace"),
}

# what pyroute2's route filter asks of the socket: no NETLINK_GET_STRICT_CHK (the table
# then goes in rtm_table and RTA_TABLE, as IPRoute sends it by default)
_PARAMETERS = {"strict_check": False}
# reply type -> pyroute2 message class, filled as the message modules are imported
_DECODERS: dict[int, Any] = {}
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_RECV_BYTES = 65536  # a dump datagram is at most 32 KiB; below malloc's mmap threshold
# Encoded requests (sequence number 0) by class, command and arguments: the same arguments
# always encode to the same bytes, and most of a verb's requests repeat from pod to pod (the
# pod-side shaping, link and deletion requests name the same interfaces and indexes), so
# pyroute2's request filters and encoder run once per distinct request. Bounded: emptied
# when full.
_ENCODED: dict[tuple[Any, ...], tuple[bytes, Any]] = {}
_ENCODED_MAX = 512
# Link requests that name a link (IFLA_IFNAME) differ from pod to pod only in the name (a
# temporary name, say): kept as one request per name length with the name patched in, by
# command, name length and the other arguments; None when the encoded request did not carry
# the name as one plain IFLA_IFNAME attribute.
_NAMED: dict[tuple[Any, ...], tuple[bytes, int] | None] = {}
_NAMED_COMMANDS = frozenset({"get", "add", "set", "del"})
_UNKNOWN: Any = object()  # not in _NAMED (None there: a request that cannot be patched)


@functools.cache
def _base() -> SimpleNamespace:
    """pyroute2's link, address, route and netns-id messages and their request filters."""
    _pyroute2.load()  # first: defers the package __init__, registers the attribute tables
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
    from pyroute2.netlink.rtnl.nsidmsg import nsidmsg
    from pyroute2.netlink.rtnl.rtmsg import rtmsg
    from pyroute2.requests.address import AddressFieldFilter, AddressIPRouteFilter
    from pyroute2.requests.link import LinkFieldFilter, LinkIPRouteFilter
    from pyroute2.requests.main import RequestProcessor
    from pyroute2.requests.route import RouteFieldFilter, RouteIPRouteFilter

    def link_reply(data: bytes) -> Any:
        return ifinfmsg(lean_link(data))

    _DECODERS.update(
        {
            _RTM_NEWLINK: link_reply,
            _RTM_DELLINK: link_reply,
            _RTM_NEWADDR: ifaddrmsg,
            _RTM_NEWROUTE: rtmsg,
            _RTM_NEWNSID: nsidmsg,
        }
    )
    return SimpleNamespace(
        ifinfmsg=ifinfmsg,
        ifaddrmsg=ifaddrmsg,
        rtmsg=rtmsg,
        nsidmsg=nsidmsg,
        RequestProcessor=RequestProcessor,
        filters={
            "link": lambda command: [LinkFieldFilter(), LinkIPRouteFilter(command)],
            "addr": lambda command: [AddressFieldFilter(), AddressIPRouteFilter(command)],
            "route": lambda command: [
                RouteFieldFilter(add_defaults=command != "dump"),
                RouteIPRouteFilter(command),
            ],
        },
    )


@functools.cache
def _tc() -> SimpleNamespace:
    """pyroute2's tc message (every qdisc and filter kind it decodes) and its request filters."""
    _base()
    from pyroute2.netlink.rtnl.tcmsg import tcmsg
    from pyroute2.requests.tc import TcIPRouteFilter, TcRequestFilter

    _DECODERS.update({_RTM_NEWQDISC: tcmsg, _RTM_NEWTFILTER: tcmsg})
    return SimpleNamespace(tcmsg=tcmsg, filters=lambda command: [TcRequestFilter(), TcIPRouteFilter(command)])


def load_tc() -> None:
    """Import tc's message and request filters now rather than on the first tc request."""
    _tc()


def _matches(dump_filter: Any, msg: Any) -> bool:
    """pyroute2's NetlinkRequest.match_one_message: every key equal (or its predicate true)."""
    for key in dump_filter:
        if not isinstance(key, (str, tuple)):
            continue
        want = dump_filter[key]
        value = msg.get(key)
        if value is not None and callable(want):
            if not want(value):
                return False
        elif want != value:
            return False
    return True


class Rtnl:
    """A blocking rtnetlink socket of the namespace the calling thread is in when it is made.

    Used by one thread at a time. Raises OSError when the socket cannot be opened.
    """

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_ROUTE)
        try:
            sock.setsockopt(_SOL_NETLINK, _NETLINK_CAP_ACK, 1)
            sock.bind((0, 0))
        except BaseException:
            sock.close()
            raise
        self._sock: socket.socket | None = sock
        self._seq = 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._sock is None

    def close(self) -> None:
        """Close the socket (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    # ------------------------------------------------------------------ transport

    def request(self, msg: Any, msg_type: int, flags: int) -> list[Any]:
        """Send ``msg`` (a pyroute2 message, fields and attributes set) and return the replies.

        Reads until the acknowledgement (requests with ``NLM_F_ACK``) or the end of the dump;
        raises pyroute2's NetlinkError for a negative acknowledgement.
        """
        header = msg["header"]
        header["type"] = msg_type
        header["flags"] = flags
        header["sequence_number"] = 0
        header["pid"] = 0
        msg.encode()
        return self._exchange(msg.data, flags)

    def _exchange(self, encoded: bytes | bytearray, flags: int) -> list[Any]:
        """Send ``encoded`` (a whole request, ``flags`` in its header) under the next sequence
        number and return the decoded replies (:meth:`request`)."""
        sock = self._sock
        if sock is None:
            raise OSError(9, "rtnetlink socket is closed")
        self._seq = seq = self._seq % 0xFFFFFFF + 1
        request = bytearray(encoded)
        U32.pack_into(request, 8, seq)
        sock.send(request)
        decoders = _DECODERS
        replies: list[Any] = []
        unpack = _HEADER.unpack_from
        while True:
            data, _anc, recv_flags, _addr = sock.recvmsg(_RECV_BYTES)
            if recv_flags & socket.MSG_TRUNC:
                raise OSError(errno.EMSGSIZE, f"rtnetlink reply larger than {_RECV_BYTES} bytes")
            offset, end = 0, len(data)
            while offset + 16 <= end:
                length, kind, _mflags, mseq, _pid = unpack(data, offset)
                if length < 16:
                    break
                if mseq == seq:
                    if kind == _NLMSG_ERROR or kind == _NLMSG_DONE:
                        code = struct.unpack_from("=i", data, offset + 16)[0] if length >= 20 else 0
                        if code < 0:
                            raise _pyroute2.load().NetlinkError(-code)
                        return replies
                    cls = decoders.get(kind)
                    if cls is not None:
                        reply = cls(data[offset : offset + length])
                        reply.decode()
                        replies.append(reply)
                    if not flags & _NLM_F_DUMP and not flags & _NLM_F_ACK and not _mflags & _NLM_F_MULTI:
                        return replies
                offset += (length + 3) & ~3

    def _call(
        self,
        msg_cls: Any,
        commands: dict[str, tuple[int, str]],
        command: str,
        filters: Callable[[str], Iterable[Any]],
        kwarg: dict[str, Any],
    ) -> list[Any]:
        """pyroute2's RTNL_API request path: the kwargs through its filters into a ``msg_cls``
        message, encoded once per distinct request (:data:`_ENCODED`)."""
        key = (msg_cls, command, repr(kwarg)) if cacheable(kwarg) else None
        cached = _ENCODED.get(key) if key is not None else None
        if cached is None:
            cached = self._encode(msg_cls, commands, command, filters, kwarg)
            if key is not None:
                if len(_ENCODED) >= _ENCODED_MAX:
                    _ENCODED.clear()
                _ENCODED[key] = cached
        encoded, dump_filter = cached
        replies = self._exchange(encoded, _HEADER.unpack_from(encoded)[2])
        if dump_filter is not None:
            replies = [r for r in replies if _matches(dump_filter, r)]
        return replies

    @staticmethod
    def _encode(
        msg_cls: Any,
        commands: dict[str, tuple[int, str]],
        command: str,
        filters: Callable[[str], Iterable[Any]],
        kwarg: dict[str, Any],
    ) -> tuple[bytes, Any]:
        """The request (sequence number 0) and, for a dump with arguments beyond the kernel's,
        pyroute2's filter of the replies (None otherwise)."""
        processor_cls = _base().RequestProcessor
        msg_type, mode_flags = commands[command]
        dump_filter = None
        if mode_flags == "dump":
            query: dict[str, Any] = {}
            for key in ("family", "ext_mask", "dump_flags"):
                if key in kwarg:
                    query[key] = kwarg.pop(key)
            if kwarg:
                dump_filter = processor_cls(context=kwarg, prime=kwarg, parameters=_PARAMETERS)
                for rf in filters(command):
                    dump_filter.add_filter(rf)
                dump_filter.finalize()
            kwarg = query
        arguments = processor_cls(context=kwarg, prime=kwarg, parameters=_PARAMETERS)
        for rf in filters(command):
            arguments.add_filter(rf)
        arguments.finalize()
        msg = msg_cls()
        for field in msg.fields:
            msg[field[0]] = arguments.get_value(field[0], default=0, mode="field")
        for key, value in arguments.items():
            nla = msg_cls.name2nla(key)
            if msg.valid_nla(nla) and value is not None:
                msg["attrs"].append([nla, value])
        if "attrs" in arguments:
            msg["attrs"].extend(arguments["attrs"])
        header = msg["header"]
        header["type"] = msg_type
        header["flags"] = _FLAGS[mode_flags]
        header["sequence_number"] = 0
        header["pid"] = 0
        msg.encode()
        return bytes(msg.data), dump_filter

    # ------------------------------------------------------------------ IPRoute's calls

    def link(self, command: str, **kwarg: Any) -> list[Any]:
        """As ``IPRoute.link`` for set, add, del, get and dump."""
        base = _base()
        name = kwarg.get("ifname")
        if type(name) is str and name and command in _NAMED_COMMANDS and cacheable(kwarg):
            raw = name.encode()
            key = (command, len(raw), repr({**kwarg, "ifname": None}))
            # one lookup: another thread may empty _NAMED between a membership test and a read
            named = _NAMED.get(key, _UNKNOWN)
            if named is _UNKNOWN:
                placeholder = "_" * len(raw)
                encoded, _ = self._encode(
                    base.ifinfmsg,
                    _LINK_COMMANDS,
                    command,
                    base.filters["link"],
                    {**kwarg, "ifname": placeholder},
                )
                offset = name_offset(encoded, placeholder.encode())
                named = (encoded, offset) if offset is not None else None
                if len(_NAMED) >= _ENCODED_MAX:
                    _NAMED.clear()
                _NAMED[key] = named
            if named is not None:
                encoded, offset = named
                request = bytearray(encoded)
                request[offset : offset + len(raw)] = raw
                return self._exchange(request, _HEADER.unpack_from(encoded)[2])
        return self._call(base.ifinfmsg, _LINK_COMMANDS, command, base.filters["link"], kwarg)

    def addr(self, command: str, **kwarg: Any) -> list[Any]:
        """As ``IPRoute.addr`` for add, del, replace and dump."""
        base = _base()
        return self._call(base.ifaddrmsg, _ADDR_COMMANDS, command, base.filters["addr"], kwarg)

    def route(self, command: str, **kwarg: Any) -> list[Any]:
        """As ``IPRoute.route`` for add, replace, del, get and dump."""
        if command in ("add", "replace"):  # IPRoute's defaults, as ip-route(8)'s
            kwarg["proto"] = kwarg.get("proto", "static") or "static"
            kwarg["type"] = kwarg.get("type", "unicast") or "unicast"
        base = _base()
        return self._call(base.rtmsg, _ROUTE_COMMANDS, command, base.filters["route"], kwarg)

    def tc(
        self,
        command: str,
        kind: str | None = None,
        index: int | None = None,
        handle: Any = None,
        **kwarg: Any,
    ) -> list[Any]:
        """As ``IPRoute.tc`` for dump, add, del, replace and the filter commands."""
        if command.startswith(("add", "replace")) and kind is None:
            raise ValueError("must specify kind for add/change commands")
        if kind is not None:
            kwarg["kind"] = kind
        if index is not None:
            kwarg["index"] = index
        if handle is not None:
            kwarg["handle"] = handle
        tc = _tc()
        return self._call(tc.tcmsg, _TC_COMMANDS, command, tc.filters, kwarg)

    def get_links(self, *indexes: int) -> list[Any]:
        """As ``IPRoute.get_links``: the links with these indexes (ENODEV raises), or all."""
        if not indexes or indexes[0] == 0:
            return self.link("dump")
        return [msg for index in indexes for msg in self.link("get", index=index)]

    def link_lookup(self, *, ifname: str) -> list[int]:
        """As ``IPRoute.link_lookup(ifname=...)``: ``[index]``, or ``[]`` when there is none."""
        try:
            return [msg["index"] for msg in self.link("get", ifname=ifname)][:1]
        except _pyroute2.load().NetlinkError:
            return []

    def get_qdiscs(self, index: int | None = None) -> list[Any]:
        """As ``IPRoute.get_qdiscs``: every qdisc, or those of link ``index``."""
        return self.tc("dump", index=index) if index is not None else self.tc("dump")

    def get_filters(self, index: int = 0, handle: int = 0, parent: int = 0) -> list[Any]:
        """As ``IPRoute.get_filters`` (integer handles): the filters of ``index`` under ``parent``."""
        msg = _tc().tcmsg()
        msg["family"] = socket.AF_UNSPEC
        msg["index"] = index
        msg["handle"] = handle
        msg["parent"] = parent
        return self.request(msg, _RTM_GETTFILTER, _FLAGS["dump"])

    def get_netnsid(self, *, fd: int) -> dict[str, Any] | None:
        """As ``IPRoute.get_netnsid(fd=...)``: ``{"nsid", "current_nsid"}`` of that namespace."""
        msg = _base().nsidmsg()
        msg["attrs"].append(("NETNSA_FD", fd))
        for reply in self.request(msg, _RTM_GETNSID, _NLM_F_REQUEST):
            return {
                "nsid": reply.get_attr("NETNSA_NSID"),
                "current_nsid": reply.get_attr("NETNSA_CURRENT_NSID"),
            }
        return None
