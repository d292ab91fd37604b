"""One interface-name rule, one MAC rule and one set of mode tables for the CNI input and the links.

cni_dra.iface holds them; the protocol layer (CNI_IFNAME, the config's mac and mode) and
the netlink layer (the sub-link spec) must give the same verdict on every value.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra import iface
from cni_dra.errors import CniError, InvalidConfigError, InvalidEnvironmentError
from cni_dra.netlink import sublink
from cni_dra.protocol import config, env

MISSING_NETNS = "/nonexistent/cni-dra-test/netns"


def _verdict(call) -> int:
    try:
        call()
    except CniError as exc:
        return exc.code
    return 0


@given(st.text(max_size=20))
def test_cni_input_and_the_link_spec_judge_ifnames_alike(name: str) -> None:
    cni = _verdict(lambda: env.validate_ifname(name))
    link = _verdict(lambda: sublink.SubLinkSpec.macvlan(parent="eth0", netns=MISSING_NETNS, ifname=name))
    assert cni == link == _verdict(lambda: iface.validate_ifname(name))
    assert cni in (0, 4)


@given(st.text(alphabet="0123456789abcdefABCDEF:-\n ", max_size=18))
def test_the_config_and_the_link_spec_judge_macs_alike(mac: str) -> None:
    def conf() -> None:
        config.load_conf(
            json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "cni-dra", "mac": mac}).encode()
        )

    def link() -> None:
        sublink.SubLinkSpec.macvlan(parent="eth0", netns=MISSING_NETNS, ifname="eth0", mac=mac)

    assert _verdict(conf) == _verdict(link) == _verdict(lambda: iface.validate_mac(mac))


def test_messages_name_the_source_and_the_problem() -> None:
    with pytest.raises(
        InvalidEnvironmentError, match=r"^invalid CNI_IFNAME 'a/b': interface name contains '/'"
    ):
        env.validate_ifname("a/b")
    with pytest.raises(InvalidEnvironmentError, match=r"^invalid interface name 'eth%d': contains '%'"):
        iface.validate_ifname("eth%d")
    with pytest.raises(InvalidEnvironmentError, match="not valid UTF-8"):
        iface.validate_ifname("a\udc80")
    with pytest.raises(InvalidConfigError, match="is multicast"):
        iface.validate_mac("01:00:5E:00:00:01")


@pytest.mark.parametrize("mac", ["02:00:00:00:00:01\n", " 02:00:00:00:00:01", "02:00:00:00:00:01:"])
def test_a_mac_with_anything_around_it_is_refused(mac: str) -> None:
    with pytest.raises(InvalidConfigError):
        iface.validate_mac(mac)


def test_one_set_of_mode_tables() -> None:
    # <linux/if_link.h>: enum macvlan_mode bits; IPVLAN_MODE_*; IPVLAN_F_PRIVATE/VEPA.
    assert dict(iface.MACVLAN_MODES) == {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8, "source": 16}
    assert dict(iface.IPVLAN_MODES) == {"l2": 0, "l3": 1, "l3s": 2}
    assert dict(iface.IPVLAN_FLAGS) == {"bridge": 0, "private": 1, "vepa": 2}
    assert iface.CONFIG_MACVLAN_MODES == ("bridge", "private", "vepa", "passthru")
    from cni_dra import netlink

    assert netlink.MACVLAN_MODES is iface.MACVLAN_MODES and netlink.validate_ifname is iface.validate_ifname
