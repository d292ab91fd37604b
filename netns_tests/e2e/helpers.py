"""What the real-cluster scenarios share: waiting, the API objects they make and read
(official Python client), and a GET from inside a node. Not a test module."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

NS = "default"
_REPO = Path(__file__).resolve().parents[2]


def load_cluster_module() -> ModuleType:
    """The bed's library, scripts/e2e/cluster.py (not a package), loaded once per process."""
    spec = importlib.util.spec_from_file_location("cni_dra_e2e_cluster", _REPO / "scripts/e2e/cluster.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def wait_for(cond, what: str, timeout_s: float = 90.0, interval_s: float = 0.5):
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        try:
            value = cond()
        except ApiException as exc:
            value, last = None, exc
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not reached in {timeout_s:.0f}s (last error: {last})")


def consistently(cond, what: str, duration_s: float = 10.0, interval_s: float = 1.0) -> None:
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        assert cond(), f"{what}: stopped holding"
        time.sleep(interval_s)


def core(api) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def resource(api) -> client.ResourceV1Api:
    return client.ResourceV1Api(api)


def to_dict(api, obj) -> dict[str, Any]:
    return api.sanitize_for_serialization(obj)


def make_template(api, name: str, bandwidth: str, *, on_nic: str | None = None) -> None:
    """A ResourceClaimTemplate with one request ``net1`` (kept when it exists already)."""
    exactly: dict[str, Any] = {
        "deviceClassName": "cni-dra-shared-nic",
        "capacity": {"requests": {"bandwidth": bandwidth}},
    }
    if on_nic:
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["net.cni-dra.dev"].ifName == "{on_nic}"'}}
        ]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "net1", "exactly": exactly}]}}},
    }
    try:
        resource(api).create_namespaced_resource_claim_template(NS, body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def make_pod(
    api,
    cluster,
    name: str,
    *,
    template: str | None = None,
    claim: str | None = None,
    templates: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    anywhere: bool = False,
) -> dict:
    """A pod of the test image; its claim from ``template`` or ``claim`` (named ``nic``), or
    one claim per entry of ``templates`` (``nic-0``, ``nic-1``...). Pinned to ``node``
    (default: the first node) by a nodeSelector, so the scheduler still allocates its
    claims; ``anywhere``: no selector, the scheduler picks the node."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": cluster.TEST_IMAGE, "imagePullPolicy": "Never"}],
    }
    if not anywhere:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node or cluster.NODE}
    refs: list[dict[str, str]] = [
        {"name": f"nic-{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)
    ]
    if template or claim:
        ref = {"name": "nic"}
        ref["resourceClaimTemplateName" if template else "resourceClaimName"] = template or claim
        refs.append(ref)
    if refs:
        spec["resourceClaims"] = refs
        spec["containers"][0]["resources"] = {"claims": [{"name": r["name"]} for r in refs]}
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if annotations:
        meta["annotations"] = annotations
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    return to_dict(api, core(api).create_namespaced_pod(NS, body))


def pod(api, name: str) -> dict | None:
    try:
        return to_dict(api, core(api).read_namespaced_pod(name, NS))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_running(api, name: str, timeout_s: float = 90.0) -> dict:
    return wait_for(
        lambda: (
            (p := pod(api, name)) and p["status"].get("phase") == "Running" and p["status"].get("podIP") and p
        ),
        f"pod {name} Running",
        timeout_s,
    )


def delete_pods(api, *names: str) -> None:
    for name in names:
        try:
            core(api).delete_namespaced_pod(name, NS, grace_period_seconds=1)
        except ApiException as exc:
            if exc.status != 404:
                raise
    for name in names:
        wait_for(lambda: pod(api, name) is None, f"pod {name} gone", 90)


def node_http(cluster, node: str, url: str, *, timeout_s: float | None = None) -> str:
    """GET ``url`` from inside ``node``'s netns (its 127.0.0.1 is the node's own); the whole
    call bounded by ``timeout_s`` when given. Raises ``CalledProcessError`` when it fails."""
    code = (
        "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    )
    out = subprocess.run(
        ["nsenter", f"--net={cluster.node(node).netns}", "python3", "-c", code, url],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_s,
    )
    return out.stdout


def status_entry(claim: dict, share_id: str) -> dict | None:
    for dev in (claim.get("status") or {}).get("devices") or []:
        if dev.get("shareID") == share_id:
            return dev
    return None


GIB = Decimal(10) ** 9


def make_claim(api, name: str, bandwidth: str) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "net1",
                        "exactly": {
                            "deviceClassName": "cni-dra-shared-nic",
                            "capacity": {"requests": {"bandwidth": bandwidth}},
                        },
                    }
                ]
            }
        },
    }
    resource(api).create_namespaced_resource_claim(NS, body)


def claim_of(api, pod_obj: dict) -> dict:
    """The pod's ResourceClaim (generated from a template or named in the spec)."""
    name = None
    for st in pod_obj["status"].get("resourceClaimStatuses") or []:
        name = st.get("resourceClaimName")
    if name is None:
        name = pod_obj["spec"]["resourceClaims"][0].get("resourceClaimName")
    return to_dict(api, resource(api).read_namespaced_resource_claim(name, NS))


