"""The Helm chart (deploy/helm/cni-dra): `helm lint`, and `helm template` parsed with the
official client's models, for the default values and for the values an operator sets.

What is checked: every object loads through the client's models unchanged; the agent runs
unprivileged with exactly the capabilities README "Install" lists, the init container with
none; every host path is mounted at its own path; the conflist is one the plugin accepts;
the RBAC is exactly what the agent calls; the admission policy names the chart's service
account; the values reach the agent's environment and the init container's discovery (the
devices list is run through ``cni-dra inventory discover``); conf/k8s is the chart
rendered with the defaults (scripts/render-manifests).

The helm binary: ``CNI_DRA_HELM`` (``make unit`` and ``make test`` set it from
scripts/e2e/build-helm), else the build's cache. Without one these tests skip, except with
``CI=true``, where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "cni-dra"
HELM_VERSION = "v4.3.2"  # scripts/e2e/build-helm's default

MODELS = {
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("resource.k8s.io/v1", "DeviceClass"): "V1DeviceClass",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): "V1ValidatingAdmissionPolicy",
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    ): "V1ValidatingAdmissionPolicyBinding",
}
CAPABILITIES = ["NET_ADMIN", "SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"]
"""The agent's capabilities (README "Install", least privilege), each found needed by trying."""


