"""Traffic control on a pod interface: tbf for egress, an ifb device shaped by tbf for ingress.

The shape (the reference CNI ``bandwidth`` plugin's, applied to cni-dra's sub-links inside
the pod's namespace):

* **egress** (pod -> network): a root ``tbf`` qdisc (handle ``1:``) on the pod interface;
* **ingress** (network -> pod): an ``ingress`` qdisc (``ffff:``) on the pod interface whose
  u32 match-all filter (priority 1, every protocol) redirects each packet with the
  ``mirred`` action (egress redirect) to an ifb device in the pod's namespace
  (:func:`ifb_name`, made in netdev group :data:`IFB_GROUP`); the ifb device's root
  ``tbf`` shapes it, then it is delivered.

:class:`ShapeSpec` says what to install; :class:`Tbf` is one direction's token bucket (rate,
burst, queue limit), with the defaults computed by :meth:`Tbf.for_rate` and the bounds
within which tbf holds it (:mod:`cni_dra.netlink.tbf`, re-exported here).
:func:`apply_shaping` installs a spec (replacing whatever shaping was there),
:func:`remove_shaping` removes it, :func:`delete_shaped_link` deletes the pod interface and
its ifb device in one go, :func:`read_shaping` reads back what the kernel holds.
:func:`remove_leaked_ifbs` deletes the ifb devices of a namespace that shape no link any
more; :func:`probe_kernel` says which piece of all this the kernel lacks.
Every call runs inside the pod's namespace on a socket opened there for the call
(:func:`cni_dra.netlink.sockets.netns_iproute`); nothing runs ``tc`` or ``ip``.

**Whose ifb device.** An ifb device is cni-dra's when it carries the mark
(:data:`IFB_GROUP`, set in the request that makes it), or when the ingress of the link it
is named after redirects to it (a device made before the mark). Only those are reused,
removed or deleted; a device of the same name made by someone else fails
:func:`apply_shaping` (code 102 naming it) and is left alone by everything else.

Errors (cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.InvalidConfigError` (7): a spec that is not valid (rates, bursts,
  limits outside what tbf holds on the interface's MTU), raised when it is built and, for
  the interface's real MTU, by :func:`apply_shaping` before any change;
* :class:`~cni_dra.errors.ContainerUnknownError` (3) /
  :class:`~cni_dra.errors.InvalidEnvironmentError` (4): the netns is missing / not a netns
  (:func:`apply_shaping`, :func:`read_shaping`; :func:`remove_shaping` treats a missing
  netns as done), or ``ifname`` is not a valid interface name;
* :class:`~cni_dra.errors.NetlinkError` (102): the interface does not exist, the kernel
  lacks a piece (``kernel lacks ifb``, ``kernel lacks the tbf qdisc``...), the ifb name is
  taken by another kind of link or by an ifb device cni-dra did not make, or another
  request failed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from cni_dra.errors import ContainerUnknownError, InvalidConfigError, InvalidEnvironmentError, NetlinkError
from cni_dra.iface import validate_ifname
from cni_dra.netlink import _pyroute2, dellink, netns, sockets
from cni_dra.netlink.netns import netns_exists
from cni_dra.netlink.tbf import (
    BURST_WINDOW_S,
    DEFAULT_LATENCY_S,
    MAX_RATE_BPS,
    MIN_BURST_BYTES,
    ShapeSpec,
    Tbf,
    burst_from_buffer,
    psched_ticks_per_us,
    tbf_parameters,
)

__all__ = [
    "DEFAULT_LATENCY_S",
    "BURST_WINDOW_S",
    "MIN_BURST_BYTES",
    "MAX_RATE_BPS",
    "IFB_PREFIX",
    "IFB_GROUP",
    "Tbf",
    "ShapeSpec",
    "ShapeInfo",
    "ifb_name",
    "apply_shaping",
    "remove_shaping",
    "delete_shaped_link",
    "read_shaping",
    "is_ifb_name",
    "remove_leaked_ifbs",
    "probe_kernel",
    "KERNEL_PIECES",
]

_T = TypeVar("_T")

LACKS_IFB = "ifb"
LACKS_TBF = "the tbf qdisc"
LACKS_REDIRECT = "the ingress qdisc, u32 classifier or mirred action"
KERNEL_PIECES: dict[str, tuple[str, ...]] = {
    LACKS_IFB: ("ifb",),
    LACKS_TBF: ("sch_tbf",),
    LACKS_REDIRECT: ("sch_ingress", "cls_u32", "act_mirred"),
}
"""The pieces of shaping a kernel may lack, as errors name them (``NetlinkError.lacks``),
and the kernel modules that provide each."""

IFB_PREFIX = "ifb-"
IFB_GROUP = 0x7CD31FB0
"""The netdev group (IFLA_GROUP) cni-dra makes its ifb devices in, in the request that makes
them: its mark on them. An ifb device named by :func:`ifb_name`'s rule without it is
someone else's (or older than the mark: then only the redirect of its link tells it is ours)."""
_HASHED_IFB_PREFIX = "ifb"
_IFNAMSIZ = 15

