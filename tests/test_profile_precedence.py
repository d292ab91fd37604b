"""Which profile each allocation result gets: node conflist < DeviceClass config < claim config,
later entries winning, per-request targeting, other drivers ignored; and the node's limits."""

from __future__ import annotations

import json

import pytest

from cni_dra.errors import InvalidConfigError, IOFailureError
from cni_dra.protocol.profile import (
    InterfaceProfile,
    ProfileLimits,
    ShapingProfile,
    applies_to,
    apply_to_netconf,
    check_limits,
    claim_profiles,
    decode_result_profile,
    driver_entries,
    limits_from_conflist,
    load_limits,
    overlay,
    result_profile,
    strictest,
)
from tests.builders import DRIVER, allocation_result, profile_config, resource_claim

OPEN = ProfileLimits(allowMac=True, allowShapingOff=True)


def resolve(config, request="net1", share_id=None):
    return result_profile(driver_entries(config, DRIVER), request, share_id)


# -- precedence -------------------------------------------------------------------------------
def test_no_config_no_profile():
    assert resolve(None) is None
    assert resolve([]) is None


def test_the_claim_wins_over_its_class():
    config = [
        profile_config("FromClass", linkType="ipvlan", mode="l3", mtu=1500),
        profile_config("FromClaim", mtu=9000),
    ]
    assert resolve(config) == InterfaceProfile(linkType="ipvlan", mode="l3", mtu=9000)


def test_the_class_is_lower_even_when_listed_after_the_claim():
    config = [profile_config("FromClaim", mtu=9000), profile_config("FromClass", mtu=1500)]
    assert resolve(config).mtu == 9000


def test_later_entries_of_one_source_win():
    config = [
        profile_config("FromClaim", mtu=9000),
        profile_config("FromClaim", mtu=4000),
        profile_config("FromClass", mtu=1400),
        profile_config("FromClass", mtu=1300),
    ]
    assert resolve(config).mtu == 4000
    assert resolve(config[2:]).mtu == 1300


def test_fields_merge_one_by_one():
    config = [
        profile_config("FromClass", linkType="macvlan", mode="private", shaping={"ingressBurstBytes": 1000}),
        profile_config("FromClaim", mtu=9000, shaping={"egressBurstBytes": 2000}),
    ]
    assert resolve(config) == InterfaceProfile(
        linkType="macvlan",
        mode="private",
        mtu=9000,
        shaping=ShapingProfile(ingressBurstBytes=1000, egressBurstBytes=2000),
    )


def test_another_link_type_drops_the_options_of_the_first():
    config = [
        profile_config("FromClass", linkType="macvlan", mode="private", mac="02:00:00:00:00:01"),
        profile_config("FromClaim", linkType="ipvlan"),
    ]
    assert resolve(config) == InterfaceProfile(linkType="ipvlan")


def test_the_same_link_type_keeps_the_mode():
    config = [
        profile_config("FromClass", linkType="ipvlan", mode="l3s", ipvlanFlag="vepa"),
        profile_config("FromClaim", linkType="ipvlan", mtu=9000),
    ]
    assert resolve(config) == InterfaceProfile(linkType="ipvlan", mode="l3s", ipvlanFlag="vepa", mtu=9000)


def test_shaping_off_drops_the_lower_overrides():
    config = [
        profile_config("FromClass", shaping={"ingressBurstBytes": 1000, "latencySeconds": 0.1}),
        profile_config("FromClaim", shaping={"enabled": False}),
    ]
    assert resolve(config).shaping == ShapingProfile(enabled=False)


@pytest.mark.parametrize(
    ("requests", "request_name", "applies"),
    [
        ([], "net1", True),
        (["net1"], "net1", True),
        (["net2"], "net1", False),
        (["net1"], "net1/fast", True),  # a main request covers its subrequests
        (["net1/fast"], "net1/fast", True),
        (["net1/slow"], "net1/fast", False),
        (["net1/fast"], "net1", False),
        (["net"], "net1", False),
    ],
)
def test_request_targeting(requests, request_name, applies):
    assert applies_to(requests, request_name) is applies


def test_each_request_gets_its_own_entries():
    config = [
        profile_config("FromClass", linkType="macvlan"),
        profile_config("FromClaim", requests=["fast"], mtu=9000),
        profile_config("FromClaim", requests=["slow"], shaping={"egressBurstBytes": 4096}),
    ]
    assert resolve(config, "fast") == InterfaceProfile(linkType="macvlan", mtu=9000)
    assert resolve(config, "slow") == InterfaceProfile(
        linkType="macvlan", shaping=ShapingProfile(egressBurstBytes=4096)
    )
    assert resolve(config, "other") == InterfaceProfile(linkType="macvlan")
    assert resolve(config[1:], "other") is None


