"""Device profiles through the installed ``cni-dra claims prepare``: a claim whose profile is
invalid or forbidden by the node's conflist fails with the message and leaves the node state
as it was; a valid one is prepared. (Applying the profile at ADD is tested where ADD does it.)"""

from __future__ import annotations

import json
import uuid

import pytest

from netns_tests.runner import cni_dra_cli
from tests.builders import allocation_result, profile_config, resource_claim


def _claim(*config, pod_uid: str) -> dict:
    return resource_claim(
        allocation_result("nic-a", request="net1", consumed={"bandwidth": "1G"}, share_id=str(uuid.uuid4())),
        uid=str(uuid.uuid4()), name="jumbo", namespace="prod", config=list(config),
        requests=[{"name": "net1", "exactly": {"deviceClassName": "cni-dra-shared-nic"}}],
        reserved_for=[{"resource": "pods", "name": "p", "uid": pod_uid}])


def _prepare(node, tmp_path, doc, pod_uid, *extra):
    f = tmp_path / f"claim-{uuid.uuid4().hex[:6]}.json"
    f.write_text(json.dumps(doc))
    return cni_dra_cli("claims", "prepare", "--state-dir", str(node.state_dir), "--inventory", str(node.inventory),
                       "--pod-uid", pod_uid, *extra, str(f))


def _state_files(node) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(node.state_dir.iterdir()) if p.name != "state.lock"}


@pytest.fixture
def conflist(tmp_path):
    path = tmp_path / "10-cni-dra.conflist"
    path.write_text(json.dumps({"cniVersion": "1.1.0", "name": "testnet",
                                "plugins": [{"type": "cni-dra", "profiles": {"maxMtu": 1500}}]}))
    return str(path)


@pytest.mark.parametrize(
    ("config", "with_limits", "message"),
    [
        ([profile_config("FromClaim", master="eth9")], False,
         "InvalidConfigError: failed to prepare claim prod/jumbo: config[0] (FromClaim): unknown field 'master' "
         "(the parent NIC is the allocated device: a profile cannot name it)"),
        ([profile_config("FromClaim", requests=["net1"], mtu=9000)], True,
         "InvalidConfigError: failed to prepare claim prod/jumbo request 'net1': mtu 9000 is above this node's "
         "limit (profiles.maxMtu: 1500), asked by config[0] (FromClaim, requests net1)"),
        ([profile_config("FromClass", linkType="macvlan"), profile_config("FromClaim", mac="02:00:00:00:00:01")],
         False,
         "InvalidConfigError: failed to prepare claim prod/jumbo request 'net1': mac 02:00:00:00:00:01 is fixed, "
         "which this node does not allow (profiles.allowMac: false), asked by config[1] (FromClaim)"),
    ],
    ids=["unknown-field", "above-maxMtu", "mac-not-allowed"],
)
def test_prepare_refuses_a_bad_profile_and_leaves_the_state(node, tmp_path, conflist, config, with_limits, message):
    first = str(uuid.uuid4())
    ok = _prepare(node, tmp_path, _claim(profile_config("FromClaim", mtu=1500), pod_uid=first), first,
                  "--conflist", conflist)
    assert ok.returncode == 0, ok.stderr
    before = _state_files(node)
    pod = str(uuid.uuid4())
    r = _prepare(node, tmp_path, _claim(*config, pod_uid=pod), pod, *(("--conflist", conflist) if with_limits else ()))
    assert r.returncode == 1
    assert r.stderr.strip() == message
    assert _state_files(node) == before
    assert [c["podUID"] for c in node.status()["preparedClaims"]] == [first]
