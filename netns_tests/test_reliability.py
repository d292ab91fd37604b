"""Reliability in real namespaces: crash at every step, corrupt state, reboots, host netns, retries.

Every case runs the installed plugin as a runtime does and then judges, independently of
the plugin's own report: the exit code and CNI error code, the state file (decoded with its
checksum), the links in the pod namespaces (pyroute2), and the host-local IPAM files.

Fault injection: ``CNI_DRA_FAULT=<step>`` makes the plugin SIGKILL itself at that step, but
only while the switch file ``/run/cni-dra/test-faults-enabled`` exists (fixture
``faults_on``). A killed plugin exits -9 with nothing on stdout, as after an OOM kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from cni_dra.faults import SWITCH_FILE
from cni_dra.netlink.info import host_link, link_in_netns
from cni_dra.quantity import Quantity
from cni_dra.state import Txn
from cni_dra.state.schema import SCHEMA_VERSION
from netns_tests.bed import DRIVER, NodeBed, links_named, parent_of, pod_args, recover, repair
from netns_tests.conftest import remove_netns
from netns_tests.runner import CNI_EXE, CNI_PATH, run_plugin

NET = "relnet"
KILLED = -signal.SIGKILL
_PLUGIN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "CNI_DRA_STATE_VERIFY": "1",
}


@pytest.fixture
def node(make_node) -> NodeBed:
    """Two 10G stand-in NICs (``nic-a``, ``nic-b``) on network ``relnet``."""
    return make_node(network=NET)


# -- 1. kill at every step ------------------------------------------------------------------
ADD_STEPS_UNDONE = [
    "add:reserved",
    "add:link-temp",
    "add:link-renamed",
    "add:link-created",
    "add:shaped",
    "add:ipam-done",
]


@pytest.mark.parametrize("step", ADD_STEPS_UNDONE + ["add:ready", "state:tmp-written", "state:renamed"])
def test_add_killed_at_step_then_recovered(node, make_netns, faults_on, step):
    ns_a, ns_b = make_netns(), make_netns()
    code, out, err = node.add(ns_a, "pod-a")
    assert code == 0, (out, err)
    ip_a = out["ips"][0]["address"].split("/")[0]

    code, out, err = node.add(ns_b, "pod-b", conf=node.conf("2G"), fault=step)
    assert code == KILLED and out is None, (code, out, err)

    code, report = recover(node)
    assert code == 0, report
    # "state:*" faults fire at the first state write of this ADD: the reservation itself
    # (tmp-written: never renamed into place; renamed: in place, then killed).
    completed = step == "add:ready"
    if completed:
        assert node.phases() == {"pod-a": "ready", "pod-b": "ready"}
        assert parent_of(ns_b) is not None
        assert sorted(node.ip_holders().values()) == ["pod-a", "pod-b"]
        assert node.consumed()["nic-a"]["bandwidth"] == Quantity.parse("3G")
        assert report["changes"] == []
    else:
        assert node.phases() == {"pod-a": "ready"}, report
        assert link_in_netns(ns_b, "eth0") is None
        assert [name for name, _ in links_named(ns_b)] == ["lo"]  # no ifb device left either
        assert node.ip_holders() == {ip_a: "pod-a"}
        assert node.consumed()["nic-a"]["bandwidth"] == Quantity.parse("1G")
        # tmp-written: the reservation never landed, nothing to recover; otherwise a stale intent
        assert bool(report["changes"]) == (step != "state:tmp-written")
    assert parent_of(ns_a) == node.parents["nic-a"]  # the completed attachment is untouched

    # the runtime retries the ADD: it works (or returns the recorded result) with one link, one charge
    code, out, err = node.add(ns_b, "pod-b", conf=node.conf("2G"))
    assert code == 0, (out, err)
    assert node.consumed()["nic-a"]["bandwidth"] == Quantity.parse("3G")
    assert sorted(node.ip_holders().values()) == ["pod-a", "pod-b"]
    for ns, cid in ((ns_b, "pod-b"), (ns_a, "pod-a")):
        code, out, err = node.delete(ns, cid)
        assert code == 0, (out, err)
    assert node.phases() == {} and node.ip_holders() == {}


def _temp_links(netns: str) -> list[str]:
    """Links in ``netns`` named like cni-dra's temporary link names (``cdra`` + 10 hex digits)."""
    import re

    return [name for name, _ in links_named(netns) if re.fullmatch(r"cdra[0-9a-f]{10}", name or "")]