def _helm() -> str:
    cache = Path(os.environ.get("CNI_DRA_E2E_CACHE", "/var/cache/cni-dra-e2e"))
    for candidate in (
        os.environ.get("CNI_DRA_HELM", ""),
        str(cache / f"helm-{HELM_VERSION}" / "bin" / "helm"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    why = "no helm binary: set CNI_DRA_HELM or run scripts/e2e/build-helm (make unit does)"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def helm(tmp_path_factory) -> Any:
    binary = _helm()
    home = tmp_path_factory.mktemp("helm-home")
    env = {**os.environ, **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [binary, *args], capture_output=True, text=True, env=env, timeout=120, check=False
        )
        if check and res.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}: exit {res.returncode}: {res.stderr}")
        return res

    return run


def render(
    helm: Any,
    values: dict[str, Any] | None = None,
    *,
    release: str = "cni-dra",
    namespace: str = "kube-system",
    tmp: Path | None = None,
) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["-f", str(path)]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def pod_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def mounts_of(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """mountPath -> host path of each hostPath mount of ``container``."""
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    return {m["mountPath"]: host[m["name"]] for m in container["volumeMounts"] if m["name"] in host}


def plugin_conf(docs: list[dict[str, Any]], key: str) -> Any:
    """The conflist's cni-dra entry as the runtime hands it to the plugin, parsed by the plugin."""
    from cni_dra.protocol.config import load_conf

    conflist = json.loads(one(docs, "ConfigMap")["data"][key])
    (entry,) = conflist["plugins"]
    return load_conf(
        json.dumps({**entry, "name": conflist["name"], "cniVersion": conflist["cniVersion"]}).encode()
    )


# -- the chart itself ------------------------------------------------------------------------


def test_the_chart_is_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == chart["version"] == version


def test_helm_lint_is_clean(helm):
    res = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in res.stdout, res.stdout
    assert "[WARNING]" not in res.stdout and "[ERROR]" not in res.stdout, res.stdout


def test_every_object_loads_through_the_client_models(helm):
    from kubernetes import client

    docs = render(helm)
    assert sorted(d["kind"] for d in docs) == sorted(k for _, k in MODELS)
    for doc in docs:
        obj = getattr(client, MODELS[(doc["apiVersion"], doc["kind"])]).model_validate(doc)
        assert client.ApiClient().sanitize_for_serialization(obj) == doc


# -- the defaults ----------------------------------------------------------------------------


def test_the_agent_runs_unprivileged_with_four_capabilities_and_the_init_container_with_none(helm):
    pod = pod_of(render(helm))
    assert pod["hostNetwork"] is True and pod["hostPID"] is True and pod["dnsPolicy"] == "Default"
    assert pod["automountServiceAccountToken"] is True
    (init,) = pod["initContainers"]
    (agent,) = pod["containers"]
    for container, caps in ((agent, {"drop": ["ALL"], "add": CAPABILITIES}), (init, {"drop": ["ALL"]})):
        assert container["securityContext"] == {
            "runAsUser": 0,
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": caps,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    env = env_of(agent)
    assert (
        env["CNI_DRA_FASTPATH_MOUNT_NS"] == "/proc/1/ns/mnt"
        and env["CNI_DRA_AGENT_SOCKET"] == "/run/cni-dra/agent.sock"
    )
    assert "KUBERNETES_SERVICE_HOST" not in env  # the in-cluster default unless apiServer.host is set


def test_every_host_directory_the_agent_uses_is_mounted_at_its_own_path(helm):
    pod = pod_of(render(helm))
    (init,) = pod["initContainers"]
    (agent,) = pod["containers"]
    assert mounts_of(pod, agent) == {
        p: p
        for p in (
            "/var/lib/cni-dra",
            "/etc/cni-dra",
            "/run/cni-dra",
            "/var/lib/kubelet/plugins/net.cni-dra.dev",
            "/var/lib/kubelet/plugins_registry",
        )
    }
    assert mounts_of(pod, init) == {
        "/host/cni/bin": "/opt/cni/bin",
        "/host/cni/net.d": "/etc/cni/net.d",
        "/etc/cni-dra": "/etc/cni-dra",
        "/run/cni-dra": "/run/cni-dra",
    }
    assert not any(m.get("readOnly") is False for m in agent["volumeMounts"])


def test_the_default_conflist_is_one_the_plugin_accepts(helm):
    conf = plugin_conf(render(helm), "10-cni-dra.conflist")
    assert (conf.name, conf.cniVersion, conf.driver, conf.linkType) == (
        "dra-net",
        "1.1.0",
        "net.cni-dra.dev",
        "macvlan",
    )
    assert (conf.stateDir, conf.inventory) == ("/var/lib/cni-dra", "/etc/cni-dra/resourceslice.yaml")


def test_the_role_is_exactly_what_the_agent_calls(helm):
    docs = render(helm)
    role = one(docs, "ClusterRole")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule.get("apiGroups", ())
        for r in rule.get("resources", ())
        for v in rule["verbs"]
    }
    assert granted == {  # cni_dra.k8s.api.KubeApi's calls, and the status.devices subresource
        ("", "nodes", "get"),
        *(("resource.k8s.io", "resourceslices", v) for v in ("get", "list", "create", "update", "delete")),
        *(("resource.k8s.io", "resourceclaims", v) for v in ("get", "list", "watch")),
        ("resource.k8s.io", "resourceclaims/status", "patch"),
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"),
    }
    # fractionalCapacityRange auto (the default): the API server's kubernetes_feature_enabled
    # sample, read from /metrics (cni_dra.agent.gate_probe); nothing else outside the API groups
    assert [r for r in role["rules"] if "nonResourceURLs" in r] == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
    ]


def test_a_stated_fractional_gate_leaves_metrics_out_of_the_role(helm, tmp_path):
    """fractionalCapacityRange on or off: the agent asks the API server nothing about it,
    so the role has no /metrics rule."""
    for value in ("on", "off"):
        role = one(render(helm, {"fractionalCapacityRange": value}, tmp=tmp_path), "ClusterRole")
        assert not [r for r in role["rules"] if "nonResourceURLs" in r], value
    (driver_rule,) = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    assert driver_rule["resourceNames"] == ["net.cni-dra.dev"]


# -- an operator's values --------------------------------------------------------------------

OPERATOR = {
    "driver": "nic.example.com",
    "image": {"repository": "registry.example.com/net/cni-dra", "tag": "0.1.1", "pullPolicy": "Never"},
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccount": {"name": "nic-agent"},
    "inventory": {
        "path": "/etc/nics/slice.yaml",
        "defaultBandwidth": "1G",
        "requestPolicy": {"default": "100M"},
        "devices": [
            {
                "ifName": "cdt-nic0",
                "bandwidth": "25G",
                "requestPolicy": {"default": "2G", "validRange": {"min": "500M", "step": "500M"}},
            },
            {"ifName": "cdt-nic1", "name": "slow"},
        ],
    },
    "network": {
        "name": "fast-net",
        "cniVersion": "1.0.0",
        "linkType": "ipvlan",
        "mode": "l2",
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.9.0.0/16"}]],
            "dataDir": "/var/lib/nics/ipam",
        },
        "shaping": False,
        "profiles": {"allowMac": True, "maxMtu": 9000},
        "capabilities": {"bandwidth": True, "mac": True},
        "extraConfig": {"mtu": 9000, "selectionPolicy": "least-allocated"},
    },
    "cni": {
        "binDir": "/home/kubernetes/bin",
        "confDir": "/etc/cni/multus/net.d",
        "conflistName": "20-fast.conflist",
    },
    "stateDir": "/var/lib/nics/state",
    "kubeletDir": "/var/lib/k0s/kubelet",
    "runDir": "/run/nics",
    "fastpath": {"processes": 2, "hostMountNamespace": "/proc/1/ns/mnt"},
    "apiServer": {"host": "10.0.0.10", "port": 6443},
    "fractionalCapacityRange": "off",
    "nicHealth": {"debounce": 2.5, "taintEffect": "NoExecute", "keepMissing": 30, "healthTimeout": 90},
    "metrics": {"port": 19412},
    "logLevel": "debug",
    "resyncInterval": 30,
    "cleanupOnExit": False,
    "admissionPolicy": {"enabled": False},
    "deviceClass": {"name": "fast-nics"},
    "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "net", "effect": "NoSchedule"}],
    "nodeSelector": {"net.example.com/fast": "true"},
    "priorityClassName": "",
}


