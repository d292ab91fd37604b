"""conf/k8s manifests: every document loads through the official client's models
unchanged (no unknown or misspelt field), and they fit together: the DeviceClass selects
the inventory's shared NICs, the template's 2G request allocates on them, the RBAC allows
every call the agent makes, the admission policy pins the agent's slice writes to its own
node (its CEL evaluated here with the CEL library the allocator uses; the real API server
judges it in ``make e2e``), the DaemonSet installs the plugin and runs the agent."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "conf" / "k8s"

MODELS = {
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Pod"): "V1Pod",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("resource.k8s.io/v1", "DeviceClass"): "V1DeviceClass",
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): "V1ResourceClaimTemplate",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): "V1ValidatingAdmissionPolicy",
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    ): "V1ValidatingAdmissionPolicyBinding",
}


def docs() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def by_kind(kind: str) -> list[dict]:
    return [d for _, d in docs() if d["kind"] == kind]


@pytest.mark.parametrize("name,doc", docs(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_manifest_loads_through_client_models(name, doc):
    from kubernetes import client

    model = getattr(client, MODELS[(doc["apiVersion"], doc["kind"])])
    obj = model.model_validate(doc)  # the client's models forbid unknown fields
    assert client.ApiClient().sanitize_for_serialization(obj) == doc


def test_every_kind_is_there():
    assert sorted({d["kind"] for _, d in docs()}) == sorted(k for _, k in MODELS)


def test_deviceclass_selects_the_inventory_nics_only():
    from cni_dra.allocator.cel import device_matches
    from cni_dra.dra.inventory import load_inventory

    (dc,) = by_kind("DeviceClass")
    exprs = [s["cel"]["expression"] for s in dc["spec"]["selectors"]]
    inv = load_inventory(str(ROOT / "conf" / "resourceslice.yaml"))
    assert [device_matches(exprs, d, inv.spec.driver) for d in inv.spec.devices] == [True, True]
    assert not device_matches(exprs, inv.spec.devices[0], "other.driver")


def test_template_request_allocates_2g_share():
    from cni_dra.allocator.claim_allocator import NodeUsage, allocate_claim
    from cni_dra.dra.claims import ResourceClaim
    from cni_dra.dra.inventory import load_inventory

    (tpl,) = by_kind("ResourceClaimTemplate")
    (dc,) = by_kind("DeviceClass")
    claim = ResourceClaim.model_validate(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": tpl["spec"]["spec"],
        }
    )
    inv = load_inventory(str(ROOT / "conf" / "resourceslice.yaml"))
    classes = {dc["metadata"]["name"]: [s["cel"]["expression"] for s in dc["spec"]["selectors"]]}
    got = allocate_claim(
        claim, inv, NodeUsage(), lambda: "3b9f0c1e-7a2d-4c5b-9e8f-1a2b3c4d5e6f", classes=classes
    )
    (res,) = got.devices.results
    assert res.request == "net1"
    assert str(res.consumed_capacity["bandwidth"]) == "2G"
    assert res.share_id == "3b9f0c1e-7a2d-4c5b-9e8f-1a2b3c4d5e6f"


def test_pod_uses_the_template():
    (pod,) = by_kind("Pod")
    (tpl,) = by_kind("ResourceClaimTemplate")
    (rc,) = pod["spec"]["resourceClaims"]
    assert rc["resourceClaimTemplateName"] == tpl["metadata"]["name"]
    assert pod["metadata"]["namespace"] == tpl["metadata"]["namespace"]


def test_rbac_allows_every_agent_call():
    (role,) = by_kind("ClusterRole")
    allowed = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule.get("apiGroups", [])
        for r in rule.get("resources", [])
        for v in rule["verbs"]
    }
    allowed |= {
        ("", url, v)
        for rule in role["rules"]
        for url in rule.get("nonResourceURLs", [])
        for v in rule["verbs"]
    }
    needed = {  # cni_dra.k8s.api.KubeApi
        ("", "/metrics", "get"),  # get_metrics_text: the DRAFractionalCapacityRange gate
        ("", "nodes", "get"),
        ("resource.k8s.io", "resourceslices", "get"),
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "create"),
        ("resource.k8s.io", "resourceslices", "update"),
        ("resource.k8s.io", "resourceslices", "delete"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims", "watch"),
        ("resource.k8s.io", "resourceclaims/status", "patch"),
    }
    assert needed <= allowed
    (binding,) = by_kind("ClusterRoleBinding")
    (sa,) = by_kind("ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    ]


def test_rbac_allows_status_devices_writes_for_this_driver_on_its_node():
    # Since Kubernetes 1.36 the API server refuses a change of status.devices unless the
    # writer may also <verb> the synthetic subresource resourceclaims/driver named after
    # the driver; the real kube-apiserver said so with "requires resource=resourceclaims/driver,
    # verb=[associated-node:patch arbitrary-node:patch]".
    (role,) = by_kind("ClusterRole")
    (ds,) = by_kind("DaemonSet")
    driver = json.loads(by_kind("ConfigMap")[0]["data"]["10-cni-dra.conflist"])["plugins"][0]["driver"]
    rules = [r for r in role["rules"] if "resourceclaims/driver" in r.get("resources", [])]
    assert rules, "no rule for resourceclaims/driver"
    (rule,) = rules
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["resourceNames"] == [driver]
    # node-local: only claims allocated on the node the agent's token is bound to
    assert rule["verbs"] == ["associated-node:patch"]
    assert (
        ds["spec"]["template"]["spec"]["serviceAccountName"]
        == by_kind("ServiceAccount")[0]["metadata"]["name"]
    )


def test_daemonset_installs_the_plugin_and_runs_the_agent():
    (ds,) = by_kind("DaemonSet")
    (cm,) = by_kind("ConfigMap")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["hostPID"] is True
    assert pod["serviceAccountName"] == by_kind("ServiceAccount")[0]["metadata"]["name"]
    (init,) = pod["initContainers"]
    script = init["args"][0]
    ienv = {e["name"]: e.get("value") for e in init["env"]}
    assert "bin=/host/cni/bin" in script and 'mv -f "$bin/.cni-dra.tmp" "$bin/cni-dra"' in script
    assert 'mv -f "/host/cni/net.d/.$CONFLIST.tmp" "/host/cni/net.d/$CONFLIST"' in script
    assert ienv["CONFLIST"] == "10-cni-dra.conflist"
    assert (
        "cp -a /opt/cni/bin/cni-dra.d " in script
    )  # the plugin tree the client runs (README "Install layout")
    host_paths = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    mounts = {m["mountPath"]: host_paths[m["name"]] for m in init["volumeMounts"] if host_paths[m["name"]]}
    assert mounts["/host/cni/bin"] == "/opt/cni/bin" and mounts["/host/cni/net.d"] == "/etc/cni/net.d"
    (agent,) = pod["containers"]
    assert agent["command"] == ["cni-dra", "agent"]
    amounts = {m["mountPath"]: host_paths[m["name"]] for m in agent["volumeMounts"]}
    # every host directory at its own path: the agent and the plugin name the same files
    assert amounts["/var/lib/kubelet/plugins/net.cni-dra.dev"] == "/var/lib/kubelet/plugins/net.cni-dra.dev"
    assert amounts["/var/lib/kubelet/plugins_registry"] == "/var/lib/kubelet/plugins_registry"
    assert amounts["/var/lib/cni-dra"] == "/var/lib/cni-dra" and amounts["/run/cni-dra"] == "/run/cni-dra"
    conflist = json.loads(cm["data"]["10-cni-dra.conflist"])
    (plugin,) = conflist["plugins"]
    assert plugin["type"] == "cni-dra" and plugin["driver"] == "net.cni-dra.dev"
    (dc,) = by_kind("DeviceClass")
    assert plugin["driver"] in dc["spec"]["selectors"][0]["cel"]["expression"]


def test_agent_cli_takes_every_variable_the_daemonset_sets(monkeypatch):
    """Each CNI_DRA_* variable of the agent's container is an option's environment twin of
    ``cni-dra agent`` (a misspelt one would be ignored silently), and its value parses."""
    from cni_dra.cli.agent import agent as command

    (ds,) = by_kind("DaemonSet")
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    assert agent["command"] == ["cni-dra", "agent"] and "args" not in agent
    env = {e["name"]: e["value"] for e in agent["env"] if "value" in e}
    twins = {p.envvar: p.name for p in command.params if getattr(p, "envvar", None)}
    assert {k for k in env if k.startswith("CNI_DRA_")} <= set(twins)
    for key in list(os.environ):
        if key.startswith("CNI_DRA_") or key in ("NODE_NAME", "KUBECONFIG"):
            monkeypatch.delenv(key)
    for key, value in {**env, "NODE_NAME": "node-a"}.items():
        monkeypatch.setenv(key, value)
    params = command.make_context("agent", []).params
    assert params["cleanup"] is True and params["fastpath_mount_ns"] == "/proc/1/ns/mnt"
    assert params["fastpath_socket"] == "/run/cni-dra/agent.sock" and params["fastpath_processes"] == 0
    assert params["plugin_dir"] == "/var/lib/kubelet/plugins/net.cni-dra.dev"
    assert params["conflists"] == ("/config/10-cni-dra.conflist",) and params["node_name"] == "node-a"


def test_the_shipped_conflists_let_pod_bandwidth_annotations_reach_the_plugin() -> None:
    """containerd and CRI-O pass ``runtimeConfig.bandwidth`` (from the pod's
    ``kubernetes.io/ingress-bandwidth`` / ``egress-bandwidth`` annotations) only to a plugin
    whose conflist entry declares the capability; cni-dra may then lower a pod's rate."""
    conflists = [
        json.loads((ROOT / "conf" / "10-cni-dra.conflist").read_text()),
        json.loads(by_kind("ConfigMap")[0]["data"]["10-cni-dra.conflist"]),
    ]  # the bed installs the chart's (tests/test_helm_chart.py checks those of its values)
    for conflist in conflists:
        assert conflist["plugins"][0]["capabilities"] == {"bandwidth": True}


