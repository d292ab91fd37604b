"""The node agent end to end on this machine: the installed ``cni-dra agent`` against
the local API stand-in (tests/k8s_apiserver.py), the kubelet's side played over the
agent's unix sockets with stubs from the same protos, the runtime's side played by
running the installed plugin, two veth pairs as the NICs eth-a and eth-b.

Sequence: the agent publishes the slice (a link change re-publishes it at once); a claim
allocated on eth-b (consumedCapacity bandwidth 3G, a shareID, reservedFor a pod UID) is
prepared over gRPC; the agent is killed (SIGKILL); the CNI ADD for that pod runs while no
agent runs and lands on eth-b; a new agent writes the claim's status (networkData with
the interface name, its IP in CIDR form and its MAC, for that shareID); unprepare over
gRPC and DEL leave no claim, attachment, status record or consumed capacity; SIGTERM with
--cleanup deletes the slice. Expected values come from the kernel (pyroute2, sysfs) and
the test's own inputs, never from cni-dra.
"""

from __future__ import annotations

import functools
import os
import signal
import uuid
from pathlib import Path

import grpc
import pytest

from cni_dra.k8s.protos import load
from netns_tests.agent_node import NODE, POD_UID, SLICE, Node, dra
from netns_tests.runner import cni_dra_status, host_ifindex, link_in_netns
from tests import builders
from tests.k8s_apiserver import DRIVER, FakeApiServer, allocated_claim

SHARE = "0f9e8d7c-6b5a-4c3d-9e2f-1a0b9c8d7e6f"


wait_for = functools.partial(builders.wait_for, timeout_s=40.0)


def sysfs(ifname: str, attr: str) -> str:
    return Path(f"/sys/class/net/{ifname}/{attr}").read_text().strip()


def set_mtu(ifname: str, mtu: int) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], mtu=mtu)


@pytest.fixture
def node(make_netns, make_parent_nic, tmp_path):
    with FakeApiServer() as server:
        server.add_node(NODE)
        n = Node(make_netns, make_parent_nic, tmp_path, server)
        try:
            yield n
        finally:
            n.close()