def test_other_drivers_are_ignored_even_when_not_ours_to_parse():
    config = [
        profile_config("FromClaim", mtu=9000),
        {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {"sharing": "time"}}},
        {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": "not even an object"}},
        {"source": "Elsewhere", "opaque": {"driver": "gpu.example.com", "parameters": {}}},
        {"source": "FromClaim"},
    ]  # not opaque: a kind of config this driver does not read
    assert resolve(config) == InterfaceProfile(mtu=9000)
    assert [e.index for e in driver_entries(config, DRIVER)] == [0]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (
            {**profile_config(), "source": "FromNode"},
            "config[0] (FromNode): source 'FromNode' is not one of FromClass, FromClaim",
        ),
        (
            {**profile_config(), "requests": "net1"},
            "config[0] (FromClaim): requests must be a list of request names",
        ),
        ({**profile_config(), "requests": [""]}, "requests must be a list of request names"),
        (
            profile_config(requests=["net1"], mtu=1),
            "config[0] (FromClaim, requests net1): mtu: Input should be greater",
        ),
        (
            {"source": "FromClass", "opaque": {"driver": DRIVER}},
            "config[0] (FromClass): parameters must be an",
        ),
    ],
)
def test_a_bad_entry_of_this_driver_is_named(entry, words):
    with pytest.raises(InvalidConfigError) as exc:
        driver_entries([entry], DRIVER)
    assert words in exc.value.msg


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (
            [profile_config("FromClass", mode="l3")],
            "mode set without linkType (they depend on it: name linkType in this config entry or in one below it, "
            "e.g. the DeviceClass's), in config[0] (FromClass)",
        ),
        ([profile_config("FromClass", mac="02:00:00:00:00:01")], "mac set without linkType"),
        (
            [profile_config("FromClass", linkType="ipvlan"), profile_config("FromClaim", mode="bridge")],
            "mode 'bridge' is not an ipvlan mode (one of l2, l3, l3s) (after config[1] (FromClaim))",
        ),
        (
            [
                profile_config("FromClass", linkType="ipvlan"),
                profile_config("FromClaim", mac="02:00:00:00:00:01"),
            ],
            "mac cannot be set for linkType ipvlan",
        ),
        (
            [profile_config("FromClass", mode="l3"), profile_config("FromClaim", linkType="macvlan")],
            "mode 'l3' is not a macvlan mode",
        ),
    ],
)
def test_the_layers_must_make_one_complete_interface(config, words):
    with pytest.raises(InvalidConfigError) as exc:
        resolve(config)
    assert words in exc.value.msg


def test_a_mode_completed_by_a_later_link_type_is_fine():
    config = [profile_config("FromClass", mode="l3"), profile_config("FromClaim", linkType="ipvlan")]
    assert resolve(config) == InterfaceProfile(linkType="ipvlan", mode="l3")


def test_passthru_needs_a_whole_device():
    config = [profile_config("FromClass", linkType="macvlan", mode="passthru")]
    assert resolve(config).mode == "passthru"
    with pytest.raises(
        InvalidConfigError, match="'passthru' takes the whole NIC.*in config\\[0\\] \\(FromClass\\)"
    ):
        resolve(config, share_id="3b9f0c1e-7a2d-4c5b-9e8f-1a2b3c4d5e6f")


def test_overlay_is_associative_on_fields_it_sets():
    a = InterfaceProfile(linkType="macvlan", mode="vepa", mtu=1500)
    b = InterfaceProfile(mtu=9000, shaping=ShapingProfile(ingressBurstBytes=5))
    c = InterfaceProfile(shaping=ShapingProfile(egressBurstBytes=6))
    assert overlay(overlay(a, b), c) == overlay(a, overlay(b, c))
    assert overlay(a, InterfaceProfile()) == a
    assert overlay(InterfaceProfile(), a) == a