@pytest.mark.parametrize("cleaner", ["del", "gc", "next-add", "repair"])
def test_add_killed_before_the_rename_leaves_no_temporary_link(node, make_netns, faults_on, cleaner):
    """A kill between creating the link under its temporary name and renaming it leaves a
    ``cdra…`` macvlan in the pod. The intent names it, so whatever runs next (the pod's DEL,
    GC, another ADD, ``state repair``) deletes it, and nothing charges it."""
    ns_a, ns_b, ns_c = make_netns(), make_netns(), make_netns()
    assert node.add(ns_a, "pod-a")[0] == 0
    code, out, err = node.add(ns_b, "pod-b", conf=node.conf("2G"), fault="add:link-temp")
    assert code == KILLED, (code, out, err)
    (temp,) = _temp_links(ns_b)
    assert parent_of(ns_b, temp) == node.parents["nic-a"] and link_in_netns(ns_b, "eth0") is None
    assert node.state().find(NET, "pod-b", "eth0").tempName == temp  # recorded before the link existed

    expect = {"pod-a": "ready"}
    if cleaner == "del":
        code, out, err = node.delete(ns_b, "pod-b")
    elif cleaner == "gc":
        gc_conf = node.conf() | {
            "cniVersion": "1.1.0",
            "cni.dev/valid-attachments": [
                {"containerID": "pod-a", "ifname": "eth0"},
                {"containerID": "pod-b", "ifname": "eth0"},
            ],
        }
        code, out, err = run_plugin("GC", gc_conf, container_id="", netns="", ifname="", cni_args=None)
    elif cleaner == "next-add":
        code, out, err = node.add(ns_c, "pod-c")
        expect["pod-c"] = "ready"
    else:
        code, out, err = repair(node, "--json")
        assert not any("untracked link" in c for c in json.loads(out)["changes"]), out
    assert code == 0, (out, err)
    assert _temp_links(ns_b) == [] and [name for name, _ in links_named(ns_b)] == ["lo"]
    assert node.phases() == expect
    assert sorted(node.ip_holders().values()) == sorted(expect)
    assert node.consumed_with_inventory() == {"nic-a": {"bandwidth": Quantity.parse(f"{len(expect)}G")}}
    for ns, cid in ((ns_a, "pod-a"), (ns_c, "pod-c")):
        assert node.delete(ns, cid)[0] == 0
    assert node.phases() == {} and node.ip_holders() == {}


def test_repair_removes_temporary_links_and_never_charges_them(node, make_netns, faults_on):
    """Links named as cni-dra names its temporary links are leftovers of an ADD killed
    before the rename: ``state repair`` deletes them, with or without a record, and
    charges none of them (each would have held its NIC's whole capacity)."""
    from pyroute2 import IPRoute

    from cni_dra.netlink.sublink import temp_name

    ns_a, ns_b, ns_c, ns_x = make_netns(), make_netns(), make_netns(), make_netns()
    assert node.add(ns_a, "pod-a")[0] == 0
    for ns, cid in ((ns_b, "pod-b"), (ns_c, "pod-c")):
        code, out, err = node.add(ns, cid, fault="add:link-temp")
        assert code == KILLED and len(_temp_links(ns)) == 1, (code, out, err)
    stray = temp_name()  # no record names this one
    with IPRoute() as ipr:
        (parent,) = ipr.link_lookup(ifname=node.parents["nic-b"])
        fd = os.open(ns_x, os.O_RDONLY)
        try:
            ipr.link("add", ifname=stray, kind="macvlan", link=parent, macvlan_mode="bridge", net_ns_fd=fd)
        finally:
            os.close(fd)
    _corrupt(node.state_dir / "state.json", "truncated")
    code, out, err = repair(node, "--json")
    assert code == 0, err
    changes = json.loads(out)["changes"]
    assert not any("untracked link" in c for c in changes), changes
    assert f"removed leaked temporary link {stray} in {ns_x}" in changes, changes
    assert all(_temp_links(ns) == [] for ns in (ns_b, ns_c, ns_x))
    assert node.phases() == {"pod-a": "ready"} and list(node.ip_holders().values()) == ["pod-a"]
    assert node.consumed_with_inventory() == {"nic-a": {"bandwidth": Quantity.parse("1G")}}
    assert node.delete(ns_a, "pod-a")[0] == 0