_TC_H_ROOT = 0xFFFFFFFF
_TC_H_INGRESS = 0xFFFFFFF1
_TBF_HANDLE = 0x10000  # 1:
_INGRESS_HANDLE = 0xFFFF0000  # ffff:
_FILTER_PRIO = 1
_FILTER_CLASSID = 0x10001  # 1:1, as tc and the reference plugin set it; unused by a redirect
_ETH_P_ALL = 0x0003
_IFF_UP = 0x1


@dataclass(frozen=True)
class ShapeInfo:
    """Shaping installed on ``ifname``: each direction's bucket as the kernel holds it (None:
    not shaped), the ifb device ingress goes through (None: none) and whether that device
    is up (None when there is none; a device that is down drops all that is redirected to it)."""

    ifname: str
    egress: Tbf | None
    ingress: Tbf | None
    ifb: str | None
    ifb_up: bool | None = None


def ifb_name(ifname: str) -> str:
    """The ifb device that shapes ``ifname``'s ingress, in the same namespace.

    Rule: ``ifb-<ifname>`` when that fits in 15 bytes (``ifname`` of up to 11 bytes, e.g.
    ``eth0`` -> ``ifb-eth0``); otherwise ``ifb`` and the first 12 hex digits of the SHA-256
    of ``ifname`` (UTF-8), e.g. ``ifb3f2a...``. The two forms cannot collide (the fourth
    character is ``-`` in one, a hex digit in the other). Raises InvalidEnvironmentError (4)
    for an invalid ``ifname``.
    """
    validate_ifname(ifname)
    short = IFB_PREFIX + ifname
    if len(short.encode()) <= _IFNAMSIZ:
        return short
    return (
        _HASHED_IFB_PREFIX
        + hashlib.sha256(ifname.encode()).hexdigest()[: _IFNAMSIZ - len(_HASHED_IFB_PREFIX)]
    )


_HASHED_IFB = re.compile(r"ifb[0-9a-f]{12}")


def is_ifb_name(name: str) -> bool:
    """True when ``name`` is one :func:`ifb_name` gives (either form) for some interface name."""
    if _HASHED_IFB.fullmatch(name):
        return True
    if not name.startswith(IFB_PREFIX):
        return False
    try:
        return ifb_name(name[len(IFB_PREFIX) :]) == name
    except InvalidEnvironmentError:
        return False


# -- the kernel side ------------------------------------------------------------------------


def _code(exc: BaseException) -> int | None:
    return _pyroute2.errno_of(exc)