# -- limits ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("profile", "limits", "words"),
    [
        (
            InterfaceProfile(linkType="ipvlan"),
            ProfileLimits(allowedLinkTypes=("macvlan",)),
            "linkType ipvlan is not allowed on this node (profiles.allowedLinkTypes: macvlan)",
        ),
        (
            InterfaceProfile(linkType="macvlan"),
            ProfileLimits(allowedLinkTypes=()),
            "linkType macvlan is not allowed on this node (profiles.allowedLinkTypes: none)",
        ),
        (
            InterfaceProfile(mtu=9000),
            ProfileLimits(maxMtu=1500),
            "mtu 9000 is above this node's limit (profiles.maxMtu: 1500)",
        ),
        (
            InterfaceProfile(linkType="macvlan", mac="02:00:00:00:00:01"),
            ProfileLimits(),
            "mac 02:00:00:00:00:01 is fixed, which this node does not allow (profiles.allowMac: false)",
        ),
        (
            InterfaceProfile(shaping=ShapingProfile(enabled=False)),
            ProfileLimits(),
            "shaping.enabled false is not allowed on this node (profiles.allowShapingOff: false)",
        ),
        (
            InterfaceProfile(shaping=ShapingProfile(egressBurstBytes=10**6)),
            ProfileLimits(maxBurstBytes=65536),
            "shaping.egressBurstBytes 1000000 is above this node's limit (profiles.maxBurstBytes: 65536)",
        ),
        (
            InterfaceProfile(shaping=ShapingProfile(ingressBurstBytes=65537)),
            ProfileLimits(maxBurstBytes=65536),
            "shaping.ingressBurstBytes 65537 is above",
        ),
    ],
)
def test_each_limit(profile, limits, words):
    with pytest.raises(InvalidConfigError) as exc:
        check_limits(profile, limits)
    assert exc.value.code == 7
    assert words in exc.value.msg


@pytest.mark.parametrize(
    "profile",
    [
        InterfaceProfile(),
        InterfaceProfile(linkType="ipvlan", mode="l3", mtu=9000),
        InterfaceProfile(mtu=1500),
        InterfaceProfile(shaping=ShapingProfile(enabled=True, ingressBurstBytes=65536)),
    ],
)
def test_within_the_limits(profile):
    check_limits(profile, ProfileLimits(maxMtu=9000, maxBurstBytes=65536))


def test_the_defaults_allow_link_types_and_mtu_but_no_mac_and_no_shaping_off():
    lim = ProfileLimits()
    assert (lim.allowedLinkTypes, lim.maxMtu, lim.allowMac, lim.allowShapingOff, lim.maxBurstBytes) == (
        ("macvlan", "ipvlan"),
        None,
        False,
        False,
        None,
    )


def test_every_breach_is_named_with_where_it_was_asked():
    with pytest.raises(InvalidConfigError) as exc:
        check_limits(
            InterfaceProfile(linkType="ipvlan", mtu=9000),
            ProfileLimits(allowedLinkTypes=("macvlan",), maxMtu=1500),
            {"mtu": "config[1] (FromClaim)"},
        )
    assert exc.value.msg == (
        "linkType ipvlan is not allowed on this node (profiles.allowedLinkTypes: macvlan); "
        "mtu 9000 is above this node's limit (profiles.maxMtu: 1500), asked by config[1] (FromClaim)"
    )


