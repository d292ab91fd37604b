"""conf/k8s/multus: the manifests ``make e2e`` applies unchanged (netns_tests/e2e/
test_runtimes.py and scripts/e2e/cluster_multus.py) load through the client's models, the
networks are cni-dra configs cni-dra itself accepts, the example pod's interfaces are the
claim's request names, and README shows these very files."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MULTUS = ROOT / "conf" / "k8s" / "multus"


def load(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((MULTUS / name).read_text()) if d]


def test_every_file_is_applied_by_the_e2e():
    cluster_multus = (ROOT / "scripts/e2e/cluster_multus.py").read_text()
    scenarios = (ROOT / "netns_tests/e2e/test_runtimes.py").read_text()
    for path in sorted(MULTUS.glob("*.yaml")):
        assert (
            f'"{path.name}"' in cluster_multus
            or f'"{path.name}"' in scenarios
            or f'/{path.name}"' in scenarios
        ), path.name


def test_manifests_load_through_client_models():
    from kubernetes import client

    models = {
        "CustomResourceDefinition": client.V1CustomResourceDefinition,
        "ServiceAccount": client.V1ServiceAccount,
        "ClusterRole": client.V1ClusterRole,
        "ClusterRoleBinding": client.V1ClusterRoleBinding,
        "ResourceClaimTemplate": client.V1ResourceClaimTemplate,
        "Pod": client.V1Pod,
    }
    for name in ("crd.yaml", "rbac.yaml", "resourceclaimtemplate.yaml", "pod.yaml"):
        for doc in load(name):
            obj = models[doc["kind"]].model_validate(doc)
            assert client.ApiClient().sanitize_for_serialization(obj) == doc, name


def test_networks_are_cni_dra_configs_with_their_own_ranges():
    from cni_dra.protocol.config import load_conf

    subnets = []
    for doc in load("networks.yaml"):
        assert (doc["apiVersion"], doc["kind"]) == ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition")
        raw = doc["spec"]["config"]
        conf = load_conf(raw.encode())
        assert json.loads(raw)["type"] == "cni-dra" and conf.name == doc["metadata"]["name"]
        subnets.append(json.loads(raw)["ipam"]["ranges"][0][0]["subnet"])
    assert len(subnets) == 2 and len(set(subnets)) == 2


def test_the_pods_interfaces_are_the_claims_request_names_and_its_networks_exist():
    (pod,) = load("pod.yaml")
    (template,) = load("resourceclaimtemplate.yaml")
    wanted = json.loads(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"])
    networks = {d["metadata"]["name"] for d in load("networks.yaml")}
    requests = [r["name"] for r in template["spec"]["spec"]["devices"]["requests"]]
    assert [w["interface"] for w in wanted] == requests == ["net1", "net2"]
    assert {w["name"] for w in wanted} == networks
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == template["metadata"]["name"]


def test_multus_may_read_pods_and_networks_and_nothing_of_cni_dras():
    (role,) = [d for d in load("rbac.yaml") if d["kind"] == "ClusterRole"]
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert ("", "pods", "get") in granted and (
        "k8s.cni.cncf.io",
        "network-attachment-definitions",
        "get",
    ) in granted
    assert not [x for x in granted if x[0] == "resource.k8s.io" or x[1] in ("secrets", "nodes", "*")]
    assert not [x for x in granted if x[1] == "pods" and x[2] not in ("get",)]


def test_readme_shows_the_files_the_e2e_applies():
    """docs/real-cluster.md ("Several interfaces per pod (Multus)") shows them as they are."""
    readme = (ROOT / "docs" / "real-cluster.md").read_text()
    for name in ("networks.yaml", "resourceclaimtemplate.yaml", "pod.yaml"):
        assert (MULTUS / name).read_text() in readme, (
            f"docs/real-cluster.md does not show conf/k8s/multus/{name} as it is"
        )
