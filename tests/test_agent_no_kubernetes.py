"""``cni-dra agent`` without Kubernetes (no root: its one NIC is the loopback device): with
no kubeconfig outside a cluster, or with ``--no-kubernetes``, it serves the fast path and
the metrics and never asks an API server; with a kubeconfig it is the Kubernetes agent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest
import yaml

from cni_dra.agent.service import Agent, AgentConfig, kubernetes_mode
from cni_dra.fastpath.client import ask_agent
from tests.builders import wait_for
from tests.k8s_apiserver import inventory_doc, write_kubeconfig


@pytest.mark.parametrize(
    "flag, kubeconfig, environ, want",
    [
        (False, None, {}, False),
        (False, "/k", {}, True),
        (False, None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, True),
        (True, "/k", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, False),
        (False, "", {"KUBERNETES_SERVICE_HOST": ""}, False),
    ],
    ids=["nothing", "kubeconfig", "in-cluster", "flag-wins", "empty"],
)
def test_kubernetes_mode(flag, kubeconfig, environ, want):
    got, why = kubernetes_mode(flag, kubeconfig, environ)
    assert got is want and why


class CountingListener:
    """A TCP port that counts the connections made to it (an API server nobody should ask)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)


@pytest.fixture
def short():
    d = tempfile.mkdtemp(prefix="cdnk", dir="/tmp")
    with open(f"{d}/inv.yaml", "w") as fh:
        yaml.safe_dump(inventory_doc("node-1", {"lo-nic": "lo"}), fh)
    api = CountingListener()
    yield d, api
    api.close()
    shutil.rmtree(d)


def _run_agent(d: str, *args: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """``cni-dra agent`` of this tree as a process; returns it and its log file."""
    log = f"{d}/agent.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from cni_dra.main import main; main()",
                "agent",
                "--inventory",
                f"{d}/inv.yaml",
                "--state-dir",
                f"{d}/state",
                "--fastpath-socket",
                f"{d}/fp/agent.sock",
                "--fastpath-processes",
                "1",
                "--metrics-address",
                "127.0.0.1:0",
                "--log-level",
                "info",
                *args,
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=os.getcwd(),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.getcwd(), **env},
        )
    return proc, log


def _served(d: str) -> bool:
    if not os.path.exists(f"{d}/fp/agent.sock"):
        return False
    answer = ask_agent({b"CNI_COMMAND": b"VERSION"}, b'{"cniVersion": "1.0.0"}', f"{d}/fp/agent.sock")
    return answer is not None and answer[0] == 0


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("case", ["no-kubeconfig", "no-kubernetes-flag"])
def test_agent_without_kubernetes_serves_and_never_asks_an_api_server(short, case):
    d, api = short
    kubeconfig = write_kubeconfig(f"{d}/kubeconfig", f"http://127.0.0.1:{api.port}")
    if case == "no-kubeconfig":
        args: tuple[str, ...] = ()
        env: dict[str, str] = {}  # no KUBECONFIG, no KUBERNETES_SERVICE_HOST, no --node-name
        why = "no kubeconfig and not in a cluster"
    else:  # a kubeconfig and the in-cluster variables are there, and ignored
        args = ("--no-kubernetes", "--kubeconfig", kubeconfig, "--node-name", "node-1")
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
        why = "--no-kubernetes"
    proc, log = _run_agent(d, *args, env=env)
    try:
        wait_for(lambda: _served(d) or proc.poll() is not None, timeout_s=60, what="the fast path")
        assert proc.poll() is None, _read(log)
        text = _read(log)
        assert f"without Kubernetes: {why}" in text and "running without Kubernetes" in text, text
        port = int(text.split("metrics on 127.0.0.1:0 (port ")[1].split(")")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert b"cni_dra_" in resp.read()
        time.sleep(1.0)  # a loop or two: still nobody asked
        assert api.connections == 0
        assert not os.path.exists(
            f"{d}/state/cluster-features.json"
        )  # auto: nothing to learn, nothing written
    finally:
        _stop(proc)
    assert proc.returncode == 0, _read(log)
    assert "Traceback" not in _read(log)


def test_with_a_kubeconfig_the_agent_is_the_kubernetes_agent(short):
    """The same command with a kubeconfig and without the flag wants the API server: it
    needs --node-name, and then asks the server (the stand-in counts the attempts)."""
    d, api = short
    kubeconfig = write_kubeconfig(f"{d}/kubeconfig", f"http://127.0.0.1:{api.port}")
    proc, log = _run_agent(d, "--kubeconfig", kubeconfig, env={})
    assert proc.wait(60) == 2, _read(log)
    assert "--node-name (NODE_NAME) is required with Kubernetes (kubeconfig" in _read(log)
    proc, log = _run_agent(
        d,
        "--kubeconfig",
        kubeconfig,
        "--node-name",
        "node-1",
        "--plugin-dir",
        f"{d}/plugins",
        "--registry-dir",
        f"{d}/reg",
        env={},
    )
    try:
        wait_for(lambda: api.connections > 0 or proc.poll() is not None, timeout_s=60, what="a connection")
        assert api.connections > 0, _read(log)
    finally:
        _stop(proc)


def test_agent_without_kubernetes_records_the_operators_fractional_range(short):
    """In-process: no Kubernetes parts, and ``on`` recorded for the plugin's allocation."""
    from cni_dra.state import StateStore
    from cni_dra.state.cluster_features import read_features

    d, _api = short
    cfg = AgentConfig(
        node_name="",
        inventory=f"{d}/inv.yaml",
        state_dir=f"{d}/state",
        kubernetes=False,
        metrics_address="",
        poll_s=0.05,
        fastpath_socket=f"{d}/fp/agent.sock",
        fastpath_processes=1,
        fractional_capacity_range="on",
    )
    agent = Agent(cfg)
    assert agent.kube is None and [type(s).__name__ for s in agent.services] == [
        "LinkWatch",
        "FastpathService",
    ]
    with pytest.raises(RuntimeError, match="without Kubernetes"):
        agent.publisher  # noqa: B018
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        features = wait_for(
            lambda: (
                os.path.exists(f"{d}/state/cluster-features.json") and read_features(StateStore(f"{d}/state"))
            ),
            what="the record",
        )
        assert features.fractional_capacity_range is True
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
