"""A pod-side link deletion is done when the kernel announces the link deleted, before the
kernel answers the request (cni_dra.netlink.dellink), in real namespaces.

The kernel answers RTM_DELLINK only after its RCU barrier (14-16 ms here); the tests hold
that answer back from cni-dra's socket for up to 10 s (:func:`held_answers`: the request
has run in the kernel, the link is deleted) and check that the deletion returns without
it, that the link is gone from the kernel's view (pyroute2's own socket), and that the
name can be taken again at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from cni_dra.netlink import _rtnl, dellink, shaping, sublink
from cni_dra.netlink.tbf import ShapeSpec
from netns_tests.bed import links_named

HOLD_S = 10.0
WAIT_S = 5.0


@dataclass
class Held:
    """The answers to RTM_DELLINK requests, held back until :attr:`release` is set."""

    release: threading.Event = field(default_factory=threading.Event)
    answered: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def held_answers(monkeypatch) -> Iterator[Held]:
    held = Held()
    real = _rtnl.Rtnl.link

    def link(self: _rtnl.Rtnl, command: str, **kw: Any) -> list[Any]:
        replies = real(self, command, **kw)  # the kernel has run the request
        if command == "del":
            held.release.wait(HOLD_S)
            held.answered.append(kw)
        return replies

    monkeypatch.setattr(_rtnl.Rtnl, "link", link)
    try:
        yield held
    finally:
        held.release.set()
        for thread in threading.enumerate():
            if thread.name == "cni-dra-dellink":
                thread.join(HOLD_S)


def in_thread(fn: Callable[[], Any]) -> Callable[[float], Any]:
    """Run ``fn`` in a thread now; the returned function waits at most its argument (s) for
    the value (AssertionError if it is not there by then) and returns it."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the waiter
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result(timeout_s: float) -> Any:
        thread.join(timeout_s)
        assert not thread.is_alive(), f"still waiting after {timeout_s} s"
        if "error" in out:
            raise out["error"]
        return out["value"]

    return result


def names(netns: str) -> set[str]:
    return {name for name, _ in links_named(netns)}


def test_delete_link_is_done_once_the_kernel_announces_the_link_deleted(
    make_netns, make_parent_nic, held_answers
) -> None:
    parent, pod = make_parent_nic(), make_netns()
    sublink.create_macvlan(parent=parent, netns=pod, ifname="eth0")
    assert in_thread(lambda: sublink.delete_link(pod, "eth0"))(WAIT_S) is True
    assert held_answers.answered == []  # the kernel's answer has not reached cni-dra yet
    assert names(pod) == {"lo"}
    # the name, and the parent's macvlan port, are free at once
    sublink.create_macvlan(parent=parent, netns=pod, ifname="eth0")
    assert names(pod) == {"lo", "eth0"}
    held_answers.release.set()
    assert in_thread(lambda: sublink.delete_link(pod, "eth0"))(WAIT_S) is True
    assert names(pod) == {"lo"}


def test_delete_shaped_link_is_done_once_the_kernel_announces_both_deleted(
    make_netns, make_parent_nic, held_answers
) -> None:
    parent, pod = make_parent_nic(), make_netns()
    sublink.create_macvlan(parent=parent, netns=pod, ifname="eth0")
    shaping.apply_shaping(pod, "eth0", ShapeSpec.symmetric(100_000_000))
    assert names(pod) == {"lo", "eth0", "ifb-eth0"}
    assert in_thread(lambda: shaping.delete_shaped_link(pod, "eth0"))(WAIT_S) == (True, True)
    assert held_answers.answered == []
    assert names(pod) == {"lo"}


def test_a_missing_link_is_answered_at_once(make_netns, held_answers) -> None:
    pod = make_netns()
    assert in_thread(lambda: sublink.delete_link(pod, "eth0"))(WAIT_S) is False  # ENODEV: no barrier


def test_past_the_helpers_bound_the_caller_waits_for_the_answer(
    make_netns, make_parent_nic, held_answers, monkeypatch
) -> None:
    parent, pod = make_parent_nic(), make_netns()
    sublink.create_macvlan(parent=parent, netns=pod, ifname="eth0")
    none_free = threading.BoundedSemaphore(1)
    none_free.acquire()
    monkeypatch.setattr(dellink, "_slots", none_free)
    result = in_thread(lambda: sublink.delete_link(pod, "eth0"))
    with pytest.raises(AssertionError, match="still waiting"):
        result(0.5)
    assert names(pod) == {"lo"}  # deleted, but not answered
    held_answers.release.set()
    assert result(WAIT_S) is True
    assert held_answers.answered == [{"ifname": "eth0"}]
