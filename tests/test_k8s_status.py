"""Claim status: the records ADD leaves in the state and the writer that applies them to
the ResourceClaim's status.devices[] on the local API stand-in."""

from __future__ import annotations

import copy

import pytest

from cni_dra.agent.nichealth import NicStatus
from cni_dra.agent.status_writer import StatusWriter, claim_status_body
from cni_dra.errors import NetlinkError
from cni_dra.k8s.api import KubeApi
from cni_dra.state import Attachment, ClaimRef, StateStore
from cni_dra.state.claim_status import claim_status_record, network_data, record_add_failure
from tests.k8s_apiserver import DRIVER, FakeApiServer, allocated_claim

SHARE = "1d0a8f7c-9e4b-4a43-8f5e-7d2c6b1a0e99"
RESULT = {
    "cniVersion": "1.1.0",
    "interfaces": [{"name": "net1", "mac": "02:11:22:33:44:55", "sandbox": "/var/run/netns/p"}],
    "ips": [
        {"address": "192.0.2.7/24", "gateway": "192.0.2.1", "interface": 0},
        {"address": "2001:db8::7/64", "interface": 0},
    ],
}


def attachment(claim_uid: str, **kw) -> Attachment:
    base = dict(
        network="net",
        containerID="c1",
        ifname="net1",
        netns="/var/run/netns/p",
        podUID="pod-a",
        driver=DRIVER,
        pool="node-1",
        device="eth-b",
        parent="ens2",
        consumedCapacity={"bandwidth": "3G"},
        shareID=SHARE,
        claim=ClaimRef(namespace="default", name="c1", uid=claim_uid, request="net1"),
        phase="ready",
        result=RESULT,
    )
    base.update(kw)
    return Attachment(**base)


def test_network_data_from_a_cni_result():
    assert network_data(RESULT, "net1") == {
        "interfaceName": "net1",
        "ips": ["192.0.2.7/24", "2001:db8::7/64"],
        "hardwareAddress": "02:11:22:33:44:55",
    }
    chained = {
        "interfaces": [
            {"name": "eth0", "mac": "02:00:00:00:00:01"},
            {"name": "net1", "mac": "02:00:00:00:00:02", "sandbox": "/x"},
        ],
        "ips": [{"address": "10.0.0.1/8", "interface": 0}, {"address": "192.0.2.9/24", "interface": 1}],
    }
    assert network_data(chained, "net1") == {
        "interfaceName": "net1",
        "ips": ["192.0.2.9/24"],
        "hardwareAddress": "02:00:00:00:00:02",
    }
    assert network_data({}, "net1") == {"interfaceName": "net1"}  # L2 only, nothing known


def test_record_shapes(tmp_path):
    att = attachment("u1")
    rec = claim_status_record(att)
    assert rec["ready"] is True and rec["networkData"]["ips"] == ["192.0.2.7/24", "2001:db8::7/64"]
    assert rec["claim"] == {"namespace": "default", "name": "c1", "uid": "u1"}
    assert (rec["driver"], rec["pool"], rec["device"], rec["shareID"]) == (DRIVER, "node-1", "eth-b", SHARE)
    store = StateStore(tmp_path)
    record_add_failure(store, att, NetlinkError("failed to create macvlan net1: boom"))
    (fail,) = store.read().statusUpdates
    assert fail["ready"] is False and fail["reason"] == "NetlinkError"
    assert fail["message"] == "CNI ADD failed with code 102: failed to create macvlan net1: boom"
    assert fail["id"] != rec["id"]


def test_record_add_failure_never_raises(tmp_path):
    (tmp_path / "state.json").write_text("{not json")  # a corrupt state: the report is lost, no raise
    record_add_failure(StateStore(tmp_path), attachment("u1"), NetlinkError("x"))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def world(tmp_path):
    with FakeApiServer() as server:
        api = KubeApi.from_config(host=server.url)
        claim = server.add_claim(
            allocated_claim(
                "c1", pool="node-1", device="eth-b", bandwidth="3G", share_id=SHARE, pod_uids=["pod-a"]
            )
        )
        store = StateStore(tmp_path)
        clock = Clock()
        outcomes: list[str] = []
        writer = StatusWriter(api, store, field_manager=DRIVER, count=outcomes.append, clock=clock)
        yield server, claim, store, writer, clock, outcomes
        api.close()


