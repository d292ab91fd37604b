"""NIC health on the real cluster: a NIC set down, or deleted and re-created, under a
running pod, as the real kube-scheduler, kubelet and API server see it.

What each scenario follows (README "Kubernetes", NIC health): the device's taint in the
node's ResourceSlice (``net.cni-dra.dev/unhealthy=<reason>:NoSchedule``), the kubelet's
``pod.status.containerStatuses[].allocatedResourcesStatus`` (from the agent's
``DRAResourceHealth`` stream), the claim's ``status.devices[]`` condition ``Ready``, the
plugin's CHECK of the pod's attachment (the installed plugin of the node, run as a runtime
would run it, with libcni's cached result as ``prevResult``), the agent's transition
counter (its metrics), and a second pod whose claim only that NIC can satisfy (a CEL
selector on ``ifName``): the scheduler keeps it Pending with its own reason and binds it
once the NIC is back.

The scenarios use the second node (:data:`NODE`); the module rolls the agents out with a
short debounce and keep-missing (:func:`agent_flags`, ``helm upgrade``) and back to the
bed's values at the end. The node-level actions are small
functions (:func:`set_nic`, :func:`delete_nic`, :func:`restore_nics`,
:func:`restart_agent`) so that they follow the bed when its agents move into a DaemonSet.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from netns_tests.e2e.helpers import (
    NS,
    consistently,
    core,
    delete_pods,
    make_pod,
    make_template,
    node_http,
    pod,
    resource,
    status_entry,
    to_dict,
    wait_for,
    wait_running,
)

DEBOUNCE_S = 2.0
KEEP_MISSING_S = 8.0
NODE = "cni-dra-e2e-2"
NIC = "cde2e-nic0"
KEY = "net.cni-dra.dev/unhealthy"
SETTLE_S = DEBOUNCE_S + 6.0
"""How long a debounced change may take to reach the slice, the kubelet and the claim."""


# -- node-level actions (the bed's; a DaemonSet bed keeps their meaning) ----------------------------


def set_nic(node: str, nic: str, state: str) -> None:
    """``ip link set <nic> up|down`` inside ``node``'s network namespace."""
    subprocess.run(["ip", "-n", node, "link", "set", nic, state], check=True)


def delete_nic(node: str, nic: str) -> None:
    """``ip link del <nic>`` inside ``node``'s network namespace (its veth peer goes with it)."""
    subprocess.run(["ip", "-n", node, "link", "del", nic], check=True)


def restore_nics(cluster, node: str) -> None:
    """The node's NICs as ``up`` made them: present, their MTU, up (idempotent)."""
    cluster.node(node).make_nics()


def restart_agent(cluster, node: str, flags: list[str]) -> None:
    """Roll the agents out with ``flags`` (``helm upgrade`` with these ``--set`` values;
    none: the bed's values) and wait until ``node``'s kubelet has registered the new agent
    and opened its health stream."""
    n = cluster.node(node)
    log = n.logfile("kubelet")
    offset = log.stat().st_size
    cluster.helm_upgrade(cluster.api_client(), *flags)

    def kubelet_said(*needles: str) -> bool:
        tail = log.read_bytes()[offset:].decode(errors="replace")
        return any(all(x in line for x in needles) for line in tail.splitlines())

    wait_for(
        lambda: kubelet_said(f'driverName="{cluster.DRIVER}"', "connected=true"),
        f"{node}: the kubelet registered the restarted agent",
        60,
    )
    wait_for(
        lambda: kubelet_said("Successfully started WatchResources health stream"),
        f"{node}: the kubelet opened the health stream",
        60,
    )


def agent_flags() -> list[str]:
    """The chart's values for a short debounce and keep-missing (both nodes' agents)."""
    return [
        "--set",
        f"nicHealth.debounce={DEBOUNCE_S:g}",
        "--set",
        f"nicHealth.keepMissing={KEEP_MISSING_S:g}",
    ]


# -- what the components show -----------------------------------------------------------------------


