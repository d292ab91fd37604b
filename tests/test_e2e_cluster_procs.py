"""The real-cluster bed's process bookkeeping (scripts/e2e/cluster_procs.py), without a cluster.

A component the bed started is "running" until it exits, whatever its /proc command line
says at that moment: right after an exec the command line can read empty, and the bed once
declared a just-started containerd dead for it and failed the whole real-cluster stage.
A node's components run under ``nsenter`` and with the node's default paths, so their
command lines need not name the bed at all: a pid file holds the pid and the process's
start time, and only that pair is the bed's process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("CNI_DRA_E2E_DIR", str(tmp_path / "bed"))
    # a fresh module: it reads CNI_DRA_E2E_DIR when it is loaded
    spec = importlib.util.spec_from_file_location(
        "cni_dra_e2e_cluster_procs_unit", _REPO / "scripts/e2e/cluster_procs.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        for proc in list(mod._PROCS.values()):
            proc.kill()
            proc.wait(5)
        sys.modules.pop(spec.name, None)


def test_a_started_child_runs_while_its_command_line_does_not_name_the_bed(cluster) -> None:
    # "sleep 30" does not name the bed directory: exactly what /proc shows of a child
    # caught between its exec and the setup of its arguments
    pid = cluster.start("containerd", ["sleep", "30"])
    assert str(cluster.DIR).encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert cluster.running("containerd")
    assert cluster.pid_of("containerd") == pid


def test_a_started_child_that_exited_is_not_running(cluster) -> None:
    pid = cluster.start("containerd", ["true"])
    cluster._PROCS["containerd"].wait(5)
    assert not cluster.running("containerd")
    assert cluster.pid_of("containerd") is None
    assert not Path(f"/proc/{pid}").exists()


def test_a_pid_file_naming_a_foreign_process_is_not_ours(cluster) -> None:
    # another process's pid in the pid file (pid reuse after a crash of the bed): never ours
    cluster.pidfile("kubelet").parent.mkdir(parents=True, exist_ok=True)
    cluster.pidfile("kubelet").write_text("1")
    assert cluster.pid_of("kubelet") is None


def test_a_live_pid_started_at_another_time_is_not_ours(cluster) -> None:
    # a node's kubelet ran as pid P and died; P now belongs to a process started later
    name = "cni-dra-e2e-2/kubelet"
    pid = cluster.start(name, ["sleep", "30"])
    proc = cluster._PROCS.pop(name)  # as another process (the test run, cluster.py down) sees it
    try:
        started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        assert cluster.pid_of(name) == pid
        cluster.pidfile(name).write_text(f"{pid} {started - 1}")
        assert cluster.pid_of(name) is None
        assert not cluster.running(name)
        cluster.stop(name)  # signals nothing that is not its own
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(5)
