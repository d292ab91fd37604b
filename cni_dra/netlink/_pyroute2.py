"""pyroute2, loaded on the first netlink call, and its errors translated into cni-dra's.

The only place in cni-dra that imports pyroute2. :func:`load` imports the narrowest
modules (``pyroute2.iproute.linux``, ``pyroute2.netlink.exceptions``) rather than the
package's public names (any ``pyroute2.*`` import still runs the package ``__init__``,
~100-280 ms), once, and registers the attribute tables pyroute2 lacks (ipvlan flags,
the macvlan broadcast queue length). The other netlink modules call ``load()`` through
this module (``_pyroute2.load()``): that attribute is the seam tests replace.

Errors: :func:`translated` turns a pyroute2 ``NetlinkError`` or an ``OSError`` into
:class:`~cni_dra.errors.NetlinkError` (102), ``failed to <what>: <strerror>``, with the
original error as ``__cause__`` (its ``code`` is the errno) and its repr as details.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from cni_dra.errors import CniError, NetlinkError

__all__ = ["load", "errno_of", "cause", "nl_error", "translated"]


@functools.cache
def load() -> SimpleNamespace:
    """pyroute2's ``IPRoute`` and ``NetlinkError``, imported on first use; decoders registered."""
    from pyroute2.iproute.linux import IPRoute
    from pyroute2.netlink import nla
    from pyroute2.netlink.exceptions import NetlinkError as PrNetlinkError
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg, macvx_data

    class ipvlan_data(nla):  # type: ignore[misc]  # noqa: N801 - pyroute2 naming; nla is untyped (Any)
        # pyroute2 0.9.7 knows IFLA_IPVLAN_MODE only; add IFLA_IPVLAN_FLAGS (<linux/if_link.h>).
        prefix = "IFLA_"
        nla_map = (
            ("IFLA_IPVLAN_UNSPEC", "none"),
            ("IFLA_IPVLAN_MODE", "uint16"),
            ("IFLA_IPVLAN_FLAGS", "uint16"),
        )

    class macvlan_data(macvx_data):  # type: ignore[misc]  # noqa: N801 - pyroute2 naming; macvx_data is untyped (Any)
        # pyroute2 0.9.7 stops at IFLA_MACVLAN_MACADDR_COUNT; the kernel (5.11+) also has
        # the broadcast queue length (<linux/if_link.h> IFLA_MACVLAN_BC_QUEUE_LEN = 7, _USED = 8).
        nla_map = (
            *macvx_data.nla_map,
            ("IFLA_MACVLAN_BC_QUEUE_LEN", "uint32"),
            ("IFLA_MACVLAN_BC_QUEUE_LEN_USED", "uint32"),
        )

    ifinfmsg.ifinfo.register_link_kind(module={"ipvlan": ipvlan_data, "macvlan": macvlan_data})
    return SimpleNamespace(IPRoute=IPRoute, NetlinkError=PrNetlinkError)


def errno_of(exc: BaseException) -> int | None:
    """errno carried by a pyroute2 NetlinkError or an OSError, else None."""
    if isinstance(exc, OSError):
        return exc.errno
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def cause(exc: BaseException) -> str:
    """The cause as a message names it: strerror of the errno, else the error's text."""
    code = errno_of(exc)
    if code is not None and code > 0:
        return os.strerror(code)
    return str(exc) or type(exc).__name__


def nl_error(what: str, exc: BaseException) -> NetlinkError:
    """NetlinkError "failed to <what>: <strerror>" keeping the pyroute2 error as details."""
    return NetlinkError(f"failed to {what}: {cause(exc)}", details=repr(exc))


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn pyroute2/OS errors raised in the block into NetlinkError; CniError passes."""
    try:
        yield
    except CniError:
        raise
    except (OSError, load().NetlinkError) as exc:
        raise nl_error(what, exc) from exc
