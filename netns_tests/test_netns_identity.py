"""A network namespace is its device and inode, not its path: the installed plugin and
``cni-dra state repair`` in real namespaces, with the pod's namespace named
``/run/netns/NAME`` (as podman and others spell it; ``/var/run`` is a symlink to ``/run``)
where repair finds it as ``/var/run/netns/NAME``; and what DEL may delete: not a link another
attachment's record names, and with an empty CNI_NETNS the link in the recorded namespace.

Judged independently of the plugin's report: the state files (:meth:`NodeBed.consumed`,
``phases``), the kernel's links (pyroute2) and host-local's reservations.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cni_dra.quantity import Quantity
from netns_tests.bed import NodeBed, links_named, repair

NET = "idnet"
SHAPED_POD = {"lo": None, "eth0": "macvlan", "ifb-eth0": "ifb"}
"""The links of a pod the node's network attached (shaped: the ifb device beside eth0)."""


@pytest.fixture
def node(make_node) -> NodeBed:
    """One 10G stand-in NIC (``nic-a``) on network ``idnet``."""
    return make_node(nics=1, network=NET)


def _run_path(netns: str) -> str:
    """The same namespace as ``netns`` (``/var/run/netns/NAME``) under ``/run/netns/NAME``."""
    path = "/run/netns/" + os.path.basename(netns)
    assert os.path.realpath(netns) == path  # this node's /var/run is /run
    return path


def _links(netns: str) -> dict[str, str | None]:
    return dict(links_named(netns))


def test_repair_finds_a_pod_added_under_run_netns_tracked(node, make_netns):
    """Repair lists /var/run/netns; the pod was added as /run/netns/NAME. The same namespace:
    its link is tracked, nothing is charged again, however often repair runs; the pod's DEL
    frees the NIC for a 9G pod."""
    ns = make_netns()
    assert node.add(_run_path(ns), "pod-a", conf=node.conf("2G"))[0] == 0
    for _ in range(2):
        code, out, err = repair(node, "--json")
        assert code == 0, (out, err)
        changes = json.loads(out)["changes"]
        assert not any(c.startswith("untracked link") for c in changes), changes
        assert node.consumed() == {"nic-a": {"bandwidth": Quantity.parse("2G")}}
    assert node.phases() == {"pod-a": "ready"}
    code, out, err = node.delete(_run_path(ns), "pod-a", conf=node.conf("2G"))
    assert code == 0, (out, err)
    assert node.consumed() == {}
    assert _links(ns) == {"lo": None}
    code, out, err = node.add(make_netns(), "pod-b", conf=node.conf("9G"))
    assert code == 0, (out, err)


def test_del_releases_a_repair_placeholder_under_another_path(node, make_netns):
    """Repair charges an untracked link found as /var/run/netns/NAME; the pod's DEL says
    /run/netns/NAME: its placeholder is released and the NIC freed."""
    from pyroute2 import IPRoute

    ns = make_netns()
    with IPRoute() as ipr:
        (parent,) = ipr.link_lookup(ifname=node.parents["nic-a"])
        fd = os.open(ns, os.O_RDONLY)
        try:
            ipr.link("add", ifname="stray0", kind="macvlan", link=parent, macvlan_mode="bridge", net_ns_fd=fd)
        finally:
            os.close(fd)
    code, out, err = repair(node, "--json")
    assert code == 0, (out, err)
    assert node.consumed() == {"nic-a": {"bandwidth": Quantity.parse("10G")}}, out
    code, out, err = node.delete(_run_path(ns), "pod-x", ifname="stray0")
    assert code == 0, (out, err)
    assert node.consumed() == {}
    assert _links(ns) == {"lo": None}


