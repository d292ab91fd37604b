""":func:`cni_dra.netlink.shaping.probe_kernel` without a kernel: what it shapes and how it
names the piece the kernel lacks (STATUS asks it through the host port; the verbs' tests fake
the port, this fakes the netlink calls under it). netns_tests/test_shaping_leaks.py probes a
real kernel."""

from __future__ import annotations

import os

import pytest

from cni_dra.errors import IOFailureError, NetlinkError
from cni_dra.netlink import netns, shaping
from cni_dra.netlink.shaping import ShapeSpec


class Probe:
    def __init__(self) -> None:
        self.shaped: list[ShapeSpec] = []
        self.fail: list[Exception] = []


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Probe:
    """The throwaway namespace faked (a descriptor of /dev/null); what is shaped there."""
    seen = Probe()

    def apply(ns: str, ifname: str, spec: ShapeSpec, new_link: bool = False) -> None:
        assert ifname == "lo" and new_link and ns.startswith("/proc/self/fd/")
        seen.shaped.append(spec)
        if seen.fail:
            raise seen.fail[0]

    # A netlink-level unit test: the seams are the netlink functions under probe_kernel
    # (the verbs' tests use the host port above it instead).
    monkeypatch.setattr(netns, "new_netns", lambda: os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    monkeypatch.setattr(shaping, "apply_shaping", apply)
    return seen


def test_a_complete_kernel_is_shaped_both_ways_once(probe: Probe) -> None:
    assert shaping.probe_kernel() is None
    assert [(s.egress is not None, s.ingress is not None) for s in probe.shaped] == [(True, True)]


@pytest.mark.parametrize(
    "piece", ["ifb", "the tbf qdisc", "the ingress qdisc, u32 classifier or mirred action"]
)
def test_the_missing_piece_is_named(probe: Probe, piece: str) -> None:
    probe.fail.append(
        NetlinkError(f"failed to shape lo in netns /proc/self/fd/5: kernel lacks {piece}", lacks=piece)
    )
    assert shaping.probe_kernel() == piece


def test_another_netlink_failure_is_raised(probe: Probe) -> None:
    probe.fail.append(NetlinkError("failed to shape lo: boom"))
    with pytest.raises(NetlinkError, match="boom"):
        shaping.probe_kernel()


def test_no_namespace_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> int:
        raise IOFailureError("failed to create a network namespace: Operation not permitted")

    monkeypatch.setattr(netns, "new_netns", refused)  # netlink-level, as above
    with pytest.raises(IOFailureError, match="Operation not permitted"):
        shaping.probe_kernel()
