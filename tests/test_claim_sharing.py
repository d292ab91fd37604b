"""A ResourceClaim shared by several pods: the agent follows ``status.reservedFor`` of the
claims prepared on this node (list, then watch, on the local API stand-in) and gives each
pod the prepared copy; the node books hold the claim's one share once however many pods'
interfaces use it."""

from __future__ import annotations

import contextlib
import functools
import time

import pytest

from cni_dra.agent.claimwatch import ClaimWatch, reserved_pods
from cni_dra.k8s.api import KubeApi
from cni_dra.quantity import Quantity
from cni_dra.state import ClaimRef, StateStore
from cni_dra.state.ledger import node_usage
from cni_dra.state.preparing import prepare_claim, share_prepared_claim
from tests import builders
from tests.builders import DRIVER, allocation_result, attachment, resource_claim
from tests.k8s_apiserver import FakeApiServer, allocated_claim

SHARE = "5b1e2c3d-4f5a-4b6c-8d7e-9f0a1b2c3d4e"


wait_for = functools.partial(builders.wait_for, timeout_s=20.0)


def reserved(*uids: str) -> list[dict[str, str]]:
    return [{"resource": "pods", "name": f"p{i}", "uid": u} for i, u in enumerate(uids)]


# -- the state side ---------------------------------------------------------------------------
def test_reserved_pods_takes_core_pods_only():
    claim = {
        "status": {
            "reservedFor": [
                *reserved("a", "b"),
                {"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": "c"},
                {"resource": "jobs", "name": "j", "uid": "d"},
            ]
        }
    }
    assert reserved_pods(claim) == {"a", "b"}
    assert reserved_pods({}) == set()


def test_share_prepared_claim_adds_the_prepared_copy_to_new_pods_only(tmp_path):
    claim = resource_claim(
        allocation_result("nic-a", consumed={"bandwidth": "2G"}, share_id=SHARE),
        uid="u1",
        reserved_for=reserved("pod-a"),
    )
    prepare_claim(str(tmp_path), "pod-a", claim)
    assert share_prepared_claim(str(tmp_path), "u1", {"pod-a", "pod-b"}) == ["pod-b"]
    st = StateStore(tmp_path).read()
    assert st.claims["pod-b"] == [claim] and st.claims["pod-a"] == [claim]
    assert share_prepared_claim(str(tmp_path), "u1", {"pod-a", "pod-b"}) == []  # idempotent


def test_share_prepared_claim_leaves_claims_not_prepared_here_alone(tmp_path):
    store = StateStore(tmp_path)
    assert share_prepared_claim(str(tmp_path), "unknown", {"pod-x"}) == []
    assert not (tmp_path / "state.json").exists()  # nothing written at all
    prepare_claim(str(tmp_path), "pod-a", resource_claim(allocation_result("nic-a"), uid="u1"))
    stamp = store.change_stamp()
    assert share_prepared_claim(str(tmp_path), "u2", {"pod-x"}) == []
    assert store.change_stamp() == stamp and "pod-x" not in store.read().claims


def test_share_prepared_claim_with_nothing_to_do_waits_for_no_state_lock(tmp_path):
    """The claim watch sees every event of every claim of the cluster; during a burst the
    ADDs hold the state's file lock in turn. An event that needs nothing (a claim not
    prepared here, or one every reserved pod holds) does not wait for it."""
    import threading

    from cni_dra.state.lock import file_locked

    claim = resource_claim(allocation_result("nic-a"), uid="u1", reserved_for=reserved("pod-a"))
    prepare_claim(str(tmp_path), "pod-a", claim)
    answers: list[list[str]] = []

    def events() -> None:
        answers.append(share_prepared_claim(str(tmp_path), "not-here", {"pod-x"}))
        answers.append(share_prepared_claim(str(tmp_path), "u1", {"pod-a"}))

    with file_locked(StateStore(tmp_path).lock_path, 5):  # another process's transaction
        t = threading.Thread(target=events, daemon=True)
        t.start()
        t.join(3)
        done = not t.is_alive()
    t.join()
    assert done and answers == [[], []]
    assert share_prepared_claim(str(tmp_path), "u1", {"pod-a", "pod-b"}) == ["pod-b"]