def result_of(claim: dict) -> dict:
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    return res


def books(cluster, node: str | None = None) -> dict:
    """``cni-dra status --json`` inside ``node`` (default: the first node): its state dir
    and inventory, as the node sees them."""
    return cluster.node(node or cluster.NODE).books()


def booked(cluster, node: str | None = None) -> dict[str, Decimal]:
    return {d["name"]: parse_quantity(d["consumed"]["bandwidth"]) for d in books(cluster, node)["devices"]}


def scheduled(api, cluster, node: str | None = None) -> dict[str, Decimal]:
    """Sum of consumedCapacity.bandwidth of every allocation result on ``node``'s pool."""
    out = {nic: Decimal(0) for nic in cluster.NICS}
    for c in resource(api).list_resource_claim_for_all_namespaces().items:
        c = to_dict(api, c)
        for res in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []:
            if res["driver"] == cluster.DRIVER and res["pool"] == (node or cluster.NODE):
                out[res["device"]] += parse_quantity(res["consumedCapacity"]["bandwidth"])
    return out


def books_match(api, cluster, node: str | None = None) -> bool:
    return booked(cluster, node) == scheduled(api, cluster, node)


def nothing_held(cluster, node: str | None = None) -> bool:
    held = books(cluster, node)
    return not held["attachments"] and not held["preparedClaims"]


def pod_netns(uid: str) -> str:
    """/proc/<pid>/ns/net of a process of pod ``uid``, found through the pod's cgroup
    (CRI-O's conmon, in the pod's cgroup but in the node's netns, is not one)."""
    root = Path("/sys/fs/cgroup/pids") / "cni-dra-e2e"
    for d in root.rglob(f"pod{uid}"):
        for procs in d.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    if Path(f"/proc/{pid}/comm").read_text().strip() != "conmon":
                        return f"/proc/{pid}/ns/net"
                except OSError:
                    continue
    raise AssertionError(f"no process of pod {uid} under {root}")


def kernel_eth0(uid: str) -> dict:
    from netns_tests.runner import link_in_netns

    link = link_in_netns(pod_netns(uid), "eth0")
    assert link is not None, f"pod {uid} has no eth0"
    return link


def node_link(cluster, node: str, ifname: str) -> dict[str, Any]:
    """The kernel's ``ifname`` in ``node``'s netns: {"index", "mtu", "mac"}."""
    from pyroute2 import IPRoute

    with IPRoute(netns=cluster.node(node).netns) as ipr:
        found = ipr.link_lookup(ifname=ifname)
        assert found, f"{ifname} is not in node {node}'s netns"
        link = ipr.link("get", index=found[0])[0]
    return {"index": link["index"], "mtu": link.get_attr("IFLA_MTU"), "mac": link.get_attr("IFLA_ADDRESS")}


def node_ifindex(cluster, node: str, ifname: str) -> int:
    return node_link(cluster, node, ifname)["index"]


