"""What lands on a node runs without any Python of the host.

The installed plugin (``/opt/cni/bin/cni-dra`` and the tree it runs when the agent does not
serve, README "Install layout") is run in a private mount namespace where every Python of
this machine is masked (:func:`netns_tests.bed.without_host_python`): Debian's
``/usr/bin/python3*`` and ``/usr/lib/python3*``, ``/usr/local``, pyenv, the project's venvs,
and the host's copies of the libraries the tree brings besides glibc (libexpat, libz,
libssl, ...). First a check that the masking works (no host interpreter runs in there, each
runs outside), then ADD, CHECK and DEL in-process (``CNI_DRA_AGENT=off``), the operator
CLI, and an agent whose worker processes start from the tree too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from cni_dra.netlink.info import host_link, link_in_netns
from netns_tests.bed import (
    masked_paths,
    pod_args,
    start_fastpath_agent,
    stop_process,
    tree_python,
    without_host_python,
)
from netns_tests.runner import CNI_EXE, cni_dra_status

PROBE = "print('ran')"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _runs(argv: list[str]) -> bool:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env={"PATH": PATH})
    return proc.returncode == 0 and proc.stdout == "ran\n"


def test_no_host_python_runs_under_the_mask(tmp_path):
    masked = masked_paths()
    assert "/usr/lib/python3.11" in masked and any(p.startswith("/opt/cni-dra") for p in masked)
    assert "/usr/lib/x86_64-linux-gnu/libexpat.so.1" in masked
    masked_sh = without_host_python(tmp_path, "/bin/sh")
    # by name on PATH, Debian's by path, and the interpreter (venv) running these tests
    for python in ("python3", "/usr/bin/python3", "/usr/bin/python3.11", sys.executable):
        assert _runs(["/bin/sh", "-c", f'exec {python} -c "{PROBE}"']), python  # it runs here...
        assert not _runs([str(masked_sh), "-c", f'exec {python} -c "{PROBE}"']), python  # ...not in there


def test_add_check_del_in_process_without_host_python(make_node, make_netns, tmp_path):
    node = make_node(path="local")  # CNI_DRA_AGENT=off: the tree's interpreter does the work
    exe = str(without_host_python(tmp_path, CNI_EXE))
    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf("2G", version="1.1.0")
    code, out, err = node.run("ADD", conf, netns=ns, cid=cid, cni_args=pod_args(cid), exe=exe)
    assert code == 0, (out, err)
    link = link_in_netns(ns, "eth0")
    assert link is not None and link.parent_index == host_link(node.parents["nic-a"]).index
    assert out["ips"][0]["address"] in link.addresses

    code, out2, err = node.run(
        "CHECK", {**conf, "prevResult": out}, netns=ns, cid=cid, cni_args=pod_args(cid), exe=exe
    )
    assert (code, out2) == (0, None), err
    code, out3, err = node.run("DEL", conf, netns=ns, cid=cid, cni_args=pod_args(cid), exe=exe)
    assert code == 0, (out3, err)
    assert link_in_netns(ns, "eth0") is None
    assert node.state_doc()["attachments"] == [] and node.ipam_reservations() == []


@pytest.mark.parametrize("args", [("--version",), ("status", "--json")])
def test_operator_cli_without_host_python(node, tmp_path, args):
    exe = str(without_host_python(tmp_path, CNI_EXE))
    extra = (
        ("--state-dir", str(node.state_dir), "--inventory", str(node.inventory))
        if args[0] == "status"
        else ()
    )
    proc = subprocess.run(
        [exe, *args, *extra], capture_output=True, text=True, timeout=60, check=False, env={"PATH": PATH}
    )
    assert proc.returncode == 0, proc.stderr
    if args[0] == "status":
        assert json.loads(proc.stdout) == cni_dra_status(node.state_dir, node.inventory)
    else:
        assert proc.stdout.startswith("cni-dra, version ")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def test_agent_worker_processes_start_from_the_tree_without_host_python(tmp_path):
    """``cni-dra agent`` serves from one process per CPU: the others are started with the
    command that started the agent (the tree's loader and libraries), not the interpreter
    file alone, which would need the host's loader to find libraries the host lacks."""
    loader = tree_python()[0]
    agent = start_fastpath_agent(
        str(tmp_path / "agent" / "agent.sock"),
        "--processes",
        "3",
        launcher=str(without_host_python(tmp_path, loader)),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            # unshare (the wrapper's exec) -> sh -> the agent: the agent is the wrapper's process
            workers = _children(agent.pid)
            alive = [pid for pid in workers if os.path.exists(f"/proc/{pid}/cmdline")]
            if len(alive) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(2)  # a worker that cannot start dies at once; give it the time to
        cmdlines = []
        for pid in _children(agent.pid):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines.append(f.read().split(b"\0")[0].decode())
        assert cmdlines == [loader, loader]
    finally:
        stop_process(agent)
