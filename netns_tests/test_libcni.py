"""cni-dra driven by libcni, the library containerd and CRI-O embed.

scripts/libcni-client (our small Go program) is built here against Debian's
packaged libcni (golang-github-appc-cni-dev, Go 1.19, GOPATH mode) and runs
AddNetworkList / CheckNetworkList / DelNetworkList on a conflist, so cni-dra sees
what a runtime really sends: ``name``/``cniVersion`` injected, the cached ADD
result as ``prevResult`` on CHECK and DEL, and CNI_ARGS
``IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_UID=u``.

libcni 1.1.x parses results up to spec 1.0.0, so the conflists here use 0.4.0
(the first with CHECK) and 1.0.0.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from netns_tests.libcni import IFNAME, SPEC_VERSIONS, Setup, run_client
from netns_tests.libcni import assert_added as _assert_added
from netns_tests.libcni import assert_deleted as _assert_deleted
from netns_tests.runner import host_ifindex, link_in_netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


@pytest.fixture
def setup(libcni_setup: Setup) -> Setup:
    return libcni_setup


@pytest.mark.parametrize("version", SPEC_VERSIONS)
def test_libcni_add_check_del(libcni_client: Path, setup: Setup, version: str) -> None:
    conflist = setup.conflist(version, setup.cni_dra_conf())
    run = lambda cmd: run_client(  # noqa: E731
        libcni_client, cmd, conflist, netns=setup.netns, cache_dir=setup.cache_dir
    )

    code, result, err = run("add")
    assert code == 0, f"ADD via libcni failed: {result} {err}"
    _assert_added(setup, result, version)

    code, out, err = run("check")
    assert code == 0, f"CHECK via libcni failed: {out} {err}"

    code, out, err = run("del")
    assert code == 0, f"DEL via libcni failed: {out} {err}"
    _assert_deleted(setup)


@pytest.mark.parametrize("version", SPEC_VERSIONS)
def test_libcni_chain_with_tuning(libcni_client: Path, setup: Setup, version: str) -> None:
    """[cni-dra, tuning]: tuning receives cni-dra's result as prevResult and sets the
    MTU on the same link; CHECK and DEL run through the whole chain."""
    tuning = {"type": "tuning", "mtu": 1400}
    conflist = setup.conflist(version, setup.cni_dra_conf(), tuning)
    run = lambda cmd: run_client(  # noqa: E731
        libcni_client, cmd, conflist, netns=setup.netns, cache_dir=setup.cache_dir
    )

    code, result, err = run("add")
    assert code == 0, f"ADD via libcni failed: {result} {err}"
    link = _assert_added(setup, result, version)
    assert link["mtu"] == 1400

    code, out, err = run("check")
    assert code == 0, f"CHECK via libcni failed: {out} {err}"

    code, out, err = run("del")
    assert code == 0, f"DEL via libcni failed: {out} {err}"
    _assert_deleted(setup)


def test_libcni_client_drives_reference_macvlan(libcni_client: Path, setup: Setup) -> None:
    """The harness itself: the client runs the reference macvlan + host-local through
    ADD/CHECK/DEL, so a failure above is cni-dra's, not the client's."""
    conflist = setup.conflist(
        "1.0.0",
        {
            "type": "macvlan",
            "master": setup.parent,
            "ipam": {"type": "host-local", "subnet": "192.0.2.0/24", "dataDir": str(setup.ipam_dir)},
        },
    )
    run = lambda cmd: run_client(  # noqa: E731
        libcni_client, cmd, conflist, netns=setup.netns, cache_dir=setup.cache_dir
    )
    code, result, err = run("add")
    assert code == 0, f"{result} {err}"
    link = link_in_netns(setup.netns, IFNAME)
    assert link is not None and link["parent_ifindex"] == host_ifindex(setup.parent)
    assert result is not None and [ip["address"] for ip in result["ips"]] == link["ipv4"]
    assert run("check")[0] == 0
    assert run("del")[0] == 0
    assert link_in_netns(setup.netns, IFNAME) is None
    # A plugin's CNI error reaches the caller as error JSON with its code.
    code, out, _ = run_client(
        libcni_client, "add", conflist, netns="/var/run/netns/does-not-exist", cache_dir=setup.cache_dir
    )
    assert code == 1 and out is not None and isinstance(out.get("code"), int)
