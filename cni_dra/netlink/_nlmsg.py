"""The bytes of rtnetlink messages, for :mod:`cni_dra.netlink._rtnl`: a link reply cut down to
the attributes cni-dra reads before pyroute2 decodes it (:func:`lean_link`), whether a
request's arguments always encode to the same bytes (:func:`cacheable`: the key of the
encoded-request cache), where a link request carries its name (:func:`name_offset`: the
name patched into a kept request), and which links a datagram of link notifications
announces deleted (:func:`deleted_links`). Pure functions over ``bytes`` and plain values; no socket,
no pyroute2.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = [
    "IFINFO_BYTES",
    "IFLA_IFNAME",
    "LINK_ATTRS",
    "NAMES_FROM_FILES",
    "NLA",
    "NLA_TYPE_MASK",
    "U32",
    "cacheable",
    "deleted_links",
    "lean_link",
    "name_offset",
]

U32 = struct.Struct("=I")  # nlmsg_len (offset 0), nlmsg_seq (offset 8)
NLA = struct.Struct("=HH")  # struct nlattr: length, type
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
IFINFO_BYTES = 16 + 16  # nlmsghdr + struct ifinfomsg: where a link's attributes start
# The attributes of a link reply that are decoded (<linux/if_link.h> numbers): the ones
# cni-dra reads. The kernel sends about 40 (statistics, per-family configuration, queue and
# offload limits...); pyroute2 builds an object for each, ≈ 60 µs a link, so the others are
# dropped from the reply before it is decoded.
LINK_ATTRS = frozenset(
    {
        1,  # IFLA_ADDRESS
        3,  # IFLA_IFNAME
        4,  # IFLA_MTU
        5,  # IFLA_LINK
        10,  # IFLA_MASTER
        16,  # IFLA_OPERSTATE
        18,  # IFLA_LINKINFO
        27,  # IFLA_GROUP
        37,  # IFLA_LINK_NETNSID
    }
)

# Arguments pyroute2 resolves through iproute2's files (/etc/iproute2/group, rt_protos,
# rt_tables...) when given as names: such a request is encoded each time, as before.
NAMES_FROM_FILES = frozenset(
    {"group", "proto", "scope", "table", "tos", "dsfield", "realm", "realms", "handle"}
)
_SCALARS = frozenset({str, int, float, bool, type(None)})

IFLA_IFNAME = 3
_RTM_DELLINK = 17
_AF_UNSPEC = 0
_NLMSG_HEADER = struct.Struct("=IH")  # nlmsg_len, nlmsg_type
_IFINFO_HEAD = struct.Struct("=BxHi")  # ifi_family, pad, ifi_type, ifi_index


def lean_link(data: bytes) -> bytes:
    """One link message (``data``: header, ifinfomsg, attributes) with only the attributes of
    :data:`LINK_ATTRS`, its length set to match."""
    end = len(data)
    out = bytearray(data[:IFINFO_BYTES])
    offset = IFINFO_BYTES
    unpack = NLA.unpack_from
    while offset + 4 <= end:
        length, kind = unpack(data, offset)
        if length < 4:
            break
        step = (length + 3) & ~3
        if kind & NLA_TYPE_MASK in LINK_ATTRS:
            out += data[offset : offset + step]
        offset += step
    U32.pack_into(out, 0, len(out))
    return bytes(out)


def _plain(value: Any) -> bool:
    """Whether ``value`` is made of str, int, float, bool, None, lists, tuples and dicts only:
    its ``repr`` then says all of it (a cache key), which an arbitrary object's need not."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is list or kind is tuple:
        for item in value:
            if not _plain(item):
                return False
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not _plain(item):
                return False
        return True
    return False


def cacheable(kwarg: dict[str, Any]) -> bool:
    """Whether a request of these arguments always encodes to the same bytes: the key of
    :data:`cni_dra.netlink._rtnl._ENCODED`."""
    for key in NAMES_FROM_FILES.intersection(kwarg):
        if type(kwarg[key]) is str:
            return False
    return _plain(kwarg)


def name_offset(encoded: bytes, placeholder: bytes) -> int | None:
    """Where the name goes in link request ``encoded``: the offset of the payload of its one
    top-level IFLA_IFNAME attribute, which must be ``placeholder`` and its NUL; else None."""
    found = None
    offset, end = IFINFO_BYTES, len(encoded)
    while offset + 4 <= end:
        length, kind = NLA.unpack_from(encoded, offset)
        if length < 4:
            return None
        if kind & NLA_TYPE_MASK == IFLA_IFNAME:
            if found is not None or encoded[offset + 4 : offset + length] != placeholder + b"\0":
                return None
            found = offset + 4
        offset += (length + 3) & ~3
    return found


def deleted_links(data: bytes) -> list[tuple[int, str | None]]:
    """(index, name) of each link that ``data`` (one datagram read from a socket subscribed
    to ``RTMGRP_LINK``) announces deleted: its RTM_DELLINK messages of family AF_UNSPEC (a
    bridge port's AF_BRIDGE RTM_DELLINK leaves the link in place); name None when the
    message carries no IFLA_IFNAME."""
    found: list[tuple[int, str | None]] = []
    offset, end = 0, len(data)
    while offset + 16 <= end:
        length, kind = _NLMSG_HEADER.unpack_from(data, offset)
        if length < 16 or offset + length > end:
            break
        if kind == _RTM_DELLINK and length >= IFINFO_BYTES:
            family, _type, index = _IFINFO_HEAD.unpack_from(data, offset + 16)
            if family == _AF_UNSPEC:
                found.append((index, _ifname(data[offset : offset + length])))
        offset += (length + 3) & ~3
    return found


def _ifname(msg: bytes) -> str | None:
    """The IFLA_IFNAME of one link message, or None."""
    offset, end = IFINFO_BYTES, len(msg)
    while offset + 4 <= end:
        length, kind = NLA.unpack_from(msg, offset)
        if length < 4:
            return None
        if kind & NLA_TYPE_MASK == IFLA_IFNAME:
            return msg[offset + 4 : offset + length].split(b"\0", 1)[0].decode(errors="replace")
        offset += (length + 3) & ~3
    return None
