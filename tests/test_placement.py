"""Placement as pure functions (no root, no lock, no netlink): claim mode honours the
scheduler's result and charges a shared claim's share once; standalone allocates over
the NICs that exist, are up and take the MTU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cni_dra.attach.placement import Asker, place, place_claim, place_standalone
from cni_dra.dra.objects import ResourceSlice
from cni_dra.errors import ClaimError, InvalidConfigError, NoCapacityError
from cni_dra.protocol.config import load_conf
from cni_dra.quantity import Quantity
from cni_dra.state import ClaimRef, NodeState
from cni_dra.state.schema import PreparedClaim
from tests.builders import (
    allocation_result,
    attachment,
    device,
    netconf_bytes,
    resource_claim,
    resource_slice,
)

SHARE = "0b7d6c5e-4f3a-4b2c-9d1e-0f2a3b4c5d6e"
SLICE = ResourceSlice.model_validate(resource_slice([device("a"), device("b")]))
UP = SimpleNamespace(mtu=1500, admin_up=True, operstate="UP")
LINKS = {"if-a": UP, "if-b": UP}


def asker(pod: str | None = "pod-1", ifname: str = "eth0") -> Asker:
    return Asker(pod, "ns", "p", "c1", ifname)


def conf(**kw):
    base = {"inventory": "/dev/null", "capacity": {"requests": {"bandwidth": "4G"}}}
    return load_conf(netconf_bytes(**(base | kw)))


def claimed(device_name: str = "b", bw: str = "3G", uid: str = "u1"):
    claim = PreparedClaim.decode(
        resource_claim(allocation_result(device_name, consumed={"bandwidth": bw}, share_id=SHARE), uid=uid)
    )
    return claim, claim.results[0]


def test_claim_mode_takes_the_schedulers_device_amount_and_share():
    got = place_claim(NodeState(), SLICE, LINKS, claimed(), "macvlan", asker())
    assert (got.device, got.parent, got.shareID) == ("b", "if-b", SHARE)
    assert got.consumedCapacity == {"bandwidth": Quantity.parse("3G")}
    assert got.claim == ClaimRef(namespace="ns", name="c", uid="u1", request="net")


def test_place_prefers_the_pods_prepared_claim_over_the_config():
    raw = resource_claim(allocation_result("b", consumed={"bandwidth": "3G"}, share_id=SHARE), uid="u1")
    state = NodeState(claims={"pod-1": [raw]})
    assert place(state, SLICE, LINKS, conf(), asker()).device == "b"  # not standalone's 4G pick
    assert place(state, SLICE, LINKS, conf(), asker("pod-2")).claim is None  # another pod: standalone


def holder(cid: str, pod: str, bw: str = "3G"):
    return attachment(
        cid,
        "b",
        podUID=pod,
        shareID=SHARE,
        consumedCapacity={"bandwidth": bw},
        claim=ClaimRef(namespace="ns", name="c", uid="u1", request="net"),
    )


def test_a_claim_shared_by_pods_is_one_share_charged_once():
    # 8G held on b (5G by another pod, 3G by the share): a second pod of the same
    # claim uses the share without a second charge (a fresh 3G would not fit: 8 + 3 > 10)
    state = NodeState(
        attachments=[attachment("x", "b", consumedCapacity={"bandwidth": "5G"}), holder("c1", "pod-1")]
    )
    got = place_claim(state, SLICE, LINKS, claimed(), "macvlan", asker("pod-2"))
    assert got.shareID == SHARE and got.device == "b"
    with pytest.raises(ClaimError, match="already used by interface eth0 of container c1"):
        place_claim(state, SLICE, LINKS, claimed(), "macvlan", asker("pod-1", "net2"))


def test_claim_mode_refusals():
    with pytest.raises(ClaimError, match="not in this node's inventory"):
        place_claim(NodeState(), SLICE, LINKS, claimed("z"), "macvlan", asker())
    with pytest.raises(ClaimError, match="interface if-b does not exist"):
        place_claim(NodeState(), SLICE, {"if-a": UP}, claimed(), "macvlan", asker())
    with pytest.raises(ClaimError, match="cannot take ipvlan"):
        state = NodeState(attachments=[attachment("x", "b", consumedCapacity={"bandwidth": "1G"})])
        place_claim(state, SLICE, LINKS, claimed(), "ipvlan", asker())
    with pytest.raises(ClaimError, match="allocation no longer fits"):
        state = NodeState(attachments=[attachment("x", "b", consumedCapacity={"bandwidth": "8G"})])
        place_claim(state, SLICE, LINKS, claimed(), "macvlan", asker())


def test_standalone_skips_missing_and_down_nics_and_says_why():
    down = SimpleNamespace(mtu=1500, admin_up=True, operstate="DOWN")
    assert place_standalone(NodeState(), SLICE, {"if-b": UP}, conf(), asker()).device == "b"
    with pytest.raises(NoCapacityError) as info:
        place_standalone(NodeState(), SLICE, {"if-a": down}, conf(), asker())
    assert (
        "a: interface if-a is down" in info.value.msg and "b: interface if-b does not exist" in info.value.msg
    )
    assert "for pod ns/p interface eth0" in info.value.msg


def test_standalone_mtu_above_every_nic_is_a_config_error():
    with pytest.raises(InvalidConfigError, match="mtu 9000 is above the MTU of every usable parent NIC"):
        place_standalone(NodeState(), SLICE, LINKS, conf(mtu=9000), asker())


def test_standalone_share_gets_a_fresh_share_id_and_the_requested_amount():
    got = place_standalone(NodeState(), SLICE, LINKS, conf(), asker())
    assert got.consumedCapacity == {"bandwidth": Quantity.parse("4G")} and got.claim is None
    assert got.shareID and got.shareID != place_standalone(NodeState(), SLICE, LINKS, conf(), asker()).shareID
