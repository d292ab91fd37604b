"""The allocator's KEP-5075 features on the ADD path: CEL selectors in the plugin config, distinctFrom: pod,
dedicated (not allowMultipleAllocations) devices in standalone and claim mode."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from cni_dra.netlink.info import host_link_by_index, link_in_netns
from netns_tests.runner import CNI_EXE, cni_dra_status, run_plugin

DRIVER = "net.cni-dra.dev"


@pytest.fixture
def make_tiered_node(tmp_path, make_parent_nic):
    """Factory over ``[(device, shared, bandwidth, tier)]``: NICs whose devices carry a ``tier``
    attribute and may be dedicated, which the shared-NIC inventory of conftest's ``make_node``
    does not describe. Returns ``(parents, conf(**kw), status())``."""

    def make(devices_spec):
        nics = sorted(make_parent_nic() for _ in devices_spec)
        devices = []
        for (name, shared, speed, tier), nic in zip(devices_spec, nics, strict=True):
            d = {
                "name": name,
                "attributes": {"ifName": {"string": nic}, "tier": {"string": tier}},
                "capacity": {"bandwidth": {"value": speed}},
            }
            if shared:
                d["allowMultipleAllocations"] = True
            devices.append(d)
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
                        "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                        "devices": devices,
                    },
                }
            )
        )
        parents = {spec[0]: nic for spec, nic in zip(devices_spec, nics, strict=True)}

        def conf(**kw):
            c = {
                "cniVersion": "1.0.0",
                "name": "net3",
                "type": "cni-dra",
                "stateDir": str(tmp_path / "state"),
                "inventory": str(inv),
            }
            c.update(kw)
            return c

        def status():
            return cni_dra_status(str(tmp_path / "state"), str(inv))

        return parents, conf, status

    return make


def _parent(ns, ifname="eth0"):
    link = link_in_netns(ns, ifname)
    return host_link_by_index(link.parent_index).name if link else None


def _add(conf, ns, pod_uid, ifname="eth0", cid=None):
    return run_plugin(
        "ADD",
        conf,
        container_id=cid or uuid.uuid4().hex,
        netns=ns,
        ifname=ifname,
        cni_args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID={pod_uid}",
    )


def test_cel_selector_in_config_restricts_devices(make_tiered_node, make_netns):
    parents, conf, _ = make_tiered_node([("a", True, "10G", "gold"), ("b", True, "10G", "silver")])
    ns = make_netns()
    c = conf(
        capacity={"requests": {"bandwidth": "1G"}},
        selectors=[{"cel": {"expression": 'device.attributes["net.cni-dra.dev"].tier == "silver"'}}],
    )
    code, out, err = _add(c, ns, str(uuid.uuid4()))
    assert code == 0, (out, err)
    assert _parent(ns) == parents["b"]  # best-fit tie would pick "a" without the selector
    bad = conf(selectors=[{"cel": {"expression": "device.nosuch("}}])
    code, out, _ = _add(bad, make_netns(), str(uuid.uuid4()))
    assert code != 0 and out["code"] == 7


def test_distinct_from_pod_puts_each_attachment_on_another_nic(make_tiered_node, make_netns):
    parents, conf, status = make_tiered_node([("a", True, "10G", "x"), ("b", True, "10G", "x")])
    ns, pod = make_netns(), str(uuid.uuid4())
    c = conf(capacity={"requests": {"bandwidth": "1G"}}, distinctFrom="pod")
    cid = uuid.uuid4().hex
    for ifname in ("eth0", "eth1"):
        code, out, err = _add(c, ns, pod, ifname=ifname, cid=cid)
        assert code == 0, (out, err)
    assert {_parent(ns, "eth0"), _parent(ns, "eth1")} == {parents["a"], parents["b"]}
    code, out, _ = _add(c, ns, pod, ifname="eth2", cid=cid)
    assert code != 0 and out["code"] == 100 and "distinctFrom" in out["msg"]
    # without distinctFrom both would have gone to the same NIC (best-fit)
    ns2, pod2 = make_netns(), str(uuid.uuid4())
    plain = conf(capacity={"requests": {"bandwidth": "1G"}})
    for ifname in ("eth0", "eth1"):
        assert _add(plain, ns2, pod2, ifname=ifname, cid="c2")[0] == 0
    assert _parent(ns2, "eth0") == _parent(ns2, "eth1")


def test_dedicated_device_is_held_whole_and_has_no_share_id(make_tiered_node, make_netns):
    parents, conf, status = make_tiered_node([("solo", False, "10G", "x")])
    ns = make_netns()
    code, out, err = _add(conf(capacity={"requests": {"bandwidth": "1G"}}), ns, str(uuid.uuid4()))
    assert code == 0, (out, err)
    att = status()["attachments"][0]
    assert att["shareID"] is None and att["consumedCapacity"] == {"bandwidth": "10G"}
    code, out, _ = _add(conf(capacity={"requests": {"bandwidth": "1G"}}), make_netns(), str(uuid.uuid4()))
    assert code != 0 and out["code"] == 100 and "dedicated device already allocated" in out["msg"]


def test_prepared_dedicated_claim_blocks_standalone_and_lands(make_tiered_node, make_netns, tmp_path):
    parents, conf, status = make_tiered_node([("solo", False, "10G", "x")])
    pod = str(uuid.uuid4())
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": "x"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "net", "driver": DRIVER, "pool": "n", "device": "solo"}]}
            }
        },
    }
    f = tmp_path / "claim.json"
    f.write_text(json.dumps(claim))
    state_dir = conf()["stateDir"]
    subprocess.run(
        [CNI_EXE, "claims", "prepare", "--state-dir", state_dir, "--pod-uid", pod, str(f)],
        check=True,
        capture_output=True,
    )
    code, out, _ = _add(conf(), make_netns(), str(uuid.uuid4()))
    assert code != 0 and out["code"] == 100  # the prepared dedicated claim holds the device
    ns = make_netns()
    code, out, err = _add(conf(), ns, pod)
    assert code == 0, (out, err)
    assert _parent(ns) == parents["solo"]
    assert status()["attachments"][0]["shareID"] is None