def node_slice(api, cluster, node: str = NODE) -> dict[str, Any]:
    return to_dict(api, resource(api).read_resource_slice(f"{node}-{cluster.DRIVER}"))


def taints(api, cluster, nic: str = NIC, node: str = NODE) -> list[tuple[str, str, str]] | None:
    """(key, value, effect) of the device's taints in the node's slice; None: not in it."""
    for d in node_slice(api, cluster, node)["spec"]["devices"]:
        if d["name"] == nic:
            return [(t["key"], t.get("value"), t["effect"]) for t in d.get("taints") or []]
    return None


def health(api, name: str) -> list[tuple[str, str, str]]:
    """(name, resourceID, health) in pod ``name``'s ``allocatedResourcesStatus``."""
    out = []
    for cs in pod(api, name)["status"].get("containerStatuses") or []:
        for st in cs.get("allocatedResourcesStatus") or []:
            for r in st.get("resources") or []:
                out.append((st["name"], r["resourceID"], r.get("health")))
    return out


def ready(api, claim_name: str, share_id: str) -> tuple[str, str] | None:
    """(status, reason) of the claim's ``Ready`` condition for that share."""
    claim = to_dict(api, resource(api).read_namespaced_resource_claim(claim_name, NS))
    entry = status_entry(claim, share_id) or {}
    for c in entry.get("conditions") or []:
        if c["type"] == "Ready":
            return c["status"], c.get("reason")
    return None


def transitions(cluster, nic: str = NIC, node: str = NODE) -> dict[str, float]:
    """The agent's ``cni_dra_device_link_transitions_total`` for ``nic``, by state entered."""
    text = node_http(cluster, node, "http://127.0.0.1:9412/metrics")
    out: dict[str, float] = {}
    for m in re.finditer(r"^cni_dra_device_link_transitions_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("ifname") == nic:
            out[labels["state"]] = float(m.group(2))
    return out


def check(cluster, uid: str, node: str = NODE) -> tuple[int, dict[str, Any]]:
    """CHECK of pod ``uid``'s attachment by the node's installed plugin, as a runtime runs
    it: the container ID, netns and ifname of the node's record, ``CNI_ARGS`` and
    ``prevResult`` from libcni's cache of the ADD, the node's conflist. (exit code, stdout)"""
    n = cluster.node(node)
    (att,) = [a for a in n.books()["attachments"] if a["podUID"] == uid]
    cache = n.host_path("/var/lib/cni/results") / f"{cluster.NETWORK}-{att['containerID']}-{att['ifname']}"
    cached = json.loads(cache.read_text())
    conflist = (
        json.loads(base64.b64decode(cached["config"])) if cached.get("config") else cluster.conflist(node)
    )
    conf = {
        **conflist["plugins"][0],
        "name": conflist["name"],
        "cniVersion": conflist["cniVersion"],
        "prevResult": cached["result"],
    }
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CNI_COMMAND": "CHECK",
        "CNI_CONTAINERID": att["containerID"],
        "CNI_NETNS": att["netns"],
        "CNI_IFNAME": att["ifname"],
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": ";".join(f"{k}={v}" for k, v in cached.get("cniArgs") or []),
    }
    res = n.run("/opt/cni/bin/cni-dra", input=json.dumps(conf), env=env, check=False)
    return res.returncode, json.loads(res.stdout) if res.stdout.strip() else {}


def pending_reason(api, name: str) -> str | None:
    """The scheduler's message on pod ``name``'s ``PodScheduled=False`` (reason Unschedulable)."""
    p = pod(api, name)
    for c in (p["status"].get("conditions") or []) if p else []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
            return c.get("message") or ""
    return None


def attached(api, cluster, name: str) -> tuple[dict, str, str]:
    """Pod ``name`` runs with its claim's share on NIC and the claim says Ready=True: (pod,
    claim name, shareID)."""
    p = wait_running(api, name)
    claim_name = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = to_dict(api, resource(api).read_namespaced_resource_claim(claim_name, NS))
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    assert (res["pool"], res["device"]) == (NODE, NIC), res
    wait_for(
        lambda: ready(api, claim_name, res["shareID"]) == ("True", "InterfaceReady"),
        f"{name}: claim Ready",
        60,
    )
    return p, claim_name, res["shareID"]


