"""ADD applies the device profile stored with the pod's prepared allocation result: the link
is made from the network config with the profile laid over it (node conflist < DeviceClass <
claim), checked again against this network's own limits; a result whose config did not
validate is refused; the attachment records what the profile made of the link, which CHECK,
``cni-dra status`` and the claim's status entry show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni_dra.errors import ClaimError
from cni_dra.protocol.config import load_conf
from cni_dra.protocol.env import parse_env
from cni_dra.protocol.profile import ProfileLimits
from cni_dra.state import NodeState, StateStore
from cni_dra.state.preparing import prepare_claim
from tests.builders import (
    DRIVER,
    allocation_result,
    attachment,
    cni_env,
    device,
    netconf_bytes,
    profile_config,
    resource_claim,
    write_slice,
)
from tests.fake_host import FakeHost

POD = "pod-1"
SHARE = "6f1d7a62-3b0e-4b7e-9a51-0c7b3d0e2f11"
OPEN = ProfileLimits(allowMac=True, allowShapingOff=True)


class _Parent:
    def __init__(self, mtu: int = 9000, mac: str = "02:00:00:00:00:aa") -> None:
        self.mtu, self.mac = mtu, mac


def _prepared(
    tmp_path: Path, *config: dict[str, Any], limits: ProfileLimits = OPEN, request: str = "eth0"
) -> NodeState:
    state_dir = tmp_path / "st"
    result = allocation_result("a", request=request, consumed={"bandwidth": "1G"}, share_id=SHARE)
    claim = resource_claim(result, uid="u-1", name="web", namespace="prod", config=list(config))
    assert prepare_claim(str(state_dir), POD, claim, driver=DRIVER, limits=limits)
    return StateStore(str(state_dir)).read()


def _inv(tmp_path: Path, **conf: Any):
    from cni_dra.attach.invocation import Invocation

    inventory = write_slice(tmp_path / "slice.json", [device("a"), device("b")])
    raw = netconf_bytes(inventory=str(inventory), stateDir=str(tmp_path / "st"), **conf)
    env = parse_env(cni_env(args=f"K8S_POD_UID={POD};K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web"))
    host = FakeHost()
    host.add_nic("if-a", 2, mtu=9000)
    host.add_nic("if-b", 3, mtu=9000)
    return Invocation(env=env, conf=load_conf(raw, env), raw=raw, port=host)


def _plan(inv, state: NodeState):
    from cni_dra.attach.plan import effective_invocation, plan

    return plan(effective_invocation(inv, state), state, {"if-a": _Parent(), "if-b": _Parent()})


def test_without_a_profile_the_conflist_makes_the_link(tmp_path: Path) -> None:
    state = _prepared(tmp_path)
    inv = _inv(tmp_path, mode="private", mtu=1400)
    att, conf = _plan(inv, state)
    assert conf is inv.conf
    assert (att.linkType, att.profile, att.device) == ("macvlan", None, "a")


def test_the_claims_profile_is_laid_over_the_conflist(tmp_path: Path) -> None:
    state = _prepared(
        tmp_path,
        profile_config("FromClass", linkType="ipvlan", mode="l3"),
        profile_config("FromClaim", requests=["eth0"], mtu=9000),
    )
    att, conf = _plan(_inv(tmp_path, mode="private", mtu=1400), state)
    assert (conf.linkType, conf.mode, conf.ipvlanFlag, conf.mtu) == ("ipvlan", "l3", "bridge", 9000)
    assert att.linkType == "ipvlan"
    assert att.profile == {
        "linkType": "ipvlan",
        "mode": "l3",
        "ipvlanFlag": "bridge",
        "mtu": 9000,
        "shaping": True,
        "fromConfig": ["linkType", "mode", "mtu"],
    }


def test_a_profile_keeps_the_conflists_fields_it_does_not_set(tmp_path: Path) -> None:
    state = _prepared(tmp_path, profile_config("FromClaim", mtu=9000))
    att, conf = _plan(_inv(tmp_path, mode="private", mtu=1400), state)
    assert (conf.linkType, conf.mode, conf.mtu) == ("macvlan", "private", 9000)
    assert att.profile["fromConfig"] == ["mtu"]


def test_a_claim_profile_with_a_fixed_mac_and_shaping_off(tmp_path: Path) -> None:
    state = _prepared(
        tmp_path,
        profile_config("FromClaim", linkType="macvlan", mac="02:00:00:00:00:42", shaping={"enabled": False}),
    )
    _, conf = _plan(_inv(tmp_path, profiles={"allowMac": True, "allowShapingOff": True}), state)
    assert (conf.mac, conf.shaping) == ("02:00:00:00:00:42", None)


@pytest.mark.parametrize(
    ("limits", "needle"),
    [
        ({"allowedLinkTypes": ["macvlan"]}, "linkType ipvlan is not allowed on this node"),
        ({"maxMtu": 1500}, "mtu 9000 is above this node's limit (profiles.maxMtu: 1500)"),
    ],
)
def test_add_checks_the_profile_against_its_own_conflists_limits(tmp_path: Path, limits, needle) -> None:
    # prepared under open limits (another conflist, or none); this network's are stricter
    state = _prepared(tmp_path, profile_config("FromClaim", linkType="ipvlan", mode="l3", mtu=9000))
    with pytest.raises(ClaimError) as info:
        _plan(_inv(tmp_path, profiles=limits), state)
    assert info.value.code == 101
    assert "claim prod/web request 'eth0'" in info.value.msg and needle in info.value.msg


def test_a_fixed_mac_needs_this_networks_permission(tmp_path: Path) -> None:
    state = _prepared(tmp_path, profile_config("FromClaim", linkType="macvlan", mac="02:00:00:00:00:42"))
    with pytest.raises(ClaimError, match=r"profiles.allowMac: false"):
        _plan(_inv(tmp_path), state)


def test_a_result_whose_config_did_not_validate_is_refused(tmp_path: Path) -> None:
    from cni_dra.state.txn import Txn

    # a claim stored by a cni-dra without profiles: its config reaches ADD unchecked
    result = allocation_result("a", request="eth0", consumed={"bandwidth": "1G"}, share_id=SHARE)
    bad = resource_claim(
        result,
        uid="u-1",
        name="web",
        namespace="prod",
        config=[profile_config("FromClaim", linkType="ipvlan", mac="02:00:00:00:00:42")],
    )
    txn = Txn(NodeState())
    txn.set_claims(POD, [bad])
    with pytest.raises(ClaimError) as info:
        _plan(_inv(tmp_path), txn.state)
    assert info.value.code == 101
    assert "its device configuration is not valid" in info.value.msg and "mac cannot be set" in info.value.msg


def test_the_profiles_link_type_is_the_one_checked_against_the_nic(tmp_path: Path) -> None:
    # the NIC carries macvlan links; the conflist says macvlan but the profile asks ipvlan
    from cni_dra.state.txn import Txn

    state = _prepared(tmp_path, profile_config("FromClass", linkType="ipvlan", mode="l3"))
    txn = Txn(state)
    txn.put(attachment("other", "a", linkType="macvlan", consumedCapacity={"bandwidth": "1G"}))
    with pytest.raises(ClaimError, match=r"carries macvlan links, so it cannot take ipvlan"):
        _plan(_inv(tmp_path), txn.state)


def test_the_profiles_mtu_is_checked_against_the_parent(tmp_path: Path) -> None:
    from cni_dra.attach.plan import effective_invocation
    from cni_dra.verbs.add import _reserve

    state = _prepared(tmp_path, profile_config("FromClaim", mtu=9000))
    inv = effective_invocation(_inv(tmp_path), state)
    with pytest.raises(ClaimError) as info:  # the claim asked it, not the conflist: the message says so
        _reserve(inv, {"if-a": _Parent(mtu=1500), "if-b": _Parent(mtu=1500)}, (1, 2))
    assert info.value.code == 101 and info.value.msg == (
        "failed to honour claim prod/web request 'eth0': its device profile asks mtu 9000, above the MTU 1500 "
        "of the allocated parent if-a (device a)"
    )
    assert StateStore(str(tmp_path / "st")).read().attachments == ()


def test_the_reserved_intent_carries_the_profiles_config(tmp_path: Path) -> None:
    from cni_dra.attach.plan import effective_invocation
    from cni_dra.verbs.add import _reserve

    state = _prepared(tmp_path, profile_config("FromClaim", mtu=9000))
    inv = _inv(tmp_path)
    store = inv.store  # loaded before: the effective invocation shares it
    effective = effective_invocation(inv, state)
    intent = _reserve(effective, {"if-a": _Parent(), "if-b": _Parent()}, (1, 2))
    assert intent.inv is effective  # the one config of the ADD, not rebuilt under the lock
    assert effective.conf.mtu == 9000 and inv.conf.mtu is None
    assert effective.raw == inv.raw  # IPAM keeps the runtime's config
    assert effective.store is store
    (att,) = StateStore(str(tmp_path / "st")).read().attachments
    assert att.profile["mtu"] == 9000 and att.phase == "adding"


def test_status_shows_the_effective_profile(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from cni_dra.cli import cli

    inventory = write_slice(tmp_path / "slice.json", [device("a")])
    prof = {
        "linkType": "ipvlan",
        "mode": "l3",
        "ipvlanFlag": "bridge",
        "mtu": 9000,
        "shaping": True,
        "fromConfig": ["linkType", "mode", "mtu"],
    }
    store = StateStore(str(tmp_path / "st"))
    with store.transaction() as txn:
        txn.put(attachment("c1", "a", linkType="ipvlan", consumedCapacity={"bandwidth": "1G"}, profile=prof))
        txn.put(attachment("c2", "a", ifname="eth1", consumedCapacity={"bandwidth": "1G"}))
    args = ["status", "--state-dir", str(tmp_path / "st"), "--inventory", str(inventory)]
    table = CliRunner().invoke(cli, args)
    assert table.exit_code == 0, table.output
    assert "ipvlan/l3/bridge mtu=9000 (profile: linkType,mode,mtu)" in table.output
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    by_cid = {a["containerID"]: a for a in doc["attachments"]}
    assert by_cid["c1"]["profile"] == prof and by_cid["c1"]["linkType"] == "ipvlan"
    assert by_cid["c2"]["profile"] is None and by_cid["c2"]["linkType"] == "macvlan"


def test_the_claim_status_entry_carries_the_profile(tmp_path: Path) -> None:
    from cni_dra.agent.status_writer import claim_status_body
    from cni_dra.state.schema import ClaimRef
    from cni_dra.state.txn import Txn

    prof = {"linkType": "macvlan", "mode": "bridge", "mtu": 9000, "shaping": True, "fromConfig": ["mtu"]}
    txn = Txn(NodeState())
    txn.put(
        attachment(
            "c1",
            "a",
            podUID=POD,
            shareID=SHARE,
            consumedCapacity={"bandwidth": "1G"},
            profile=prof,
            claim=ClaimRef(namespace="prod", name="web", uid="u-1", request="eth0"),
            result={
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": "/var/run/netns/x"}],
            },
        )
    )
    body = claim_status_body({"namespace": "prod", "name": "web", "uid": "u-1"}, txn.state, [])
    (entry,) = body["status"]["devices"]
    assert entry["data"] == {
        "apiVersion": "net.cni-dra.dev/v1alpha1",
        "kind": "InterfaceStatus",
        "linkType": "macvlan",
        "parentInterface": "if-a",
        "profile": prof,
    }


class _Stop(Exception):
    pass


def test_add_reads_its_effective_config_once_and_every_step_sees_it(tmp_path: Path, monkeypatch) -> None:
    """From its first step on, ADD works with one invocation: the device profile already
    merged into the config (not the runtime's config first and the profile's after the
    reservation). The machine is the in-memory host; the verb's own steps are spied on
    (monkeypatch: they are functions of the verb, not of the machine) to record the
    invocation each one is given, and the ADD is stopped at its reservation."""
    import cni_dra.attach.device_profile
    import cni_dra.attach.recover
    import cni_dra.verbs.add as add

    _prepared(tmp_path, profile_config("FromClaim", mtu=9000))
    runtime = _inv(tmp_path)
    seen: list[Any] = []
    merges: list[Any] = []
    real_conf_for = cni_dra.attach.device_profile.conf_for

    def conf_for(inv, picked):
        merges.append(picked)
        return real_conf_for(inv, picked)

    def reserve(inv, host_links, ident):
        seen.append(("reserve", inv))
        raise _Stop

    monkeypatch.setattr(cni_dra.attach.device_profile, "conf_for", conf_for)
    monkeypatch.setattr(cni_dra.attach.recover, "recover_pending", lambda inv: seen.append(("recover", inv)))
    monkeypatch.setattr(add, "_reserve_after_recovery", reserve)
    with pytest.raises(_Stop):
        add.cmd_add(runtime)
    assert [step for step, _ in seen] == ["recover", "reserve"]
    (first, inv), (_, later) = seen
    assert inv is later  # one object from the first step to the reservation
    assert inv.conf.mtu == 9000 and runtime.conf.mtu is None  # the profile's, merged before parsing
    assert len(merges) == 1  # merged and parsed once