def node_mtu(cluster, node: str, ifname: str) -> int:
    return node_link(cluster, node, ifname)["mtu"]


def ip_json(uid: str, *args: str) -> Any:
    """``ip -j <args>`` in pod ``uid``'s netns."""
    out = subprocess.run(
        ["nsenter", f"--net={pod_netns(uid)}", "ip", "-j", *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout or "[]")


def eth0_parent(uid: str) -> tuple[str, int]:
    """(the named netns, ifindex there) of the parent of pod ``uid``'s eth0, in the kernel's
    words: the link's ``link_netnsid`` and the netns the pod's netns gives that id."""
    (link,) = ip_json(uid, "-d", "link", "show", "eth0")
    names = {e["nsid"]: e.get("name") for e in ip_json(uid, "netns", "list-id")}
    return names.get(link.get("link_netnsid")), link["link_index"]


def on_nic(cluster, uid: str, node: str, nic: str) -> bool:
    """Pod ``uid``'s eth0 is a link on NIC ``nic`` of ``node`` (not a same-named NIC of another node)."""
    return eth0_parent(uid) == (node, node_ifindex(cluster, node, nic))


def ip_link(uid: str, ifname: str = "eth0") -> dict:
    """``ip -d -j link show`` of ``ifname`` in pod ``uid``'s netns: the kernel's own words
    on the link's kind (``linkinfo.info_kind``), mode (``linkinfo.info_data.mode``) and MTU."""
    (link,) = ip_json(uid, "-d", "link", "show", ifname)
    return link


def tc(uid: str, *args: str) -> list[dict]:
    """``tc -j <args>`` in pod ``uid``'s netns: the kernel's traffic control, in tc's words."""
    out = subprocess.run(
        ["nsenter", f"--net={pod_netns(uid)}", "tc", "-j", *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout or "[]")


def kernel_rates(uid: str, ifname: str = "eth0") -> dict[str, int]:
    """The rates (bit/s) the kernel shapes pod ``uid``'s ``ifname`` to: egress, the root tbf
    on it; ingress, the root tbf on the device its ingress filter redirects to (mirred)."""

    def root_tbf(dev: str) -> dict:
        (q,) = [q for q in tc(uid, "qdisc", "show", "dev", dev) if q["kind"] == "tbf" and q.get("root")]
        return q

    (to_dev,) = {
        a["to_dev"]
        for f in tc(uid, "filter", "show", "dev", ifname, "ingress")
        for a in (f.get("options") or {}).get("actions") or []
        if a.get("kind") == "mirred"
    }
    # tc -j gives a tbf's rate in bytes per second
    return {
        "egress": root_tbf(ifname)["options"]["rate"] * 8,
        "ingress": root_tbf(to_dev)["options"]["rate"] * 8,
    }


def pod_events(api, pod_obj: dict) -> list[tuple[str, str]]:
    """(reason, message) of the events about this pod (by UID: a pod of the same name in an
    earlier scenario has events of its own), as ``kubectl describe pod`` lists them."""
    uid = pod_obj["metadata"]["uid"]
    events = core(api).list_namespaced_event(NS, field_selector=f"involvedObject.uid={uid}").items
    return [(e.reason or "", e.message or "") for e in events]


def wait_event(api, name: str, reason: str, *needles: str, timeout_s: float = 60) -> str:
    """The message of pod ``name``'s first event of ``reason`` that contains every needle."""
    p = pod(api, name)
    assert p is not None, name

    def found() -> str | None:
        for r, msg in pod_events(api, p):
            if r == reason and all(n in msg for n in needles):
                return msg
        return None

    try:
        return wait_for(found, f"pod {name}: event {reason} with {needles}", timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; events: {pod_events(api, p)}") from None


def forbidden(call) -> bool:
    """Whether ``call()`` is refused with 403 Forbidden (any other error is raised)."""
    try:
        call()
    except ApiException as exc:
        if exc.status == 403:
            return True
        raise
    return False


def refused(call, *, why: str) -> None:
    """``call()`` is refused with 403 Forbidden and a message containing ``why``."""
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, (err.value.status, err.value.body)
    assert why in json.loads(err.value.body)["message"], err.value.body


def delete_cluster_objects(api, *, classes: tuple[str, ...] = (), templates: tuple[str, ...] = ()) -> None:
    for name in templates:
        try:
            resource(api).delete_namespaced_resource_claim_template(name, NS)
        except ApiException as exc:
            if exc.status != 404:
                raise
    for name in classes:
        try:
            resource(api).delete_device_class(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def check_attached(api, cluster, name: str, bandwidth: str) -> tuple[dict, dict, dict]:
    """Pod ``name`` runs with eth0 on the NIC the scheduler allocated on the pod's node, as
    that node's kubelet prepared it, and the claim's status carries its interface.
    Returns (pod, claim, result)."""
    p = wait_running(api, name)
    node = p["spec"]["nodeName"]
    claim = claim_of(api, p)
    res = result_of(claim)
    assert res["driver"] == cluster.DRIVER and res["pool"] == node
    assert res["device"] in cluster.NICS
    assert parse_quantity(res["consumedCapacity"]["bandwidth"]) == parse_quantity(bandwidth)
    assert res.get("shareID"), "a share of a multi-allocatable device has a shareID"
    # what the node's kubelet prepared (NodePrepareResources) and containerd's ADD attached
    uid = p["metadata"]["uid"]
    held = books(cluster, node)
    atts = [a for a in held["attachments"] if a["podUID"] == uid]
    assert [(a["device"], a["shareID"], a["ifname"]) for a in atts] == [
        (res["device"], res["shareID"], "eth0")
    ]
    assert parse_quantity(atts[0]["consumedCapacity"]["bandwidth"]) == parse_quantity(bandwidth)
    prepared = [c for c in held["preparedClaims"] if c["podUID"] == uid]
    assert [c["uid"] for c in prepared] == [claim["metadata"]["uid"]]
    # the kernel: eth0 in the pod is a macvlan on the allocated NIC of the pod's node
    eth0 = kernel_eth0(uid)
    assert eth0_parent(uid) == (node, node_ifindex(cluster, node, res["device"]))
    assert [c.split("/")[0] for c in eth0["ipv4"]] == [p["status"]["podIP"]]
    # the claim's status: networkData by server-side apply under the driver's field manager
    claim = wait_for(
        lambda: (
            (c := to_dict(api, resource(api).read_namespaced_resource_claim(claim["metadata"]["name"], NS)))
            and status_entry(c, res["shareID"])
            and c
        ),
        "networkData written",
        60,
    )
    entry = status_entry(claim, res["shareID"])
    assert (entry["driver"], entry["pool"], entry["device"]) == (cluster.DRIVER, node, res["device"])
    nd = entry["networkData"]
    assert nd["interfaceName"] == "eth0"
    assert nd["ips"] == eth0["ipv4"] and nd["ips"][0].split("/")[0] == p["status"]["podIP"]
    assert nd["hardwareAddress"].lower() == eth0["mac"].lower()
    assert {(c["type"], c["status"]) for c in entry.get("conditions") or []} >= {("Ready", "True")}
    managers = [
        (m["manager"], m["operation"], m.get("subresource")) for m in claim["metadata"]["managedFields"]
    ]
    assert (cluster.DRIVER, "Apply", "status") in managers
    return p, claim, res


@pytest.fixture(autouse=True)
def clean_namespace(api, cluster):
    """Every scenario starts and ends with no pod and no claim in the namespace, so that
    one failure does not spill into the next scenario's books."""
    yield
    names = [p.metadata.name for p in core(api).list_namespaced_pod(NS).items]
    delete_pods(api, *names)
    for c in resource(api).list_namespaced_resource_claim(NS).items:
        try:
            resource(api).delete_namespaced_resource_claim(c.metadata.name, NS)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(lambda: not resource(api).list_namespaced_resource_claim(NS).items, "claims gone", 60)
    for n in cluster.NODES:
        wait_for(lambda n=n: not books(cluster, n.name)["attachments"], f"no attachment left on {n.name}", 30)
