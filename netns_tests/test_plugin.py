"""The installed /opt/cni/bin/cni-dra driven exactly as a runtime does (env + stdin + exit code + stdout).

Covers: selection policies, claim mode (honoured and refused), DEL
twice / without netns / without parent, CHECK, mtu refused before IPAM, rollback of an
ADD that fails after IPAM. Parents are veth ends (stand-in NICs) from conftest fixtures.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from cni_dra.netlink.info import host_link, link_in_netns
from netns_tests.bed import DRIVER, parent_of
from netns_tests.runner import CNI_EXE, CNI_PATH, run_plugin
from tests.builders import allocation_result, resource_claim


def _args(pod_uid: str) -> str:
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p-{pod_uid[:6]};K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_UID={pod_uid}"


def _add(node, netns, conf, cid=None, pod_uid=None, ifname="eth0"):
    cid = cid or uuid.uuid4().hex
    pod_uid = pod_uid or str(uuid.uuid4())
    code, out, err = run_plugin(
        "ADD", conf, container_id=cid, netns=netns, ifname=ifname, cni_args=_args(pod_uid)
    )
    return cid, code, out, err


@pytest.mark.parametrize("policy,second", [("best-fit", "nic-a"), ("least-allocated", "nic-b")])
def test_selection_policies(node, make_netns, policy, second):
    ns1, ns2 = make_netns(), make_netns()
    _, code, out, err = _add(node, ns1, node.conf("4G", selectionPolicy=policy))
    assert code == 0, (out, err)
    assert parent_of(ns1) == node.parents["nic-a"]  # tie broken by device name
    _, code, out, err = _add(node, ns2, node.conf("3G", selectionPolicy=policy))
    assert code == 0, (out, err)
    assert parent_of(ns2) == node.parents[second]
    assert node.reported_consumed()[second] == ("7G" if second == "nic-a" else "3G")


def test_add_result_and_status(node, make_netns):
    ns = make_netns()
    cid, code, out, err = _add(node, ns, node.conf("2500M", version="1.1.0"))
    assert code == 0, (out, err)
    assert out["cniVersion"] == "1.1.0"
    iface = out["interfaces"][0]
    link = link_in_netns(ns, "eth0")
    assert (iface["name"], iface["mac"], iface["sandbox"]) == ("eth0", link.mac, ns)
    assert out["ips"][0]["address"].startswith("198.51.100.") and out["ips"][0]["interface"] == 0
    assert out["ips"][0]["address"] in link.addresses
    att = node.status()["attachments"][0]
    assert (att["containerID"], att["ifname"], att["device"]) == (cid, "eth0", "nic-a")
    assert att["consumedCapacity"] == {"bandwidth": "2500M"}
    uuid.UUID(att["shareID"])


def test_no_room_error_names_request_and_remaining(node, make_netns):
    assert _add(node, make_netns(), node.conf("10G"))[1] == 0
    assert _add(node, make_netns(), node.conf("7G"))[1] == 0
    _, code, out, _ = _add(node, make_netns(), node.conf("8G"))
    assert code != 0 and out["code"] == 100
    assert "bandwidth 8G" in out["msg"]
    assert "nic-a" in out["msg"] and "nic-b" in out["msg"]
    assert "3G" in out["msg"] and "remaining bandwidth 0" in out["msg"]


def _claim_doc(device: str, bw: str, share: str, pod_uid: str) -> dict:
    return resource_claim(
        allocation_result(device, consumed={"bandwidth": bw}, share_id=share),
        uid=str(uuid.uuid4()),
        name="net-claim",
        requests=[
            {
                "name": "net",
                "exactly": {
                    "deviceClassName": "cni-dra-shared-nic",
                    "capacity": {"requests": {"bandwidth": bw}},
                },
            }
        ],
        reserved_for=[{"resource": "pods", "name": "p", "uid": pod_uid}],
    )


def _prepare(node, tmp_path, doc, pod_uid):
    import subprocess

    f = tmp_path / f"claim-{uuid.uuid4().hex[:6]}.json"
    f.write_text(json.dumps(doc))
    subprocess.run(
        [CNI_EXE, "claims", "prepare", "--state-dir", str(node.state_dir), "--pod-uid", pod_uid, str(f)],
        check=True,
        capture_output=True,
        env={"PATH": os.environ["PATH"]},
    )


def test_claim_mode_uses_the_allocated_device(node, make_netns, tmp_path):
    pod_uid, share = str(uuid.uuid4()), str(uuid.uuid4())
    _prepare(node, tmp_path, _claim_doc("nic-b", "6G", share, pod_uid), pod_uid)
    ns = make_netns()
    # the config asks for 1G standalone: claim mode ignores it and honours the allocation
    _, code, out, err = _add(node, ns, node.conf("1G"), pod_uid=pod_uid)
    assert code == 0, (out, err)
    assert parent_of(ns) == node.parents["nic-b"]
    att = node.status()["attachments"][0]
    assert (att["device"], att["shareID"], att["consumedCapacity"]) == ("nic-b", share, {"bandwidth": "6G"})
    assert node.reported_consumed() == {"nic-a": "0", "nic-b": "6G"}


def test_prepared_claim_reserves_capacity_against_standalone(node, make_netns, tmp_path):
    pod_uid = str(uuid.uuid4())
    _prepare(node, tmp_path, _claim_doc("nic-b", "6G", str(uuid.uuid4()), pod_uid), pod_uid)
    _add(node, make_netns(), node.conf("10G"))  # takes nic-a whole
    _, code, out, _ = _add(node, make_netns(), node.conf("5G"))
    assert code != 0 and out["code"] == 100  # nic-b has only 4G left beside the prepared claim


def test_claim_mode_refuses_a_result_that_no_longer_fits(node, make_netns, tmp_path):
    assert _add(node, make_netns(), node.conf("10G"))[1] == 0
    assert _add(node, make_netns(), node.conf("8G"))[1] == 0  # nic-b: 8G used
    pod_uid = str(uuid.uuid4())
    _prepare(node, tmp_path, _claim_doc("nic-b", "6G", str(uuid.uuid4()), pod_uid), pod_uid)
    ns = make_netns()
    before = node.status()
    _, code, out, _ = _add(node, ns, node.conf("1G"), pod_uid=pod_uid)
    assert code != 0 and out["code"] == 101
    assert "no longer fits" in out["msg"]
    assert link_in_netns(ns, "eth0") is None
    assert node.status()["attachments"] == before["attachments"]


def test_del_twice_and_capacity_returns(node, make_netns):
    ns = make_netns()
    cid, code, out, err = _add(node, ns, node.conf("4G"))
    assert code == 0, (out, err)
    for _ in range(2):
        code, out, err = run_plugin("DEL", node.conf("4G"), container_id=cid, netns=ns, ifname="eth0")
        assert code == 0, (out, err)
    assert link_in_netns(ns, "eth0") is None
    assert node.reported_consumed() == {"nic-a": "0", "nic-b": "0"}
    assert node.ipam_reservations() == []


def test_del_without_prior_add_succeeds(node, make_netns):
    code, out, err = run_plugin(
        "DEL", node.conf(), container_id="never-added", netns=make_netns(), ifname="eth0"
    )
    assert code == 0, (out, err)


def test_del_with_netns_deleted_or_empty(node, make_netns):
    ns = make_netns()
    cid, code, _, _ = _add(node, ns, node.conf("4G"))
    assert code == 0
    os.system(f"ip netns delete {Path(ns).name}")  # the pod sandbox is gone
    code, out, err = run_plugin("DEL", node.conf(), container_id=cid, netns=ns, ifname="eth0")
    assert code == 0, (out, err)
    assert node.status()["attachments"] == []
    assert node.ipam_reservations() == []
    ns2 = make_netns()
    cid2, code, _, _ = _add(node, ns2, node.conf("4G"))
    assert code == 0
    code, out, err = run_plugin("DEL", node.conf(), container_id=cid2, netns="", ifname="eth0")
    assert code == 0, (out, err)
    assert node.status()["attachments"] == []
    assert node.ipam_reservations() == []


def test_del_with_parent_nic_deleted(node, make_netns):
    ns = make_netns()
    cid, code, _, _ = _add(node, ns, node.conf("4G"))
    assert code == 0
    os.system(f"ip link delete {node.parents['nic-a']}")  # the macvlan goes with it
    code, out, err = run_plugin("DEL", node.conf(), container_id=cid, netns=ns, ifname="eth0")
    assert code == 0, (out, err)
    assert node.status()["attachments"] == []
    assert node.ipam_reservations() == []


def test_check_after_add_then_fails_when_link_removed(node, make_netns):
    ns = make_netns()
    conf = node.conf("4G")
    cid, code, out, _ = _add(node, ns, conf)
    assert code == 0
    checked = dict(conf, prevResult=out)
    code, cout, err = run_plugin("CHECK", checked, container_id=cid, netns=ns, ifname="eth0")
    assert code == 0, (cout, err)
    from cni_dra.netlink.sublink import delete_link

    assert delete_link(ns, "eth0")
    code, cout, _ = run_plugin("CHECK", checked, container_id=cid, netns=ns, ifname="eth0")
    assert code != 0 and cout["code"] == 105


def test_mtu_above_parent_refused_before_ipam(node, make_netns, tmp_path):
    calls = tmp_path / "ipam-calls"
    plugdir = tmp_path / "plugins"
    plugdir.mkdir()
    rec = plugdir / "recording-ipam"
    rec.write_text(f'#!/bin/sh\necho "$CNI_COMMAND" >> {calls}\nexec /usr/lib/cni/host-local\n')
    rec.chmod(0o755)
    conf = node.conf("1G", mtu=9000)
    conf["ipam"]["type"] = "recording-ipam"
    ns = make_netns()
    code, out, _ = run_plugin(
        "ADD", conf, container_id="c-mtu", netns=ns, ifname="eth0", cni_path=f"{plugdir}:{CNI_PATH}"
    )
    assert code != 0 and out["code"] == 7
    assert "mtu 9000" in out["msg"]
    assert not calls.exists()
    assert link_in_netns(ns, "eth0") is None
    assert node.status()["attachments"] == []


def test_add_failing_after_ipam_rolls_back_everything(node, make_netns):
    conf = node.conf("4G")
    # host-local hands out the address and a route whose gateway is not on-link: configuring it fails
    conf["ipam"]["routes"] = [{"dst": "203.0.113.0/24", "gw": "192.0.2.77"}]
    ns = make_netns()
    _, code, out, _ = _add(node, ns, conf)
    assert code != 0, out
    assert out["code"] == 102
    assert link_in_netns(ns, "eth0") is None
    assert node.ipam_reservations() == []
    assert node.status()["attachments"] == []
    assert node.reported_consumed() == {"nic-a": "0", "nic-b": "0"}
    # no temporary link left in the host either
    assert all(host_link(p) is not None for p in node.parents.values())


# -- regressions from the first user review ------------------------------------------------
def test_one_claim_result_serves_one_interface(node, make_netns, tmp_path):
    pod_uid, share = str(uuid.uuid4()), str(uuid.uuid4())
    _prepare(node, tmp_path, _claim_doc("nic-a", "2G", share, pod_uid), pod_uid)
    ns, cid = make_netns(), uuid.uuid4().hex
    assert _add(node, ns, node.conf(None), cid=cid, pod_uid=pod_uid, ifname="net1")[1] == 0
    _, code, out, _ = _add(node, ns, node.conf(None), cid=cid, pod_uid=pod_uid, ifname="eth5")
    assert code != 0 and out["code"] == 101 and "already used by interface net1" in out["msg"]
    assert link_in_netns(ns, "eth5") is None
    assert node.reported_consumed()["nic-a"] == "2G"


def test_claim_shared_by_two_pods_is_one_share_charged_once(node, make_netns, tmp_path):
    """A ResourceClaim shared by two pods (prepared for both, as the agent does from
    status.reservedFor): both interfaces on the allocated NIC with its shareID, the share
    charged once; the first pod's DEL leaves the second pod's interface and the charge."""
    pod1, pod2, share = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    doc = _claim_doc("nic-b", "2G", share, pod1)
    _prepare(node, tmp_path, doc, pod1)
    _prepare(node, tmp_path, doc, pod2)
    ns1, ns2 = make_netns(), make_netns()
    cid1, code, out, err = _add(node, ns1, node.conf(None), pod_uid=pod1)
    assert code == 0, (out, err)
    cid2, code, out, err = _add(node, ns2, node.conf(None), pod_uid=pod2)
    assert code == 0, (out, err)
    assert parent_of(ns1) == parent_of(ns2) == node.parents["nic-b"]
    atts = node.status()["attachments"]
    assert sorted(a["podUID"] for a in atts) == sorted([pod1, pod2])
    assert {a["shareID"] for a in atts} == {share}
    assert node.reported_consumed() == {"nic-a": "0", "nic-b": "2G"}
    code, out, err = run_plugin(
        "DEL", node.conf(None), container_id=cid1, netns=ns1, ifname="eth0", cni_args=_args(pod1)
    )
    assert code == 0, (out, err)
    assert link_in_netns(ns1, "eth0") is None and link_in_netns(ns2, "eth0") is not None
    assert [a["podUID"] for a in node.status()["attachments"]] == [pod2]
    assert node.reported_consumed() == {"nic-a": "0", "nic-b": "2G"}


def test_del_leaves_a_foreign_link_alone(node, make_netns):
    ns = make_netns()
    import subprocess

    name = Path(ns).name
    peer = f"{name[:10]}f"
    subprocess.run(
        ["ip", "link", "add", peer, "type", "veth", "peer", "name", "net3", "netns", name], check=True
    )
    try:
        _, code, out, _ = _add(node, ns, node.conf("1G"), ifname="net3")
        assert code != 0 and out["code"] == 4  # the name is taken in the pod
        code, out, err = run_plugin("DEL", node.conf("1G"), container_id="x1", netns=ns, ifname="net3")
        assert code == 0, (out, err)
        assert link_in_netns(ns, "net3") is not None  # not ours: left alone
    finally:
        subprocess.run(["ip", "link", "del", peer], check=False, capture_output=True)


def test_del_without_record_removes_a_macvlan_on_an_inventory_nic(node, make_netns):
    ns = make_netns()
    cid, code, _, _ = _add(node, ns, node.conf("1G"))
    assert code == 0
    import shutil

    shutil.rmtree(node.state_dir)  # the state is lost (e.g. a wiped stateDir)
    code, out, err = run_plugin("DEL", node.conf("1G"), container_id=cid, netns=ns, ifname="eth0")
    assert code == 0, (out, err)
    assert link_in_netns(ns, "eth0") is None
    assert node.ipam_reservations() == []


def test_selection_skips_nics_whose_mtu_is_too_small(tmp_path, make_parent_nic, make_netns):
    small, big = make_parent_nic(mtu=1400), make_parent_nic(mtu=1500)
    devices = [
        {
            "name": n,
            "allowMultipleAllocations": True,
            "attributes": {"ifName": {"string": i}},
            "capacity": {"bandwidth": {"value": "10G"}},
        }
        for n, i in (("a-small", small), ("b-big", big))
    ]
    inv = tmp_path / "slice.json"
    inv.write_text(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": "n"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": "n",
                    "devices": devices,
                    "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                },
            }
        )
    )
    conf = {
        "cniVersion": "1.0.0",
        "name": "mtunet",
        "type": "cni-dra",
        "stateDir": str(tmp_path / "st"),
        "inventory": str(inv),
        "mtu": 1500,
        "capacity": {"requests": {"bandwidth": "1G"}},
    }
    ns = make_netns()
    code, out, err = run_plugin("ADD", conf, container_id="cm1", netns=ns, ifname="eth0")
    assert code == 0, (out, err)
    assert parent_of(ns) == big
    code, out, _ = run_plugin(
        "ADD", dict(conf, mtu=9000), container_id="cm2", netns=make_netns(), ifname="eth0"
    )
    assert code != 0 and out["code"] == 7 and "mtu 9000" in out["msg"]


def test_prepare_refuses_unknown_device_and_bad_share_id(node, tmp_path):
    import subprocess

    for doc in (
        _claim_doc("nic-z", "1G", str(uuid.uuid4()), "p"),
        _claim_doc("nic-a", "1G", "NOT-A-UUID", "p"),
    ):
        f = tmp_path / f"bad-{uuid.uuid4().hex[:6]}.json"
        f.write_text(json.dumps(doc))
        r = subprocess.run(
            [
                CNI_EXE,
                "claims",
                "prepare",
                "--state-dir",
                str(node.state_dir),
                "--inventory",
                node.conf()["inventory"],
                "--pod-uid",
                "p",
                str(f),
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 1 and r.stderr.startswith("InvalidConfigError: ")
    assert node.status()["preparedClaims"] == []


def test_best_fit_is_not_first_fit(node, make_netns, tmp_path):
    """nic-b holds a 5G prepared claim: 3G goes to nic-b under best-fit (least left that
    fits), to nic-a under least-allocated; a first-fit or by-name choice would say nic-a."""
    pod_uid = str(uuid.uuid4())
    _prepare(node, tmp_path, _claim_doc("nic-b", "5G", str(uuid.uuid4()), pod_uid), pod_uid)
    ns1, ns2 = make_netns(), make_netns()
    assert _add(node, ns1, node.conf("3G"))[1] == 0
    assert parent_of(ns1) == node.parents["nic-b"]
    assert _add(node, ns2, node.conf("3G", selectionPolicy="least-allocated"))[1] == 0
    assert parent_of(ns2) == node.parents["nic-a"]


def test_check_fails_on_mac_mismatch(node, make_netns):
    ns = make_netns()
    conf = node.conf("1G")
    cid, code, out, _ = _add(node, ns, conf)
    assert code == 0
    out["interfaces"][0]["mac"] = "c2:00:00:00:00:99"
    code, cout, _ = run_plugin("CHECK", dict(conf, prevResult=out), container_id=cid, netns=ns, ifname="eth0")
    assert code != 0 and cout["code"] == 105 and "MAC" in cout["msg"]


@pytest.mark.parametrize("ifname", ["net+1", "pod@a", "x#1"])
def test_any_printable_ascii_interface_name_is_added_and_deleted(node, make_netns, ifname):
    """Names with punctuation the kernel keeps: ADD writes their sysctls (it failed on them
    with code 7 before) and shapes them; DEL removes all."""
    from netns_tests.bed import links_named, sysctl_in_netns

    ns = make_netns()
    cid, code, out, err = _add(node, ns, node.conf("300M"), ifname=ifname)
    assert code == 0, (out, err)
    assert sysctl_in_netns(ns, f"net/ipv4/conf/{ifname}/arp_notify") == "1"
    assert ("ifb-" + ifname, "ifb") in links_named(ns)
    code, out, err = run_plugin(
        "DEL", node.conf("300M"), container_id=cid, netns=ns, ifname=ifname, cni_args=_args(cid)
    )
    assert (code, out) == (0, None), err
    assert [name for name, _ in links_named(ns)] == ["lo"]


@pytest.mark.parametrize("ifname", ["eté", "net\x7f", "a\x1fb"])
def test_an_interface_name_outside_printable_ascii_is_code_4_before_anything(node, make_netns, ifname):
    ns = make_netns()
    _, code, out, err = _add(node, ns, node.conf("300M"), ifname=ifname)
    assert code == 1 and out is not None and out["code"] == 4, (out, err)
    assert out["msg"] == (
        f"invalid CNI_IFNAME {ifname!r}: interface name contains a character that is not "
        "printable ASCII (cni-dra takes '!' to '~' only)"
    )
    assert node.status()["attachments"] == [] and node.reported_consumed() == {"nic-a": "0", "nic-b": "0"}
