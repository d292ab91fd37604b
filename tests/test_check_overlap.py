"""CHECK runs the IPAM plugin's CHECK while it verifies the link; errors keep their order."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from cni_dra import ipam
from cni_dra.errors import CheckFailedError, IpamError
from cni_dra.netlink import info
from cni_dra.netlink.info import LinkInfo
from cni_dra.verbs import check

NETNS = "/var/run/netns/pod-1"
MAC = "02:00:00:00:00:07"


def _inv() -> Any:
    prev = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "mac": MAC, "sandbox": NETNS}],
        "ips": [{"address": "10.0.0.7/24", "interface": 0}],
    }
    att = SimpleNamespace(
        phase="ready",
        linkType="macvlan",
        parent="nic0",
        device="nic-a",
        netns=NETNS,
        shaping=None,
        netnsIdentity=None,
        profile=None,
    )
    store = SimpleNamespace(read=lambda: SimpleNamespace(find=lambda *key: att))
    return SimpleNamespace(
        env=SimpleNamespace(ifname="eth0", container_id="c1", netns=NETNS, path=["/opt/cni/bin"]),
        conf=SimpleNamespace(
            prevResult=prev,
            cniVersion="1.1.0",
            name="net1",
            ipam_type="host-local",
            mode="bridge",
            ipvlanFlag=None,
        ),
        raw=b"{}",
        environ={},
        store=store,
    )


def _link(**changes: Any) -> LinkInfo:
    base = dict(
        name="eth0",
        index=2,
        kind="macvlan",
        mac=MAC,
        mtu=1500,
        operstate="UP",
        admin_up=True,
        parent_index=5,
        parent_netnsid=0,
        mode="bridge",
        addresses=("10.0.0.7/24",),
    )
    base.update(changes)
    return LinkInfo(**base)


@pytest.fixture
def parent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        info, "host_link", lambda name: _link(name=name, index=5, kind=None, parent_index=None)
    )


def test_ipam_check_runs_while_the_link_is_verified(monkeypatch: pytest.MonkeyPatch, parent: None) -> None:
    ipam_started = threading.Event()
    seen: list[bool] = []

    def fake_ipam_check(*a: Any, **kw: Any) -> None:
        ipam_started.set()

    def link_in_netns(netns: str, ifname: str) -> LinkInfo:
        seen.append(ipam_started.wait(timeout=10))  # sequential CHECK would wait here in vain
        return _link()

    monkeypatch.setattr(ipam, "ipam_check", fake_ipam_check)
    monkeypatch.setattr(info, "link_in_netns", link_in_netns)
    check.cmd_check(_inv())
    assert seen == [True]


def test_a_link_mismatch_is_reported_before_an_ipam_failure(
    monkeypatch: pytest.MonkeyPatch, parent: None
) -> None:
    link_checked = threading.Event()
    ipam_done: list[bool] = []

    def fake_ipam_check(*a: Any, **kw: Any) -> None:
        link_checked.wait(timeout=10)
        ipam_done.append(True)
        raise IpamError("failed to check IPAM host-local: no IP allocated", code=999)

    def link_in_netns(netns: str, ifname: str) -> LinkInfo:
        link_checked.set()
        return _link(mac="02:00:00:00:00:99")

    monkeypatch.setattr(ipam, "ipam_check", fake_ipam_check)
    monkeypatch.setattr(info, "link_in_netns", link_in_netns)
    with pytest.raises(CheckFailedError, match="MAC is 02:00:00:00:00:99"):
        check.cmd_check(_inv())
    assert ipam_done == [True]  # the plugin finished before CHECK returned


def test_an_ipam_failure_alone_is_raised_with_code_103_for_999(
    monkeypatch: pytest.MonkeyPatch, parent: None
) -> None:
    def fake_ipam_check(*a: Any, **kw: Any) -> None:
        raise IpamError("failed to check IPAM host-local: no IP allocated", code=999)

    monkeypatch.setattr(ipam, "ipam_check", fake_ipam_check)
    monkeypatch.setattr(info, "link_in_netns", lambda netns, ifname: _link())
    with pytest.raises(IpamError) as exc:
        check.cmd_check(_inv())
    assert exc.value.code == 103
    assert "no IP allocated" in exc.value.msg


def test_a_good_link_and_ipam_pass(monkeypatch: pytest.MonkeyPatch, parent: None) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(ipam, "ipam_check", lambda *a, **kw: calls.append(a))
    monkeypatch.setattr(info, "link_in_netns", lambda netns, ifname: _link())
    check.cmd_check(_inv())
    assert calls == [("host-local", b"{}", {}, ["/opt/cni/bin"])]
