"""IPAM runs while the kernel makes or deletes the link (cni_dra.verbs.add and .delete)."""

from __future__ import annotations

import io
import json
import threading

from cni_dra import ipam
from cni_dra.cni import run
from cni_dra.netlink import addr, info, shaping, sublink, sysctl
from cni_dra.state import Attachment, StateStore
from tests.builders import device, every_path_a_netns, write_slice


def _setup(tmp_path, monkeypatch, delete_link, ipam_del):
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
    every_path_a_netns(monkeypatch)
    monkeypatch.setattr(sublink, "delete_link", delete_link)
    monkeypatch.setattr(ipam, "ipam_del", ipam_del)
    env = {
        "CNI_COMMAND": "DEL",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/pod",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": "/usr/bin:/bin",
    }
    return env, json.dumps(conf).encode()


def test_ipam_del_runs_while_the_link_is_deleted(tmp_path, monkeypatch):
    started = threading.Event()
    order: list[str] = []

    def ipam_del(*args, **kwargs):
        order.append("ipam")
        started.set()

    def delete_link(path, ifname):
        # sequential code would call IPAM only after this returns: the wait would time out
        order.append("link" if started.wait(10) else "link without IPAM running")
        return True

    env, stdin = _setup(tmp_path, monkeypatch, delete_link, ipam_del)
    import os

    synced = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd))
    out = io.StringIO()
    assert run(env, stdin, out) == 0, out.getvalue()
    assert order == ["ipam", "link"]
    assert StateStore(tmp_path / "state").read().attachments == []  # capacity released after both
    assert synced == []  # DEL's records are not fsync'ed: a reboot releases what a crash loses


def test_a_failed_ipam_del_keeps_the_capacity_and_is_reported(tmp_path, monkeypatch):
    from cni_dra.errors import IpamError

    deleted = []

    def ipam_del(*args, **kwargs):
        raise IpamError("failed to delete IPAM host-local: disk full")

    env, stdin = _setup(tmp_path, monkeypatch, lambda p, i: deleted.append(i) or True, ipam_del)
    out = io.StringIO()
    assert run(env, stdin, out) == 1
    answer = json.loads(out.getvalue())
    assert answer["code"] == IpamError.code and "disk full" in answer["msg"]
    assert deleted == ["eth0"]  # the link went anyway
    (att,) = StateStore(tmp_path / "state").read().attachments  # still charged: the runtime retries DEL
    assert att.phase == "deleting"


def test_dhcp_is_released_before_the_link_goes(tmp_path, monkeypatch):
    """The dhcp daemon sends DHCPRELEASE through the pod's link: reference order."""
    import time

    order: list[str] = []

    def slow_release(*args, **kwargs):
        time.sleep(0.3)  # run concurrently, the link would go first
        order.append("ipam")

    env, stdin = _setup(tmp_path, monkeypatch, lambda p, i: order.append("link") or True, slow_release)
    conf = json.loads(stdin)
    conf["ipam"] = {"type": "dhcp"}
    out = io.StringIO()
    assert run(env, json.dumps(conf).encode(), out) == 0, out.getvalue()
    assert order == ["ipam", "link"]


# -- ADD ---------------------------------------------------------------------------------
def _add_setup(tmp_path, monkeypatch, ipam_type, create, ipam_add):
    from cni_dra.protocol.results import IPConfig, Result

    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    conf = {
        "cniVersion": "1.0.0",
        "name": "net",
        "type": "cni-dra",
        "stateDir": str(tmp_path / "state"),
        "inventory": str(tmp_path / "slice.yaml"),
        "ipam": {"type": ipam_type},
    }
    parent = info.LinkInfo(
        name="eth9",
        index=7,
        kind=None,
        mac="02:00:00:00:00:09",
        mtu=1500,
        operstate="UP",
        admin_up=True,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
    )
    monkeypatch.setattr(info, "host_link", lambda name: parent if name == "eth9" else None)
    every_path_a_netns(monkeypatch)
    monkeypatch.setattr(sublink, "create_macvlan", create)
    monkeypatch.setattr(
        shaping,
        "apply_shaping",
        lambda netns, ifname, spec, **kw: shaping.ShapeInfo(
            ifname, spec.egress, spec.ingress, shaping.ifb_name(ifname) if spec.ingress else None
        ),
    )
    monkeypatch.setattr(shaping, "remove_shaping", lambda netns, ifname: True)
    monkeypatch.setattr(sysctl, "set_sysctl_in_netns", lambda *a: None)
    monkeypatch.setattr(addr, "configure_interface", lambda *a, **k: None)
    monkeypatch.setattr(sublink, "delete_link", lambda *a: True)
    monkeypatch.setattr(
        ipam, "ipam_add", lambda *a, **k: ipam_add() or Result(ips=[IPConfig(address="192.0.2.5/24")])
    )
    monkeypatch.setattr(ipam, "ipam_del", lambda *a, **k: None)
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/pod",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": "/usr/bin:/bin",
    }
    link = info.LinkInfo(
        name="eth0",
        index=2,
        kind="macvlan",
        mac="02:00:00:00:00:01",
        mtu=1500,
        operstate="UP",
        admin_up=True,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
    )
    return env, json.dumps(conf).encode(), link


def test_host_local_add_runs_while_the_link_is_made(tmp_path, monkeypatch):
    started = threading.Event()
    order: list[str] = []

    def create(**kwargs):
        # sequential code would start IPAM only after the link exists: the wait would time out
        order.append("link" if started.wait(10) else "link without IPAM running")
        return link

    env, stdin, link = _add_setup(
        tmp_path, monkeypatch, "host-local", create, lambda: order.append("ipam") or started.set()
    )
    out = io.StringIO()
    assert run(env, stdin, out) == 0, out.getvalue()
    assert order == ["ipam", "link"]
    assert json.loads(out.getvalue())["ips"][0]["address"] == "192.0.2.5/24"
    (att,) = StateStore(tmp_path / "state").read().attachments
    assert att.phase == "ready"


def test_dhcp_add_waits_for_the_link(tmp_path, monkeypatch):
    """The dhcp daemon configures through the pod's link: reference order."""
    import time

    order: list[str] = []

    def create(**kwargs):
        time.sleep(0.3)  # run concurrently, IPAM would come first
        order.append("link")
        return link

    env, stdin, link = _add_setup(tmp_path, monkeypatch, "dhcp", create, lambda: order.append("ipam"))
    monkeypatch.setattr("cni_dra.verbs.add.dhcp_socket_missing", lambda ipam_conf: None)
    out = io.StringIO()
    assert run(env, stdin, out) == 0, out.getvalue()
    assert order == ["link", "ipam"]


def test_a_failed_link_returns_the_address_ipam_gave(tmp_path, monkeypatch):
    from cni_dra.errors import NetlinkError

    released = []

    def create(**kwargs):
        raise NetlinkError("failed to create macvlan eth0: boom")

    env, stdin, _ = _add_setup(tmp_path, monkeypatch, "host-local", create, lambda: None)
    monkeypatch.setattr(ipam, "ipam_del", lambda *a, **k: released.append(a[0]))
    out = io.StringIO()
    assert run(env, stdin, out) == 1
    assert json.loads(out.getvalue())["code"] == NetlinkError.code
    assert released == ["host-local"]
    assert StateStore(tmp_path / "state").read().attachments == []  # capacity released too
