"""A NIC that fails, seen by the agent (root): the installed ``cni-dra agent`` against the
local API stand-in, two veth pairs as the NICs eth-a and eth-b, a pod attached to eth-b
through a prepared claim. eth-b is set down and up, loses its carrier (peer down), flaps
for less than the debounce, and is deleted and re-created, while the test watches what
the scheduler would see (the slice's device taints), what the kubelet would get (the
``DRAResourceHealth`` v1 stream, read over the agent's socket as the kubelet does), the
claim's ``Ready`` condition, the agent's log and its metrics. Expected values come from
the test's own inputs; times from the test's clock.
"""

from __future__ import annotations

import functools
import queue
import re
import threading
import time
import urllib.request

import grpc
import pytest
from pyroute2 import IPRoute

from cni_dra.k8s.protos import load
from netns_tests.agent_node import NODE, POD_UID, SLICE, Node, dra
from netns_tests.conftest import delete_host_link
from tests import builders
from tests.k8s_apiserver import DRIVER, FakeApiServer, allocated_claim

DEBOUNCE_S = 1.5
KEEP_MISSING_S = 4.0
SHARE = "3b2a1c0d-9e8f-4a7b-8c6d-5e4f3a2b1c0d"
KEY = f"{DRIVER}/unhealthy"

wait_for = functools.partial(builders.wait_for, timeout_s=DEBOUNCE_S + 10.0)


def set_state(ifname: str, state: str) -> None:
    with IPRoute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state=state)


def make_veth(name: str) -> None:
    with IPRoute() as ipr:
        ipr.link("add", ifname=name, kind="veth", peer=name + "p")
        for end in (name, name + "p"):
            ipr.link("set", index=ipr.link_lookup(ifname=end)[0], state="up")


