"""The parameters type of cni-dra's DRA configuration (net.cni-dra.dev/v1alpha1 InterfaceConfig):
strict, every field checked, errors that name the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cni_dra.errors import InvalidConfigError
from cni_dra.iface import CONFIG_MACVLAN_MODES, IPVLAN_FLAGS, IPVLAN_MODES
from cni_dra.protocol.profile import (
    API_VERSION,
    KIND,
    InterfaceProfile,
    ShapingProfile,
    parse_interface_config,
)

HEAD = {"apiVersion": API_VERSION, "kind": KIND}


def parse(**fields):
    return parse_interface_config({**HEAD, **fields})


def refused(**fields) -> str:
    with pytest.raises(InvalidConfigError) as exc:
        parse(**fields)
    assert exc.value.code == 7
    return exc.value.msg


def test_the_smallest_config_sets_nothing():
    cfg = parse()
    assert cfg.profile() == InterfaceProfile()
    assert cfg.profile().set_fields() == {}


def test_every_field_round_trips():
    cfg = parse(
        linkType="ipvlan",
        mode="l3",
        ipvlanFlag="private",
        mtu=9000,
        shaping={
            "enabled": True,
            "ingressBurstBytes": 262144,
            "egressBurstBytes": 131072,
            "latencySeconds": 0.05,
        },
    )
    assert cfg.profile().set_fields() == {
        "linkType": "ipvlan",
        "mode": "l3",
        "ipvlanFlag": "private",
        "mtu": 9000,
        "shaping": {
            "enabled": True,
            "ingressBurstBytes": 262144,
            "egressBurstBytes": 131072,
            "latencySeconds": 0.05,
        },
    }


@pytest.mark.parametrize("mode", CONFIG_MACVLAN_MODES)
def test_macvlan_modes(mode):
    assert parse(linkType="macvlan", mode=mode).mode == mode


@pytest.mark.parametrize("mode", list(IPVLAN_MODES))
@pytest.mark.parametrize("flag", list(IPVLAN_FLAGS))
def test_ipvlan_modes_and_flags(mode, flag):
    cfg = parse(linkType="ipvlan", mode=mode, ipvlanFlag=flag)
    assert (cfg.mode, cfg.ipvlanFlag) == (mode, flag)


def test_the_mac_is_kept_lower_case():
    assert parse(linkType="macvlan", mac="02:AB:cd:00:00:01").mac == "02:ab:cd:00:00:01"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"linkType": "vxlan"}, "linkType: 'vxlan' is not supported (supported: macvlan, ipvlan)"),
        ({"linkType": "macvlan", "mode": "l3"}, "mode 'l3' is not a macvlan mode"),
        ({"linkType": "macvlan", "mode": "source"}, "mode 'source' is not a macvlan mode"),
        (
            {"linkType": "ipvlan", "mode": "bridge"},
            "mode 'bridge' is not an ipvlan mode (one of l2, l3, l3s)",
        ),
        ({"mode": "fast"}, "mode 'fast' is not a mode"),
        ({"linkType": "ipvlan", "ipvlanFlag": "l2"}, "ipvlanFlag 'l2' is not one of bridge, private, vepa"),
        ({"linkType": "macvlan", "ipvlanFlag": "bridge"}, "ipvlanFlag applies to linkType ipvlan only"),
        ({"linkType": "ipvlan", "mac": "02:00:00:00:00:01"}, "mac cannot be set for linkType ipvlan"),
        ({"mac": "01:00:5e:00:00:01"}, "mac: MAC address '01:00:5e:00:00:01' is multicast"),
        ({"mac": "00:00:00:00:00:00"}, "is all zeros"),
        ({"mac": "02-00-00-00-00-01"}, "malformed MAC address"),
        ({"mtu": 67}, "mtu: Input should be greater than or equal to 68"),
        ({"mtu": 65536}, "mtu: Input should be less than or equal to 65535"),
        ({"mtu": "9000"}, 'mtu: Input should be a valid integer, not "9000"'),
        ({"mtu": 1500.0}, "mtu: Input should be a valid integer, not 1500.0"),
        ({"mtu": True}, "mtu: Input should be a valid integer, not true"),
        ({"linkType": 1}, "linkType: Input should be a valid string"),
        ({"shaping": True}, "shaping: must be an object, not true"),
        ({"shaping": {"enabled": "yes"}}, "shaping.enabled: Input should be a valid boolean"),
        (
            {"shaping": {"ingressBurstBytes": 0}},
            "shaping.ingressBurstBytes: Input should be greater than or equal to 1",
        ),
        (
            {"shaping": {"egressBurstBytes": 2**32}},
            "shaping.egressBurstBytes: Input should be less than or equal to",
        ),
        ({"shaping": {"latencySeconds": 0}}, "shaping.latencySeconds: Input should be greater than 0"),
        (
            {"shaping": {"latencySeconds": 11}},
            "shaping.latencySeconds: Input should be less than or equal to 10",
        ),
        ({"shaping": {"latencySeconds": "0.1"}}, "shaping.latencySeconds: Input should be a valid number"),
        (
            {"shaping": {"enabled": False, "egressBurstBytes": 4096}},
            "overrides cannot go with enabled: false",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_field(fields, words):
    assert words in refused(**fields)


@pytest.mark.parametrize("key", ["master", "parent", "device", "ifName"])
def test_the_parent_nic_cannot_be_named(key):
    msg = refused(**{key: "eth0"})
    assert msg == f"unknown field {key!r} (the parent NIC is the allocated device: a profile cannot name it)"


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"bcqueuelen": 5}, "bcqueuelen"),
        ({"mtus": 9000}, "mtus"),
        ({"shaping": {"rate": "1G"}}, "shaping.rate"),
    ],
)
def test_unknown_fields_are_refused(fields, name):
    assert refused(**fields) == f"unknown field {name!r}"


def test_every_problem_is_named_at_once():
    msg = refused(mtu=1, bogus=True)
    assert "mtu: Input should be greater than or equal to 68" in msg and "unknown field 'bogus'" in msg


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"kind": KIND}, "apiVersion: Field required"),
        ({"apiVersion": API_VERSION}, "kind: Field required"),
        (
            {"apiVersion": "net.cni-dra.dev/v1", "kind": KIND},
            "apiVersion: 'net.cni-dra.dev/v1' is not supported (supported: net.cni-dra.dev/v1alpha1)",
        ),
        (
            {"apiVersion": API_VERSION, "kind": "NetworkConfig"},
            "kind: 'NetworkConfig' is not InterfaceConfig",
        ),
    ],
)
def test_the_type_is_versioned(params, words):
    with pytest.raises(InvalidConfigError) as exc:
        parse_interface_config(params)
    assert words in exc.value.msg


@pytest.mark.parametrize("params", [None, [], "ipvlan", 3])
def test_parameters_must_be_an_object(params):
    with pytest.raises(InvalidConfigError, match="parameters must be an InterfaceConfig object"):
        parse_interface_config(params)


def test_profiles_are_values():
    p = parse(linkType="macvlan", mtu=1500).profile()
    with pytest.raises(ValidationError):
        p.mtu = 9000  # type: ignore[misc]
    assert p == parse(mtu=1500, linkType="macvlan").profile()
    assert hash(ShapingProfile(enabled=True)) == hash(ShapingProfile(enabled=True))


def test_a_profile_without_link_type_takes_any_known_mode():
    # completed by the layers below (checked when all layers are laid over each other)
    assert parse(mode="l3").mode == "l3"
    assert parse(ipvlanFlag="vepa").ipvlanFlag == "vepa"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"shaping": "yes"}, 'shaping: must be an object, not "yes"'),
        ({"mtu": "1400"}, 'mtu: Input should be a valid integer, not "1400"'),
        ({"shaping": {"enabled": "no"}}, 'shaping.enabled: Input should be a valid boolean, not "no"'),
    ],
)
def test_a_value_of_the_wrong_type_is_quoted_back(fields, message) -> None:
    from cni_dra.errors import InvalidConfigError
    from cni_dra.protocol.profile import parse_interface_config

    with pytest.raises(InvalidConfigError) as info:
        parse_interface_config(
            {"apiVersion": "net.cni-dra.dev/v1alpha1", "kind": "InterfaceConfig", **fields}
        )
    assert info.value.msg == message
