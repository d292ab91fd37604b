"""NIC health: each published NIC's link state, debounced into transitions.

For every device of the inventory the agent reads its host interface (``ifName``) and
judges it (:func:`link_problem`):

* ``missing``: no such interface;
* ``admin-down``: the interface is set down (``ip link set … down``);
* ``carrier-lost``: it is up but passes no traffic: operstate other than ``UP`` (``DOWN``
  without carrier, ``LOWERLAYERDOWN`` for a veth whose peer is down, ``DORMANT``...),
  except ``UNKNOWN`` with the carrier bit set (drivers that report no operstate);
* healthy (None) otherwise.

A change takes effect only after it has lasted ``debounce_s`` (:class:`NicHealth`): a flap
shorter than that changes nothing, not even a log line; a longer one is one transition,
logged once (warning when the NIC turns unhealthy, info when it is healthy again), dated
from the moment the change was first seen. The first reading of a device (agent start,
a device added to the inventory) takes effect at once. Between two unhealthy reasons the
reason follows after ``debounce_s`` too, and the time the NIC turned unhealthy stays.

What the agent does with it: taints in the ResourceSlice (:mod:`cni_dra.agent.publisher`;
a ``missing`` NIC is kept, tainted, for ``keep_missing_s`` and then left out), the kubelet's
resource health stream (:func:`health_reports`), ``Ready`` conditions in claim statuses
(:mod:`cni_dra.agent.status_writer`) and metrics. The tracker is used from the agent's main loop
only (not thread-safe); readings come from ``link(ifName)``, a seam for tests
(:func:`cni_dra.netlink.info.host_link` in the agent).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cni_dra.k8s.dra_health import DeviceHealth

if TYPE_CHECKING:
    from cni_dra.netlink.info import LinkInfo

__all__ = ["PROBLEMS", "NicStatus", "NicHealth", "link_problem", "health_reports", "describe", "rfc3339"]

log = logging.getLogger("cni_dra.agent.nichealth")

PROBLEMS = ("missing", "admin-down", "carrier-lost")
"""The reasons a NIC is unhealthy (also the value of its device taint)."""


def link_problem(info: LinkInfo | None) -> str | None:
    """What is wrong with a host interface as rtnetlink reports it (``None``: absent), or
    None when it can pass traffic. See the module docstring."""
    if info is None:
        return "missing"
    if not info.admin_up:
        return "admin-down"
    if info.operstate == "UP" or (info.operstate == "UNKNOWN" and info.carrier):
        return None
    return "carrier-lost"


def rfc3339(wall_s: float) -> str:
    """Unix seconds as RFC 3339 UTC, whole seconds (``2026-12-01T10:00:00Z``)."""
    return datetime.datetime.fromtimestamp(int(wall_s), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_WHAT = {
    "missing": "does not exist",
    "admin-down": "is administratively down",
    "carrier-lost": "has no carrier",
}


@dataclass(frozen=True)
class NicStatus:
    """One device's NIC health in effect (debounced).

    ``problem``: None (healthy) or one of :data:`PROBLEMS`; ``since_s`` / ``since_wall_s``:
    when this state began (monotonic / Unix seconds); ``unhealthy_since_wall_s``: when the
    NIC turned unhealthy (kept while the reason changes; None when healthy);
    ``missing_since_wall_s``: when it last vanished (kept after it came back: the pods'
    links went with it), None if it never did while this agent ran;
    ``recovered_wall_s``: when it last turned healthy again (None: healthy since its first
    reading, or not healthy); ``dropped``: missing for longer than the agent keeps it in
    the slice.
    """

    device: str
    ifname: str
    problem: str | None
    since_s: float
    since_wall_s: float
    unhealthy_since_wall_s: float | None = None
    missing_since_wall_s: float | None = None
    recovered_wall_s: float | None = None
    dropped: bool = False

    @property
    def healthy(self) -> bool:
        return self.problem is None


def describe(st: NicStatus) -> str:
    """A sentence on ``st`` for the kubelet's pod status and claim conditions."""
    if st.problem is None:
        return f"host NIC {st.ifname} is up"
    return f"host NIC {st.ifname} {_WHAT[st.problem]} (since {rfc3339(st.unhealthy_since_wall_s or st.since_wall_s)})"


@dataclass
class _Pending:
    problem: str | None
    since_s: float
    since_wall_s: float


