"""The whole agent in-process (no root: its one NIC is the loopback device), against the
local API stand-in: publish, prepare over gRPC, status records written asynchronously,
drift repair, restart without loss, cleanup, extra services."""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading

import grpc
import pytest
import yaml

from cni_dra.agent.service import Agent, AgentConfig
from cni_dra.k8s.protos import load
from cni_dra.state import Attachment, ClaimRef, StateStore
from cni_dra.state.claim_status import claim_status_record
from tests import builders
from tests.k8s_apiserver import DRIVER, FakeApiServer, allocated_claim, inventory_doc, write_kubeconfig

SHARE = "2c9b8a7d-6e5f-4a3b-9c1d-0e2f3a4b5c6d"
SLICE = "node-1-net.cni-dra.dev"


wait_for = functools.partial(builders.wait_for, timeout_s=30.0)


class FakeService:
    def __init__(self) -> None:
        self.events: list[str] = []

    def start(self) -> None:
        self.events.append("start")

    def stop(self) -> None:
        self.events.append("stop")


@pytest.fixture
def env():
    short = tempfile.mkdtemp(prefix="cda", dir="/tmp")
    inv = f"{short}/inv.yaml"
    with open(inv, "w") as fh:
        yaml.safe_dump(inventory_doc("node-1", {"lo-nic": "lo"}), fh)
    with FakeApiServer() as server:
        server.add_node("node-1")
        yield server, short, inv
    shutil.rmtree(short)


def config(short, inv, server, **kw) -> AgentConfig:
    base = dict(
        node_name="node-1",
        inventory=inv,
        state_dir=f"{short}/state",
        kubeconfig=write_kubeconfig(f"{short}/kubeconfig", server.url),
        plugin_dir=f"{short}/plugins",
        registry_dir=f"{short}/reg",
        metrics_address="127.0.0.1:0",
        resync_s=0.3,
        poll_s=0.05,
        fastpath_socket=f"{short}/fastpath/agent.sock",
        fastpath_processes=1,
    )
    base.update(kw)
    return AgentConfig(**base)


class Running:
    def __init__(self, cfg: AgentConfig) -> None:
        self.agent = Agent(cfg)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> Agent:
        self.thread.start()
        return self.agent

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def prepare(agent: Agent, claim) -> object:
    pb2, services = load("dra_v1")
    wait_for(lambda: agent.plugin.dra_socket.is_socket())
    with grpc.insecure_channel(f"unix://{agent.plugin.dra_socket}") as ch:
        return services.DRAPluginStub(ch).NodePrepareResources(
            pb2.NodePrepareResourcesRequest(
                claims=[
                    pb2.Claim(
                        namespace="default", uid=claim["metadata"]["uid"], name=claim["metadata"]["name"]
                    )
                ]
            ),
            timeout=10,
        )


def test_agent_lifecycle_restart_loses_nothing(env):
    server, short, inv = env
    fake = FakeService()
    claim = server.add_claim(
        allocated_claim(
            "c1", pool="node-1", device="lo-nic", bandwidth="3G", share_id=SHARE, pod_uids=["pod-a"]
        )
    )
    uid = claim["metadata"]["uid"]
    with Running(config(short, inv, server, cleanup=True, extra=[fake])) as agent:
        slice_ = wait_for(lambda: server.slices.get(SLICE))
        (dev,) = slice_["spec"]["devices"]
        assert dev["attributes"]["ifName"] == {"string": "lo"} and dev["attributes"]["mtu"]["int"] > 0
        assert slice_["metadata"]["ownerReferences"][0]["uid"] == server.nodes["node-1"]["metadata"]["uid"]
        assert prepare(agent, claim).claims[uid].devices[0].share_id == SHARE
        assert fake.events == ["start"]
        # drift: the slice vanishes; the periodic resync puts it back
        with server.lock:
            del server.slices[SLICE]
        wait_for(lambda: SLICE in server.slices)
    assert fake.events == ["start", "stop"]
    assert SLICE not in server.slices  # --cleanup
    assert not agent.plugin.dra_socket.exists() and not agent.plugin.registration_socket.exists()
    # While no agent runs, a claim-mode ADD completes: it leaves its record in the state.
    store = StateStore(f"{short}/state")
    assert list(store.read().claims) == ["pod-a"]  # prepared claims survived the restart
    with store.transaction() as txn:
        att = Attachment(
            network="n",
            containerID="c1",
            ifname="net1",
            podUID="pod-a",
            driver=DRIVER,
            pool="node-1",
            device="lo-nic",
            parent="lo",
            consumedCapacity={"bandwidth": "3G"},
            shareID=SHARE,
            claim=ClaimRef(namespace="default", name="c1", uid=uid, request="net1"),
            phase="ready",
            result={
                "interfaces": [{"name": "net1", "mac": "02:aa:bb:cc:dd:ee", "sandbox": "/x"}],
                "ips": [{"address": "192.0.2.44/24", "interface": 0}],
            },
        )
        txn.put(att)
        txn.add_status_update(claim_status_record(att))
    with Running(config(short, inv, server)) as agent:
        wait_for(lambda: server.slices.get(SLICE))
        entry = wait_for(
            lambda: (server.claims[("default", "c1")].get("status", {}).get("devices") or [None])[0]
        )
        assert entry["networkData"] == {
            "interfaceName": "net1",
            "ips": ["192.0.2.44/24"],
            "hardwareAddress": "02:aa:bb:cc:dd:ee",
        }
        wait_for(lambda: store.read().statusUpdates == [])
        # the kubelet prepares again after the restart: same answer, still one copy per pod
        assert prepare(agent, claim).claims[uid].devices[0].share_id == SHARE
        (copy_,) = store.read().claims["pod-a"]
        assert copy_["status"]["allocation"] == claim["status"]["allocation"]
        with urllib_open(f"http://127.0.0.1:{agent.metrics_port}/metrics") as text:
            assert 'cni_dra_status_updates_total{outcome="applied"} 1.0' in text
            assert 'cni_dra_prepare_total{result="ok"} 1.0' in text
    assert SLICE in server.slices  # no --cleanup: the slice stays
    assert server.invalid == []