@pytest.mark.parametrize("step", ["del:intent", "del:link-deleted", "del:ipam-released", "state:tmp-written"])
@pytest.mark.parametrize("recovery", ["cli", "next-add"])
def test_del_killed_at_step_then_recovered(node, make_netns, faults_on, step, recovery):
    ns_a, ns_b, ns_c = make_netns(), make_netns(), make_netns()
    for ns, cid in ((ns_a, "pod-a"), (ns_b, "pod-b")):
        code, out, err = node.add(ns, cid)
        assert code == 0, (out, err)
    ip_a = next(ip for ip, c in node.ip_holders().items() if c == "pod-a")

    code, out, err = node.delete(ns_b, "pod-b", fault=step)
    assert code == KILLED and out is None, (code, out, err)

    if recovery == "cli":
        code, report = recover(node)
        assert code == 0, report
        expect = {"pod-a": "ready"}
        # state:tmp-written is the "deleting" intent never renamed into place: nothing is
        # stale, pod-b stays attached until the runtime's DEL retry below.
        if step == "state:tmp-written":
            expect["pod-b"] = "ready"
    else:
        code, out, err = node.add(ns_c, "pod-c")
        assert code == 0, (out, err)
        expect = {"pod-a": "ready", "pod-c": "ready"}
        if step == "state:tmp-written":
            expect["pod-b"] = "ready"
    assert node.phases() == expect
    if "pod-b" not in expect:
        assert link_in_netns(ns_b, "eth0") is None
        assert "pod-b" not in node.ip_holders().values()
    assert node.ip_holders()[ip_a] == "pod-a" and parent_of(ns_a) is not None

    # the runtime's DEL retry succeeds whatever is left
    code, out, err = node.delete(ns_b, "pod-b")
    assert code == 0, (out, err)
    assert link_in_netns(ns_b, "eth0") is None and "pod-b" not in node.ip_holders().values()
    assert "pod-b" not in node.phases()
    consumed = node.consumed()["nic-a"]["bandwidth"]
    assert consumed == Quantity.parse("2G" if recovery == "next-add" else "1G")


def test_fault_env_alone_does_nothing(node, make_netns):
    """Without the switch file the variable is ignored: a runtime's environment cannot kill the plugin."""
    if os.path.exists(SWITCH_FILE):
        pytest.skip("switch file present (another fault test runs in parallel)")
    ns = make_netns()
    code, out, err = node.add(ns, "pod-a", fault="add:reserved")
    assert code == 0, (out, err)
    assert node.phases() == {"pod-a": "ready"}
    assert node.delete(ns, "pod-a")[0] == 0


# -- 2. state integrity ---------------------------------------------------------------------
def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "bad-checksum":
        assert b'"1G"' in data
        path.write_bytes(data.replace(b'"1G"', b'"9G"', 1))  # still valid JSON, books changed
    else:  # pragma: no cover
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["empty", "truncated", "bad-checksum"])
def test_corrupt_state_fails_closed_and_repair_rebuilds(node, make_netns, how):
    ns_a, ns_b, ns_c = make_netns(), make_netns(), make_netns()
    for ns, cid in ((ns_a, "pod-a"), (ns_b, "pod-b")):
        code, out, err = node.add(ns, cid)
        assert code == 0, (out, err)
    state_file = node.state_dir / "state.json"
    _corrupt(state_file, how)
    corrupt_bytes = state_file.read_bytes()
    ipam_before = node.ip_holders()

    # ADD fails closed: code 5, no link, no IPAM, the file untouched
    code, out, err = node.add(ns_c, "pod-c")
    assert code == 1 and out["code"] == 5, (out, err)
    assert "corrupt" in out["msg"] and "state repair" in out["msg"]
    assert link_in_netns(ns_c, "eth0") is None and node.ip_holders() == ipam_before
    assert state_file.read_bytes() == corrupt_bytes

    # DEL still removes the link and releases the IPAM it can identify (the runtime's config)
    code, out, err = node.delete(ns_a, "pod-a")
    assert code == 0, (out, err)
    assert link_in_netns(ns_a, "eth0") is None
    assert sorted(node.ip_holders().values()) == ["pod-b"]
    assert state_file.read_bytes() == corrupt_bytes

    # repair: from the backup plus live links; pod-a's link is gone, pod-b's is live
    code, out, err = repair(node, "--json")
    assert code == 0, err
    report = json.loads(out)
    text = "\n".join(report["changes"])
    assert "moved the unreadable state.json" in text and "from state.json.bak" in text
    assert "dropped attachment relnet/pod-a/eth0" in text
    assert node.phases() == {"pod-b": "ready"}
    assert node.consumed()["nic-a"]["bandwidth"] == Quantity.parse("1G")
    assert [p.name for p in node.state_dir.iterdir() if p.name.startswith("state.json.corrupt-")]
    # and the node works again
    code, out, err = node.add(ns_c, "pod-c")
    assert code == 0, (out, err)
    for ns, cid in ((ns_b, "pod-b"), (ns_c, "pod-c")):
        assert node.delete(ns, cid)[0] == 0
    assert node.phases() == {} and node.ip_holders() == {}