def _link_index(ipr: Any, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return found[0] if found else None


def _pod_link(ipr: Any, netns: str, ifname: str) -> tuple[int, int]:
    """(ifindex, MTU) of ``ifname``, in one request."""
    try:
        msg = ipr.link("get", ifname=ifname)[0]
    except _pyroute2.load().NetlinkError as exc:
        if _code(exc) == errno.ENODEV:
            raise NetlinkError(f"failed to shape {ifname} in netns {netns}: no such interface") from exc
        raise _pyroute2.nl_error(f"shape {ifname} in netns {netns}", exc) from exc
    return int(msg["index"]), int(msg.get_attr("IFLA_MTU"))


def _qdiscs(ipr: Any, index: int) -> Iterator[Any]:
    for msg in ipr.get_qdiscs(index=index):
        if msg["index"] == index:
            yield msg


def _qdisc(ipr: Any, index: int, parent: int) -> Any | None:
    for msg in _qdiscs(ipr, index):
        if msg["parent"] == parent:
            return msg
    return None


def _tbf_of(msg: Any | None, ticks_per_us: float) -> Tbf | None:
    if msg is None or msg.get_attr("TCA_KIND") != "tbf":
        return None
    parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
    rate_bps = parms["rate"] * 8
    burst = burst_from_buffer(parms["buffer"], rate_bps, ticks_per_us) if rate_bps else 0
    return Tbf(rate_bps=rate_bps, burst_bytes=burst, limit_bytes=parms["limit"])


def _link_kind(msg: Any) -> str | None:
    linkinfo = msg.get_attr("IFLA_LINKINFO")
    return linkinfo.get_attr("IFLA_INFO_KIND") if linkinfo is not None else None


def _redirect_target(ipr: Any, index: int) -> int | None:
    """ifindex the ingress u32 filter of ``index`` redirects to (mirred), or None."""
    try:
        filters = ipr.get_filters(index=index, parent=_INGRESS_HANDLE)
    except _pyroute2.load().NetlinkError:
        return None
    for msg in filters:
        if msg.get_attr("TCA_KIND") != "u32":
            continue
        opts = msg.get_attr("TCA_OPTIONS")
        acts = opts.get_attr("TCA_U32_ACT") if opts is not None else None
        if acts is None:
            continue
        for act in acts.get("attrs", []):
            body = act[1]
            if body.get_attr("TCA_ACT_KIND") != "mirred":
                continue
            parms = body.get_attr("TCA_ACT_OPTIONS").get_attr("TCA_MIRRED_PARMS")
            return int(parms["ifindex"])
    return None


def _replace_tbf(ipr: Any, index: int, tbf: Tbf) -> None:
    ipr.tc("replace", "tbf", index, _TBF_HANDLE, parent=_TC_H_ROOT, **tbf_parameters(tbf))


def _delete_qdisc(ipr: Any, index: int, parent: int, kind: str) -> bool:
    """Delete ``index``'s qdisc at ``parent`` if it is of ``kind``; False if there was none."""
    msg = _qdisc(ipr, index, parent)
    if msg is None or msg.get_attr("TCA_KIND") != kind:
        return False
    try:
        # no kind: pyroute2 would build (and demand) a tbf's parameters for a deletion
        ipr.tc("del", index=index, handle=msg["handle"], parent=parent)
    except _pyroute2.load().NetlinkError as exc:
        if _code(exc) in (errno.ENOENT, errno.EINVAL, errno.ENODEV):
            return False
        raise
    return True


def _delete_link_index(ipr: Any, index: int) -> None:
    try:
        ipr.link("del", index=index)
    except _pyroute2.load().NetlinkError as exc:
        if _code(exc) != errno.ENODEV:
            raise


def _delete_announced(index: int) -> None:
    """:func:`_delete_link_index`, done when the kernel announces the deletion
    (:mod:`cni_dra.netlink.dellink`; the calling thread is in the link's namespace)."""
    try:
        dellink.delete({"index": index}, indexes=(index,))
    except _pyroute2.load().NetlinkError as exc:
        if _code(exc) != errno.ENODEV:
            raise


def _kernel_lacks(exc: BaseException, piece: str, what: str) -> NetlinkError:
    """``failed to <what>: kernel lacks <piece>`` (``lacks`` set to ``piece``, one of
    :data:`KERNEL_PIECES`) for 'unknown kind' answers, else the cause."""
    if _code(exc) in (errno.EOPNOTSUPP, errno.ENOENT, errno.EPROTONOSUPPORT):
        return NetlinkError(f"failed to {what}: kernel lacks {piece}", details=repr(exc), lacks=piece)
    return _pyroute2.nl_error(what, exc)


def _is_ours(ipr: Any, msg: Any, pod_idx: int | None) -> bool:
    """Whether link ``msg`` is an ifb device cni-dra made: of kind ifb, with the mark
    (:data:`IFB_GROUP`) or the target of the ingress redirect of link ``pod_idx`` (the pod
    interface it is named after; None when there is none)."""
    if _link_kind(msg) != "ifb":
        return False
    if msg.get_attr("IFLA_GROUP") == IFB_GROUP:
        return True
    return pod_idx is not None and _redirect_target(ipr, pod_idx) == int(msg["index"])


def _our_ifb(ipr: Any, ifname: str, pod_idx: int | None) -> int | None:
    """The index of the ifb device of ``ifname`` when it is cni-dra's (:func:`_is_ours`), else None."""
    idx = _link_index(ipr, ifb_name(ifname))
    if idx is None:
        return None
    msgs = ipr.get_links(idx)
    return idx if msgs and _is_ours(ipr, msgs[0], pod_idx) else None


def _ensure_ifb(ipr: Any, netns: str, ifname: str, mtu: int, ours: int | None) -> int:
    """The ifb device of ``ifname``, up with ``mtu``: ``ours`` (the index of cni-dra's device,
    found before) or else made here, in one request with the mark. A link that holds the
    name already is refused: of another kind, or an ifb device cni-dra did not make."""
    name = ifb_name(ifname)
    what = f"create ifb device {name} in netns {netns}"
    if ours is None:
        try:
            ipr.link("add", ifname=name, kind="ifb", mtu=mtu, state="up", group=IFB_GROUP)
        except _pyroute2.load().NetlinkError as exc:
            if _code(exc) != errno.EEXIST:
                raise _kernel_lacks(exc, LACKS_IFB, what) from exc
            ours = _marked_ifb(ipr, name, what)
        else:
            made = _link_index(ipr, name)
            if made is None:  # pragma: no cover - removed under us
                raise NetlinkError(f"failed to {what}: it vanished after creation")
            return made
    with _pyroute2.translated(f"bring ifb device {name} up in netns {netns}"):
        ipr.link("set", index=ours, mtu=mtu, state="up", group=IFB_GROUP)
    return ours


def _marked_ifb(ipr: Any, name: str, what: str) -> int:
    """The index of link ``name``, which exists, when it is an ifb device with cni-dra's
    mark; else NetlinkError (102) ``failed to <what>: ...`` saying what holds the name."""
    idx = _link_index(ipr, name)
    msgs = ipr.get_links(idx) if idx is not None else []
    if idx is None or not msgs or _link_kind(msgs[0]) != "ifb":
        raise NetlinkError(f"failed to {what}: {name} exists and is not an ifb device")
    if msgs[0].get_attr("IFLA_GROUP") != IFB_GROUP:
        raise NetlinkError(
            f"failed to {what}: {name} exists and cni-dra did not make it (not in cni-dra's netdev group "
            f"{IFB_GROUP:#x}); it is left alone: remove it, or use another interface name"
        )
    return idx


def _add_redirect(ipr: Any, pod_idx: int, ifb_idx: int) -> None:
    """Ingress qdisc on the pod interface, and its u32 match-all filter redirecting to the ifb."""
    ipr.tc("add", "ingress", pod_idx, _INGRESS_HANDLE)
    ipr.tc(
        "add-filter",
        "u32",
        pod_idx,
        parent=_INGRESS_HANDLE,
        prio=_FILTER_PRIO,
        protocol=_ETH_P_ALL,
        target=_FILTER_CLASSID,
        keys=["0x0/0x0+0"],
        action=dict(kind="mirred", direction="egress", action="redirect", ifindex=ifb_idx),
    )


def _remove_all(ipr: Any, ifname: str) -> bool:
    """Remove every piece of shaping of ``ifname`` in the socket's namespace; missing is fine.
    True when something was removed."""
    removed = False
    idx = _link_index(ipr, ifname)
    ifb = _our_ifb(ipr, ifname, idx)  # before the redirect that may tell it goes
    if idx is not None:
        removed = _delete_qdisc(ipr, idx, _TC_H_INGRESS, "ingress")
        removed = _delete_qdisc(ipr, idx, _TC_H_ROOT, "tbf") or removed
    if ifb is not None:
        _delete_link_index(ipr, ifb)
        removed = True
    return removed


def apply_shaping(netns: str, ifname: str, spec: ShapeSpec, *, new_link: bool = False) -> ShapeInfo:
    """Shape ``ifname`` in ``netns`` as ``spec`` says, replacing any shaping installed before.

    Egress: root tbf (``1:``) on ``ifname``, replaced in place. Ingress: the ifb device
    :func:`ifb_name` (made if missing, MTU of ``ifname``, up) with a root tbf, then a fresh
    ingress qdisc with the redirecting filter on ``ifname``. A direction the spec leaves
    unshaped is removed. Returns :func:`read_shaping`'s view of the result.

    ``new_link``: ``ifname`` was made just now (ADD), so it has no shaping to replace or
    remove, and the result is what was installed (the spec's buckets, ``ifb`` when ingress is
    shaped) rather than read back: about half the requests.

    On any failure everything of shaping on ``ifname`` is removed (the interface is left
    unshaped, never half shaped) and the error raised.

    Raises:
        ContainerUnknownError: (3) the netns does not exist.
        InvalidEnvironmentError: (4) ``ifname`` is invalid or the netns is not a network namespace.
        InvalidConfigError: (7) a bucket of ``spec`` that tbf cannot hold on ``ifname``'s MTU
            (:mod:`cni_dra.netlink.tbf`), before any change.
        NetlinkError: (102) ``failed to shape <ifname> in netns <netns>: ...``; the interface does
            not exist, the kernel lacks ifb or tbf (``kernel lacks ifb``), a link of another kind
            or an ifb device cni-dra did not make holds the ifb name (left alone), or the kernel
            refused a request.
    """
    validate_ifname(ifname)
    with sockets.netns_iproute(netns) as ipr:
        pod_idx, mtu = _pod_link(ipr, netns, ifname)
        try:
            spec = spec.at_mtu(mtu)  # the interface's bounds, before any change
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"{exc.msg} (interface {ifname} in netns {netns})") from exc
        egress, ingress = spec.egress, spec.ingress
        try:
            with _pyroute2.translated(f"shape {ifname} in netns {netns}"):
                _apply(ipr, netns, ifname, pod_idx, mtu, egress, ingress, new_link)
        except BaseException:
            try:
                _remove_all(ipr, ifname)
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise
        if new_link:
            return ShapeInfo(
                ifname=ifname,
                egress=egress,
                ingress=ingress,
                ifb=ifb_name(ifname) if ingress is not None else None,
                ifb_up=True if ingress is not None else None,
            )
        with _pyroute2.translated(f"read shaping of {ifname} in netns {netns}"):
            return _read(ipr, ifname) or ShapeInfo(ifname=ifname, egress=None, ingress=None, ifb=None)


