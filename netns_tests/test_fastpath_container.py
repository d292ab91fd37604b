"""The fast path of an agent in a container: served after joining the node's mount namespace.

The DaemonSet's agent runs in the node's network and PID namespaces (``hostNetwork``,
``hostPID``) but in a mount namespace and root of its own, with its code at a path the node
may not have. Here it is started as the installed tree's ``cni_dra.fastpath.server`` in the
same position: ``unshare --mount --propagation private`` (the test process stands for the
node: its mount namespace is the one a runtime runs plugins in), its tree bind-mounted over
a directory that is empty in the node's view, and the bed's directory (state, inventory,
IPAM data) hidden under a tmpfs in its own view. Pods' network namespaces made after it
started are not in its view either (private propagation). So only a process that resolves
every path as the caller does can serve, and only code from its own tree can run there.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cni_dra.netlink.info import host_link, link_in_netns
from netns_tests.bed import NodeBed, stop_process, tree_python
from netns_tests.runner import run_plugin


def _ns(pid: int | str, kind: str = "mnt") -> tuple[int, int]:
    st = os.stat(f"/proc/{pid}/ns/{kind}")
    return st.st_dev, st.st_ino


def _contained(image: Path, hidden: Path | None, argv: list[str], prefix: tuple[str, ...] = ()) -> list[str]:
    """The command that runs ``argv`` (which names the tree as ``image``) in a mount namespace
    of its own where the installed tree is bind-mounted over ``image`` (an empty directory in
    the caller's view) and ``hidden``, if given, is an empty tmpfs."""
    tree = Path(tree_python()[3]).parents[1]
    steps = 'mount --bind "$1" "$2"; ' + (
        'mount -t tmpfs -o size=1m,mode=0700 hidden "$3"; ' if hidden else ""
    )
    return [
        *prefix,
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-ec",
        steps + 'shift 3; exec "$@"',
        "sh",
        str(tree),
        str(image),
        str(hidden or ""),
        *argv,
    ]


def _image_python(image: Path) -> list[str]:
    img = str(image)
    return [f"{img}/lib/ld-linux-x86-64.so.2", "--library-path", f"{img}/lib", f"{img}/bin/python3", "-I"]


class ContainedAgent:
    """A fast-path server in a mount namespace of its own (module docstring); ``join``: the
    mount namespace its worker processes join (``--join-mount-ns``), None for none;
    ``prefix``: a command it runs under (e.g. ``setpriv`` dropping a capability)."""

    def __init__(self, work: Path, hidden: Path, *, join: str | None, prefix: tuple[str, ...] = ()) -> None:
        self.socket = str(work / "run" / "agent.sock")
        self.image = work / "image-tree"  # empty in the node's view
        self.image.mkdir()
        self.log = work / "agent.log"
        server = [
            *_image_python(self.image),
            "-m",
            "cni_dra.fastpath.server",
            "--socket",
            self.socket,
            "--processes",
            "2",
            "--log-level",
            "info",
            "--cwd",
            os.getcwd(),
            *(["--join-mount-ns", join] if join else []),
        ]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                _contained(self.image, hidden, server, prefix), stdout=subprocess.PIPE, stderr=log, cwd="/"
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("ready"):
            stop_process(self.proc)
            raise RuntimeError(f"agent did not start: {line!r} {self.log.read_text()}")
        self.pids = [int(p) for p in line.split("pids=")[1].split(",")]

    def wait_for_log(self, text: str, count: int, timeout_s: float = 30.0) -> str:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            log = self.log.read_text(errors="replace")
            if log.count(text) >= count:
                return log
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not logged {count} times: {self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def contained(tmp_path_factory, node_dir):
    agents: list[ContainedAgent] = []

    def start(join: str | None, prefix: tuple[str, ...] = ()) -> ContainedAgent:
        agent = ContainedAgent(tmp_path_factory.mktemp("contained"), node_dir, join=join, prefix=prefix)
        agents.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in agents:
            agent.stop()


@pytest.fixture
def node_dir(tmp_path) -> Path:
    """The bed's directory: state, inventory and IPAM data (hidden in the agent's own view)."""
    return tmp_path


def _run(node: NodeBed, agent: ContainedAgent, command: str, conf: dict, netns: str, cid: str, mode: str):
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={cid}"
    return run_plugin(
        command,
        conf,
        container_id=cid,
        netns=netns,
        ifname="eth0",
        cni_args=args,
        extra_env={"CNI_DRA_AGENT": mode, "CNI_DRA_AGENT_SOCKET": agent.socket},
    )


def test_an_agent_in_its_own_mount_namespace_serves_the_node_after_joining_it(
    make_node, make_netns, contained
):
    """Every verb with ``CNI_DRA_AGENT=require`` (a success proves the agent served it): the
    link, the books and the IPAM reservation are where the caller sees them; STATUS and GC
    import modules the worker had not loaded (they come from its own tree, which the node's
    view does not have). The agent process itself stays in its own mount namespace and
    serves nothing; its two worker processes are in the node's."""
    agent = contained(join=f"/proc/{os.getpid()}/ns/mnt")
    node = make_node(network="ctrnet")
    log = agent.wait_for_log("joined the mount namespace", 2)
    assert "cannot join" not in log
    main, *workers = agent.pids
    assert len(workers) == 2
    assert _ns(main) != _ns("self") and all(_ns(w) == _ns("self") for w in workers)
    assert os.listdir(agent.image) == []  # the agent's code is nowhere in the node's view

    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf("2G")
    code, out, err = _run(node, agent, "ADD", conf, ns, cid, "require")
    assert code == 0, (out, err, agent.log.read_text())
    link = link_in_netns(ns, "eth0")
    assert link is not None and link.parent_index == host_link(node.parents["nic-a"]).index
    assert out["ips"][0]["address"] in link.addresses
    (att,) = node.state_doc()["attachments"]
    assert (att["containerID"], att["device"], att["phase"]) == (cid, "nic-a", "ready")
    assert node.ipam_reservations() == [out["ips"][0]["address"].split("/")[0]]

    code, out2, err = _run(node, agent, "CHECK", {**conf, "prevResult": out}, ns, cid, "require")
    assert code == 0 and out2 is None, (out2, err)
    status_conf = {**conf, "cniVersion": "1.1.0"}
    code, out3, err = _run(node, agent, "STATUS", status_conf, "", "", "require")
    assert code == 0, (out3, err, agent.log.read_text())
    gc_conf = {**status_conf, "cni.dev/valid-attachments": [{"containerID": cid, "ifname": "eth0"}]}
    code, out4, err = _run(node, agent, "GC", gc_conf, "", "", "require")
    assert code == 0, (out4, err, agent.log.read_text())
    assert [a["containerID"] for a in node.state_doc()["attachments"]] == [cid]

    code, out5, err = _run(node, agent, "DEL", conf, ns, cid, "require")
    assert code == 0, (out5, err)
    assert link_in_netns(ns, "eth0") is None
    assert node.state_doc()["attachments"] == [] and node.ipam_reservations() == []
    assert "Error" not in agent.log.read_text() and "Traceback" not in agent.log.read_text()


@pytest.mark.parametrize("case", ["no join", "join without CAP_SYS_PTRACE"])
def test_an_agent_that_does_not_see_the_nodes_mount_namespace_declines(
    make_node, make_netns, contained, case
):
    """Without joining, or when the join fails (opening the node's namespace of a process
    with more capabilities needs CAP_SYS_PTRACE), the agent resolves paths in its own view:
    it declines (``require`` fails with code 11 saying why) and the plugin's own run does the
    work (the default mode)."""
    if case == "no join":
        agent = contained(join=None)
    else:
        agent = contained(
            join=f"/proc/{os.getpid()}/ns/mnt", prefix=("setpriv", "--bounding-set=-sys_ptrace")
        )
        log = agent.wait_for_log("cannot join the mount namespace", 2)
        assert "Permission denied" in log
    node = make_node(network="ctrnet")
    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf()
    code, out, err = _run(node, agent, "ADD", conf, ns, cid, "require")
    assert code == 1 and out["code"] == 11, (out, err)
    assert "declined caller sees mnt=" in out["msg"], out
    assert link_in_netns(ns, "eth0") is None and node.state_doc()["attachments"] == []

    code, out, err = _run(node, agent, "ADD", conf, ns, cid, "")
    assert code == 0, (out, err)
    assert link_in_netns(ns, "eth0") is not None
    code, out, err = _run(node, agent, "DEL", conf, ns, cid, "")
    assert code == 0, (out, err)
    assert link_in_netns(ns, "eth0") is None and node.state_doc()["attachments"] == []
    assert agent.log.read_text().count("fastpath: declined: caller sees mnt=") >= 2


JOIN_AND_IMPORT = """
import json, os, sys
from cni_dra.fastpath.join import join_mount_namespace
joined = join_mount_namespace(sys.argv[1])
import bz2, lzma, sqlite3, ssl, uuid  # extension modules (and the libraries they need) not loaded yet
from cni_dra.verbs import gc, status  # and cni_dra's own
print(json.dumps({"moved": joined.moved, "libraries": joined.libraries, "cwd": os.getcwd(),
                  "sqlite": sqlite3.sqlite_version, "modules": [gc.__name__, status.__name__]}))
"""


def test_code_imported_after_joining_comes_from_the_agents_own_tree(tmp_path):
    """After the join, a module or library the process had not loaded yet comes from its
    own tree, which the node's view lacks: here the node is a mount namespace without any
    Python and without the host's copies of the tree's libraries (:func:`masked_paths`), and
    the process imports ``cni_dra.verbs.gc`` and extension modules whose libraries
    (libsqlite3, liblzma, libbz2, libssl) nothing had loaded before."""
    from netns_tests.bed import masked_paths

    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    masks = [
        f"mount -t tmpfs -o size=64k masked '{p}'" if os.path.isdir(p) else f"mount --bind '{empty}' '{p}'"
        for p in masked_paths()
    ]
    node = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-ec",
            "; ".join([*masks, "echo ready", "exec cat"]),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert node.stdout is not None and node.stdout.readline() == b"ready\n"
        image = tmp_path / "image-tree"
        image.mkdir()
        res = subprocess.run(
            _contained(
                image, None, [*_image_python(image), "-c", JOIN_AND_IMPORT, f"/proc/{node.pid}/ns/mnt"]
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd="/",
        )
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout)
        assert got["moved"] is True and got["libraries"] >= 10 and got["cwd"] == "/"
        assert got["modules"] == ["cni_dra.verbs.gc", "cni_dra.verbs.status"] and got["sqlite"]
    finally:
        if node.stdin:
            node.stdin.close()
        node.wait(timeout=30)
        if node.stdout:
            node.stdout.close()


def test_an_intent_names_its_process_as_the_nodes_proc_does():
    """A process in a PID namespace of its own that reads the node's ``/proc`` (a worker
    that started in a container and joined the node's mount namespace) records its owner by
    the pid the node's readers see, not by its pid in its own namespace (1 here, the node's
    init): recovery on the node then judges the right process alive, then gone."""
    from cni_dra.state.owner import owner_alive
    from cni_dra.state.schema import Owner

    code = (
        "import sys; from cni_dra.state.owner import current_owner; "
        "print(current_owner().model_dump_json(), flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", *tree_python(), "-I", "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        owner = Owner.model_validate(json.loads(proc.stdout.readline()))
        (child,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        nspid = [
            ln for ln in Path(f"/proc/{child}/status").read_text().splitlines() if ln.startswith("NSpid:")
        ]
        assert nspid == [f"NSpid:\t{child}\t1"]  # pid 1 in its own namespace
        assert owner.pid == int(child)
        assert owner_alive(owner)
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert not owner_alive(owner)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
