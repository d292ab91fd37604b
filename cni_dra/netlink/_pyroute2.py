"""pyroute2, loaded on the first netlink call, and its errors translated into cni-dra's.

The only place in cni-dra that imports pyroute2. :func:`load` imports the narrowest
modules (``pyroute2.iproute.linux``, ``pyroute2.netlink.exceptions``) rather than the
package's public names, once, and registers the attribute tables pyroute2 lacks (ipvlan
flags, the macvlan broadcast queue length). It does so without running the package's
``__init__`` (:func:`_without_package_root`): that ``__init__`` imports every pyroute2
API (IPDB, NDB, conntrack, ipset, plan9, wireguard, ...), 64 modules and ≈ 22 ms of CPU
of the ≈ 90 ms pyroute2 costs a process that runs in-process. The other netlink modules
call ``load()`` through this module (``_pyroute2.load()``): that attribute is the seam
tests replace.

Errors: :func:`translated` turns a pyroute2 ``NetlinkError`` or an ``OSError`` into
:class:`~cni_dra.errors.NetlinkError` (102), ``failed to <what>: <strerror>``, with the
original error as ``__cause__`` (its ``code`` is the errno) and its repr as details.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from cni_dra.errors import CniError, NetlinkError

__all__ = ["load", "errno_of", "cause", "nl_error", "translated"]


_load_lock = threading.Lock()


@contextmanager
def _without_package_root() -> Iterator[None]:
    """Import ``pyroute2.*`` submodules in the block without executing ``pyroute2/__init__``.

    Unless the package is imported already, a module object for it (its spec and
    ``__path__``, its code not run) stands in ``sys.modules`` during the block, so that
    submodules resolve through it; it is removed afterwards, so a later ``import pyroute2``
    (a test, an operator's code in the agent) gets the real package, which then finds the
    submodules loaded here. When pyroute2 is not found, the block's own imports fail as
    they would anyway.
    """
    spec = None if "pyroute2" in sys.modules else importlib.util.find_spec("pyroute2")
    if spec is None or spec.submodule_search_locations is None:
        yield
        return
    root = importlib.util.module_from_spec(spec)
    sys.modules["pyroute2"] = root
    try:
        yield
    finally:
        if sys.modules.get("pyroute2") is root:
            del sys.modules["pyroute2"]


@functools.cache
def load() -> SimpleNamespace:
    """pyroute2's ``IPRoute`` and ``NetlinkError``, imported on first use; decoders registered.

    Raises ImportError when pyroute2 cannot be imported.
    """
    with _load_lock, _without_package_root():
        return _load()


def _load() -> SimpleNamespace:
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