def test_old_schema_state_is_migrated(node, make_netns):
    ns = make_netns()
    node.state_dir.mkdir(mode=0o700)
    claim = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "cu"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "net",
                            "driver": DRIVER,
                            "pool": "n",
                            "device": "nic-b",
                            "consumedCapacity": {"bandwidth": "3G"},
                            "shareID": "4a5b",
                        }
                    ]
                }
            }
        },
    }
    (node.state_dir / "state.json").write_text(
        json.dumps({"schemaVersion": 1, "claims": {"other": [claim]}, "attachments": []})
    )
    code, out, err = node.add(ns, "pod-a")
    assert code == 0, (out, err)
    st = node.state()
    assert st.schemaVersion == SCHEMA_VERSION and st.claims["other"][0]["metadata"]["uid"] == "cu"
    # the migrated claim still counts: best-fit puts pod-a on nic-b (7G left) next to it
    assert node.consumed() == {"nic-b": {"bandwidth": Quantity.parse("4G")}}
    assert node.delete(ns, "pod-a")[0] == 0


def test_old_schema_attachment_without_amounts_holds_its_whole_nic(node, make_netns):
    """A schema-1 record without consumedCapacity is charged its NIC's whole capacity until
    its DEL: later ADDs cannot put 11G on a 10G NIC."""
    ns_old, ns_x, ns_y = make_netns(), make_netns(), make_netns()
    node.state_dir.mkdir(mode=0o700)
    old = {
        "network": NET,
        "containerID": "pod-old",
        "ifname": "eth0",
        "netns": ns_old,
        "podUID": "uid-pod-old",
        "driver": DRIVER,
        "pool": "n",
        "device": "nic-a",
        "ifName": node.parents["nic-a"],
        "phase": "ready",
    }
    (node.state_dir / "state.json").write_text(
        json.dumps({"schemaVersion": 1, "claims": {}, "attachments": [old]})
    )
    code, out, err = node.add(ns_x, "pod-x", conf=node.conf("6G"))
    assert code == 0, (out, err)
    assert parent_of(ns_x) == node.parents["nic-b"]
    code, out, err = node.add(ns_y, "pod-y", conf=node.conf("6G"))
    assert code == 1 and out["code"] == 100, (out, err)
    assert "nic-a: remaining bandwidth 0 < 6G" in out["msg"]
    assert node.consumed_with_inventory()["nic-a"] == {"bandwidth": node.capacity}
    assert node.delete(ns_old, "pod-old")[0] == 0  # its DEL releases the NIC
    code, out, err = node.add(ns_y, "pod-y", conf=node.conf("6G"))
    assert code == 0, (out, err)
    assert parent_of(ns_y) == node.parents["nic-a"]
    for ns, cid in ((ns_x, "pod-x"), (ns_y, "pod-y")):
        assert node.delete(ns, cid)[0] == 0
    assert node.phases() == {} and node.ip_holders() == {}