@pytest.fixture(scope="module")
def operator(helm, tmp_path_factory) -> list[dict[str, Any]]:
    return render(
        helm, OPERATOR, release="nics", namespace="net-system", tmp=tmp_path_factory.mktemp("operator")
    )


def test_operator_values_reach_the_agent(operator):
    pod = pod_of(operator)
    (agent,) = pod["containers"]
    assert agent["image"] == "registry.example.com/net/cni-dra:0.1.1" and agent["imagePullPolicy"] == "Never"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and "priorityClassName" not in pod
    assert (
        pod["nodeSelector"] == {"net.example.com/fast": "true"}
        and pod["tolerations"] == OPERATOR["tolerations"]
    )
    assert agent["resources"] == OPERATOR["resources"] and pod["serviceAccountName"] == "nic-agent"
    assert env_of(agent) == {
        "KUBERNETES_SERVICE_HOST": "10.0.0.10",
        "KUBERNETES_SERVICE_PORT": "6443",
        "CNI_DRA_INVENTORY": "/etc/nics/slice.yaml",
        "CNI_DRA_STATE_DIR": "/var/lib/nics/state",
        "CNI_DRA_CONFLIST": "/config/20-fast.conflist",
        "CNI_DRA_PLUGIN_DIR": "/var/lib/k0s/kubelet/plugins/nic.example.com",
        "CNI_DRA_REGISTRY_DIR": "/var/lib/k0s/kubelet/plugins_registry",
        "CNI_DRA_METRICS_ADDRESS": ":19412",
        "CNI_DRA_RESYNC_INTERVAL": "30",
        "CNI_DRA_CLEANUP": "false",
        "CNI_DRA_AGENT_SOCKET": "/run/nics/agent.sock",
        "CNI_DRA_FASTPATH_PROCESSES": "2",
        "CNI_DRA_FASTPATH_MOUNT_NS": "/proc/1/ns/mnt",
        "CNI_DRA_LOG_LEVEL": "debug",
        "CNI_DRA_FRACTIONAL_CAPACITY_RANGE": "off",
        "CNI_DRA_NIC_DEBOUNCE": "2.5",
        "CNI_DRA_TAINT_EFFECT": "NoExecute",
        "CNI_DRA_KEEP_MISSING": "30",
        "CNI_DRA_HEALTH_TIMEOUT": "90",
    }
    assert agent["ports"] == [{"name": "metrics", "containerPort": 19412}]
    assert agent["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": 19412}
    assert mounts_of(pod, agent) == {
        p: p
        for p in (
            "/var/lib/nics/state",
            "/etc/nics",
            "/run/nics",
            "/var/lib/k0s/kubelet/plugins/nic.example.com",
            "/var/lib/k0s/kubelet/plugins_registry",
        )
    }
    (init,) = pod["initContainers"]
    assert mounts_of(pod, init)["/host/cni/bin"] == "/home/kubernetes/bin"
    assert mounts_of(pod, init)["/host/cni/net.d"] == "/etc/cni/multus/net.d"