def _apply(
    ipr: Any,
    netns: str,
    ifname: str,
    pod_idx: int,
    mtu: int,
    egress: Tbf | None,
    ingress: Tbf | None,
    new_link: bool,
) -> None:
    where = f"{ifname} in netns {netns}"
    if egress is not None:
        try:
            _replace_tbf(ipr, pod_idx, egress)
        except (OSError, _pyroute2.load().NetlinkError) as exc:
            raise _kernel_lacks(exc, LACKS_TBF, f"shape egress of {where}") from exc
    elif not new_link:
        with _pyroute2.translated(f"remove egress shaping of {where}"):
            _delete_qdisc(ipr, pod_idx, _TC_H_ROOT, "tbf")
    ours = None
    if not new_link:
        with _pyroute2.translated(f"remove ingress shaping of {where}"):
            ours = _our_ifb(ipr, ifname, pod_idx)  # before the redirect that may tell it goes
            _delete_qdisc(ipr, pod_idx, _TC_H_INGRESS, "ingress")  # its filter goes with it
    if ingress is None:
        if ours is not None:
            with _pyroute2.translated(f"remove ifb device {ifb_name(ifname)} in netns {netns}"):
                _delete_link_index(ipr, ours)
        return
    ifb_idx = _ensure_ifb(ipr, netns, ifname, mtu, ours)
    try:
        _replace_tbf(ipr, ifb_idx, ingress)
    except (OSError, _pyroute2.load().NetlinkError) as exc:
        raise _kernel_lacks(exc, LACKS_TBF, f"shape ingress of {where}") from exc
    try:
        _add_redirect(ipr, pod_idx, ifb_idx)
    except (OSError, _pyroute2.load().NetlinkError) as exc:
        raise _kernel_lacks(
            exc, LACKS_REDIRECT, f"redirect ingress of {where} to {ifb_name(ifname)}"
        ) from exc


