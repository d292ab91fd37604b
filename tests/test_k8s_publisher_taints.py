"""NIC health in the ResourceSlice: device taints (KEP-5055) for a NIC that is down or gone,
removed when it is back; a vanished NIC kept (tainted, with its last attributes) and then
dropped; published to the local API stand-in, whose bodies the official client's models
check."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from cni_dra.agent.nichealth import NicHealth, NicStatus
from cni_dra.agent.publisher import Publisher, desired_slice, device_taints, taint_key
from cni_dra.k8s.api import KubeApi
from cni_dra.netlink.info import LinkInfo
from tests.k8s_apiserver import DRIVER, FakeApiServer, inventory_doc

INV = inventory_doc("node-1", {"eth-a": "ens1", "eth-b": "ens2"})
NAME = "node-1-net.cni-dra.dev"
T0_WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z
KEY = "net.cni-dra.dev/unhealthy"


def link(name: str, *, admin_up: bool = True, operstate: str = "UP", mtu: int = 1500) -> LinkInfo:
    mac = {"ens1": "02:00:00:00:00:0a", "ens2": "02:00:00:00:00:0b"}[name]
    return LinkInfo(
        name=name,
        index=3,
        kind="veth",
        mac=mac,
        mtu=mtu,
        operstate=operstate,
        admin_up=admin_up,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
        carrier=operstate == "UP",
    )


def no_pci(_: str) -> tuple[None, None]:
    return None, None


def status(device: str, problem: str | None, **kw) -> NicStatus:
    return NicStatus(
        device=device, ifname="ens2", problem=problem, since_s=0.0, since_wall_s=T0_WALL + 60, **kw
    )


def devices(slice_: dict) -> dict[str, dict]:
    return {d["name"]: d for d in slice_["spec"]["devices"]}


def taints(dev: dict) -> list[dict]:
    """The device's taints with timeAdded as an instant (the client sends ``+00:00`` for ``Z``)."""
    return [
        dict(t, timeAdded=datetime.datetime.fromisoformat(t["timeAdded"].replace("Z", "+00:00")))
        for t in dev["taints"]
    ]


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_taint_key_and_taints():
    assert taint_key(DRIVER) == KEY
    assert device_taints(DRIVER, None) == []
    assert device_taints(DRIVER, status("eth-b", None)) == []
    assert device_taints(DRIVER, status("eth-b", "carrier-lost", unhealthy_since_wall_s=T0_WALL)) == [
        {"key": KEY, "value": "carrier-lost", "effect": "NoSchedule", "timeAdded": "2027-01-15T08:00:00Z"}
    ]
    assert device_taints(DRIVER, status("eth-b", "admin-down"), "NoExecute") == [
        {"key": KEY, "value": "admin-down", "effect": "NoExecute", "timeAdded": "2027-01-15T08:01:00Z"}
    ]


def test_desired_slice_taints_unhealthy_nics_and_keeps_a_missing_one_with_its_last_attributes():
    host = {"ens1": link("ens1"), "ens2": None}
    known = {
        "eth-b": {"ifName": {"string": "ens2"}, "mac": {"string": "02:00:00:00:00:0b"}, "mtu": {"int": 9000}}
    }
    health = {
        "eth-a": status("eth-a", None),
        "eth-b": status("eth-b", "missing", unhealthy_since_wall_s=T0_WALL),
    }
    got = devices(
        desired_slice(
            INV, node_name="node-1", node=None, link=host.get, pci=no_pci, health=health, known=known
        )
    )
    assert "taints" not in got["eth-a"]
    assert got["eth-b"]["taints"] == [
        {"key": KEY, "value": "missing", "effect": "NoSchedule", "timeAdded": "2027-01-15T08:00:00Z"}
    ]
    assert got["eth-b"]["attributes"] == known["eth-b"]  # as last published
    assert got["eth-b"]["capacity"] == INV["spec"]["devices"][1]["capacity"]
    # missing and never published: the inventory's attributes
    got = devices(desired_slice(INV, node_name="node-1", node=None, link=host.get, pci=no_pci, health=health))
    assert got["eth-b"]["attributes"] == {"ifName": {"string": "ens2"}}
    # dropped: left out
    health["eth-b"] = dataclasses.replace(health["eth-b"], dropped=True)
    got = devices(desired_slice(INV, node_name="node-1", node=None, link=host.get, pci=no_pci, health=health))
    assert sorted(got) == ["eth-a"]


def test_absent_during_the_debounce_is_still_published_untainted():
    host = {"ens1": link("ens1"), "ens2": None}
    health = {"eth-a": status("eth-a", None), "eth-b": status("eth-b", None)}  # not (yet) judged missing
    got = devices(desired_slice(INV, node_name="node-1", node=None, link=host.get, pci=no_pci, health=health))
    assert sorted(got) == ["eth-a", "eth-b"] and "taints" not in got["eth-b"]