def test_nic_health_values_are_the_agents_options(helm, operator, monkeypatch):
    """The chart's nicHealth values reach the agent as its options' env twins, parsed to
    what they say; the defaults are the agent's own."""
    from cni_dra.cli.agent import agent

    def params(env: dict[str, str]) -> dict[str, object]:
        for name in [n for n in os.environ if n.startswith("CNI_DRA_")]:
            monkeypatch.delenv(name)
        for name, value in {**env, "NODE_NAME": "n1"}.items():
            monkeypatch.setenv(name, value)
        ctx = agent.make_context("agent", [])
        return {k: ctx.params[k] for k in ("nic_debounce", "taint_effect", "keep_missing", "health_timeout")}

    (mine,) = pod_of(operator)["containers"]
    assert params(env_of(mine)) == {
        "nic_debounce": 2.5,
        "taint_effect": "NoExecute",
        "keep_missing": 30.0,
        "health_timeout": 90,
    }
    (default,) = pod_of(render(helm))["containers"]
    assert params(env_of(default)) == params({})


def test_an_unknown_taint_effect_fails_the_render(helm, tmp_path):
    (tmp_path / "v.yaml").write_text(yaml.safe_dump({"nicHealth": {"taintEffect": "PreferNoSchedule"}}))
    res = helm("template", "cni-dra", str(CHART), "-f", str(tmp_path / "v.yaml"), check=False)
    assert res.returncode != 0 and "nicHealth.taintEffect must be NoSchedule, NoExecute or None" in res.stderr


def test_operator_values_shape_the_conflist(operator):
    conf = plugin_conf(operator, "20-fast.conflist")
    assert (conf.name, conf.cniVersion, conf.driver, conf.linkType, conf.mode) == (
        "fast-net",
        "1.0.0",
        "nic.example.com",
        "ipvlan",
        "l2",
    )
    assert (conf.stateDir, conf.inventory, conf.mtu) == ("/var/lib/nics/state", "/etc/nics/slice.yaml", 9000)
    from cni_dra.protocol.profile import limits_from_conflist

    conflist = json.loads(one(operator, "ConfigMap")["data"]["20-fast.conflist"])
    entry = conflist["plugins"][0]
    assert entry["shaping"] is False and entry["selectionPolicy"] == "least-allocated"
    assert (
        entry["capabilities"] == {"bandwidth": True, "mac": True}
        and entry["ipam"] == OPERATOR["network"]["ipam"]
    )
    limits = limits_from_conflist(conflist)
    assert limits.allowMac is True and limits.maxMtu == 9000


