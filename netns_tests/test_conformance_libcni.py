"""[cni-dra, tuning] through libcni (as containerd runs it): tuning changes the MTU and a
sysctl of cni-dra's interface, and CHECK of the whole chain still passes.

Uses the libcni harness of netns_tests/libcni.py.
"""

from __future__ import annotations

import subprocess

import pytest

from netns_tests.libcni import IFNAME, Setup, run_client
from netns_tests.libcni import assert_added as _assert_added
from netns_tests.libcni import assert_deleted as _assert_deleted


@pytest.fixture
def setup(libcni_setup: Setup) -> Setup:
    return libcni_setup


def _sysctl(netns: str, key: str) -> str:
    proc = subprocess.run(
        ["nsenter", f"--net={netns}", "cat", f"/proc/sys/{key}"], capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_chain_with_tuning_mtu_and_sysctl(libcni_client, setup: Setup, version: str) -> None:
    key = f"net/ipv4/conf/{IFNAME}/arp_ignore"
    assert _sysctl(setup.netns, "net/ipv4/conf/default/arp_ignore") == "0"
    tuning = {"type": "tuning", "mtu": 1280, "sysctl": {f"net.ipv4.conf.{IFNAME}.arp_ignore": "2"}}
    conflist = setup.conflist(version, setup.cni_dra_conf(), tuning)

    def run(cmd: str):
        return run_client(libcni_client, cmd, conflist, netns=setup.netns, cache_dir=setup.cache_dir)

    code, result, err = run("add")
    assert code == 0, f"ADD via libcni failed: {result} {err}"
    link = _assert_added(setup, result, version)
    assert link["mtu"] == 1280
    assert _sysctl(setup.netns, key) == "2"
    # cni-dra set arp_notify itself; tuning did not undo it
    assert _sysctl(setup.netns, f"net/ipv4/conf/{IFNAME}/arp_notify") == "1"

    code, out, err = run("check")
    assert code == 0, f"CHECK via libcni failed: {out} {err}"

    code, out, err = run("del")
    assert code == 0, f"DEL via libcni failed: {out} {err}"
    _assert_deleted(setup)
