"""Shared fixtures for root tests in real network namespaces.

Everything under ``netns_tests/`` is skipped unless the tests run as root.
Fixtures build their world with pyroute2 directly (not with cni_dra code), so
tests can check cni_dra against an independent view of the kernel.

Names: every link and namespace a fixture creates is called
``cdt-<session token><counter>`` (links: at most 14 bytes; the veth peer adds
``p``). The session token is random per pytest process, so parallel runs never
collide; at session end a check fails the run if anything with this session's
token is left on the host.

* ``make_netns()`` -> ``/var/run/netns/NAME`` (removed at teardown even if the
  test removed it already or failed);
* ``make_parent_nic(mtu=None)`` -> name of a host veth end that is up, its peer
  up too (deleted at teardown; deleting one end removes both).
"""

from __future__ import annotations

import errno
import itertools
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

NETNS_RUN_DIR = "/var/run/netns"
TEST_PREFIX = "cdt-"
SESSION_TOKEN = secrets.token_hex(3)  # 6 hex chars
_counter = itertools.count(1)
_HERE = Path(__file__).resolve().parent


def unique_name() -> str:
    """``cdt-<session token><3 hex>``: 13 bytes, unique within this session."""
    n = next(_counter)
    if n >= 0x1000:  # pragma: no cover - 4095 objects per session
        raise RuntimeError("too many test objects in one session")
    return f"{TEST_PREFIX}{SESSION_TOKEN}{n:03x}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="netns_tests need root (network namespaces, veth pairs)")
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


def _iproute():  # type: ignore[no-untyped-def]
    from pyroute2.iproute.linux import IPRoute

    return IPRoute()


def _netns_module():  # type: ignore[no-untyped-def]
    from pyroute2 import netns

    return netns


@pytest.fixture
def make_netns() -> Iterator[Callable[[], str]]:
    """Factory: create a fresh, uniquely named netns; returns its path."""
    names: list[str] = []

    def make() -> str:
        name = unique_name()
        names.append(name)
        _netns_module().create(name)
        return f"{NETNS_RUN_DIR}/{name}"

    try:
        yield make
    finally:
        for name in names:
            remove_netns(name)


def remove_netns(name_or_path: str) -> None:
    """Remove a netns made by :func:`make_netns`; no error if already gone."""
    name = os.path.basename(name_or_path)
    path = f"{NETNS_RUN_DIR}/{name}"
    if os.path.lexists(path):
        try:
            _netns_module().remove(name)
        except FileNotFoundError:
            pass


@pytest.fixture
def make_parent_nic() -> Iterator[Callable[..., str]]:
    """Factory ``make(mtu=None) -> name``: a host veth pair standing in for a NIC, both ends up."""
    names: list[str] = []

    def make(mtu: int | None = None) -> str:
        name = unique_name()
        peer = name + "p"
        names.append(name)
        with _iproute() as ipr:
            ipr.link("add", ifname=name, kind="veth", peer=peer)
            for end in (name, peer):
                (idx,) = ipr.link_lookup(ifname=end)
                if mtu is not None:
                    ipr.link("set", index=idx, mtu=mtu)
                ipr.link("set", index=idx, state="up")
        return name

    try:
        yield make
    finally:
        delete_host_link(*names)


def delete_host_link(*names: str) -> None:
    """Delete host links by name; no error if already gone."""
    from pyroute2.netlink.exceptions import NetlinkError

    with _iproute() as ipr:
        for name in names:
            for idx in ipr.link_lookup(ifname=name):
                try:
                    ipr.link("del", index=idx)
                except NetlinkError as exc:
                    if exc.code != errno.ENODEV:
                        raise


def leftovers() -> tuple[list[str], list[str]]:
    """(links, netns names) on the host that carry this session's token."""
    mine = TEST_PREFIX + SESSION_TOKEN
    try:
        netns = sorted(n for n in os.listdir(NETNS_RUN_DIR) if n.startswith(mine))
    except FileNotFoundError:
        netns = []
    with _iproute() as ipr:
        links = sorted(
            name
            for msg in ipr.link("dump")
            if (name := msg.get_attr("IFLA_IFNAME") or "").startswith(mine)
        )
    return links, netns


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    """Session-end check: no test link or netns of this session remains on the host."""
    yield
    if os.geteuid() != 0:
        return
    links, netns = leftovers()
    # Clean up so one failure does not pollute the machine, then report it.
    delete_host_link(*links)
    for name in netns:
        remove_netns(name)
    assert not links and not netns, f"left behind: links {links}, netns {netns}"
