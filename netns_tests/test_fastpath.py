"""The installed executable on both paths: served by the agent, and in-process.

``agent``: the invocation carries ``CNI_DRA_AGENT=require`` (the client never falls back, so
a success proves the agent ran it); ``local``: ``CNI_DRA_AGENT=off`` (in-process). The agent
is ``python -I -m cni_dra.fastpath.server`` from the same venv as the executable. Also: both
paths at once against one state never over-commit a NIC, and a killed agent (stale socket)
makes the plugin fall back to in-process work.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from cni_dra.fastpath.wire import encode_frames
from cni_dra.netlink.info import host_link, link_in_netns
from netns_tests.bed import NodeBed, start_fastpath_agent, stop_process
from netns_tests.runner import CNI_EXE, run_plugin
from tests import builders

PATHS = ["agent", "local"]


@pytest.fixture
def node(make_node, fastpath_agent) -> NodeBed:
    """Two 10G stand-in NICs (``nic-a``, ``nic-b``) on network ``fpnet``, the module's agent."""
    return make_node(network="fpnet", agent_socket=fastpath_agent)


def _plugin(node, path, command, conf, netns, cid, ifname="eth0"):
    pod = str(uuid.uuid5(uuid.NAMESPACE_URL, cid))
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p-{cid[:6]};K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={pod}"
    return run_plugin(
        command, conf, container_id=cid, netns=netns, ifname=ifname, cni_args=args, extra_env=node.env(path)
    )


@pytest.mark.parametrize("path", PATHS)
def test_add_check_del(node, make_netns, path):
    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf("2G")
    code, out, err = _plugin(node, path, "ADD", conf, ns, cid)
    assert code == 0, (out, err)
    link = link_in_netns(ns, "eth0")
    assert link is not None and link.kind == "macvlan"
    assert link.parent_index == host_link(node.parents["nic-a"]).index
    assert out["interfaces"][0]["mac"] == link.mac and out["ips"][0]["address"] in link.addresses
    (att,) = node.state_doc()["attachments"]
    assert (att["containerID"], att["device"], att["phase"]) == (cid, "nic-a", "ready")
    assert node.ipam_reservations() == [out["ips"][0]["address"].split("/")[0]]

    code, out2, err = _plugin(node, path, "CHECK", {**conf, "prevResult": out}, ns, cid)
    assert code == 0 and out2 is None, (out2, err)

    for _ in range(2):  # DEL is idempotent on both paths
        code, out3, err = _plugin(node, path, "DEL", conf, ns, cid)
        assert code == 0, (out3, err)
        assert link_in_netns(ns, "eth0") is None
        assert node.state_doc()["attachments"] == [] and node.ipam_reservations() == []


@pytest.mark.parametrize("path", PATHS)
def test_no_capacity_error_json(node, make_netns, path):
    ns = make_netns()
    code, out, err = _plugin(node, path, "ADD", node.conf("20G"), ns, uuid.uuid4().hex)
    assert code == 1 and out["code"] == 100 and out["cniVersion"] == "1.0.0", (out, err)
    assert "nic-a" in out["msg"] and "nic-b" in out["msg"]
    assert link_in_netns(ns, "eth0") is None
    assert node.state_doc()["attachments"] == [] and node.ipam_reservations() == []


@pytest.mark.parametrize("path", PATHS)
def test_check_reports_a_removed_link(node, make_netns, path):
    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf()
    code, out, err = _plugin(node, path, "ADD", conf, ns, cid)
    assert code == 0, (out, err)
    from pyroute2 import IPRoute

    with IPRoute(netns=ns) as ipr:
        ipr.link("del", index=ipr.link_lookup(ifname="eth0")[0])
    code, out2, err = _plugin(node, path, "CHECK", {**conf, "prevResult": out}, ns, cid)
    assert code == 1 and out2["code"] == 105, (out2, err)
    code, _, err = _plugin(node, path, "DEL", conf, ns, cid)
    assert code == 0, err