class urllib_open:  # noqa: N801 - a tiny context manager returning the body text
    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url, timeout=5) as resp:
            return resp.read().decode()

    def __exit__(self, *exc) -> None:
        pass


def test_publish_failures_are_retried(env):
    server, short, inv = env
    server.fail("POST", r".*/resourceslices", 503, count=2)
    with Running(config(short, inv, server)):
        wait_for(lambda: SLICE in server.slices)
    assert len(server.requests_for("POST", r".*/resourceslices")) == 3


def test_agent_runs_the_fast_path_service(env):
    """The fast path is one of the agent's services: its socket (0600) serves plugin
    invocations while the agent runs, and is gone once it stopped."""
    import os
    import stat

    from cni_dra.fastpath.client import ask_agent

    server, short, inv = env
    cfg = config(short, inv, server)
    with Running(cfg) as agent:
        wait_for(lambda: os.path.exists(cfg.fastpath_socket))
        assert stat.S_IMODE(os.stat(cfg.fastpath_socket).st_mode) == 0o600
        assert agent.fastpath in agent.services
        answer = ask_agent(
            {b"CNI_COMMAND": b"VERSION"}, b'{"cniVersion": "1.0.0"}', cfg.fastpath_socket, timeout_s=30
        )
        assert answer is not None and answer[0] == 0 and b"supportedVersions" in answer[1]
    assert not os.path.exists(cfg.fastpath_socket)


def test_agent_taints_a_missing_nic_reports_it_to_the_kubelet_then_drops_it(env):
    """Unprivileged: the inventory names an interface the host lacks. The agent publishes
    that device tainted ``missing`` (and the loopback NIC untainted), its health stream
    says UNHEALTHY for it and HEALTHY for the other, the registration advertises the
    stream, and after ``keep_missing_s`` the device leaves the slice."""
    server, short, inv = env
    with open(inv, "w") as fh:
        yaml.safe_dump(inventory_doc("node-1", {"lo-nic": "lo", "gone-nic": "cdnoexist0"}), fh)
    cfg = config(short, inv, server, keep_missing_s=2.0, resync_s=3600, taint_effect="NoExecute")
    with Running(cfg) as agent:
        slice_ = wait_for(lambda: server.slices.get(SLICE))
        devs = {d["name"]: d for d in slice_["spec"]["devices"]}
        assert "taints" not in devs["lo-nic"]
        (taint,) = devs["gone-nic"]["taints"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            f"{DRIVER}/unhealthy",
            "missing",
            "NoExecute",
        )
        pb2, services = load("dra_health_v1")
        wait_for(lambda: agent.plugin.dra_socket.is_socket())
        with grpc.insecure_channel(f"unix://{agent.plugin.dra_socket}") as ch:
            stream = services.DRAResourceHealthStub(ch).NodeWatchResources(
                pb2.NodeWatchResourcesRequest(), timeout=10
            )
            report = {
                d.device.device_name: (
                    pb2.HealthStatus.Name(d.health),
                    d.message,
                    d.health_check_timeout_seconds,
                )
                for d in next(stream).devices
            }
            stream.cancel()
        assert report["lo-nic"] == ("HEALTHY", "host NIC lo is up", 60)
        assert report["gone-nic"][0] == "UNHEALTHY"
        assert report["gone-nic"][1].startswith("host NIC cdnoexist0 does not exist (since ")
        assert "v1.DRAResourceHealth" in agent.plugin.supported_versions()
        # kept 2 s after it was first seen missing, then left out (no resync due: the agent wakes for it)
        wait_for(lambda: [d["name"] for d in server.slices[SLICE]["spec"]["devices"]] == ["lo-nic"])
        with urllib_open(f"http://127.0.0.1:{agent.metrics_port}/metrics") as text:
            assert 'cni_dra_device_link_up{device="gone-nic",ifname="cdnoexist0"} 0.0' in text
            assert 'cni_dra_device_link_up{device="lo-nic",ifname="lo"} 1.0' in text
    assert server.invalid == []
