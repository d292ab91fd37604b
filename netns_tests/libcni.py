"""The libcni harness: scripts/libcni-client (our small Go program over Debian's packaged
libcni, the library containerd and CRI-O embed) built and run on a conflist, and the node it
runs against. Fixtures ``libcni_client`` and ``libcni_setup`` live in conftest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from netns_tests.bed import PLAIN_POLICY, NodeBed
from netns_tests.runner import CNI_PATH, K8S_CNI_ARGS, host_ifindex, link_in_netns

__all__ = [
    "CONTAINER_ID",
    "IFNAME",
    "SPEC_VERSIONS",
    "Setup",
    "assert_added",
    "assert_deleted",
    "build_libcni_client",
    "run_client",
]

GOPATH = "/usr/share/gocode"
LIBCNI_SRC = Path(GOPATH, "src/github.com/containernetworking/cni/libcni")
CLIENT_SRC = Path(__file__).resolve().parent.parent / "scripts" / "libcni-client"
IFNAME = "net1"
CONTAINER_ID = "c"
SPEC_VERSIONS = ["0.4.0", "1.0.0"]


def build_libcni_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of the libcni client, built now into a temp dir (no binary is committed);
    skips the test when Go or the libcni source is missing."""
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


def run_client(
    client: Path, command: str, conflist: Path, *, netns: str, cache_dir: Path, cni_args: str = K8S_CNI_ARGS
) -> tuple[int, dict[str, Any] | None, str]:
    proc = subprocess.run(
        [
            str(client),
            "-conflist",
            str(conflist),
            "-netns",
            netns,
            "-id",
            CONTAINER_ID,
            "-ifname",
            IFNAME,
            "-args",
            cni_args,
            "-path",
            CNI_PATH,
            "-cache-dir",
            str(cache_dir),
            command,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, out, proc.stderr


class Setup:
    """One stand-in NIC as device ``nic0`` (a :class:`NodeBed`), a pod netns, libcni's cache dir."""

    def __init__(self, make_netns, make_parent_nic, tmp_path: Path) -> None:
        self.netns = make_netns()
        self.parent = make_parent_nic()
        self.tmp = tmp_path
        self.node = NodeBed(
            tmp_path, [self.parent], devices=["nic0"], request_policy=PLAIN_POLICY, network="dra-libcni"
        )
        self.state_dir = self.node.state_dir
        self.ipam_dir = self.node.ipam_dir
        self.inventory = self.node.inventory
        self.cache_dir = tmp_path / "libcni-cache"

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
        return self.node.status()


def assert_added(s: Setup, result: dict[str, Any] | None, version: str) -> dict[str, Any]:
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


def assert_deleted(s: Setup) -> None:
    assert link_in_netns(s.netns, IFNAME) is None
    status = s.status()
    assert status["attachments"] == []
    assert status["devices"][0]["consumed"].get("bandwidth") == "0"
    assert status["devices"][0]["remaining"] == {"bandwidth": "10G"}