def _in_pod_netns(netns: str, what: str, work: Callable[[Any], _T], gone: _T) -> _T:
    """``work(ipr)`` on a socket opened in ``netns`` (its errors as ``failed to <what>``);
    ``gone`` when the netns is gone: a missing path, or the empty file left once it was
    unmounted (DEL's rule: nothing left to do). Raises InvalidEnvironmentError (4) when
    ``netns`` exists but is not a network namespace."""
    try:
        with sockets.netns_iproute(netns) as ipr, _pyroute2.translated(what):
            return work(ipr)
    except ContainerUnknownError:
        return gone
    except InvalidEnvironmentError:
        if not netns_exists(netns):
            return gone
        raise


def remove_shaping(netns: str, ifname: str) -> bool:
    """Remove the shaping of ``ifname`` in ``netns``: its ifb device, ingress and root tbf qdiscs.

    Idempotent: a missing netns, interface, device or qdisc is success (DEL's rule). A link
    that holds the ifb name and is not cni-dra's ifb device (module docstring) is left
    alone. Returns True when something was
    removed (an ifb device left behind by a link deleted before it, for instance).

    Raises:
        InvalidEnvironmentError: (4) ``ifname`` is invalid or ``netns`` is not a network namespace.
        NetlinkError: (102) the kernel refused a request.
    """
    validate_ifname(ifname)
    return _in_pod_netns(
        netns, f"remove shaping of {ifname} in netns {netns}", lambda ipr: _remove_all(ipr, ifname), False
    )


