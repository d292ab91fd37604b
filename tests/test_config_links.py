"""Link options of the config: linkType, mode, ipvlanFlag, mac, bcqueuelen, nodad;
mixed link types kept apart by the allocator; the netlink request for bcqueuelen."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.errors import IncompatibleVersionError, InvalidConfigError, NoCapacityError
from cni_dra.protocol.config import load_conf
from cni_dra.protocol.env import parse_env
from cni_dra.state import Attachment, NodeState
from tests.builders import attachment, cni_env, device, netconf_bytes, write_slice


def _raw(**kw) -> bytes:
    return netconf_bytes(**kw)


def _env(args: str = "") -> object:
    return parse_env(cni_env("ADD", args=args))


def test_ipvlan_defaults() -> None:
    c = load_conf(_raw(linkType="ipvlan"))
    assert (c.linkType, c.mode, c.ipvlanFlag, c.mac, c.bcqueuelen) == ("ipvlan", "l2", "bridge", None, None)


def test_macvlan_defaults() -> None:
    c = load_conf(_raw())
    assert (c.linkType, c.mode, c.ipvlanFlag, c.nodad) == ("macvlan", "bridge", None, False)


@pytest.mark.parametrize("mode", ["l2", "l3", "l3s"])
@pytest.mark.parametrize("flag", ["bridge", "private", "vepa"])
def test_ipvlan_modes_and_flags(mode: str, flag: str) -> None:
    c = load_conf(_raw(linkType="ipvlan", mode=mode, ipvlanFlag=flag))
    assert (c.mode, c.ipvlanFlag) == (mode, flag)


@pytest.mark.parametrize("mode", ["bridge", "private", "vepa", "passthru"])
def test_macvlan_modes(mode: str) -> None:
    assert load_conf(_raw(mode=mode)).mode == mode


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"linkType": "ipvlan", "mode": "bridge"}, "not an ipvlan mode"),
        ({"linkType": "ipvlan", "mode": "passthru"}, "not an ipvlan mode"),
        ({"mode": "l3"}, "not a macvlan mode"),
        ({"mode": "source"}, "not a macvlan mode"),
        ({"ipvlanFlag": "private"}, "ipvlanFlag applies to linkType ipvlan only"),
        ({"linkType": "ipvlan", "ipvlanFlag": "passthru"}, "ipvlanFlag 'passthru'"),
        ({"linkType": "ipvlan", "mac": "c2:00:00:00:00:01"}, "its parent's MAC"),
        ({"linkType": "ipvlan", "bcqueuelen": 10}, "bcqueuelen applies to linkType macvlan only"),
        ({"linkType": "vlan"}, "linkType 'vlan' is not supported"),
        ({"bcqueuelen": -1}, "bcqueuelen"),
        ({"bcqueuelen": 2**32}, "bcqueuelen"),
        ({"dadTimeoutSeconds": 0}, "dadTimeoutSeconds"),
    ],
)
def test_invalid_link_options_are_code_7_naming_the_problem(kw: dict, needle: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        load_conf(_raw(**kw))
    assert info.value.code == 7
    assert needle in info.value.msg


def test_mac_from_cni_args_on_ipvlan_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="parent's MAC"):
        load_conf(_raw(linkType="ipvlan"), _env("IgnoreUnknown=1;MAC=c2:00:00:00:00:09"))


def test_runtime_config_mac_without_capability_is_ignored_even_when_bad() -> None:
    assert load_conf(_raw(runtimeConfig={"mac": "01:00:00:00:00:00"})).mac is None


_hex = st.integers(0, 255)


@given(st.lists(_hex, min_size=6, max_size=6), st.sampled_from(["conf", "args", "runtime"]))
def test_mac_multicast_bit_decides_acceptance(octets: list[int], where: str) -> None:
    mac = ":".join(f"{o:02X}" for o in octets)
    kw: dict = {}
    env = None
    if where == "conf":
        kw["mac"] = mac
    elif where == "args":
        env = _env(f"IgnoreUnknown=1;MAC={mac}")
    else:
        kw.update(runtimeConfig={"mac": mac}, capabilities={"mac": True})
    if octets[0] & 1 or not any(octets):
        with pytest.raises(InvalidConfigError) as info:
            load_conf(_raw(**kw), env)
        assert mac in info.value.msg
    else:
        assert load_conf(_raw(**kw), env).mac == mac.lower()


@pytest.mark.parametrize(
    "bad", ["c2:11:22:33:44", "c2-11-22-33-44-55", "c2:11:22:33:44:5g", "c21122334455", ""]
)
def test_malformed_mac_is_code_7(bad: str) -> None:
    with pytest.raises(InvalidConfigError):
        load_conf(_raw(mac=bad))


# --------------------------------------------------------------------------- mixed link types


def _att(device: str, link_type: str, cid: str = "c", pool: str = "n") -> Attachment:
    return attachment(
        cid, device, pool=pool, linkType=link_type, consumedCapacity={"bandwidth": "0"}
    )  # recorded: an empty record holds the whole NIC


def test_link_type_conflicts_names_devices_with_the_other_type() -> None:
    from cni_dra.verbs.add import link_type_conflicts

    atts = [_att("a", "macvlan", "1"), _att("b", "ipvlan", "2"), _att("c", "macvlan", "3", pool="other")]
    assert set(link_type_conflicts(atts, "ipvlan", "net.cni-dra.dev", "n")) == {"a"}
    assert set(link_type_conflicts(atts, "macvlan", "net.cni-dra.dev", "n")) == {"b"}
    assert "carries macvlan links" in link_type_conflicts(atts, "ipvlan", "net.cni-dra.dev", "n")["a"]
    assert link_type_conflicts(atts, "ipvlan", "other.driver", "n") == {}


class _Parent:
    def __init__(self, mtu: int = 1500, mac: str = "02:00:00:00:00:aa") -> None:
        self.mtu, self.mac = mtu, mac


def _inv(tmp_path: Path, conf: dict, devices: list[str]):
    from cni_dra.attach.invocation import Invocation

    inventory = write_slice(tmp_path / "slice.json", [device(d) for d in devices])
    raw = _raw(inventory=str(inventory), stateDir=str(tmp_path / "st"), **conf)
    return Invocation(env=_env(), conf=load_conf(raw), raw=raw)


def test_allocator_skips_a_nic_of_the_other_type_even_if_best_fit_prefers_it(tmp_path: Path) -> None:
    from cni_dra.attach.plan import plan_attachment

    inv = _inv(tmp_path, {"linkType": "ipvlan", "capacity": {"requests": {"bandwidth": "1G"}}}, ["a", "b"])
    state = NodeState(
        attachments=[_att("a", "macvlan", "1").model_dump() | {"consumedCapacity": {"bandwidth": "5G"}}]
    )  # a has less left: best-fit's pick
    att = plan_attachment(inv, state, {"if-a": _Parent(), "if-b": _Parent()})
    assert att.device == "b" and att.linkType == "ipvlan"


def test_allocator_explains_when_only_the_other_type_has_room(tmp_path: Path) -> None:
    from cni_dra.attach.plan import plan_attachment

    inv = _inv(tmp_path, {"capacity": {"requests": {"bandwidth": "1G"}}}, ["a"])
    state = NodeState(attachments=[_att("a", "ipvlan", "1")])
    with pytest.raises(NoCapacityError) as info:
        plan_attachment(inv, state, {"if-a": _Parent()})
    assert "a: carries ipvlan links, so it cannot take macvlan" in info.value.msg


def test_duplicate_mac_refused_naming_the_holder() -> None:
    from cni_dra.attach.plan import refuse_duplicate_mac

    holder = Attachment.model_validate(
        _att("a", "macvlan", "c-old").model_dump()
        | {"result": {"interfaces": [{"name": "eth0", "mac": "c2:00:00:00:00:01", "sandbox": "/x"}]}}
    )
    new = _att("a", "macvlan", "c-new")
    with pytest.raises(InvalidConfigError) as info:
        refuse_duplicate_mac("c2:00:00:00:00:01", new, _Parent(), NodeState(attachments=[holder]))
    assert "c-old" in info.value.msg
    refuse_duplicate_mac(
        "c2:00:00:00:00:02", new, _Parent(), NodeState(attachments=[holder])
    )  # other MAC: fine
    with pytest.raises(InvalidConfigError, match="address of the parent NIC"):
        refuse_duplicate_mac("02:00:00:00:00:aa", new, _Parent(), NodeState())


# --------------------------------------------------------------------------- ADD refusals before effects


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_l2_only_old_versions_refused_before_reading_anything(tmp_path: Path, version: str) -> None:
    from cni_dra.attach.invocation import Invocation
    from cni_dra.verbs.add import cmd_add

    raw = _raw(cniVersion=version, inventory=str(tmp_path / "missing"), stateDir=str(tmp_path / "st"))
    with pytest.raises(IncompatibleVersionError) as info:
        cmd_add(Invocation(env=_env(), conf=load_conf(raw), raw=raw))
    assert info.value.code == 1
    assert not (tmp_path / "st").exists()


def test_dhcp_socket_absent_is_code_11_before_any_effect(tmp_path: Path) -> None:
    from cni_dra.attach.invocation import Invocation
    from cni_dra.errors import TryAgainLaterError
    from cni_dra.verbs.add import cmd_add

    sock = str(tmp_path / "dhcp.sock")
    raw = _raw(
        ipam={"type": "dhcp", "daemonSocketPath": sock},
        inventory=str(tmp_path / "missing"),
        stateDir=str(tmp_path / "st"),
    )
    with pytest.raises(TryAgainLaterError) as info:
        cmd_add(Invocation(env=_env(), conf=load_conf(raw), raw=raw))
    assert sock in info.value.msg
    assert not (tmp_path / "st").exists()


def test_dhcp_socket_check_sees_a_real_socket(tmp_path: Path) -> None:
    import socket

    from cni_dra.verbs.status import dhcp_socket_missing

    path = str(tmp_path / "d.sock")
    assert dhcp_socket_missing({"type": "dhcp", "daemonSocketPath": path}) == path
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        assert dhcp_socket_missing({"type": "dhcp", "daemonSocketPath": path}) is None
    assert dhcp_socket_missing({"type": "host-local"}) is None


# --------------------------------------------------------------------------- netlink request


def test_macvlan_newlink_carries_bcqueuelen() -> None:
    from pyroute2.iproute.linux import IPBatch
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    from cni_dra.netlink import _pyroute2, sublink

    _pyroute2.load()
    spec = sublink.SubLinkSpec.macvlan(parent="p", netns="/nonexistent", ifname="t", bcqueuelen=4321).newlink(
        parent_index=4, netns_fd=5
    )
    ipb = IPBatch()
    try:
        ipb.link("add", ifname="t", **spec)
        data = bytes(ipb.batch)
    finally:
        ipb.close()
    msg = ifinfmsg(data)
    msg.decode()
    info = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
    assert info.get_attr("IFLA_MACVLAN_BC_QUEUE_LEN") == 4321
    # <linux/if_link.h>: IFLA_MACVLAN_BC_QUEUE_LEN is attribute 7 of the macvlan data
    # (struct nlattr: u16 length 8, u16 type 7, then the u32 value).
    assert b"\x08\x00\x07\x00" + (4321).to_bytes(4, "little") in data


@pytest.mark.parametrize("bad", [-1, 2**32, True, "10"])
def test_create_macvlan_refuses_bad_bcqueuelen(bad) -> None:
    from cni_dra.netlink import sublink

    with pytest.raises(InvalidConfigError, match="bcqueuelen"):
        sublink.create_macvlan(parent="p", netns="/nonexistent", ifname="eth0", bcqueuelen=bad)


# --------------------------------------------------------------------------- IPAM codes


@pytest.mark.parametrize("given,want", [(999, 103), (11, 11), (50, 50), (None, 103)])
def test_ipam_catch_all_becomes_103_other_codes_stay(given, want) -> None:
    from cni_dra.attach.invocation import ipam_codes
    from cni_dra.errors import IpamError

    with pytest.raises(IpamError) as info, ipam_codes():
        raise IpamError("failed to add IPAM x: boom", code=given)
    assert info.value.code == want
    assert "boom" in info.value.msg


@given(
    placed=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["macvlan", "ipvlan"])), max_size=6
    ),
    link_type=st.sampled_from(["macvlan", "ipvlan"]),
    policy=st.sampled_from(["best-fit", "least-allocated"]),
)
def test_reserve_never_mixes_link_types_on_a_nic(tmp_path_factory, placed, link_type, policy) -> None:
    from cni_dra.attach.plan import plan_attachment

    inv = _inv(
        tmp_path_factory.mktemp("inv"), {"linkType": link_type, "selectionPolicy": policy}, ["a", "b", "c"]
    )
    state = NodeState(attachments=[_att(dev, lt, str(i)) for i, (dev, lt) in enumerate(placed)])
    parents = {f"if-{d}": _Parent() for d in "abc"}
    other = {dev for dev, lt in placed if lt != link_type}
    try:
        att = plan_attachment(inv, state, parents)
    except NoCapacityError as exc:
        assert other == {"a", "b", "c"}, exc.msg  # refused only when every NIC has the other type
        assert all(f"{d}: carries" in exc.msg for d in "abc")
    else:
        assert att.device not in other
