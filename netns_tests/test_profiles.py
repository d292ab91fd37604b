"""Device profiles through the installed executable: ``cni-dra claims prepare`` refuses a claim
whose profile is invalid or forbidden by the node's conflist, with the message, leaving the
node state as it was; a valid one is prepared, and the ADD of its pod makes exactly the link
the profile asks (kind, mode, MTU, MAC, name, parent) in the pod netns, which CHECK accepts
and ``cni-dra status`` shows; an ADD whose own conflist forbids the profile fails with
nothing left behind. (The ipvlan profile runs in the user-mode-linux lane, test_ipvlan.py.)"""

from __future__ import annotations

import json
import uuid

import pytest

from cni_dra.netlink.info import host_link, link_in_netns
from netns_tests.runner import cni_dra_cli, k8s_cni_args, run_plugin
from tests.builders import allocation_result, profile_config, resource_claim


def _claim(*config, pod_uid: str, device: str = "nic-a") -> dict:
    return resource_claim(
        allocation_result(device, request="net1", consumed={"bandwidth": "1G"}, share_id=str(uuid.uuid4())),
        uid=str(uuid.uuid4()),
        name="jumbo",
        namespace="prod",
        config=list(config),
        requests=[{"name": "net1", "exactly": {"deviceClassName": "cni-dra-shared-nic"}}],
        reserved_for=[{"resource": "pods", "name": "p", "uid": pod_uid}],
    )


def _prepare(node, tmp_path, doc, pod_uid, *extra):
    f = tmp_path / f"claim-{uuid.uuid4().hex[:6]}.json"
    f.write_text(json.dumps(doc))
    return cni_dra_cli(
        "claims",
        "prepare",
        "--state-dir",
        str(node.state_dir),
        "--inventory",
        str(node.inventory),
        "--pod-uid",
        pod_uid,
        *extra,
        str(f),
    )


def _state_files(node) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(node.state_dir.iterdir()) if p.name != "state.lock"}


@pytest.fixture
def conflist(tmp_path):
    path = tmp_path / "10-cni-dra.conflist"
    path.write_text(
        json.dumps(
            {
                "cniVersion": "1.1.0",
                "name": "testnet",
                "plugins": [{"type": "cni-dra", "profiles": {"maxMtu": 1500}}],
            }
        )
    )
    return str(path)


@pytest.mark.parametrize(
    ("config", "with_limits", "message"),
    [
        (
            [profile_config("FromClaim", master="eth9")],
            False,
            "InvalidConfigError: failed to prepare claim prod/jumbo: config[0] (FromClaim): unknown field 'master' "
            "(the parent NIC is the allocated device: a profile cannot name it)",
        ),
        (
            [profile_config("FromClaim", requests=["net1"], mtu=9000)],
            True,
            "InvalidConfigError: failed to prepare claim prod/jumbo request 'net1': mtu 9000 is above this node's "
            "limit (profiles.maxMtu: 1500), asked by config[0] (FromClaim, requests net1)",
        ),
        (
            [
                profile_config("FromClass", linkType="macvlan"),
                profile_config("FromClaim", mac="02:00:00:00:00:01"),
            ],
            False,
            "InvalidConfigError: failed to prepare claim prod/jumbo request 'net1': mac 02:00:00:00:00:01 is fixed, "
            "which this node does not allow (profiles.allowMac: false), asked by config[1] (FromClaim)",
        ),
    ],
    ids=["unknown-field", "above-maxMtu", "mac-not-allowed"],
)
def test_prepare_refuses_a_bad_profile_and_leaves_the_state(
    node, tmp_path, conflist, config, with_limits, message
):
    first = str(uuid.uuid4())
    ok = _prepare(
        node,
        tmp_path,
        _claim(profile_config("FromClaim", mtu=1500), pod_uid=first),
        first,
        "--conflist",
        conflist,
    )
    assert ok.returncode == 0, ok.stderr
    before = _state_files(node)
    pod = str(uuid.uuid4())
    r = _prepare(
        node, tmp_path, _claim(*config, pod_uid=pod), pod, *(("--conflist", conflist) if with_limits else ())
    )
    assert r.returncode == 1
    assert r.stderr.strip() == message
    assert _state_files(node) == before
    assert [c["podUID"] for c in node.status()["preparedClaims"]] == [first]


def _pod_args(pod_uid: str) -> str:
    return k8s_cni_args(namespace="prod", name="jumbo-pod", uid=pod_uid, infra_container_id="c")


def _open_conflist(tmp_path, **limits) -> str:
    path = tmp_path / "open.conflist"
    path.write_text(
        json.dumps(
            {
                "cniVersion": "1.1.0",
                "name": "testnet",
                "plugins": [
                    {"type": "cni-dra", "profiles": {"allowMac": True, "allowShapingOff": True, **limits}}
                ],
            }
        )
    )
    return str(path)


