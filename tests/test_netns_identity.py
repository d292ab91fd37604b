"""Network namespaces are told apart by identity (device and inode), not by path, in every
verb: DEL (which link it may delete, the repair placeholder it releases, the namespace it
uses when CNI_NETNS is empty), a repeated ADD, and :func:`cni_dra.netlink.netns.same_netns`
itself. The machine is the in-memory host (tests/fake_host.py): each path resolves to an identity from a table, the way
``/run/netns/x`` and ``/var/run/netns/x`` resolve to one nsfs inode on a node where
``/var/run`` is a symlink to ``/run``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cni_dra.attach.rebuild import REPAIR_NETWORK
from cni_dra.attach.shaping_plan import record
from cni_dra.errors import ContainerUnknownError
from cni_dra.netlink import info, netns
from cni_dra.netlink.shaping import ShapeInfo, Tbf
from cni_dra.state import StateStore
from tests.builders import attachment, device, netconf, run_verb, write_slice
from tests.fake_host import FakeHost, pod_link

POD = (0x20, 4026532001)
OTHER = (0x20, 4026532002)
IDENTITIES = {"/run/netns/pod": POD, "/var/run/netns/pod": POD, "/run/netns/other": OTHER}
"""Path → namespace identity: the pod's namespace under two spellings, and another pod's."""


def _link(name: str, parent_index: int = 7) -> info.LinkInfo:
    return pod_link(name=name, index=3, parent_index=parent_index)


def _nic(name: str, index: int) -> info.LinkInfo:
    return info.LinkInfo(
        name=name,
        index=index,
        kind=None,
        mac="02:00:00:00:00:09",
        mtu=1500,
        operstate="UP",
        admin_up=True,
        parent_index=None,
        parent_netnsid=None,
        mode=None,
    )


class Kernel(FakeHost):
    """Namespaces from :data:`IDENTITIES` (``ids``), each holding a macvlan of every name asked on
    host NIC ``parent`` (``eth9``, the inventory's; none with ``parent`` None); records the links
    deleted as (netns, name); ``found``: what the runtimes' netns directory names by identity."""

    def __init__(self) -> None:
        super().__init__(every_path_a_netns=False)
        self.deleted: list[tuple[str, str]] = []
        self.parent: str | None = "eth9"
        self.ids = dict(IDENTITIES)
        self.found: dict[tuple[int, int], str] = {}
        self.host_links["eth9"] = _nic("eth9", 7)

    def _ident(self, path: str) -> tuple[int, int]:
        if path not in self.ids:
            raise ContainerUnknownError(f"failed to open netns {path}: no such file")
        return self.ids[path]

    def find_netns(self, ident: tuple[int, int]) -> str | None:
        return self.found.get(ident)

    def link_in_netns(self, netns: str, ifname: str) -> info.LinkInfo | None:
        self._call("link_in_netns", netns, ifname)
        return _link(ifname) if netns in self.ids else None

    def host_parent_of(self, netns: str, ifname: str) -> info.LinkInfo | None:
        self._call("host_parent_of", netns, ifname)
        return _nic(self.parent, 7) if netns in self.ids and self.parent else None

    def delete_shaped_link(self, netns: str, ifname: str) -> tuple[bool, bool]:
        self._call("delete_shaped_link", netns, ifname)
        self.deleted.append((netns, ifname))
        return True, True

    def delete_link(self, netns: str | None, ifname: str) -> bool:
        self._call("delete_link", netns, ifname)
        self.deleted.append((str(netns), ifname))
        return True


def _node(tmp_path: Path, *atts: Any) -> dict[str, Any]:
    """A network ``net`` on NIC ``eth9`` (device nic-a) whose state holds ``atts``; its config."""
    write_slice(tmp_path / "slice.yaml", [device("nic-a", "eth9")], name="s")
    if atts:
        with StateStore(tmp_path / "state").transaction() as txn:
            for att in atts:
                txn.put(att)
    return netconf(
        name="net",
        stateDir=str(tmp_path / "state"),
        inventory=str(tmp_path / "slice.yaml"),
        ipam={"type": "host-local"},
    )


def _keys(tmp_path: Path) -> list[tuple[str, str, str]]:
    return [a.key for a in StateStore(tmp_path / "state").read().attachments]


SHAPED = record(ShapeInfo("net1", Tbf.for_rate(300_000_000), Tbf.for_rate(300_000_000), "ifb-net1"))


# -- DEL of a container with no record -----------------------------------------------------------
@pytest.mark.parametrize("spelling", ["/run/netns/pod", "/var/run/netns/pod"])
def test_del_of_an_unknown_container_leaves_another_attachments_link(tmp_path, spelling):
    """The link (and its ifb device) belongs to the attachment whose record names it, in the
    same namespace by identity whatever the path: a DEL without a record of its own leaves it."""
    kernel = Kernel()
    owner = attachment(
        "c-b",
        network="net",
        ifname="net1",
        netns="/run/netns/pod",
        parent="eth9",
        consumedCapacity={"bandwidth": "2G"},
        shaping=SHAPED,
    )
    conf = _node(tmp_path, owner)
    code, out = run_verb(kernel, "DEL", conf, container_id="c-x", netns=spelling, ifname="net1")
    assert (code, out) == (0, None)
    assert kernel.deleted == []
    assert _keys(tmp_path) == [("net", "c-b", "net1")]


def test_del_of_an_unknown_container_still_removes_an_unowned_cni_dra_link(tmp_path):
    """A record naming the same ifname in ANOTHER namespace is no owner: the state-lost case holds."""
    kernel = Kernel()
    conf = _node(
        tmp_path, attachment("c-b", network="net", ifname="net1", netns="/run/netns/other", parent="eth9")
    )
    assert run_verb(kernel, "DEL", conf, container_id="c-x", netns="/var/run/netns/pod", ifname="net1") == (
        0,
        None,
    )
    assert kernel.deleted == [("/var/run/netns/pod", "net1")]
    assert _keys(tmp_path) == [("net", "c-b", "net1")]


def test_del_releases_the_repair_placeholder_named_under_another_path(tmp_path):
    """``state repair`` names the pod's namespace /var/run/netns/...; the runtime's DEL may say
    /run/netns/...: the same namespace, so the placeholder is released with the link."""
    kernel = Kernel()
    placeholder = attachment(
        "repair-pod",
        network=REPAIR_NETWORK,
        ifname="net1",
        netns="/var/run/netns/pod",
        parent="eth9",
        consumedCapacity={"bandwidth": "10G"},
    )
    conf = _node(tmp_path, placeholder)
    assert run_verb(kernel, "DEL", conf, container_id="c-x", netns="/run/netns/pod", ifname="net1") == (
        0,
        None,
    )
    assert _keys(tmp_path) == []
    assert kernel.deleted == [("/run/netns/pod", "net1")]


# -- DEL with an empty CNI_NETNS -----------------------------------------------------------------
def test_del_with_empty_netns_deletes_the_link_in_the_recorded_namespace(tmp_path):
    kernel = Kernel()
    conf = _node(
        tmp_path,
        attachment(
            "c1", network="net", ifname="net1", netns="/var/run/netns/pod", parent="eth9", shaping=SHAPED
        ),
    )
    assert run_verb(kernel, "DEL", conf, container_id="c1", netns="", ifname="net1") == (0, None)
    assert kernel.deleted == [("/var/run/netns/pod", "net1")]  # with its ifb device (the shaped deletion)
    assert _keys(tmp_path) == []


def test_del_with_empty_netns_leaves_a_link_off_the_recorded_parent(tmp_path):
    """The recorded path may name another namespace now (a reused /proc/PID path): a link of
    that name on another NIC is not this attachment's. The record and IPAM still go."""
    kernel = Kernel()
    kernel.parent = "eth8"
    conf = _node(
        tmp_path, attachment("c1", network="net", ifname="net1", netns="/var/run/netns/pod", parent="eth9")
    )
    assert run_verb(kernel, "DEL", conf, container_id="c1", netns="", ifname="net1") == (0, None)
    assert kernel.deleted == []
    assert _keys(tmp_path) == []


def test_del_with_empty_netns_leaves_a_link_another_record_names(tmp_path):
    """The recorded /proc/PID path now names another pod's namespace (the PID was reused),
    where that pod's attachment has a link of the same name on the same NIC: not ours."""
    kernel = Kernel()
    kernel.ids["/proc/4242/ns/net"] = POD
    mine = attachment("c1", network="net", ifname="net1", netns="/proc/4242/ns/net", parent="eth9")
    theirs = attachment("c-b", network="net", ifname="net1", netns="/run/netns/pod", parent="eth9")
    conf = _node(tmp_path, mine, theirs)
    assert run_verb(kernel, "DEL", conf, container_id="c1", netns="", ifname="net1") == (0, None)
    assert kernel.deleted == []
    assert _keys(tmp_path) == [("net", "c-b", "net1")]


def test_del_with_empty_netns_and_the_recorded_namespace_gone_succeeds(tmp_path):
    kernel = Kernel()
    conf = _node(
        tmp_path, attachment("c1", network="net", ifname="net1", netns="/var/run/netns/gone", parent="eth9")
    )
    assert run_verb(kernel, "DEL", conf, container_id="c1", netns="", ifname="net1") == (0, None)
    assert kernel.deleted == [] and _keys(tmp_path) == []


# -- a repeated ADD --------------------------------------------------------------------------------
def test_repeated_add_under_another_path_returns_the_recorded_result(tmp_path):
    kernel = Kernel()
    result = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "net1", "sandbox": "/run/netns/pod"}],
        "ips": [{"address": "192.0.2.5/24", "interface": 0}],
    }
    conf = _node(
        tmp_path,
        attachment("c1", network="net", ifname="net1", netns="/run/netns/pod", parent="eth9", result=result),
    )
    code, out = run_verb(kernel, "ADD", conf, container_id="c1", netns="/var/run/netns/pod", ifname="net1")
    assert code == 0, out
    assert out["ips"] == [{"address": "192.0.2.5/24", "interface": 0}]
    code, out = run_verb(kernel, "ADD", conf, container_id="c1", netns="/run/netns/other", ifname="net1")
    assert code == 1 and out["code"] == 104  # another namespace: a container ID reused without DEL