# -- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def health_node(api, cluster) -> Iterator[str]:
    """The second node's agent with a short debounce and keep-missing; its defaults again
    (and its NICs as made) afterwards."""
    restart_agent(cluster, NODE, agent_flags())
    wait_for(lambda: taints(api, cluster) == [], "the NIC published untainted", 30)
    try:
        yield NODE
    finally:
        restore_nics(cluster, NODE)
        restart_agent(cluster, NODE, [])


@pytest.fixture(autouse=True)
def _clean(api, cluster, health_node) -> Iterator[None]:
    """No pod or claim left in the namespace, the node's NICs restored, even on failure."""
    try:
        yield
    finally:
        restore_nics(cluster, NODE)
        delete_pods(api, *[p.metadata.name for p in core(api).list_namespaced_pod(NS).items])
        for c in resource(api).list_namespaced_resource_claim(NS).items:
            try:
                resource(api).delete_namespaced_resource_claim(c.metadata.name, NS)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        wait_for(lambda: not resource(api).list_namespaced_resource_claim(NS).items, "claims gone", 60)
        wait_for(lambda: not cluster.node(NODE).books()["attachments"], f"no attachment left on {NODE}", 30)
        wait_for(lambda: taints(api, cluster) == [], "the NIC untainted again", 30)


# -- scenarios -------------------------------------------------------------------------------------------


def _down_or_gone(api, cluster, *, gone: bool) -> None:
    make_template(api, "nic-1g-health", "1G", on_nic=NIC)
    make_pod(api, cluster, "pod-h", template="nic-1g-health", node=NODE)
    p, claim_name, share = attached(api, cluster, "pod-h")
    uid = p["metadata"]["uid"]
    resource_id = f"{cluster.DRIVER}/{NODE}/{NIC}"
    wait_for(
        lambda: ("claim:nic", resource_id, "Healthy") in health(api, "pod-h"), "the kubelet shows Healthy", 60
    )
    assert check(cluster, uid)[0] == 0, "CHECK passes on a healthy NIC"
    before = transitions(cluster)
    reason, condition = ("missing", "LinkMissing") if gone else ("admin-down", "LinkDown")

    t0 = time.monotonic()
    delete_nic(NODE, NIC) if gone else set_nic(NODE, NIC, "down")
    wait_for(
        lambda: taints(api, cluster) == [(KEY, reason, "NoSchedule")],
        f"the device tainted {reason}",
        SETTLE_S,
    )
    tainted_after = time.monotonic() - t0
    assert tainted_after >= DEBOUNCE_S - 0.5, f"tainted {tainted_after:.1f}s after, before the debounce"
    wait_for(
        lambda: ("claim:nic", resource_id, "Unhealthy") in health(api, "pod-h"),
        "the kubelet shows the device Unhealthy in the pod's status",
        SETTLE_S,
    )
    wait_for(
        lambda: ready(api, claim_name, share) == ("False", condition),
        f"the claim Ready=False {condition}",
        SETTLE_S,
    )
    assert transitions(cluster).get(reason, 0) == before.get(reason, 0) + 1
    code, out = check(cluster, uid)
    if not gone:
        assert code != 0 and out.get("code") == 105 and "administratively down" in out.get("msg", ""), (
            code,
            out,
        )
    else:  # the macvlan went with its parent
        assert code != 0 and out.get("code") == 105 and "the link is not in netns" in out.get("msg", ""), (
            code,
            out,
        )
    assert pod(api, "pod-h")["status"]["phase"] == "Running", "NoSchedule leaves running pods alone"

    # a new pod that only this NIC can serve: Pending, the scheduler's own reason
    make_pod(api, cluster, "pod-h2", template="nic-1g-health", node=NODE)
    why = wait_for(lambda: pending_reason(api, "pod-h2"), "the new pod Unschedulable", 60)
    assert "cannot allocate all claims" in why, why
    if gone:  # kept tainted for --keep-missing, then left out of the slice
        wait_for(lambda: taints(api, cluster) is None, "the vanished NIC left the slice", KEEP_MISSING_S + 10)
    consistently(
        lambda: (
            pending_reason(api, "pod-h2") is not None and pod(api, "pod-h2")["spec"].get("nodeName") is None
        ),
        "the new pod stays Pending",
        5,
    )

    t1 = time.monotonic()
    restore_nics(cluster, NODE) if gone else set_nic(NODE, NIC, "up")
    wait_for(lambda: taints(api, cluster) == [], "the taint gone", SETTLE_S)
    untainted_after = time.monotonic() - t1
    p2 = wait_running(api, "pod-h2", 60)
    bound_after = time.monotonic() - t1
    assert p2["spec"]["nodeName"] == NODE
    wait_for(
        lambda: ("claim:nic", resource_id, "Healthy") in health(api, "pod-h"),
        "the kubelet shows Healthy again",
        SETTLE_S,
    )
    if gone:  # its eth0 went with the old NIC: the share stays LinkMissing
        consistently(
            lambda: ready(api, claim_name, share) == ("False", "LinkMissing"),
            "the old pod's claim LinkMissing",
            3,
        )
    else:
        wait_for(
            lambda: ready(api, claim_name, share) == ("True", "InterfaceReady"),
            "the claim Ready again",
            SETTLE_S,
        )
        assert check(cluster, uid)[0] == 0, "CHECK passes again"
    assert transitions(cluster).get("up", 0) == before.get("up", 0) + 1
    print(
        f"{'deleted' if gone else 'down'}: tainted {tainted_after:.1f}s after, untainted {untainted_after:.1f}s "
        f"and the pending pod Running {bound_after:.1f}s after the NIC was back; scheduler: {why!r}; CHECK: {out}"
    )