_BATCH_GROUP_BASE = 0x7CD40000  # netdev groups tried for a batched deletion (any unused one does)


def delete_shaped_link(netns: str, ifname: str) -> tuple[bool, bool]:
    """Delete the pod interface ``ifname`` in ``netns`` together with its ifb device; returns
    (interface deleted, ifb device deleted). Idempotent as :func:`remove_shaping` (a missing
    netns, interface or device is success; a link that holds the ifb name and is not
    cni-dra's ifb device, module docstring, is left alone).

    Why together: a link deletion is mostly the kernel's unregistration (RCU grace periods,
    tens of ms on a busy node), and deleting the two one after the other pays it twice.
    Both are moved into a netdev group no other link of the namespace uses and deleted with
    one RTM_DELLINK naming the group, which the kernel unregisters as one batch. The
    interface's qdiscs and the redirect go with it. Done when the kernel announces both
    deleted, before it has freed them (:mod:`cni_dra.netlink.dellink`).

    Raises:
        InvalidEnvironmentError: (4) ``ifname`` is invalid or ``netns`` is not a network namespace.
        NetlinkError: (102) the kernel refused a request.
    """
    validate_ifname(ifname)
    return _in_pod_netns(
        netns,
        f"delete link {ifname} and its ifb device in netns {netns}",
        lambda ipr: _delete_pair_racing(ipr, ifname),
        (False, False),
    )