# -- 3. reboots -----------------------------------------------------------------------------
def test_reboot_releases_attachments_whose_netns_is_gone(node, make_netns):
    ns_a, ns_b, ns_c = make_netns(), make_netns(), make_netns()
    for ns, cid in ((ns_a, "pod-a"), (ns_b, "pod-b")):
        code, out, err = node.add(ns, cid)
        assert code == 0, (out, err)
    st = node.state()
    claim = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "cu"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "net",
                            "driver": DRIVER,
                            "pool": "n",
                            "device": "nic-b",
                            "consumedCapacity": {"bandwidth": "3G"},
                            "shareID": "4a5b",
                        }
                    ]
                }
            }
        },
    }
    txn = Txn(st)  # on a copy of the state read
    txn.set_claims("prepared-pod", [claim])
    txn.set_boot_id("00000000-0000-0000-0000-000000000000")  # the state was last reconciled in another boot
    node.write_state(txn.state)
    remove_netns(ns_a)  # pod-a's namespace did not survive the "reboot"

    code, out, err = node.add(ns_c, "pod-c")  # first use after the reboot
    assert code == 0, (out, err)
    st = node.state()
    assert {a.containerID for a in st.attachments} == {"pod-b", "pod-c"}
    assert st.claims["prepared-pod"][0]["metadata"]["uid"] == "cu"  # prepared claims stay
    assert st.bootID == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert sorted(node.ip_holders().values()) == ["pod-b", "pod-c"]  # pod-a's address released
    # pod-a's 1G is free again; best-fit put pod-c next to the prepared claim on nic-b
    assert node.consumed() == {
        "nic-a": {"bandwidth": Quantity.parse("1G")},
        "nic-b": {"bandwidth": Quantity.parse("4G")},
    }
    for ns, cid in ((ns_b, "pod-b"), (ns_c, "pod-c")):
        assert node.delete(ns, cid)[0] == 0


# -- 4. locking -----------------------------------------------------------------------------
def test_lock_held_gives_code_11_and_nothing_written(node, make_netns):
    import fcntl

    ns = make_netns()
    code, out, err = node.add(ns, "pod-a")
    assert code == 0
    before = (node.state_dir / "state.json").read_bytes()
    ns2 = make_netns()
    fd = os.open(node.state_dir / "state.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code, out, err = node.add(ns2, "pod-b", conf=node.conf(lockTimeoutSeconds=0.5))
        assert code == 1 and out["code"] == 11, (out, err)
        assert "still held" in out["msg"]
        assert (node.state_dir / "state.json").read_bytes() == before
        assert link_in_netns(ns2, "eth0") is None and list(node.ip_holders().values()) == ["pod-a"]
    finally:
        os.close(fd)
    assert node.delete(ns, "pod-a")[0] == 0


# -- 5. namespaces --------------------------------------------------------------------------
def test_host_netns_refused_on_add_and_del_touches_no_host_link(node, make_netns):
    host_ns = f"/proc/{os.getpid()}/ns/net"
    peer = node.parents["nic-b"] + "p"  # a host link; the name is valid for a pod interface too
    code, out, err = node.add(host_ns, "pod-h", ifname="eth0")
    assert code == 1 and out["code"] == 4, (out, err)
    assert "host network namespace" in out["msg"]
    assert node.phases() == {} and node.ip_holders() == {}
    assert host_link("eth0") is None or host_link("eth0").kind != "macvlan"

    # a host link already named like CNI_IFNAME does not break ADD (the link is made in the pod netns)
    ns = make_netns()
    code, out, err = node.add(ns, "pod-a", ifname=peer)
    assert code == 0, (out, err)
    assert link_in_netns(ns, peer).kind == "macvlan"
    peer_index = host_link(peer).index

    # DEL aimed at the host netns: releases state and IPAM, leaves the host link alone
    code, out, err = node.delete(host_ns, "pod-a", ifname=peer)
    assert code == 0, (out, err)
    assert host_link(peer) is not None and host_link(peer).index == peer_index
    assert node.phases() == {} and node.ip_holders() == {}
    assert node.delete(ns, "pod-a", ifname=peer)[0] == 0  # the runtime's real DEL


def test_path_that_is_not_a_netns_is_refused(node, tmp_path):
    bogus = tmp_path / "not-a-netns"
    bogus.write_text("x")
    code, out, err = node.add(str(bogus), "pod-a")
    assert code == 1 and out["code"] == 4, (out, err)
    assert "not a network namespace" in out["msg"]
    assert node.phases() == {} and node.ip_holders() == {}


# -- 6. parent NIC trouble ------------------------------------------------------------------
def test_down_or_missing_nic_is_skipped_and_named(make_node, make_netns):
    from netns_tests.conftest import _iproute, delete_host_link

    node = make_node(network=NET)
    nics = node.nics
    with _iproute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=nics[0])[0], state="down")
    ns1, ns2 = make_netns(), make_netns()
    code, out, err = node.add(ns1, "pod-a", conf=node.conf("6G"))
    assert code == 0, (out, err)
    assert parent_of(ns1) == nics[1]  # nic-a (lower name, best-fit tie) is down: skipped
    delete_host_link(nics[1])  # nic-b vanishes under pod-a
    code, out, err = node.add(ns2, "pod-b", conf=node.conf("1G"))
    assert code == 1 and out["code"] == 100, (out, err)
    assert f"nic-a: interface {nics[0]} is down" in out["msg"]
    assert f"nic-b: interface {nics[1]} does not exist" in out["msg"]
    code, out, err = node.delete(ns1, "pod-a")  # DEL is not blocked by the missing parent
    assert code == 0, (out, err)
    assert node.phases() == {} and node.ip_holders() == {}


