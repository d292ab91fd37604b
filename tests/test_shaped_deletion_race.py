"""Two DELs of one attachment at once (the runtime retried, or two paths of one namespace):
the pod interface and its ifb device vanish under one of them between its dump of the
namespace's links and its requests. What is gone is done: that DEL succeeds too.

The pod namespace's rtnetlink socket is faked (:class:`Namespace`), and the deletion that
:mod:`cni_dra.netlink.dellink` sends from its own socket goes to it too: the other DEL deletes
both links at the moment this one first asks the kernel to change one (ENODEV from then on).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Any

import pytest

from cni_dra.netlink import _pyroute2, dellink, shaping, sockets


class _Attrs:
    def __init__(self, **attrs: Any) -> None:
        self.attrs = attrs

    def get_attr(self, name: str) -> Any:
        return self.attrs.get(name)


class _Link(_Attrs):
    def __init__(self, index: int, name: str, kind: str, group: int = 0) -> None:
        super().__init__(IFLA_IFNAME=name, IFLA_GROUP=group, IFLA_LINKINFO=_Attrs(IFLA_INFO_KIND=kind))
        self.index = index

    def __getitem__(self, key: str) -> int:
        assert key == "index"
        return self.index


class Namespace:
    """A pod namespace holding ``eth0`` and cni-dra's ``ifb-eth0``; ``race``: another DEL
    deletes both as soon as this one first asks to change a link."""

    def __init__(self, race: str) -> None:
        self.links = {3: _Link(3, "eth0", "macvlan"), 4: _Link(4, "ifb-eth0", "ifb", shaping.IFB_GROUP)}
        self.race = race
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def link(self, command: str, **kw: Any) -> Any:
        if command == "dump":
            return list(self.links.values())
        self.requests.append((command, kw))
        if (command, self.race) in (("set", "set"), ("del", "del")):
            self.race = ""
            self.links.clear()  # the other DEL got there first
        if command == "set":
            if kw["index"] not in self.links:
                raise _pyroute2.load().NetlinkError(errno.ENODEV, "No such device")
            self.links[kw["index"]].attrs["IFLA_GROUP"] = kw["group"]
            return None
        gone = [
            i
            for i, link in self.links.items()
            if link.get_attr("IFLA_GROUP") == kw.get("group") or i == kw.get("index")
        ]
        if not gone:
            raise _pyroute2.load().NetlinkError(errno.ENODEV, "No such device")
        for index in gone:
            del self.links[index]
        return None

    def get_filters(self, **kw: Any) -> list[Any]:
        return []


def _pod_socket(monkeypatch, ns: Namespace) -> None:
    @contextlib.contextmanager
    def in_pod(netns: str) -> Iterator[Namespace]:
        yield ns

    monkeypatch.setattr(sockets, "netns_iproute", in_pod)
    monkeypatch.setattr(dellink, "delete", lambda request, **_: ns.link("del", **request))


@pytest.mark.parametrize("race", ["set", "del"], ids=["gone-before-grouping", "gone-before-deletion"])
def test_a_shaped_link_deleted_by_another_del_meanwhile_is_done(monkeypatch, race):
    ns = Namespace(race)

    _pod_socket(monkeypatch, ns)
    shaping.delete_shaped_link("/var/run/netns/pod", "eth0")  # no NetlinkError: nothing left to delete
    assert ns.links == {}


def test_without_a_race_both_go_in_one_batch(monkeypatch):
    ns = Namespace(race="")

    _pod_socket(monkeypatch, ns)
    assert shaping.delete_shaped_link("/var/run/netns/pod", "eth0") == (True, True)
    assert ns.links == {} and [c for c, _ in ns.requests] == ["set", "set", "del"]