def _e2e_bed() -> Any:
    spec = importlib.util.spec_from_file_location(
        "cni_dra_e2e_cluster_manifests", ROOT / "scripts/e2e/cluster.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- the admission policy (conf/k8s/admission.yaml) -----------------------------------------------

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"


def _agent_user() -> str:
    (sa,) = by_kind("ServiceAccount")
    return f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"


def _slice(node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "net.cni-dra.dev",
        "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
    }
    spec.update({"nodeName": node} if node else {"allNodes": True})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": spec,
    }


def admit(
    operation: str, *, user: str, node: str | None, new: dict | None = None, old: dict | None = None
) -> list[str] | None:
    """The policy's verdict on a request, as the API server's admission evaluates it: None
    when its match condition leaves the request alone, else the messages of the failed
    validations ([] = admitted). ``node``: the node the user's token is bound to."""
    import cel

    (policy,) = by_kind("ValidatingAdmissionPolicy")
    spec = policy["spec"]
    user_info: dict[str, Any] = {"username": user}
    if node is not None:
        user_info["extra"] = {NODE_NAME_KEY: [node], "authentication.kubernetes.io/credential-id": ["JTI=x"]}
    ctx: dict[str, Any] = {
        "request": {"operation": operation, "userInfo": user_info},
        "object": new,
        "oldObject": old,
    }
    if not all(cel.evaluate(m["expression"], ctx) for m in spec["matchConditions"]):
        return None
    variables: dict[str, Any] = {}
    for var in spec["variables"]:
        variables[var["name"]] = cel.evaluate(var["expression"], {**ctx, "variables": variables})
    ctx["variables"] = variables
    out = []
    for v in spec["validations"]:
        if not cel.evaluate(v["expression"], ctx):
            assert v["reason"] == "Forbidden"  # a 403, not the default 422 Invalid
            out.append(v["message"] if "message" in v else cel.evaluate(v["messageExpression"], ctx))
    return out


