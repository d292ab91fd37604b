"""The agent's node for root tests: a node bed (two veth NICs eth-a and eth-b on pool
``node-1``), the installed ``cni-dra agent`` run against the local API stand-in with its
sockets in a short temporary directory, and the kubelet's and runtime's calls played
from the test (gRPC stubs from the same protos; the installed plugin). Used by
``test_agent_e2e.py`` and ``test_agent_nic_health.py``."""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import grpc

from cni_dra.k8s.protos import load
from netns_tests.bed import NodeBed
from netns_tests.runner import CNI_EXE, k8s_cni_args, run_plugin
from tests import builders
from tests.k8s_apiserver import DRIVER, FakeApiServer, write_kubeconfig

__all__ = ["NODE", "SLICE", "SUBNET", "POD_UID", "Node", "dra", "free_port"]

NODE = "node-1"
SLICE = f"{NODE}-{DRIVER}"
SUBNET = "192.0.2.0/24"
POD_UID = "7a1e2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b"

wait_for = functools.partial(builders.wait_for, timeout_s=40.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """The node bed (eth-a, eth-b on pool ``node-1``) with the agent's processes and sockets."""

    def __init__(self, make_netns, make_parent_nic, tmp_path: Path, server: FakeApiServer) -> None:
        self.bed = NodeBed(
            tmp_path,
            [make_parent_nic(), make_parent_nic()],
            devices=["eth-a", "eth-b"],
            pool=NODE,
            network="dra-net",
            version="1.1.0",
            make_netns=make_netns,
        )
        self.nics = self.bed.parents
        self.make_netns = make_netns
        self.server = server
        self.short = tempfile.mkdtemp(prefix="cde", dir="/tmp")  # short unix socket paths
        self.state_dir = self.bed.state_dir
        self.inventory = self.bed.inventory
        self.kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), server.url)
        self.log = tmp_path / "agent.log"
        self.procs: list[subprocess.Popen] = []

    def start_agent(self, *extra: str) -> subprocess.Popen:
        self.metrics_port = free_port()
        args = [
            CNI_EXE,
            "agent",
            "--node-name",
            NODE,
            "--kubeconfig",
            self.kubeconfig,
            "--inventory",
            str(self.inventory),
            "--state-dir",
            str(self.state_dir),
            "--plugin-dir",
            f"{self.short}/plugins",
            "--registry-dir",
            f"{self.short}/registry",
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
            "--resync-interval",
            "3600",
            *extra,
        ]
        with open(self.log, "a") as log:
            # the fast-path socket in this test's directory, never the node's /run/cni-dra one
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={
                    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                    "CNI_DRA_AGENT_SOCKET": f"{self.short}/fastpath/agent.sock",
                },
            )
        self.procs.append(proc)
        wait_for(
            lambda: Path(f"{self.short}/registry/{DRIVER}-reg.sock").is_socket() or proc.poll() is not None,
            what="agent sockets",
        )
        assert proc.poll() is None, self.log.read_text()
        return proc

    @property
    def dra_socket(self) -> str:
        return f"unix://{self.short}/plugins/dra.sock"

    def conf(self, **kw) -> dict:
        conf = {
            "cniVersion": "1.1.0",
            "name": "dra-net",
            "type": "cni-dra",
            "driver": DRIVER,
            "stateDir": str(self.state_dir),
            "inventory": str(self.inventory),
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": SUBNET}]],
                "dataDir": str(self.state_dir.parent / "ipam"),
            },
        }
        conf.update(kw)
        return conf

    def cni(self, command: str, netns: str, conf: dict | None = None):
        return run_plugin(
            command,
            conf or self.conf(),
            container_id="ctr-1",
            netns=netns,
            ifname="net1",
            cni_args=k8s_cni_args(namespace="default", name="pod-0", uid=POD_UID, infra_container_id="ctr-1"),
        )

    def state(self) -> dict:
        return self.bed.state_doc()  # snapshot + journal

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.short, ignore_errors=True)


def dra(node: Node, method: str, claim: dict):
    pb2, services = load("dra_v1")
    ref = pb2.Claim(
        namespace=claim["metadata"]["namespace"], uid=claim["metadata"]["uid"], name=claim["metadata"]["name"]
    )
    with grpc.insecure_channel(node.dra_socket) as ch:
        stub = services.DRAPluginStub(ch)
        if method == "prepare":
            return stub.NodePrepareResources(pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=20)
        return stub.NodeUnprepareResources(pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=20)
