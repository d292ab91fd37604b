"""Shaping's leftovers and the kernel's pieces, with the installed plugin in real namespaces.

* ``cni-dra state repair`` deletes an ifb device whose link is gone once no record names
  it (state lost, or a link deleted behind the plugin's back), and nothing else: not the
  ifb device of a live link (tracked, or charged as a repair placeholder), not an ifb
  device named otherwise or without cni-dra's mark (not cni-dra's, whatever its name);
* STATUS with shaping on probes this kernel (which has ifb, tbf, ingress, u32 and mirred)
  once and keeps the answer for the boot; with shaping off it probes nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cni_dra.netlink.shaping import ifb_name, probe_kernel
from cni_dra.state import StateStore
from netns_tests.bed import NodeBed, links_named, repair

NET = "leaknet"
LONG_IFNAME = "podinterface0"  # 13 bytes: its ifb device has the hashed name


@pytest.fixture
def node(make_node) -> NodeBed:
    """Two 10G stand-in NICs (``nic-a``, ``nic-b``) on network ``leaknet``, spec 1.1.0."""
    return make_node(network=NET, version="1.1.0")


def _links(netns: str) -> dict[str, str | None]:
    return dict(links_named(netns))


def _delete_link(netns: str, ifname: str) -> None:
    """Delete ``ifname`` in ``netns`` behind the plugin's back (its ifb device stays)."""
    from pyroute2 import IPRoute

    with IPRoute(netns=netns) as ipr:
        (idx,) = ipr.link_lookup(ifname=ifname)
        ipr.link("del", index=idx)


def _add_ifb(netns: str, name: str) -> None:
    from pyroute2 import IPRoute

    with IPRoute(netns=netns) as ipr:
        ipr.link("add", ifname=name, kind="ifb")


def test_repair_removes_ifb_devices_whose_link_and_record_are_gone(node, make_netns) -> None:
    ns_a, ns_b, ns_c, ns_d = (make_netns() for _ in range(4))
    for ns, cid, ifname in (
        (ns_a, "pod-a", "eth0"),
        (ns_b, "pod-b", "eth0"),
        (ns_c, "pod-c", LONG_IFNAME),
        (ns_d, "pod-d", "eth0"),
    ):
        code, out, err = node.add(ns, cid, ifname=ifname)
        assert code == 0, (out, err)
        assert _links(ns)[ifb_name(ifname)] == "ifb"
    hashed = ifb_name(LONG_IFNAME)
    assert hashed.startswith("ifb") and not hashed.startswith("ifb-")
    # The records of pod-b, pod-c and pod-d are lost (an older backup restored, say); pod-b's
    # and pod-c's links are deleted behind the plugin's back, pod-d's stays (untracked).
    with StateStore(node.state_dir).transaction() as txn:
        for cid, ifname in (("pod-b", "eth0"), ("pod-c", LONG_IFNAME), ("pod-d", "eth0")):
            assert txn.remove(NET, cid, ifname) is not None
    _delete_link(ns_b, "eth0")
    _delete_link(ns_c, LONG_IFNAME)
    _add_ifb(ns_b, "myifb0")  # someone else's
    _add_ifb(ns_b, "ifb-net1")  # someone else's, named by the rule (no net1 link): not marked as cni-dra's

    code, out, err = repair(node, "--json")
    assert code == 0, (out, err)
    changes = json.loads(out)["changes"]
    leaked = sorted(c for c in changes if c.startswith("removed leaked ifb device"))
    assert leaked == sorted(
        [f"removed leaked ifb device ifb-eth0 in {ns_b}", f"removed leaked ifb device {hashed} in {ns_c}"]
    ), changes
    assert any(c.startswith(f"untracked link eth0 in {ns_d}") for c in changes), changes
    assert _links(ns_a) == {"lo": None, "eth0": "macvlan", "ifb-eth0": "ifb"}  # tracked: untouched
    assert _links(ns_b) == {"lo": None, "myifb0": "ifb", "ifb-net1": "ifb"}  # not cni-dra's: left alone
    assert _links(ns_c) == {"lo": None}
    assert _links(ns_d) == {"lo": None, "eth0": "macvlan", "ifb-eth0": "ifb"}  # charged placeholder: stays
    # a second repair finds nothing more
    code, out, err = repair(node, "--json")
    assert code == 0 and not [c for c in json.loads(out)["changes"] if "leaked" in c], (out, err)
    # the live links' DELs take their ifb devices with them
    for ns, cid in ((ns_a, "pod-a"), (ns_d, "pod-d")):
        code, out, err = node.delete(ns, cid)
        assert code == 0, (out, err)
        assert _links(ns) == {"lo": None}
    assert node.phases() == {}


def test_repair_without_a_state_file_still_removes_leaked_ifb_devices(node, make_netns) -> None:
    ns = make_netns()
    code, out, err = node.add(ns, "pod-a")
    assert code == 0, (out, err)
    _delete_link(ns, "eth0")
    for path in node.state_dir.iterdir():  # the state directory wiped
        path.unlink()
    code, out, err = repair(node)  # the operator's text output
    assert code == 0, (out, err)
    assert out.splitlines() == [f"removed leaked ifb device ifb-eth0 in {ns}"]
    assert _links(ns) == {"lo": None}


def test_status_probes_shaping_once_per_boot_and_not_when_shaping_is_off(node, tmp_path) -> None:
    probe_file = node.state_dir / "shaping-probe.json"
    code, out, err = node.run("STATUS", node.conf(shaping=False))
    assert (code, out) == (0, None), err
    assert not probe_file.exists()
    namespaces = sorted(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else []
    code, out, err = node.run("STATUS", node.conf())
    assert (code, out) == (0, None), err
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert json.loads(probe_file.read_text()) == {"bootID": boot, "lacks": None}
    assert (sorted(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else []) == namespaces
    # a remembered answer is not probed again this boot; one of another boot is
    probe_file.write_text(json.dumps({"bootID": "0" * 32, "lacks": None}))
    assert node.run("STATUS", node.conf())[:2] == (0, None)
    assert json.loads(probe_file.read_text()) == {"bootID": boot, "lacks": None}


def test_the_probe_leaves_nothing_behind() -> None:
    before = (links_named(), sorted(os.listdir("/proc/self/fd")))
    assert probe_kernel() is None  # this kernel has every piece
    assert (links_named(), sorted(os.listdir("/proc/self/fd"))) == before
