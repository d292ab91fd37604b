"""cni_dra.k8s.api against the local API stand-in (tests/k8s_apiserver.py): paths, verbs,
bodies (decoded by the official client's models) and error translation."""

from __future__ import annotations

import socket

import pytest

from cni_dra.errors import InvalidConfigError, IOFailureError, TryAgainLaterError
from cni_dra.k8s.api import KubeApi
from tests.k8s_apiserver import FakeApiServer, allocated_claim, inventory_doc, write_kubeconfig

SLICE = {**inventory_doc("n1", {"eth-a": "eth-a"}), "metadata": {"name": "n1-net"}}


@pytest.fixture
def server():
    with FakeApiServer() as srv:
        yield srv


@pytest.fixture
def api(server, tmp_path):
    api = KubeApi.from_config(write_kubeconfig(str(tmp_path / "kubeconfig"), server.url))
    yield api
    api.close()


def test_node_get_and_missing(server, api):
    node = server.add_node("n1")
    assert api.get_node("n1")["metadata"]["uid"] == node["metadata"]["uid"]
    assert api.get_node("nope") is None


def test_slice_create_get_list_replace_delete(server, api):
    created = api.create_resource_slice(SLICE)
    assert created["metadata"]["name"] == "n1-net"
    assert server.requests_for("POST", "/apis/resource.k8s.io/v1/resourceslices")[0].body == SLICE
    assert api.get_resource_slice("n1-net")["spec"] == SLICE["spec"]
    assert [
        s["metadata"]["name"] for s in api.list_resource_slices(driver="net.cni-dra.dev", node_name="n1")
    ] == ["n1-net"]
    assert api.list_resource_slices(driver="net.cni-dra.dev", node_name="n2") == []
    assert api.list_resource_slices(driver="other", node_name="n1") == []
    cur = api.get_resource_slice("n1-net")
    cur["spec"]["pool"]["generation"] = 2
    assert api.replace_resource_slice("n1-net", cur)["spec"]["pool"]["generation"] == 2
    with pytest.raises(TryAgainLaterError) as err:  # same resourceVersion again: stale
        api.replace_resource_slice("n1-net", cur)
    assert err.value.code == 11 and "modified" in err.value.details
    assert api.delete_resource_slice("n1-net") is True
    assert api.delete_resource_slice("n1-net") is False
    assert api.get_resource_slice("n1-net") is None
    assert server.invalid == []


def test_create_existing_slice_is_a_conflict(server, api):
    api.create_resource_slice(SLICE)
    with pytest.raises(TryAgainLaterError):
        api.create_resource_slice(SLICE)


def test_claim_get_and_status_apply(server, api):
    claim = server.add_claim(
        allocated_claim(
            "c1",
            pool="n1",
            device="eth-a",
            bandwidth="3G",
            share_id="0b7c5f7e-1a55-4c8e-a0a4-4f8ad9d0e9a1",
            pod_uids=["p1"],
        )
    )
    got = api.get_resource_claim("default", "c1")
    assert got["metadata"]["uid"] == claim["metadata"]["uid"]
    assert got["status"]["allocation"] == claim["status"]["allocation"]
    assert api.get_resource_claim("default", "nope") is None
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "default", "uid": claim["metadata"]["uid"]},
        "status": {
            "devices": [
                {
                    "driver": "net.cni-dra.dev",
                    "pool": "n1",
                    "device": "eth-a",
                    "shareID": "0b7c5f7e-1a55-4c8e-a0a4-4f8ad9d0e9a1",
                    "networkData": {
                        "interfaceName": "net1",
                        "ips": ["192.0.2.10/24"],
                        "hardwareAddress": "02:00:00:00:00:01",
                    },
                }
            ]
        },
    }
    out = api.apply_resource_claim_status("default", "c1", body, field_manager="net.cni-dra.dev")
    assert out["status"]["devices"][0]["networkData"]["ips"] == ["192.0.2.10/24"]
    (req,) = server.requests_for(
        "PATCH", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1/status"
    )
    assert req.content_type == "application/apply-patch+yaml"
    assert req.query == {"fieldManager": ["net.cni-dra.dev"], "force": ["true"]}
    assert req.body == body
    assert server.invalid == []
    # a claim re-created under the same name (other UID) is not written: 409
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(TryAgainLaterError):
        api.apply_resource_claim_status("default", "c1", body, field_manager="net.cni-dra.dev")
    assert api.apply_resource_claim_status("default", "gone", body, field_manager="x") is None


def test_server_error_is_io_failure_with_message(server, api):
    server.fail("GET", r"/apis/resource.k8s.io/v1/resourceslices/.*", 500)
    with pytest.raises(IOFailureError) as err:
        api.get_resource_slice("x")
    assert err.value.code == 5
    assert "HTTP 500" in err.value.msg and err.value.details == "injected failure"


def test_connection_refused_is_io_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    api = KubeApi.from_config(host=f"http://127.0.0.1:{port}")
    with pytest.raises(IOFailureError):
        api.get_node("n1")


def test_bad_kubeconfig_is_invalid_config(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    with pytest.raises(InvalidConfigError) as err:
        KubeApi.from_config(str(path))
    assert err.value.code == 7 and str(path) in err.value.msg


def test_no_kubeconfig_outside_a_cluster_is_invalid_config(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(InvalidConfigError) as err:
        KubeApi.from_config(None)
    assert "in-cluster" in err.value.msg


def test_client_refuses_unknown_fields_before_sending(server, api):
    bad = {**SLICE, "spec": {**SLICE["spec"], "devices": [{**SLICE["spec"]["devices"][0], "bandwith": "1G"}]}}
    with pytest.raises(InvalidConfigError) as err:
        api.create_resource_slice(bad)
    assert "bandwith" in err.value.details
    assert server.requests == []


def test_stand_in_rejects_fields_the_client_models_do_not_know(server):
    """The checker is real: a raw body with an unknown field is refused and recorded."""
    import json
    import urllib.error
    import urllib.request

    bad = {**SLICE, "spec": {**SLICE["spec"], "devices": [{**SLICE["spec"]["devices"][0], "bandwith": "1G"}]}}
    req = urllib.request.Request(
        f"{server.url}/apis/resource.k8s.io/v1/resourceslices",
        method="POST",
        data=json.dumps(bad).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 422
    err.value.close()
    assert len(server.invalid) == 1 and "bandwith" in server.invalid[0][2]
    assert server.slices == {}
