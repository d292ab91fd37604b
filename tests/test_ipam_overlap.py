"""IPAM runs while the kernel makes or deletes the link (cni_dra.verbs.add and .delete)."""

from __future__ import annotations

import io
import json
import socket
import threading

from cni_dra.cni import run
from cni_dra.state import Attachment, StateStore
from tests.builders import device, write_slice
from tests.fake_host import FakeHost


def _setup(tmp_path, delete_link, ipam_del):
    conf = {
        "cniVersion": "1.0.0",
        "name": "net",
        "type": "cni-dra",
        "stateDir": str(tmp_path / "state"),
        "inventory": str(tmp_path / "slice.yaml"),
        "ipam": {"type": "host-local", "subnet": "192.0.2.0/24"},
    }
    with StateStore(tmp_path / "state").transaction() as txn:
        txn.put(
            Attachment(
                network="net",
                containerID="c1",
                ifname="eth0",
                netns="/var/run/netns/pod",
                driver="d",
                pool="p",
                device="nic-a",
                parent="eth9",
                consumedCapacity={"bandwidth": "1G"},
                phase="ready",
                ipamType="host-local",
                ipamConf=json.dumps(conf),
            )
        )
    with StateStore(tmp_path / "state").transaction() as txn:  # a second commit: the journal exists
        txn.add_status_update({"claim": {"uid": "other"}})
    host = FakeHost()
    host.add_nic("eth9", 7)
    host.hooks["delete_link"] = delete_link
    host.hooks["ipam_del"] = ipam_del
    env = {
        "CNI_COMMAND": "DEL",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/pod",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": "/usr/bin:/bin",
    }
    return env, json.dumps(conf).encode(), host


def test_ipam_del_runs_while_the_link_is_deleted(tmp_path, monkeypatch):
    started = threading.Event()
    order: list[str] = []

    def ipam_del(*args):
        order.append("ipam")
        started.set()

    def delete_link(path, ifname):
        # sequential code would call IPAM only after this returns: the wait would time out
        order.append("link" if started.wait(10) else "link without IPAM running")

    env, stdin, host = _setup(tmp_path, delete_link, ipam_del)
    import os

    synced = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd))  # the state's syncs, counted
    out = io.StringIO()
    assert run(env, stdin, out, host=host) == 0, out.getvalue()
    assert order == ["ipam", "link"]
    assert StateStore(tmp_path / "state").read().attachments == []  # capacity released after both
    assert synced == []  # DEL's records are not fsync'ed: a reboot releases what a crash loses


def test_a_failed_ipam_del_keeps_the_capacity_and_is_reported(tmp_path):
    from cni_dra.errors import IpamError

    deleted = []

    def ipam_del(*args):
        raise IpamError("failed to delete IPAM host-local: disk full")

    env, stdin, host = _setup(tmp_path, lambda p, i: deleted.append(i), ipam_del)
    out = io.StringIO()
    assert run(env, stdin, out, host=host) == 1
    answer = json.loads(out.getvalue())
    assert answer["code"] == IpamError.code and "disk full" in answer["msg"]
    assert deleted == ["eth0"]  # the link went anyway
    (att,) = StateStore(tmp_path / "state").read().attachments  # still charged: the runtime retries DEL
    assert att.phase == "deleting"


def test_dhcp_is_released_before_the_link_goes(tmp_path):
    """The dhcp daemon sends DHCPRELEASE through the pod's link: reference order."""
    import time

    order: list[str] = []

    def slow_release(*args):
        time.sleep(0.3)  # run concurrently, the link would go first
        order.append("ipam")

    env, stdin, host = _setup(tmp_path, lambda p, i: order.append("link"), slow_release)
    conf = json.loads(stdin)
    conf["ipam"] = {"type": "dhcp"}
    out = io.StringIO()
    assert run(env, json.dumps(conf).encode(), out, host=host) == 0, out.getvalue()
    assert order == ["ipam", "link"]


# -- ADD ---------------------------------------------------------------------------------
def _add_setup(tmp_path, ipam_type, create, ipam_add):
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    ipam_conf = {"type": ipam_type}
    if ipam_type == "dhcp":  # the daemon's socket is there
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / "dhcp.sock"))
        sock.close()
        ipam_conf["daemonSocketPath"] = str(tmp_path / "dhcp.sock")
    conf = {
        "cniVersion": "1.0.0",
        "name": "net",
        "type": "cni-dra",
        "stateDir": str(tmp_path / "state"),
        "inventory": str(tmp_path / "slice.yaml"),
        "ipam": ipam_conf,
    }
    host = FakeHost()
    host.add_nic("eth9", 7)
    host.hooks["add_sublink"] = create
    host.hooks["ipam_add"] = ipam_add
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/pod",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": "/usr/bin:/bin",
    }
    return env, json.dumps(conf).encode(), host


def test_host_local_add_runs_while_the_link_is_made(tmp_path):
    started = threading.Event()
    order: list[str] = []

    def create(*args):
        # sequential code would start IPAM only after the link exists: the wait would time out
        order.append("link" if started.wait(10) else "link without IPAM running")

    env, stdin, host = _add_setup(
        tmp_path, "host-local", create, lambda *a: order.append("ipam") or started.set()
    )
    out = io.StringIO()
    assert run(env, stdin, out, host=host) == 0, out.getvalue()
    assert order == ["ipam", "link"]
    assert json.loads(out.getvalue())["ips"][0]["address"] == "192.0.2.5/24"
    (att,) = StateStore(tmp_path / "state").read().attachments
    assert att.phase == "ready"


def test_dhcp_add_waits_for_the_link(tmp_path):
    """The dhcp daemon configures through the pod's link: reference order."""
    import time

    order: list[str] = []

    def create(*args):
        time.sleep(0.3)  # run concurrently, IPAM would come first
        order.append("link")

    env, stdin, host = _add_setup(tmp_path, "dhcp", create, lambda *a: order.append("ipam"))
    out = io.StringIO()
    assert run(env, stdin, out, host=host) == 0, out.getvalue()
    assert order == ["link", "ipam"]


def test_a_failed_link_returns_the_address_ipam_gave(tmp_path):
    from cni_dra.errors import NetlinkError

    env, stdin, host = _add_setup(tmp_path, "host-local", lambda *a: None, lambda *a: None)
    host.fail["add_sublink"] = NetlinkError("failed to create macvlan eth0: boom")
    out = io.StringIO()
    assert run(env, stdin, out, host=host) == 1
    assert json.loads(out.getvalue())["code"] == NetlinkError.code
    assert [args[0] for args in host.called("ipam_del")] == ["host-local"] and host.leases == {}
    assert StateStore(tmp_path / "state").read().attachments == []  # capacity released too
