"""NIC health: what a link reading means, and the debounce that turns readings into
transitions (a fake clock: no sleeping), kept-then-dropped vanished NICs, the kubelet's
report."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_dra.agent.nichealth import NicHealth, health_reports, link_problem
from cni_dra.netlink.info import LinkInfo

T0_WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def info(*, admin_up: bool = True, operstate: str = "UP", carrier: bool = True) -> LinkInfo:
    return LinkInfo(
        name="ens2",
        index=7,
        kind="veth",
        mac="02:00:00:00:00:0b",
        mtu=1500,
        operstate=operstate,
        admin_up=admin_up,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
        carrier=carrier,
    )


@pytest.mark.parametrize(
    "reading, want",
    [
        (None, "missing"),
        (info(), None),
        (info(admin_up=False, operstate="DOWN", carrier=False), "admin-down"),
        (info(operstate="DOWN", carrier=False), "carrier-lost"),  # a NIC without cable
        (info(operstate="LOWERLAYERDOWN", carrier=False), "carrier-lost"),  # a veth whose peer is down
        (info(operstate="DORMANT", carrier=True), "carrier-lost"),
        (info(operstate="UNKNOWN", carrier=True), None),  # drivers without operstate (loopback, tun)
        (info(operstate="UNKNOWN", carrier=False), "carrier-lost"),
    ],
)
def test_link_problem(reading, want):
    assert link_problem(reading) == want


UP, DOWN, GONE = info(), info(admin_up=False, operstate="DOWN", carrier=False), None
NOCARRIER = info(operstate="LOWERLAYERDOWN", carrier=False)


class World:
    """A fake clock and host: ``links[ifname]`` is what the next reading sees."""

    def __init__(self, debounce_s: float = 5.0, keep_missing_s: float = 60.0) -> None:
        self.t = 100.0
        self.links: dict[str, LinkInfo | None] = {"ens1": UP, "ens2": UP}
        self.seen: list[tuple[str, str | None, bool]] = []
        self.health = NicHealth(
            lambda: [("eth-a", "ens1"), ("eth-b", "ens2")],
            self.links.get,
            debounce_s=debounce_s,
            keep_missing_s=keep_missing_s,
            clock=lambda: self.t,
            wall=lambda: T0_WALL + self.t,
            on_transition=lambda s, first: self.seen.append((s.device, s.problem, first)),
        )

    def at(self, t: float, **links: LinkInfo | None) -> list:
        self.t = t
        self.links.update(links)
        return self.health.observe()


def warnings_and_infos(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "cni_dra.agent.nichealth" and r.levelno >= logging.INFO
    ]


def test_first_reading_takes_effect_at_once_and_a_healthy_start_is_silent(caplog):
    w = World()
    w.links["ens2"] = NOCARRIER
    with caplog.at_level(logging.DEBUG, logger="cni_dra.agent.nichealth"):
        changed = w.at(100.0)
    assert [(s.device, s.problem) for s in changed] == [("eth-a", None), ("eth-b", "carrier-lost")]
    assert w.seen == [("eth-a", None, True), ("eth-b", "carrier-lost", True)]
    assert warnings_and_infos(caplog) == [
        "device eth-b: host NIC ens2 has no carrier (since 2027-01-15T08:01:40Z)"
    ]
    assert w.health.next_due() is None


def test_a_flap_shorter_than_the_debounce_changes_nothing(caplog):
    w = World(debounce_s=5.0)
    w.at(100.0)
    with caplog.at_level(logging.INFO, logger="cni_dra.agent.nichealth"):
        assert w.at(101.0, ens2=DOWN) == []
        assert w.health.next_due() == 106.0  # when the debounce of the pending change ends
        assert w.at(104.9, ens2=UP) == []  # back within 3.9 s
        assert w.health.next_due() is None
        assert w.at(110.0) == []  # nothing was pending any more
    assert warnings_and_infos(caplog) == []
    assert w.health.statuses()["eth-b"].problem is None
    assert w.seen == [("eth-a", None, True), ("eth-b", None, True)]


def test_a_change_that_lasts_is_one_transition_dated_when_first_seen(caplog):
    w = World(debounce_s=5.0)
    w.at(100.0)
    with caplog.at_level(logging.INFO, logger="cni_dra.agent.nichealth"):
        assert w.at(101.0, ens2=DOWN) == []
        assert w.at(103.0) == []  # still down, still within the debounce
        (st,) = w.at(106.0)  # 5 s after it was first seen down
        assert w.at(107.0) == [] and w.at(200.0) == []  # no repeats while it stays down
    assert (st.device, st.problem, st.since_s, st.since_wall_s) == (
        "eth-b",
        "admin-down",
        101.0,
        T0_WALL + 101.0,
    )
    assert st.unhealthy_since_wall_s == T0_WALL + 101.0
    assert warnings_and_infos(caplog) == [
        "device eth-b: host NIC ens2 is administratively down (since 2027-01-15T08:01:41Z)"
    ]
    assert w.seen[-1] == ("eth-b", "admin-down", False)
    # back up: one more transition (debounced the same way), logged once at info
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cni_dra.agent.nichealth"):
        assert w.at(300.0, ens2=UP) == []
        (back,) = w.at(305.0)
    assert (back.problem, back.unhealthy_since_wall_s, back.recovered_wall_s) == (None, None, T0_WALL + 300.0)
    assert warnings_and_infos(caplog) == [
        "device eth-b: host NIC ens2 is up again, after 199s unhealthy (admin-down)"
    ]


def test_another_reason_follows_after_the_debounce_and_keeps_the_time_it_turned_unhealthy():
    w = World(debounce_s=2.0)
    w.at(100.0)
    w.at(110.0, ens2=NOCARRIER)
    (st,) = w.at(112.0)
    assert st.problem == "carrier-lost"
    assert w.at(120.0, ens2=DOWN) == []
    (st,) = w.at(122.0)
    assert (st.problem, st.since_wall_s, st.unhealthy_since_wall_s) == (
        "admin-down",
        T0_WALL + 120.0,
        T0_WALL + 110.0,
    )
    # unhealthy, for a moment under another reason, then the first again: nothing happens
    w.at(130.0, ens2=NOCARRIER)
    assert w.at(131.0, ens2=DOWN) == []
    assert w.at(140.0) == []


def test_a_reason_that_changes_while_pending_counts_from_the_first_sighting():
    w = World(debounce_s=5.0)
    w.at(100.0)
    assert w.at(101.0, ens2=NOCARRIER) == []
    assert w.at(104.0, ens2=DOWN) == []
    (st,) = w.at(106.0)
    assert (st.problem, st.since_s) == ("admin-down", 101.0)


def test_a_vanished_nic_is_kept_then_dropped_and_remembered_after_it_returns():
    w = World(debounce_s=1.0, keep_missing_s=30.0)
    w.at(100.0)
    w.at(110.0, ens2=GONE)
    (st,) = w.at(111.0)
    assert (st.problem, st.missing_since_wall_s) == ("missing", T0_WALL + 110.0)
    assert w.health.next_due() == 140.0  # when it is dropped from the slice
    w.t = 139.9
    assert not w.health.statuses()["eth-b"].dropped
    w.t = 140.0
    assert w.health.statuses()["eth-b"].dropped
    assert not w.health.statuses()["eth-a"].dropped
    assert w.health.next_due() == 140.0  # due until the agent has looked again (and published)
    assert w.at(140.0) == []  # dropping is no transition
    assert w.health.next_due() is None  # dropped: nothing more to wake up for
    # re-created: healthy again after the debounce, not dropped, and it remembers it vanished
    w.at(200.0, ens2=UP)
    (back,) = w.at(201.0)
    assert (back.problem, back.dropped, back.missing_since_wall_s) == (None, False, T0_WALL + 110.0)
    assert not w.health.statuses()["eth-b"].dropped


def test_devices_follow_the_inventory():
    devices = [("eth-a", "ens1")]
    links = {"ens1": UP, "ens9": UP}
    h = NicHealth(lambda: devices, links.get, debounce_s=1.0, clock=lambda: 5.0, wall=lambda: T0_WALL)
    h.observe()
    devices[:] = [("eth-a", "ens9")]  # renamed in the inventory: a first reading again
    (st,) = h.observe()
    assert (st.device, st.ifname) == ("eth-a", "ens9")
    devices.clear()
    assert h.observe() == [] and h.statuses() == {}


def test_health_reports_for_the_kubelet():
    w = World(debounce_s=0.0)
    w.at(100.0, ens2=NOCARRIER)
    reports = health_reports("node-1", w.health.statuses())
    assert [(r.pool, r.device, r.healthy, r.message, r.updated_s) for r in reports] == [
        ("node-1", "eth-a", True, "host NIC ens1 is up", int(T0_WALL) + 100),
        (
            "node-1",
            "eth-b",
            False,
            "host NIC ens2 has no carrier (since 2027-01-15T08:01:40Z)",
            int(T0_WALL) + 100,
        ),
    ]


def test_negative_times_are_refused():
    with pytest.raises(ValueError):
        NicHealth(list, lambda n: None, debounce_s=-1)


readings = st.lists(
    st.tuples(st.floats(min_value=0.01, max_value=10.0), st.sampled_from([UP, DOWN, NOCARRIER, GONE])),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(readings, st.floats(min_value=0.5, max_value=5.0))
def test_readings_that_never_last_the_debounce_never_change_the_state(steps, debounce_s):
    """Whatever flaps, each shorter than the debounce before the NIC is back up: no transition."""
    w = World(debounce_s=debounce_s)
    w.at(0.0)
    t = 0.0
    for gap, reading in steps:
        gap = min(gap, debounce_s * 0.9)
        assert w.at(t + gap, ens2=reading) == []
        assert w.at(t + gap + debounce_s * 0.05, ens2=UP) == []
        t += gap + debounce_s * 0.05
    assert w.health.statuses()["eth-b"].problem is None


@settings(max_examples=200, deadline=None)
@given(readings, st.floats(min_value=0.5, max_value=5.0))
def test_after_a_stable_stretch_the_state_is_the_last_reading(steps, debounce_s):
    """However it flapped before, a reading that lasts the debounce is the state in effect,
    and every transition names a state the NIC was really read in."""
    w = World(debounce_s=debounce_s)
    w.at(0.0)
    t = 0.0
    for gap, reading in steps:
        t += gap
        for s in w.at(t, ens2=reading):
            assert s.problem in {link_problem(r) for _, r in steps}
    last = steps[-1][1] if steps else UP
    w.at(t + debounce_s + 1e-6)  # (t is a float sum: a hair more than the debounce)
    assert w.health.statuses()["eth-b"].problem == link_problem(last)
    flips = sum(
        1
        for a, b in zip(
            [None] + [link_problem(r) for _, r in steps], [link_problem(r) for _, r in steps], strict=False
        )
        if a != b
    )
    assert len([x for x in w.seen if x[0] == "eth-b" and not x[2]]) <= flips
