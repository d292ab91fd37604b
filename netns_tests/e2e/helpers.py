"""What the real-cluster scenarios share: waiting, the API objects they make and read
(official Python client), and a GET from inside a node. Not a test module."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

NS = "default"


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
    exactly: dict[str, Any] = {"deviceClassName": "cni-dra-shared-nic",
                               "capacity": {"requests": {"bandwidth": bandwidth}}}
    if on_nic:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["net.cni-dra.dev"].ifName == "{on_nic}"'}}]
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [{"name": "net1", "exactly": exactly}]}}}}
    try:
        resource(api).create_namespaced_resource_claim_template(NS, body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def make_pod(api, cluster, name: str, *, template: str | None = None, claim: str | None = None,
             templates: tuple[str, ...] = (), annotations: dict[str, str] | None = None,
             node: str | None = None, anywhere: bool = False) -> dict:
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
    refs: list[dict[str, str]] = [{"name": f"nic-{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
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
    return wait_for(lambda: (p := pod(api, name)) and p["status"].get("phase") == "Running" and p["status"].get("podIP")
                    and p, f"pod {name} Running", timeout_s)


def delete_pods(api, *names: str) -> None:
    for name in names:
        try:
            core(api).delete_namespaced_pod(name, NS, grace_period_seconds=1)
        except ApiException as exc:
            if exc.status != 404:
                raise
    for name in names:
        wait_for(lambda: pod(api, name) is None, f"pod {name} gone", 90)


def node_http(cluster, node: str, url: str) -> str:
    """GET ``url`` from inside ``node``'s netns (its 127.0.0.1 is the node's own)."""
    code = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    out = subprocess.run(["nsenter", f"--net={cluster.node(node).netns}", "python3", "-c", code, url],
                         capture_output=True, text=True, check=True)
    return out.stdout


def status_entry(claim: dict, share_id: str) -> dict | None:
    for dev in (claim.get("status") or {}).get("devices") or []:
        if dev.get("shareID") == share_id:
            return dev
    return None
