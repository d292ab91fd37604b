"""Hypothesis invariants of the agent's state handling against the local API stand-in:

* any sequence of NodePrepareResources / NodeUnprepareResources (with kubelet retries)
  leaves exactly the claims prepared and not unprepared since, once per reserved pod;
* whatever the API server answers to status writes (errors, in any order), every ADD
  record ends up written exactly once per successful apply and none is lost or kept.
"""

from __future__ import annotations

import tempfile

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_dra.agent.driver import ClaimDriver
from cni_dra.agent.status_writer import StatusWriter
from cni_dra.dra.inventory import load_inventory
from cni_dra.k8s.api import KubeApi
from cni_dra.state import Attachment, ClaimRef, StateStore
from cni_dra.state.claim_status import claim_status_record
from tests.k8s_apiserver import DRIVER, FakeApiServer, allocated_claim, inventory_doc

CLAIMS = {  # name -> (device, pods)
    "c0": ("eth-a", ["p0"]),
    "c1": ("eth-b", ["p0", "p1"]),
    "c2": ("eth-a", ["p2"]),
}
SHARES = {
    "c0": "00000000-0000-4000-8000-000000000000",
    "c1": "11111111-1111-4111-8111-111111111111",
    "c2": "22222222-2222-4222-8222-222222222222",
}

ops = st.lists(
    st.tuples(st.sampled_from(["prepare", "unprepare"]), st.sampled_from(sorted(CLAIMS))), max_size=12
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_prepare_unprepare_sequences(seq):
    with tempfile.TemporaryDirectory() as tmp, FakeApiServer() as server:
        inv = f"{tmp}/inv.yaml"
        with open(inv, "w") as fh:
            yaml.safe_dump(inventory_doc("node-1", {"eth-a": "ens1", "eth-b": "ens2"}), fh)
        uids = {}
        for name, (device, pods) in CLAIMS.items():
            # one request name per claim: p0 holds c0 and c1, one interface each (two
            # results for one interface would be refused at prepare)
            c = server.add_claim(
                allocated_claim(
                    name,
                    pool="node-1",
                    device=device,
                    bandwidth="1G",
                    share_id=SHARES[name],
                    pod_uids=pods,
                    request=f"net{name[1:]}",
                )
            )
            uids[name] = c["metadata"]["uid"]
        api = KubeApi.from_config(host=server.url)
        driver = ClaimDriver(
            api, state_dir=f"{tmp}/state", driver_name=DRIVER, inventory=lambda: load_inventory(inv)
        )
        prepared: set[str] = set()
        for verb, name in seq:
            getattr(driver, verb)("default", uids[name], name)
            (prepared.add if verb == "prepare" else prepared.discard)(name)
        api.close()
        state = StateStore(f"{tmp}/state").read()
        got = {pod: sorted(c["metadata"]["name"] for c in cs) for pod, cs in state.claims.items()}
        want: dict[str, list[str]] = {}
        for name in sorted(prepared):
            for pod in CLAIMS[name][1]:
                want.setdefault(pod, []).append(name)
        assert got == want


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers=st.lists(st.sampled_from([500, 503, 429]), max_size=8), n_claims=st.integers(1, 3))
def test_status_records_survive_any_failures(answers, n_claims):
    with tempfile.TemporaryDirectory() as tmp, FakeApiServer() as server:
        names = sorted(CLAIMS)[:n_claims]
        store = StateStore(tmp)
        for i, name in enumerate(names):
            device, pods = CLAIMS[name]
            c = server.add_claim(
                allocated_claim(
                    name, pool="node-1", device=device, bandwidth="1G", share_id=SHARES[name], pod_uids=pods
                )
            )
            att = Attachment(
                network="n",
                containerID=f"ctr{i}",
                ifname="net1",
                podUID=pods[0],
                driver=DRIVER,
                pool="node-1",
                device=device,
                parent="ens1",
                shareID=SHARES[name],
                claim=ClaimRef(namespace="default", name=name, uid=c["metadata"]["uid"]),
                phase="ready",
                result={
                    "interfaces": [{"name": "net1", "mac": f"02:00:00:00:00:0{i}", "sandbox": "/x"}],
                    "ips": [{"address": f"192.0.2.{i + 1}/24", "interface": 0}],
                },
            )
            with store.transaction() as txn:
                txn.put(att)
                txn.add_status_update(claim_status_record(att))
        for code in answers:
            server.fail("PATCH", r".*/status", code)
        now = [0.0]
        api = KubeApi.from_config(host=server.url)
        writer = StatusWriter(api, store, field_manager=DRIVER, clock=lambda: now[0])
        for _ in range(100):
            wait = writer.sync()
            if wait is None:
                break
            now[0] += wait
        api.close()
        assert store.read().statusUpdates == []
        for i, name in enumerate(names):
            (entry,) = server.claims[("default", name)]["status"]["devices"]
            assert entry["shareID"] == SHARES[name]
            assert entry["networkData"] == {
                "interfaceName": "net1",
                "ips": [f"192.0.2.{i + 1}/24"],
                "hardwareAddress": f"02:00:00:00:00:0{i}",
            }
        ok = [r for r in server.requests_for("PATCH", r".*/status")]
        assert len(ok) == len(answers) + n_claims  # every failure retried, each claim applied once
        assert server.invalid == []
