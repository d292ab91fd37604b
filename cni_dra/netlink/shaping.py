"""Traffic control on a pod interface: tbf for egress, an ifb device shaped by tbf for ingress.

The shape (the reference CNI ``bandwidth`` plugin's, applied to cni-dra's sub-links inside
the pod's namespace):

* **egress** (pod -> network): a root ``tbf`` qdisc (handle ``1:``) on the pod interface;
* **ingress** (network -> pod): an ``ingress`` qdisc (``ffff:``) on the pod interface whose
  u32 match-all filter (priority 1, every protocol) redirects each packet with the
  ``mirred`` action (egress redirect) to an ifb device in the pod's namespace
  (:func:`ifb_name`); the ifb device's root ``tbf`` shapes it, then it is delivered.

:class:`ShapeSpec` says what to install; :class:`Tbf` is one direction's token bucket (rate,
burst, queue limit), with the defaults computed by :meth:`Tbf.for_rate`.
:func:`apply_shaping` installs a spec (replacing whatever shaping was there),
:func:`remove_shaping` removes it, :func:`delete_shaped_link` deletes the pod interface and
its ifb device in one go, :func:`read_shaping` reads back what the kernel holds.
:func:`remove_leaked_ifbs` deletes the ifb devices of a namespace that shape no link any
more; :func:`probe_kernel` says which piece of all this the kernel lacks.
Every call runs inside the pod's namespace on a socket opened there for the call
(:func:`cni_dra.netlink.sockets.netns_iproute`); nothing runs ``tc`` or ``ip``.

Errors (cni-dra codes in :mod:`cni_dra.errors`):

* :class:`~cni_dra.errors.InvalidConfigError` (7): a spec that is not valid (rates, bursts,
  limits out of range), raised when it is built;
* :class:`~cni_dra.errors.ContainerUnknownError` (3) /
  :class:`~cni_dra.errors.InvalidEnvironmentError` (4): the netns is missing / not a netns
  (:func:`apply_shaping`, :func:`read_shaping`; :func:`remove_shaping` treats a missing
  netns as done), or ``ifname`` is not a valid interface name;
* :class:`~cni_dra.errors.NetlinkError` (102): the interface does not exist, the kernel
  lacks a piece (``kernel lacks ifb``, ``kernel lacks the tbf qdisc``...), the ifb name is
  taken by another kind of link, or another request failed.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from cni_dra.errors import ContainerUnknownError, InvalidConfigError, InvalidEnvironmentError, NetlinkError
from cni_dra.iface import validate_ifname
from cni_dra.netlink import _pyroute2, netns, sockets
from cni_dra.netlink.netns import netns_exists

__all__ = [
    "DEFAULT_LATENCY_S",
    "BURST_WINDOW_S",
    "MIN_BURST_BYTES",
    "MAX_RATE_BPS",
    "IFB_PREFIX",
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

DEFAULT_LATENCY_S = 0.025
"""Longest a packet may wait in a tbf queue by default (the reference bandwidth plugin's 25 ms)."""
BURST_WINDOW_S = 0.002
"""Default burst: the bytes the rate sends in this long (2 ms), at least :data:`MIN_BURST_BYTES`."""
MIN_BURST_BYTES = 2 * 65536
"""Default burst floor: two 64 KiB TSO/GRO packets (one must fit or tbf segments or drops it)."""
MAX_RATE_BPS = 8 * (2**32 - 1)
"""tbf's 32-bit rate field holds bytes per second: about 34.36 Gbit/s."""
IFB_PREFIX = "ifb-"
_HASHED_IFB_PREFIX = "ifb"
_IFNAMSIZ = 15

_TC_H_ROOT = 0xFFFFFFFF
_TC_H_INGRESS = 0xFFFFFFF1
_TBF_HANDLE = 0x10000  # 1:
_INGRESS_HANDLE = 0xFFFF0000  # ffff:
_FILTER_PRIO = 1
_FILTER_CLASSID = 0x10001  # 1:1, as tc and the reference plugin set it; unused by a redirect
_ETH_P_ALL = 0x0003
_TIME_UNITS_PER_SEC = 1_000_000
_MAX_U32 = 2**32 - 1


def _positive_int(value: object, what: str, maximum: int = _MAX_U32) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= maximum:
        raise InvalidConfigError(f"invalid shaping: {what} {value!r} is not an integer in [1, {maximum}]")
    return value


@dataclass(frozen=True)
class Tbf:
    """One token bucket: ``rate_bps`` (bits per second), ``burst_bytes`` (bucket size),
    ``limit_bytes`` (queue length). Built with :meth:`for_rate`; read back as the kernel holds it."""

    rate_bps: int
    burst_bytes: int
    limit_bytes: int

    @classmethod
    def for_rate(cls, rate_bps: int, burst_bytes: int | None = None,
                 latency_s: float = DEFAULT_LATENCY_S) -> Tbf:
        """A bucket for ``rate_bps`` with the defaults below. Raises InvalidConfigError (7).

        * ``burst_bytes`` (None: default) = max(⌈rate_bps / 8 × :data:`BURST_WINDOW_S`⌉,
          :data:`MIN_BURST_BYTES`). The bucket must hold the largest packet the stack
          hands to the qdisc (a 64 KiB TSO/GRO aggregate, else tbf segments or drops it)
          and refill for longer than the timer's granularity, so that bulk TCP is not
          held below the rate; the larger the bucket, the more a sender may exceed the rate
          for one burst: at most ``burst_bytes`` once per idle period, under 1 % of 3 s at
          100 Mbit/s.
        * ``limit_bytes`` = ⌈rate_bps / 8 × ``latency_s``⌉ + ``burst_bytes``: the bytes that
          wait at most ``latency_s`` (default :data:`DEFAULT_LATENCY_S`, 25 ms) behind a full
          bucket: the reference bandwidth plugin's choice, enough queue for TCP to keep the
          link busy without the delay of a deep buffer.

        ``rate_bps`` is rounded down to whole bytes per second (what tbf stores).
        """
        rate_bps = _positive_int(rate_bps, "rate", MAX_RATE_BPS)
        if rate_bps < 8:
            raise InvalidConfigError(f"invalid shaping: rate {rate_bps} is below 8 bit/s (one byte per second)")
        rate_Bps = rate_bps // 8  # noqa: N806 - bytes, not bits
        if burst_bytes is None:
            burst_bytes = max(math.ceil(rate_Bps * BURST_WINDOW_S), MIN_BURST_BYTES)
        burst_bytes = _positive_int(burst_bytes, "burst")
        if isinstance(latency_s, bool) or not isinstance(latency_s, (int, float)) or not 0 < latency_s <= 10:
            raise InvalidConfigError(f"invalid shaping: latency {latency_s!r} s is not in (0, 10]")
        limit_bytes = math.ceil(rate_Bps * latency_s) + burst_bytes
        if limit_bytes > _MAX_U32:
            raise InvalidConfigError(f"invalid shaping: queue limit {limit_bytes} bytes is above 2**32-1")
        return cls(rate_bps=rate_Bps * 8, burst_bytes=burst_bytes, limit_bytes=limit_bytes)


@dataclass(frozen=True)
class ShapeSpec:
    """What to shape: each direction's rate in bits per second (None: that direction unshaped),
    its burst in bytes (None: :meth:`Tbf.for_rate`'s default), and the queue latency.

    Egress is what the pod sends, ingress what it receives. Building one validates it and
    raises InvalidConfigError (7); :attr:`egress` / :attr:`ingress` are the resulting buckets.
    """

    egress_rate_bps: int | None = None
    egress_burst_bytes: int | None = None
    ingress_rate_bps: int | None = None
    ingress_burst_bytes: int | None = None
    latency_s: float = DEFAULT_LATENCY_S

    def __post_init__(self) -> None:
        for direction in ("egress", "ingress"):
            if getattr(self, f"{direction}_rate_bps") is None and getattr(self, f"{direction}_burst_bytes") is not None:
                raise InvalidConfigError(f"invalid shaping: {direction} burst without an {direction} rate")
        self.egress  # noqa: B018 - validates
        self.ingress  # noqa: B018

    @property
    def egress(self) -> Tbf | None:
        """The egress bucket, or None."""
        if self.egress_rate_bps is None:
            return None
        return Tbf.for_rate(self.egress_rate_bps, self.egress_burst_bytes, self.latency_s)

    @property
    def ingress(self) -> Tbf | None:
        """The ingress bucket, or None."""
        if self.ingress_rate_bps is None:
            return None
        return Tbf.for_rate(self.ingress_rate_bps, self.ingress_burst_bytes, self.latency_s)

    @classmethod
    def symmetric(cls, rate_bps: int, burst_bytes: int | None = None) -> ShapeSpec:
        """Both directions at ``rate_bps``."""
        return cls(egress_rate_bps=rate_bps, egress_burst_bytes=burst_bytes,
                   ingress_rate_bps=rate_bps, ingress_burst_bytes=burst_bytes)


@dataclass(frozen=True)
class ShapeInfo:
    """Shaping installed on ``ifname``: each direction's bucket as the kernel holds it (None:
    not shaped), and the ifb device ingress goes through (None: none)."""

    ifname: str
    egress: Tbf | None
    ingress: Tbf | None
    ifb: str | None


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
    return _HASHED_IFB_PREFIX + hashlib.sha256(ifname.encode()).hexdigest()[:_IFNAMSIZ - len(_HASHED_IFB_PREFIX)]


_HASHED_IFB = re.compile(r"ifb[0-9a-f]{12}")


def is_ifb_name(name: str) -> bool:
    """True when ``name`` is one :func:`ifb_name` gives (either form) for some interface name."""
    if _HASHED_IFB.fullmatch(name):
        return True
    if not name.startswith(IFB_PREFIX):
        return False
    try:
        return ifb_name(name[len(IFB_PREFIX):]) == name
    except InvalidEnvironmentError:
        return False


def burst_from_buffer(buffer_ticks: int, rate_bps: int, ticks_per_us: float) -> int:
    """The burst in bytes that a tbf ``buffer`` (its transmit time at ``rate_bps``, in
    scheduler ticks of ``ticks_per_us`` per microsecond) stands for, rounded to the nearest byte."""
    return round(buffer_ticks / ticks_per_us / _TIME_UNITS_PER_SEC * rate_bps / 8)


def psched_ticks_per_us() -> float:
    """Packet scheduler ticks per microsecond (``/proc/net/psched``, as tc computes it)."""
    with open("/proc/net/psched", encoding="ascii") as f:
        t2us, us2t, clock_res, _ = (int(x, 16) for x in f.read().split())
    return t2us / us2t * (clock_res / _TIME_UNITS_PER_SEC)


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
    ipr.tc("replace", "tbf", index, _TBF_HANDLE, parent=_TC_H_ROOT, rate=tbf.rate_bps // 8,
           burst=tbf.burst_bytes, limit=tbf.limit_bytes)


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


def _kernel_lacks(exc: BaseException, piece: str, what: str) -> NetlinkError:
    """``failed to <what>: kernel lacks <piece>`` (``lacks`` set to ``piece``, one of
    :data:`KERNEL_PIECES`) for 'unknown kind' answers, else the cause."""
    if _code(exc) in (errno.EOPNOTSUPP, errno.ENOENT, errno.EPROTONOSUPPORT):
        return NetlinkError(f"failed to {what}: kernel lacks {piece}", details=repr(exc), lacks=piece)
    return _pyroute2.nl_error(what, exc)


def _ensure_ifb(ipr: Any, netns: str, ifname: str, mtu: int) -> tuple[int, bool]:
    """The ifb device of ``ifname``, made if missing and up with ``mtu``; (index, made here).

    Made (up, with its MTU) in one request; only when the name exists already is it checked
    to be an ifb device and set up."""
    name = ifb_name(ifname)
    what = f"create ifb device {name} in netns {netns}"
    try:
        ipr.link("add", ifname=name, kind="ifb", mtu=mtu, state="up")
        made = True
    except _pyroute2.load().NetlinkError as exc:
        if _code(exc) != errno.EEXIST:
            raise _kernel_lacks(exc, LACKS_IFB, what) from exc
        made = False
    idx = _link_index(ipr, name)
    if idx is None:  # pragma: no cover - removed under us
        raise NetlinkError(f"failed to {what}: it vanished after creation")
    if made:
        return idx, True
    msgs = ipr.get_links(idx)
    if not msgs or _link_kind(msgs[0]) != "ifb":
        raise NetlinkError(f"failed to {what}: {name} exists and is not an ifb device")
    with _pyroute2.translated(f"bring ifb device {name} up in netns {netns}"):
        ipr.link("set", index=idx, mtu=mtu, state="up")
    return idx, False


def _add_redirect(ipr: Any, pod_idx: int, ifb_idx: int) -> None:
    """Ingress qdisc on the pod interface, and its u32 match-all filter redirecting to the ifb."""
    ipr.tc("add", "ingress", pod_idx, _INGRESS_HANDLE)
    ipr.tc("add-filter", "u32", pod_idx, parent=_INGRESS_HANDLE, prio=_FILTER_PRIO, protocol=_ETH_P_ALL,
           target=_FILTER_CLASSID, keys=["0x0/0x0+0"], action=dict(kind="mirred", direction="egress", action="redirect", ifindex=ifb_idx))


def _remove_all(ipr: Any, ifname: str) -> bool:
    """Remove every piece of shaping of ``ifname`` in the socket's namespace; missing is fine.
    True when something was removed."""
    removed = False
    idx = _link_index(ipr, ifname)
    if idx is not None:
        removed = _delete_qdisc(ipr, idx, _TC_H_INGRESS, "ingress")
        removed = _delete_qdisc(ipr, idx, _TC_H_ROOT, "tbf") or removed
    return _remove_ifb(ipr, ifname) or removed


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
        NetlinkError: (102) ``failed to shape <ifname> in netns <netns>: ...``; the interface does
            not exist, the kernel lacks ifb or tbf (``kernel lacks ifb``), a link of another kind
            holds the ifb name, or the kernel refused a request.
    """
    validate_ifname(ifname)
    egress, ingress = spec.egress, spec.ingress
    with sockets.netns_iproute(netns) as ipr:
        pod_idx, mtu = _pod_link(ipr, netns, ifname)
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
            return ShapeInfo(ifname=ifname, egress=egress, ingress=ingress,
                             ifb=ifb_name(ifname) if ingress is not None else None)
        with _pyroute2.translated(f"read shaping of {ifname} in netns {netns}"):
            return _read(ipr, ifname) or ShapeInfo(ifname=ifname, egress=None, ingress=None, ifb=None)


def _apply(ipr: Any, netns: str, ifname: str, pod_idx: int, mtu: int, egress: Tbf | None, ingress: Tbf | None,
           new_link: bool) -> None:
    where = f"{ifname} in netns {netns}"
    if egress is not None:
        try:
            _replace_tbf(ipr, pod_idx, egress)
        except (OSError, _pyroute2.load().NetlinkError) as exc:
            raise _kernel_lacks(exc, LACKS_TBF, f"shape egress of {where}") from exc
    elif not new_link:
        with _pyroute2.translated(f"remove egress shaping of {where}"):
            _delete_qdisc(ipr, pod_idx, _TC_H_ROOT, "tbf")
    if not new_link:
        with _pyroute2.translated(f"remove ingress shaping of {where}"):
            _delete_qdisc(ipr, pod_idx, _TC_H_INGRESS, "ingress")  # its filter goes with it
    if ingress is None:
        if not new_link:
            with _pyroute2.translated(f"remove ifb device {ifb_name(ifname)} in netns {netns}"):
                _remove_ifb(ipr, ifname)
        return
    ifb_idx, _ = _ensure_ifb(ipr, netns, ifname, mtu)
    try:
        _replace_tbf(ipr, ifb_idx, ingress)
    except (OSError, _pyroute2.load().NetlinkError) as exc:
        raise _kernel_lacks(exc, LACKS_TBF, f"shape ingress of {where}") from exc
    try:
        _add_redirect(ipr, pod_idx, ifb_idx)
    except (OSError, _pyroute2.load().NetlinkError) as exc:
        raise _kernel_lacks(exc, LACKS_REDIRECT,
                            f"redirect ingress of {where} to {ifb_name(ifname)}") from exc


def _remove_ifb(ipr: Any, ifname: str) -> bool:
    idx = _link_index(ipr, ifb_name(ifname))
    if idx is not None:
        msgs = ipr.get_links(idx)
        if msgs and _link_kind(msgs[0]) == "ifb":
            _delete_link_index(ipr, idx)
            return True
    return False


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
    of another kind that holds the ifb name is left alone. Returns True when something was
    removed (an ifb device left behind by a link deleted before it, for instance).

    Raises:
        InvalidEnvironmentError: (4) ``ifname`` is invalid or ``netns`` is not a network namespace.
        NetlinkError: (102) the kernel refused a request.
    """
    validate_ifname(ifname)
    return _in_pod_netns(netns, f"remove shaping of {ifname} in netns {netns}",
                         lambda ipr: _remove_all(ipr, ifname), False)


_BATCH_GROUP_BASE = 0x7CD40000  # netdev groups tried for a batched deletion (any unused one does)


def delete_shaped_link(netns: str, ifname: str) -> tuple[bool, bool]:
    """Delete the pod interface ``ifname`` in ``netns`` together with its ifb device; returns
    (interface deleted, ifb device deleted). Idempotent as :func:`remove_shaping` (a missing
    netns, interface or device is success; a link of another kind that holds the ifb name is
    left alone).

    Why together: a link deletion is mostly the kernel's unregistration (RCU grace periods,
    tens of ms on a busy node), and deleting the two one after the other pays it twice.
    Both are moved into a netdev group no other link of the namespace uses and deleted with
    one RTM_DELLINK naming the group, which the kernel unregisters as one batch. The
    interface's qdiscs and the redirect go with it.

    Raises:
        InvalidEnvironmentError: (4) ``ifname`` is invalid or ``netns`` is not a network namespace.
        NetlinkError: (102) the kernel refused a request.
    """
    validate_ifname(ifname)
    return _in_pod_netns(netns, f"delete link {ifname} and its ifb device in netns {netns}",
                         lambda ipr: _delete_pair(ipr, ifname), (False, False))


def _delete_pair(ipr: Any, ifname: str) -> tuple[bool, bool]:
    links = {msg.get_attr("IFLA_IFNAME"): msg for msg in ipr.link("dump")}
    pod, ifb = links.get(ifname), links.get(ifb_name(ifname))
    if ifb is not None and _link_kind(ifb) != "ifb":
        ifb = None
    if pod is None or ifb is None:
        done = []
        for msg in (pod, ifb):
            if msg is not None:
                _delete_link_index(ipr, msg["index"])
            done.append(msg is not None)
        return done[0], done[1]
    used = {msg.get_attr("IFLA_GROUP") for msg in links.values()}
    group = next(g for g in range(_BATCH_GROUP_BASE, _BATCH_GROUP_BASE + len(used) + 1) if g not in used)
    for msg in (pod, ifb):
        ipr.link("set", index=msg["index"], group=group)
    try:
        ipr.link("del", group=group)
    except _pyroute2.load().NetlinkError as exc:
        if _code(exc) not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        for msg in (pod, ifb):  # a kernel without group deletion: one after the other
            _delete_link_index(ipr, msg["index"])
    return True, True


def read_shaping(netns: str, ifname: str) -> ShapeInfo | None:
    """The shaping installed on ``ifname`` in ``netns``, or None when there is none.

    Egress: the root tbf of ``ifname``. Ingress: the tbf of the device the ingress filter of
    ``ifname`` redirects to (reported only when that device exists and has a tbf). Rates
    and limits are the kernel's; bursts are computed back from tbf's buffer time (so they
    may differ from what was asked by a few bytes of rounding).

    Raises:
        ContainerUnknownError: (3) / InvalidEnvironmentError: (4) as :func:`apply_shaping`.
        NetlinkError: (102) the interface does not exist or a request failed.
    """
    validate_ifname(ifname)
    with sockets.netns_iproute(netns) as ipr, _pyroute2.translated(f"read shaping of {ifname} in netns {netns}"):
        info = _read(ipr, ifname)
    if info is None:
        raise NetlinkError(f"failed to shape {ifname} in netns {netns}: no such interface")
    if info.egress is None and info.ingress is None and info.ifb is None:
        return None
    return info


def _read(ipr: Any, ifname: str) -> ShapeInfo | None:
    """The shaping of ``ifname`` from one dump of the namespace's links, one of its qdiscs
    and (when there is an ingress qdisc) one of its ingress filters; None: no such interface."""
    names = {int(msg["index"]): msg.get_attr("IFLA_IFNAME") for msg in ipr.link("dump")}
    idx = next((i for i, name in names.items() if name == ifname), None)
    if idx is None:
        return None
    ticks = psched_ticks_per_us()
    qdiscs = {(int(msg["index"]), int(msg["parent"])): msg for msg in ipr.get_qdiscs()}
    egress = _tbf_of(qdiscs.get((idx, _TC_H_ROOT)), ticks)
    ingress, ifb = None, None
    if (idx, _TC_H_INGRESS) in qdiscs:
        target = _redirect_target(ipr, idx)
        if target is not None and target in names:  # (not when the ifb device was deleted under the filter)
            ifb = names[target]
            ingress = _tbf_of(qdiscs.get((target, _TC_H_ROOT)), ticks)
    return ShapeInfo(ifname=ifname, egress=egress, ingress=ingress, ifb=ifb)


def remove_leaked_ifbs(netns_path: str) -> list[str]:
    """Delete the ifb devices in ``netns_path`` that shape no link any more; their names.

    Leaked: an ifb device whose name follows :func:`ifb_name`'s rule (:func:`is_ifb_name`)
    while no link X of the namespace has ``ifb_name(X)`` equal to it and no link's ingress
    redirects to it (its link was deleted without it: a DEL whose record was lost).
    An ifb device of a live link stays (that link's DEL removes it), and so does one named
    otherwise (not cni-dra's). A missing netns is nothing to do.

    Raises:
        InvalidEnvironmentError: (4) ``netns_path`` is not a network namespace.
        NetlinkError: (102) the kernel refused a request.
    """
    return _in_pod_netns(netns_path, f"remove leaked ifb devices in netns {netns_path}", _remove_leaked, [])


def _remove_leaked(ipr: Any) -> list[str]:
    dump = list(ipr.link("dump"))
    links = {int(msg["index"]): msg.get_attr("IFLA_IFNAME") for msg in dump}
    kinds = {int(msg["index"]): _link_kind(msg) for msg in dump}
    owned = set()
    for name in links.values():
        try:
            owned.add(ifb_name(name))
        except InvalidEnvironmentError:
            continue
    orphans = {i: n for i, n in links.items() if kinds.get(i) == "ifb" and is_ifb_name(n) and n not in owned}
    if not orphans:
        return []
    redirected = {_redirect_target(ipr, int(msg["index"])) for msg in ipr.get_qdiscs()
                  if int(msg["parent"]) == _TC_H_INGRESS}
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