def _delete_pair_racing(ipr: Any, ifname: str) -> tuple[bool, bool]:
    """:func:`_delete_pair`, again from a fresh dump when a link it dumped vanished under it
    (ENODEV: another DEL of the same attachment deleted it first; what is gone is done)."""
    for _ in range(3):
        try:
            return _delete_pair(ipr, ifname)
        except _pyroute2.load().NetlinkError as exc:
            if _code(exc) != errno.ENODEV:
                raise
    return _delete_pair(ipr, ifname)


def _delete_pair(ipr: Any, ifname: str) -> tuple[bool, bool]:
    links = {msg.get_attr("IFLA_IFNAME"): msg for msg in ipr.link("dump")}
    pod, ifb = links.get(ifname), links.get(ifb_name(ifname))
    if ifb is not None and not _is_ours(ipr, ifb, int(pod["index"]) if pod is not None else None):
        ifb = None
    if pod is None or ifb is None:
        done = []
        for msg in (pod, ifb):
            if msg is not None:
                _delete_announced(msg["index"])
            done.append(msg is not None)
        return done[0], done[1]
    used = {msg.get_attr("IFLA_GROUP") for msg in links.values()}
    group = next(g for g in range(_BATCH_GROUP_BASE, _BATCH_GROUP_BASE + len(used) + 1) if g not in used)
    for msg in (pod, ifb):
        ipr.link("set", index=msg["index"], group=group)
    try:
        dellink.delete({"group": group}, indexes=(pod["index"], ifb["index"]))
    except _pyroute2.load().NetlinkError as exc:
        if _code(exc) not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        for msg in (ifb, pod):  # a kernel without group deletion: one after the other, the
            _delete_link_index(ipr, msg["index"])  # ifb first (it left the mark's group above)
    return True, True


def read_shaping(netns: str, ifname: str) -> ShapeInfo | None:
    """The shaping installed on ``ifname`` in ``netns``, or None when there is none.

    Egress: the root tbf of ``ifname``. Ingress: the tbf of the device the ingress filter of
    ``ifname`` redirects to (reported only when that device exists and has a tbf), and
    whether that device is up (``ifb_up``). Rates
    and limits are the kernel's; bursts are computed back from tbf's buffer time (so they
    may differ from what was asked by a few bytes of rounding).

    Raises:
        ContainerUnknownError: (3) / InvalidEnvironmentError: (4) as :func:`apply_shaping`.
        NetlinkError: (102) the interface does not exist or a request failed.
    """
    validate_ifname(ifname)
    with (
        sockets.netns_iproute(netns) as ipr,
        _pyroute2.translated(f"read shaping of {ifname} in netns {netns}"),
    ):
        info = _read(ipr, ifname)
    if info is None:
        raise NetlinkError(f"failed to shape {ifname} in netns {netns}: no such interface")
    if info.egress is None and info.ingress is None and info.ifb is None:
        return None
    return info