def test_agent_end_to_end(node):
    server = node.server
    agent = node.start_agent()
    # -- the slice -------------------------------------------------------------------------
    published = wait_for(lambda: server.slices.get(SLICE), what="slice published")
    devices = {d["name"]: d for d in published["spec"]["devices"]}
    assert sorted(devices) == ["eth-a", "eth-b"]
    for dev, ifname in node.nics.items():
        attrs = devices[dev]["attributes"]
        assert attrs["ifName"] == {"string": ifname}
        assert attrs["mac"] == {"string": sysfs(ifname, "address")}
        assert attrs["mtu"] == {"int": int(sysfs(ifname, "mtu"))}
        assert devices[dev]["allowMultipleAllocations"] is True
        assert devices[dev]["capacity"]["bandwidth"]["value"] == "10G"
    assert published["spec"]["pool"]["generation"] == 1
    assert published["metadata"]["ownerReferences"][0]["uid"] == server.nodes[NODE]["metadata"]["uid"]
    # a NIC change is published at once (resync is an hour away): netlink link events
    set_mtu(node.nics["eth-b"], 1400)
    wait_for(lambda: server.slices[SLICE]["spec"]["pool"]["generation"] == 2, what="re-publish on link event")
    eth_b = [d for d in server.slices[SLICE]["spec"]["devices"] if d["name"] == "eth-b"][0]
    assert eth_b["attributes"]["mtu"] == {"int": 1400}
    # -- registration, as the kubelet's plugin watcher does it --------------------------------
    pb2, services = load("pluginregistration_v1")
    with grpc.insecure_channel(f"unix://{node.short}/registry/{DRIVER}-reg.sock") as ch:
        info = services.RegistrationStub(ch).GetInfo(pb2.InfoRequest(), timeout=20)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, f"{node.short}/plugins/dra.sock")
    assert "v1.DRAPlugin" in info.supported_versions
    # -- prepare over gRPC -------------------------------------------------------------------
    claim = server.add_claim(
        allocated_claim(
            "pod-0-net", pool=NODE, device="eth-b", bandwidth="3G", share_id=SHARE, pod_uids=[POD_UID]
        )
    )
    uid = claim["metadata"]["uid"]
    resp = dra(node, "prepare", claim).claims[uid]
    assert resp.error == ""
    assert [(d.pool_name, d.device_name, d.share_id) for d in resp.devices] == [(NODE, "eth-b", SHARE)]
    assert [c["metadata"]["uid"] for c in node.state()["claims"][POD_UID]] == [uid]
    # -- the agent crashes; ADD runs while no agent runs ---------------------------------------
    agent.send_signal(signal.SIGKILL)
    agent.wait(10)
    netns = node.make_netns()
    code, result, err = node.cni("ADD", netns)
    assert code == 0, (result, err)
    link = link_in_netns(netns, "net1")
    assert link["parent_ifindex"] == host_ifindex(node.nics["eth-b"])  # the kernel: on eth-b
    (att,) = cni_dra_status(node.state_dir, node.inventory)["attachments"]
    assert (att["device"], att["shareID"], att["consumedCapacity"]) == ("eth-b", SHARE, {"bandwidth": "3G"})
    consumed = {
        d["name"]: d["consumed"]["bandwidth"]
        for d in cni_dra_status(node.state_dir, node.inventory)["devices"]
    }
    assert consumed == {"eth-a": "0", "eth-b": "3G"}
    (pending,) = node.state()["statusUpdates"]  # ADD left its record; nobody wrote the claim yet
    assert pending["claim"]["uid"] == uid
    assert "devices" not in (server.claims[("default", "pod-0-net")].get("status") or {})
    # -- a new agent writes the claim status -------------------------------------------------
    agent = node.start_agent("--cleanup")
    entry = wait_for(
        lambda: (server.claims[("default", "pod-0-net")]["status"].get("devices") or [None])[0],
        what="claim status written",
    )
    assert (entry["driver"], entry["pool"], entry["device"], entry["shareID"]) == (
        DRIVER,
        NODE,
        "eth-b",
        SHARE,
    )
    assert entry["networkData"] == {
        "interfaceName": "net1",
        "ips": link["ipv4"],
        "hardwareAddress": link["mac"],
    }
    assert [ip.split("/")[1] for ip in link["ipv4"]] == ["24"]
    assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")]
    patches = server.requests_for("PATCH", r".*/resourceclaims/pod-0-net/status")
    assert {p.content_type for p in patches} == {"application/apply-patch+yaml"}
    assert {p.query["fieldManager"][0] for p in patches} == {DRIVER}
    wait_for(lambda: node.state()["statusUpdates"] == [], what="record removed")
    # the kubelet prepares again after the restart: nothing lost, nothing doubled
    assert dra(node, "prepare", claim).claims[uid].devices[0].share_id == SHARE
    assert len(node.state()["claims"][POD_UID]) == 1
    # -- teardown as the kubelet and the runtime do it ----------------------------------------
    code, out, err = node.cni("DEL", netns)
    assert code == 0, (out, err)
    wait_for(
        lambda: server.claims[("default", "pod-0-net")]["status"]["devices"] == [],
        what="the DEL'd share's entry removed from the claim status",
    )
    assert dra(node, "unprepare", claim).claims[uid].error == ""
    state = node.state()
    assert (state["claims"], state["attachments"], state.get("statusUpdates", [])) == ({}, [], [])
    report = cni_dra_status(node.state_dir, node.inventory)
    assert {d["name"]: d["consumed"]["bandwidth"] for d in report["devices"]} == {"eth-a": "0", "eth-b": "0"}
    assert link_in_netns(netns, "net1") is None
    # -- metrics, then SIGTERM with --cleanup --------------------------------------------------
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'cni_dra_prepare_total{result="ok"} 1.0' in text
    assert 'cni_dra_status_updates_total{outcome="applied"}' in text
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(20) == 0, node.log.read_text()
    assert SLICE not in server.slices
    assert not os.path.exists(f"{node.short}/plugins/dra.sock")
    assert server.invalid == []


def test_failed_add_is_reported_on_the_claim(node):
    server = node.server
    node.start_agent()
    wait_for(lambda: server.slices.get(SLICE), what="slice published")
    share = str(uuid.uuid4())
    claim = server.add_claim(
        allocated_claim(
            "pod-0-net", pool=NODE, device="eth-a", bandwidth="1G", share_id=share, pod_uids=[POD_UID]
        )
    )
    assert dra(node, "prepare", claim).claims[claim["metadata"]["uid"]].error == ""
    netns = node.make_netns()
    code, out, _ = node.cni("ADD", netns, node.conf(ipam={"type": "no-such-ipam-plugin"}))
    assert code != 0 and out["code"] != 0
    entry = wait_for(
        lambda: (server.claims[("default", "pod-0-net")]["status"].get("devices") or [None])[0],
        what="failure written",
    )
    assert (entry["device"], entry["shareID"]) == ("eth-a", share)
    (cond,) = entry["conditions"]
    assert (cond["type"], cond["status"]) == ("Ready", "False")
    assert f"code {out['code']}" in cond["message"]
    assert "networkData" not in entry
    assert node.state()["attachments"] == []  # the rollback released everything
    assert server.invalid == []