@pytest.mark.parametrize("path", PATHS)
def test_relative_netns_is_refused_and_del_leaves_the_pod_intact(node, make_netns, path):
    """A relative CNI_NETNS resolves against the plugin's working directory: an ADD from
    one directory and a DEL from another would name different namespaces (the DEL then
    released IP and capacity and left the link in the pod). Both paths refuse it with
    code 4 on ADD and DEL and change nothing."""
    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf()
    here = os.path.relpath(ns)  # resolves to the pod's netns from this working directory
    assert not os.path.isabs(here) and os.path.samefile(here, ns)
    code, out, err = _plugin(node, path, "ADD", conf, here, cid)
    assert code == 1 and out["code"] == 4 and "CNI_NETNS" in out["msg"], (out, err)
    assert (
        link_in_netns(ns, "eth0") is None
        and node.state_doc()["attachments"] == []
        and node.ipam_reservations() == []
    )

    code, out, err = _plugin(node, path, "ADD", conf, ns, cid)
    assert code == 0, (out, err)
    ip = out["ips"][0]["address"]
    for relative in (here, ns.lstrip("/")):  # the second names nothing from here
        code, out, err = _plugin(node, path, "DEL", conf, relative, cid)
        assert code == 1 and out["code"] == 4 and "not an absolute path" in out["msg"], (out, err)
        assert ip in link_in_netns(ns, "eth0").addresses
        assert [a["phase"] for a in node.state_doc()["attachments"]] == ["ready"]
        assert node.ipam_reservations() == [ip.split("/")[0]]
    code, out, err = _plugin(node, path, "DEL", conf, ns, cid)
    assert code == 0, (out, err)
    assert (
        link_in_netns(ns, "eth0") is None
        and node.state_doc()["attachments"] == []
        and node.ipam_reservations() == []
    )


def _set_link(ifname: str, up: bool, netns: str | None = None) -> None:
    from pyroute2 import IPRoute

    with IPRoute(**({"netns": netns} if netns else {})) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="up" if up else "down")


def _carrier(ifname: str, netns: str | None = None) -> bool:
    """IFF_LOWER_UP of ``ifname`` as the kernel reports it (pyroute2, not cni_dra)."""
    from pyroute2 import IPRoute

    with IPRoute(**({"netns": netns} if netns else {})) as ipr:
        return bool(ipr.link("get", index=ipr.link_lookup(ifname=ifname)[0])[0]["flags"] & 0x10000)


def _wait(cond, timeout_s: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("path", PATHS)
def test_check_fails_while_the_link_cannot_pass_traffic(node, make_netns, path):
    """CHECK is "is this attachment working as configured": it fails, naming the cause, when
    the parent NIC has no carrier (its cable: here the veth peer, down; the pod link then
    shows NO-CARRIER), when the parent is administratively down, and when the pod's own
    link is; it passes again once each is repaired."""
    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf()
    code, out, err = _plugin(node, path, "ADD", conf, ns, cid)
    assert code == 0, (out, err)
    check_conf = {**conf, "prevResult": out}
    nic = node.parents["nic-a"]
    what = f"failed to check interface eth0 of container {cid}"

    def check() -> tuple[int, dict | None, str]:
        return _plugin(node, path, "CHECK", check_conf, ns, cid)

    cases = [
        (
            lambda up: _set_link(nic + "p", up),
            f"{what}: its parent NIC {nic} (device nic-a) has no carrier (NO-CARRIER)",
        ),
        (
            lambda up: _set_link(nic, up),
            f"{what}: its parent NIC {nic} (device nic-a) is administratively down",
        ),
        (lambda up: _set_link("eth0", up, ns), f"{what}: the link is administratively down in netns {ns}"),
    ]
    try:
        for toggle, says in cases:
            toggle(False)
            code, err_json, err = check()
            assert code == 1 and err_json["code"] == 105 and err_json["msg"] == says, (err_json, err)
            toggle(True)
            assert _wait(lambda: _carrier("eth0", ns)), "the pod link did not get its carrier back"
            code, err_json, err = check()
            assert code == 0, (err_json, err)
        _set_link(nic + "p", False)  # no carrier on the parent: the pod link shows NO-CARRIER too
        assert _wait(lambda: not _carrier("eth0", ns))
        code, err_json, err = check()
        assert code == 1 and "has no carrier" in err_json["msg"], (err_json, err)
    finally:
        _set_link(nic + "p", True)
        _set_link(nic, True)
    code, _, err = _plugin(node, path, "DEL", conf, ns, cid)
    assert code == 0, err


def test_both_paths_at_once_never_overcommit(node, make_netns):
    """8 concurrent ADDs of 4G, alternating agent and in-process, on 2 x 10G: exactly 4 fit."""
    jobs = [(PATHS[i % 2], make_netns(), f"c{i}{uuid.uuid4().hex[:8]}") for i in range(8)]
    conf = node.conf("4G")
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda j: _plugin(node, j[0], "ADD", conf, j[1], j[2]), jobs))
    ok = [j for j, r in zip(jobs, results, strict=True) if r[0] == 0]
    refused = [r for r in results if r[0] != 0]
    assert len(ok) == 4, results
    assert all(r[1]["code"] == 100 for r in refused), refused
    per_device: dict[str, int] = {}
    for att in node.state_doc()["attachments"]:
        per_device[att["device"]] = per_device.get(att["device"], 0) + 1
    assert per_device == {"nic-a": 2, "nic-b": 2}
    assert all(link_in_netns(ns, "eth0") is not None for _, ns, _ in ok)
    for path, ns, cid in jobs:
        code, _, err = _plugin(node, path, "DEL", conf, ns, cid)
        assert code == 0, err
    assert node.state_doc()["attachments"] == []


