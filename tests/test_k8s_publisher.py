"""ResourceSlice publisher: the slice built from the inventory and the host, published
to the local API stand-in with generation bumps, drift repair and cleanup."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_dra.agent.publisher import PCIE_ROOT_ATTRIBUTE, Publisher, desired_slice, pci_info, slice_name
from cni_dra.k8s.api import KubeApi
from tests.k8s_apiserver import FakeApiServer, inventory_doc


@dataclass
class Link:
    mac: str | None
    mtu: int


INV = inventory_doc("node-1", {"eth-a": "ens1", "eth-b": "ens2"})
NAME = "node-1-net.cni-dra.dev"


def no_pci(_: str) -> tuple[None, None]:
    return None, None


class Host:
    """Host links the publisher sees (mutable per test)."""

    def __init__(self) -> None:
        self.links = {"ens1": Link("02:00:00:00:00:0a", 1500), "ens2": Link("02:00:00:00:00:0b", 9000)}

    def __call__(self, name: str) -> Link | None:
        return self.links.get(name)


def test_slice_name_is_a_dns_subdomain():
    assert slice_name("node-1", "node-1", "net.cni-dra.dev") == "node-1-net.cni-dra.dev"
    assert slice_name("Node_1", "pool-x", "net.cni-dra.dev") == "node-1-pool-x-net.cni-dra.dev"
    assert len(slice_name("n" * 300, "p", "d")) == 253


def test_desired_slice_attributes_owner_and_missing_nic():
    host = Host()
    del host.links["ens2"]
    pci = {"ens1": ("0000:3b:00.0", "pci0000:3a")}
    node = {"metadata": {"name": "node-1", "uid": "u-node"}}
    got = desired_slice(INV, node_name="node-1", node=node, link=host, pci=lambda n: pci.get(n, (None, None)))
    assert got["metadata"] == {
        "name": NAME,
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "u-node", "controller": True}
        ],
    }
    assert [d["name"] for d in got["spec"]["devices"]] == ["eth-a"]  # ens2 is not on the host
    dev = got["spec"]["devices"][0]
    assert dev["attributes"] == {
        "ifName": {"string": "ens1"},
        "mac": {"string": "02:00:00:00:00:0a"},
        "mtu": {"int": 1500},
        "pciAddress": {"string": "0000:3b:00.0"},
        PCIE_ROOT_ATTRIBUTE: {"string": "pci0000:3a"},
    }
    assert dev["capacity"] == INV["spec"]["devices"][0]["capacity"]
    assert dev["allowMultipleAllocations"] is True
    assert got["spec"]["pool"] == {"name": "node-1", "generation": 1, "resourceSliceCount": 1}
    assert got["spec"]["nodeName"] == "node-1"
    # no Node readable: no owner reference
    assert (
        "ownerReferences"
        not in desired_slice(INV, node_name="node-1", node=None, link=host, pci=no_pci)["metadata"]
    )


def test_pci_info_from_sysfs(tmp_path):
    dev = tmp_path / "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    dev.mkdir(parents=True)
    (tmp_path / "net/ens1").mkdir(parents=True)
    os.symlink(dev, tmp_path / "net/ens1/device")
    virt = tmp_path / "devices/virtual/net/veth0"
    virt.mkdir(parents=True)
    (tmp_path / "net/veth0").mkdir(parents=True)
    assert pci_info("ens1", str(tmp_path / "net")) == ("0000:3b:00.0", "pci0000:3a")
    assert pci_info("veth0", str(tmp_path / "net")) == (None, None)  # no device link
    assert pci_info("nope", str(tmp_path / "net")) == (None, None)


@pytest.fixture
def world():
    with FakeApiServer() as server:
        server.add_node("node-1")
        api = KubeApi.from_config(host=server.url)
        host = Host()
        inv = {"doc": copy.deepcopy(INV)}
        pub = Publisher(api, node_name="node-1", inventory=lambda: inv["doc"], link=host, pci=no_pci)
        yield server, pub, host, inv
        api.close()


def gen(server) -> int:
    return server.slices[NAME]["spec"]["pool"]["generation"]


def test_publish_create_unchanged_update(world):
    server, pub, host, _ = world
    assert pub.sync() == "created"
    assert gen(server) == 1
    assert (
        server.slices[NAME]["metadata"]["ownerReferences"][0]["uid"]
        == server.nodes["node-1"]["metadata"]["uid"]
    )
    assert pub.sync() == "unchanged"
    assert server.requests_for("PUT", r".*/resourceslices/.*") == []
    host.links["ens2"].mtu = 1400  # a NIC change
    assert pub.sync() == "updated"
    assert gen(server) == 2
    mtu = {d["name"]: d["attributes"]["mtu"]["int"] for d in server.slices[NAME]["spec"]["devices"]}
    assert mtu == {"eth-a": 1500, "eth-b": 1400}
    assert server.invalid == []


def test_inventory_change_bumps_generation(world):
    server, pub, _, inv = world
    pub.sync()
    inv["doc"]["spec"]["devices"][1]["capacity"]["bandwidth"]["value"] = "25G"
    assert pub.sync() == "updated"
    assert gen(server) == 2
    assert server.slices[NAME]["spec"]["devices"][1]["capacity"]["bandwidth"]["value"] == "25G"


def test_drift_is_repaired(world):
    server, pub, _, _ = world
    pub.sync()
    with server.lock:  # someone else edits the slice
        server.slices[NAME]["spec"]["devices"].pop()
    assert pub.sync() == "updated"
    assert [d["name"] for d in server.slices[NAME]["spec"]["devices"]] == ["eth-a", "eth-b"]
    assert gen(server) == 2
    with server.lock:  # ... or deletes it
        del server.slices[NAME]
    assert pub.sync() == "created"
    assert NAME in server.slices


def test_stale_slices_of_this_node_are_deleted(world):
    server, pub, _, _ = world
    old = copy.deepcopy(INV)
    old["metadata"] = {"name": "node-1-oldpool-net.cni-dra.dev"}
    old["spec"]["pool"]["name"] = "oldpool"
    server.slices[old["metadata"]["name"]] = old
    other_node = copy.deepcopy(INV)
    other_node["metadata"] = {"name": "node-2-net.cni-dra.dev"}
    other_node["spec"]["nodeName"] = "node-2"
    server.slices["node-2-net.cni-dra.dev"] = other_node
    pub.sync()
    assert sorted(server.slices) == ["node-1-net.cni-dra.dev", "node-2-net.cni-dra.dev"]


def test_cleanup_deletes_the_slice(world):
    server, pub, _, _ = world
    pub.sync()
    assert pub.cleanup() is True
    assert NAME not in server.slices
    assert pub.cleanup() is False


def test_publish_errors_are_reported_and_raised(world):
    server, pub, _, _ = world
    outcomes = []
    pub.on_result = outcomes.append
    server.fail("POST", r".*/resourceslices", 500)
    from cni_dra.errors import IOFailureError

    with pytest.raises(IOFailureError):
        pub.sync()
    assert pub.sync() == "created"
    assert outcomes == ["error", "created"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([1400, 1500, 9000]), min_size=1, max_size=6))
def test_generation_counts_changes(mtus):
    """Publishing after each MTU value: the generation rises by one exactly when the
    published content changed, never otherwise."""
    with FakeApiServer() as server:
        api = KubeApi.from_config(host=server.url)
        host = Host()
        pub = Publisher(api, node_name="node-1", inventory=lambda: INV, link=host, pci=no_pci)
        changes = 0
        last = host.links["ens1"].mtu
        pub.sync()
        for mtu in mtus:
            host.links["ens1"].mtu = mtu
            out = pub.sync()
            assert out == ("updated" if mtu != last else "unchanged")
            changes += mtu != last
            last = mtu
        assert gen(server) == 1 + changes
        api.close()