class NicHealth:
    """Debounced health of the inventory's NICs.

    ``devices()``: (device, ifName) pairs to track (re-read at each :meth:`observe`);
    ``link(ifName)``: the host link or None; ``debounce_s``: how long a change must last;
    ``keep_missing_s``: how long a vanished NIC stays in the slice; ``clock`` / ``wall``:
    monotonic and Unix seconds (tests pass fakes); ``on_transition(status, first)``: called
    for every state that takes effect (``first``: the device's first reading).
    """

    def __init__(
        self,
        devices: Callable[[], Iterable[tuple[str, str]]],
        link: Callable[[str], LinkInfo | None],
        *,
        debounce_s: float = 5.0,
        keep_missing_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_transition: Callable[[NicStatus, bool], None] = lambda status, first: None,
    ) -> None:
        if debounce_s < 0 or keep_missing_s < 0:
            raise ValueError("debounce and keep times must not be negative")
        self.devices = devices
        self.link = link
        self.debounce_s = debounce_s
        self.keep_missing_s = keep_missing_s
        self.clock = clock
        self.wall = wall
        self.on_transition = on_transition
        self._status: dict[str, NicStatus] = {}
        self._pending: dict[str, _Pending] = {}
        self._observed_s = float("-inf")  # the clock at the last observe()

    def observe(self) -> list[NicStatus]:
        """Read every NIC once; returns the states that took effect now (transitions, and
        first readings). Raises what ``devices()`` and ``link()`` raise."""
        now, wall = self.clock(), self.wall()
        self._observed_s = now
        wanted = dict(self.devices())
        for gone in set(self._status) - set(wanted):
            self._status.pop(gone)
            self._pending.pop(gone, None)
        changed = []
        for device, ifname in wanted.items():
            raw = link_problem(self.link(ifname))
            st = self._status.get(device)
            if st is None or st.ifname != ifname:
                st = self._first(device, ifname, raw, now, wall)
                changed.append(st)
                self.on_transition(st, True)
                continue
            new = self._step(st, raw, now, wall)
            if new is not None:
                changed.append(new)
                self.on_transition(new, False)
        return changed

    def _first(self, device: str, ifname: str, raw: str | None, now: float, wall: float) -> NicStatus:
        self._pending.pop(device, None)
        st = NicStatus(
            device,
            ifname,
            raw,
            now,
            wall,
            unhealthy_since_wall_s=None if raw is None else wall,
            missing_since_wall_s=wall if raw == "missing" else None,
        )
        self._status[device] = st
        if raw is not None:
            log.warning("device %s: %s", device, describe(st))
        return st

    def _step(self, st: NicStatus, raw: str | None, now: float, wall: float) -> NicStatus | None:
        """Feed one reading to a known device; the new status when a change took effect."""
        device = st.device
        if raw == st.problem:
            if device in self._pending:
                log.debug(
                    "device %s: ignored a flap of %s shorter than %.1fs", device, st.ifname, self.debounce_s
                )
            self._pending.pop(device, None)
            return None
        pend = self._pending.get(device)
        if pend is None or (pend.problem is None) != (raw is None):
            pend = self._pending[device] = _Pending(raw, now, wall)
        else:
            pend.problem = raw  # same direction, another reason: the first sighting counts
        if now - pend.since_s < self.debounce_s:
            return None
        del self._pending[device]
        unhealthy = None if raw is None else (st.unhealthy_since_wall_s or pend.since_wall_s)
        missing = pend.since_wall_s if raw == "missing" else st.missing_since_wall_s
        new = NicStatus(
            device,
            st.ifname,
            raw,
            pend.since_s,
            pend.since_wall_s,
            unhealthy,
            missing,
            recovered_wall_s=pend.since_wall_s if raw is None else None,
        )
        self._status[device] = new
        if raw is None:
            log.info(
                "device %s: %s again, after %.0fs unhealthy (%s)",
                device,
                describe(new),
                pend.since_wall_s - (st.unhealthy_since_wall_s or pend.since_wall_s),
                st.problem,
            )
        else:
            log.warning("device %s: %s", device, describe(new))
        return new

    def statuses(self) -> dict[str, NicStatus]:
        """Every tracked device's status now (``dropped`` computed at the current clock)."""
        now = self.clock()
        return {
            d: replace(st, dropped=st.problem == "missing" and now - st.since_s >= self.keep_missing_s)
            for d, st in self._status.items()
        }

    def next_due(self) -> float | None:
        """The monotonic time at which something changes without a new link event: a
        pending change's debounce ends, or a missing NIC is to be dropped (until the next
        :meth:`observe` after that). None: nothing."""
        times = [p.since_s + self.debounce_s for p in self._pending.values()]
        times += [
            st.since_s + self.keep_missing_s
            for st in self._status.values()
            if st.problem == "missing" and st.since_s + self.keep_missing_s > self._observed_s
        ]
        return min(times) if times else None


def health_reports(pool: str, statuses: Mapping[str, NicStatus]) -> list[DeviceHealth]:
    """The kubelet's report: one entry per device of ``pool``, sorted by name."""
    return [
        DeviceHealth(
            pool=pool, device=d, healthy=st.healthy, message=describe(st), updated_s=int(st.since_wall_s)
        )
        for d, st in sorted(statuses.items())
    ]