# -- same_netns itself, on real namespace files ------------------------------------------------------
def test_same_netns_compares_identities_not_paths(tmp_path):
    alias = tmp_path / "alias"
    alias.symlink_to("/proc/self/ns/net")  # another path to this process's namespace
    here = f"/proc/{os.getpid()}/ns/net"
    assert netns.same_netns(str(alias), here)
    assert netns.same_netns("/proc/thread-self/ns/net", here)
    assert netns.netns_identity_or_none(str(alias)) == (os.stat(here).st_dev, os.stat(here).st_ino)
    plain = tmp_path / "plain"
    plain.write_text("")  # what an unmounted /var/run/netns/NAME leaves: no namespace
    assert not netns.same_netns(str(plain), here)
    assert not netns.same_netns(str(tmp_path / "missing"), here)
    assert not netns.same_netns("", here)
    assert netns.netns_identity_or_none(str(plain)) is None
    assert netns.same_netns(str(tmp_path / "missing"), str(tmp_path / "missing"))  # one path is itself


# -- the namespace recorded at ADD, by identity ------------------------------------------------------
GONE = (0x20, 4026532999)
"""The identity of a namespace that no longer exists (no path in :data:`IDENTITIES` names it)."""


def test_del_with_empty_netns_leaves_a_link_in_a_namespace_made_again_under_the_recorded_path(tmp_path):
    """The pod's namespace was deleted and another made under its name, holding a link of the
    same name on the same NIC: it is not the namespace the attachment recorded (its identity
    differs), so that link stays; the record, its IPAM and its capacity go (the recorded
    namespace took its link with it)."""
    kernel = Kernel()
    conf = _node(
        tmp_path,
        attachment(
            "c1",
            network="net",
            ifname="net1",
            netns="/run/netns/pod",
            netnsIdentity=GONE,
            parent="eth9",
            shaping=SHAPED,
        ),
    )
    assert run_verb(kernel, "DEL", conf, container_id="c1", netns="", ifname="net1") == (0, None)
    assert kernel.deleted == []
    assert _keys(tmp_path) == []


