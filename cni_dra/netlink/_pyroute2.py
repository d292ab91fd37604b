"""pyroute2, loaded on the first netlink call, and its errors translated into cni-dra's.

With :mod:`cni_dra.netlink._rtnl`, the only place in cni-dra that imports pyroute2.
:func:`load` imports the narrowest modules (``pyroute2.netlink.exceptions``, the link
message ``pyroute2.netlink.rtnl.ifinfmsg``) rather than the package's public names, once,
and registers the attribute tables pyroute2 lacks (ipvlan flags, the macvlan broadcast
queue length); pyroute2's ``IPRoute`` (``pyroute2.iproute.linux``: asyncio, every tc and
link-kind module) is never imported, :mod:`~cni_dra.netlink._rtnl` is the transport. It does so before the package's ``__init__``
runs (:func:`_package_init_deferred`): that ``__init__`` imports every pyroute2 API (IPDB,
NDB, conntrack, ipset, plan9, wireguard, ...), 64 modules and ≈ 22 ms of CPU of the
≈ 90 ms pyroute2 costs a process that runs in-process; it runs only if something asks
the package for more than those submodules. The other netlink modules
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
def _package_init_deferred() -> Iterator[None]:
    """Import ``pyroute2.*`` submodules in the block before ``pyroute2/__init__`` runs.

    Unless pyroute2 is imported already, its package module is made from its spec, its code
    not run, and put in ``sys.modules``: the submodules load through it. After the block,
    a submodule asked of the package by name (``from pyroute2 import protocols``, as tc's
    modules and ``pyroute2.iproute.linux`` do) is imported as that submodule; the first other
    attribute the module lacks (``pyroute2.IPRoute``, ``from pyroute2 import NDB``,
    ``pyroute2.__version__``) runs the package's ``__init__`` in it, once, under a lock: from
    then on it is the package ``import pyroute2`` makes, holding the same submodules. When
    the block fails, or pyroute2 is not found (its imports then fail as they would anyway),
    nothing of this stays.
    """
    spec = None if "pyroute2" in sys.modules else importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        yield
        return
    loader = spec.loader
    root = importlib.util.module_from_spec(spec)
    lock = threading.RLock()
    state = {"armed": False, "running": False, "done": False}

    def complete(name: str) -> object:
        """The package's ``__getattr__``: only reached for an attribute it lacks."""
        if state["armed"] and not (state["running"] or state["done"]) and _is_submodule(name):
            return importlib.import_module(f"pyroute2.{name}")
        with lock:
            if state["armed"] and not (state["running"] or state["done"]):
                state["running"] = True  # an attribute asked for while __init__ runs: absent
                try:
                    loader.exec_module(root)
                    state["done"] = True
                finally:
                    state["running"] = False
        try:
            return root.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'pyroute2' has no attribute {name!r}") from None

    root.__dict__["__getattr__"] = complete
    sys.modules["pyroute2"] = root
    try:
        yield
    except BaseException:
        if sys.modules.get("pyroute2") is root:
            del sys.modules["pyroute2"]
        raise
    state["armed"] = True


def _is_submodule(name: str) -> bool:
    """Whether ``pyroute2.<name>`` is a module of the package (imported or not)."""
    if not name.isidentifier() or name.startswith("_"):
        return False
    return f"pyroute2.{name}" in sys.modules or importlib.util.find_spec(f"pyroute2.{name}") is not None


@functools.cache
def load() -> SimpleNamespace:
    """pyroute2's ``NetlinkError``, imported on first use; link decoders registered.

    Raises ImportError when pyroute2 cannot be imported.
    """
    with _load_lock, _package_init_deferred():
        return _load()


def _load() -> SimpleNamespace:
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
    return SimpleNamespace(NetlinkError=PrNetlinkError)


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