# -- 8. runtime retries ---------------------------------------------------------------------
def test_repeated_add_returns_same_result_and_id_reuse_after_del(node, make_netns):
    ns = make_netns()
    code, first, err = node.add(ns, "pod-a", conf=node.conf("2G"))
    assert code == 0, (first, err)
    code, again, err = node.add(ns, "pod-a", conf=node.conf("2G"))
    assert code == 0 and again == first, (again, err)
    assert len(node.state().attachments) == 1 and len(node.ip_holders()) == 1
    assert node.consumed()["nic-a"]["bandwidth"] == Quantity.parse("2G")

    ns2 = make_netns()  # same attachment key, another netns: a clear error, nothing charged
    code, out, err = node.add(ns2, "pod-a", conf=node.conf("2G"))
    assert code == 1 and out["code"] == 104 and "already attached" in out["msg"], (out, err)
    assert link_in_netns(ns2, "eth0") is None and len(node.ip_holders()) == 1

    assert node.delete(ns, "pod-a")[0] == 0
    code, out, err = node.add(ns2, "pod-a", conf=node.conf("2G"))  # container ID reused after DEL
    assert code == 0, (out, err)
    assert node.phases() == {"pod-a": "ready"} and parent_of(ns2) is not None
    assert node.delete(ns2, "pod-a")[0] == 0
    assert node.phases() == {} and node.ip_holders() == {}


def test_state_files_are_private(node, make_netns):
    import stat

    ns = make_netns()
    assert node.add(ns, "pod-a")[0] == 0
    assert node.add(ns, "pod-a", ifname="eth1")[0] == 0  # a second write creates the backup
    assert stat.S_IMODE(os.stat(node.state_dir).st_mode) == 0o700
    for name in ("state.json", "state.json.bak", "state.lock"):
        st = os.stat(node.state_dir / name)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, 0), name
    for ifname in ("eth0", "eth1"):
        assert node.delete(ns, "pod-a", ifname=ifname)[0] == 0


def test_cli_recover_on_clean_state_does_nothing(node):
    code, report = recover(node)
    assert code == 0 and report == {"changes": [], "errors": []}


_ = uuid  # container IDs are fixed names here; uuid kept for ad-hoc debugging


def test_temp_link_names_are_random_and_a_collision_is_retried(make_netns, make_parent_nic):
    """In-process: the recorded temporary name is already taken in the pod netns; link
    creation goes on under the next name derived from it and leaves the squatter alone."""
    from pyroute2 import IPRoute

    from cni_dra.netlink import sublink

    names = {sublink.temp_name() for _ in range(50)}
    assert len(names) == 50 and all(n.startswith(sublink.TEMP_NAME_PREFIX) and len(n) <= 15 for n in names)
    ns, parent = make_netns(), make_parent_nic()
    squatter = sublink.temp_name()
    with IPRoute(netns=ns) as ipr:
        ipr.link("add", ifname=squatter, kind="veth", peer="sq-peer")
    info = sublink.create_macvlan(parent=parent, netns=ns, ifname="eth0", temp=squatter)
    assert info.name == "eth0" and info.kind == "macvlan"
    assert link_in_netns(ns, squatter) is not None and link_in_netns(ns, squatter).kind == "veth"
    assert sorted(name for name, _ in links_named(ns)) == sorted(["lo", "eth0", squatter, "sq-peer"])


