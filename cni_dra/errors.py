"""One error hierarchy for cni-dra; each class carries its CNI error code.

Source: CNI spec 1.1.0, section "Error" (well-known error codes). Codes used:

* 1 incompatible CNI version, 2 unsupported field in network configuration,
  3 container unknown or does not exist, 4 invalid necessary environment variables,
  5 I/O failure, 6 failed to decode content, 7 invalid network config,
  11 try again later, 50 plugin not available (51, limited connectivity, only as an
  IPAM plugin's own code, carried by :class:`IpamError`);
* 100 and up are cni-dra specific (see :class:`NoCapacityError` and friends).

Messages read ``failed to <verb> <object> <name>: <cause>`` and keep the cause in
``details``. The entry point turns any :class:`CniError` into the error JSON
``{"cniVersion", "code", "msg", "details"}`` on stdout.
"""

from __future__ import annotations

__all__ = [
    "CniError",
    "IncompatibleVersionError",
    "UnsupportedFieldError",
    "ContainerUnknownError",
    "InvalidEnvironmentError",
    "IOFailureError",
    "DecodeError",
    "InvalidConfigError",
    "TryAgainLaterError",
    "PluginNotAvailableError",
    "NoCapacityError",
    "ClaimError",
    "InventoryError",
    "NetlinkError",
    "IpamError",
    "StateError",
    "StateWriteError",
    "AttachmentExistsError",
    "CheckFailedError",
]


class CniError(Exception):
    """Base of every error cni-dra reports. ``code`` is the CNI error code."""

    code: int = 999

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict[str, object]:
        """The CNI error JSON object (spec 1.1.0 "Error")."""
        out: dict[str, object] = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


class IncompatibleVersionError(CniError):
    code = 1


class UnsupportedFieldError(CniError):
    code = 2


class ContainerUnknownError(CniError):
    code = 3


class InvalidEnvironmentError(CniError):
    code = 4


class IOFailureError(CniError):
    code = 5


class DecodeError(CniError):
    code = 6


class InvalidConfigError(CniError):
    code = 7


class TryAgainLaterError(CniError):
    code = 11


class PluginNotAvailableError(CniError):
    code = 50


class InventoryError(InvalidConfigError):
    """The node's ResourceSlice inventory is invalid (names the device and field). Code 7."""


class NoCapacityError(CniError):
    """No NIC has room for the request (KEP-5075 fit rules). Code 100."""

    code = 100


class ClaimError(CniError):
    """A prepared ResourceClaim cannot be honoured on this node. Code 101."""

    code = 101


class NetlinkError(CniError):
    """A netlink operation (link create/delete/rename/address) failed. Code 102.

    ``lacks``: the piece of the kernel whose absence made it fail (e.g. ``ifb``), when
    that is the cause (:mod:`cni_dra.netlink.shaping`); else None."""

    code = 102

    def __init__(self, msg: str, details: str = "", *, lacks: str | None = None) -> None:
        super().__init__(msg, details)
        self.lacks = lacks


class IpamError(CniError):
    """The delegated IPAM plugin failed; ``code`` is the IPAM plugin's own code when it gave one."""

    code = 103

    def __init__(self, msg: str, details: str = "", code: int | None = None) -> None:
        super().__init__(msg, details)
        if code is not None:
            self.code = code


class StateError(IOFailureError):
    """The node-local state file cannot be read or written. Code 5."""


class StateWriteError(StateError):
    """A change to the node-local state was not committed (a full disk, an I/O error);
    nothing of it is on disk. Code 5. Unlike an unreadable state, the verb must stop and
    let the runtime retry rather than carry on without the state."""


class AttachmentExistsError(CniError):
    """ADD for an attachment (network, container ID, ifname) that already exists elsewhere. Code 104."""

    code = 104


class CheckFailedError(CniError):
    """CHECK found the attachment differs from what ADD made (link, parent, MAC, addresses). Code 105."""

    code = 105