def add_ready(store, uid, **kw):
    with store.transaction() as txn:
        att = attachment(uid, **kw)
        txn.put(att)
        txn.add_status_update(claim_status_record(att))


def test_writer_applies_network_data_and_ready(world):
    server, claim, store, writer, _, outcomes = world
    add_ready(store, claim["metadata"]["uid"])
    assert writer.sync() is None
    (entry,) = server.claims[("default", "c1")]["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"], entry["shareID"]) == (
        DRIVER,
        "node-1",
        "eth-b",
        SHARE,
    )
    assert entry["networkData"] == {
        "interfaceName": "net1",
        "ips": ["192.0.2.7/24", "2001:db8::7/64"],
        "hardwareAddress": "02:11:22:33:44:55",
    }
    (cond,) = entry["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "True", "InterfaceReady")
    (req,) = server.requests_for("PATCH", r".*/resourceclaims/c1/status")
    assert req.query["fieldManager"] == [DRIVER]
    assert req.body["metadata"]["uid"] == claim["metadata"]["uid"]
    assert store.read().statusUpdates == []
    assert outcomes == ["applied"]
    assert server.invalid == []


def test_writer_retries_with_backoff(world):
    server, claim, store, writer, clock, outcomes = world
    add_ready(store, claim["metadata"]["uid"])
    server.fail("PATCH", r".*/status", 500, count=3)
    waits = []
    for _ in range(3):
        waits.append(writer.sync())
        assert writer.sync() == pytest.approx(waits[-1])  # not due yet: no request
        clock.t += waits[-1]
    assert waits == [0.5, 1.0, 2.0]
    assert len(server.requests_for("PATCH", r".*/status")) == 3
    assert len(store.read().statusUpdates) == 1  # kept until written
    assert writer.sync() is None
    assert server.claims[("default", "c1")]["status"]["devices"][0]["networkData"]["interfaceName"] == "net1"
    assert outcomes == ["error", "error", "error", "applied"]


def test_failure_record_becomes_ready_false(world):
    server, claim, store, writer, _, _ = world
    record_add_failure(
        store, attachment(claim["metadata"]["uid"]), NetlinkError("failed to create macvlan: EBUSY")
    )
    writer.sync()
    (entry,) = server.claims[("default", "c1")]["status"]["devices"]
    assert "networkData" not in entry
    (cond,) = entry["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "NetlinkError")
    assert "code 102" in cond["message"] and "EBUSY" in cond["message"]


def test_gone_or_replaced_claims_drop_their_records(world):
    server, claim, store, writer, _, outcomes = world
    add_ready(store, "not-the-uid", containerID="c0")  # claim re-created under the same name
    add_ready(store, claim["metadata"]["uid"])
    with server.lock:
        del server.claims[("default", "c1")]  # ... and now deleted
    writer.sync()
    assert store.read().statusUpdates == []
    assert outcomes == ["gone", "gone"]


def test_body_lists_every_ready_share_of_the_claim(world):
    """Server-side apply owns the whole list: a second share's record must not drop the first."""
    _, claim, store, _, _, _ = world
    uid = claim["metadata"]["uid"]
    other = "5e3d1b0a-2f4c-4a6e-9b8d-7c6a5e4d3c2b"
    with store.transaction() as txn:
        txn.put(attachment(uid))
        txn.put(attachment(uid, containerID="c2", shareID=other, device="eth-a"))
        txn.put(attachment("another-claim", containerID="c3"))
    rec = claim_status_record(attachment(uid, containerID="c2", shareID=other, device="eth-a"))
    body = claim_status_body({"namespace": "default", "name": "c1", "uid": uid}, store.read(), [rec])
    assert [(e["device"], e["shareID"]) for e in body["status"]["devices"]] == [
        ("eth-a", other),
        ("eth-b", SHARE),
    ]


def test_second_share_keeps_the_first_and_a_deleted_share_goes(world):
    """Server-side apply with one field manager: each apply states the whole set of this
    node's shares of the claim, so a new share keeps the others and a DEL'd one is removed."""
    server, claim, store, writer, _, _ = world
    uid = claim["metadata"]["uid"]
    other = "5e3d1b0a-2f4c-4a6e-9b8d-7c6a5e4d3c2b"
    add_ready(store, uid)
    writer.sync()
    with store.transaction() as txn:
        att = attachment(uid, containerID="c2", shareID=other, device="eth-a")
        txn.put(att)
        txn.add_status_update(claim_status_record(att))
    writer.sync()
    devs = server.claims[("default", "c1")]["status"]["devices"]
    assert sorted((d["device"], d["shareID"]) for d in devs) == [("eth-a", other), ("eth-b", SHARE)]
    with store.transaction() as txn:  # DEL of the first share: no record, the writer notices
        txn.remove("net", "c1", "net1")
    writer.sync()
    devs = server.claims[("default", "c1")]["status"]["devices"]
    assert [(d["device"], d["shareID"]) for d in devs] == [("eth-a", other)]
    with store.transaction() as txn:  # DEL of the last share
        for _a in list(txn.attachments):
            txn.remove(*_a.key)
    writer.sync()
    assert server.claims[("default", "c1")]["status"]["devices"] == []
    n = len(server.requests_for("PATCH", r".*/status"))
    assert writer.sync() is None  # nothing more to say
    assert len(server.requests_for("PATCH", r".*/status")) == n


def test_share_deleted_across_an_agent_restart_leaves_the_claim(world):
    """A restarted agent does not know what it applied before: it applies each claim the
    node holds once, so a share DEL'd after (or while) it was down leaves the claim status."""
    server, claim, store, writer, clock, _ = world
    uid = claim["metadata"]["uid"]
    with store.transaction() as txn:
        txn.set_claims("pod-a", [copy.deepcopy(claim)])  # the state's own copy, as a decoded request is
    add_ready(store, uid)
    writer.sync()
    assert len(server.claims[("default", "c1")]["status"]["devices"]) == 1
    # the agent restarts; the pod is deleted while it is down
    with store.transaction() as txn:
        txn.remove("net", "c1", "net1")
    restarted = StatusWriter(writer.api, store, field_manager=DRIVER, clock=clock)
    restarted.sync()
    assert server.claims[("default", "c1")]["status"]["devices"] == []


def test_restarted_agent_notices_a_later_del(world):
    server, claim, store, writer, clock, _ = world
    uid = claim["metadata"]["uid"]
    add_ready(store, uid)
    writer.sync()
    restarted = StatusWriter(writer.api, store, field_manager=DRIVER, clock=clock)
    restarted.sync()  # converges: the share is still there
    assert len(server.claims[("default", "c1")]["status"]["devices"]) == 1
    with store.transaction() as txn:  # DEL after the restart
        txn.remove("net", "c1", "net1")
    restarted.sync()
    assert server.claims[("default", "c1")]["status"]["devices"] == []


def test_claim_shared_by_two_pods_reports_one_entry_that_follows_the_live_interface(world):
    """Two pods' interfaces use the one share of a shared claim: one status.devices entry,
    the first ready interface's networkData; when that pod's DEL removes its attachment,
    the entry is applied again with the other pod's interface, not left stale."""
    server, claim, store, writer, _, _ = world
    uid = claim["metadata"]["uid"]
    add_ready(store, uid)
    other = dict(
        RESULT,
        interfaces=[{"name": "net1", "mac": "02:11:22:33:44:66", "sandbox": "/var/run/netns/q"}],
        ips=[{"address": "192.0.2.8/24", "interface": 0}],
    )
    add_ready(store, uid, containerID="c2", podUID="pod-b", result=other)
    writer.sync()
    (entry,) = server.claims[("default", "c1")]["status"]["devices"]
    assert entry["networkData"]["ips"] == ["192.0.2.7/24", "2001:db8::7/64"]
    with store.transaction() as txn:
        txn.remove("net", "c1", "net1")
    writer.sync()
    (entry,) = server.claims[("default", "c1")]["status"]["devices"]
    assert entry["networkData"] == {
        "interfaceName": "net1",
        "ips": ["192.0.2.8/24"],
        "hardwareAddress": "02:11:22:33:44:66",
    }
    assert "pod-b" in entry["conditions"][0]["message"]


def test_ready_is_dated_when_its_interface_became_ready_not_when_the_claim_is_applied(world):
    """``lastTransitionTime`` of Ready=True is when the entry's interface became ready
    (its ``readyAt``): a restarted agent applying the claim again, or a second pod of a
    shared claim becoming ready on the same share, leaves it as it was; it moves when the
    entry follows another pod's interface."""
    server, claim, store, writer, clock, _ = world
    uid = claim["metadata"]["uid"]
    add_ready(store, uid, readyAt="2027-01-15T07:59:00.250Z")

    def ready_since() -> str:
        (entry,) = server.claims[("default", "c1")]["status"]["devices"]
        (cond,) = entry["conditions"]
        assert cond["status"] == "True"
        return cond["lastTransitionTime"]

    writer.sync()
    assert ready_since() == "2027-01-15T07:59:00Z"
    restarted = StatusWriter(writer.api, store, field_manager=DRIVER, clock=clock)
    restarted.sync()  # applies the claim again to converge: nothing changed
    assert ready_since() == "2027-01-15T07:59:00Z"
    add_ready(store, uid, containerID="c2", podUID="pod-b", readyAt="2027-01-15T08:03:00.000Z")
    restarted.sync()  # the second pod's record: the entry still reports pod-a's interface
    assert ready_since() == "2027-01-15T07:59:00Z"
    with store.transaction() as txn:
        txn.remove("net", "c1", "net1")
    restarted.sync()  # the entry follows pod-b's interface
    assert ready_since() == "2027-01-15T08:03:00Z"
    assert server.invalid == []


# -- NIC health: Ready conditions follow the host NIC ------------------------------------------

T0_WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z
READY_AT = "2027-01-15T07:59:00.000Z"  # the attachment became ready a minute before T0


def nic(problem, **kw) -> NicStatus:
    return NicStatus(device="eth-b", ifname="ens2", problem=problem, since_s=0.0, since_wall_s=T0_WALL, **kw)


def ready_condition(server) -> dict:
    (entry,) = server.claims[("default", "c1")]["status"]["devices"]
    assert entry["networkData"]["interfaceName"] == "net1"  # networkData stays whatever the NIC does
    (cond,) = entry["conditions"]
    return cond


def test_ready_false_while_the_nic_is_down_or_missing_and_true_again_when_back(world):
    server, claim, store, _, clock, _ = world
    health = {}
    writer = StatusWriter(
        world[3].api,
        store,
        field_manager=DRIVER,
        clock=clock,
        health=lambda: {(DRIVER, "node-1", d): st for d, st in health.items()},
    )
    add_ready(store, claim["metadata"]["uid"], readyAt=READY_AT)
    writer.sync()
    assert ready_condition(server)["status"] == "True"
    n = len(server.requests_for("PATCH", r".*/status"))
    # the NIC loses carrier: the claim is applied again without a new record
    health["eth-b"] = nic("carrier-lost", unhealthy_since_wall_s=T0_WALL)
    writer.sync()
    cond = ready_condition(server)
    assert {k: cond[k] for k in ("type", "status", "reason", "message")} == {
        "type": "Ready",
        "status": "False",
        "reason": "LinkDown",
        "message": "interface net1 of pod pod-a: host NIC ens2 has no carrier (since 2027-01-15T08:00:00Z)",
    }
    assert cond["lastTransitionTime"].startswith("2027-01-15T08:00:00")
    assert writer.sync() is None and len(server.requests_for("PATCH", r".*/status")) == n + 1  # once
    # set down by an admin while without carrier: still LinkDown, same time
    health["eth-b"] = nic("admin-down", unhealthy_since_wall_s=T0_WALL)
    writer.sync()
    assert ready_condition(server)["reason"] == "LinkDown"
    assert "administratively down" in ready_condition(server)["message"]
    health["eth-b"] = nic("missing", unhealthy_since_wall_s=T0_WALL, missing_since_wall_s=T0_WALL + 30)
    writer.sync()
    assert (ready_condition(server)["status"], ready_condition(server)["reason"]) == ("False", "LinkMissing")
    assert server.invalid == []


def test_back_up_is_ready_again_dated_when_it_recovered(world):
    server, claim, store, _, clock, _ = world
    health = {"eth-b": nic("admin-down", unhealthy_since_wall_s=T0_WALL)}
    writer = StatusWriter(
        world[3].api,
        store,
        field_manager=DRIVER,
        clock=clock,
        health=lambda: {(DRIVER, "node-1", d): st for d, st in health.items()},
    )
    add_ready(store, claim["metadata"]["uid"], readyAt=READY_AT)
    writer.sync()
    assert ready_condition(server)["status"] == "False"
    health["eth-b"] = nic(None, recovered_wall_s=T0_WALL + 120)
    writer.sync()
    cond = ready_condition(server)
    assert (cond["status"], cond["reason"]) == ("True", "InterfaceReady")
    assert cond["lastTransitionTime"].startswith("2027-01-15T08:02:00")


def test_an_interface_made_before_its_nic_vanished_stays_link_missing_after_the_nic_returns(world):
    """A NIC deleted and re-created took the pods' links with it: their entries stay
    LinkMissing; an interface ADDed after the NIC returned is Ready."""
    server, claim, store, _, clock, _ = world
    back = nic(None, missing_since_wall_s=T0_WALL, recovered_wall_s=T0_WALL + 60)
    health = {"eth-b": back}
    body = claim_status_body(
        {"namespace": "default", "name": "c1", "uid": "u"},
        _state_with(store, "u", readyAt=READY_AT),
        [],
        {(DRIVER, "node-1", "eth-b"): back},
    )
    (cond,) = body["status"]["devices"][0]["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "LinkMissing")
    assert cond["message"] == (
        "interface net1 of pod pod-a went with host NIC ens2, which vanished at 2027-01-15T08:00:00Z"
    )
    later = claim_status_body(
        {"namespace": "default", "name": "c1", "uid": "u"},
        _state_with(store, "u", readyAt="2027-01-15T08:05:00.000Z", containerID="c9"),
        [],
        {(DRIVER, "node-1", "eth-b"): back},
    )
    (cond,) = [e for e in later["status"]["devices"]][0]["conditions"]
    assert cond["status"] == "True"
    # through the writer and the API stand-in: the claim is applied with LinkMissing
    writer = StatusWriter(
        world[3].api,
        store,
        field_manager=DRIVER,
        clock=clock,
        health=lambda: {(DRIVER, "node-1", d): st for d, st in health.items()},
    )
    add_ready(store, claim["metadata"]["uid"], readyAt=READY_AT, containerID="c5")
    writer.sync()
    assert ready_condition(server)["reason"] == "LinkMissing"
    assert server.invalid == []


def _state_with(store, uid, **kw):
    with store.transaction() as txn:
        for a in list(txn.attachments):
            txn.remove(*a.key)
        txn.put(attachment(uid, **kw))
    return store.read()


def test_health_of_other_devices_or_drivers_leaves_the_condition_alone(world):
    _, _, store, _, _, _ = world
    down = nic("carrier-lost", unhealthy_since_wall_s=T0_WALL)
    for key in [
        ("other.example.com", "node-1", "eth-b"),
        (DRIVER, "node-2", "eth-b"),
        (DRIVER, "node-1", "eth-a"),
    ]:
        body = claim_status_body(
            {"namespace": "default", "name": "c1", "uid": "u"}, _state_with(store, "u"), [], {key: down}
        )
        assert body["status"]["devices"][0]["conditions"][0]["status"] == "True", key
