"""The DRA kubelet plugin, called over its unix sockets with stubs generated from the
same .proto files, as the kubelet does: registration GetInfo, NodePrepareResources and
NodeUnprepareResources (v1 and v1beta1), health; claims read from the API stand-in and
written to the node state."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid

import grpc
import pytest
import yaml
from click.testing import CliRunner

from cni_dra.agent.driver import ClaimDriver
from cni_dra.dra.inventory import load_inventory
from cni_dra.k8s.api import KubeApi
from cni_dra.k8s.kubelet_plugin import KubeletPlugin
from cni_dra.k8s.protos import load
from cni_dra.state import StateStore
from tests.k8s_apiserver import DRIVER, FakeApiServer, allocated_claim, inventory_doc

SHARE = "6f1d7a62-3b0e-4b7e-9a51-0c7b3d0e2f11"


@pytest.fixture
def world():
    short = tempfile.mkdtemp(prefix="cdk", dir="/tmp")  # unix socket paths are short (108 bytes)
    inv_path = f"{short}/inventory.yaml"
    with open(inv_path, "w") as fh:
        yaml.safe_dump(inventory_doc("node-1", {"eth-a": "ens1", "eth-b": "ens2"}), fh)
    with FakeApiServer() as server:
        api = KubeApi.from_config(host=server.url)
        calls = []
        driver = ClaimDriver(
            api,
            state_dir=f"{short}/state",
            driver_name=DRIVER,
            inventory=lambda: load_inventory(inv_path),
            observe=lambda *a: calls.append(a),
        )
        plugin = KubeletPlugin(
            DRIVER, driver, plugin_dir=f"{short}/plugins/{DRIVER}", registry_dir=f"{short}/reg"
        )
        plugin.start()
        try:
            yield server, plugin, f"{short}/state", calls
        finally:
            plugin.stop()
            api.close()
            shutil.rmtree(short)


def channel(path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{path}")


def claims_in_state(state_dir) -> dict:
    return StateStore(state_dir).read().claims


def prepare(plugin, version, claims):
    pb2, services = load(version)
    with channel(plugin.dra_socket) as ch:
        stub = services.DRAPluginStub(ch)
        return stub.NodePrepareResources(
            pb2.NodePrepareResourcesRequest(
                claims=[
                    pb2.Claim(
                        namespace=c["metadata"]["namespace"],
                        uid=c["metadata"]["uid"],
                        name=c["metadata"]["name"],
                    )
                    for c in claims
                ]
            ),
            timeout=10,
        )


def unprepare(plugin, version, claims):
    pb2, services = load(version)
    with channel(plugin.dra_socket) as ch:
        return services.DRAPluginStub(ch).NodeUnprepareResources(
            pb2.NodeUnprepareResourcesRequest(
                claims=[
                    pb2.Claim(
                        namespace=c["metadata"]["namespace"],
                        uid=c["metadata"]["uid"],
                        name=c["metadata"]["name"],
                    )
                    for c in claims
                ]
            ),
            timeout=10,
        )


def test_registration_get_info_and_notify(world):
    _, plugin, _, _ = world
    pb2, services = load("pluginregistration_v1")
    with channel(plugin.registration_socket) as ch:
        stub = services.RegistrationStub(ch)
        info = stub.GetInfo(pb2.InfoRequest(), timeout=10)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(plugin.dra_socket)
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        stub.NotifyRegistrationStatus(
            pb2.RegistrationStatus(plugin_registered=False, error="nope"), timeout=10
        )
        assert plugin.registered is False and plugin.registration_error == "nope"
        stub.NotifyRegistrationStatus(pb2.RegistrationStatus(plugin_registered=True), timeout=10)
        assert plugin.registered is True
    assert plugin.registration_socket.name == f"{DRIVER}-reg.sock"


@pytest.mark.parametrize("version", ["dra_v1", "dra_v1beta1"])
def test_prepare_writes_state_for_every_reserved_pod(world, version):
    server, plugin, state_dir, calls = world
    claim = server.add_claim(
        allocated_claim(
            "c1", pool="node-1", device="eth-b", bandwidth="3G", share_id=SHARE, pod_uids=["pod-a", "pod-b"]
        )
    )
    resp = prepare(plugin, version, [claim])
    out = resp.claims[claim["metadata"]["uid"]]
    assert out.error == ""
    assert [
        (list(d.request_names), d.pool_name, d.device_name, d.share_id, list(d.cdi_device_ids))
        for d in out.devices
    ] == [(["net1"], "node-1", "eth-b", SHARE, [])]
    state = claims_in_state(state_dir)
    assert sorted(state) == ["pod-a", "pod-b"]
    for pod in ("pod-a", "pod-b"):
        (stored,) = state[pod]
        assert stored["metadata"]["uid"] == claim["metadata"]["uid"]
        assert stored["status"]["allocation"] == claim["status"]["allocation"]
    # kubelet retry / agent restart: the same answer, the state unchanged
    before = StateStore(state_dir).path.read_bytes()
    again = prepare(plugin, version, [claim])
    assert again.claims[claim["metadata"]["uid"]] == out
    assert StateStore(state_dir).path.read_bytes() == before
    assert [c[:2] for c in calls] == [("prepare", True), ("prepare", True)]


def test_prepare_same_state_as_the_cli(world, tmp_path):
    """gRPC prepare and `cni-dra claims prepare` store the same document."""
    from cni_dra.cli import cli

    server, plugin, state_dir, _ = world
    claim = server.add_claim(
        allocated_claim(
            "c1", pool="node-1", device="eth-a", bandwidth="2G", share_id=SHARE, pod_uids=["pod-a"]
        )
    )
    prepare(plugin, "dra_v1", [claim])
    res = CliRunner().invoke(
        cli,
        ["claims", "prepare", "--state-dir", str(tmp_path / "cli"), "--pod-uid", "pod-a", "-"],
        input=json.dumps(server.claims[("default", "c1")]),
    )
    assert res.exit_code == 0, res.output
    assert claims_in_state(tmp_path / "cli") == claims_in_state(state_dir)


def _err(server, plugin, state_dir, claim_obj):
    resp = prepare(plugin, "dra_v1", [claim_obj])
    out = resp.claims[claim_obj["metadata"]["uid"]]
    assert list(out.devices) == []
    assert claims_in_state(state_dir) == {}
    return out.error


def test_prepare_refuses_claims_not_for_this_node(world):
    server, plugin, state_dir, _ = world
    other = server.add_claim(
        allocated_claim("c1", pool="node-2", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["p"])
    )
    assert "ClaimError (CNI code 101)" in _err(server, plugin, state_dir, other)
    assert "node-2/eth-a" in _err(server, plugin, state_dir, other)
    nodev = server.add_claim(
        allocated_claim("c2", pool="node-1", device="eth-z", bandwidth="1G", share_id=SHARE, pod_uids=["p"])
    )
    assert "node-1/eth-z, not on this node" in _err(server, plugin, state_dir, nodev)


def test_prepare_refuses_missing_replaced_unallocated_unreserved(world):
    server, plugin, state_dir, _ = world
    ghost = {"metadata": {"namespace": "default", "name": "ghost", "uid": str(uuid.uuid4())}}
    assert "does not exist" in _err(server, plugin, state_dir, ghost)
    claim = server.add_claim(
        allocated_claim("c1", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["p"])
    )
    replaced = {"metadata": {**claim["metadata"], "uid": str(uuid.uuid4())}}
    assert "has UID" in _err(server, plugin, state_dir, replaced)
    unalloc = allocated_claim(
        "c2", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["p"]
    )
    del unalloc["status"]
    unalloc = server.add_claim(unalloc)
    assert "not allocated" in _err(server, plugin, state_dir, unalloc)
    unres = server.add_claim(
        allocated_claim("c3", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=[])
    )
    assert "names no pod" in _err(server, plugin, state_dir, unres)


def test_one_bad_claim_does_not_fail_the_others(world):
    server, plugin, state_dir, _ = world
    good = server.add_claim(
        allocated_claim("good", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["p"])
    )
    bad = {"metadata": {"namespace": "default", "name": "ghost", "uid": "u-ghost"}}
    resp = prepare(plugin, "dra_v1", [good, bad])
    assert resp.claims[good["metadata"]["uid"]].error == ""
    assert resp.claims["u-ghost"].error
    assert list(claims_in_state(state_dir)) == ["p"]


def test_a_pods_claims_giving_one_interface_two_results_are_refused_together(world):
    """The kubelet sends a pod's claims together; two whose requests are both named net1
    would leave ADD two results for interface net1 (and, under containerd, two results and
    none named eth0): both are refused at prepare, with one message, and nothing is stored
    for any pod, not even for another pod that shares one of them."""
    server, plugin, state_dir, calls = world
    a = server.add_claim(
        allocated_claim(
            "pod-x-nic-a",
            pool="node-1",
            device="eth-a",
            bandwidth="1G",
            share_id=SHARE,
            pod_uids=["px", "py"],
        )
    )
    b = server.add_claim(
        allocated_claim(
            "pod-x-nic-b",
            pool="node-1",
            device="eth-b",
            bandwidth="2G",
            share_id=str(uuid.uuid4()),
            pod_uids=["px"],
        )
    )
    resp = prepare(plugin, "dra_v1", [a, b])
    errors = [resp.claims[c["metadata"]["uid"]].error for c in (a, b)]
    assert (
        errors[0]
        == errors[1]
        == (
            "ClaimError (CNI code 101): failed to prepare claims default/pod-x-nic-a, default/pod-x-nic-b for pod "
            "default/pod-0: interface 'net1' would have 2 allocation results of net.cni-dra.dev to choose from "
            "(claim default/pod-x-nic-a request 'net1', claim default/pod-x-nic-b request 'net1'); an interface takes "
            "the one result whose request is named after it (or the pod's only result): give the requests of a pod's "
            "claims distinct names, one per interface"
        )
    )
    assert [list(resp.claims[c["metadata"]["uid"]].devices) for c in (a, b)] == [[], []]
    assert claims_in_state(state_dir) == {}
    assert [c[:2] for c in calls] == [("prepare", False), ("prepare", False)]


def test_a_claim_that_gives_a_held_interface_a_second_result_is_refused_and_the_held_one_stays(world):
    server, plugin, state_dir, _ = world
    a = server.add_claim(
        allocated_claim(
            "first", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["px"]
        )
    )
    assert prepare(plugin, "dra_v1", [a]).claims[a["metadata"]["uid"]].error == ""
    before = StateStore(state_dir).path.read_bytes()
    b = server.add_claim(
        allocated_claim(
            "second",
            pool="node-1",
            device="eth-b",
            bandwidth="1G",
            share_id=str(uuid.uuid4()),
            pod_uids=["px"],
        )
    )
    err = prepare(plugin, "dra_v1", [b]).claims[b["metadata"]["uid"]].error
    assert (
        "failed to prepare claim default/second for pod default/pod-0: interface 'net1' would have 2 "
        "allocation results of net.cni-dra.dev to choose from (claim default/first request 'net1', "
        "claim default/second request 'net1')"
    ) in err, err
    assert StateStore(state_dir).path.read_bytes() == before
    assert [c["metadata"]["name"] for c in claims_in_state(state_dir)["px"]] == ["first"]
    # the kubelet preparing the held claim again (a restart) is still fine
    assert prepare(plugin, "dra_v1", [a]).claims[a["metadata"]["uid"]].error == ""


def test_one_request_allocated_two_devices_is_refused(world):
    server, plugin, state_dir, _ = world
    claim = allocated_claim(
        "two-of-net1", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["px"]
    )
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    claim["status"]["allocation"]["devices"]["results"].append(
        {**res, "device": "eth-b", "shareID": str(uuid.uuid4())}
    )
    claim = server.add_claim(claim)
    assert "interface 'net1' would have 2 allocation results" in _err(server, plugin, state_dir, claim)


def test_api_server_down_is_a_per_claim_error_and_retry_works(world):
    server, plugin, state_dir, _ = world
    claim = server.add_claim(
        allocated_claim("c1", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["p"])
    )
    server.fail("GET", r".*/resourceclaims/c1", 503)
    assert (
        "IOFailureError (CNI code 5)"
        in prepare(plugin, "dra_v1", [claim]).claims[claim["metadata"]["uid"]].error
    )
    assert prepare(plugin, "dra_v1", [claim]).claims[claim["metadata"]["uid"]].error == ""


def _two_claims(server) -> tuple[dict, dict]:
    """c1 on eth-a reserved for pods pa and pb; c2 on eth-b (request net2) for pa alone."""
    c1 = server.add_claim(
        allocated_claim(
            "c1", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["pa", "pb"]
        )
    )
    c2 = server.add_claim(
        allocated_claim(
            "c2",
            pool="node-1",
            device="eth-b",
            bandwidth="1G",
            share_id=str(uuid.uuid4()),
            pod_uids=["pa"],
            request="net2",
        )
    )
    return c1, c2


def test_unprepare_removes_from_every_pod_and_is_idempotent(world):
    server, plugin, state_dir, calls = world
    c1, c2 = _two_claims(server)
    resp = prepare(plugin, "dra_v1", [c1, c2])
    assert [resp.claims[c["metadata"]["uid"]].error for c in (c1, c2)] == ["", ""]
    resp = unprepare(plugin, "dra_v1beta1", [c1])
    assert resp.claims[c1["metadata"]["uid"]].error == ""
    state = claims_in_state(state_dir)
    assert list(state) == ["pa"] and [c["metadata"]["name"] for c in state["pa"]] == ["c2"]
    with server.lock:  # the claim may be gone from the API server by then: not needed
        server.claims.clear()
    assert unprepare(plugin, "dra_v1", [c1, c2]).claims[c2["metadata"]["uid"]].error == ""
    assert claims_in_state(state_dir) == {}
    assert ("unprepare", True) in [c[:2] for c in calls]


def _count_state_locks(monkeypatch, state_dir) -> list[str]:
    """Every wait for ``state_dir``'s state lock (in-process lock, then the file lock) from now on."""
    from cni_dra.state import lock

    waits: list[str] = []
    held = lock.held

    def counting(lock_path, *args, **kwargs):
        if str(lock_path).startswith(state_dir):
            waits.append(str(lock_path))
        return held(lock_path, *args, **kwargs)

    monkeypatch.setattr(lock, "held", counting)
    return waits