def test_killed_agent_falls_back_to_in_process(node, make_netns, tmp_path):
    sock = str(tmp_path / "dead" / "agent.sock")
    proc = start_fastpath_agent(sock)
    proc.kill()
    proc.wait()
    stop_process(proc)
    assert os.path.exists(sock)  # stale socket left behind: connect is refused
    ns, cid = make_netns(), uuid.uuid4().hex
    env = {"CNI_DRA_AGENT_SOCKET": sock}
    code, out, err = run_plugin("ADD", node.conf(), container_id=cid, netns=ns, ifname="eth0", extra_env=env)
    assert code == 0, (out, err)
    assert link_in_netns(ns, "eth0") is not None
    code, _, err = run_plugin("DEL", node.conf(), container_id=cid, netns=ns, ifname="eth0", extra_env=env)
    assert code == 0, err
    assert node.state_doc()["attachments"] == []


def test_agent_from_another_mount_namespace_is_declined(node, make_netns):
    """A plugin in another mount namespace (unshare -m) is declined: require fails with 11."""
    ns, cid = make_netns(), uuid.uuid4().hex
    env = {
        **os.environ,
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": ns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_DRA_AGENT": "require",
        "CNI_DRA_AGENT_SOCKET": node.socket,
    }
    proc = subprocess.run(
        ["unshare", "-m", CNI_EXE],
        input=json.dumps(node.conf()).encode(),
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and out["code"] == 11, (out, proc.stderr)
    assert node.state_doc()["attachments"] == [] and link_in_netns(ns, "eth0") is None


@pytest.fixture
def declining_agent(tmp_path):
    """A fake agent (:func:`tests.builders.fake_agent`) that declines every request."""
    with builders.fake_agent(
        tmp_path / "declining", lambda frames: encode_frames(b"declined test agent", b"")
    ) as agent:
        yield agent


def test_declined_invocation_runs_in_process_on_identical_stdin(node, make_netns, declining_agent):
    """A config above a pipe buffer (> 64 KiB): whatever the executable read before the agent
    declined reaches the in-process run unchanged (the compiled client execs the Python one)."""
    path = declining_agent.path
    ns, cid = make_netns(), uuid.uuid4().hex
    conf = node.conf(args={"pad": "x" * (200 << 10)})
    env = {"CNI_DRA_AGENT_SOCKET": path}
    code, out, err = run_plugin("ADD", conf, container_id=cid, netns=ns, ifname="eth0", extra_env=env)
    assert code == 0, (out, err)
    assert link_in_netns(ns, "eth0") is not None
    (att,) = node.state_doc()["attachments"]
    assert att["containerID"] == cid and att["phase"] == "ready"
    stdins = [frames[3] for frames in declining_agent.requests]
    assert stdins and all(s == stdins[0] and json.loads(s) == conf for s in stdins)
    code, _, err = run_plugin("DEL", conf, container_id=cid, netns=ns, ifname="eth0", extra_env=env)
    assert code == 0, err
    assert link_in_netns(ns, "eth0") is None and node.state_doc()["attachments"] == []


def _temp_links(netns: str) -> list[str]:
    """Links in ``netns`` named like cni-dra's temporary link names (``cdra`` + 10 hex digits)."""
    import re

    from netns_tests.bed import links_named

    return [name for name, _ in links_named(netns) if re.fullmatch(r"cdra[0-9a-f]{10}", name or "")]


@pytest.mark.parametrize("processes", [1, 2])
def test_agent_killed_mid_add_records_the_temporary_link_and_recovery_removes_it(
    make_node, make_netns, faults_on, tmp_path, processes
):
    """The agent (or its worker process) dies between making the link under its temporary
    name and renaming it: the intent it wrote names that link (as an in-process ADD's does),
    and ``state recover`` deletes it, the dead process still unreaped (a zombie counts as dead)."""
    from netns_tests.bed import recover

    sock = str(tmp_path / "dying" / "agent.sock")
    node = make_node(network="fpnet", agent_socket=sock)
    agent = start_fastpath_agent(sock, "--processes", str(processes), env={"CNI_DRA_FAULT": "add:link-temp"})
    try:
        ns, cid = make_netns(), uuid.uuid4().hex
        code, out, err = _plugin(node, "agent", "ADD", node.conf(), ns, cid)
        assert code == 1 and out["code"] == 11, (out, err)  # "require": not served, no fallback
        (temp,) = _temp_links(ns)
        (att,) = node.state_doc()["attachments"]
        assert (att["phase"], att["tempName"]) == ("adding", temp)
        assert link_in_netns(ns, "eth0") is None
        code, report = recover(node)
        assert code == 0 and report["errors"] == [], report
        assert (
            _temp_links(ns) == [] and node.state_doc()["attachments"] == [] and node.ipam_reservations() == []
        )
    finally:
        agent.kill()
        stop_process(agent)


def test_a_burst_of_adds_falls_back_without_code_11_when_the_agent_dies(
    make_node, make_netns, faults_on, tmp_path
):
    """The agent dies with several ADDs in flight (the first to reach the fault point kills
    it); every client falls back to in-process work at once. Each fallback recovers the dead
    intents it finds, so one pod's interrupted ADD may be under another pod's recovery when its
    own fallback asks: it waits for that recovery instead of answering "an ADD of the same
    attachment is still in progress" (code 11). All ten pods come up on the first try."""
    sock = str(tmp_path / "dying" / "agent.sock")
    node = make_node(network="fpnet", agent_socket=sock)
    agent = start_fastpath_agent(sock, "--processes", "1", env={"CNI_DRA_FAULT": "add:link-temp"})
    pods = [(make_netns(), f"burst-{i}-{uuid.uuid4().hex[:8]}") for i in range(10)]
    env = {"CNI_DRA_AGENT_SOCKET": sock}
    try:
        with ThreadPoolExecutor(len(pods)) as pool:
            results = list(
                pool.map(
                    lambda p: run_plugin(
                        "ADD",
                        node.conf("100M"),
                        container_id=p[1],
                        netns=p[0],
                        ifname="eth0",
                        extra_env=env,
                        timeout_s=180,
                    ),
                    pods,
                )
            )
        assert [(code, (out or {}).get("code")) for code, out, _ in results] == [(0, None)] * len(pods), (
            results
        )
        assert sorted(a["phase"] for a in node.state_doc()["attachments"]) == ["ready"] * len(pods)
        assert all(_temp_links(ns) == [] for ns, _ in pods)
    finally:
        agent.kill()
        stop_process(agent)
    for ns, cid in pods:
        code, _, err = run_plugin(
            "DEL",
            node.conf("100M"),
            container_id=cid,
            netns=ns,
            ifname="eth0",
            extra_env={"CNI_DRA_AGENT": "off"},
        )
        assert code == 0, err
    assert node.state_doc()["attachments"] == [] and node.ipam_reservations() == []


@pytest.mark.parametrize("processes", [1, 2])
def test_add_falls_back_when_the_agent_dies_mid_add(make_node, make_netns, faults_on, tmp_path, processes):
    """The process serving an ADD dies halfway; the client at once runs the ADD in-process,
    while the dead process is a zombie its parent has not reaped yet (the agent's own
    parent, or the agent for a worker process). That owner is dead: the in-process ADD
    undoes its intent (the temporary link included) and succeeds, instead of answering
    "an ADD of the same attachment is still in progress" (code 11)."""
    sock = str(tmp_path / "dying" / "agent.sock")
    node = make_node(network="fpnet", agent_socket=sock)
    agent = start_fastpath_agent(sock, "--processes", str(processes), env={"CNI_DRA_FAULT": "add:link-temp"})
    try:
        ns, cid = make_netns(), uuid.uuid4().hex
        env = {"CNI_DRA_AGENT_SOCKET": sock}  # the default mode: the agent, else in-process
        code, out, err = run_plugin(
            "ADD", node.conf(), container_id=cid, netns=ns, ifname="eth0", extra_env=env
        )
        assert code == 0, (out, err)
        assert _temp_links(ns) == [] and link_in_netns(ns, "eth0") is not None
        (att,) = node.state_doc()["attachments"]
        assert (att["containerID"], att["phase"]) == (cid, "ready")
        code, _, err = run_plugin(
            "DEL", node.conf(), container_id=cid, netns=ns, ifname="eth0", extra_env={"CNI_DRA_AGENT": "off"}
        )
        assert code == 0, err
        assert node.state_doc()["attachments"] == [] and node.ipam_reservations() == []
    finally:
        agent.kill()
        stop_process(agent)
