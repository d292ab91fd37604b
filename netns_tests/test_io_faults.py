"""ADD and DEL under I/O faults and on a full disk, run exactly as a runtime runs the plugin.

1. The matrix: an I/O fault (ENOSPC, EIO, a short write) at each state I/O call an ADD or
   a DEL makes in turn (:mod:`cni_dra.state.fsio`, armed by ``CNI_DRA_IO_FAULT`` and the
   root-owned test switch), in the plugin's own process and in the agent's fast-path worker.
2. A real full disk: the state directory on a 1 MiB tmpfs filled to within a few KiB,
   several pods added until the disk refuses, in-process and through the agent.
3. A full disk under host-local's ``dataDir``.

Invariants checked after every run:

* a verb that exited 0 is durable: a fresh reader of the state sees it, the kernel has (or,
  after DEL, no longer has) the link, host-local has (or released) the address;
* a verb that failed answered code 5 (or, for IPAM's own full disk, IPAM's error) and,
  for ADD, left no link, address or charge of its own; a failed DEL is finished by the
  runtime's retry, which then releases everything;
* the other pod, added before, keeps its link on its NIC, its address and its charge;
* ``cni-dra state recover`` has nothing to do, and the agent (whose cache lived through
  the fault) answers the next verb from the same state as a fresh reader;
* once the fault is gone (or space freed) the same verb succeeds.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_dra.quantity import Quantity
from netns_tests.bed import NodeBed, parent_of, pod_args, recover, start_fastpath_agent, stop_process
from netns_tests.runner import link_in_netns

PATHS = ["local", "agent"]


@pytest.fixture
def node(make_node) -> NodeBed:
    """Two 10G stand-in NICs (``nic-a``, ``nic-b``) on network ``relnet``."""
    return make_node(network="relnet")


class Bed:
    """The node with one pod ("keeper") attached before any fault, reached on ``path``; in
    agent mode, its own agent (started afresh with each fault plan)."""

    def __init__(self, node: NodeBed, make_netns, path: str, tmp_path: Path) -> None:
        self.node, self.make_netns, self.path, self.tmp = node, make_netns, path, tmp_path
        self.agent: subprocess.Popen[bytes] | None = None
        self.socket = str(tmp_path / "agent" / "agent.sock")
        node.socket = self.socket
        self.keeper_ns = make_netns()
        code, out, err = self.run("ADD", self.keeper_ns, "keeper")
        assert code == 0, (out, err)
        self.keeper_ip = out["ips"][0]["address"].split("/")[0]
        self.keeper_parent = parent_of(self.keeper_ns)

    def start_agent(self, env: dict[str, str]) -> None:
        """A fast-path agent with one worker process and thread, so that a fault plan (counted
        per process) applies to the next request and the cache lives on after it."""
        self.stop_agent()
        self.agent = start_fastpath_agent(self.socket, "--processes", "1", "--workers", "1", env=env)

    def stop_agent(self) -> None:
        if self.agent is not None:
            stop_process(self.agent)
            self.agent = None

    def run(self, command: str, netns: str, cid: str, fault_env: dict[str, str] | None = None):
        """One verb as the runtime runs it; ``fault_env`` arms the plugin process (local) or a
        freshly started agent (agent) with a fault plan."""
        if self.path == "agent":
            if fault_env is not None or self.agent is None:
                self.start_agent(fault_env or {})
            extra = None
        else:
            extra = fault_env
        return self.node.run(
            command,
            self.node.conf(),
            netns,
            cid,
            "eth0",
            cni_args=pod_args(cid),
            path=self.path,
            extra_env=extra,
        )

    # -- invariants ------------------------------------------------------------------------
    def holds(self, cid: str, netns: str, ip: str | None = None) -> None:
        state = self.node.state()
        att = state.find("relnet", cid, "eth0")
        assert att is not None and att.phase == "ready", f"{cid}: {att}"
        assert link_in_netns(netns, "eth0") is not None, f"{cid}: no link"
        reserved = {c: i for i, c in self.node.ip_holders().items()}
        assert cid in reserved, f"{cid}: no address"
        if ip is not None:
            assert reserved[cid] == ip

    def absent(self, cid: str, netns: str) -> None:
        assert self.node.state().find("relnet", cid, "eth0") is None, f"{cid} still in state"
        assert link_in_netns(netns, "eth0") is None, f"{cid}: link left"
        assert cid not in self.node.ip_holders().values(), f"{cid}: address left"

    def intact(self) -> None:
        """The keeper and the books: only ready attachments are charged, 1G each."""
        self.holds("keeper", self.keeper_ns, self.keeper_ip)
        assert parent_of(self.keeper_ns) == self.keeper_parent
        state = self.node.state()
        assert all(a.phase == "ready" for a in state.attachments), [
            (a.containerID, a.phase) for a in state.attachments
        ]
        total = sum((q["bandwidth"] for q in self.node.consumed().values()), Quantity.parse("0"))
        assert total == Quantity.parse(f"{len(state.attachments)}G")
        code, report = recover(self.node)
        assert code == 0 and report["changes"] == [] and report["errors"] == [], report


def _calls(bed: Bed, command: str, netns: str, cid: str) -> list[str]:
    """The state I/O calls one verb makes (no fault, counted through the seam)."""
    log = bed.tmp / f"calls-{command}"
    log.unlink(missing_ok=True)
    code, out, err = bed.run(command, netns, cid, fault_env={"CNI_DRA_IO_FAULT_LOG": str(log)})
    assert code == 0, (out, err)
    return log.read_text().split()


def _faults(calls: list[str]) -> list[tuple[int, str]]:
    return [
        (n, kind)
        for n, call in enumerate(calls, 1)
        for kind in (("ENOSPC", "EIO", "short") if call == "write" else ("ENOSPC", "EIO"))
    ]


@pytest.fixture
def make_bed(node, make_netns, tmp_path, faults_on):
    """``make_bed(path)``: a :class:`Bed` on ``path``; its agent is stopped afterwards."""
    beds: list[Bed] = []

    def make(path: str) -> Bed:
        beds.append(Bed(node, make_netns, path, tmp_path))
        return beds[-1]

    yield make
    for b in beds:
        b.stop_agent()


@pytest.fixture
def bed(make_bed, request):
    return make_bed(request.param)


@pytest.mark.parametrize("bed", PATHS, indirect=True)
def test_add_with_a_fault_at_each_state_io_call(bed: Bed) -> None:
    ns = bed.make_netns()
    calls = _calls(bed, "ADD", ns, "probe")
    assert bed.run("DEL", ns, "probe")[0] == 0
    assert calls.count("write") >= 2 and "fdatasync" in calls, calls
    failed = 0
    for n, kind in _faults(calls):
        code, out, err = bed.run("ADD", ns, "pod", fault_env={"CNI_DRA_IO_FAULT": f"any@{n}={kind}"})
        where = f"ADD with {kind} at call {n} ({calls[n - 1]}): exit {code} {out} {err[-800:]}"
        if code == 0:
            bed.holds("pod", ns, out["ips"][0]["address"].split("/")[0])
        else:
            failed += 1
            assert out is not None and out["code"] == 5, where
            assert "failed to write state" in out["msg"], where
            assert "Traceback" not in err, where
            bed.absent("pod", ns)
        bed.intact()
        code, out, err = bed.run("ADD", ns, "pod")  # the fault is gone (the agent lived on)
        assert code == 0, (where, out, err)
        bed.holds("pod", ns)
        code, out, err = bed.run("DEL", ns, "pod")
        assert code == 0, f"DEL after {where}: {out} {err}"
        bed.absent("pod", ns)
    assert failed, "no injected fault made ADD fail"


@pytest.mark.parametrize("bed", PATHS, indirect=True)
def test_del_with_a_fault_at_each_state_io_call(bed: Bed) -> None:
    ns = bed.make_netns()
    assert bed.run("ADD", ns, "probe")[0] == 0
    calls = _calls(bed, "DEL", ns, "probe")
    failed = 0
    for n, kind in _faults(calls):
        code, out, err = bed.run("ADD", ns, "pod")
        assert code == 0, (out, err)
        code, out, err = bed.run("DEL", ns, "pod", fault_env={"CNI_DRA_IO_FAULT": f"any@{n}={kind}"})
        where = f"DEL with {kind} at call {n} ({calls[n - 1]}): exit {code} {out} {err[-800:]}"
        if code != 0:
            failed += 1
            assert out is not None and out["code"] == 5, where
            assert "Traceback" not in err, where
            code, out, err = bed.run("DEL", ns, "pod")  # the runtime retries
            assert code == 0, (where, out, err)
        bed.absent("pod", ns)
        bed.intact()
    assert failed, "no injected fault made DEL fail"


# -- a real full disk ---------------------------------------------------------------------------
@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted (0700) on ``where`` for the block; unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(where: Path, leave_bytes: int) -> Path:
    """A file that leaves about ``leave_bytes`` free on the filesystem of ``where``."""
    filler = where / "filler"
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))
    return filler


@pytest.fixture
def small_state_dir(node: NodeBed):
    with _tmpfs(node.state_dir, "1M") as where:
        yield where


@pytest.mark.parametrize("path", PATHS)
def test_full_state_disk_never_costs_another_pod_its_network(small_state_dir, make_bed, make_netns, path):
    b = make_bed(path)
    filler = _fill(small_state_dir, 6 << 10)
    pods = {f"pod-{i}": make_netns() for i in range(8)}
    added, refused = {}, []
    for cid, ns in pods.items():
        code, out, err = b.run("ADD", ns, cid)
        if code == 0:
            added[cid] = out["ips"][0]["address"].split("/")[0]
        else:
            assert out is not None and out["code"] == 5, (cid, out, err)
            assert "No space left on device" in out["msg"], out
            assert "Traceback" not in err, err
            refused.append(cid)
        for done, ip in added.items():
            b.holds(done, pods[done], ip)
        for cid_refused in refused:
            b.absent(cid_refused, pods[cid_refused])
        b.holds("keeper", b.keeper_ns, b.keeper_ip)
    assert refused, "the disk never filled up"
    # once space is back, the refused pods are added and every pod is deleted
    filler.unlink()
    for cid in refused:
        code, out, err = b.run("ADD", pods[cid], cid)
        assert code == 0, (cid, out, err)
    for cid, ns in pods.items():
        code, out, err = b.run("DEL", ns, cid)
        assert code == 0, (cid, out, err)
        b.absent(cid, ns)
    b.intact()


@pytest.fixture
def small_ipam_dir(node: NodeBed):
    with _tmpfs(node.ipam_dir, "64k") as where:
        yield where


@pytest.mark.parametrize("path", PATHS)
def test_full_ipam_disk_fails_add_cleanly(small_ipam_dir, make_bed, make_netns, path):
    b = make_bed(path)
    filler = _fill(small_ipam_dir, 0)
    ns = make_netns()
    code, out, err = b.run("ADD", ns, "pod")
    assert (
        code != 0 and out is not None and "space" in out["msg"].lower() + str(out.get("details", "")).lower()
    ), (out, err)
    assert "Traceback" not in err
    b.absent("pod", ns)
    b.intact()
    filler.unlink()
    code, out, err = b.run("ADD", ns, "pod")
    assert code == 0, (out, err)
    b.holds("pod", ns)
    assert b.run("DEL", ns, "pod")[0] == 0
    b.absent("pod", ns)
    b.intact()