def test_prepare_takes_the_state_lock_once_per_call(world, monkeypatch):
    """A burst's ADDs hold the state lock in turn: a prepare reads, checks and stores its
    claims for every reserved pod in one transaction, not a locked read and then one
    transaction per pod."""
    server, plugin, state_dir, _ = world
    c1, c2 = _two_claims(server)
    waits = _count_state_locks(monkeypatch, state_dir)
    resp = prepare(plugin, "dra_v1", [c1, c2])
    assert [resp.claims[c["metadata"]["uid"]].error for c in (c1, c2)] == ["", ""]
    assert len(waits) == 1
    assert {p: [c["metadata"]["name"] for c in cs] for p, cs in claims_in_state(state_dir).items()} == {
        "pa": ["c1", "c2"],
        "pb": ["c1"],
    }


def test_unprepare_takes_the_state_lock_once_per_claim(world, monkeypatch):
    server, plugin, state_dir, _ = world
    c1 = server.add_claim(
        allocated_claim(
            "c1", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["pa", "pb", "pc"]
        )
    )
    assert prepare(plugin, "dra_v1", [c1]).claims[c1["metadata"]["uid"]].error == ""
    waits = _count_state_locks(monkeypatch, state_dir)
    assert unprepare(plugin, "dra_v1", [c1]).claims[c1["metadata"]["uid"]].error == ""
    assert len(waits) == 1
    assert claims_in_state(state_dir) == {}


