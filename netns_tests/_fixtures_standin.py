"""Stand-ins for the ``make_netns`` / ``make_parent_nic`` fixtures of netns_tests/conftest.py.

Temporary: the real fixtures are written elsewhere; the lead deletes this file when
they land. No test imports it; load it explicitly while conftest.py lacks them:

    python -m pytest -p netns_tests._fixtures_standin netns_tests/test_libcni.py

Creation and deletion use ``ip`` (its output is never read).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

__all__ = ["make_netns", "make_parent_nic"]


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True)


@pytest.fixture
def make_netns() -> Iterator[Callable[[], str]]:
    """Factory: each call makes a fresh netns and returns its path /var/run/netns/NAME."""
    made: list[str] = []

    def make() -> str:
        name = f"cdt-{uuid.uuid4().hex[:8]}"
        _ip("netns", "add", name)
        made.append(name)
        return f"/var/run/netns/{name}"

    try:
        yield make
    finally:
        for name in made:
            if os.path.exists(f"/var/run/netns/{name}"):
                _ip("netns", "del", name, check=False)


@pytest.fixture
def make_parent_nic() -> Iterator[Callable[..., str]]:
    """Factory: make_parent_nic(mtu=None) makes a veth pair (both ends up) and returns
    the host end's name, the stand-in NIC a macvlan hangs from."""
    made: list[str] = []

    def make(mtu: int | None = None) -> str:
        name = f"cdp-{uuid.uuid4().hex[:8]}"
        _ip("link", "add", name, "type", "veth", "peer", "name", f"{name}-p")
        made.append(name)
        if mtu is not None:
            _ip("link", "set", name, "mtu", str(mtu))
            _ip("link", "set", f"{name}-p", "mtu", str(mtu))
        _ip("link", "set", name, "up")
        _ip("link", "set", f"{name}-p", "up")
        return name

    try:
        yield make
    finally:
        for name in made:
            _ip("link", "del", name, check=False)