def test_temporary_links_are_deleted_only_when_they_are_ours(make_netns, make_parent_nic):
    """What a killed ADD can leave under the names derived from its recorded temporary name
    is deleted: a macvlan on the recorded parent. A link of such a name of another kind, or
    on another parent, and a macvlan under any other name stay."""
    from pyroute2 import IPRoute

    from cni_dra.netlink import sublink

    ns, parent, other = make_netns(), make_parent_nic(), make_parent_nic()
    first = sublink.temp_name()
    ours, on_other, unrelated = (
        sublink.temp_names(first)[1],
        sublink.temp_names(first)[2],
        sublink.temp_name(),
    )
    with IPRoute(netns=ns) as ipr:
        ipr.link("add", ifname=first, kind="veth", peer="sq-peer")  # a squatter
    with IPRoute() as ipr:
        fd = os.open(ns, os.O_RDONLY)
        try:
            for name, nic in ((ours, parent), (on_other, other), (unrelated, parent)):
                (index,) = ipr.link_lookup(ifname=nic)
                ipr.link("add", ifname=name, kind="macvlan", link=index, macvlan_mode="bridge", net_ns_fd=fd)
        finally:
            os.close(fd)
    assert sublink.delete_temp_links(ns, first, parent) == [ours]
    assert sorted(name for name, _ in links_named(ns)) == sorted(
        ["lo", first, "sq-peer", on_other, unrelated]
    )
    assert sublink.delete_temp_links(ns, first, parent) == []  # idempotent


def test_gc_recovers_a_crashed_add(node, make_netns, faults_on):
    ns_a, ns_b = make_netns(), make_netns()
    assert node.add(ns_a, "pod-a")[0] == 0
    code, out, err = node.add(ns_b, "pod-b", fault="add:ipam-done")
    assert code == KILLED, (code, out, err)
    assert node.phases() == {"pod-a": "ready", "pod-b": "adding"}
    assert dict(links_named(ns_b)).get("ifb-eth0") == "ifb"  # shaped before the crash
    gc_conf = node.conf() | {
        "cniVersion": "1.1.0",
        "cni.dev/valid-attachments": [
            {"containerID": "pod-a", "ifname": "eth0"},
            {"containerID": "pod-b", "ifname": "eth0"},
        ],
    }
    code, out, err = run_plugin("GC", gc_conf, container_id="", netns="", ifname="", cni_args=None)
    assert code == 0, (out, err)
    assert node.phases() == {"pod-a": "ready"}  # pod-b is "valid" but its ADD died: undone
    assert link_in_netns(ns_b, "eth0") is None and list(node.ip_holders().values()) == ["pod-a"]
    assert [name for name, _ in links_named(ns_b)] == ["lo"]  # its ifb device went with it
    assert node.delete(ns_a, "pod-a")[0] == 0


def test_repair_charges_links_no_attachment_names(node, make_netns):
    """A macvlan on an inventory NIC in a netns the state does not know is charged with its
    NIC's whole capacity (its share is unknown), so the NIC is never promised twice; the
    pod's DEL (same netns and ifname) releases the placeholder."""
    from pyroute2 import IPRoute

    ns_a, ns_x = make_netns(), make_netns()
    assert node.add(ns_a, "pod-a")[0] == 0
    with IPRoute() as ipr:
        (parent,) = ipr.link_lookup(ifname=node.parents["nic-b"])
        fd = os.open(ns_x, os.O_RDONLY)
        try:
            ipr.link("add", ifname="stray0", kind="macvlan", link=parent, macvlan_mode="bridge", net_ns_fd=fd)
        finally:
            os.close(fd)
    _corrupt(node.state_dir / "state.json", "truncated")
    code, out, err = repair(node, "--json")
    assert code == 0, err
    changes = json.loads(out)["changes"]
    assert any(
        c.startswith(f"untracked link stray0 in {ns_x} on {node.parents['nic-b']}: charged the whole")
        for c in changes
    ), changes
    assert not any("untracked link eth0" in c for c in changes)  # pod-a's link is tracked
    assert node.consumed() == {
        "nic-a": {"bandwidth": Quantity.parse("1G")},
        "nic-b": {"bandwidth": Quantity.parse("10G")},
    }
    # nic-b is full until the stray link's pod is deleted: a new 1G pod goes to nic-a
    ns_c = make_netns()
    assert node.add(ns_c, "pod-c")[0] == 0
    assert node.state().find(NET, "pod-c", "eth0").device == "nic-a"
    code, out, err = node.delete(ns_x, "pod-x", ifname="stray0")
    assert code == 0, (out, err)
    assert node.consumed() == {"nic-a": {"bandwidth": Quantity.parse("2G")}}
    assert node.delete(ns_a, "pod-a")[0] == 0
    assert node.delete(ns_c, "pod-c")[0] == 0