class World:
    """A publisher and a NIC health tracker over a fake clock and host, the API stand-in."""

    def __init__(self, server: FakeApiServer, api: KubeApi, effect: str = "NoSchedule") -> None:
        self.server = server
        self.t = 0.0
        self.host: dict[str, LinkInfo | None] = {"ens1": link("ens1"), "ens2": link("ens2")}
        self.health = NicHealth(
            lambda: [("eth-a", "ens1"), ("eth-b", "ens2")],
            self.host.get,
            debounce_s=2.0,
            keep_missing_s=30.0,
            clock=lambda: self.t,
            wall=lambda: T0_WALL + self.t,
        )
        self.pub = Publisher(
            api,
            node_name="node-1",
            inventory=lambda: INV,
            link=self.host.get,
            pci=no_pci,
            health=self.health.statuses,
            taint_effect=effect,
        )

    def at(self, t: float, **links: LinkInfo | None) -> str:
        self.t = t
        self.host.update(links)
        self.health.observe()
        return self.pub.sync()

    def published(self) -> dict[str, dict]:
        return devices(self.server.slices[NAME])

    def generation(self) -> int:
        return int(self.server.slices[NAME]["spec"]["pool"]["generation"])


@pytest.fixture
def world():
    with FakeApiServer() as server:
        server.add_node("node-1")
        api = KubeApi.from_config(host=server.url)
        yield World(server, api)
        api.close()


def test_down_is_tainted_after_the_debounce_and_untainted_when_back(world):
    assert world.at(0.0) == "created"
    assert "taints" not in world.published()["eth-b"]
    assert world.at(10.0, ens2=link("ens2", admin_up=False, operstate="DOWN")) == "unchanged"  # debouncing
    assert world.at(12.0) == "updated"
    assert taints(world.published()["eth-b"]) == [
        {"key": KEY, "value": "admin-down", "effect": "NoSchedule", "timeAdded": utc("2027-01-15T08:00:10Z")}
    ]
    assert "taints" not in world.published()["eth-a"]
    # the API returns the time as +00:00 through the client: still the same content
    assert world.at(13.0) == "unchanged"
    assert world.at(100.0) == "unchanged"
    assert world.generation() == 2
    world.at(200.0, ens2=link("ens2"))
    assert world.at(202.0) == "updated"
    assert "taints" not in world.published()["eth-b"]
    assert world.generation() == 3
    assert world.server.invalid == []


def test_a_flap_shorter_than_the_debounce_publishes_nothing(world):
    world.at(0.0)
    assert world.at(10.0, ens2=link("ens2", operstate="LOWERLAYERDOWN")) == "unchanged"
    assert world.at(11.5, ens2=link("ens2")) == "unchanged"
    assert world.at(20.0) == "unchanged"
    assert world.generation() == 1
    assert len(world.server.requests_for("PUT", r".*/resourceslices/.*")) == 0


def test_a_vanished_nic_is_kept_tainted_then_dropped_then_back(world):
    world.at(0.0, ens2=link("ens2", mtu=9000))
    world.at(10.0, ens2=None)
    assert world.at(12.0) == "updated"
    eth_b = world.published()["eth-b"]
    assert taints(eth_b) == [
        {"key": KEY, "value": "missing", "effect": "NoSchedule", "timeAdded": utc("2027-01-15T08:00:10Z")}
    ]
    assert eth_b["attributes"]["mtu"] == {"int": 9000} and eth_b["attributes"]["mac"] == {
        "string": "02:00:00:00:00:0b"
    }
    assert world.at(39.0) == "unchanged"  # kept for 30 s after it vanished
    assert world.at(40.0) == "updated"
    assert sorted(world.published()) == ["eth-a"]
    world.at(100.0, ens2=link("ens2", mtu=1500))  # re-created
    assert world.at(102.0) == "updated"
    eth_b = world.published()["eth-b"]
    assert "taints" not in eth_b and eth_b["attributes"]["mtu"] == {"int": 1500}
    assert world.server.invalid == []


def test_a_restarted_agent_keeps_a_missing_nic_with_the_attributes_it_published(world):
    world.at(0.0, ens2=link("ens2", mtu=9000))
    fresh = World(world.server, world.pub.api)  # a new agent: nothing in memory
    fresh.host["ens2"] = None
    assert fresh.at(5.0) == "updated"
    assert fresh.published()["eth-b"]["attributes"]["mtu"] == {"int": 9000}
    assert fresh.published()["eth-b"]["taints"][0]["value"] == "missing"


def test_a_restarted_agent_keeps_the_time_a_published_taint_was_added(world):
    world.at(0.0)
    world.at(10.0, ens2=link("ens2", operstate="DOWN"))
    world.at(12.0)
    generation = world.generation()
    fresh = World(world.server, world.pub.api)  # restarted at t=500: its first reading is "down"
    fresh.host["ens2"] = link("ens2", operstate="DOWN")
    assert fresh.at(500.0) == "unchanged"  # no new timeAdded, no new generation
    assert taints(fresh.published()["eth-b"])[0]["timeAdded"] == utc("2027-01-15T08:00:10Z")
    assert fresh.generation() == generation


def test_no_execute_when_asked():
    with FakeApiServer() as server:
        server.add_node("node-1")
        api = KubeApi.from_config(host=server.url)
        w = World(server, api, effect="NoExecute")
        w.at(0.0, ens2=link("ens2", operstate="DOWN"))
        assert [t["effect"] for t in w.published()["eth-b"]["taints"]] == ["NoExecute"]
        assert server.invalid == []
        api.close()
    with pytest.raises(ValueError, match="NoEvict"):
        Publisher(None, node_name="n", inventory=dict, link=lambda n: None, taint_effect="NoEvict")  # type: ignore[arg-type]
