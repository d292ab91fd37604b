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

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from netns_tests.runner import (
    CNI_PATH,
    K8S_CNI_ARGS,
    cni_dra_status,
    host_ifindex,
    link_in_netns,
)

GOPATH = "/usr/share/gocode"
LIBCNI_SRC = Path(GOPATH, "src/github.com/containernetworking/cni/libcni")
CLIENT_SRC = Path(__file__).resolve().parent.parent / "scripts" / "libcni-client"
IFNAME = "net1"
CONTAINER_ID = "c"
SPEC_VERSIONS = ["0.4.0", "1.0.0"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


@pytest.fixture(scope="session")
def libcni_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of the libcni client, built now into a temp dir (no binary is committed)."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not installed (apt package golang-go; `make deps` installs it)")
    if not LIBCNI_SRC.is_dir():
        pytest.skip(f"libcni source missing at {LIBCNI_SRC} (apt package golang-github-appc-cni-dev)")
    out_dir = tmp_path_factory.mktemp("libcni-client")
    exe = out_dir / "libcni-client"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GOPATH": GOPATH,
        "GO111MODULE": "off",
        "GOFLAGS": "",
        "GOENV": "off",
        "CGO_ENABLED": "0",
        "GOCACHE": str(out_dir / "gocache"),
        "HOME": str(out_dir),
    }
    proc = subprocess.run(
        [go, "build", "-o", str(exe), "."],
        cwd=CLIENT_SRC,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"building the libcni client failed:\n{proc.stderr}"
    return exe


def _run_client(
    client: Path, command: str, conflist: Path, *, netns: str, cache_dir: Path, cni_args: str = K8S_CNI_ARGS
) -> tuple[int, dict[str, Any] | None, str]:
    proc = subprocess.run(
        [
            str(client),
            "-conflist", str(conflist),
            "-netns", netns,
            "-id", CONTAINER_ID,
            "-ifname", IFNAME,
            "-args", cni_args,
            "-path", CNI_PATH,
            "-cache-dir", str(cache_dir),
            command,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, out, proc.stderr


def _inventory(device: str, ifname: str) -> str:
    return json.dumps(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "libcni-node-net.cni-dra.dev"},
            "spec": {
                "driver": "net.cni-dra.dev",
                "nodeName": "libcni-node",
                "pool": {"name": "libcni-node", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": device,
                        "allowMultipleAllocations": True,
                        "attributes": {"ifName": {"string": ifname}},
                        "capacity": {"bandwidth": {"value": "10G"}},
                    }
                ],
            },
        }
    )


class Setup:
    def __init__(self, make_netns, make_parent_nic, tmp_path: Path) -> None:
        self.netns = make_netns()
        self.parent = make_parent_nic()
        self.tmp = tmp_path
        self.state_dir = tmp_path / "state"
        self.ipam_dir = tmp_path / "ipam"
        self.cache_dir = tmp_path / "libcni-cache"
        self.inventory = tmp_path / "resourceslice.json"
        self.inventory.write_text(_inventory("nic0", self.parent))

    def cni_dra_conf(self) -> dict[str, Any]:
        return {
            "type": "cni-dra",
            "stateDir": str(self.state_dir),
            "inventory": str(self.inventory),
            "capacity": {"requests": {"bandwidth": "2G"}},
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "192.0.2.0/24"}]],
                "dataDir": str(self.ipam_dir),
            },
        }

    def conflist(self, version: str, *plugins: dict[str, Any]) -> Path:
        path = self.tmp / "net.conflist"
        path.write_text(json.dumps({"cniVersion": version, "name": "dra-libcni", "plugins": list(plugins)}))
        return path

    def status(self) -> dict[str, Any]:
        return cni_dra_status(self.state_dir, self.inventory)


@pytest.fixture
def setup(make_netns, make_parent_nic, tmp_path) -> Setup:
    return Setup(make_netns, make_parent_nic, tmp_path)


def _assert_added(s: Setup, result: dict[str, Any] | None, version: str) -> dict[str, Any]:
    assert result is not None
    assert result["cniVersion"] == version
    link = link_in_netns(s.netns, IFNAME)
    assert link is not None, f"no {IFNAME} in the pod netns"
    assert link["kind"] == "macvlan"
    assert link["parent_ifindex"] == host_ifindex(s.parent)
    assert [ip["address"] for ip in result["ips"]] == link["ipv4"]
    status = s.status()
    assert [(a["podUID"], a["containerID"], a["ifname"], a["device"]) for a in status["attachments"]] == [
        ("u", CONTAINER_ID, IFNAME, "nic0")
    ]
    assert status["devices"][0]["consumed"] == {"bandwidth": "2G"}
    return link


def _assert_deleted(s: Setup) -> None:
    assert link_in_netns(s.netns, IFNAME) is None
    status = s.status()
    assert status["attachments"] == []
    assert status["devices"][0]["consumed"].get("bandwidth") == "0"
    assert status["devices"][0]["remaining"] == {"bandwidth": "10G"}


@pytest.mark.parametrize("version", SPEC_VERSIONS)
def test_libcni_add_check_del(libcni_client: Path, setup: Setup, version: str) -> None:
    conflist = setup.conflist(version, setup.cni_dra_conf())
    run = lambda cmd: _run_client(  # noqa: E731
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
    run = lambda cmd: _run_client(  # noqa: E731
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
    run = lambda cmd: _run_client(  # noqa: E731
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
    code, out, _ = _run_client(
        libcni_client, "add", conflist, netns="/var/run/netns/does-not-exist", cache_dir=setup.cache_dir
    )
    assert code == 1 and out is not None and isinstance(out.get("code"), int)
