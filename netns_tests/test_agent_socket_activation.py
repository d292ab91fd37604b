"""The agent without Kubernetes as systemd runs it: ``systemd-socket-activate`` (systemd's own
tool for the ``.socket`` unit's job; no systemd runs as PID 1 here) listens on a private
socket path, and the first plugin invocation after "boot" starts the installed
``cni-dra agent --no-kubernetes`` and is served by it (``CNI_DRA_AGENT=require``: no
fallback), under the service unit's capability bounding set and ``NoNewPrivileges``. Also:
``scripts/install.sh units`` writes units that ``systemd-analyze verify`` accepts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from cni_dra.netlink.info import link_in_netns
from netns_tests.runner import CNI_EXE
from tests.builders import wait_for

REPO = Path(__file__).resolve().parent.parent
SERVICE = REPO / "conf" / "systemd" / "cni-dra-agent.service"
ACTIVATE = shutil.which("systemd-socket-activate")
CAPS = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}

pytestmark = pytest.mark.skipif(
    ACTIVATE is None and not os.environ.get("CI"),
    reason="systemd-socket-activate not installed (apt install systemd)",
)


def service_directive(key: str) -> str:
    """One ``Key=value`` of the service unit (the last one)."""
    values = [
        line.partition("=")[2].strip()
        for line in SERVICE.read_text().splitlines()
        if line.startswith(f"{key}=")
    ]
    assert values, key
    return values[-1]


def _exe(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/exe")


def _status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(field)


@pytest.fixture
def short():
    d = tempfile.mkdtemp(prefix="cdsa", dir="/tmp")  # short unix socket path; 0700
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_first_invocation_starts_the_agent_and_is_served_by_it(make_node, make_netns, short):
    os.mkdir(f"{short}/run", 0o700)  # as DirectoryMode=0700 makes it
    sock = f"{short}/run/agent.sock"
    node = make_node(network="sanet", path="agent", agent_socket=sock)
    caps = service_directive("CapabilityBoundingSet").split()
    assert service_directive("NoNewPrivileges") == "yes" and set(caps) <= set(CAPS)
    bounding = "-all," + ",".join("+" + c.removeprefix("CAP_").lower() for c in caps)
    log = node.tmp / "agent.log"
    argv = [
        ACTIVATE or "systemd-socket-activate",
        "--listen",
        sock,
        "--fdname=fastpath",
        "-E",
        "PATH",
        "setpriv",
        f"--bounding-set={bounding}",
        "--no-new-privs",
        "--",  # as the unit confines it
        CNI_EXE,
        "agent",
        "--no-kubernetes",
        "--inventory",
        str(node.inventory),
        "--state-dir",
        str(node.state_dir),
        "--fastpath-socket",
        sock,
        "--fastpath-processes",
        "2",
        "--metrics-address",
        "",
        "--log-level",
        "info",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=os.getcwd(), start_new_session=True
        )
    try:
        wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, what="the socket")
        time.sleep(1.0)
        # "boot": the socket is there, the agent is not (no connection yet)
        assert proc.poll() is None and _exe(proc.pid).endswith("systemd-socket-activate"), log.read_text()
        assert Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text() == ""

        ns, cid = make_netns(), uuid.uuid4().hex[:12]
        t0 = time.monotonic()
        code, out, err = node.run("ADD", netns=ns, cid=cid)  # CNI_DRA_AGENT=require: the agent or an error
        first_s = time.monotonic() - t0
        assert code == 0, (out, err, log.read_text())
        assert link_in_netns(ns, "eth0") is not None
        # the same process became the agent (socket activation execs in place), confined as the unit says
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"agent" in cmdline and b"--no-kubernetes" in cmdline, cmdline
        assert int(_status(proc.pid, "CapBnd"), 16) == sum(1 << CAPS[c] for c in caps)
        assert _status(proc.pid, "NoNewPrivs") == "1"
        # the agent and its worker process accept on systemd's socket (fd 3, passed to both)
        inherited = os.readlink(f"/proc/{proc.pid}/fd/3")
        workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert inherited.startswith("socket:") and len(workers) == 1, (inherited, workers)
        assert inherited in {
            os.readlink(f"/proc/{workers[0]}/fd/{fd}") for fd in os.listdir(f"/proc/{workers[0]}/fd")
        }
        text = log.read_text()
        assert (
            "serving on the socket systemd passed" in text and "without Kubernetes: --no-kubernetes" in text
        ), text

        code, out, err = node.run("DEL", netns=ns, cid=cid)
        assert code == 0, (out, err, log.read_text())
        assert link_in_netns(ns, "eth0") is None
        assert node.state_doc()["attachments"] == [] and node.ipam_reservations() == []
        print(f"first invocation (agent started by it): {first_s * 1e3:.0f} ms")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text()
    assert os.path.exists(sock)  # systemd's file: the agent leaves it for the next one


def test_install_writes_units_that_verify(tmp_path):
    """``scripts/install.sh units`` into a private directory: the two units, ExecStart
    naming the installed client, accepted by ``systemd-analyze verify``; a second run
    changes nothing."""
    if shutil.which("systemd-analyze") is None and not os.environ.get("CI"):
        pytest.skip("systemd-analyze not installed (apt install systemd)")
    env = {**os.environ, "CNI_DRA_SYSTEMD_DIR": str(tmp_path), "CNI_BIN_DIR": os.path.dirname(CNI_EXE)}
    subprocess.run([str(REPO / "scripts" / "install.sh"), "units"], env=env, check=True, capture_output=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cni-dra-agent.service", "cni-dra-agent.socket"]
    service = (tmp_path / "cni-dra-agent.service").read_text()
    assert f"\nExecStart={CNI_EXE} agent --no-kubernetes\n" in service
    assert {oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {"0o644"}
    proc = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            "--man=no",
            str(tmp_path / "cni-dra-agent.socket"),
            str(tmp_path / "cni-dra-agent.service"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc
    again = subprocess.run(
        [str(REPO / "scripts" / "install.sh"), "units"], env=env, check=True, capture_output=True, text=True
    )
    assert again.stderr == ""