def test_operator_values_name_the_objects_and_drop_what_is_disabled(operator):
    kinds = sorted(d["kind"] for d in operator)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "DeviceClass",
        "ServiceAccount",
    ]
    assert one(operator, "DaemonSet")["metadata"] == {
        "name": "nics-cni-dra",
        "namespace": "net-system",
        "labels": {
            "app.kubernetes.io/name": "cni-dra",
            "app.kubernetes.io/instance": "nics",
            "app.kubernetes.io/version": "0.1.0",
        },
    }
    assert one(operator, "ClusterRoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": "nic-agent", "namespace": "net-system"}
    ]
    dc = one(operator, "DeviceClass")
    assert dc["metadata"]["name"] == "fast-nics"
    assert dc["spec"]["selectors"][0]["cel"]["expression"] == (
        'device.driver == "nic.example.com" && device.allowMultipleAllocations'
    )


def test_the_devices_the_operator_lists_become_the_nodes_inventory(operator, tmp_path, monkeypatch):
    """The init container's environment and the ConfigMap's devices list, given to
    ``cni-dra inventory discover`` as the init container runs it: the slice has those NICs
    with the bandwidth and requestPolicy the values say (the NICs are absent here, which
    discover keeps: the operator named them)."""
    from click.testing import CliRunner

    from cni_dra.cli import cli
    from cni_dra.dra.inventory import load_inventory

    pod = pod_of(operator)
    (init,) = pod["initContainers"]
    env = env_of(init)
    assert env["INVENTORY_SOURCE"] == "discover" and env["CNI_DRA_DEVICES"] == "/config/devices.yaml"
    assert 'cni-dra inventory discover -o "$CNI_DRA_INVENTORY"' in init["args"][0]
    devices = tmp_path / "devices.yaml"
    devices.write_text(one(operator, "ConfigMap")["data"]["devices.yaml"])
    out = tmp_path / "slice.yaml"
    for key in list(os.environ):
        if key.startswith("CNI_DRA_"):
            monkeypatch.delenv(key)
    for key, value in {**env, "CNI_DRA_DEVICES": str(devices), "NODE_NAME": "node-a"}.items():
        monkeypatch.setenv(key, value)
    res = CliRunner().invoke(cli, ["inventory", "discover", "-o", str(out)])
    assert res.exit_code == 0, res.output
    inv = load_inventory(str(out))
    assert (inv.spec.driver, inv.spec.node_name, inv.spec.pool.name) == (
        "nic.example.com",
        "node-a",
        "node-a",
    )
    got = {
        d.name: yaml.safe_load(json.dumps(d.model_dump(mode="json", by_alias=True, exclude_none=True)))[
            "capacity"
        ]
        for d in inv.spec.devices
    }
    assert got == {
        "cdt-nic0": {
            "bandwidth": {
                "value": "25G",
                "requestPolicy": {"default": "2G", "validRange": {"min": "500M", "step": "500M"}},
            }
        },
        "slow": {"bandwidth": {"value": "1G", "requestPolicy": {"default": "100M"}}},
    }


def test_interfaces_filter_and_node_provided_inventory(helm, tmp_path):
    docs = render(
        helm,
        {"inventory": {"interfaces": ["eth1", "eth2"], "requestPolicy": {"default": "1G"}}},
        tmp=tmp_path,
    )
    env = env_of(pod_of(docs)["initContainers"][0])
    assert env["CNI_DRA_INTERFACES"] == "eth1 eth2" and json.loads(env["CNI_DRA_REQUEST_POLICY"]) == {
        "default": "1G"
    }
    assert "devices.yaml" not in one(docs, "ConfigMap")["data"] and "CNI_DRA_DEVICES" not in env
    docs = render(helm, {"inventory": {"source": "node"}}, tmp=tmp_path)
    assert env_of(pod_of(docs)["initContainers"][0])["INVENTORY_SOURCE"] == "node"