class HealthStream:
    """The kubelet's side of ``NodeWatchResources`` v1: every report, with its arrival time."""

    def __init__(self, socket: str) -> None:
        pb2, services = load("dra_health_v1")
        self.pb2 = pb2
        self.channel = grpc.insecure_channel(socket)
        self.call = services.DRAResourceHealthStub(self.channel).NodeWatchResources(
            pb2.NodeWatchResourcesRequest()
        )
        self.reports: queue.Queue = queue.Queue()
        self.all: list[tuple[float, dict]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for msg in self.call:
                report = {
                    d.device.device_name: (
                        self.pb2.HealthStatus.Name(d.health),
                        d.message,
                        d.device.pool_name,
                        d.health_check_timeout_seconds,
                    )
                    for d in msg.devices
                }
                self.all.append((time.monotonic(), report))
        except grpc.RpcError:
            pass

    def latest(self) -> dict:
        return self.all[-1][1] if self.all else {}

    def eth_b(self) -> tuple[str, str]:
        return self.latest().get("eth-b", ("", ""))[:2]

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def node(make_netns, make_parent_nic, tmp_path):
    with FakeApiServer() as server:
        server.add_node(NODE)
        n = Node(make_netns, make_parent_nic, tmp_path, server)
        try:
            yield n
        finally:
            n.close()
            # eth-b may have been re-created by the test: the fixture's cleanup deletes it by name
            delete_host_link(n.nics["eth-b"])


def taints(node: Node, device: str = "eth-b") -> list[tuple[str, str, str]] | None:
    """(key, value, effect) of the device's taints in the published slice; None: not published."""
    for d in node.server.slices[SLICE]["spec"]["devices"]:
        if d["name"] == device:
            return [(t["key"], t["value"], t["effect"]) for t in d.get("taints") or []]
    return None


def ready(node: Node) -> tuple[str, str, dict]:
    """(status, reason, networkData) of the claim's one status entry; empty before it is written."""
    entries = node.server.claims[("default", "pod-0-net")].get("status", {}).get("devices") or []
    if not entries:
        return "", "", {}
    (entry,) = entries
    (cond,) = entry["conditions"]
    return cond["status"], cond["reason"], entry.get("networkData") or {}


def eth_b_log_lines(node: Node) -> list[str]:
    return [
        line for line in node.log.read_text().splitlines() if "cni_dra.agent.nichealth: device eth-b:" in line
    ]


def test_nic_down_up_flap_carrier_and_gone_are_seen_by_slice_kubelet_and_claim(node):
    server, eth_b = node.server, node.nics["eth-b"]
    node.start_agent("--nic-debounce", str(DEBOUNCE_S), "--keep-missing", str(KEEP_MISSING_S))
    wait_for(lambda: server.slices.get(SLICE), what="slice published")
    assert taints(node) == [] and taints(node, "eth-a") == []
    stream = HealthStream(node.dra_socket)
    try:
        wait_for(lambda: stream.eth_b()[0] == "HEALTHY", what="first health report")
        assert stream.latest()["eth-a"] == ("HEALTHY", f"host NIC {node.nics['eth-a']} is up", NODE, 60)
        # a pod on eth-b: prepared claim, CNI ADD, its claim status Ready
        claim = server.add_claim(
            allocated_claim(
                "pod-0-net", pool=NODE, device="eth-b", bandwidth="2G", share_id=SHARE, pod_uids=[POD_UID]
            )
        )
        assert dra(node, "prepare", claim).claims[claim["metadata"]["uid"]].error == ""
        netns = node.make_netns()
        code, result, err = node.cni("ADD", netns)
        assert code == 0, (result, err)
        wait_for(lambda: ready(node)[:2] == ("True", "InterfaceReady"), what="claim Ready")
        generation = server.slices[SLICE]["spec"]["pool"]["generation"]

        # -- a flap shorter than the debounce changes nothing ------------------------------------
        set_state(eth_b, "down")
        time.sleep(DEBOUNCE_S / 4)
        set_state(eth_b, "up")
        time.sleep(DEBOUNCE_S + 2.0)
        assert server.slices[SLICE]["spec"]["pool"]["generation"] == generation
        assert taints(node) == []
        assert all(r.get("eth-b", ("HEALTHY",))[0] == "HEALTHY" for _, r in stream.all)
        assert ready(node)[0] == "True"
        assert eth_b_log_lines(node) == []

        # -- set down: tainted after the debounce, Unhealthy, claim Ready=False -------------------
        t_down = time.monotonic()
        set_state(eth_b, "down")
        wait_for(lambda: taints(node) == [(KEY, "admin-down", "NoSchedule")], what="admin-down taint")
        assert time.monotonic() - t_down >= DEBOUNCE_S
        assert taints(node, "eth-a") == []
        wait_for(lambda: stream.eth_b()[0] == "UNHEALTHY", what="unhealthy report")
        assert re.fullmatch(rf"host NIC {eth_b} is administratively down \(since \S+Z\)", stream.eth_b()[1])
        status, reason, data = wait_for(lambda: ready(node)[1] == "LinkDown" and ready(node), what="LinkDown")
        assert status == "False" and data["interfaceName"] == "net1"  # networkData stays

        # -- up again: untainted, Healthy, Ready -----------------------------------------------------
        set_state(eth_b, "up")
        wait_for(lambda: taints(node) == [], what="taint removed")
        wait_for(lambda: stream.eth_b() == ("HEALTHY", f"host NIC {eth_b} is up"), what="healthy report")
        wait_for(lambda: ready(node)[:2] == ("True", "InterfaceReady"), what="Ready again")

        # -- carrier lost (the veth's peer down) ----------------------------------------------------
        set_state(eth_b + "p", "down")
        wait_for(lambda: taints(node) == [(KEY, "carrier-lost", "NoSchedule")], what="carrier-lost taint")
        wait_for(lambda: "has no carrier" in stream.eth_b()[1], what="no-carrier report")
        set_state(eth_b + "p", "up")
        wait_for(lambda: taints(node) == [], what="carrier back")

        # -- deleted: kept tainted 'missing', then dropped; re-created: back, its pod's link is not --
        delete_host_link(eth_b)
        t_gone = time.monotonic()
        wait_for(lambda: taints(node) == [(KEY, "missing", "NoSchedule")], what="missing taint")
        wait_for(
            lambda: stream.eth_b()[0] == "UNHEALTHY" and "does not exist" in stream.eth_b()[1],
            what="missing report",
        )
        wait_for(lambda: ready(node)[1] == "LinkMissing", what="LinkMissing")
        wait_for(lambda: taints(node) is None, what="dropped from the slice")
        assert time.monotonic() - t_gone >= KEEP_MISSING_S
        assert stream.eth_b()[0] == "UNHEALTHY"  # still reported to the kubelet
        make_veth(eth_b)
        wait_for(lambda: taints(node) == [], what="published again")
        wait_for(lambda: stream.eth_b()[0] == "HEALTHY", what="healthy after re-creation")
        time.sleep(1.0)
        assert ready(node)[1] == "LinkMissing"  # the pod's macvlan went with the old NIC

        # one log line per transition, none for the flap
        lines = eth_b_log_lines(node)
        assert len(lines) == 6, lines
        assert [
            "administratively down" in lines[0],
            "up again" in lines[1],
            "no carrier" in lines[2],
            "up again" in lines[3],
            "does not exist" in lines[4],
            "up again" in lines[5],
        ] == [True] * 6
        with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        labels = f'device="eth-b",ifname="{eth_b}"'
        assert f"cni_dra_device_link_up{{{labels}}} 1.0" in text
        for state, n in (("up", 3), ("admin-down", 1), ("carrier-lost", 1), ("missing", 1)):
            assert f'cni_dra_device_link_transitions_total{{{labels},state="{state}"}} {n}.0' in text
        code, out, err = node.cni("DEL", netns)
        assert code == 0, (out, err)
    finally:
        stream.close()
    assert server.invalid == []