def test_the_admission_policy_is_bound_matches_slice_writes_and_only_the_agents_requests():
    (policy,) = by_kind("ValidatingAdmissionPolicy")
    (binding,) = by_kind("ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], sorted(rule["operations"])) == (
        ["resource.k8s.io"],
        ["resourceslices"],
        ["CREATE", "DELETE", "UPDATE"],
    )
    (ds,) = by_kind("DaemonSet")
    assert (
        _agent_user() == f"system:serviceaccount:{ds['metadata']['namespace']}:"
        f"{ds['spec']['template']['spec']['serviceAccountName']}"
    )
    # the kubelet (its own node restriction applies), the scheduler, an admin, another
    # service account of the same name elsewhere: not this policy's business
    for user in (
        "system:node:node-b",
        "system:kube-scheduler",
        "admin",
        "system:serviceaccount:other:cni-dra",
    ):
        assert admit("CREATE", user=user, node="node-b", new=_slice("node-a")) is None


def test_the_agent_writes_its_own_nodes_slices():
    user = _agent_user()
    assert admit("CREATE", user=user, node="node-a", new=_slice("node-a")) == []
    assert admit("UPDATE", user=user, node="node-a", new=_slice("node-a"), old=_slice("node-a")) == []
    assert admit("DELETE", user=user, node="node-a", old=_slice("node-a")) == []


@pytest.mark.parametrize(
    ("operation", "new", "old"),
    [
        ("CREATE", "node-a", None),
        ("UPDATE", "node-a", "node-a"),
        ("UPDATE", "node-b", "node-a"),  # taking over another node's slice
        ("UPDATE", "node-a", "node-b"),  # handing its own slice to another node
        ("DELETE", None, "node-a"),
    ],
)
def test_a_token_bound_to_another_node_cannot_touch_this_nodes_slices(operation, new, old):
    got = admit(
        operation, user=_agent_user(), node="node-b", new=new and _slice(new), old=old and _slice(old)
    )
    assert got == [
        "cni-dra's service account on node 'node-b' may write only that node's ResourceSlices, "
        "not those of node 'node-a'"
    ]


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_a_slice_for_no_single_node_is_refused(operation):
    new = None if operation == "DELETE" else _slice(None)
    old = None if operation == "CREATE" else _slice(None)
    assert admit(operation, user=_agent_user(), node="node-a", new=new, old=old) == [
        "cni-dra's service account on node 'node-a' may write only that node's ResourceSlices, not a slice for no "
        "single node (allNodes, nodeSelector or perDeviceNodeSelection)"
    ]


def test_a_token_bound_to_no_node_writes_no_slice():
    assert admit("CREATE", user=_agent_user(), node=None, new=_slice("node-a")) == [
        "cni-dra's service account may write ResourceSlices only with a token bound to a node (its pod's or a Node)"
    ]