def test_del_naming_another_live_namespace_deletes_the_link_where_the_record_says(tmp_path):
    """CNI_NETNS names a live namespace other than the one recorded at ADD: the pod's link is
    deleted where it is (the recorded namespace), never the link of that name in CNI_NETNS."""
    kernel = Kernel()
    conf = _node(
        tmp_path,
        attachment(
            "c1",
            network="net",
            ifname="net1",
            netns="/run/netns/pod",
            netnsIdentity=POD,
            parent="eth9",
            shaping=SHAPED,
        ),
    )
    assert run_verb(kernel, "DEL", conf, container_id="c1", netns="/run/netns/other", ifname="net1") == (
        0,
        None,
    )
    assert kernel.deleted == [("/run/netns/pod", "net1")]
    assert _keys(tmp_path) == []


def test_del_finds_the_recorded_namespace_under_another_path(tmp_path):
    """The recorded path (a symlink, say) names another namespace now; the recorded one is
    still named under /var/run/netns: its link goes from there, not from what the recorded
    path names now."""
    kernel = Kernel()
    kernel.ids["/tmp/pod-link"] = OTHER  # pointed elsewhere after the ADD
    kernel.found[POD] = "/var/run/netns/pod"
    conf = _node(
        tmp_path,
        attachment(
            "c1",
            network="net",
            ifname="net1",
            netns="/tmp/pod-link",
            netnsIdentity=POD,
            parent="eth9",
            shaping=SHAPED,
        ),
    )
    assert run_verb(kernel, "DEL", conf, container_id="c1", netns="", ifname="net1") == (0, None)
    assert kernel.deleted == [("/var/run/netns/pod", "net1")]
    assert _keys(tmp_path) == []


