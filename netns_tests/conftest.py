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
  up too (deleted at teardown; deleting one end removes both);
* ``make_node(nics=2, mtu=None, **bed options)`` -> a :class:`netns_tests.bed.NodeBed` on
  fresh stand-in NICs under ``tmp_path``; ``node`` is ``make_node()``;
* ``faults_on`` -> the root-owned switch that lets ``CNI_DRA_FAULT``/``CNI_DRA_IO_FAULT`` act;
* ``fastpath_agent`` (module scope) -> the socket of a running fast-path agent;
* ``libcni_client`` (session) and ``libcni_setup``: see :mod:`netns_tests.libcni`.
"""

from __future__ import annotations

import errno
import itertools
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from netns_tests.bed import NodeBed, start_fastpath_agent, stop_process

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
            name for msg in ipr.link("dump") if (name := msg.get_attr("IFLA_IFNAME") or "").startswith(mine)
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


@pytest.fixture
def make_node(tmp_path, make_parent_nic, make_netns) -> Callable[..., NodeBed]:
    """Factory ``make(nics=2, mtu=None, **options)``: a :class:`NodeBed` on ``nics`` fresh
    stand-in NICs (``mtu`` each), under ``tmp_path``; ``options`` go to :class:`NodeBed`."""

    def make(nics: int = 2, mtu: int | None = None, **options: object) -> NodeBed:
        return NodeBed(
            tmp_path, [make_parent_nic(mtu=mtu) for _ in range(nics)], make_netns=make_netns, **options
        )  # type: ignore[arg-type]

    return make


@pytest.fixture
def node(make_node) -> NodeBed:
    """Two 10G stand-in NICs (``nic-a``, ``nic-b``) on network ``testnet``."""
    return make_node()


@pytest.fixture
def faults_on() -> Iterator[None]:
    """The test switch that lets CNI_DRA_FAULT act (removed afterwards if we made it)."""
    from cni_dra.faults import SWITCH_FILE

    made = not os.path.exists(SWITCH_FILE)
    os.makedirs(os.path.dirname(SWITCH_FILE), mode=0o700, exist_ok=True)
    Path(SWITCH_FILE).touch(mode=0o600)
    try:
        yield
    finally:
        if made:
            Path(SWITCH_FILE).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def fastpath_agent(tmp_path_factory) -> Iterator[str]:
    """A fast-path agent (``cni_dra.fastpath.server`` of the installed venv) for this module; its socket."""
    sock = str(tmp_path_factory.mktemp("fastpath") / "agent" / "agent.sock")
    proc = start_fastpath_agent(sock)
    try:
        yield sock
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def libcni_client(tmp_path_factory) -> Path:
    """The libcni client (scripts/libcni-client), built once per session."""
    from netns_tests.libcni import build_libcni_client

    return build_libcni_client(tmp_path_factory)


@pytest.fixture
def libcni_setup(make_netns, make_parent_nic, tmp_path):  # type: ignore[no-untyped-def]
    """A :class:`netns_tests.libcni.Setup`: one stand-in NIC, a pod netns, libcni's cache dir."""
    from netns_tests.libcni import Setup

    return Setup(make_netns, make_parent_nic, tmp_path)