def test_an_unknown_inventory_source_fails_the_render(helm, tmp_path):
    (tmp_path / "v.yaml").write_text(yaml.safe_dump({"inventory": {"source": "guess"}}))
    res = helm("template", "cni-dra", str(CHART), "-f", str(tmp_path / "v.yaml"), check=False)
    assert res.returncode != 0 and "inventory.source must be discover or node" in res.stderr


def test_host_directories_that_coincide_share_one_volume(helm, tmp_path):
    """Mount paths must be unique in a container: an inventory in the state directory and
    the socket directory in it too give one volume mounted once, and its subdirectory."""
    docs = render(
        helm,
        {
            "stateDir": "/var/lib/cni-dra",
            "inventory": {"path": "/var/lib/cni-dra/inventory.yaml"},
            "runDir": "/var/lib/cni-dra/run",
        },
        tmp=tmp_path,
    )
    pod = pod_of(docs)
    (init,) = pod["initContainers"]
    (agent,) = pod["containers"]
    for container in (init, agent):
        paths = [m["mountPath"] for m in container["volumeMounts"]]
        assert len(paths) == len(set(paths)), paths
    assert mounts_of(pod, agent)["/var/lib/cni-dra"] == "/var/lib/cni-dra"
    assert mounts_of(pod, agent)["/var/lib/cni-dra/run"] == "/var/lib/cni-dra/run"
    assert len({v["name"] for v in pod["volumes"]}) == len(pod["volumes"])