def test_a_nic_set_down_is_tainted_unhealthy_not_ready_and_keeps_new_pods_pending_until_up(api, cluster):
    _down_or_gone(api, cluster, gone=False)


def test_a_nic_deleted_is_tainted_missing_then_dropped_and_new_pods_run_once_it_is_recreated(api, cluster):
    _down_or_gone(api, cluster, gone=True)


def test_a_flap_shorter_than_the_debounce_changes_nothing(api, cluster):
    make_template(api, "nic-1g-health", "1G", on_nic=NIC)
    make_pod(api, cluster, "pod-f", template="nic-1g-health", node=NODE)
    _, claim_name, share = attached(api, cluster, "pod-f")
    resource_id = f"{cluster.DRIVER}/{NODE}/{NIC}"
    wait_for(
        lambda: ("claim:nic", resource_id, "Healthy") in health(api, "pod-f"), "the kubelet shows Healthy", 60
    )
    generation = node_slice(api, cluster)["spec"]["pool"]["generation"]
    claim_rv = to_dict(api, resource(api).read_namespaced_resource_claim(claim_name, NS))["metadata"][
        "resourceVersion"
    ]
    before = transitions(cluster)
    set_nic(NODE, NIC, "down")
    time.sleep(DEBOUNCE_S / 4)
    set_nic(NODE, NIC, "up")
    consistently(
        lambda: (
            taints(api, cluster) == []
            and ("claim:nic", resource_id, "Healthy") in health(api, "pod-f")
            and ready(api, claim_name, share) == ("True", "InterfaceReady")
        ),
        "no taint, Healthy, Ready",
        DEBOUNCE_S + 3,
        0.25,
    )
    assert node_slice(api, cluster)["spec"]["pool"]["generation"] == generation
    assert (
        to_dict(api, resource(api).read_namespaced_resource_claim(claim_name, NS))["metadata"][
            "resourceVersion"
        ]
        == claim_rv
    )
    assert transitions(cluster) == before
