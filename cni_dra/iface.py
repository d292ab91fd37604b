"""Interface names, MAC addresses and macvlan/ipvlan modes: the kernel's rules, in one place.

Shared by the CNI protocol layer (``CNI_IFNAME``, the config's ``mac`` and ``mode``) and
the netlink adapter (the links it creates), so both accept and refuse the same values.
Standard library only: imported on every CNI call.

Interface name (:func:`validate_ifname`): what the kernel's ``dev_valid_name()`` accepts
and keeps as sent, which is also what CNI spec 1.1.0 "Parameters" (``CNI_IFNAME``) and the
reference skel's ``ValidateInterfaceName`` ask for, in printable ASCII:

* not empty, valid UTF-8, at most 15 bytes (``IFNAMSIZ`` 16 minus the NUL);
* not ``.`` or ``..``;
* no ``/``, ``:``, NUL or ``%`` (the kernel expands ``%d`` as a name pattern);
* no whitespace: Unicode White_Space (Go's ``unicode.IsSpace``, what the reference skel
  checks; the ASCII separators 0x1c-0x1f are not whitespace there nor in the kernel), and
  no byte the kernel's ``isspace()`` matches (``\\t\\n\\v\\f\\r``, space, 0xa0; so a UTF-8
  name with a 0xa0 byte, such as ``à`` = c3 a0, is refused too);
* nothing but printable ASCII (``!`` to ``~``): the spec and the kernel take other bytes,
  but cni-dra writes per-interface sysctls (``net/ipv4/conf/<name>/...``) and names ifb
  devices after the name, where control characters and look-alike letters (a precomposed
  ``é`` or ``e`` and a combining accent) only cause trouble; it refuses them up front
  (code 4) rather than fail half way through ADD.

MAC address (:func:`validate_mac`): unicast Ethernet ``xx:xx:xx:xx:xx:xx`` (hex, either
case), not all zeros, I/G bit clear; returned lower case.

Errors (cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.InvalidEnvironmentError` (4): a bad interface name;
* :class:`~cni_dra.errors.InvalidConfigError` (7): a bad MAC address.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NewType

from cni_dra.errors import InvalidConfigError, InvalidEnvironmentError

__all__ = [
    "IFNAMSIZ",
    "MAX_IFNAME_BYTES",
    "IfName",
    "MACVLAN_MODES",
    "CONFIG_MACVLAN_MODES",
    "IPVLAN_MODES",
    "IPVLAN_FLAGS",
    "validate_ifname",
    "validate_mac",
    "mac_field",
]

IFNAMSIZ = 16
"""<linux/if.h>: the size of an interface name buffer, terminating NUL included."""

MAX_IFNAME_BYTES = IFNAMSIZ - 1
"""Longest interface name, in UTF-8 bytes."""

IfName = NewType("IfName", str)
"""A Linux interface name that passed :func:`validate_ifname` (at most 15 bytes)."""

# <linux/if_link.h>: enum macvlan_mode (bit values) and the ipvlan mode and flags.
MACVLAN_MODES: Mapping[str, int] = MappingProxyType(
    {"bridge": 4, "private": 1, "vepa": 2, "passthru": 8, "source": 16}
)
"""Every macvlan mode the kernel knows, with its ``IFLA_MACVLAN_MODE`` value."""

CONFIG_MACVLAN_MODES: tuple[str, ...] = tuple(m for m in MACVLAN_MODES if m != "source")
"""The macvlan modes a network config may name (default bridge), as the reference macvlan
plugin: ``source`` needs a list of allowed source MACs that the config has no key for."""

IPVLAN_MODES: Mapping[str, int] = MappingProxyType({"l2": 0, "l3": 1, "l3s": 2})
"""ipvlan modes (default l2) with their ``IFLA_IPVLAN_MODE`` value."""

IPVLAN_FLAGS: Mapping[str, int] = MappingProxyType({"bridge": 0, "private": 1, "vepa": 2})
"""ipvlan flags (default bridge) with their ``IFLA_IPVLAN_FLAGS`` value (IPVLAN_F_PRIVATE, IPVLAN_F_VEPA)."""

_MAC_RE = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")
# Bytes the kernel's isspace() matches (lib/ctype.c: \t\n\v\f\r, space, 0xa0).
_KERNEL_SPACE_BYTES = frozenset(b"\t\n\v\f\r \xa0")
# Python's str.isspace() also counts these ASCII separators; Unicode White_Space does not.
_NOT_WHITE_SPACE = frozenset("\x1c\x1d\x1e\x1f")


def _ifname_problem(ifname: object) -> str | None:
    """Why ``ifname`` is not a valid interface name ("is empty", ...), or None."""
    if not isinstance(ifname, str) or not ifname:
        return "is empty"
    try:
        raw = ifname.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if len(raw) > MAX_IFNAME_BYTES:
        return f"is longer than {MAX_IFNAME_BYTES} bytes"
    if ifname in (".", ".."):
        return "is '.' or '..'"
    if "\x00" in ifname:
        return "contains a NUL character"
    if "%" in ifname:
        return "contains '%' (the kernel expands it as a name pattern like eth%d)"
    if any(c in "/:" or (c.isspace() and c not in _NOT_WHITE_SPACE) for c in ifname) or any(
        b in _KERNEL_SPACE_BYTES for b in raw
    ):
        return "contains '/', ':' or whitespace"
    if not all("!" <= c <= "~" for c in ifname):
        return "contains a character that is not printable ASCII (cni-dra takes '!' to '~' only)"
    return None


def validate_ifname(ifname: str, *, var: str | None = None) -> IfName:
    """Return ``ifname`` if it is a valid Linux interface name (module docstring has the rule).

    ``var`` names where the value came from (``CNI_IFNAME``) for the message: ``invalid
    CNI_IFNAME 'a/b': interface name contains '/', ':' or whitespace``; without it the
    message reads ``invalid interface name 'a/b': contains ...``.

    Raises:
        InvalidEnvironmentError: (code 4) any rule broken; the message says which.
    """
    problem = _ifname_problem(ifname)
    if problem is None:
        return IfName(ifname)
    if var is not None:
        raise InvalidEnvironmentError(f"invalid {var} {ifname!r}: interface name {problem}")
    raise InvalidEnvironmentError(f"invalid interface name {ifname!r}: {problem}")


def validate_mac(mac: str) -> str:
    """Return the unicast Ethernet MAC ``mac`` (``xx:xx:xx:xx:xx:xx``) in lower case.

    Raises:
        InvalidConfigError: (code 7) malformed, multicast (I/G bit set) or all zeros; the
            message quotes ``mac`` as given.
    """
    if not isinstance(mac, str) or not _MAC_RE.fullmatch(mac):
        raise InvalidConfigError(f"malformed MAC address {mac!r} (want xx:xx:xx:xx:xx:xx)")
    if int(mac[:2], 16) & 1:
        raise InvalidConfigError(f"MAC address {mac!r} is multicast")
    if mac.replace(":", "") == "000000000000":
        raise InvalidConfigError(f"MAC address {mac!r} is all zeros")
    return mac.lower()


def mac_field(mac: str | None) -> str | None:
    """:func:`validate_mac` for an optional MAC field of a pydantic model: None passes, a
    bad MAC raises ValueError with the message (pydantic gathers ValueErrors into one)."""
    if mac is None:
        return None
    try:
        return validate_mac(mac)
    except InvalidConfigError as exc:
        raise ValueError(exc.msg) from exc