def test_repair_charges_a_link_once_when_its_namespace_has_two_names(node, make_netns):
    """An operator's ``ip netns attach`` gives a pod's namespace a second name under
    /var/run/netns (a bind mount of the same nsfs inode). Repair finds the untracked link
    under both names but charges it once, converged; the pod's DEL deletes the link and
    frees the NIC, leaving no placeholder behind to hold it."""
    import subprocess

    from pyroute2 import IPRoute

    from netns_tests.conftest import remove_netns, unique_name

    ns = make_netns()
    alias = f"/var/run/netns/{unique_name()}"
    Path(alias).touch()  # the mount point
    try:
        subprocess.run(["mount", "--bind", ns, alias], check=True)
        assert os.stat(alias).st_ino == os.stat(ns).st_ino
        with IPRoute() as ipr:
            (parent,) = ipr.link_lookup(ifname=node.parents["nic-a"])
            fd = os.open(ns, os.O_RDONLY)
            try:
                ipr.link(
                    "add", ifname="stray0", kind="macvlan", link=parent, macvlan_mode="bridge", net_ns_fd=fd
                )
            finally:
                os.close(fd)
        code, out, err = repair(node, "--json")
        assert code == 0, (out, err)
        untracked = [c for c in json.loads(out)["changes"] if c.startswith("untracked link stray0")]
        assert len(untracked) == 1, out
        assert node.consumed() == {"nic-a": {"bandwidth": Quantity.parse("10G")}}
        code, out, err = repair(node, "--json")
        assert (code, json.loads(out)) == (0, {"changes": [], "errors": []}), err
        code, out, err = node.delete(ns, "pod-x", ifname="stray0")
        assert code == 0, (out, err)
        assert node.consumed() == {}
        assert node.state().attachments == []
        assert _links(ns) == {"lo": None}
    finally:
        remove_netns(alias)


@pytest.mark.parametrize("spelling", ["same path", "/run path"])
def test_del_of_an_unknown_container_leaves_another_attachments_link(node, make_netns, spelling):
    """A DEL whose container has no record, with the netns and ifname of another
    container's live attachment, deletes neither that attachment's link nor its ifb device."""
    ns = make_netns()
    code, out, err = node.add(ns, "pod-a")
    assert code == 0, (out, err)
    ip_a = out["ips"][0]["address"].split("/")[0]
    code, out, err = node.delete(ns if spelling == "same path" else _run_path(ns), "intruder")
    assert code == 0, (out, err)
    assert _links(ns) == SHAPED_POD
    assert node.phases() == {"pod-a": "ready"}
    assert node.consumed() == {"nic-a": {"bandwidth": Quantity.parse("1G")}}
    assert node.ip_holders() == {ip_a: "pod-a"}
    code, out, err = node.delete(ns, "pod-a")  # the owner's DEL removes both
    assert code == 0, (out, err)
    assert _links(ns) == {"lo": None} and node.consumed() == {} and node.ip_holders() == {}


def test_del_with_empty_netns_removes_the_link_in_the_recorded_namespace(node, make_netns):
    """CNI_NETNS may be empty on DEL: the link (holding the address being released) and its
    ifb device go from the namespace the attachment recorded, which still exists."""
    ns = make_netns()
    code, out, err = node.add(ns, "pod-a")
    assert code == 0, (out, err)
    assert _links(ns) == SHAPED_POD
    code, out, err = node.delete("", "pod-a")
    assert code == 0, (out, err)
    assert _links(ns) == {"lo": None}
    assert node.phases() == {} and node.consumed() == {} and node.ip_holders() == {}
    code, out, err = node.delete("", "pod-a")  # repeated: nothing left to do
    assert code == 0, (out, err)


# -- the namespace's identity, recorded at ADD -------------------------------------------------------
def _macvlan_in(netns: str, parent: str, name: str = "eth0") -> None:
    """A hand-made macvlan on host NIC ``parent``, moved into ``netns`` as ``name`` (not cni-dra's)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        (index,) = ipr.link_lookup(ifname=parent)
        fd = os.open(netns, os.O_RDONLY)
        try:
            ipr.link("add", ifname=name, kind="macvlan", link=index, macvlan_mode="bridge", net_ns_fd=fd)
        finally:
            os.close(fd)


def _name_again(path: str, other: str) -> None:
    """``ip netns del`` of the namespace at ``path``, then ``path`` made to name the live
    namespace ``other`` (a bind mount, as ``ip netns add`` makes): "the namespace was deleted
    and one made again under its name", with an identity that surely differs (the kernel may
    give a new namespace a dead one's inode)."""
    import subprocess

    from netns_tests.conftest import remove_netns

    remove_netns(path)
    with open(path, "x"):
        pass
    subprocess.run(["mount", "--bind", other, path], check=True)


def test_add_records_the_identity_of_its_namespace(node, make_netns):
    ns = make_netns()
    assert node.add(_run_path(ns), "pod-a")[0] == 0
    st = os.stat(ns)
    (att,) = node.state_doc()["attachments"]
    assert att["netnsIdentity"] == [st.st_dev, st.st_ino]
    assert node.delete(ns, "pod-a")[0] == 0


