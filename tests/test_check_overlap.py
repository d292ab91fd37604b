"""CHECK runs the IPAM plugin's CHECK while it verifies the link; errors keep their order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from cni_dra.errors import CheckFailedError, IpamError
from cni_dra.netlink.info import LinkInfo
from cni_dra.verbs import check
from tests.fake_host import FakeHost, pod_link

NETNS = "/var/run/netns/pod-1"
MAC = "02:00:00:00:00:07"


def _inv(host: FakeHost) -> Any:
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
    store = SimpleNamespace(peek=lambda: SimpleNamespace(find=lambda *key: att))
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
        host=host,
    )


def _link(**changes: Any) -> LinkInfo:
    return pod_link(**{"mac": MAC, "addresses": ("10.0.0.7/24",), **changes})


class Host(FakeHost):
    """The in-memory host with parent nic0 and the pod link; ``on_ipam_check`` and
    ``on_link`` run inside the IPAM CHECK and the pod link's read (to order the two)."""

    def __init__(self, link: LinkInfo) -> None:
        super().__init__()
        self.host_links["nic0"] = _link(name="nic0", index=5, kind=None, parent_index=None)
        self.put_link(NETNS, link, "nic0")
        self.on_ipam_check: Callable[[], None] = lambda: None
        self.on_link: Callable[[], None] = lambda: None
        self.ipam_checks: list[tuple[Any, ...]] = []

    def ipam_check(self, plugin: str, netconf: bytes, environ: Any, cni_path: Any) -> None:
        self.ipam_checks.append((plugin, netconf, environ, cni_path))
        self.on_ipam_check()

    def link_in_netns(self, netns: str, ifname: str) -> LinkInfo | None:
        self.on_link()
        return super().link_in_netns(netns, ifname)


def test_ipam_check_runs_while_the_link_is_verified() -> None:
    host = Host(_link())
    ipam_started = threading.Event()
    seen: list[bool] = []
    host.on_ipam_check = ipam_started.set
    host.on_link = lambda: seen.append(ipam_started.wait(timeout=10))  # sequential CHECK waits in vain
    check.cmd_check(_inv(host))
    assert seen == [True]


def test_a_link_mismatch_is_reported_before_an_ipam_failure() -> None:
    host = Host(_link(mac="02:00:00:00:00:99"))
    link_checked = threading.Event()
    ipam_done: list[bool] = []

    def ipam_fails() -> None:
        link_checked.wait(timeout=10)
        ipam_done.append(True)
        raise IpamError("failed to check IPAM host-local: no IP allocated", code=999)

    host.on_ipam_check = ipam_fails
    host.on_link = link_checked.set
    with pytest.raises(CheckFailedError, match="MAC is 02:00:00:00:00:99"):
        check.cmd_check(_inv(host))
    assert ipam_done == [True]  # the plugin finished before CHECK returned


def test_an_ipam_failure_alone_is_raised_with_code_103_for_999() -> None:
    host = Host(_link())

    def ipam_fails() -> None:
        raise IpamError("failed to check IPAM host-local: no IP allocated", code=999)

    host.on_ipam_check = ipam_fails
    with pytest.raises(IpamError) as exc:
        check.cmd_check(_inv(host))
    assert exc.value.code == 103
    assert "no IP allocated" in exc.value.msg


def test_a_good_link_and_ipam_pass() -> None:
    host = Host(_link())
    check.cmd_check(_inv(host))
    assert host.ipam_checks == [("host-local", b"{}", {}, ["/opt/cni/bin"])]


def test_ipam_check_runs_while_the_state_is_read() -> None:
    host = Host(_link())
    ipam_started = threading.Event()
    seen: list[bool] = []
    host.on_ipam_check = ipam_started.set
    inv = _inv(host)
    state = inv.store.peek()

    def peek() -> Any:
        seen.append(ipam_started.wait(timeout=3))  # a CHECK that starts IPAM after the read waits in vain
        return state

    inv.store = SimpleNamespace(peek=peek)
    check.cmd_check(inv)
    assert seen == [True]


def test_check_waits_for_no_state_file_lock(tmp_path: Any) -> None:
    """A burst's ADDs and DELs hold the state's file lock in turn: CHECK reads without it."""
    from cni_dra.errors import ContainerUnknownError
    from cni_dra.state import StateStore
    from cni_dra.state.lock import file_locked
    from tests.builders import attachment

    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.put(attachment("other", netns=NETNS))
    inv = _inv(Host(_link()))
    inv.store = store
    raised: list[BaseException] = []

    def run() -> None:
        try:
            check.cmd_check(inv)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            raised.append(exc)

    with file_locked(store.lock_path, 5):  # another process's transaction
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(3)
        done = not t.is_alive()
    t.join()
    assert done
    assert [type(e) for e in raised] == [ContainerUnknownError]
    assert "no attachment on network 'net1' in state" in str(raised[0])