def _read(ipr: Any, ifname: str) -> ShapeInfo | None:
    """The shaping of ``ifname`` from one dump of the namespace's links, one of its qdiscs
    and (when there is an ingress qdisc) one of its ingress filters; None: no such interface."""
    dump = list(ipr.link("dump"))
    names = {int(msg["index"]): msg.get_attr("IFLA_IFNAME") for msg in dump}
    up = {int(msg["index"]): bool(msg["flags"] & _IFF_UP) for msg in dump}
    idx = next((i for i, name in names.items() if name == ifname), None)
    if idx is None:
        return None
    ticks = psched_ticks_per_us()
    qdiscs = {(int(msg["index"]), int(msg["parent"])): msg for msg in ipr.get_qdiscs()}
    egress = _tbf_of(qdiscs.get((idx, _TC_H_ROOT)), ticks)
    ingress, ifb, ifb_up = None, None, None
    if (idx, _TC_H_INGRESS) in qdiscs:
        target = _redirect_target(ipr, idx)
        if target is not None and target in names:  # (not when the ifb device was deleted under the filter)
            ifb, ifb_up = names[target], up[target]
            ingress = _tbf_of(qdiscs.get((target, _TC_H_ROOT)), ticks)
    return ShapeInfo(ifname=ifname, egress=egress, ingress=ingress, ifb=ifb, ifb_up=ifb_up)


def remove_leaked_ifbs(netns_path: str) -> list[str]:
    """Delete the ifb devices in ``netns_path`` that shape no link any more; their names.

    Leaked: an ifb device cni-dra made (its mark, :data:`IFB_GROUP`) whose name follows
    :func:`ifb_name`'s rule (:func:`is_ifb_name`) while no link X of the namespace has
    ``ifb_name(X)`` equal to it and no link's ingress redirects to it (its link was deleted
    without it: a DEL whose record was lost). An ifb device of a live link stays (that
    link's DEL removes it), and so does one named otherwise or without the mark (not
    cni-dra's, or made before the mark: nothing tells it from someone else's). A missing
    netns is nothing to do.

    Raises:
        InvalidEnvironmentError: (4) ``netns_path`` is not a network namespace.
        NetlinkError: (102) the kernel refused a request.
    """
    return _in_pod_netns(netns_path, f"remove leaked ifb devices in netns {netns_path}", _remove_leaked, [])


def _remove_leaked(ipr: Any) -> list[str]:
    dump = list(ipr.link("dump"))
    links = {int(msg["index"]): msg.get_attr("IFLA_IFNAME") for msg in dump}
    ours = {
        int(msg["index"])
        for msg in dump
        if _link_kind(msg) == "ifb" and msg.get_attr("IFLA_GROUP") == IFB_GROUP
    }
    owned = set()
    for name in links.values():
        try:
            owned.add(ifb_name(name))
        except InvalidEnvironmentError:
            continue
    orphans = {i: n for i, n in links.items() if i in ours and is_ifb_name(n) and n not in owned}
    if not orphans:
        return []
    redirected = {
        _redirect_target(ipr, int(msg["index"]))
        for msg in ipr.get_qdiscs()
        if int(msg["parent"]) == _TC_H_INGRESS
    }
    removed = []
    for idx, name in sorted(orphans.items()):
        if idx not in redirected:
            _delete_link_index(ipr, idx)
            removed.append(name)
    return removed


_PROBE_RATE_BPS = 8_000_000


def probe_kernel() -> str | None:
    """The piece of shaping this kernel lacks, as ADD names it (``ifb``, ``the tbf qdisc``,
    ``the ingress qdisc, u32 classifier or mirred action``), or None when it has them all.

    Shapes ``lo`` of a throwaway network namespace (:func:`cni_dra.netlink.netns.new_netns`)
    both ways with :func:`apply_shaping`, as ADD shapes a pod interface: an ifb device with
    a tbf, a tbf on ``lo``, its ingress qdisc and u32 filter redirecting (mirred) to the ifb
    device. The namespace, and all of it with it, is gone when this returns. Costs a
    namespace and about ten requests: callers keep the answer (it holds until a reboot).

    Raises:
        IOFailureError: (5) no namespace can be made (no privilege).
        NetlinkError: (102) a request failed for another reason than a missing piece.
    """
    fd = netns.new_netns()
    try:
        apply_shaping(f"/proc/self/fd/{fd}", "lo", ShapeSpec.symmetric(_PROBE_RATE_BPS), new_link=True)
    except NetlinkError as exc:
        if exc.lacks is not None:
            return exc.lacks
        raise
    finally:
        os.close(fd)
    return None