def shared(cid: str, pod: str, share: str = SHARE, uid: str = "u1", **kw):
    return attachment(
        cid,
        "nic-a",
        pool="n",
        podUID=pod,
        shareID=share,
        consumedCapacity={"bandwidth": "2G"},
        claim=ClaimRef(namespace="ns", name="c", uid=uid, request="net"),
        **kw,
    )


def test_one_share_used_by_two_pods_is_charged_once(tmp_path):
    claim = resource_claim(allocation_result("nic-a", consumed={"bandwidth": "2G"}, share_id=SHARE), uid="u1")
    store = StateStore(tmp_path)
    with store.transaction() as txn:
        txn.set_claims("pod-a", [claim])
        txn.set_claims("pod-b", [claim])
        txn.put(shared("c1", "pod-a"))
        txn.put(shared("c2", "pod-b"))
    assert node_usage(store.read(), DRIVER, "n").consumed == {"nic-a": {"bandwidth": Quantity.parse("2G")}}
    # two shares of one claim (two requests on one device) are two charges
    with store.transaction() as txn:
        txn.put(shared("c3", "pod-c", share="6f1e2c3d-4f5a-4b6c-8d7e-9f0a1b2c3d4e"))
        txn.put(attachment("c4", "nic-a", pool="n", podUID="pod-d", consumedCapacity={"bandwidth": "1G"}))
    assert node_usage(store.read(), DRIVER, "n").consumed == {"nic-a": {"bandwidth": Quantity.parse("5G")}}


# -- the watch, against the API stand-in ----------------------------------------------------------
@pytest.fixture
def world(tmp_path):
    with FakeApiServer() as server:
        api = KubeApi.from_config(host=server.url)
        watch = ClaimWatch(api, lambda uid, pods: share_prepared_claim(str(tmp_path), uid, pods))
        yield server, watch, StateStore(tmp_path)
        watch.stop()
        api.close()


def test_pods_reserved_later_get_the_prepared_claim(world):
    server, watch, store = world
    claim = server.add_claim(
        allocated_claim(
            "c1", pool="node-1", device="nic-a", bandwidth="2G", share_id=SHARE, pod_uids=["pod-a"]
        )
    )
    other = server.add_claim(
        allocated_claim(
            "c2", pool="node-9", device="nic-z", bandwidth="1G", share_id=SHARE, pod_uids=["pod-x"]
        )
    )
    prepare_claim(str(store.dir), "pod-a", claim)
    watch.start()
    assert watch.synced.wait(10)
    claim["status"]["reservedFor"] = reserved("pod-a", "pod-b")
    server.add_claim(claim)  # the scheduler reserves it for a second pod
    other["status"]["reservedFor"] = reserved("pod-x", "pod-y")
    server.add_claim(other)  # a claim of another node: not prepared here
    copies = wait_for(lambda: store.read().claims.get("pod-b"))
    assert [c["metadata"]["uid"] for c in copies] == [claim["metadata"]["uid"]]
    assert copies[0]["status"]["allocation"] == claim["status"]["allocation"]
    time.sleep(0.3)
    assert set(store.read().claims) == {"pod-a", "pod-b"}


def test_the_first_list_catches_up_and_an_expired_watch_lists_again(world):
    server, watch, store = world
    claim = server.add_claim(
        allocated_claim(
            "c1", pool="node-1", device="nic-a", bandwidth="2G", share_id=SHARE, pod_uids=["pod-a", "pod-b"]
        )
    )
    prepare_claim(str(store.dir), "pod-a", claim)  # prepared before pod-b was reserved
    server.fail("WATCH", r".*/resourceclaims", 410)
    watch.start()
    wait_for(lambda: "pod-b" in store.read().claims)
    wait_for(lambda: len(server.requests_for("GET", r".*/v1/resourceclaims")) >= 2)  # 410: a fresh list
    claim["status"]["reservedFor"] = reserved("pod-a", "pod-b", "pod-c")
    server.add_claim(claim)
    wait_for(lambda: "pod-c" in store.read().claims)
    assert server.invalid == []