@pytest.mark.parametrize(
    ("profiles", "words"),
    [
        ({"maxMTU": 9000}, "unknown field 'maxMTU'"),
        ({"allowedLinkTypes": ["vxlan"]}, "'vxlan' is not a link type"),
        ({"allowedLinkTypes": "macvlan"}, "allowedLinkTypes: Input should be a valid tuple"),
        ({"allowMac": "yes"}, "allowMac: Input should be a valid boolean"),
        ({"maxMtu": 10}, "maxMtu: Input should be greater than or equal to 68"),
        (None, "profiles: must be an object, not null"),
    ],
)
def test_bad_limits_are_refused(profiles, words):
    conflist = {"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "cni-dra", "profiles": profiles}]}
    with pytest.raises(InvalidConfigError) as exc:
        limits_from_conflist(conflist, "/etc/cni/net.d/10.conflist")
    assert exc.value.msg.startswith("invalid network config /etc/cni/net.d/10.conflist: profiles: ")
    assert words in exc.value.msg


def test_limits_from_conflists(tmp_path):
    a = tmp_path / "10.conflist"
    a.write_text(
        json.dumps(
            {
                "cniVersion": "1.1.0",
                "name": "a",
                "plugins": [
                    {
                        "type": "cni-dra",
                        "profiles": {"maxMtu": 9000, "allowMac": True, "allowShapingOff": True},
                    },
                    {"type": "tuning"},
                ],
            }
        )
    )
    b = tmp_path / "20.conf"
    b.write_text(
        json.dumps(
            {
                "cniVersion": "1.1.0",
                "name": "b",
                "type": "cni-dra",
                "profiles": {
                    "allowedLinkTypes": ["ipvlan"],
                    "maxMtu": 4000,
                    "allowMac": True,
                    "maxBurstBytes": 1 << 20,
                },
            }
        )
    )
    assert load_limits([str(a)]) == ProfileLimits(maxMtu=9000, allowMac=True, allowShapingOff=True)
    assert load_limits([str(a), str(b)]) == ProfileLimits(
        allowedLinkTypes=("ipvlan",), maxMtu=4000, allowMac=True, allowShapingOff=False, maxBurstBytes=1 << 20
    )
    assert load_limits([]) == ProfileLimits()
    c = tmp_path / "30.conflist"
    c.write_text(json.dumps({"cniVersion": "1.1.0", "name": "c", "plugins": [{"type": "cni-dra"}]}))
    assert load_limits([str(c)]) == ProfileLimits()


def test_strictest_of_none_is_the_default():
    assert strictest([]) == ProfileLimits()
    assert strictest([OPEN]) == OPEN


@pytest.mark.parametrize(
    ("text", "err", "words"),
    [
        (None, IOFailureError, "failed to read network config"),
        ("{", InvalidConfigError, "not valid JSON"),
        ("[]", InvalidConfigError, "top level must be a JSON object"),
        ('{"plugins": [{"type": "macvlan"}]}', InvalidConfigError, "it has no cni-dra plugin entry"),
    ],
)
def test_unreadable_conflists(tmp_path, text, err, words):
    path = tmp_path / "x.conflist"
    if text is not None:
        path.write_text(text)
    with pytest.raises(err, match=words):
        load_limits([str(path)])


# -- the whole claim, as prepare sees it ------------------------------------------------------
def claim(*config, results=None):
    results = results or [allocation_result("nic-a", request="net1")]
    return resource_claim(*results, name="web", namespace="prod", config=list(config))


def test_claim_profiles_per_request():
    c = claim(
        profile_config("FromClass", linkType="ipvlan", mode="l3"),
        profile_config("FromClaim", requests=["net2"], mtu=9000),
        results=[
            allocation_result("nic-a", request="net1"),
            allocation_result("nic-b", request="net2"),
            allocation_result("gpu-0", request="gpu", driver="gpu.example.com"),
        ],
    )
    assert claim_profiles(c, DRIVER, ProfileLimits()) == {
        "net1": InterfaceProfile(linkType="ipvlan", mode="l3"),
        "net2": InterfaceProfile(linkType="ipvlan", mode="l3", mtu=9000),
    }


def test_a_claim_without_config_has_no_profiles():
    assert claim_profiles(claim(), DRIVER, ProfileLimits()) == {"net1": None}


def test_a_forbidden_profile_names_claim_request_field_and_limit():
    c = claim(
        profile_config("FromClass", linkType="macvlan"),
        profile_config("FromClaim", requests=["net1"], mtu=9000),
    )
    with pytest.raises(InvalidConfigError) as exc:
        claim_profiles(c, DRIVER, ProfileLimits(maxMtu=1500))
    assert exc.value.msg == (
        "failed to prepare claim prod/web request 'net1': mtu 9000 is above this node's limit "
        "(profiles.maxMtu: 1500), asked by config[1] (FromClaim, requests net1)"
    )


def test_a_bad_entry_fails_the_claim_even_if_it_targets_no_result():
    c = claim(profile_config("FromClaim", requests=["elsewhere"], master="eth0"))
    with pytest.raises(InvalidConfigError) as exc:
        claim_profiles(c, DRIVER, OPEN)
    assert exc.value.msg == (
        "failed to prepare claim prod/web: config[0] (FromClaim, requests elsewhere): unknown "
        "field 'master' (the parent NIC is the allocated device: a profile cannot name it)"
    )


def test_two_interfaces_cannot_share_a_fixed_mac():
    c = claim(
        profile_config("FromClaim", linkType="macvlan", mac="02:00:00:00:00:01"),
        results=[allocation_result("nic-a", request="net1"), allocation_result("nic-b", request="net2")],
    )
    with pytest.raises(InvalidConfigError) as exc:
        claim_profiles(c, DRIVER, OPEN)
    assert exc.value.msg == (
        "failed to prepare claim prod/web request 'net2': mac 02:00:00:00:00:01 would go to two "
        "interfaces (requests 'net1' and 'net2'; one MAC per interface)"
    )
    # one request with two devices (count: 2) is two interfaces too
    c = claim(
        profile_config("FromClaim", linkType="macvlan", mac="02:00:00:00:00:01"),
        results=[allocation_result("nic-a", request="net1"), allocation_result("nic-b", request="net1")],
    )
    with pytest.raises(InvalidConfigError, match="requests 'net1' and 'net1'"):
        claim_profiles(c, DRIVER, OPEN)


def test_the_decoded_profile_never_raises():
    good = [profile_config("FromClass", linkType="ipvlan"), profile_config("FromClaim", mtu=9000)]
    assert decode_result_profile(good, DRIVER, "net1") == (
        InterfaceProfile(linkType="ipvlan", mtu=9000),
        None,
    )
    assert decode_result_profile(None, DRIVER, "net1") == (None, None)
    profile, why = decode_result_profile([profile_config(mtu="big")], DRIVER, "net1")
    assert profile is None and why == 'config[0] (FromClaim): mtu: Input should be a valid integer, not "big"'
    # limits are not the state's business: what prepare let through, the state reads back
    assert decode_result_profile([profile_config(shaping={"enabled": False})], DRIVER, "net1")[1] is None


# -- the node's layer, at ADD ------------------------------------------------------------------
NODE = {
    "type": "cni-dra",
    "linkType": "macvlan",
    "mode": "private",
    "mac": "02:00:00:00:00:09",
    "bcqueuelen": 100,
    "mtu": 1500,
    "shaping": {"capacity": "bandwidth", "ingressBurstBytes": 100},
}


def test_no_profile_leaves_the_conflist_alone():
    assert apply_to_netconf(NODE, None) == NODE
    assert apply_to_netconf(NODE, InterfaceProfile()) == NODE


def test_the_profile_wins_over_the_conflist():
    got = apply_to_netconf(NODE, InterfaceProfile(mtu=9000, shaping=ShapingProfile(egressBurstBytes=7)))
    assert got == {
        **NODE,
        "mtu": 9000,
        "shaping": {"capacity": "bandwidth", "ingressBurstBytes": 100, "egressBurstBytes": 7},
    }


def test_another_link_type_drops_the_conflist_link_options():
    got = apply_to_netconf(NODE, InterfaceProfile(linkType="ipvlan", mode="l3"))
    assert got == {
        "type": "cni-dra",
        "linkType": "ipvlan",
        "mode": "l3",
        "mtu": 1500,
        "shaping": NODE["shaping"],
    }


def test_the_same_link_type_keeps_the_conflist_mode_and_mac():
    assert apply_to_netconf(NODE, InterfaceProfile(linkType="macvlan")) == NODE
    assert apply_to_netconf({"type": "cni-dra"}, InterfaceProfile(linkType="macvlan", mode="vepa")) == {
        "type": "cni-dra",
        "linkType": "macvlan",
        "mode": "vepa",
    }


@pytest.mark.parametrize(
    ("node_shaping", "profile_shaping", "expect"),
    [
        ({"capacity": "bw"}, ShapingProfile(enabled=False), False),
        (False, ShapingProfile(enabled=True), {}),
        (False, ShapingProfile(ingressBurstBytes=5), False),  # an override does not turn shaping on
        (True, ShapingProfile(ingressBurstBytes=5), {"ingressBurstBytes": 5}),
        (
            None,
            ShapingProfile(latencySeconds=0.1),
            {"latencySeconds": 0.1},
        ),  # absent: the config's default (on)
    ],
)
def test_shaping_on_and_off(node_shaping, profile_shaping, expect):
    node = {"type": "cni-dra"} if node_shaping is None else {"type": "cni-dra", "shaping": node_shaping}
    assert apply_to_netconf(node, InterfaceProfile(shaping=profile_shaping))["shaping"] == expect


def test_the_plugin_accepts_the_profiles_block_of_its_conflist_entry() -> None:
    import json

    from cni_dra.protocol.config import load_conf

    raw = json.dumps(
        {
            "cniVersion": "1.1.0",
            "name": "n",
            "type": "cni-dra",
            "profiles": {"allowedLinkTypes": ["ipvlan"], "maxMtu": 1500},
        }
    ).encode()
    conf = load_conf(raw)
    assert conf.profiles.maxMtu == 1500 and conf.profiles.allowedLinkTypes == ("ipvlan",)
