"""Unprivileged tests of cni_dra.netlink: validation, parsing, lazy import.

Every validation here must fail before any namespace or netlink access, so the
calls use a netns path that does not exist: reaching it would raise code 3
instead of the expected error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra import iface
from cni_dra.errors import InvalidConfigError, InvalidEnvironmentError
from cni_dra.netlink import _pyroute2, addr, info, sublink, sysctl

MISSING_NETNS = "/nonexistent/cni-dra-test/netns"
REPO = Path(__file__).resolve().parents[1]

NAME_CHARS = st.characters(codec="ascii", categories=("L", "N"), include_characters="-_.@")


def test_importing_the_package_does_not_import_pyroute2() -> None:
    code = "import sys, cni_dra.netlink; print('pyroute2' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- ifname


@given(st.text(NAME_CHARS, min_size=1, max_size=15).filter(lambda s: s not in (".", "..")))
def test_valid_ifnames_pass(name: str) -> None:
    iface.validate_ifname(name)


@given(st.text(NAME_CHARS, min_size=16, max_size=40))
def test_ifnames_over_15_bytes_fail(name: str) -> None:
    with pytest.raises(InvalidEnvironmentError):
        iface.validate_ifname(name)


@given(
    st.text(NAME_CHARS, max_size=6),
    st.sampled_from(["/", ":", " ", "\t", "\n"]),
    st.text(NAME_CHARS, max_size=6),
)
def test_ifnames_with_forbidden_chars_fail(a: str, bad: str, b: str) -> None:
    with pytest.raises(InvalidEnvironmentError) as exc:
        iface.validate_ifname(a + bad + b)
    assert exc.value.code == 4


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "é" * 8, "eth%d", "%", "a\x00b", "\xa0", "à", "a\u2003b", "a\x85", "a\x1fb", "é" * 7],
)
def test_special_ifnames_fail(name: str) -> None:
    with pytest.raises(InvalidEnvironmentError):
        iface.validate_ifname(name)


@pytest.mark.parametrize("name", ["eth0.100", "x" * 15, "-", "@", "e+t", "a~b"])
def test_unusual_but_valid_ifnames_pass(name: str) -> None:
    iface.validate_ifname(name)  # the kernel keeps these as sent (see netns_tests)


# --------------------------------------------------------------------------- speed


def _sysfs(tmp_path: Path, name: str, content: str) -> str:
    (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / name / "speed").write_text(content)
    return str(tmp_path)


@given(st.integers(min_value=1, max_value=10**7))
def test_speed_positive_mbps_is_bits_per_second(tmp_path_factory, mbps: int) -> None:
    root = _sysfs(tmp_path_factory.mktemp("sys"), "eth0", f"{mbps}\n")
    assert info.link_speed_bps("eth0", sysfs_net=root) == mbps * 1_000_000


@given(st.integers(max_value=0))
def test_speed_unknown_or_nonpositive_is_none(tmp_path_factory, mbps: int) -> None:
    root = _sysfs(tmp_path_factory.mktemp("sys"), "eth0", f"{mbps}\n")
    assert info.link_speed_bps("eth0", sysfs_net=root) is None


@pytest.mark.parametrize("content", ["", "fast\n", "10.5\n", "\xff"])
def test_speed_garbage_is_none(tmp_path: Path, content: str) -> None:
    assert info.link_speed_bps("eth0", sysfs_net=_sysfs(tmp_path, "eth0", content)) is None


def test_speed_missing_file_is_none(tmp_path: Path) -> None:
    assert info.link_speed_bps("eth0", sysfs_net=str(tmp_path)) is None


def test_speed_name_cannot_escape_sysfs(tmp_path: Path) -> None:
    (tmp_path / "speed").write_text("1000\n")
    inner = tmp_path / "net"
    inner.mkdir()
    assert info.link_speed_bps("..", sysfs_net=str(inner)) is None


# --------------------------------------------------------------------------- create validation


@given(st.text(max_size=20).filter(lambda s: s not in iface.MACVLAN_MODES))
def test_unknown_macvlan_mode_is_code_7(mode: str) -> None:
    with pytest.raises(InvalidConfigError) as exc:
        sublink.create_macvlan(parent="eth0", netns=MISSING_NETNS, ifname="eth0", mode=mode)
    assert exc.value.code == 7


@pytest.mark.parametrize(("mode", "flag"), [("l4", "bridge"), ("L2", "bridge"), ("l2", "vepa2"), ("l3", "")])
def test_unknown_ipvlan_mode_or_flag_is_code_7(mode: str, flag: str) -> None:
    with pytest.raises(InvalidConfigError):
        sublink.create_ipvlan(parent="eth0", netns=MISSING_NETNS, ifname="eth0", mode=mode, flag=flag)


@pytest.mark.parametrize(
    "mac",
    [
        "",
        "02:00:00:00:00",
        "02:00:00:00:00:00:00",
        "02-00-00-00-00-01",
        "0g:00:00:00:00:01",
        "01:00:5e:00:00:01",
        "03:00:00:00:00:01",
        "00:00:00:00:00:00",
        "0200.0000.0001",
    ],
)
def test_bad_mac_is_code_7(mac: str) -> None:
    with pytest.raises(InvalidConfigError):
        sublink.create_macvlan(parent="eth0", netns=MISSING_NETNS, ifname="eth0", mac=mac)


@pytest.mark.parametrize("mtu", [0, 67, -1, 1500.0, "1500", True])
def test_bad_mtu_is_code_7(mtu: object) -> None:
    with pytest.raises(InvalidConfigError):
        sublink.create_macvlan(parent="eth0", netns=MISSING_NETNS, ifname="eth0", mtu=mtu)  # type: ignore[arg-type]


def test_bad_ifname_is_checked_before_the_netns() -> None:
    with pytest.raises(InvalidEnvironmentError):
        sublink.create_macvlan(parent="eth0", netns=MISSING_NETNS, ifname="eth0:1")


# --------------------------------------------------------------------------- configure / sysctl validation


@pytest.mark.parametrize(
    ("addresses", "routes"),
    [
        ([("10.0.0.1", None)], []),  # not CIDR
        ([("10.0.0.300/24", None)], []),
        ([], [("10.0.0.0/33", None)]),
        ([], [("0.0.0.0/0", "gateway")]),
        ([], [("0.0.0.0/0", "fd00::1")]),  # family mismatch
    ],
)
def test_configure_rejects_bad_input_before_touching_the_netns(addresses, routes) -> None:
    with pytest.raises(InvalidConfigError):
        addr.configure_interface(MISSING_NETNS, "eth0", addresses=addresses, routes=routes)


@pytest.mark.parametrize(
    "key",
    [
        "kernel/hostname",
        "/net/ipv4/ip_forward",
        "net/../kernel/hostname",
        "net/ipv4/conf/eth0/../../../../kernel/x",
        "net",
        "net/",
        "net//ipv4",
        "net/ipv4/conf/./x",
        "net/ipv4 /x",
        "net/ipv4/conf/e\u00e9/x",
        "net/ipv4/conf/a\x1fb/x",
    ],
)
def test_sysctl_key_outside_net_is_code_7(key: str) -> None:
    with pytest.raises(InvalidConfigError):
        sysctl.set_sysctl_in_netns(MISSING_NETNS, key, 1)


@pytest.mark.parametrize("ifname", ["e+t", "net@1", "a~b", "x#y", "v!", "eth0.100", "a-b_c", "a=b"])
def test_sysctl_keys_take_every_interface_name(ifname: str) -> None:
    """Any name CNI_IFNAME may hold makes a sysctl key: the write goes on to the netns (gone here)."""
    from cni_dra.errors import ContainerUnknownError

    iface.validate_ifname(ifname)
    with pytest.raises(ContainerUnknownError):
        sysctl.set_sysctl_in_netns(MISSING_NETNS, f"net/ipv4/conf/{ifname}/arp_notify", 1)


# --------------------------------------------------------------------------- ipvlan wire format
# This kernel has no ipvlan, so the RTM_NEWLINK that create_ipvlan sends is checked
# here: compiled by pyroute2's IPBatch (no socket I/O), decoded back, and read by
# the same decoder link_in_netns uses.


def _compile_newlink(ifname: str, spec: dict) -> object:
    from pyroute2.iproute.linux import IPBatch
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    _pyroute2.load()  # registers the ipvlan attribute table
    ipb = IPBatch()
    try:
        ipb.link("add", ifname=ifname, **spec)
        data = bytes(ipb.batch)
    finally:
        ipb.close()
    msg = ifinfmsg(data)
    msg.decode()
    return msg


@pytest.mark.parametrize("mode", sorted(iface.IPVLAN_MODES))
@pytest.mark.parametrize("flag", sorted(iface.IPVLAN_FLAGS))
def test_ipvlan_newlink_carries_mode_and_flags(mode: str, flag: str) -> None:
    spec = sublink.SubLinkSpec.ipvlan(
        parent="eth0", netns=MISSING_NETNS, ifname="eth0", mode=mode, flag=flag, mtu=1400
    ).newlink(parent_index=7, netns_fd=3)
    msg = _compile_newlink("cdratest", spec)
    data = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
    # <linux/if_link.h>: IPVLAN_MODE_L2=0, L3=1, L3S=2; IPVLAN_F_PRIVATE=1, IPVLAN_F_VEPA=2.
    assert data.get_attr("IFLA_IPVLAN_MODE") == {"l2": 0, "l3": 1, "l3s": 2}[mode]
    assert (data.get_attr("IFLA_IPVLAN_FLAGS") or 0) == {"bridge": 0, "private": 1, "vepa": 2}[flag]
    assert msg.get_attr("IFLA_LINK") == 7
    assert msg.get_attr("IFLA_NET_NS_FD") == 3
    assert msg.get_attr("IFLA_MTU") == 1400
    assert msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") == "ipvlan"
    msg["index"] = 9
    link = info.decode_link(msg)
    assert (link.kind, link.mode, link.ipvlan_flag) == ("ipvlan", mode, flag)


@pytest.mark.parametrize("mode", sorted(iface.MACVLAN_MODES))
def test_macvlan_newlink_carries_mode_and_mac(mode: str) -> None:
    spec = sublink.SubLinkSpec.macvlan(
        parent="eth0", netns=MISSING_NETNS, ifname="eth0", mode=mode, mac="02:00:00:00:00:01"
    ).newlink(parent_index=4, netns_fd=5)
    msg = _compile_newlink("cdratest", spec)
    data = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
    # <linux/if_link.h> enum macvlan_mode: private 1, vepa 2, bridge 4, passthru 8, source 16.
    assert data.get_attr("IFLA_MACVLAN_MODE") == mode
    assert msg.get_attr("IFLA_ADDRESS") == "02:00:00:00:00:01"
    assert msg.get_attr("IFLA_MTU") is None
