"""conf/k8s/profiles: the device-profile examples load through the official client's models
unchanged, their config is what cni-dra's prepare accepts and gives the profile they say,
their selectors pick the NICs they mean; and the DaemonSet's agent reads the limits from the
conflist the plugin gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cni_dra.protocol.profile import InterfaceProfile, ProfileLimits, claim_profiles, limits_from_conflist
from tests.builders import DRIVER, allocation_result, device, resource_slice

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "conf" / "k8s" / "profiles"
MODELS = {
    "DeviceClass": "V1DeviceClass",
    "ResourceClaimTemplate": "V1ResourceClaimTemplate",
    "ResourceClaim": "ResourceV1ResourceClaim",
}


def docs() -> list[tuple[str, dict]]:
    return [
        (path.name, doc)
        for path in sorted(PROFILES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def one(kind: str, name: str) -> dict:
    (doc,) = [d for _, d in docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("name,doc", docs(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_example_loads_through_client_models(name, doc):
    from kubernetes import client

    assert doc["apiVersion"] == "resource.k8s.io/v1"
    obj = getattr(client, MODELS[doc["kind"]]).model_validate(doc)
    assert client.ApiClient().sanitize_for_serialization(obj) == doc


def allocated(claim_spec: dict, classes: dict[str, dict], *, name: str = "c") -> dict:
    """What the scheduler makes of a claim spec: one result per request and the config of
    each request's class (FromClass) then the claim's own (FromClaim), as the allocator
    copies them into status.allocation.devices.config."""
    results, config = [], []
    for req in claim_spec["devices"]["requests"]:
        results.append(
            allocation_result("eth0", request=req["name"], share_id="3b9f0c1e-7a2d-4c5b-9e8f-1a2b3c4d5e6f")
        )
        cls = classes[req["exactly"]["deviceClassName"]]
        config += [
            {"source": "FromClass", "requests": [req["name"]], **c} for c in cls["spec"].get("config", [])
        ]
    config += [{"source": "FromClaim", **c} for c in claim_spec["devices"].get("config", [])]
    return {
        "metadata": {"name": name, "namespace": "default"},
        "status": {"allocation": {"devices": {"results": results, "config": config}}},
    }


def test_the_ipvlan_l3_class_gives_its_claims_an_ipvlan_l3():
    dc = one("DeviceClass", "cni-dra-ipvlan-l3")
    tpl = one("ResourceClaimTemplate", "nic-share-ipvlan-l3")
    claim = allocated(tpl["spec"]["spec"], {dc["metadata"]["name"]: dc})
    assert claim_profiles(claim, DRIVER, ProfileLimits()) == {
        "net1": InterfaceProfile(linkType="ipvlan", mode="l3")
    }


def test_a_node_that_allows_macvlan_only_refuses_the_ipvlan_class():
    dc = one("DeviceClass", "cni-dra-ipvlan-l3")
    claim = allocated(
        one("ResourceClaimTemplate", "nic-share-ipvlan-l3")["spec"]["spec"], {dc["metadata"]["name"]: dc}
    )
    from cni_dra.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="linkType ipvlan is not allowed on this node"):
        claim_profiles(claim, DRIVER, ProfileLimits(allowedLinkTypes=("macvlan",)))


def test_the_jumbo_claim_asks_mtu_9000_on_a_jumbo_nic():
    shared = yaml.safe_load((ROOT / "conf" / "k8s" / "deviceclass.yaml").read_text())
    claim = one("ResourceClaim", "jumbo-net")
    got = claim_profiles(
        allocated(claim["spec"], {shared["metadata"]["name"]: shared}), DRIVER, ProfileLimits()
    )
    assert got == {"net1": InterfaceProfile(mtu=9000)}

    from cni_dra.allocator.cel import device_matches
    from cni_dra.dra.objects import ResourceSlice

    exprs = [s["cel"]["expression"] for s in shared["spec"]["selectors"]]
    exprs += [s["cel"]["expression"] for s in claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
    nics = []
    for name, mtu in (("eth0", 1500), ("eth1", 9000), ("eth2", 9216)):
        nic = device(name)
        nic["attributes"]["mtu"] = {"int": mtu}
        nics.append(nic)
    inv = ResourceSlice.model_validate(resource_slice(nics))
    assert [d.name for d in inv.spec.devices if device_matches(exprs, d, DRIVER)] == ["eth1", "eth2"]


def test_the_agent_reads_the_limits_from_the_plugins_conflist():
    k8s = ROOT / "conf" / "k8s" / "daemonset.yaml"
    cm, ds = list(yaml.safe_load_all(k8s.read_text()))
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    configmaps = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert configmaps[next(n for n in mounts if n in configmaps)] == cm["metadata"]["name"]
    mount = mounts[next(n for n in mounts if n in configmaps)]
    key = env["CNI_DRA_CONFLIST"].removeprefix(mount + "/")
    # the plugin's conflist, as the init container installs it
    (init,) = pod["initContainers"]
    assert {"name": "CONFLIST", "value": key} in init["env"] and '"/config/$CONFLIST"' in init["args"][0]
    assert limits_from_conflist(json.loads(cm["data"][key])) == ProfileLimits()