def test_del_with_empty_netns_leaves_the_link_of_a_namespace_made_again_under_the_name(node, make_netns):
    """The pod's namespace was deleted (its link went with it) and another made under its
    name, holding a hand-made macvlan ``eth0`` on the same NIC: a DEL with an empty CNI_NETNS
    releases the pod's IP and capacity and leaves that link alone."""
    ns, other = make_netns(), make_netns()
    code, out, err = node.add(ns, "pod-z")
    assert code == 0, (out, err)
    _name_again(ns, other)
    _macvlan_in(ns, node.parents["nic-a"])
    code, out, err = node.delete("", "pod-z")
    assert code == 0, (out, err)
    assert _links(ns) == {"lo": None, "eth0": "macvlan"}
    assert node.phases() == {} and node.consumed() == {} and node.ip_holders() == {}


def test_repeated_add_into_a_namespace_made_again_under_the_name_is_refused(node, make_netns):
    """The recorded result names a link that is not in the namespace now under that path."""
    ns, other = make_netns(), make_netns()
    assert node.add(ns, "pod-z")[0] == 0
    _name_again(ns, other)
    code, out, err = node.add(ns, "pod-z")
    assert code == 1 and out["code"] == 104, (out, err)
    assert _links(ns) == {"lo": None}
    assert node.delete(ns, "pod-z")[0] == 0
    assert node.phases() == {} and node.ip_holders() == {}


def test_del_naming_another_namespace_removes_the_link_where_it_is(node, make_netns):
    """The right container ID with another live CNI_NETNS: the pod's link (holding the IP being
    released) and its ifb device go from the namespace recorded at ADD; the other namespace's
    link of that name stays. Nothing is left charged, nothing left up."""
    ns, other = make_netns(), make_netns()
    code, out, err = node.add(ns, "pod-f")
    assert code == 0, (out, err)
    _macvlan_in(other, node.parents["nic-a"])
    code, out, err = node.delete(other, "pod-f")
    assert code == 0, (out, err)
    assert _links(ns) == {"lo": None}
    assert _links(other) == {"lo": None, "eth0": "macvlan"}
    assert node.phases() == {} and node.consumed() == {} and node.ip_holders() == {}


def test_del_finds_the_recorded_namespace_when_its_symlink_was_pointed_elsewhere(node, make_netns, tmp_path):
    """ADD through a symlink; the symlink then names another namespace. A DEL with an empty
    CNI_NETNS removes the pod's link from the namespace it was added in (found under
    /var/run/netns by its identity), not the other's."""
    ns, other = make_netns(), make_netns()
    link = tmp_path / "pod-netns"
    link.symlink_to(ns)
    assert node.add(str(link), "pod-s")[0] == 0
    _macvlan_in(other, node.parents["nic-a"])
    link.unlink()
    link.symlink_to(other)
    code, out, err = node.delete("", "pod-s")
    assert code == 0, (out, err)
    assert _links(ns) == {"lo": None}
    assert _links(other) == {"lo": None, "eth0": "macvlan"}
    assert node.phases() == {} and node.consumed() == {} and node.ip_holders() == {}


# -- a CNI_NETNS that is no usable namespace path ---------------------------------------------------
@pytest.mark.parametrize("kind", ["not-a-directory", "loop", "too-long", "pid1"])
def test_del_with_an_unusable_netns_path_never_answers_an_internal_error(node, make_netns, tmp_path, kind):
    """Code 0 (a path that names nothing: the namespace is gone) or 4 (it cannot be looked at,
    answered before anything is done), never 999 and never a traceback; the pod's own DEL
    then removes its link and frees everything."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    path = {
        "not-a-directory": "/etc/passwd/x",
        "loop": str(loop),
        "too-long": "/" + "x" * 300,
        "pid1": "/proc/1/ns/net",
    }[kind]
    ns = make_netns()
    assert node.add(ns, "pod-b")[0] == 0
    code, out, err = node.delete(path, "pod-b")
    assert "Traceback" not in err
    if code:
        assert out["code"] == 4, out
        assert node.phases() == {"pod-b": "ready"}  # nothing was done
        code, out, err = node.delete(ns, "pod-b")
        assert code == 0, (out, err)
    assert _links(ns) == {"lo": None}
    assert node.phases() == {} and node.consumed() == {} and node.ip_holders() == {}