def test_the_admission_policy_matches_the_charts_service_account(helm, tmp_path):
    docs = render(
        helm, {"serviceAccount": {"name": "nic-agent"}}, release="nics", namespace="net-system", tmp=tmp_path
    )
    policy = one(docs, "ValidatingAdmissionPolicy")
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == 'request.userInfo.username == "system:serviceaccount:net-system:nic-agent"'
    assert (
        one(docs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"]
        == policy["metadata"]["name"]
        == ("nics-cni-dra-resourceslices")
    )


def test_a_new_conflist_rolls_the_pods(helm, tmp_path):
    def checksum(values: dict[str, Any]) -> str:
        return one(render(helm, values, tmp=tmp_path), "DaemonSet")["spec"]["template"]["metadata"][
            "annotations"
        ]["cni-dra.dev/config-sha256"]

    base = checksum({})
    assert re.fullmatch(r"[0-9a-f]{16}", base)
    assert checksum({"network": {"name": "other"}}) != base
    assert checksum({"inventory": {"defaultBandwidth": "25G"}}) != base
    assert checksum({"logLevel": "debug"}) == base


# -- conf/k8s is the chart --------------------------------------------------------------------


def test_conf_k8s_is_the_chart_rendered_with_its_defaults(helm):
    """conf/k8s/{rbac,admission,daemonset,deviceclass}.yaml are what scripts/render-manifests
    writes from the chart (run `make render-manifests` after changing the chart)."""
    spec = importlib.util.spec_from_file_location(
        "cni_dra_render_manifests",
        ROOT / "scripts" / "render-manifests",
        loader=importlib.machinery.SourceFileLoader(
            "cni_dra_render_manifests", str(ROOT / "scripts" / "render-manifests")
        ),
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rendered = helm("template", mod.RELEASE, str(CHART), "--namespace", mod.NAMESPACE).stdout
    for name, text in mod.manifests(rendered).items():
        assert (ROOT / "conf" / "k8s" / name).read_text() == text, (
            f"conf/k8s/{name} differs: make render-manifests"
        )


# -- per-node IPAM, and the values the e2e bed installs with ---------------------------------

BED_VALUES = ROOT / "scripts" / "e2e" / "helm-values.yaml"


def _install_script(docs: list[dict[str, Any]]) -> str:
    (init,) = pod_of(docs)["initContainers"]
    return init["args"][0]


def test_ipam_by_node_gives_each_named_node_its_own_conflist(helm, tmp_path):
    """network.ipamByNode: one ConfigMap key per named node (<conflistName>.<node>), the same
    conflist with that node's ipam; the init container installs its node's key when there
    is one, the common conflist otherwise; a change of it rolls the pods."""
    ipam = {
        "n1": {"type": "host-local", "ranges": [[{"subnet": "10.1.1.0/24"}]]},
        "n2": {"type": "host-local", "ranges": [[{"subnet": "10.1.2.0/24"}]]},
    }
    docs = render(helm, {"network": {"ipamByNode": ipam}}, tmp=tmp_path)
    data = one(docs, "ConfigMap")["data"]
    assert sorted(data) == ["10-cni-dra.conflist", "10-cni-dra.conflist.n1", "10-cni-dra.conflist.n2"]
    common = json.loads(data["10-cni-dra.conflist"])
    for node, want in ipam.items():
        conf = plugin_conf(docs, f"10-cni-dra.conflist.{node}")
        assert conf.ipam is not None and conf.ipam.model_dump(exclude_none=True)["ranges"] == want["ranges"]
        per_node = json.loads(data[f"10-cni-dra.conflist.{node}"])
        per_node["plugins"][0]["ipam"] = common["plugins"][0]["ipam"]
        assert per_node == common  # only the ipam differs
    script = _install_script(docs)
    assert 'if [ -f "$src.$NODE_NAME" ]; then src="$src.$NODE_NAME"; fi' in script
    assert 'cp "$src" "/host/cni/net.d/.$CONFLIST.tmp"' in script
    base = one(render(helm, {}, tmp=tmp_path), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    rolled = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert base["cni-dra.dev/config-sha256"] != rolled["cni-dra.dev/config-sha256"]


def test_the_e2e_beds_values_keep_the_charts_rbac_and_give_each_node_its_subnet(helm):
    """scripts/e2e/helm-values.yaml (what cluster.py installs with): the RBAC, admission
    policy and DeviceClass are the default rendering's, unchanged; each of the bed's nodes
    gets a conflist on its own pod subnet (the subnets cluster.py's NODES name), the image
    is never pulled, the agent talks to the API server itself, discovery takes the two NICs."""
    default = {(d["kind"], d["metadata"]["name"]): d for d in render(helm)}
    bed = [
        d
        for d in yaml.safe_load_all(
            helm(
                "template", "cni-dra", str(CHART), "--namespace", "kube-system", "-f", str(BED_VALUES)
            ).stdout
        )
        if d
    ]
    for d in bed:
        if d["kind"] not in ("ConfigMap", "DaemonSet"):
            assert d == default[(d["kind"], d["metadata"]["name"])], d["kind"]
    cluster_src = (ROOT / "scripts/e2e/cluster.py").read_text()
    subnets = dict(re.findall(r'Node\("([\w-]+)", \d+, "([\d./]+)"\)', cluster_src))
    assert len(subnets) == 2
    for node, subnet in subnets.items():
        conf = plugin_conf(bed, f"10-cni-dra-e2e.conflist.{node}")
        assert conf.name == "cni-dra-e2e"
        assert conf.ipam is not None and conf.ipam.model_dump(exclude_none=True)["ranges"] == [
            [{"subnet": subnet}]
        ]
        # the runtime passes the pods' bandwidth annotations only to a plugin that declares it
        raw = json.loads(one(bed, "ConfigMap")["data"][f"10-cni-dra-e2e.conflist.{node}"])
        assert raw["plugins"][0]["capabilities"] == {"bandwidth": True}
    pod = pod_of(bed)
    (init,) = pod["initContainers"]
    (agent,) = pod["containers"]
    assert init["imagePullPolicy"] == agent["imagePullPolicy"] == "Never"
    env = env_of(agent)
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.250.0.1", "16443")
    assert env_of(init)["CNI_DRA_INTERFACES"] == "cde2e-nic0 cde2e-nic1"