def test_a_state_that_cannot_be_written_fails_every_claim_of_the_call(world):
    server, plugin, state_dir, calls = world
    a = server.add_claim(
        allocated_claim("ca", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["pa"])
    )
    b = server.add_claim(
        allocated_claim(
            "cb", pool="node-1", device="eth-b", bandwidth="1G", share_id=str(uuid.uuid4()), pod_uids=["pb"]
        )
    )
    missing = {"metadata": {"namespace": "default", "name": "gone", "uid": str(uuid.uuid4())}}
    with open(state_dir, "w"):  # a regular file where the state directory belongs
        pass
    resp = prepare(plugin, "dra_v1", [a, b, missing])
    errors = [resp.claims[c["metadata"]["uid"]].error for c in (a, b, missing)]
    assert errors[0] == errors[1] and errors[0].startswith("StateError (CNI code 5)"), errors
    assert "it does not exist" in errors[2]
    assert [c[:2] for c in calls] == [("prepare", False)] * 3


def test_health_service(world):
    _, plugin, _, _ = world
    pb2, services = load("health_v1")
    with channel(plugin.dra_socket) as ch:
        stub = services.HealthStub(ch)
        assert stub.Check(pb2.HealthCheckRequest(), timeout=10).status == pb2.HealthCheckResponse.SERVING
        assert (
            stub.Check(
                pb2.HealthCheckRequest(service="k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"), timeout=10
            ).status
            == pb2.HealthCheckResponse.SERVING
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(pb2.HealthCheckRequest(), timeout=10)
        assert next(watch).status == pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_stop_removes_sockets_and_restart_binds_again(world):
    server, plugin, _, _ = world
    plugin.stop()
    assert not plugin.dra_socket.exists() and not plugin.registration_socket.exists()
    plugin.start()  # stale files from a crash are replaced too
    assert plugin.dra_socket.is_socket() and plugin.registration_socket.is_socket()