# -- an event handled while the claim's prepare is under way -------------------------------------
@contextlib.contextmanager
def _prepare_after_a_second_reservation(tmp_path, share=None):
    """A claim allocated and reserved for pod-a, whose watch event reserving it for pod-b too
    was handled before any prepare (so the watch found it prepared nowhere): yields the
    prepare of that claim (as the kubelet calls it, reading pod-a's reservation), the API
    stand-in, the event's claim and the state directory."""
    import copy

    import yaml

    from cni_dra.agent.driver import ClaimDriver
    from cni_dra.dra.inventory import load_inventory
    from tests.k8s_apiserver import inventory_doc

    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(inventory_doc("node-1", {"nic-a": "ens1"})))
    state = str(tmp_path / "state")
    with FakeApiServer() as server:
        api = KubeApi.from_config(host=server.url)
        try:
            watch = ClaimWatch(api, share or (lambda uid, pods: share_prepared_claim(state, uid, pods)))
            driver = ClaimDriver(
                api,
                state_dir=state,
                driver_name=DRIVER,
                inventory=lambda: load_inventory(str(inv)),
                stored=watch.catch_up,
            )
            claim = server.add_claim(
                allocated_claim(
                    "c1", pool="node-1", device="nic-a", bandwidth="2G", share_id=SHARE, pod_uids=["pod-a"]
                )
            )
            later = copy.deepcopy(claim)  # the event of the second reservation, handled first
            later["status"]["reservedFor"] = reserved("pod-a", "pod-b")
            assert watch.reconcile(later) == []  # not prepared here yet
            meta = claim["metadata"]

            def prepare():
                (out,) = driver.prepare_claims([(meta["namespace"], meta["uid"], meta["name"])])
                return out

            yield prepare, server, later, state
        finally:
            api.close()


def test_a_pod_reserved_while_the_prepare_runs_gets_the_claim_when_it_is_stored(tmp_path):
    """The prepare read the claim reserved for pod-a; the scheduler then reserved it for
    pod-b too, and the watch saw that before the prepare stored the claim (so it found the
    claim prepared nowhere and shared it with no one). Once stored, pod-b holds it too."""
    with _prepare_after_a_second_reservation(tmp_path) as (prepare, _, _, state):
        assert not isinstance(prepare(), Exception)
        held = StateStore(state).read().claims
        assert set(held) == {"pod-a", "pod-b"}
        assert held["pod-b"] == held["pod-a"]


def test_the_watch_forgets_the_pods_of_deleted_and_unlisted_claims(tmp_path):
    """A DELETED event, or a claim gone from a fresh list, leaves nothing to catch up on."""
    shared_with: list[tuple[str, set[str]]] = []

    class Api:
        claims: list[dict] = []

        def list_resource_claims(self):
            return self.claims, "1"

        def watch_resource_claims(self, version, *, timeout_s):
            watch.stop()
            return iter(())

    def claim_of(uid: str, *pods: str) -> dict:
        return {"metadata": {"uid": uid, "name": uid}, "status": {"reservedFor": reserved(*pods)}}

    watch = ClaimWatch(Api(), lambda uid, pods: shared_with.append((uid, pods)) or [])
    watch.reconcile(claim_of("u1", "pod-a"))
    watch.reconcile(claim_of("u2", "pod-b"))
    watch.catch_up("u1")
    assert shared_with[-1] == ("u1", {"pod-a"})
    shared_with.clear()
    watch.forget(claim_of("u1"))
    assert watch.catch_up("u1") == [] and shared_with == []
    watch._list_and_watch()  # a fresh list without u2
    assert watch.catch_up("u2") == [] and shared_with == []


def test_a_failed_catch_up_fails_the_prepare_and_its_retry_gives_the_later_pod_the_claim(tmp_path):
    """The watch saw pod-b reserved before the prepare stored the claim, and will see no
    other event for it; the prepare's sharing with pod-b then fails (the state lock held
    past its timeout). The prepare is refused, so the kubelet calls it again, and that
    call's read of the claim names pod-b: pod-b holds the claim."""
    from cni_dra.errors import TryAgainLaterError

    lock_held = [False]
    state = str(tmp_path / "state")

    def share(uid: str, pods: set[str]) -> list[str]:
        if lock_held[0]:
            raise TryAgainLaterError("failed to lock state: still held by another process after 10s")
        return share_prepared_claim(state, uid, pods)

    with _prepare_after_a_second_reservation(tmp_path, share) as (prepare, server, later, _):
        lock_held[0] = True
        assert isinstance(prepare(), TryAgainLaterError)
        assert set(StateStore(state).read().claims) == {"pod-a"}
        lock_held[0] = False
        server.add_claim(later)  # what the kubelet's retry reads
        assert not isinstance(prepare(), Exception)
        assert set(StateStore(state).read().claims) == {"pod-a", "pod-b"}