# -- 7. repair and DEL beside an ADD or a DEL still running ------------------------------------
def _stopped_add(node: NodeBed, ns: str, cid: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """An in-process ADD stopped (SIGSTOP) once its link and ifb device exist, while it waits
    for IPAM (host-local behind a wrapper that sleeps 2 s first): (the plugin process, the
    pid its intent names, stopped)."""
    import time

    slow = tmp_path / "slow-ipam"
    slow.mkdir(exist_ok=True)
    (slow / "host-local").write_text(
        f'#!/bin/sh\n[ "$CNI_COMMAND" = ADD ] && sleep 2\nexec {CNI_PATH}/host-local "$@"\n'
    )
    (slow / "host-local").chmod(0o755)
    env = {
        **_PLUGIN_ENV,
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": ns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": f"{slow}:{CNI_PATH}",
        "CNI_ARGS": pod_args(cid),
        "CNI_DRA_AGENT": "off",
    }
    conf = tmp_path / f"{cid}.json"
    conf.write_text(json.dumps(node.conf()))
    with conf.open("rb") as stdin:
        proc = subprocess.Popen(
            [CNI_EXE], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "ifb-eth0" in dict(links_named(ns)):
            att = node.state().find(NET, cid, "eth0")
            assert att is not None and att.phase == "adding" and att.owner is not None
            os.kill(att.owner.pid, signal.SIGSTOP)
            return proc, att.owner.pid
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the ADD never made its ifb device")


def test_repair_leaves_an_add_in_flight_alone_and_its_del_waits_for_it(node, make_netns, tmp_path):
    """``state repair`` while an ADD is stopped halfway (its link and ifb device made): on a
    healthy state nothing was lost, so the ADD keeps its intent; a DEL meanwhile answers code
    11 and removes nothing; the ADD, resumed, completes; then the DEL removes everything."""
    ns = make_netns()
    proc, pid = _stopped_add(node, ns, "pod-s", tmp_path)
    try:
        code, out, err = repair(node, "--json")
        assert code == 0, err
        assert not any("pod-s" in line for line in json.loads(out)["changes"]), out
        assert node.phases() == {"pod-s": "adding"}
        code, out, err = node.delete(ns, "pod-s")
        assert code == 1 and out["code"] == 11, (out, err)
        assert dict(links_named(ns)).get("eth0") == "macvlan"
    finally:
        os.kill(pid, signal.SIGCONT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, (stdout, stderr)
    assert node.phases() == {"pod-s": "ready"}
    code, out, err = node.delete(ns, "pod-s")
    assert code == 0, (out, err)
    assert [name for name, _ in links_named(ns)] == ["lo"]
    assert node.phases() == {} and node.consumed() == {} and node.ip_holders() == {}


def test_repair_undoes_an_add_killed_halfway_with_its_ifb_device(node, make_netns, tmp_path):
    """The stopped ADD is killed instead: repair undoes it (link, ifb device, IP, capacity),
    as recovery would; nothing of it is left in the pod."""
    ns = make_netns()
    proc, pid = _stopped_add(node, ns, "pod-k", tmp_path)
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    code, out, err = repair(node, "--json")
    assert code == 0, err
    assert any(
        line.startswith("dropped attachment relnet/pod-k/eth0") for line in json.loads(out)["changes"]
    ), out
    assert [name for name, _ in links_named(ns)] == ["lo"]
    assert node.phases() == {} and node.consumed() == {} and node.ip_holders() == {}


def test_two_dels_of_one_attachment_at_once_both_succeed(node, make_netns):
    """The runtime's DEL and a retry of it (one through /run/netns, one through /var/run/netns)
    race to delete the link and its ifb device: what the other one deleted is done."""
    for round_ in range(6):
        ns = make_netns()
        cid = f"pod-r{round_}"
        assert node.add(ns, cid)[0] == 0
        procs = []
        for path in (ns, "/run/netns/" + os.path.basename(ns)):
            env = {
                **_PLUGIN_ENV,
                "CNI_COMMAND": "DEL",
                "CNI_CONTAINERID": cid,
                "CNI_NETNS": path,
                "CNI_IFNAME": "eth0",
                "CNI_PATH": CNI_PATH,
                "CNI_ARGS": pod_args(cid),
            }
            proc = subprocess.Popen(
                [CNI_EXE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
            )
            procs.append(proc)
        for proc in procs:
            stdout, stderr = proc.communicate(json.dumps(node.conf()).encode(), timeout=60)
            assert proc.returncode == 0, (stdout, stderr)
        assert [name for name, _ in links_named(ns)] == ["lo"]
        assert node.phases() == {} and node.ip_holders() == {}