def test_del_naming_the_recorded_namespace_deletes_there_without_a_netlink_look(tmp_path):
    """The normal DEL: CNI_NETNS is the recorded namespace (another path of it does too); the
    link goes by name, with no netlink request to judge it first."""
    kernel = Kernel()
    kernel.fail["link_in_netns"] = AssertionError("a netlink look on the normal DEL")
    kernel.fail["host_parent_of"] = AssertionError("a netlink look on the normal DEL")
    conf = _node(
        tmp_path,
        attachment(
            "c1",
            network="net",
            ifname="net1",
            netns="/run/netns/pod",
            netnsIdentity=POD,
            parent="eth9",
            shaping=SHAPED,
        ),
    )
    assert run_verb(kernel, "DEL", conf, container_id="c1", netns="/var/run/netns/pod", ifname="net1") == (
        0,
        None,
    )
    assert kernel.deleted == [("/var/run/netns/pod", "net1")]


def test_repeated_add_into_a_namespace_made_again_is_not_answered_from_the_record(tmp_path):
    """A repeated ADD returns the recorded result only for the namespace it recorded, with
    its link there: a namespace made again under the same path (another identity), or the
    same one without the link, is refused (code 104: DEL it first)."""
    kernel = Kernel()
    result = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "net1", "sandbox": "/run/netns/pod"}],
        "ips": [{"address": "192.0.2.5/24", "interface": 0}],
    }
    conf = _node(
        tmp_path,
        attachment(
            "c1",
            network="net",
            ifname="net1",
            netns="/run/netns/pod",
            netnsIdentity=GONE,
            parent="eth9",
            result=result,
        ),
    )
    code, out = run_verb(kernel, "ADD", conf, container_id="c1", netns="/run/netns/pod", ifname="net1")
    assert code == 1 and out["code"] == 104, out
    kernel.ids["/run/netns/pod"] = GONE  # the recorded namespace, but its link is gone
    kernel.parent = None
    code, out = run_verb(kernel, "ADD", conf, container_id="c1", netns="/run/netns/pod", ifname="net1")
    assert code == 1 and out["code"] == 104 and "its link is no longer there" in out["msg"], out
    kernel.parent = "eth9"
    code, out = run_verb(kernel, "ADD", conf, container_id="c1", netns="/var/run/netns/pod", ifname="net1")
    assert code == 1 and out["code"] == 104  # /var/run/netns/pod is POD, not the recorded namespace
    code, out = run_verb(kernel, "ADD", conf, container_id="c1", netns="/run/netns/pod", ifname="net1")
    assert code == 0 and out["ips"] == [{"address": "192.0.2.5/24", "interface": 0}], out


def test_check_fails_in_a_namespace_made_again_under_the_recorded_path(tmp_path):
    kernel = Kernel()
    result = {"cniVersion": "1.1.0", "interfaces": [{"name": "net1", "sandbox": "/run/netns/pod"}], "ips": []}
    conf = _node(
        tmp_path,
        attachment(
            "c1",
            network="net",
            ifname="net1",
            netns="/run/netns/pod",
            netnsIdentity=GONE,
            parent="eth9",
            result=result,
        ),
    )
    code, out = run_verb(
        kernel,
        "CHECK",
        {**conf, "prevResult": result},
        container_id="c1",
        netns="/run/netns/pod",
        ifname="net1",
    )
    assert code == 1 and out["code"] == 105
    assert "CNI_NETNS /run/netns/pod is not the namespace it was added in" in out["msg"]


def test_gc_releases_without_touching_a_namespace_made_again_under_the_recorded_path(tmp_path):
    kernel = Kernel()
    conf = _node(
        tmp_path,
        attachment(
            "c1",
            network="net",
            ifname="net1",
            netns="/run/netns/pod",
            netnsIdentity=GONE,
            parent="eth9",
            shaping=SHAPED,
        ),
    )
    code, out = run_verb(kernel, "GC", {**conf, "cni.dev/valid-attachments": []})
    assert (code, out) == (0, None)
    assert kernel.deleted == [] and _keys(tmp_path) == []


def test_recovery_finishes_a_del_without_touching_a_namespace_made_again(tmp_path):
    from cni_dra.attach.recover import recover
    from cni_dra.state.owner import boot_id
    from cni_dra.state.schema import Owner

    kernel = Kernel()
    dead = Owner(pid=2**22 + 7, start=1, boot=boot_id())
    _node(
        tmp_path,
        attachment(
            "c1",
            network="net",
            ifname="net1",
            netns="/run/netns/pod",
            netnsIdentity=GONE,
            parent="eth9",
            shaping=SHAPED,
            phase="deleting",
            owner=dead,
        ),
    )
    report = recover(StateStore(tmp_path / "state"), environ={}, host=kernel)
    assert report.errors == [] and kernel.deleted == [] and _keys(tmp_path) == []