def test_add_makes_exactly_the_link_the_profile_asks(make_node, make_netns, tmp_path):
    node = make_node(mtu=9000)
    pod = str(uuid.uuid4())
    mac = "02:00:5e:10:00:42"
    doc = _claim(
        profile_config("FromClass", linkType="macvlan", mode="private"),
        profile_config("FromClaim", requests=["net1"], mtu=9000, mac=mac),
        pod_uid=pod,
        device="nic-b",
    )
    r = _prepare(node, tmp_path, doc, pod, "--conflist", _open_conflist(tmp_path))
    assert r.returncode == 0, r.stderr
    ns = make_netns()
    # the node's network says macvlan bridge, default MTU, no MAC: the profile wins field by field
    conf = node.conf(None, version="1.1.0", profiles={"allowMac": True})
    code, out, err = run_plugin(
        "ADD", conf, container_id="c-jumbo", netns=ns, ifname="net1", cni_args=_pod_args(pod)
    )
    assert code == 0, (out, err)
    link = link_in_netns(ns, "net1")
    assert link is not None
    assert (link.kind, link.mode, link.mtu, link.mac) == ("macvlan", "private", 9000, mac)
    assert link.parent_index == host_link(node.parents["nic-b"]).index
    assert out["interfaces"][0] == {"name": "net1", "mac": mac, "mtu": 9000, "sandbox": ns}
    (att,) = node.status()["attachments"]
    assert att["profile"] == {
        "linkType": "macvlan",
        "mode": "private",
        "mtu": 9000,
        "mac": mac,
        "shaping": True,
        "fromConfig": ["linkType", "mac", "mode", "mtu"],
    }
    # CHECK verifies the link against the profile ADD applied, not the conflist's "bridge"
    check = {**conf, "prevResult": out}
    code, cout, err = run_plugin(
        "CHECK", check, container_id="c-jumbo", netns=ns, ifname="net1", cni_args=_pod_args(pod)
    )
    assert code == 0, (cout, err)
    code, dout, err = run_plugin(
        "DEL", conf, container_id="c-jumbo", netns=ns, ifname="net1", cni_args=_pod_args(pod)
    )
    assert code == 0, (dout, err)
    assert link_in_netns(ns, "net1") is None


def test_add_refuses_a_profile_its_own_conflist_forbids_and_leaves_nothing(node, make_netns, tmp_path):
    pod = str(uuid.uuid4())
    doc = _claim(
        profile_config("FromClaim", requests=["net1"], mtu=1400, shaping={"enabled": False}), pod_uid=pod
    )
    r = _prepare(node, tmp_path, doc, pod, "--conflist", _open_conflist(tmp_path))  # the agent's limits: open
    assert r.returncode == 0, r.stderr
    before = node.status()
    ns = make_netns()
    conf = node.conf(None, version="1.1.0")  # this network's limits: the defaults (no shaping off)
    code, out, err = run_plugin(
        "ADD", conf, container_id="c-off", netns=ns, ifname="net1", cni_args=_pod_args(pod)
    )
    assert code != 0 and out["code"] == 101, (out, err)
    assert out["msg"] == (
        "failed to honour claim prod/jumbo request 'net1' on network 'testnet': its device profile shaping.enabled "
        "false is not allowed on this node (profiles.allowShapingOff: false)"
    )
    assert link_in_netns(ns, "net1") is None
    after = node.status()
    assert after["attachments"] == [] and after["devices"] == before["devices"]


def test_two_requests_of_one_claim_make_two_interfaces_each_with_its_profile(make_node, make_netns, tmp_path):
    """A claim with two requests (two NICs) and a profile per request: the runtime (Multus,
    one delegate per network attachment) calls ADD once per interface, CNI_IFNAME naming the
    request; each call makes its request's link on its allocated NIC."""
    node = make_node(mtu=9000)
    pod = str(uuid.uuid4())
    doc = resource_claim(
        allocation_result("nic-a", request="net1", consumed={"bandwidth": "1G"}, share_id=str(uuid.uuid4())),
        allocation_result("nic-b", request="net2", consumed={"bandwidth": "2G"}, share_id=str(uuid.uuid4())),
        uid=str(uuid.uuid4()),
        name="two",
        namespace="prod",
        config=[
            profile_config("FromClass", linkType="macvlan", mode="private"),
            profile_config("FromClaim", requests=["net2"], mtu=4000),
        ],
    )
    r = _prepare(node, tmp_path, doc, pod)
    assert r.returncode == 0, r.stderr
    ns = make_netns()
    conf = node.conf(None, version="1.1.0")
    for ifname in ("net1", "net2"):
        code, out, err = run_plugin(
            "ADD", conf, container_id="c-two", netns=ns, ifname=ifname, cni_args=_pod_args(pod)
        )
        assert code == 0, (ifname, out, err)
    one, two = link_in_netns(ns, "net1"), link_in_netns(ns, "net2")
    assert (one.kind, one.mode, one.mtu, one.parent_index) == (
        "macvlan",
        "private",
        9000,
        host_link(node.parents["nic-a"]).index,
    )  # the parent's MTU, no profile MTU
    assert (two.kind, two.mode, two.mtu, two.parent_index) == (
        "macvlan",
        "private",
        4000,
        host_link(node.parents["nic-b"]).index,
    )
    by_if = {a["ifname"]: a for a in node.status()["attachments"]}
    assert by_if["net1"]["profile"]["fromConfig"] == ["linkType", "mode"]
    assert by_if["net2"]["profile"]["fromConfig"] == ["linkType", "mode", "mtu"]
    assert (by_if["net1"]["consumedCapacity"], by_if["net2"]["consumedCapacity"]) == (
        {"bandwidth": "1G"},
        {"bandwidth": "2G"},
    )
    for ifname in ("net1", "net2"):
        assert (
            run_plugin("DEL", conf, container_id="c-two", netns=ns, ifname=ifname, cni_args=_pod_args(pod))[0]
            == 0
        )
